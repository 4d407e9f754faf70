"""Training with sharded parameters for PyTorch (:class:`~multidev.adapter.SupportsShardedTraining`):
torch's own FSDP2 (``torch.distributed.fsdp.fully_shard``) over a process mesh, one process per
device, for ``multidev.data_parallel(model, optimizer, mesh=process_mesh, param_axis=...)`` under
the torch engine (FSDP2 runs on torch.distributed's process group, which only that engine starts).

The ranks along the parameter axes hold one piece each of every parameter and of its optimizer
state (FSDP2's rule: cut along the first dimension, the last piece padded), gathered for each
forward and backward pass of a submodule and freed after; the other axes replicate the pieces
(HSDP: a 2-d ``DeviceMesh``, replicas first). Every rank trains on the batch it is given, and the
gradients are averaged over all ranks (reduce-scattered along the parameter axes, all-reduced along
the others): ranks along the parameter axes that are given the same rows compute the same gradient,
so the mean is the same. Each child module that holds parameters is sharded as one unit, then the
root (FSDP2's recommended wrapping). The optimizer given is kept: its parameter groups and any state
it has are moved to the sharded parameters (FSDP2 replaces them), so building it before wrapping is
fine. One process over several devices is not a mode of FSDP2: CapabilityError.
"""
from __future__ import annotations

import zlib
from collections import defaultdict
from typing import Any

import numpy as np

from multidev.adapter import CapabilityError, Concern, InvalidArgumentError, SupportsShardedTraining

from .core import TorchCore
from .parallel import TorchReplica


class TorchShardedTraining(Concern, SupportsShardedTraining):
    """``nn.Module`` + ``torch.optim`` sharded with FSDP2 over the processes of a torch group."""

    core: TorchCore
    one_process_mesh = False  # (FSDP2 runs one process per device: a one-process mesh is multidev's own)
    process_engine = "torch"  # (FSDP2 runs on torch.distributed's group; under other engines: multidev's own)

    def sharded_replica(self, model: Any, optimizer: Any, mesh: Any, data_axes: tuple[str, ...],
                        layout_for: Any) -> Any:
        if not isinstance(model, self.core.torch.nn.Module):
            return None
        raise CapabilityError("data_parallel(mesh=...) over one process's devices: torch shards parameters with "
                              "FSDP2, one process per device; use a process mesh (multidev.distributed.process_mesh) "
                              "under the torch engine")

    def sharded_process_replica(self, model: Any, optimizer: Any, grid: Any, data_axes: tuple[str, ...],
                                param_axes: tuple[str, ...], grad_dtype: str | None) -> Any:
        """A replica of ``model`` sharded with FSDP2: ``grid`` the process mesh (``shape``,
        ``axis_names``, ``size``: the group's ranks row-major), ``param_axes`` the axes the
        parameters are cut along (the others replicate them); ``grad_dtype`` the dtype gradients
        are reduced in. None where ``model`` is no ``nn.Module``."""
        torch = self.core.torch
        if not isinstance(model, torch.nn.Module):
            return None
        import torch.distributed as tdist

        if not tdist.is_available() or not tdist.is_initialized():
            raise CapabilityError("data_parallel over a process mesh shards a torch model with FSDP2, which runs on "
                                  "torch.distributed's process group: start the group with the torch engine "
                                  "(torchrun, or python -m multidev.distributed.launch --engine torch)")
        if tdist.get_world_size() != grid.size:
            raise CapabilityError(f"data_parallel: the process mesh has {grid.size} ranks, torch.distributed's "
                                  f"group {tdist.get_world_size()}")
        devices = {t.device for t in (*model.parameters(), *model.buffers())}
        if len(devices) != 1:
            raise InvalidArgumentError(f"data_parallel: the model's tensors are on {sorted(map(str, devices))}: move "
                                       "it to one device first (md.to(model, dev))")
        return TorchFsdpReplica(self.core, torch, model, optimizer, grid, param_axes, next(iter(devices)),
                                grad_dtype)


class TorchFsdpReplica(TorchReplica):
    """The module sharded in place by FSDP2; its optimizer moved onto the sharded parameters."""

    #: FSDP2 reduces the gradients itself: the core runs no gradient buckets and no start broadcast.
    syncs_itself = True
    #: A parameter without a gradient at the optimizer's step: "error" (named) or "zero" (the core sets it).
    unused = "error"

    def __init__(self, backend: Any, torch: Any, model: Any, optimizer: Any, grid: Any,
                 param_axes: tuple[str, ...], device: Any, grad_dtype: str | None) -> None:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.distributed.tensor import distribute_tensor

        names = list(grid.axis_names)
        shard = [names.index(a) for a in param_axes]
        rep = [i for i in range(len(names)) if i not in shard]
        ranks = np.arange(grid.size).reshape(grid.shape)  # row-major, as the process mesh lays them out
        r_size = int(np.prod([grid.shape[i] for i in rep])) if rep else 1
        grid2 = ranks.transpose(rep + shard).reshape(r_size, -1)
        kind = "cuda" if device.type == "cuda" else device.type
        if r_size == 1:
            mesh = DeviceMesh(kind, torch.as_tensor(grid2[0]), mesh_dim_names=("shard",))
        else:
            mesh = DeviceMesh(kind, torch.as_tensor(grid2), mesh_dim_names=("replicate", "shard"))
        me = int(torch.distributed.get_rank())
        where = np.argwhere(grid2 == me)[0]
        #: the ranks that hold the same pieces as this one (a replicate group), as group ranks
        self.peers = tuple(tuple(int(r) for r in grid2[:, j]) for j in range(grid2.shape[1]))
        self.piece = int(where[1])
        policy = MixedPrecisionPolicy(reduce_dtype=getattr(torch, grad_dtype) if grad_dtype else None)
        by_name = {id(p): n for n, p in model.named_parameters()}
        groups = [] if optimizer is None else [[by_name[id(p)] for p in g["params"]] for g in optimizer.param_groups]
        state = {} if optimizer is None else {by_name[id(p)]: s for p, s in optimizer.state.items() if id(p) in by_name}
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        new = dict(model.named_parameters())
        if optimizer is not None:
            for g, ns in zip(optimizer.param_groups, groups):
                g["params"] = [new[n] for n in ns]

            def piece(v: Any, p: Any) -> Any:  # a state tensor shaped like its parameter: cut as it is
                if isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(p.shape) and v.ndim:
                    return distribute_tensor(v.to(p.device), p.device_mesh, p.placements)
                return v
            # distribute_tensor is a collective: every rank cuts the state in one order (the parameters',
            # each one's keys sorted), whatever order its optimizer's state dict holds them in
            order = [n for ns in groups for n in ns if n in state]
            optimizer.state = defaultdict(dict, {new[n]: {k: piece(state[n][k], new[n]) for k in sorted(state[n])}
                                                 for n in order})
        super().__init__(backend, torch, model, optimizer, [backend.from_native_device(device)])

    def load(self, params: Any, buffers: Any) -> None:
        if params is not None:
            raise CapabilityError("data_parallel over a process mesh: the parameters are sharded; load a checkpoint "
                                  "into the plain model on every rank before data_parallel (which takes rank 0's "
                                  "state at its start), or use torch.distributed.checkpoint")
        super().load(None, buffers)

    def _sync(self, on: bool) -> None:
        if getattr(self, "_syncing", True) != on:  # (FSDP2's default: on) only a change walks the modules
            self.model.set_requires_gradient_sync(on)
            self._syncing = on

    def backward(self, batch: Any, loss_fn: Any, ready: Any) -> Any:
        self._sync(False)  # accumulation (no_sync): the next step reduces the sum
        return super().backward(batch, loss_fn, None)

    def local_step(self, batch: Any, loss_fn: Any) -> Any:
        self._sync(True)
        loss = super().backward(batch, loss_fn, None)
        self.apply(None)
        return loss

    def apply(self, grads: Any) -> None:
        missing = [n for n, p in self._named if p.grad is None]
        if missing and self.unused == "error":
            self.optimizer.zero_grad(set_to_none=True)
            raise InvalidArgumentError(f"data_parallel: {len(missing)} parameter(s) received no gradient in this "
                                       f"step: {', '.join(missing[:5])} (data_parallel(unused='zero') counts them "
                                       "as zero)")
        for _, p in self._named:
            if p.grad is None:
                p.grad = self.torch.zeros_like(p)
        super().apply(None)

    def fingerprints(self) -> list[list[int]]:
        """One row: this rank's pieces of the parameters, then the buffers."""
        torch = self.torch

        def local(t: Any) -> Any:
            t = t.to_local() if hasattr(t, "to_local") else t
            return zlib.crc32(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()) & 0x7FFFFFFF
        return [[local(p) for p in self._params] + [local(b) for _, b in self.model.named_buffers()]]
