"""Data parallelism over the user's own model and the framework's own optimizer: one API for one
process over several devices and for one process per device under :mod:`multidev.distributed`.

::

    dp = md.data_parallel(model, optimizer)        # torch: nn.Module + torch.optim; JAX: params + optax, ...
    for X, y in loader:
        loss = dp.step(dp.shard((X, y)), loss_fn)  # loss_fn(model, batch) -> scalar mean loss

What it does across processes (a group of more than one rank, :func:`multidev.distributed.init`):

- at the start, every rank takes rank 0's parameters, buffers and optimizer state
  (:func:`broadcast_state`, also usable alone, e.g. after loading a checkpoint on rank 0);
- each step the gradients are averaged over the ranks in buckets (several parameters flattened into
  one tensor, one collective per bucket), started as soon as a bucket's gradients are final: during
  the backward pass where the framework has gradient hooks (torch), after it elsewhere; the first
  bucket (last layers first) closes at 1 MiB, as DDP's, where the engine's collectives progress
  while the backward pass computes (gloo, NCCL; not MPI's); one
  consistency exchange per step, not one per collective; ``grad_dtype`` exchanges them in
  bfloat16 or float16 (half the bytes, about 3 significant digits);
- buffers (BatchNorm's running statistics) are rank 0's (``buffers="broadcast"``): after each
  :meth:`DataParallel.step`'s backward pass, so every replica ends the step bitwise equal, and
  before each training forward of a loop that calls the model itself (DistributedDataParallel's
  policy); or each rank's own (``"local"``). Each rank normalises with its own batch's
  statistics (no synchronised BatchNorm);
- a parameter that received no gradient on this rank raises naming it (``unused="error"``), or
  counts as a zero gradient (``"zero"``: models whose branches differ by rank);
- :meth:`DataParallel.no_sync` accumulates gradients without communicating; the first step after
  it averages the sum;
- ``verify=True`` checks after every step that every device and rank holds bitwise the same
  parameters and buffers (one small gather of checksums), naming the first that differs.

In one process over several devices (``devices=[...]``) the adapter runs its framework's own way
(JAX: one jitted step over the devices, the batch sharded; MXNet: the parameters on every context
and the Trainer's reduction; torch on GPUs: a replica per device, its gradients reduced onto the
first and the parameters copied back), behind the same ``step``. Gradients are means: a loss
function returns its batch's mean, and the step averages over devices and ranks (weighted by rows
within a process, equal across ranks: give every rank batches of one size).
"""
from __future__ import annotations

import contextlib
import pickle
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from . import buckets
from ._device import Device, DeviceLike
from .buckets import DEFAULT_BUCKET_MB
from .errors import (
    CapabilityError,
    InvalidArgumentError,
    MultidevError,
    ReplicaMismatchError,
    UnsupportedTensorError,
    translate_errors,
)
from .placement import device_list
from .protocol import Backend, SupportsDataParallel
from .registry import backend_of, require
from .replicas import Replica
from .trees import leaves, structure_owner

__all__ = ["DataParallel", "broadcast_state", "data_parallel"]

#: The reduced-precision dtypes gradients may travel in (``grad_dtype``).
EXCHANGE_DTYPES = ("bfloat16", "float16")
BUFFER_POLICIES = ("broadcast", "local")
UNUSED_POLICIES = ("error", "zero")
CHECK_POLICIES = ("step", "start")


# -- the group ------------------------------------------------------------------------------------
def _group() -> Any:
    """The process group when one of more than one rank is initialised, else None (a program that
    never imported multidev.distributed has none)."""
    running = sys.modules.get(f"{__package__}.distributed")
    if running is None or not running.is_initialized() or running.world_size() < 2:
        return None
    from .distributed.group import current
    return current()


@contextlib.contextmanager
def _checked(g: Any, on: bool) -> Iterator[None]:
    """The group's consistency checks for the calls inside: as set (``on``), or off."""
    old = g.check
    g.check = old and on
    try:
        yield
    finally:
        g.check = old


def _dist() -> Any:
    from . import distributed
    return distributed


def _carried(dtype: str, device: Device, b: Any) -> bool:
    try:
        return bool(_dist().carries(dtype, device, backend=b.name))
    except MultidevError:
        return False


def _broadcast_flat(flat: Any, src: int, g: Any, check: bool) -> Any:
    """Rank ``src``'s ``flat`` (a 1-D tensor) on every rank; dtypes the engine cannot carry (int64
    on JAX's engine without x64) travel as their bytes."""
    b = backend_of(flat)
    dtype, dev = b.dtype_of(flat), b.device_of(flat)
    with _checked(g, check):
        if _carried(dtype, dev, b):
            return _dist().broadcast(flat, src)
        host = np.ascontiguousarray(b.to_numpy(flat))
        raw = _dist().broadcast(host.view(np.uint8), src)
        return b.asarray(np.asarray(raw).view(host.dtype), dtype, dev)


def _broadcast_object(obj: Any, src: int, g: Any) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank (its length, then its bytes)."""
    data = pickle.dumps(obj) if g.rank == src else b""
    n = int(np.asarray(_dist().broadcast(np.array([len(data)], dtype=np.int32), src))[0])
    buf = np.frombuffer(data, dtype=np.uint8).copy() if g.rank == src else np.zeros(n, dtype=np.uint8)
    with _checked(g, False):
        raw = np.asarray(_dist().broadcast(buf, src)) if n else buf
    return obj if g.rank == src else pickle.loads(raw.tobytes())


# -- buckets --------------------------------------------------------------------------------------
def plan_buckets(replica: Replica, tensors: Sequence[Any], cap_bytes: float, reverse: bool,
                 overlaps: bool = True) -> list[list[int]]:
    """Indices of ``tensors`` grouped into buckets of one dtype and device, each up to ``cap_bytes``
    (a larger tensor alone), in reverse order where gradients come last-layer first
    (:func:`multidev.buckets.plan_buckets` for the replica's backend). Gradients (``reverse``) over
    an engine whose collectives progress in the background (``overlaps``): the first bucket closes
    once it holds :data:`~multidev.buckets.FIRST_BUCKET_MB` (as DDP's), so its collective overlaps
    the backward pass of the layers before it."""
    first = buckets.FIRST_BUCKET_MB * 2**20 if reverse and overlaps else None
    return buckets.plan_buckets(replica.backend, tensors, cap_bytes, reverse, first_bytes=first)


class GradientSync:
    """The gradient averaging of one data-parallel model across the ranks: :meth:`ready` takes each
    gradient as it is final, a full bucket starts its collective (in bucket order, the same on every
    rank), :meth:`finish` waits and gives the averaged gradients. Adapters with gradient hooks call
    these from the framework's backward pass (:meth:`Replica.attach`)."""

    def __init__(self, dp: DataParallel) -> None:
        self._dp = dp
        rep = dp.replica
        self.names = [n for n, _ in rep.parameters()]
        params = [p for _, p in rep.parameters()]
        self._like = params
        self.buckets = plan_buckets(rep, params, dp.bucket_bytes, reverse=True,
                                    overlaps=dp.group is None or bool(getattr(dp.group.engine, "overlaps", True)))
        self._bucket_of = {i: k for k, bucket in enumerate(self.buckets) for i in bucket}
        self._inplace = bool(rep.backend.capabilities.mutable)
        self.active = True
        self.in_step = False
        self._grads: list[Any] | None = None
        self._filled: list[int] = []
        self._works: list[Any] = []
        self._next = 0
        self._checked = False
        self.prechecked = False  # the step's record went ahead of its forward pass (check_ahead)
        self._ahead: Any = None  # that record's exchange, completed before the first bucket (_settle)
        self.refused = False  # the ranks' records differed: the step's gradients are dropped
        self.collectives = 0  # bucket collectives started so far (tests count them)

    def _start_round(self) -> None:
        self._grads = [None] * len(self._like)
        self._filled = [0] * len(self.buckets)
        self._works = [None] * len(self.buckets)
        self._next = 0
        self._checked, self.prechecked = self.prechecked, False

    def check_ahead(self) -> None:
        """Send the step's consistency record ahead, before its forward pass (:meth:`DataParallel.step`):
        the record the first bucket's allreduce would send (its op, dtype, length and device kind: the
        same on every rank that runs a step of this model). The exchange completes when the first
        bucket launches, so the round trip overlaps the forward and backward passes and no rank waits
        for another before computing; the step's buckets then go unchecked. Ranks whose steps differ
        raise there, on every rank, before any gradient moves (:attr:`refused` set). (Where the user's
        loop runs the backward pass itself, the first bucket carries the exchange instead.)"""
        from .distributed.consistency import Call, ahead
        from .distributed.transport import transport_backend

        dp, g = self._dp, self._dp.group
        first = [self._like[i] for i in self.buckets[0]]
        b = dp.replica.backend
        dtype = dp.grad_dtype or b.dtype_of(first[0])
        length = sum(buckets.numel(b.shape_of(t)) for t in first)
        tkind = transport_backend(g, b.device_of(first[0]), b)[1].kind  # the kind of device it travels on
        self._ahead = ahead(g, "allreduce", lambda: Call("allreduce", op="sum", dtype=dtype, shape=(length,),
                                                          tkind=tkind))
        self.prechecked = True

    def _settle(self) -> None:
        """Complete the exchange :meth:`check_ahead` sent (before the step's first collective)."""
        pending, self._ahead = self._ahead, None
        if pending is not None:
            try:
                pending.wait()
            except MultidevError:
                self.refused = True
                raise

    def drop_ahead(self) -> None:
        """The step ended before its first collective (an error): its record stays with the group,
        whose next checked call exchanges it first."""
        self._ahead = None
        self.refused = False

    def reset(self) -> None:
        """Forget a round left unfinished (a backward pass that raised)."""
        self._grads = None

    def ready(self, i: int, g: Any) -> None:
        """Parameter ``i``'s gradient ``g`` is final for this step."""
        if self._grads is None:
            self._start_round()
        assert self._grads is not None
        if self._grads[i] is None:
            self._filled[self._bucket_of[i]] += 1
        self._grads[i] = g
        self._launch_full()

    def _launch_full(self) -> None:
        while self._next < len(self.buckets) and self._filled[self._next] == len(self.buckets[self._next]):
            self._launch(self._next)
            self._next += 1

    def _launch(self, k: int) -> None:
        dp, g = self._dp, self._dp.group
        assert self._grads is not None
        self._settle()
        flat = dp.replica.flatten([self._grads[i] for i in self.buckets[k]], dp.grad_dtype)
        first = not self._checked and dp.checks == "step"  # the step's first collective carries the exchange
        with _checked(g, first):  # in place where the framework writes in place: the bucket is ours
            self._works[k] = _dist().allreduce(flat, "sum", inplace=self._inplace, async_op=True)
        self._checked = True
        self.collectives += 1

    def finish(self) -> list[Any]:
        """Wait for every bucket and return the averaged gradients (one per parameter, on the first
        device), ending the step's round. A parameter without a gradient: ``unused="zero"`` counts
        it as zeros, ``"error"`` raises naming it."""
        if self._grads is None:
            self._start_round()
        grads = self._grads
        assert grads is not None
        missing = [i for i, gr in enumerate(grads) if gr is None]
        if missing and self._dp.unused == "error":
            self._grads = None
            names = ", ".join(self.names[i] for i in missing[:8]) + (" ..." if len(missing) > 8 else "")
            raise InvalidArgumentError(
                f"data_parallel: {len(missing)} parameter(s) received no gradient on rank {self._dp.rank} this step: "
                f"{names}. Every rank must give every parameter a gradient (the other ranks wait for this one's "
                "buckets): pass data_parallel(..., unused='zero') to count them as zeros, or leave them out of the "
                "trained parameters (requires_grad=False / a frozen subtree)")
        for i in missing:
            self.ready(i, self._dp.replica.zeros_like(self._like[i]))
        self._launch_full()
        out: list[Any] = [None] * len(grads)
        scale = 1.0 / self._dp.world_size
        try:
            for k, bucket in enumerate(self.buckets):
                summed = self._works[k].wait()
                for i, v in zip(bucket, self._dp.replica.unflatten(summed, [self._like[i] for i in bucket], scale)):
                    out[i] = v
        finally:
            self._grads = None
        return out

    def before_forward(self) -> None:
        """Rank 0's buffers, before a training forward outside :meth:`DataParallel.step`
        (``buffers="broadcast"``; the step takes them after its backward pass instead)."""
        if self._dp.buffers == "broadcast" and not self.in_step:
            self._dp.sync_buffers()


# -- the API --------------------------------------------------------------------------------------
def _model_backend(model: Any, what: str) -> Backend:
    # a plain container's framework is its tensors' (no adapter owns a list, tuple or dict: one that
    # claims them would take another framework's model, or a renamed copy's, for its own)
    found = None if type(model) in (list, tuple, dict) else structure_owner(model)
    if found is not None:
        b = found[0]
    else:
        try:
            first = next(iter(leaves(model, what)), None)
        except (UnsupportedTensorError, InvalidArgumentError) as e:
            raise InvalidArgumentError(f"{what} takes a model (a framework's module, or a tree of its tensors); "
                                       f"got {type(model).__name__}: {e}") from None
        if first is None:
            raise InvalidArgumentError(f"{what}: the model holds no tensor")
        b = backend_of(first[1])
    return b


def _replica_for(model: Any, optimizer: Any, devices: Sequence[DeviceLike] | None, what: str) -> Replica:
    b = _model_backend(model, what)
    parallel = require(b, SupportsDataParallel, what, "its framework's models cannot be wrapped")
    if devices is None:
        from .api import device_of
        devs = [device_of(model)]
    else:
        devs = device_list(b, devices, what)
    with translate_errors(f"{b.name} {what}"):
        rep = parallel.data_parallel_replica(model, optimizer, devs)
    if rep is None:
        raise InvalidArgumentError(f"{what}: the {b.name} backend does not take a {type(model).__name__} as a model")
    return rep


def _broadcast(rep: Replica, g: Any, src: int, optimizer: bool = True) -> None:
    """Rank ``src``'s parameters, buffers and optimizer state into ``rep`` on every rank, in buckets
    (one collective per dtype and bucket)."""
    if not isinstance(src, int) or isinstance(src, bool) or not 0 <= src < g.world_size:
        raise InvalidArgumentError(f"broadcast_state: src must be a rank in [0, {g.world_size}), got {src!r:.40}")
    first = True
    for part in ("parameters", "buffers"):
        named = rep.parameters() if part == "parameters" else rep.buffers()
        tensors = [t for _, t in named]
        if not tensors:
            continue
        new: list[Any] = [None] * len(tensors)
        for bucket in plan_buckets(rep, tensors, DEFAULT_BUCKET_MB * 2**20, reverse=False):
            like = [tensors[i] for i in bucket]
            flat = _broadcast_flat(rep.flatten(like, None), src, g, first)
            first = False
            for i, v in zip(bucket, rep.unflatten(flat, like, None)):
                new[i] = v
        if g.rank != src:
            rep.load(new if part == "parameters" else None, new if part == "buffers" else None)
    if optimizer:
        state = _broadcast_object(rep.optimizer_state(), src, g)
        if g.rank != src and state is not None:
            rep.load_optimizer_state(state)


def broadcast_state(model: Any, optimizer: Any = None, *, src: int = 0) -> Any:
    """Rank ``src``'s parameters, buffers and optimizer state on every rank of the process group
    (a collective: every rank calls it); what :func:`data_parallel` does at the start, for use
    alone, e.g. after loading a checkpoint on one rank. Returns the model: the same object, updated
    in place (torch, MXNet, Keras), or a new tree (JAX: ``params = md.broadcast_state(params)``).
    The optimizer (torch) is updated in place; a flax ``TrainState`` carries its own. Without a
    group of more than one rank, a no-op returning ``model``."""
    g = _group()
    if g is None:
        return model
    rep = _replica_for(model, optimizer, None, "broadcast_state")
    _broadcast(rep, g, src)
    return rep.model


class DataParallel:
    """A model and its optimizer trained data-parallel (made by :func:`data_parallel`): the same
    code on one device, several devices of one process, and one process per device."""

    def __init__(self, replica: Replica, group: Any, *, bucket_mb: float, grad_dtype: str | None, buffers: str,
                 unused: str, verify: bool, checks: str = "step") -> None:
        self.replica = replica
        self.group = group
        self.rank = 0 if group is None else group.rank
        self.world_size = 1 if group is None else group.world_size
        self.bucket_bytes = float(bucket_mb) * 2**20
        self.grad_dtype = grad_dtype
        self.buffers = buffers
        self.unused = unused
        self.verify_each_step = verify
        self.checks = checks
        self._no_sync = False
        self.sync: GradientSync | None = None
        self._attached = False
        self._self_synced = bool(getattr(replica, "syncs_itself", False))
        self._one_program = bool(getattr(replica, "one_program", False))
        rows = getattr(replica, "rows", None)  # (this rank's part, parts): a batch cut along a mesh's data axes
        self._rows = (self.rank, self.world_size) if rows is None else rows
        if group is not None and not self._self_synced:
            _broadcast(replica, group, 0)
            self.sync = GradientSync(self)
            self._attached = replica.attach(self.sync)
        replica.drop_gradients()  # the first step averages what accumulates from now on (a refusal before
        # this point leaves the model's gradients as they were)

    @property
    def model(self) -> Any:
        """The model now: the object given (torch, MXNet, Keras; trained in place) or the current
        tree (JAX: the parameters, or the ``TrainState``). Its state is the plain model's: a
        checkpoint of it loads without the wrapper. Where every rank runs one program (JAX across
        processes) reading it gathers the pieces: a collective every rank makes, agreed first (a
        rank reading alone raises CollectiveMismatchError or DistributedTimeoutError, never hangs)."""
        if self._one_program and self.group is not None:
            self._agree_read("model")
        return self.replica.model

    @property
    def optimizer(self) -> Any:
        """The optimizer given (JAX: the optax transformation; the state is ``replica.opt_state``)."""
        return self.replica.optimizer

    @property
    def devices(self) -> list[Device]:
        """This process's devices."""
        return list(self.replica.devices)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward (torch, Keras, Gluon models)."""
        return self.replica.forward(*args, **kwargs)

    def shard(self, batch: Any) -> Any:
        """This rank's rows of a global batch (a tensor, or a tuple, list or dict of tensors with one
        batch axis): rank ``r`` of ``n`` takes ``numpy.array_split``'s part ``r``; the batch itself
        with one rank. A view or slice, no copy where the framework slices without one."""
        part, parts = self._rows
        if parts == 1:
            return batch
        if isinstance(batch, (tuple, list)):
            return type(batch)(self.shard(x) for x in batch)
        if isinstance(batch, dict):
            return {k: self.shard(v) for k, v in batch.items()}
        b = backend_of(batch)
        n = b.shape_of(batch)[0] if b.shape_of(batch) else 0
        if n < parts:
            raise InvalidArgumentError(f"DataParallel.shard: a batch of {n} rows cannot give each of "
                                       f"{parts} {'ranks' if parts == self.world_size else 'parts'} a row")
        sizes = [len(p) for p in np.array_split(np.empty(n, dtype=np.int8), parts)]
        return b.split(batch, sizes, 0)[part]

    def step(self, batch: Any, loss_fn: Callable[..., Any]) -> Any:
        """One training step: ``loss_fn(model, batch)`` (JAX: ``loss_fn(params, batch)``) on this
        process's batch, its gradients averaged over every device and rank, one step of the
        optimizer. Inside :meth:`no_sync` the gradients only accumulate (no communication, no
        optimizer step); the next step outside it averages their sum. Returns this process's loss,
        a scalar of the framework (not synchronised: read it when you need it)."""
        if not callable(loss_fn):
            raise InvalidArgumentError(f"DataParallel.step: loss_fn must be callable, got {type(loss_fn).__name__}")
        rep, sync = self.replica, self.sync
        if self._one_program and self.group is not None and self.checks == "step" and self.group.check:
            self._agree_batch(batch)
        if self._no_sync:
            loss = rep.backward(batch, loss_fn, None)
        elif sync is None:
            loss = rep.local_step(batch, loss_fn)
            if self._self_synced and self.group is not None and self.buffers == "broadcast":
                self.sync_buffers()
        else:
            sync.in_step = True  # the buffers follow the backward pass, not a forward hook
            sync.reset()
            try:
                if self.checks == "step" and sync.buckets and self.group is not None and self.group.check:
                    sync.check_ahead()
                if self._attached:
                    loss = rep.backward(batch, loss_fn, None)  # the hooks averaged the gradients in place
                    grads = None
                else:
                    loss = rep.backward(batch, loss_fn, sync.ready)
                    grads = sync.finish()
            except BaseException:
                if sync.refused:  # the ranks' steps differ: nothing moved; this step's gradients go
                    sync.reset()
                    rep.drop_gradients()
                raise
            finally:
                sync.in_step = False
                sync.prechecked = False  # consumed by the round's start; never left for a later loop
                sync.drop_ahead()
            if self.buffers == "broadcast":
                self.sync_buffers()  # rank 0's statistics, updated by its forward, everywhere
            rep.apply(grads)
        if self.verify_each_step and not self._no_sync:
            self.verify()
        return loss

    def _agree_batch(self, batch: Any) -> None:
        """The step's consistency exchange where every rank runs one program (JAX across
        processes): each rank's batch structure, shapes and dtypes; ranks that differ raise
        CollectiveMismatchError on every rank before any computes (the program would wait forever)."""
        from .distributed.consistency import Call, agree
        from .structured import structure_leaves

        def record() -> Any:
            found = structure_leaves(batch, "DataParallel.step")
            return Call("batch", leaves=len(found.tensors), sig=found.signature())
        agree(self.group, "batch", record)

    def _agree_read(self, what: str) -> None:
        """The exchange before a collective read of a one-program replica's state: every rank reads
        the same thing at the same point (a rank stepping or reading something else: mismatch)."""
        from .distributed.consistency import Call, agree

        sig = zlib.crc32(f"read {what}".encode()) & 0x7FFFFFFF
        agree(self.group, "batch", lambda: Call("batch", leaves=0, sig=sig))

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradients accumulate locally inside the block (no collective, no optimizer step from
        :meth:`step`); the first step after it averages the accumulated sum, as
        DistributedDataParallel's ``no_sync``."""
        old = self._no_sync
        self._no_sync = True
        if self.sync is not None:
            self.sync.active = False
        try:
            yield
        finally:
            self._no_sync = old
            if self.sync is not None:
                self.sync.active = not old

    def sync_buffers(self) -> None:
        """Rank 0's buffers on every rank now (a collective; a no-op without buffers or a group)."""
        g = self.group
        named = self.replica.buffers()
        if g is None or not named:
            return
        tensors = [t for _, t in named]
        new: list[Any] = [None] * len(tensors)
        for bucket in plan_buckets(self.replica, tensors, self.bucket_bytes, reverse=False):
            like = [tensors[i] for i in bucket]
            flat = _broadcast_flat(self.replica.flatten(like, None), 0, g, False)
            for i, v in zip(bucket, self.replica.unflatten(flat, like, None)):
                new[i] = v
        if g.rank != 0:
            self.replica.load(None, new)

    def broadcast_state(self, src: int = 0) -> None:
        """Rank ``src``'s parameters, buffers and optimizer state on every rank (a collective), e.g.
        after loading a checkpoint on one rank. CapabilityError where the parameters are sharded
        over processes (load the checkpoint before :func:`data_parallel`, which takes rank 0's)."""
        if self._self_synced and self.group is not None:
            raise CapabilityError("DataParallel.broadcast_state: the parameters are sharded over the processes; load "
                                  "a checkpoint into the plain model on every rank before data_parallel (which takes "
                                  "rank 0's state at its start)")
        if self.group is not None:
            _broadcast(self.replica, self.group, src)

    def verify(self) -> None:
        """Check that every device and rank holds bitwise the same parameters (and buffers, with
        ``buffers="broadcast"``) now (a
        collective where there is a group: one gather of a checksum per tensor); ReplicaMismatchError
        on every rank, naming the first tensor that differs and where, otherwise."""
        rep = self.replica
        names = [n for n, _ in rep.parameters()]
        if self.buffers == "broadcast":
            names += [n for n, _ in rep.buffers()]
        rows = [row[:len(names)] for row in rep.fingerprints()]
        for d, row in enumerate(rows[1:], 1):
            if row != rows[0]:
                i = next(j for j, (a, c) in enumerate(zip(rows[0], row)) if a != c)
                raise ReplicaMismatchError(f"data_parallel: {names[i]} differs between {rep.devices[0]} and "
                                           f"{rep.devices[d]} (rank {self.rank})")
        if self.group is None:
            return
        with _checked(self.group, True):
            every = np.asarray(_dist().allgather(np.array([rows[0]], dtype=np.int32), 0))
        peers = getattr(rep, "peers", None)  # sharded: the ranks holding the same pieces, group by group
        if peers is not None:
            for grp in peers:
                for r in grp[1:]:
                    diff = np.nonzero(every[r] != every[grp[0]])[0]
                    if diff.size:
                        raise ReplicaMismatchError(f"data_parallel: {names[int(diff[0])]} differs between rank "
                                                   f"{grp[0]} and rank {r}, which hold the same piece ({diff.size} of "
                                                   f"{len(names)} tensors differ)")
            return
        for r in range(1, every.shape[0]):
            diff = np.nonzero(every[r] != every[0])[0]
            if diff.size:
                raise ReplicaMismatchError(f"data_parallel: {names[int(diff[0])]} differs between rank 0 and rank {r} "
                                           f"({diff.size} of {len(names)} tensors differ)")

    def close(self) -> None:
        """Remove the hooks the wrapper installed in the model (the model trains alone again)."""
        self.replica.detach()
        self._attached = False


def data_parallel(model: Any, optimizer: Any = None, *, devices: Sequence[DeviceLike] | None = None,
                  bucket_mb: float = DEFAULT_BUCKET_MB, grad_dtype: str | None = None, buffers: str = "broadcast",
                  unused: str = "error", verify: bool = False, checks: str = "step", mesh: Any = None,
                  data_axis: Any = None, param_axis: Any = None) -> DataParallel:
    """Train ``model`` with ``optimizer`` data-parallel (see the module's doc for what it does).

    - ``model``: the framework's own: a torch ``nn.Module``, a JAX parameter tree or flax
      ``TrainState``, a Keras model, a Gluon ``Block``; ``optimizer``: the framework's own
      (``torch.optim``, an optax transformation, a Gluon ``Trainer``, a Keras optimizer; None for
      a ``TrainState``, which carries its own).
    - ``devices``: this process's devices; several: the framework's one-process data parallelism
      over them (the model is replicated there); default: the model's one device.
    - Under a process group of more than one rank (:func:`multidev.distributed.init`), every rank
      calls it (it broadcasts rank 0's state) and every step averages across ranks too.
    - ``bucket_mb``: gradient megabytes per collective; ``grad_dtype``: ``"bfloat16"`` or
      ``"float16"`` to exchange gradients in half the bytes (None: their own dtype);
      ``buffers``: ``"broadcast"`` (rank 0's before each step) or ``"local"``; ``unused``:
      ``"error"`` or ``"zero"`` for a parameter without a gradient; ``verify``: check after every
      step that all replicas are bitwise equal (a debugging aid); ``checks``: where the group's
      consistency checks run, ``"step"`` (one exchange per step) or ``"start"`` (at the start
      only: the steps' collectives unchecked, as DistributedDataParallel's).
    - ``mesh``: a :class:`~multidev.Mesh` of this process's devices instead of ``devices``
      (:mod:`multidev.sharded_training`): the batch's rows cut along ``data_axis`` (an axis name or
      a tuple of them; default the mesh's first axis), each parameter and its optimizer state cut
      along ``param_axis`` (default every other axis; ``()``: replicated) on its first dimension
      that divides evenly (:func:`~multidev.sharded_training.param_layout`), the collectives
      inserted by the framework's compiler. JAX only so far (``SupportsShardedTraining``), one
      process: CapabilityError elsewhere and under a process group of more than one rank, except
      with the parameters replicated (``param_axis=()``, or ``data_axis`` every axis): plain data
      parallelism over the mesh's devices on any framework (the batch cut over all of them, the
      same mean gradient).
    - ``mesh``: or a :class:`~multidev.distributed.ProcessMesh` of the group's processes, one device
      each: each rank trains on its rows of a batch cut along ``data_axis`` (:meth:`DataParallel.shard`),
      the parameters and optimizer state cut along ``param_axis`` (default every other axis) and
      replicated along the rest, with the framework's own sharded data parallelism (torch: FSDP2
      under the torch engine; JAX: global arrays and one jitted step on every process under the jax
      engine, the step's loss the whole batch's mean; :mod:`multidev.sharded_training`), or
      multidev's own where the framework has none (Keras, Gluon, under any engine: the optimizer's state
      sharded, the weights whole on every rank; :mod:`multidev.managed_sharding`); gradients
      are averaged over every rank, ``grad_dtype`` the dtype they are reduced in (torch, Keras), buffers
      rank 0's after each step (``buffers="broadcast"``). CapabilityError for frameworks without it.

    The model is used in place where the framework's tensors are mutable: no copy, no wrapper
    prefix in its state; a gradient hook per parameter where the framework has them
    (:meth:`DataParallel.close` removes them). Gradients accumulated before wrapping are cleared.
    """
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) or not bucket_mb > 0:
        raise InvalidArgumentError(f"data_parallel: bucket_mb must be a positive number, got {bucket_mb!r:.40}")
    if grad_dtype is not None and grad_dtype not in EXCHANGE_DTYPES:
        raise InvalidArgumentError(f"data_parallel: grad_dtype must be None or one of {EXCHANGE_DTYPES}, "
                                   f"got {grad_dtype!r:.40}")
    if buffers not in BUFFER_POLICIES:
        raise InvalidArgumentError(f"data_parallel: buffers must be one of {BUFFER_POLICIES}, got {buffers!r:.40}")
    if unused not in UNUSED_POLICIES:
        raise InvalidArgumentError(f"data_parallel: unused must be one of {UNUSED_POLICIES}, got {unused!r:.40}")
    if checks not in CHECK_POLICIES:
        raise InvalidArgumentError(f"data_parallel: checks must be one of {CHECK_POLICIES}, got {checks!r:.40}")
    if not isinstance(verify, bool):
        raise InvalidArgumentError(f"data_parallel: verify must be True or False, got {verify!r:.40}")
    g = _group()
    placed = sys.modules.get(f"{__package__}.distributed.mesh")  # a process mesh needs a group: loaded then
    if mesh is not None and placed is not None and isinstance(mesh, placed.ProcessMesh):
        if devices is not None:
            raise InvalidArgumentError("data_parallel: give devices or mesh, not both (a process mesh runs one device "
                                       "per process: the model's)")
        from .sharded_training import sharded_process_replica
        rep = sharded_process_replica(_model_backend(model, "data_parallel"), model, optimizer, mesh, data_axis,
                                      param_axis, grad_dtype, unused, g, lambda: _replica_for(
                                          model, optimizer, None, "data_parallel"), _broadcast, "data_parallel")
        return DataParallel(rep, g, bucket_mb=float(bucket_mb), grad_dtype=grad_dtype, buffers=buffers,
                            unused=unused, verify=verify, checks=checks)
    if mesh is not None:
        if devices is not None:
            raise InvalidArgumentError("data_parallel: give devices or mesh, not both (a mesh names its devices)")
        if g is not None:
            raise CapabilityError("data_parallel(mesh=...): a mesh of this process's devices under a process group of "
                                  "more than one rank; across processes pass a process mesh "
                                  "(multidev.distributed.process_mesh), one device per process")
        from .managed_sharding import ManagedDeviceShardedReplica, has_piece_optimizer
        from .sharded_training import device_mesh_axes, sharded_replica
        b = _model_backend(model, "data_parallel")
        plain = b.sharded_training is None or getattr(b.sharded_training, "one_process_mesh", True) is False
        param_axes = device_mesh_axes(mesh, data_axis, param_axis, "data_parallel")[1]
        if plain and not param_axes:
            # parameters replicated on every device of the mesh, and no sharded mode: plain data
            # parallelism over them (the batch cut over every device: the same mean gradient)
            rep = _replica_for(model, optimizer, list(mesh.devices), "data_parallel")
        elif plain:
            # no sharded mode of the framework's own: multidev cuts the optimizer's state over the
            # devices along the parameter axes (the batch cut over every device, as above); what it
            # cannot shard is refused before the replica moves or copies the model, where the adapter
            # says so (its optional piece_refusal)
            if optimizer is None:
                raise InvalidArgumentError("data_parallel with param_axis needs the optimizer: data_parallel(model, "
                                           "optimizer, mesh=..., param_axis=...)")
            if (refusal := getattr(b.parallel, "piece_refusal", None)) is not None:
                refusal(model, optimizer)
            whole = _replica_for(model, optimizer, list(mesh.devices), "data_parallel")
            if not has_piece_optimizer(whole):
                raise CapabilityError(f"data_parallel(param_axis=...): the {b.name} backend has no sharded training of "
                                      "its own and its replica gives no optimizer over pieces; train without "
                                      "param_axis")
            rep = ManagedDeviceShardedReplica(whole, mesh, param_axes)
            rep.unused = unused
        else:
            rep = sharded_replica(b, model, optimizer, mesh, data_axis, param_axis, "data_parallel")
        return DataParallel(rep, None, bucket_mb=float(bucket_mb), grad_dtype=grad_dtype, buffers=buffers,
                            unused=unused, verify=verify, checks=checks)
    if data_axis is not None or param_axis is not None:
        raise InvalidArgumentError("data_parallel: data_axis and param_axis name axes of a mesh: pass mesh=")
    rep = _replica_for(model, optimizer, devices, "data_parallel")
    if g is not None and rep.processes_refusal:
        raise CapabilityError(f"data_parallel: {rep.processes_refusal}")
    if g is not None and grad_dtype is not None and not _carried(grad_dtype, rep.devices[0], rep.backend):
        raise CapabilityError(f"data_parallel(grad_dtype={grad_dtype!r}): the {g.info.engine} engine cannot carry "
                              f"{grad_dtype} tensors of this backend")
    return DataParallel(rep, g, bucket_mb=float(bucket_mb), grad_dtype=grad_dtype, buffers=buffers, unused=unused,
                        verify=verify, checks=checks)
