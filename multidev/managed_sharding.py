"""The optimizer's state sharded over processes by multidev itself (ZeRO's stage 1), for the
frameworks with no sharded data parallelism of their own (Keras, Gluon): what
``multidev.data_parallel(model, optimizer, mesh=process_mesh, param_axis=...)`` builds for them.

Each rank holds the whole model (its forward and backward run as in plain data parallelism) and
updates only its piece of each parameter, with an optimizer over those pieces: the optimizer's state
(Adam's moments, momentum) is held once over the ranks along the parameter axes, not on every rank.
A step:

1. forward and backward on this rank's rows (the batch cut along the data axes; ranks along the
   parameter axes are given the same rows, so they compute the same gradient), then one consistency
   exchange over every rank (the step's collectives, and a parameter without a gradient decided by
   all alike): nothing is stepped on any rank before every rank agreed;
2. the gradients averaged over the data axes (one flattened allreduce along them);
3. each rank's piece of each gradient (the core's layout rule, :func:`multidev.adapter.param_spec`:
   the first dimension the parameter axes divide evenly; a parameter no dimension divides is whole on
   every rank and updated by all alike) stepped by the piece optimizer;
4. the updated pieces gathered along the parameter axes (one flattened allgather) into the model.

Over one process's devices (``data_parallel(model, optimizer, mesh=md.make_mesh(...), param_axis=...)``),
:class:`ManagedDeviceShardedReplica` does the same without processes: the framework's own replica
over every device of the mesh computes the batch's mean gradient (on the first device), piece ``k``
of each parameter is stepped on the ``k``-th device along the parameter axes (those of the mesh's
first device) by an optimizer whose state lives there, and the updated pieces make the model's new
weights on every device.

The pieces' optimizer is the adapter's (:meth:`multidev.adapter.Replica.piece_optimizer`): the
optimizer given, rebuilt over the pieces with its configuration and no state, so it must start
fresh and update element by element (Adam, SGD, RMSprop...; not LAMB's per-tensor trust ratio or a
norm clip over a whole tensor: the adapter refuses those with CapabilityError). The optimizer given
stays the user's handle: its learning rate and weight decay, changed between steps, are the
pieces' at the next step, and its step count follows theirs. The model is the source of the
weights: each step starts the pieces from the model's values.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from .errors import CapabilityError, InvalidArgumentError
from .replicas import Replica, param_spec

__all__ = ["ManagedDeviceShardedReplica", "ManagedShardedReplica", "has_piece_optimizer"]


def has_piece_optimizer(rep: Replica) -> bool:
    """Whether ``rep``'s class gives an optimizer over pieces (overrides ``piece_optimizer``)."""
    return type(rep).piece_optimizer is not Replica.piece_optimizer


class _PiecesReplica(Replica):
    """What both managed sharded replicas share: ``plain`` (the framework's replica of the whole
    model) runs the forward and backward, and an optimizer over pieces steps in :meth:`local_step`."""

    #: the core runs no gradient buckets: :meth:`local_step` exchanges what it needs
    syncs_itself = True
    #: a parameter without a gradient at the step: "error" (named) or "zero"
    unused = "error"
    #: how the refusals name this mode
    _what = "data_parallel with param_axis"

    def __init__(self, plain: Replica, mesh: Any, param_axes: tuple[str, ...]) -> None:
        self.plain, self.mesh, self.param_axes = plain, mesh, param_axes
        self.backend, self.optimizer = plain.backend, plain.optimizer
        self.devices = plain.devices
        if plain.optimizer is None:
            raise InvalidArgumentError(f"{self._what} needs the optimizer: data_parallel(model, optimizer, mesh=..., "
                                       "param_axis=...)")
        self._shapes = [tuple(self.backend.shape_of(p)) for _, p in plain.parameters()]
        #: per parameter: the dimension cut along the parameter axes, None where it is whole everywhere
        self._cut = [next((d for d, s in enumerate(param_spec(mesh.sizes, shp, param_axes)) if s is not None), None)
                     for shp in self._shapes]

    def _gradients(self, batch: Any, loss_fn: Callable[..., Any], n: int) -> tuple[Any, list[Any]]:
        """(the loss, the ``n`` parameters' gradients, None where one got none) of one backward of
        ``plain``, whose own gradients are dropped (the pieces step: the plain replica keeps none)."""
        grads: list[Any] = [None] * n

        def got(i: int, g: Any) -> None:
            grads[i] = g
        try:
            loss = self.plain.backward(batch, loss_fn, got)
        finally:
            self.plain.drop_gradients()
        return loss, grads

    def _refuse_missing(self, grads: Sequence[Any]) -> None:
        """InvalidArgumentError naming the parameters without a gradient, where ``unused`` is "error"."""
        missing = [i for i, g in enumerate(grads) if g is None]
        if missing and self.unused == "error":
            names = [n for n, _ in self.plain.parameters()]
            raise InvalidArgumentError(f"data_parallel: {len(missing)} parameter(s) received no gradient in this "
                                       f"step: {', '.join(names[i] for i in missing[:5])} (data_parallel("
                                       "unused='zero') counts them as zero)")

    @property
    def model(self) -> Any:
        """The plain replica's model now (a JAX tree is rebound each step)."""
        return self.plain.model

    # -- what the core asks of a replica -------------------------------------------------------------
    def parameters(self) -> list[tuple[str, Any]]:
        return self.plain.parameters()

    def buffers(self) -> list[tuple[str, Any]]:
        return self.plain.buffers()

    def backward(self, batch: Any, loss_fn: Callable[..., Any], ready: Any) -> Any:
        return self.plain.backward(batch, loss_fn, None)  # (no_sync: accumulate; the next step takes the sum)

    def drop_gradients(self) -> None:
        self.plain.drop_gradients()

    def apply(self, grads: Sequence[Any | None] | None) -> None:
        raise CapabilityError(f"{self._what} steps in DataParallel.step (local_step)")

    def zeros_like(self, x: Any) -> Any:
        return self.plain.zeros_like(x)

    def fingerprints(self) -> list[list[int]]:
        return self.plain.fingerprints()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.plain.forward(*args, **kwargs)


class ManagedShardedReplica(_PiecesReplica):
    """``plain`` (a replica of the whole model on this rank's device; made before rank 0's state is
    broadcast, so the adapter's refusals come before anything moves) trained with its optimizer's
    state sharded over ``param_axes`` of the process mesh ``mesh`` (see the module doc)."""

    _what = "data_parallel over a process mesh"

    def __init__(self, plain: Replica, mesh: Any, rank: int, data_axes: tuple[str, ...],
                 param_axes: tuple[str, ...], grad_dtype: str | None) -> None:
        super().__init__(plain, mesh, param_axes)
        self.data_axes, self.grad_dtype = data_axes, grad_dtype
        b = self.backend
        self._group = mesh.group_of(rank, param_axes)  # the ranks holding the other pieces, in gather order
        self._k, self._n = self._group.index(rank), len(self._group)
        self._data_n = len(mesh.group_of(rank, data_axes))
        params = [t for _, t in plain.parameters()]
        dtypes = sorted({b.dtype_of(p) for p in params})
        if len(dtypes) > 1:
            raise CapabilityError(f"data_parallel over a process mesh: the parameters are of one dtype here (the "
                                  f"gradients and pieces travel flattened), got {', '.join(dtypes)}")
        self._dtype = dtypes[0] if dtypes else None
        self._pieces = self.plain.piece_optimizer([self._piece(p, i) for i, p in enumerate(params)])
        if self._pieces is None:
            raise CapabilityError(f"data_parallel over a process mesh: the {b.name} replica gives no optimizer over "
                                  "pieces")
        #: ranks that hold the same optimizer pieces (for verify: every rank holds the whole model)
        self.peers = None

    def _piece(self, t: Any, i: int) -> Any:
        d = self._cut[i]
        if d is None:
            return t
        b = self.backend
        return b.split(t, [self._shapes[i][d] // self._n] * self._n, d)[self._k]

    # -- what the core asks of a replica -------------------------------------------------------------
    def load(self, params: Sequence[Any] | None, buffers: Sequence[Any] | None) -> None:
        if params is not None:
            raise CapabilityError("data_parallel over a process mesh: the optimizer's state is sharded; load a "
                                  "checkpoint into the plain model on every rank before data_parallel (which takes "
                                  "rank 0's state at its start)")
        self.plain.load(None, buffers)

    def optimizer_state(self) -> Any:
        raise CapabilityError("data_parallel over a process mesh: each rank holds a piece of the optimizer's state; "
                              "there is no whole state to read on one rank")

    def load_optimizer_state(self, state: Any) -> None:
        raise CapabilityError("data_parallel over a process mesh: each rank holds a piece of the optimizer's state; "
                              "start from a fresh optimizer")

    def local_step(self, batch: Any, loss_fn: Callable[..., Any]) -> Any:
        from .distributed import mesh as dmesh

        loss, grads = self._gradients(batch, loss_fn, len(self._shapes))
        params = [t for _, t in self.plain.parameters()]
        cut = [i for i, d in enumerate(self._cut) if d is not None]
        length = sum(math.prod(self._shapes[i]) // self._n for i in cut)

        def check() -> tuple[tuple[Any, ...], int]:
            # a parameter without a gradient is decided by every rank alike, before anything moves:
            # the rank missing one raises naming it, the others CollectiveMismatchError naming that rank
            self._refuse_missing(grads)
            return (self.mesh, self.data_axes, self.param_axes, tuple(self._shapes), self._dtype,
                    self.grad_dtype), length

        # one consistency exchange for the step (the two collectives below are covered by it): the
        # optimizer over pieces steps only once every rank agreed, so a refused step changes nothing
        lengths = dmesh.agree_call("DataParallel.step (process mesh)", check)
        grads = [self.plain.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
        if self._data_n > 1:  # the mean over the data axes (ranks along the parameter axes hold the same)
            flat = dmesh.allreduce_along_one(self.plain.flatten(grads, self.grad_dtype), self.mesh, self.data_axes,
                                             agreed=True)
            grads = self.plain.unflatten(flat, grads, 1.0 / self._data_n)
        new = self._pieces.step([self._piece(g, i) for i, g in enumerate(grads)],
                                [self._piece(p, i) for i, p in enumerate(params)])
        whole = list(new)
        if cut:
            b = self.backend
            like = [new[i] for i in cut]
            gathered = dmesh.allgather_along_one(self.plain.flatten(like, None), self.mesh, self.param_axes, 0,
                                                 agreed=lengths)
            ranks = [self.plain.unflatten(part, like, None) for part in b.split(gathered, [length] * self._n, 0)]
            for j, i in enumerate(cut):
                whole[i] = b.concat([r[j] for r in ranks], self._cut[i])
        self.plain.load(whole, None)
        return loss


class ManagedDeviceShardedReplica(_PiecesReplica):
    """``plain`` (the framework's replica of the whole model on every device of the one-process mesh
    ``mesh``) trained with its optimizer's state cut over the devices along ``param_axes`` of the
    mesh's first device (see the module doc): piece ``k`` of each parameter (the core's layout rule)
    and its state live on the ``k``-th of them; a parameter no dimension divides is stepped whole on
    the first. Synchronous as the framework's step is; the model is updated in place."""

    def __init__(self, plain: Replica, mesh: Any, param_axes: tuple[str, ...]) -> None:
        super().__init__(plain, mesh, param_axes)
        first = mesh.devices[0]
        #: the devices holding piece 0, 1, ... of each parameter (gather order along the parameter axes)
        self.holders = next(g for g in mesh.groups(param_axes) if first in g)
        n = len(self.holders)
        params = [t for _, t in plain.parameters()]
        #: per holder: the parameters it steps (its piece of each cut one; the whole ones on the first)
        self._mine = [[i for i, d in enumerate(self._cut) if d is not None or k == 0] for k in range(n)]
        self._pieces = [self.plain.piece_optimizer([self._piece(p, i, k) if i in idx else None
                                                    for i, p in enumerate(params)]) if idx else None
                        for k, idx in enumerate(self._mine)]
        if any(o is None for o, idx in zip(self._pieces, self._mine) if idx):
            raise CapabilityError(f"data_parallel with param_axis: the {self.backend.name} replica gives no "
                                  "optimizer over pieces")

    def _on(self, t: Any, device: Any) -> Any:
        b = self.backend
        return t if b.device_of(t) == device else b.move(t, device)

    def _piece(self, t: Any, i: int, k: int) -> Any:
        """Piece ``k`` of parameter (or gradient) ``i``, on its holder."""
        d = self._cut[i]
        if d is not None:
            n = len(self.holders)
            t = self.backend.split(t, [self._shapes[i][d] // n] * n, d)[k]
        return self._on(t, self.holders[k])

    # -- what the core asks of a replica -------------------------------------------------------------
    def load(self, params: Sequence[Any] | None, buffers: Sequence[Any] | None) -> None:
        self.plain.load(params, buffers)  # (the pieces start from the model's values at each step)

    def optimizer_state(self) -> Any:
        raise CapabilityError("data_parallel with param_axis: the optimizer's state is cut over the mesh's devices; "
                              "there is no whole state to read")

    def load_optimizer_state(self, state: Any) -> None:
        raise CapabilityError("data_parallel with param_axis: the optimizer's state is cut over the mesh's devices; "
                              "start from a fresh optimizer")

    def local_step(self, batch: Any, loss_fn: Callable[..., Any]) -> Any:
        loss, grads = self._gradients(batch, loss_fn, len(self._shapes))
        self._refuse_missing(grads)  # (before any piece steps: a refused step changes nothing)
        params = [t for _, t in self.plain.parameters()]
        grads = [self.plain.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
        first = self.devices[0]
        new: dict[tuple[int, int], Any] = {}
        for k, (opt, idx) in enumerate(zip(self._pieces, self._mine)):
            if opt is None:
                continue
            out = opt.step([self._piece(grads[i], i, k) for i in idx], [self._piece(params[i], i, k) for i in idx])
            for i, t in zip(idx, out):
                new[i, k] = self._on(t, first)
        b = self.backend
        whole = [new[i, 0] if d is None else b.concat([new[i, k] for k in range(len(self.holders))], d)
                 for i, d in enumerate(self._cut)]
        buffers = [t for _, t in self.plain.buffers()]  # (the first device's running statistics: every device's)
        self.plain.load(whole, buffers or None)
        return loss
