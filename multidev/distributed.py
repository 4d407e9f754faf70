"""Collectives across processes, through torch.distributed (gloo on CPU, NCCL on GPU).

One process per rank, started by ``torchrun`` (or anything that sets its environment)::

    torchrun --nproc_per_node=4 train.py

    # train.py
    import multidev as md
    from multidev import distributed as dist

    dist.init()                                   # reads RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK
    g = dist.allreduce(grad, op="mean")           # grad: a tensor of any backend
    h = dist.allreduce(grad, async_op=True)       # a handle; h.wait() gives the result
    dist.shutdown()

Any backend's tensor travels as a tensor of the transport backend (:data:`TRANSPORT`) through
:func:`multidev.convert`: zero-copy through DLPack where the producer and the process group's device
allow it, else an explicit copy; the result comes back, again through ``convert``, as a tensor of
the input's backend, on the input's device, with its dtype. The transport is torch.distributed
itself; nothing here is home-made.

Semantics follow :mod:`multidev.collectives`: the same ops (``mean`` is a sum divided by the world
size and is refused for integers; ``bool`` takes max/min only), uneven pieces follow
``numpy.array_split`` (``scatter``, ``reduce_scatter``, and ``allgather``/``gather`` accept pieces
that differ along ``axis``). Every rank must call every collective in the same order with tensors of
one dtype and (except along ``axis`` for the gathers) one shape.

Failure: a rank that dies, hangs or never arrives makes the others raise
:class:`DistributedTimeoutError` within the ``timeout`` given to :func:`init` (immediately, when
the peer's connection closes), never hang. Errors are classified by type: what the transport
raises during a collective (torch's ``DistError`` family, and the bare ``RuntimeError`` gloo uses
for a lost peer) is a lost or hung peer, since the inputs were checked before it was called;
argument errors are :class:`DistributedError`. The process group is then unusable: call
:func:`shutdown` and start again.

``torch`` is imported by these functions only, so ``import multidev`` stays light.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ._device import Device, DeviceLike
from .collectives import split_sizes
from .errors import CapabilityError, CollectiveInputError, DistributedError, DistributedTimeoutError, MultidevError
from .exchange import convert
from .placement import resolve
from .protocol import Backend
from .registry import backend_of, get_backend
from .validate import check_axis, check_op

__all__ = [
    "DEFAULT_TIMEOUT", "TRANSPORT", "DistributedError", "DistributedTimeoutError", "Work", "allgather", "allreduce",
    "backend_name", "barrier", "broadcast", "gather", "init", "is_initialized", "local_rank", "rank", "reduce",
    "reduce_scatter", "scatter", "shutdown", "transport_path", "world_size",
]

#: Seconds a collective (and init's rendezvous) waits for the other ranks before raising.
DEFAULT_TIMEOUT = 300.0
#: The backend whose tensors torch.distributed moves: every other backend's tensor is converted to it.
TRANSPORT = "torch"


# -- process group state --------------------------------------------------------------------------
@dataclass
class _State:
    rank: int
    world_size: int
    local_rank: int
    pg_backend: str
    timeout: float
    cuda_device: Any  # torch.device of this rank's GPU, or None
    broken: str | None = None

    @property
    def nccl(self) -> bool:
        return "nccl" in self.pg_backend

    @property
    def host_transport(self) -> bool:
        """Whether the group moves CPU tensors itself (gloo or MPI)."""
        return "gloo" in self.pg_backend or "mpi" in self.pg_backend

    def device_for(self, kind: str) -> Any:
        """The one place that knows the group's devices: where a transport tensor whose device type
        is ``kind`` ("cpu" or "cuda") must be for this group. Its own device type where the group
        serves it, else this rank's GPU (NCCL only) or the CPU (gloo only)."""
        import torch

        if kind == "cuda" and self.nccl:
            return self.cuda_device
        if kind == "cpu" and self.host_transport:
            return torch.device("cpu")
        return self.cuda_device if self.nccl else torch.device("cpu")

    def object_device(self) -> Any:
        """The device ``broadcast_object_list`` needs: this rank's GPU when only NCCL serves the group."""
        return self.cuda_device if self.nccl and not self.host_transport else None


_state: _State | None = None
_lock = threading.Lock()


def _env_int(name: str, given: int | None, default: int | None) -> int:
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int):
            raise DistributedError(f"{name.lower()} must be an int, got {given!r:.40}")
        return int(given)
    v = os.environ.get(name)
    if v is None or v == "":
        if default is None:
            raise DistributedError(f"multidev.distributed.init: ${name} is not set; start the processes "
                                   f"with torchrun, or pass {name.lower()}=...")
        return default
    try:
        return int(v)
    except ValueError:
        raise DistributedError(f"${name}={v!r:.40} is not an integer") from None


def init(backend: str | None = None, *, rank: int | None = None, world_size: int | None = None,
         master_addr: str | None = None, master_port: int | None = None, local_rank: int | None = None,
         timeout: float = DEFAULT_TIMEOUT, rendezvous_timeout: float | None = None) -> None:
    """Join the process group.

    Every argument left as None is read from torchrun's environment: ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR`` (default 127.0.0.1), ``MASTER_PORT`` (default 29500), ``LOCAL_RANK`` (default
    ``RANK``). ``backend``: ``"gloo"``, ``"nccl"``, or None for ``"cpu:gloo,cuda:nccl"`` where CUDA
    and NCCL are present (CPU tensors through gloo, GPU tensors through NCCL) and ``"gloo"``
    elsewhere. ``timeout`` (seconds) bounds every collective: a dead or hung rank raises
    :class:`DistributedTimeoutError` in the others instead of hanging. ``rendezvous_timeout`` (default:
    ``timeout``) bounds the wait for every rank to arrive; a rank that never does makes init raise
    :class:`DistributedTimeoutError`.
    """
    global _state
    import torch
    import torch.distributed as tdist

    if not tdist.is_available():
        raise CapabilityError("this torch build has no torch.distributed; install a build with it")
    with _lock:
        if _state is not None:
            raise DistributedError("multidev.distributed is already initialised; call shutdown() first")
        r = _env_int("RANK", rank, None)
        ws = _env_int("WORLD_SIZE", world_size, None)
        lr = _env_int("LOCAL_RANK", local_rank, r)
        addr = master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        port = _env_int("MASTER_PORT", master_port, 29500)
        if not 0 <= r < ws:
            raise DistributedError(f"rank {r} is out of range for world size {ws}")
        rdv = timeout if rendezvous_timeout is None else rendezvous_timeout
        for name, v in (("timeout", timeout), ("rendezvous_timeout", rdv)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise DistributedError(f"{name} must be a positive number of seconds, got {v!r:.40}")
        cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        if backend is None:
            backend = "cpu:gloo,cuda:nccl" if cuda and tdist.is_nccl_available() else "gloo"
        if not isinstance(backend, str) or not backend:
            raise DistributedError(f"backend must be 'gloo', 'nccl' or 'cpu:gloo,cuda:nccl', got {backend!r:.40}")
        cuda_device = None
        if "nccl" in backend:
            if not cuda:
                raise CapabilityError("backend 'nccl' needs CUDA GPUs; use 'gloo' on CPU-only machines")
            cuda_device = torch.device("cuda", lr % torch.cuda.device_count())
            torch.cuda.set_device(cuda_device)
            # NCCL's watchdog otherwise tears the process down on a timeout; blocking wait raises.
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        kwargs: dict[str, Any] = {}
        if cuda_device is not None:
            kwargs["device_id"] = cuda_device
        try:
            # rank 0 hosts the store and waits up to the rendezvous timeout for every rank
            store = tdist.TCPStore(addr, port, ws, is_master=(r == 0),
                                   timeout=timedelta(seconds=float(rdv)), wait_for_workers=True)
            tdist.init_process_group(backend, store=store, rank=r, world_size=ws,
                                     timeout=timedelta(seconds=float(timeout)), **kwargs)
        except Exception as e:
            raise _translate(e, f"init (rank {r} of {ws}, {addr}:{port})", float(rdv)) from e
        _state = _State(r, ws, lr, backend, float(timeout), cuda_device)


def is_initialized() -> bool:
    """True between :func:`init` and :func:`shutdown`."""
    return _state is not None


def _st() -> _State:
    st = _state
    if st is None:
        raise DistributedError("multidev.distributed is not initialised: call multidev.distributed.init() "
                               "(in processes started by torchrun)")
    if st.broken:
        raise DistributedError(f"the process group failed earlier ({st.broken}); call shutdown() and "
                               "init() again")
    return st


def rank() -> int:
    """This process's rank."""
    return _st().rank


def world_size() -> int:
    """The number of processes."""
    return _st().world_size


def local_rank() -> int:
    """This process's rank on its machine (its GPU index under NCCL)."""
    return _st().local_rank


def backend_name() -> str:
    """The torch.distributed backend in use (``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``)."""
    return _st().pg_backend


def shutdown() -> None:
    """Leave the process group (also after a failure). Safe to call when not initialised."""
    global _state
    with _lock:
        if _state is None:
            return
        import torch.distributed as tdist

        with contextlib.suppress(Exception):  # a broken group may fail to tear down; it is gone either way
            if tdist.is_initialized():
                tdist.destroy_process_group()
        _state = None


def _translate(e: BaseException, what: str, timeout: float) -> DistributedError:
    """Classify a torch.distributed failure by its type (see the module docstring)."""
    msg = str(e).strip()[:500]
    if isinstance(e, DistributedError):
        return e
    if isinstance(e, (MultidevError, ValueError, TypeError, KeyError, AttributeError)):
        return DistributedError(f"{what} failed: {type(e).__name__}: {msg}")
    if isinstance(e, (TimeoutError, RuntimeError, ConnectionError)):  # DistError and gloo's RuntimeError
        return DistributedTimeoutError(
            f"{what}: another rank died, hung or never arrived (timeout {timeout:g} s): {type(e).__name__}: {msg}")
    return DistributedError(f"{what} failed in torch.distributed: {type(e).__name__}: {msg}")


def _fail(st: _State, e: BaseException, what: str) -> DistributedError:
    err = _translate(e, f"{what} on rank {st.rank}", st.timeout)
    st.broken = str(err)[:200]
    return err


# -- conversion to and from the transport ---------------------------------------------------------
@dataclass
class _Origin:
    backend: Backend
    device: Device
    dtype: str
    is_transport: bool


def _transport() -> Backend:
    return get_backend(TRANSPORT)


def _to_transport(x: Any, st: _State) -> tuple[Any, _Origin, bool, str]:
    """``(t, origin, shared, path)``: a contiguous transport tensor with x's values on the device
    the process group takes; ``shared`` when it aliases x's memory; ``path`` is ``"native"`` (x is
    a transport tensor), ``"dlpack"`` (shared through DLPack) or ``"copy"``."""
    b = backend_of(x)
    tb = _transport()
    o = _Origin(b, b.device_of(x), b.dtype_of(x), b is tb)
    if o.is_transport:
        t, shared, path = x.detach(), True, "native"  # detach: collectives are not autograd ops
    else:
        # a host tensor of a virtual CPU device travels as the transport's cpu:0 (same memory)
        to = Device("cpu", 0) if o.device.kind == "cpu" else None
        try:
            t, shared, path = convert(x, TRANSPORT, copy=False, device=to), True, "dlpack"
        except CapabilityError:
            t, shared, path = convert(x, TRANSPORT, copy=True, device=to), False, "copy"
    target = st.device_for(t.device.type)
    if t.device != target or not t.is_contiguous():
        t = t.to(target).contiguous()
        shared, path = False, "copy"
    return t, o, shared, path


def _from_transport(t: Any, o: _Origin) -> Any:
    """``t`` as a tensor of the input's backend, on its device, with its dtype (through convert)."""
    tb = _transport()
    if o.is_transport:
        return t if tb.device_of(t) == o.device else tb.move(t, o.device)
    if o.device.kind == "cpu":
        if tb.device_of(t).kind != "cpu":
            t = tb.move(t, Device("cpu", 0))
        y = convert(t, o.backend.name, device=o.device)  # a view on the input's (virtual) CPU device
    else:
        y = convert(t, o.backend.name)
    b = o.backend
    return y if b.device_of(y) == o.device else b.move(y, o.device)


def transport_path(x: Any) -> str:
    """How ``x`` would travel in a collective of the current group: ``"native"`` (a transport
    tensor), ``"dlpack"`` (shared zero-copy) or ``"copy"``."""
    return _to_transport(x, _st())[3]


# -- async handles --------------------------------------------------------------------------------
class Work:
    """A collective in flight. :meth:`wait` blocks until it has finished and returns the result (a
    tensor of the input's backend, or None on ranks that receive nothing); errors, timeouts
    included, surface there as :class:`DistributedError` / :class:`DistributedTimeoutError`."""

    def __init__(self, works: Sequence[Any], finish: Callable[[], Any], what: str, st: _State) -> None:
        self._works = list(works)
        self._finish = finish
        self._what = what
        self._st = st
        self._lock = threading.Lock()
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None

    def is_completed(self) -> bool:
        """True when the transfer has finished (wait() then returns at once)."""
        return self._done or all(w is None or w.is_completed() for w in self._works)

    def wait(self) -> Any:
        """Block until done and return the result (raises the collective's error)."""
        with self._lock:
            if not self._done:
                try:
                    for w in self._works:
                        if w is not None:
                            w.wait()
                    self._result = self._finish()
                except DistributedError as e:
                    self._error = e
                except Exception as e:  # noqa: BLE001 - torch's RuntimeError / DistError, classified
                    self._error = _fail(self._st, e, self._what)
                self._done = True
                self._works = []
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        return f"<multidev.distributed.Work {self._what} {'done' if self._done else 'in flight'}>"


def _run(st: _State, what: str, start: Callable[[], tuple[list[Any], Callable[[], Any]]],
         async_op: bool) -> Any:
    try:
        works, finish = start()
    except (DistributedError, CollectiveInputError, CapabilityError):
        raise
    except Exception as e:
        raise _fail(st, e, what) from e
    h = Work(works, finish, what, st)
    return h if async_op else h.wait()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch.distributed warns on some calls about its own deprecated internals; keep logs clean."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


# -- validation -----------------------------------------------------------------------------------
def _reduce_op(op: str) -> Any:
    import torch.distributed as tdist

    return {"sum": tdist.ReduceOp.SUM, "mean": tdist.ReduceOp.SUM, "prod": tdist.ReduceOp.PRODUCT,
            "max": tdist.ReduceOp.MAX, "min": tdist.ReduceOp.MIN}[op]


def _check_rank(r: Any, st: _State, what: str, name: str) -> int:
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < st.world_size:
        raise CollectiveInputError(f"{what}: {name}={r!r:.40} is not a rank of this world (0..{st.world_size - 1})")
    return r


def _check_inplace(x: Any, inplace: bool, what: str) -> None:
    if not inplace:
        return
    b = backend_of(x)
    if not b.capabilities.mutable:
        raise CapabilityError(f"{b.name} tensors are immutable: {what}(inplace=True) cannot write into "
                              "them; use inplace=False and rebind the result")
    # Probe writability before any rank communicates (read-only arrays, inference tensors): a
    # rewrite with a copy of itself is bitwise a no-op, and a local failure then breaks no group.
    try:
        b.assign(x, b.copy(x, b.device_of(x)))
    except (ValueError, RuntimeError, MultidevError) as e:
        raise CapabilityError(f"{what}(inplace=True): this {b.name} tensor cannot be written ({e}); "
                              "pass a writable tensor or use inplace=False") from e


# -- collectives ----------------------------------------------------------------------------------
def _result(t: Any, o: _Origin, x: Any, inplace: bool, shared: bool, writes_through: bool) -> Any:
    if not inplace:
        return _from_transport(t, o)
    if shared and writes_through:
        return x  # the collective wrote into x's own memory
    o.backend.assign(x, _from_transport(t, o))
    return x


def _writes_through(o: _Origin) -> bool:
    """Whether writing into memory shared through DLPack is a valid in-place update of the input:
    transport tensors, and synchronous mutable backends (NumPy). Asynchronous engines (MXNet) get an
    explicit ``assign`` so their dependency tracking sees the write."""
    return o.is_transport or (o.backend.capabilities.mutable and not o.backend.capabilities.async_execution)


def _working_tensor(x: Any, st: _State, inplace: bool) -> tuple[Any, _Origin, bool, bool]:
    """The transport tensor a collective reduces into, ``(t, origin, shares x's memory, writes
    through)``: x's own memory only when the call is in place and writes reach x; else a clone."""
    t, o, shared, _ = _to_transport(x, st)
    through = _writes_through(o)
    if shared and not (inplace and through):
        t = t.clone()
        shared = False
    return t, o, shared, through


def allreduce(x: Any, op: str = "sum", *, inplace: bool = False, async_op: bool = False) -> Any:
    """Reduce ``x`` elementwise over every rank; every rank gets the result.

    ``op``: sum, mean, max, min, prod (mean: integers refused). ``inplace=True`` writes into ``x``
    (mutable backends; CapabilityError elsewhere) and returns it. ``async_op=True`` returns a
    :class:`Work` whose ``wait()`` gives the result.
    """
    st = _st()
    b = backend_of(x)
    check_op(op, b.dtype_of(x), "distributed.allreduce")
    _check_inplace(x, inplace, "distributed.allreduce")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch.distributed as tdist

        t, o, shared, through = _working_tensor(x, st, inplace)
        with _quiet():
            w = tdist.all_reduce(t, op=_reduce_op(op), async_op=True)

        def finish() -> Any:
            if op == "mean":
                t.div_(st.world_size)
            return _result(t, o, x, inplace, shared, through)
        return [w], finish

    return _run(st, "allreduce", start, async_op)


def broadcast(x: Any, src: int = 0, *, inplace: bool = False, async_op: bool = False) -> Any:
    """Rank ``src``'s ``x`` on every rank (each rank passes a tensor of the same shape and dtype;
    only ``src``'s values matter). ``inplace=True`` writes into ``x`` (mutable backends)."""
    st = _st()
    _check_rank(src, st, "distributed.broadcast", "src")
    backend_of(x)
    _check_inplace(x, inplace, "distributed.broadcast")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch.distributed as tdist

        t, o, shared, through = _working_tensor(x, st, inplace)
        with _quiet():
            w = tdist.broadcast(t, src=src, async_op=True)
        return [w], lambda: _result(t, o, x, inplace, shared, through)

    return _run(st, "broadcast", start, async_op)


def reduce(x: Any, dst: int = 0, op: str = "sum", *, async_op: bool = False) -> Any:
    """The reduction of every rank's ``x`` on rank ``dst`` (a new tensor); None on the other ranks."""
    st = _st()
    b = backend_of(x)
    _check_rank(dst, st, "distributed.reduce", "dst")
    check_op(op, b.dtype_of(x), "distributed.reduce")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch.distributed as tdist

        t, o, shared, _ = _to_transport(x, st)
        if shared:
            t = t.clone()  # torch reduces in place on every rank
        with _quiet():
            w = tdist.reduce(t, dst=dst, op=_reduce_op(op), async_op=True)

        def finish() -> Any:
            if st.rank != dst:
                return None
            if op == "mean":
                t.div_(st.world_size)
            return _from_transport(t, o)
        return [w], finish

    return _run(st, "reduce", start, async_op)


_DTYPE_NAMES = dict(enumerate(["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                               "float32", "float64", "complex64", "complex128", "uint16", "uint32",
                               "uint64"]))
_DTYPE_CODES = {v: k for k, v in _DTYPE_NAMES.items()}


def _exchange_shapes(t: Any, dtype: str, st: _State, axis: int, what: str) -> list[int]:
    """Every rank's length along ``axis`` (synchronously); checks rank count, other dims and dtype."""
    import torch
    import torch.distributed as tdist

    if t.dim() > 16:
        raise CollectiveInputError(f"{what}: at most 16 dimensions")
    code = _DTYPE_CODES.get(dtype, -1)
    meta = [t.dim(), code, *list(t.shape)]
    meta += [-1] * (2 + 16 - len(meta))
    mine = torch.tensor(meta, dtype=torch.int64, device=t.device)
    allm = [torch.empty_like(mine) for _ in range(st.world_size)]
    with _quiet():
        tdist.all_gather(allm, mine)
    rows = [m.tolist() for m in allm]
    rest = list(t.shape[:axis]) + list(t.shape[axis + 1:])
    for r, row in enumerate(rows):
        shape_r = row[2:2 + row[0]] if row[0] >= 0 else []
        rest_r = shape_r[:axis] + shape_r[axis + 1:]
        if row[0] != t.dim() or row[1] != code or rest_r != rest:
            raise CollectiveInputError(
                f"{what}: rank {r} passed shape {tuple(shape_r)} ({_DTYPE_NAMES.get(row[1], '?')}) but rank "
                f"{st.rank} passed {tuple(t.shape)} ({dtype}); tensors must agree in dtype "
                f"and in every dimension but axis {axis}"
            )
    return [row[2 + axis] for row in rows]


def _pad_to(t: Any, length: int, axis: int) -> Any:
    import torch

    if t.shape[axis] == length:
        return t
    shape = list(t.shape)
    shape[axis] = length - t.shape[axis]
    return torch.cat([t, torch.zeros(shape, dtype=t.dtype, device=t.device)], dim=axis)


def _padded_send(x: Any, st: _State, ax: int, what: str) -> tuple[Any, _Origin, list[int]]:
    """For the gathers: x as a transport tensor, padded along ``ax`` to the longest rank's length,
    with its origin and every rank's length (pieces may differ along ``ax``)."""
    t, o, _, _ = _to_transport(x, st)
    lengths = _exchange_shapes(t, o.dtype, st, ax, what)
    return _pad_to(t, max(lengths), ax).contiguous(), o, lengths


def allgather(x: Any, axis: int = 0, *, async_op: bool = False) -> Any:
    """The concatenation of every rank's ``x`` along ``axis``, in rank order, on every rank.
    Lengths along ``axis`` may differ between ranks (a first small exchange finds them)."""
    st = _st()
    b = backend_of(x)
    ax = check_axis(axis, len(b.shape_of(x)), "distributed.allgather")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch
        import torch.distributed as tdist

        send, o, lengths = _padded_send(x, st, ax, "distributed.allgather")
        bufs = [torch.empty_like(send) for _ in range(st.world_size)]
        with _quiet():
            w = tdist.all_gather(bufs, send, async_op=True)

        def finish() -> Any:
            parts = [buf.narrow(ax, 0, n) for buf, n in zip(bufs, lengths)]
            return _from_transport(torch.cat(parts, dim=ax).contiguous(), o)
        return [w], finish

    return _run(st, "allgather", start, async_op)


def gather(x: Any, dst: int = 0, axis: int = 0, *, async_op: bool = False) -> Any:
    """The concatenation of every rank's ``x`` along ``axis`` on rank ``dst``; None elsewhere.
    Lengths along ``axis`` may differ between ranks. Uses torch.distributed's gather (NCCL too)."""
    st = _st()
    b = backend_of(x)
    _check_rank(dst, st, "distributed.gather", "dst")
    ax = check_axis(axis, len(b.shape_of(x)), "distributed.gather")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch
        import torch.distributed as tdist

        send, o, lengths = _padded_send(x, st, ax, "distributed.gather")
        bufs = [torch.empty_like(send) for _ in range(st.world_size)] if st.rank == dst else None
        with _quiet():
            w = tdist.gather(send, gather_list=bufs, dst=dst, async_op=True)

        def finish() -> Any:
            if st.rank != dst or bufs is None:
                return None
            parts = [buf.narrow(ax, 0, n) for buf, n in zip(bufs, lengths)]
            return _from_transport(torch.cat(parts, dim=ax).contiguous(), o)
        return [w], finish

    return _run(st, "gather", start, async_op)


def reduce_scatter(x: Any, op: str = "sum", axis: int = 0, *, async_op: bool = False) -> Any:
    """Reduce every rank's ``x`` elementwise and give rank ``r`` piece ``r`` of the result, cut along
    ``axis`` as ``numpy.array_split`` cuts (the first pieces one larger)."""
    st = _st()
    b = backend_of(x)
    check_op(op, b.dtype_of(x), "distributed.reduce_scatter")
    shape = b.shape_of(x)
    ax = check_axis(axis, len(shape), "distributed.reduce_scatter")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch
        import torch.distributed as tdist

        t, o, _, _ = _to_transport(x, st)
        n = st.world_size
        sizes = split_sizes(shape[ax], n)
        m = sizes[0] if sizes else 0
        # equal blocks (pad each piece to the largest), moved to the front axis: contiguous rows
        pieces = [_pad_to(p, m, ax) for p in torch.split(t, sizes, dim=ax)]
        send = torch.cat([p.movedim(ax, 0) for p in pieces], dim=0).contiguous()
        out = torch.empty((m, *tuple(send.shape[1:])), dtype=send.dtype, device=send.device)
        with _quiet():
            w = tdist.reduce_scatter_tensor(out, send, op=_reduce_op(op), async_op=True)

        def finish() -> Any:
            if op == "mean":
                out.div_(n)
            mine = out.narrow(0, 0, sizes[st.rank]).movedim(0, ax).contiguous()
            return _from_transport(mine, o)
        return [w], finish

    return _run(st, "reduce_scatter", start, async_op)


def scatter(x: Any, src: int = 0, axis: int = 0, *, backend: str | None = None,
            device: DeviceLike | None = None, async_op: bool = False) -> Any:
    """Rank ``src``'s ``x`` cut along ``axis`` (``numpy.array_split`` sizes); rank ``r`` gets piece ``r``.

    On the other ranks ``x`` may be None (or any tensor: only its backend and device are used): the
    piece is then a tensor of ``backend`` (default: src's backend) on ``device`` (default: x's device,
    else cpu:0). Shape and dtype travel from ``src`` in a first small exchange.
    """
    st = _st()
    _check_rank(src, st, "distributed.scatter", "src")
    if st.rank == src:
        if x is None:
            raise CollectiveInputError("distributed.scatter: the src rank must pass the tensor to scatter")
        check_axis(axis, len(backend_of(x).shape_of(x)), "distributed.scatter")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch
        import torch.distributed as tdist

        meta: list[Any] = [None]
        if st.rank == src:
            t, o, _, _ = _to_transport(x, st)
            meta = [(tuple(t.shape), o.dtype, o.backend.name, t.device.type)]
        with _quiet():
            tdist.broadcast_object_list(meta, src=src, device=st.object_device())
        full_shape, dtype, src_backend, kind = meta[0]
        ax = check_axis(axis, len(full_shape), "distributed.scatter")
        sizes = split_sizes(full_shape[ax], st.world_size)
        m = sizes[0] if sizes else 0
        if st.rank == src:
            o_me = o
        else:
            b = backend_of(x) if x is not None else get_backend(backend or src_backend)
            if device is not None:
                dev = resolve(b, device)
            else:
                dev = b.device_of(x) if x is not None else Device("cpu", 0)
            o_me = _Origin(b, dev, dtype, b is _transport())
        piece_shape = list(full_shape)
        piece_shape[ax] = m
        moved = [piece_shape[ax], *piece_shape[:ax], *piece_shape[ax + 1:]]
        tdev = st.device_for(kind)
        out = torch.empty(moved, dtype=getattr(torch, dtype), device=tdev)
        chunks = None
        if st.rank == src:
            t2 = t.to(tdev)
            chunks = [_pad_to(p, m, ax).movedim(ax, 0).contiguous() for p in torch.split(t2, sizes, dim=ax)]
        with _quiet():
            w = tdist.scatter(out, scatter_list=chunks, src=src, async_op=True)

        def finish() -> Any:
            mine = out.narrow(0, 0, sizes[st.rank]).movedim(0, ax).contiguous()
            return _from_transport(mine, o_me)
        return [w], finish

    return _run(st, "scatter", start, async_op)


def barrier() -> None:
    """Wait until every rank gets here (raises DistributedTimeoutError when one never does)."""
    st = _st()

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch.distributed as tdist

        with _quiet():
            w = tdist.barrier(async_op=True)
        return [w], lambda: None

    _run(st, "barrier", start, False)
