"""Data parallelism for MXNet (:class:`~multidev.adapter.SupportsDataParallel`): a Gluon ``Block``
and its ``gluon.Trainer``, trained in place.

Several devices of one process are Gluon's own way (D2L 12.6's concise MXNet program): the
parameters on every context (``collect_params().reset_ctx(ctxs)``), the batch split over them
(``gluon.utils.split_and_load``), one ``autograd.backward`` over every context's loss (each weighted
by its share of the rows), and the Trainer's step, whose kvstore sums the contexts' gradients and
updates every copy alike. BatchNorm's running statistics (parameters with ``grad_req="null"``)
are the first context's, copied to the others after each step.

Gradients accumulate (``grad_req="add"``, cleared after each step), so ``no_sync`` works; across
processes the core averages the contexts' summed gradients, which go back into the first context's
buffers (zeros in the others) before the Trainer's step. The Trainer's ``step(1)``: the loss
function returns a mean, not the D2L sum that ``step(batch_size)`` rescales.
"""
from __future__ import annotations

import copy
import os
import tempfile
import zlib
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

from .core import MxnetCore

#: MXNet optimizers whose update is element by element: a piece of a parameter steps as it would
#: within the whole (multidev's own sharding of their state over processes)
ELEMENTWISE = ("SGD", "NAG", "Adam", "RMSProp", "AdaGrad", "AdaDelta", "Adamax", "Nadam", "Ftrl", "Signum", "FTML")


def piece_refusal(mx: Any, trainer: Any) -> None:
    """CapabilityError where multidev cannot shard ``trainer``'s optimizer state (its update is not
    known to be element by element, or it has stepped already); None otherwise."""
    opt = trainer._optimizer
    kind = type(opt).__name__
    if kind not in ELEMENTWISE or type(opt) is not getattr(mx.optimizer, kind, None):
        raise CapabilityError(f"data_parallel(param_axis=...): multidev cannot shard a {kind}'s state (its "
                              "update is not known to be element by element: a piece would step differently); "
                              f"sharded: mxnet.optimizer.{', '.join(ELEMENTWISE)}")
    if opt.num_update > opt.begin_num_update or any(u.states for u in trainer._updaters):
        raise CapabilityError("data_parallel(param_axis=...): the Trainer has stepped already, and its "
                              "optimizer's state cannot be cut into pieces; give data_parallel a fresh Trainer")

class MxnetParallel(Concern, SupportsDataParallel):
    """Gluon blocks with Gluon Trainers."""

    core: MxnetCore

    def piece_refusal(self, model: Any, optimizer: Any) -> None:
        """What :meth:`MxnetReplica.piece_optimizer` would refuse, raised before a replica moves the
        block and the Trainer onto other contexts (nothing here for what the replica refuses itself)."""
        mx = self.core.mx
        if isinstance(model, mx.gluon.Block) and isinstance(optimizer, mx.gluon.Trainer):
            piece_refusal(mx, optimizer)

    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        mx = self.core.mx
        if not isinstance(model, mx.gluon.Block):
            return None
        if optimizer is not None and not isinstance(optimizer, mx.gluon.Trainer):
            raise InvalidArgumentError(f"data_parallel: a Gluon block trains with a gluon.Trainer, got "
                                       f"{type(optimizer).__name__}")
        params = list(model.collect_params().values())
        if any(getattr(p, "_data", None) is None for p in params):
            raise InvalidArgumentError("data_parallel: initialize the block's parameters first (net.initialize(), "
                                       "then one forward for deferred shapes)")
        mine = {id(p) for p in params}
        if optimizer is not None and any(id(p) not in mine for p in optimizer._params):
            raise InvalidArgumentError("data_parallel: the Trainer holds parameters that are not the block's (build "
                                       "the Trainer on net.collect_params())")
        ctxs = [self.core.to_native_device(d) for d in devices]
        if any(p.list_ctx() != ctxs for p in params):
            if optimizer is not None and optimizer._kv_initialized:
                raise InvalidArgumentError("data_parallel: the Trainer has stepped on other contexts than "
                                           f"{ctxs}: initialize the block there first, then build the Trainer")
            model.collect_params().reset_ctx(ctxs)  # Gluon's one-process data parallelism: a copy per context
            if optimizer is not None:  # the Trainer read its contexts when it was built: read them again
                optimizer._contexts = optimizer._check_contexts()
                optimizer._updaters = [mx.optimizer.get_updater(optimizer._optimizer) for _ in optimizer._contexts]
                optimizer._reset_kvstore()
        return MxnetReplica(self.core, mx, model, optimizer, list(devices), ctxs)


class MxnetReplica(Replica):
    """The block on its contexts, and its Trainer."""

    def __init__(self, backend: Any, mx: Any, model: Any, trainer: Any, devices: list[Device], ctxs: list[Any]) -> None:
        self.backend, self.mx, self.model, self.optimizer, self.devices = backend, mx, model, trainer, devices
        self._ctxs = ctxs
        items = list(model.collect_params().items())
        self._trained = [(n, p) for n, p in items if p.grad_req != "null"]
        self._buffers = [(n, p) for n, p in items if p.grad_req == "null"]
        for _, p in self._trained:
            p.grad_req = "add"  # accumulate (no_sync); cleared after every step
        self._zero()
        self._pending = False

    def _zero(self) -> None:
        for _, p in self._trained:
            for g in p.list_grad():
                g[:] = 0

    def parameters(self) -> list[tuple[str, Any]]:
        return [(n, p.data(self._ctxs[0])) for n, p in self._trained]

    def buffers(self) -> list[tuple[str, Any]]:
        return [(n, p.data(self._ctxs[0])) for n, p in self._buffers]

    def load(self, params: Sequence[Any] | None, buffers: Sequence[Any] | None) -> None:
        for (_, p), v in zip(self._trained, params or ()):
            p.set_data(v)
        for (_, p), v in zip(self._buffers if buffers is not None else (), buffers or ()):
            p.set_data(v)

    def optimizer_state(self) -> Any:
        if self.optimizer is None:
            return None
        fd, path = tempfile.mkstemp(suffix=".states")
        os.close(fd)
        try:
            self.optimizer.save_states(path)
            with open(path, "rb") as f:
                return f.read()
        finally:
            os.unlink(path)

    def load_optimizer_state(self, state: Any) -> None:
        fd, path = tempfile.mkstemp(suffix=".states")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(state)
            self.optimizer.load_states(path)
        finally:
            os.unlink(path)

    def _rows(self, batch: Any) -> int:
        first = batch
        while isinstance(first, (tuple, list)) and first:
            first = first[0]
        shape = getattr(first, "shape", None)
        return int(shape[0]) if shape else 0

    def _split(self, batch: Any, sizes: list[int]) -> list[Any]:
        mx = self.mx
        if isinstance(batch, (tuple, list)):
            return [type(batch)(z) for z in zip(*(self._split(x, sizes) for x in batch))]
        x = batch if isinstance(batch, mx.nd.NDArray) else mx.nd.array(batch, ctx=self._ctxs[0],
                                                                          dtype=getattr(batch, "dtype", None))
        out, at = [], 0
        for n, ctx in zip(sizes, self._ctxs):
            out.append(x[at:at + n].as_in_context(ctx))
            at += n
        return out

    def backward(self, batch: Any, loss_fn: Callable[..., Any], ready: Ready | None) -> Any:
        mx = self.mx
        if self.optimizer is None:
            raise InvalidArgumentError("DataParallel.step needs the optimizer: data_parallel(model, trainer)")
        n = self._rows(batch)
        if n < len(self._ctxs):
            raise InvalidArgumentError(f"DataParallel.step: a batch of {n} rows cannot give each of "
                                       f"{len(self._ctxs)} devices a row")
        sizes = [len(p) for p in np.array_split(np.empty(n, dtype=np.int8), len(self._ctxs))]
        parts = self._split(batch, sizes)
        with mx.autograd.record():
            losses = []
            for part, rows in zip(parts, sizes):
                loss = loss_fn(self.model, part)
                if loss.size != 1:
                    raise InvalidArgumentError(f"DataParallel.step: loss_fn must return a scalar, got shape "
                                               f"{loss.shape}")
                losses.append(loss * (rows / n) if len(parts) > 1 else loss)
        mx.autograd.backward(losses)
        self._pending = True
        if ready is not None:
            for i in range(len(self._trained) - 1, -1, -1):
                ready(i, self._summed(self._trained[i][1]))
        total = losses[0].reshape((1,))  # MXNet's scalars are 1-element arrays
        for extra in losses[1:]:
            total = total + extra.reshape((1,)).as_in_context(self._ctxs[0])
        return total

    def drop_gradients(self) -> None:
        self._zero()
        self._pending = False

    def _summed(self, p: Any) -> Any:
        gs = p.list_grad()
        total = gs[0].copy()
        for g in gs[1:]:
            total += g.as_in_context(self._ctxs[0])
        return total

    def apply(self, grads: Sequence[Any | None] | None) -> None:
        if grads is not None:
            for (_, p), g in zip(self._trained, grads):
                gs = p.list_grad()
                gs[0][:] = g if g is not None else 0
                for other in gs[1:]:
                    other[:] = 0  # the Trainer sums the contexts: the average once
        if self._pending:
            self.optimizer.step(1)
        self._pending = False
        self._zero()
        for _, p in self._buffers:  # the first context's statistics on every context
            if len(self._ctxs) > 1:
                p.set_data(p.data(self._ctxs[0]))


    def piece_optimizer(self, pieces: list[Any]) -> Any:
        """A fresh copy of the Trainer's optimizer (its settings, no state) in a Trainer of its own over
        Gluon parameters holding ``pieces`` on their context, each with its parameter's ``lr_mult``
        and ``wd_mult`` (see :meth:`multidev.adapter.Replica.piece_optimizer`)."""
        mx, trainer = self.mx, self.optimizer
        opt = trainer._optimizer
        piece_refusal(mx, trainer)
        fresh = copy.deepcopy(opt)
        fresh.param_dict, fresh._index_update_count = {}, {}
        params = []
        for i, ((_, p), piece) in enumerate(zip(self._trained, pieces)):
            if piece is None:  # (a parameter this holder steps none of)
                continue
            q = mx.gluon.Parameter(f"piece{i}", shape=piece.shape, dtype=piece.dtype, lr_mult=p.lr_mult,
                                   wd_mult=p.wd_mult)
            q.initialize(ctx=piece.context)  # the pieces' device holds their state
            q.set_data(piece)
            params.append(q)
        return _GluonPieces(mx.gluon.Trainer(params, fresh, kvstore=None), params, trainer)

    def zeros_like(self, x: Any) -> Any:
        return self.mx.nd.zeros_like(x)

    def flatten(self, tensors: Sequence[Any], dtype: str | None) -> Any:
        flat = self.mx.nd.concat(*[t.reshape(-1) for t in tensors], dim=0)
        return flat if dtype is None else flat.astype(self.backend.to_native_dtype(dtype))

    def unflatten(self, flat: Any, like: Sequence[Any], scale: float | None) -> list[Any]:
        if flat.dtype != like[0].dtype:
            flat = flat.astype(like[0].dtype)
        if scale is not None and scale != 1.0:
            flat = flat * scale
        out, at = [], 0
        for t in like:
            n = int(np.prod(t.shape, dtype=np.int64))
            out.append(flat[at:at + n].reshape(t.shape))
            at += n
        return out

    def fingerprints(self) -> list[list[int]]:
        ps = [p for _, p in [*self._trained, *self._buffers]]
        return [[zlib.crc32(np.ascontiguousarray(p.data(ctx).asnumpy()).tobytes()) & 0x7FFFFFFF for p in ps]
                for ctx in self._ctxs]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


class _GluonPieces:
    """A Trainer over one rank's pieces of the parameters (Gluon parameters of their own), following
    the user's Trainer ``given``: its optimizer's learning rate and weight decay now, its update count
    after (the optimizer is read at each step: loading the Trainer's states replaces it)."""

    def __init__(self, trainer: Any, params: list[Any], given: Any) -> None:
        self.trainer, self.params, self.given = trainer, params, given

    def step(self, grads: Sequence[Any], values: Sequence[Any]) -> list[Any]:
        opt, given = self.trainer._optimizer, self.given._optimizer
        for p, x, g in zip(self.params, values, grads):
            p.set_data(x)
            p.grad()[:] = g
            p.data()._fresh_grad = True  # (what backward would mark: the Trainer steps only fresh gradients)
        opt.lr_scheduler = given.lr_scheduler  # (the user's, shared: the optimizer given never steps)
        if given.lr_scheduler is None:  # (Trainer.set_learning_rate sets it; a scheduler follows num_update)
            opt.lr = given.lr
        opt.wd = given.wd
        self.trainer.step(1)  # (the loss is a mean: no rescaling by a batch size)
        given.num_update = opt.num_update
        return [p.data().copy() for p in self.params]
