"""The torch baseline for ``multidev bench``: torch's own calls for every row."""
from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from multidev import Device

from ..baseline import Call, Native


class TorchNative(Native):
    framework = "torch"
    #: suite ``startup``: the framework's import and first call, in a fresh interpreter
    startup_code = "import torch; torch.zeros(1)"
    env_vars = ("TORCH_NCCL_BLOCKING_WAIT", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "PYTORCH_CUDA_ALLOC_CONF",
                "TORCH_DISTRIBUTED_DEBUG")

    def __init__(self, b: Any) -> None:
        super().__init__(b)
        import torch

        self.torch = torch

    def dev(self, d: Device) -> Any:
        t = self.torch
        return t.device("cuda", d.index) if d.kind == "gpu" else t.device("mps") if d.kind == "mps" else t.device("cpu")

    def mm(self, dev: Device) -> Callable[[Any, Any], Any]:
        return self.torch.mm

    def op_to(self, x: Any, dev: Device) -> Call:
        return x.to, (self.dev(dev),), "x.to(device)"

    def mover(self, dev: Device, non_blocking: bool = False) -> Callable[[Any], Any]:
        d = self.dev(dev)
        return lambda x: x.to(d, non_blocking=non_blocking)

    def op_move_async(self, x: Any, dev: Device) -> Call:
        return functools.partial(x.to, self.dev(dev), non_blocking=True), (), "x.to(device, non_blocking=True)"

    def op_copy(self, x: Any, dev: Device) -> Call:
        return functools.partial(x.to, self.dev(dev), copy=True), (), "x.to(device, copy=True)"

    def op_device_of(self, x: Any) -> Call:
        return operator.attrgetter("device"), (x,), "x.device"

    def _sync_fn(self, dev: Device) -> Call:
        t = self.torch
        if dev.kind == "gpu":
            return t.cuda.synchronize, (self.dev(dev),), "torch.cuda.synchronize(device)"
        if dev.kind == "mps":
            return t.mps.synchronize, (), "torch.mps.synchronize()"
        return t.cpu.synchronize, (), "torch.cpu.synchronize()"

    def op_sync(self, dev: Device, x: Any = None) -> Call:
        return self._sync_fn(dev)

    def op_wait(self, x: Any) -> Call:
        fn, a, label = self._sync_fn(self.b.device_of(x))
        return fn, a, label + " (torch has no per-tensor wait)"

    def op_zeros(self, shape: tuple, dev: Device) -> Call:
        t = self.torch
        return functools.partial(t.zeros, shape, dtype=t.float32, device=self.dev(dev)), (), \
            "torch.zeros(shape, device=device)"

    def op_h2d(self, a: np.ndarray, dev: Device) -> Call:
        t = self.torch
        if dev.kind == "cpu":  # from_numpy(a).to('cpu') would alias a: copy, as md.asarray does
            return (lambda arr: t.from_numpy(arr).clone()), (a,), "torch.from_numpy(a).clone()"
        return (lambda arr, d: t.from_numpy(arr).to(d)), (a, self.dev(dev)), "torch.from_numpy(a).to(device)"

    def op_d2h(self, x: Any) -> Call:
        return (lambda t: t.cpu().numpy()), (x,), "x.cpu().numpy()"

    def op_h2d_pinned(self, a: np.ndarray, dev: Device) -> Call | None:
        """The best native upload: from a preallocated pinned host tensor (GPU only)."""
        t = self.torch
        if dev.kind != "gpu":
            return None
        src = t.from_numpy(a).pin_memory()
        d = self.dev(dev)
        return (lambda s: s.to(d, non_blocking=True)), (src,), \
            "pinned.to(device, non_blocking=True) (pinned source allocated beforehand)"

    def op_d2h_pinned(self, x: Any) -> Call | None:
        """The best native download: into a preallocated pinned host tensor (GPU only)."""
        t = self.torch
        if x.device.type != "cuda":
            return None
        dst = t.empty(x.shape, dtype=x.dtype, pin_memory=True)

        def down(x: Any) -> Any:
            dst.copy_(x, non_blocking=True)
            t.cuda.current_stream(x.device).synchronize()
            return dst.numpy()
        return down, (x,), "pinned.copy_(x, non_blocking=True); stream sync (pinned buffer allocated beforehand)"

    def set_precision(self, mode: str) -> dict[str, Any]:
        t = self.torch
        if mode in ("fp32", "tf32"):
            t.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            t.backends.cudnn.allow_tf32 = mode == "tf32"
        return {"torch.backends.cuda.matmul.allow_tf32": bool(t.backends.cuda.matmul.allow_tf32),
                "torch.backends.cudnn.allow_tf32": bool(t.backends.cudnn.allow_tf32),
                "torch.get_float32_matmul_precision()": t.get_float32_matmul_precision(),
                "torch.get_num_threads()": t.get_num_threads()}

    def save_precision(self) -> Any:
        t = self.torch
        return t.backends.cuda.matmul.allow_tf32, t.backends.cudnn.allow_tf32

    def restore_precision(self, state: Any) -> None:
        self.torch.backends.cuda.matmul.allow_tf32, self.torch.backends.cudnn.allow_tf32 = state

    def device_name(self, dev: Device) -> str:
        if dev.kind == "gpu":
            return self.torch.cuda.get_device_name(dev.index)
        return super().device_name(dev)

    def op_dist_allreduce(self, t: Any) -> Call:
        """torch.distributed.all_reduce in place on a preallocated tensor (the process group's own)."""
        import torch.distributed as tdist

        return tdist.all_reduce, (t,), "torch.distributed.all_reduce(t) (in place)"

    def op_dist_allreduce_group_torch(self, t: Any, groups: Any) -> Call:
        """torch.distributed.all_reduce in place within this rank's subgroup of ``groups`` (made here by
        ``new_subgroups_by_enumeration``, every rank calling it): the engine's own subgroup call."""
        import torch.distributed as tdist

        pg, _ = tdist.new_subgroups_by_enumeration([list(g) for g in groups])
        return (lambda: tdist.all_reduce(t, group=pg)), (), "torch.distributed.all_reduce(t, group=subgroup)"

    def op_dist_place_torch(self, x: Any, pm: Any) -> Call:
        """torch's ``distribute_tensor`` of ``x`` over the process mesh's ``DeviceMesh``, rows along its first
        axis and columns along its second (``[Shard(0), Shard(1)]``: a scatter from rank 0 per mesh dimension;
        no Replicate, so it writes nothing into ``x``)."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh(x.device.type, pm.shape, mesh_dim_names=pm.axis_names)
        return (lambda: distribute_tensor(x, mesh, [Shard(0), Shard(1)])), (), \
            "torch.distributed.tensor.distribute_tensor(x, mesh, [Shard(0), Shard(1)])"

    def op_dist_gather_torch(self, y: Any) -> Call:
        """A DTensor's ``full_tensor()`` (torch's own gather)."""
        return y.full_tensor, (), "dtensor.full_tensor()"

    def op_dist_allreduce_torch(self, t: Any) -> Call:
        """The torch engine's own call (suite ``distributed``): torch.distributed.all_reduce in place."""
        return self.op_dist_allreduce(t)

    def op_dist_allreduce_floor_torch(self, t: Any) -> Call:
        """The least an allreduce that honours a timeout does on torch.distributed (suite
        ``distributed``'s floor row): ``all_reduce(t, async_op=True)`` in place, then the work's
        ``wait`` with a timeout (a blocking call cannot give up on a lost peer)."""
        from datetime import timedelta

        import torch.distributed as tdist

        limit = timedelta(seconds=300)

        def floor() -> None:
            tdist.all_reduce(t, async_op=True).wait(timeout=limit)
        return floor, (), "torch.distributed.all_reduce(t, async_op=True).wait(timeout=...) (in place)"

    def op_allreduce_framework(self, bufs: list[Any]) -> Call | None:
        """NCCL's allreduce in place on preallocated buffers, one per GPU (the nccl-tests baseline)."""
        t = self.torch
        if len(bufs) < 2 or any(b.device.type != "cuda" for b in bufs) or not t.cuda.nccl.is_available(bufs):
            return None
        return t.cuda.nccl.all_reduce, (bufs,), "torch.cuda.nccl.all_reduce(bufs) (in place)"

    def op_allreduce_d2l(self, bufs: list[Any]) -> Call | None:
        """D2L's allreduce written in torch: add everything into the first device, copy the sum back."""
        if len(bufs) < 2:
            return None

        def d2l(bufs: list[Any]) -> list[Any]:
            for b in bufs[1:]:
                bufs[0][:] += b.to(bufs[0].device)
            for b in bufs[1:]:
                b[:] = bufs[0].to(b.device)
            return bufs
        return d2l, (bufs,), "D2L allreduce (copy-and-add into device 0, copy back)"

    def op_from_dlpack(self, x: Any) -> Call:
        """torch as a DLPack consumer (the native side of convert(x, 'torch'))."""
        return self.torch.from_dlpack, (x,), "torch.from_dlpack(x)"

    def op_d2h_book(self, ys: list[Any]) -> Call:
        """D2L's recipe: every result copied with .to('cpu', non_blocking=True), then a device sync."""
        t = self.torch

        def book(ys: list[Any]) -> list[Any]:
            out = [y.to("cpu", non_blocking=True) for y in ys]
            for d in {y.device for y in ys if y.device.type == "cuda"}:
                t.cuda.synchronize(d)
            return out
        return book, (ys,), "[y.to('cpu', non_blocking=True) for y in ys]; torch.cuda.synchronize()"

    def _side_copy(self, y: Any, cs: Any) -> Any:
        t = self.torch
        ev = t.cuda.Event()
        ev.record(t.cuda.current_stream(y.device))
        host = t.empty(y.shape, dtype=y.dtype, pin_memory=True)
        cs.wait_event(ev)
        with t.cuda.stream(cs):
            host.copy_(y, non_blocking=True)
        y.record_stream(cs)
        return host

    def op_copy_alone(self, ys: list[Any]) -> Call | None:
        """The copies alone: every (already computed) result into pinned memory on a side stream."""
        t = self.torch
        if not ys or ys[0].device.type != "cuda":
            return None
        cs = t.cuda.Stream(ys[0].device)

        def copies(ys: list[Any]) -> list[Any]:
            out = [self._side_copy(y, cs) for y in ys]
            cs.synchronize()
            return out
        return copies, (ys,), "side-stream copies into pinned memory; stream sync"

    def op_overlap_bound(self, mm: Callable[[Any, Any], Any], x: Any, k: int) -> Call | None:
        """The best overlap torch allows, written by hand: each result's copy on a side stream into
        pinned memory, waiting on an event recorded after its producer."""
        t = self.torch
        if x.device.type != "cuda":
            return None
        cs = t.cuda.Stream(x.device)

        def bound(x: Any) -> list[Any]:
            out = [self._side_copy(mm(x, x), cs) for _ in range(k)]
            cs.synchronize()
            return out
        return bound, (x,), "per result: event; copy stream waits; pinned.copy_(y, non_blocking=True); sync"
    # -- D2L 12.1 (suite "compile"): the MLP and torch's own compilers --------------------------
    def mlp_d2l(self, weights: list[np.ndarray], dev: Device) -> Callable[[], Any]:
        """Fresh ``nn.Sequential`` MLPs (Linear + ReLU, as D2L) holding ``weights``, on ``dev``."""
        t = self.torch
        nn = t.nn

        def make() -> Any:
            layers: list[Any] = []
            for i in range(0, len(weights), 2):
                w, b = weights[i], weights[i + 1]
                lin = nn.Linear(w.shape[0], w.shape[1])
                with t.no_grad():
                    lin.weight.copy_(t.from_numpy(w.T.copy()))
                    lin.bias.copy_(t.from_numpy(b))
                layers += [lin, nn.ReLU()]
            return nn.Sequential(*layers[:-1]).to(self.dev(dev))
        return make

    def compiled_d2l(self, make: Callable[[], Any], x: Any, dev: Device, quick: bool) -> dict[str, Any]:
        """torch's compilers, each on a fresh net: TorchScript (D2L's), a trace, and torch.compile
        (default mode; reduce-overhead, i.e. CUDA graphs, on a GPU) except in quick runs (seconds
        of compilation)."""
        import warnings

        t = self.torch
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch >= 2.10 deprecates torch.jit
            out = {"torch.jit.script": t.jit.script(make()), "torch.jit.trace": t.jit.trace(make(), (x,))}
        if not quick:
            out["torch.compile"] = t.compile(make())
            if dev.kind == "gpu":
                out["torch.compile(mode='reduce-overhead')"] = t.compile(make(), mode="reduce-overhead")
        return out

    # -- suite "models": the framework's own model, its move, and the one-device training step --
    def model_d2l(self, kind: str, dev: Device, seed: int = 0) -> Any:
        """D2L's LeNet (``"lenet"``: 1x28x28 -> 10, sigmoid, average pooling) or an MLP
        (``"mlp:1024-4096-4096-10"``, ReLU) as an ``nn.Sequential`` on ``dev``, seeded."""
        t = self.torch
        nn = t.nn
        t.manual_seed(seed)
        if kind == "lenet":
            net = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.Sigmoid(), nn.AvgPool2d(2, 2),
                                nn.Conv2d(6, 16, 5), nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Flatten(),
                                nn.Linear(400, 120), nn.Sigmoid(), nn.Linear(120, 84), nn.Sigmoid(), nn.Linear(84, 10))
        else:
            sizes = [int(s) for s in kind.split(":")[1].split("-")]
            layers: list[Any] = []
            for i in range(len(sizes) - 1):
                layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
            net = nn.Sequential(*layers[:-1])
        return net.to(self.dev(dev))

    def op_model_to(self, model: Any, dev: Device) -> Call:
        """``module.to(device)``: parameters and buffers moved in place (nothing when resident)."""
        return model.to, (self.dev(dev),), "module.to(device)"

    def train_d2l(self, kind: str, dev: Device, seed: int = 0) -> tuple[list[Any], Callable[..., Any]]:
        """The model's parameters (leaves that require grad, on ``dev``) and its summed
        cross-entropy ``loss(params, X, y)`` calling the model functionally (for md.train_batch and
        for the native step alike)."""
        t = self.torch
        F = t.nn.functional
        net = self.model_d2l(kind, dev, seed)
        names = [n for n, _ in net.named_parameters()]
        params = [p.detach().clone().requires_grad_() for p in net.parameters()]

        def loss(ps: list[Any], X: Any, y: Any) -> Any:
            return F.cross_entropy(t.func.functional_call(net, dict(zip(names, ps)), (X,)), y, reduction="sum")
        return params, loss

    def op_train_step(self, params: list[Any], loss: Callable[..., Any], X: Any, y: Any, dev: Device,
                      lr: float) -> Call:
        """One SGD step written in torch, the step md.train_batch takes on one device: the batch to
        the device, the gradients by ``torch.autograd.grad``, ``p.sub_(g, alpha=lr / B)`` under
        ``no_grad``, the loss read with ``.item()``."""
        t = self.torch
        d = self.dev(dev)
        step = lr / X.shape[0]

        def train_step(X: Any, y: Any) -> float:
            X, y = X.to(d), y.to(d)
            with t.enable_grad():
                value = loss(params, X, y)
                grads = t.autograd.grad(value, params)
            with t.no_grad():
                for p, g in zip(params, grads):
                    p.sub_(g, alpha=step)
            return value.item()
        return train_step, (X, y), "X.to(d); autograd.grad(loss(params, X, y), params); p.sub_(g, alpha=lr/B); .item()"
