"""Data parallelism for PyTorch (:class:`~multidev.adapter.SupportsDataParallel`): an ``nn.Module``
and any ``torch.optim`` optimizer, trained in place.

One device per process: the module itself is the replica (no copy, no wrapper, so its
``state_dict`` has no prefix). Its gradients reach the core's buckets from a
``register_post_accumulate_grad_hook`` per parameter, so a bucket's collective starts while the
backward pass goes on, and an autograd-engine callback at the end of the pass writes the averaged
gradients into ``.grad``: ``loss.backward(); optimizer.step()`` written by hand works as with
DistributedDataParallel. A forward pre-hook takes rank 0's buffers before each training forward.

Several devices of one process (GPUs): ``nn.DataParallel``'s scheme without its re-replication
each step: a copy of the module per further device, the batch split by rows, each copy's gradients
added into the first's (weighted by its rows), the optimizer's step on the first, its parameters and
buffers copied back out. torch has one CPU device, so this mode needs GPUs.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from multidev.adapter import (
    CapabilityError,
    Concern,
    Device,
    InvalidArgumentError,
    Ready,
    Replica,
    SupportsDataParallel,
)

from .core import TorchCore

#: torch optimizers whose update is element by element: a piece of a parameter steps as it would
#: within the whole (multidev's own sharding of their state; not LBFGS, Adafactor, SparseAdam...)
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "ASGD",
               "Rprop")


def piece_refusal(torch: Any, opt: Any) -> None:
    """CapabilityError where multidev cannot shard ``opt``'s state (its update is not known to be
    element by element, or it has stepped already); None otherwise."""
    kind = type(opt).__name__
    if kind not in ELEMENTWISE or type(opt) is not getattr(torch.optim, kind, None):
        raise CapabilityError(f"data_parallel(param_axis=...): multidev cannot shard a {kind}'s state (its update "
                              "is not known to be element by element: a piece would step differently); sharded: "
                              f"torch.optim.{', '.join(ELEMENTWISE)}")
    # (Adagrad fills its state when it is made: a step count of 0 is a fresh state)
    if any(st and float(st.get("step", 1)) > 0 for st in opt.state.values()):
        raise CapabilityError("data_parallel(param_axis=...): the optimizer has stepped already, and its state "
                              "cannot be cut into pieces; give data_parallel a fresh optimizer")


class TorchParallel(Concern, SupportsDataParallel):
    """``nn.Module`` + ``torch.optim.Optimizer`` replicas."""

    core: TorchCore

    def piece_refusal(self, model: Any, optimizer: Any) -> None:
        """What :meth:`TorchReplica.piece_optimizer` would refuse, raised before a replica is made
        (nothing here for what the replica refuses itself)."""
        torch = self.core.torch
        if isinstance(model, torch.nn.Module) and isinstance(optimizer, torch.optim.Optimizer):
            piece_refusal(torch, optimizer)

    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        torch = self.core.torch
        if not isinstance(model, torch.nn.Module):
            return None
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidArgumentError(f"data_parallel: a torch module trains with a torch.optim.Optimizer, got "
                                       f"{type(optimizer).__name__}")
        mine = {id(p) for p in model.parameters()}
        if optimizer is not None:
            stray = [i for i, g in enumerate(optimizer.param_groups) for p in g["params"] if id(p) not in mine]
            if stray:
                raise InvalidArgumentError(f"data_parallel: the optimizer holds {len(stray)} tensor(s) that are not "
                                           "parameters of the model (build the optimizer on this model's "
                                           "parameters, after moving the model)")
        where = {self.core.from_native_device(t.device) for t in (*model.parameters(), *model.buffers())}
        if where - {devices[0]}:
            raise InvalidArgumentError(f"data_parallel: the model's tensors are on {sorted(map(str, where))}, not on "
                                       f"{devices[0]}: move it there first (md.to(model, dev)), then build the "
                                       "optimizer")
        if len(devices) == 1:
            return TorchReplica(self.core, torch, model, optimizer, list(devices))
        return TorchDevicesReplica(self.core, torch, model, optimizer, list(devices))


class TorchReplica(Replica):
    """The module itself on its one device."""

    def __init__(self, backend: Any, torch: Any, model: Any, optimizer: Any, devices: list[Device]) -> None:
        self.backend, self.torch, self.model, self.optimizer, self.devices = backend, torch, model, optimizer, devices
        self._named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._params = [p for _, p in self._named]
        self._handles: list[Any] = []  # (the gradients are dropped by DataParallel once it is made)

    def parameters(self) -> list[tuple[str, Any]]:
        return list(self._named)

    def buffers(self) -> list[tuple[str, Any]]:
        return list(self.model.named_buffers())

    def load(self, params: Sequence[Any] | None, buffers: Sequence[Any] | None) -> None:
        with self.torch.no_grad():
            for p, v in zip(self._params, params or ()):
                p.copy_(v)
            for (_, b), v in zip(self.model.named_buffers() if buffers is not None else (), buffers or ()):
                b.copy_(v)

    def optimizer_state(self) -> Any:
        return None if self.optimizer is None else self.optimizer.state_dict()

    def load_optimizer_state(self, state: Any) -> None:
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state)

    def _loss(self, model: Any, batch: Any, loss_fn: Callable[..., Any]) -> Any:
        if self.optimizer is None:
            raise InvalidArgumentError("DataParallel.step needs the optimizer: data_parallel(model, optimizer)")
        loss = loss_fn(model, batch)
        if not isinstance(loss, self.torch.Tensor) or loss.numel() != 1:
            raise InvalidArgumentError(f"DataParallel.step: loss_fn must return a scalar tensor, got "
                                       f"{getattr(loss, 'shape', type(loss).__name__)}")
        return loss

    def backward(self, batch: Any, loss_fn: Callable[..., Any], ready: Ready | None) -> Any:
        loss = self._loss(self.model, batch, loss_fn)
        loss.backward()
        if ready is not None:
            for i, p in enumerate(self._params):
                if p.grad is not None:
                    ready(i, p.grad)
        return loss.detach()

    def apply(self, grads: Sequence[Any | None] | None) -> None:
        if grads is not None:
            for p, g in zip(self._params, grads):
                p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def drop_gradients(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def attach(self, sync: Any) -> bool:
        torch = self.torch
        queued = [False]

        def finish() -> None:  # the end of the backward pass: the averaged gradients into .grad
            queued[0] = False
            for p, g in zip(self._params, sync.finish()):
                p.grad = g

        def hook_for(i: int) -> Callable[[Any], None]:
            def hook(p: Any) -> None:
                if not sync.active:
                    return
                if not queued[0]:
                    queued[0] = True
                    torch.autograd.Variable._execution_engine.queue_callback(finish)
                try:
                    sync.ready(i, p.grad)
                except BaseException:
                    queued[0] = False  # the backward pass ends here: torch drops the queued finish
                    raise
            return hook

        def before(module: Any, args: Any) -> None:
            queued[0] = False  # (a backward pass that raised elsewhere left its finish unrun)
            if module.training and torch.is_grad_enabled():
                sync.before_forward()

        self._handles = [p.register_post_accumulate_grad_hook(hook_for(i)) for i, p in enumerate(self._params)]
        self._handles.append(self.model.register_forward_pre_hook(before))
        return True

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


    def piece_optimizer(self, pieces: list[Any]) -> Any:
        """The optimizer's class over new parameters holding the ``pieces`` on their device, in param
        groups as the given optimizer's, with their settings (see
        :meth:`multidev.adapter.Replica.piece_optimizer`)."""
        torch, opt = self.torch, self.optimizer
        piece_refusal(torch, opt)
        at = {id(p): i for i, p in enumerate(self._params)}
        made = [None if x is None else torch.nn.Parameter(x.detach().clone()) for x in pieces]
        groups, follows = [], []  # the pieces' groups, and the given optimizer's group each follows
        for j, g in enumerate(opt.param_groups):
            mine = [made[at[id(p)]] for p in g["params"] if id(p) in at and made[at[id(p)]] is not None]
            if mine:
                groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": mine})
                follows.append(j)
        held = [p for p in made if p is not None]
        if len(held) != sum(len(g["params"]) for g in groups):
            raise CapabilityError("data_parallel(param_axis=...): the optimizer does not hold every trained "
                                  "parameter of the model (freeze the others with requires_grad=False)")
        new = type(opt)(groups)
        if "initial_accumulator_value" in opt.defaults:  # (Adagrad fills its sums from its constructor's value)
            v = opt.defaults["initial_accumulator_value"]
            with torch.no_grad():
                for p, st in new.state.items():
                    st["sum"].fill_(complex(v, v) if torch.is_complex(p) else v)  # (torch's own rule)
        return _TorchPieces(torch, new, held, opt, follows)

    def zeros_like(self, x: Any) -> Any:
        return self.torch.zeros_like(x)

    def flatten(self, tensors: Sequence[Any], dtype: str | None) -> Any:
        flat = self.torch.cat([t.reshape(-1) for t in tensors])
        return flat if dtype is None else flat.to(self.backend.to_native_dtype(dtype))

    def unflatten(self, flat: Any, like: Sequence[Any], scale: float | None) -> list[Any]:
        if flat.dtype != like[0].dtype:
            flat = flat.to(like[0].dtype)
        if scale is not None and scale != 1.0:
            flat = flat.mul_(scale)
        parts = self.torch.split(flat, [t.numel() for t in like])
        return [p.view(t.shape) for p, t in zip(parts, like)]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


class TorchDevicesReplica(TorchReplica):
    """The module on the first device and a copy on each further one, kept equal after each step."""

    def __init__(self, backend: Any, torch: Any, model: Any, optimizer: Any, devices: list[Device]) -> None:
        super().__init__(backend, torch, model, optimizer, devices)
        self._copies = [copy.deepcopy(model).to(backend.to_native_device(d)) for d in devices[1:]]
        self._copy_params = [[p for _, p in c.named_parameters() if p.requires_grad] for c in self._copies]

    def _shard(self, batch: Any, sizes: list[int]) -> list[Any]:
        torch = self.torch
        if isinstance(batch, torch.Tensor):
            return [part.to(self.backend.to_native_device(d), non_blocking=True)
                    for part, d in zip(torch.split(batch, sizes), self.devices)]
        if isinstance(batch, (tuple, list)):
            return [type(batch)(z) for z in zip(*(self._shard(x, sizes) for x in batch))]
        if isinstance(batch, dict):
            cols = {k: self._shard(v, sizes) for k, v in batch.items()}
            return [{k: cols[k][d] for k in batch} for d in range(len(self.devices))]
        raise InvalidArgumentError(f"DataParallel.step: a batch is a tensor, or a tuple, list or dict of tensors; got "
                                   f"{type(batch).__name__}")

    def _rows(self, batch: Any) -> int:
        torch = self.torch
        if isinstance(batch, torch.Tensor):
            return int(batch.shape[0]) if batch.ndim else 0
        first = next(iter(batch.values() if isinstance(batch, dict) else batch), None)
        return 0 if first is None else self._rows(first)

    def backward(self, batch: Any, loss_fn: Callable[..., Any], ready: Ready | None) -> Any:
        n = self._rows(batch)
        if n < len(self.devices):
            raise InvalidArgumentError(f"DataParallel.step: a batch of {n} rows cannot give each of "
                                       f"{len(self.devices)} devices a row")
        sizes = [len(p) for p in np.array_split(np.empty(n, dtype=np.int8), len(self.devices))]
        dev0 = self.backend.to_native_device(self.devices[0])
        total = None
        for m, shard, rows in zip([self.model, *self._copies], self._shard(batch, sizes), sizes):
            loss = self._loss(m, shard, loss_fn) * (rows / n)
            loss.backward()
            total = loss.detach().to(dev0) if total is None else total + loss.detach().to(dev0)
        with self.torch.no_grad():  # the copies' gradients added into the first's
            for i, p in enumerate(self._params):
                for ps in self._copy_params:
                    g = ps[i].grad
                    if g is not None:
                        p.grad = g.to(dev0) if p.grad is None else p.grad.add_(g.to(dev0))
                        ps[i].grad = None
                if ready is not None and p.grad is not None:
                    ready(i, p.grad)
        return total

    def apply(self, grads: Sequence[Any | None] | None) -> None:
        super().apply(grads)
        with self.torch.no_grad():
            for c, ps in zip(self._copies, self._copy_params):
                for p, q in zip(self._params, ps):
                    q.copy_(p, non_blocking=True)
                for (_, b), (_, cb) in zip(self.model.named_buffers(), c.named_buffers()):
                    cb.copy_(b, non_blocking=True)

    def load(self, params: Sequence[Any] | None, buffers: Sequence[Any] | None) -> None:
        super().load(params, buffers)
        with self.torch.no_grad():
            for c, ps in zip(self._copies, self._copy_params):
                for p, q in zip(self._params, ps):
                    q.copy_(p)
                for (_, b), (_, cb) in zip(self.model.named_buffers(), c.named_buffers()):
                    cb.copy_(b)

    def drop_gradients(self) -> None:
        super().drop_gradients()
        for c in self._copies:
            c.zero_grad(set_to_none=True)

    def attach(self, sync: Any) -> bool:
        return False  # the hooks of the first copy would fire before the others' gradients exist

    def fingerprints(self) -> list[list[int]]:
        import zlib

        rows = []
        for m, ps in zip([self.model, *self._copies], [self._params, *self._copy_params]):
            ts = [*ps, *(b for _, b in m.named_buffers())]
            rows.append([zlib.crc32(t.detach().cpu().contiguous().view(-1).view(self.torch.uint8).numpy().tobytes())
                         & 0x7FFFFFFF for t in ts])
        return rows

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


class _TorchPieces:
    """A torch optimizer over one rank's (or device's) pieces of the parameters (parameters of their
    own), following the user's optimizer ``given``: each group's settings (a learning rate set by
    hand or by a scheduler, the weight decay) read at each step."""

    def __init__(self, torch: Any, optimizer: Any, params: list[Any], given: Any, follows: list[int]) -> None:
        self.torch, self.optimizer, self.params, self.given = torch, optimizer, params, given
        self._follows = follows  # for each of the pieces' groups, the given optimizer's group it follows

    def step(self, grads: Sequence[Any], values: Sequence[Any]) -> list[Any]:
        torch = self.torch
        for mine, j in zip(self.optimizer.param_groups, self._follows):
            mine.update({k: v for k, v in self.given.param_groups[j].items() if k != "params"})
        with torch.no_grad():
            for p, x, g in zip(self.params, values, grads):
                p.copy_(x)
                p.grad = g.detach().to(p.dtype).contiguous()  # (a no-op where it is so already)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return [p.detach().clone() for p in self.params]
