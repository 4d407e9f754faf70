"""Collectives across processes, through torch.distributed (gloo on CPU, NCCL on GPU).

One process per rank, started by ``torchrun`` (or anything that sets its environment)::

    torchrun --nproc_per_node=4 train.py

    # train.py
    import multidev as md
    from multidev import distributed as dist

    dist.init()                                   # reads RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK
    g = dist.allreduce(grad, op="mean")           # grad: a numpy, torch, JAX, TF or MXNet tensor
    h = dist.allreduce(grad, async_op=True)       # a handle; h.wait() gives the result
    dist.shutdown()

Any backend's tensor travels as a torch tensor: zero-copy through DLPack where the producer and the
process group's device allow it (``torch.from_dlpack`` of the adapter's ``export_dlpack``), else an
explicit copy through NumPy; the result comes back as a tensor of the input's backend, on the input's
device, with its dtype. The transport is torch.distributed itself; nothing here is home-made.

Semantics follow :mod:`multidev.collectives`: the same ops (``mean`` is a sum divided by the world
size and is refused for integers; ``bool`` takes max/min only), uneven pieces follow
``numpy.array_split`` (``scatter``, ``reduce_scatter``, and ``allgather``/``gather`` accept pieces
that differ along ``axis``). Every rank must call every collective in the same order with tensors of
one dtype and (except along ``axis`` for the gathers) one shape.

Failure: a rank that dies, hangs or never arrives makes the others raise
:class:`DistributedTimeoutError` within the ``timeout`` given to :func:`init` (immediately, when
the peer's connection closes), never hang. The process group is then unusable: call
:func:`shutdown` and start again.

``torch`` is imported by these functions only, so ``import multidev`` stays light.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

import numpy as np

from ._device import Device, DeviceLike
from .collectives import split_sizes
from .errors import CapabilityError, CollectiveInputError, DistributedError, DistributedTimeoutError
from .registry import backend_of, get_backend

__all__ = [
    "init", "is_initialized", "shutdown", "rank", "world_size", "local_rank", "backend_name",
    "barrier", "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "scatter", "gather",
    "Work", "DistributedError", "DistributedTimeoutError", "DEFAULT_TIMEOUT",
]

#: Seconds a collective (and init's rendezvous) waits for the other ranks before raising.
DEFAULT_TIMEOUT = 300.0




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


_state: _State | None = None
_lock = threading.Lock()

_PEER_LOST = ("timed out", "timeout", "connection closed", "connection reset", "pair closure",
              "broken pipe", "connection refused", "peer", "waiting for clients", "socket", "aborted",
              "unavailable")


def _env_int(name: str, given: int | None, default: int | None) -> int:
    if given is not None:
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
        raise DistributedError(f"${name}={v!r} is not an integer") from None


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
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise DistributedError(f"{name} must be a positive number of seconds, got {v!r}")
        cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        if backend is None:
            backend = "cpu:gloo,cuda:nccl" if cuda and tdist.is_nccl_available() else "gloo"
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
        except Exception as e:  # DistStoreError, RuntimeError, ValueError
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

        try:
            if tdist.is_initialized():
                tdist.destroy_process_group()
        except Exception:  # a broken group may fail to tear down cleanly; it is gone either way
            pass
        _state = None


def _translate(e: BaseException, what: str, timeout: float) -> DistributedError:
    msg = str(e)
    low = msg.lower()
    if isinstance(e, TimeoutError) or any(k in low for k in _PEER_LOST):
        return DistributedTimeoutError(
            f"{what}: another rank died, hung or never arrived (timeout {timeout:g} s): {msg.strip()[:500]}"
        )
    return DistributedError(f"{what} failed in torch.distributed: {type(e).__name__}: {msg.strip()[:500]}")


def _fail(st: _State, e: BaseException, what: str) -> DistributedError:
    err = _translate(e, f"{what} on rank {st.rank}", st.timeout)
    st.broken = str(err)[:200]
    return err


# -- conversion to and from torch -----------------------------------------------------------------
@dataclass
class _Origin:
    backend: Any
    device: Device
    dtype: str
    is_torch: bool


def _torch_dtype_name(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def _from_numpy_to_torch(a: np.ndarray, dtype: str) -> Any:
    import torch

    a = np.ascontiguousarray(a)
    if dtype == "bfloat16":  # NumPy has no native bfloat16 (ml_dtypes); share the bits
        return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))


def _to_torch(x: Any, st: _State) -> tuple[Any, _Origin, bool, str]:
    """``(t, origin, shared, path)``: a contiguous torch tensor with x's values on the device the
    process group takes; ``shared`` when it aliases x's memory; ``path`` is ``"native"``,
    ``"dlpack"`` or ``"copy"``."""
    import torch

    b = backend_of(x)
    o = _Origin(b, b.device_of(x), b.dtype_of(x), b.framework == "torch")
    t, shared, path = None, False, "copy"
    if o.is_torch:
        t, shared, path = x.detach(), True, "native"  # detach: collectives are not autograd ops
    elif b.capabilities.dlpack:
        try:
            from .transfer import _exportable

            if b.capabilities.async_execution:
                b.wait(x)  # a bare capsule carries no stream: wait for the producer first
            t = torch.from_dlpack(_exportable(b, x))
            if _torch_dtype_name(t) != o.dtype or tuple(t.shape) != b.shape_of(x):
                t = None
            else:
                shared, path = True, "dlpack"
        except Exception:  # unsupported dtype, strides, read-only, device: copy instead
            t = None
    if t is None:
        t = _from_numpy_to_torch(b.to_numpy(x), o.dtype)
        shared, path = False, "copy"
    target = _pg_device(t, st)
    if t.device != target or not t.is_contiguous():
        t = t.to(target).contiguous()
        shared = False
        path = "copy"
    return t, o, shared, path


def _pg_device(t: Any, st: _State) -> Any:
    """The device a tensor must be on for this process group: its own where the group's backend
    serves that device type, else this rank's GPU (NCCL only) or the CPU (gloo only)."""
    import torch

    be = st.pg_backend
    if t.device.type == "cuda" and "nccl" in be:
        return st.cuda_device
    if t.device.type == "cpu" and ("gloo" in be or "mpi" in be):
        return torch.device("cpu")
    if "nccl" in be:
        return st.cuda_device
    return torch.device("cpu")


def _from_torch(t: Any, o: _Origin) -> Any:
    """``t`` as a tensor of the input's backend, on its device, with its dtype."""
    b = o.backend
    if o.is_torch:
        target = b.to_native_device(o.device)
        return t if t.device == target else t.to(target)
    if t.device.type != "cpu" and o.device.kind == "cpu":
        t = t.cpu()
    if t.device.type == "cuda":
        # the collective finished on torch's stream; a consumer of a bare capsule does not wait for it
        import torch

        torch.cuda.current_stream(t.device).synchronize()
    y = None
    if b.capabilities.dlpack:
        # import_dlpack takes the producer's device: the input's own where t lives on it (any CPU
        # tensor for a CPU input, virtual devices included), else t's own device and a move after
        here = (Device("cpu", 0) if t.device.type == "cpu" else Device("gpu", t.device.index or 0))
        if here.kind == o.device.kind and (here.kind == "cpu" or here.index == o.device.index):
            here = o.device
        try:
            y = b.import_dlpack(t, here)
            if b.dtype_of(y) != o.dtype or b.shape_of(y) != tuple(t.shape):
                y = None
        except Exception:  # the backend cannot take this buffer without a copy: copy below
            y = None
    if y is None:
        a = t.cpu()
        a = a.float().numpy() if o.dtype == "bfloat16" else a.numpy()
        return b.asarray(a, o.dtype, o.device)
    return y if b.device_of(y) == o.device else b.move(y, o.device)


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
                except Exception as e:  # torch's RuntimeError / DistError
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
def _quiet() -> Any:
    """torch.distributed warns on some calls about its own deprecated internals; keep logs clean."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


# -- validation -----------------------------------------------------------------------------------
def _check_op(op: str, dtype: str, what: str) -> None:
    from .collectives import _check_op as check

    check(op, dtype, what)


def _reduce_op(op: str) -> Any:
    import torch.distributed as tdist

    return {"sum": tdist.ReduceOp.SUM, "mean": tdist.ReduceOp.SUM, "prod": tdist.ReduceOp.PRODUCT,
            "max": tdist.ReduceOp.MAX, "min": tdist.ReduceOp.MIN}[op]


def _check_rank(r: Any, st: _State, what: str, name: str) -> int:
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < st.world_size:
        raise CollectiveInputError(f"{what}: {name}={r!r} is not a rank of this world (0..{st.world_size - 1})")
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
    except (ValueError, RuntimeError) as e:
        raise CapabilityError(f"{what}(inplace=True): this {b.name} tensor cannot be written ({e}); "
                              "pass a writable tensor or use inplace=False") from e


def _axis(shape: tuple[int, ...], axis: int, what: str) -> int:
    from .collectives import _axis as check

    return check(axis, len(shape), what)


# -- collectives ----------------------------------------------------------------------------------
def _result(t: Any, o: _Origin, x: Any, inplace: bool, shared: bool, writes_through: bool) -> Any:
    if not inplace:
        return _from_torch(t, o)
    if shared and writes_through:
        return x  # the collective wrote into x's own memory
    o.backend.assign(x, _from_torch(t, o))
    return x


def _writes_through(o: _Origin) -> bool:
    """Whether writing into memory shared through DLPack is a valid in-place update of the input:
    torch tensors, and synchronous mutable backends (NumPy). Asynchronous engines (MXNet) get an
    explicit ``assign`` so their dependency tracking sees the write."""
    return o.is_torch or (o.backend.capabilities.mutable and not o.backend.capabilities.async_execution)


def _working_tensor(x: Any, st: _State, inplace: bool) -> tuple[Any, _Origin, bool, bool]:
    """The torch tensor a collective reduces into, ``(t, origin, shares x's memory, writes
    through)``: x's own memory only when the call is in place and writes reach x; else a clone."""
    t, o, shared, _ = _to_torch(x, st)
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
    _check_op(op, b.dtype_of(x), "distributed.allreduce")
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
    _check_op(op, b.dtype_of(x), "distributed.reduce")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch.distributed as tdist

        t, o, shared, _ = _to_torch(x, st)
        if shared:
            t = t.clone()  # torch reduces in place on every rank
        with _quiet():
            w = tdist.reduce(t, dst=dst, op=_reduce_op(op), async_op=True)

        def finish() -> Any:
            if st.rank != dst:
                return None
            if op == "mean":
                t.div_(st.world_size)
            return _from_torch(t, o)
        return [w], finish

    return _run(st, "reduce", start, async_op)


def _exchange_shapes(t: Any, st: _State, axis: int, what: str) -> list[int]:
    """Every rank's length along ``axis`` (synchronously); checks rank count, other dims and dtype."""
    import torch
    import torch.distributed as tdist

    code = _DTYPE_CODES.get(_torch_dtype_name(t), -1)
    meta = [t.dim(), code] + list(t.shape)
    meta += [-1] * (2 + 16 - len(meta))
    if t.dim() > 16:
        raise CollectiveInputError(f"{what}: at most 16 dimensions")
    mine = torch.tensor(meta, dtype=torch.int64, device=t.device)
    allm = [torch.empty_like(mine) for _ in range(st.world_size)]
    with _quiet():
        tdist.all_gather(allm, mine)
    rows = [m.tolist() for m in allm]
    for r, row in enumerate(rows):
        shape_r = row[2:2 + row[0]] if row[0] >= 0 else []
        rest_r = shape_r[:axis] + shape_r[axis + 1:]
        rest = list(t.shape[:axis]) + list(t.shape[axis + 1:])
        if row[0] != t.dim() or row[1] != code or rest_r != rest:
            raise CollectiveInputError(
                f"{what}: rank {r} passed shape {tuple(shape_r)} ({_DTYPE_NAMES.get(row[1], '?')}) but rank "
                f"{st.rank} passed {tuple(t.shape)} ({_torch_dtype_name(t)}); tensors must agree in dtype "
                f"and in every dimension but axis {axis}"
            )
    return [row[2 + axis] for row in rows]


_DTYPE_NAMES = dict(enumerate(["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                               "float32", "float64", "complex64", "complex128", "uint16", "uint32",
                               "uint64"]))
_DTYPE_CODES = {v: k for k, v in _DTYPE_NAMES.items()}


def _pad_to(t: Any, length: int, axis: int) -> Any:
    import torch

    if t.shape[axis] == length:
        return t
    shape = list(t.shape)
    shape[axis] = length - t.shape[axis]
    return torch.cat([t, torch.zeros(shape, dtype=t.dtype, device=t.device)], dim=axis)


def _padded_send(x: Any, st: _State, ax: int, what: str) -> tuple[Any, _Origin, list[int]]:
    """For the gathers: x as torch, padded along ``ax`` to the longest rank's length, with its
    origin and every rank's length (pieces may differ along ``ax``)."""
    t, o, _, _ = _to_torch(x, st)
    lengths = _exchange_shapes(t, st, ax, what)
    return _pad_to(t, max(lengths), ax).contiguous(), o, lengths


def allgather(x: Any, axis: int = 0, *, async_op: bool = False) -> Any:
    """The concatenation of every rank's ``x`` along ``axis``, in rank order, on every rank.
    Lengths along ``axis`` may differ between ranks (a first small exchange finds them)."""
    st = _st()
    b = backend_of(x)
    ax = _axis(b.shape_of(x), axis, "distributed.allgather")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch
        import torch.distributed as tdist

        send, o, lengths = _padded_send(x, st, ax, "distributed.allgather")
        bufs = [torch.empty_like(send) for _ in range(st.world_size)]
        with _quiet():
            w = tdist.all_gather(bufs, send, async_op=True)

        def finish() -> Any:
            parts = [buf.narrow(ax, 0, n) for buf, n in zip(bufs, lengths)]
            return _from_torch(torch.cat(parts, dim=ax).contiguous(), o)
        return [w], finish

    return _run(st, "allgather", start, async_op)


def gather(x: Any, dst: int = 0, axis: int = 0, *, async_op: bool = False) -> Any:
    """The concatenation of every rank's ``x`` along ``axis`` on rank ``dst``; None elsewhere.
    Lengths along ``axis`` may differ between ranks."""
    st = _st()
    b = backend_of(x)
    _check_rank(dst, st, "distributed.gather", "dst")
    ax = _axis(b.shape_of(x), axis, "distributed.gather")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch
        import torch.distributed as tdist

        send, o, lengths = _padded_send(x, st, ax, "distributed.gather")
        if "nccl" in st.pg_backend and send.device.type == "cuda":
            # NCCL has no gather: all_gather and keep what dst needs
            bufs = [torch.empty_like(send) for _ in range(st.world_size)]
            with _quiet():
                w = tdist.all_gather(bufs, send, async_op=True)
        else:
            bufs = [torch.empty_like(send) for _ in range(st.world_size)] if st.rank == dst else None
            with _quiet():
                w = tdist.gather(send, gather_list=bufs, dst=dst, async_op=True)

        def finish() -> Any:
            if st.rank != dst:
                return None
            parts = [buf.narrow(ax, 0, n) for buf, n in zip(bufs, lengths)]
            return _from_torch(torch.cat(parts, dim=ax).contiguous(), o)
        return [w], finish

    return _run(st, "gather", start, async_op)


def reduce_scatter(x: Any, op: str = "sum", axis: int = 0, *, async_op: bool = False) -> Any:
    """Reduce every rank's ``x`` elementwise and give rank ``r`` piece ``r`` of the result, cut along
    ``axis`` as ``numpy.array_split`` cuts (the first pieces one larger)."""
    st = _st()
    b = backend_of(x)
    _check_op(op, b.dtype_of(x), "distributed.reduce_scatter")
    shape = b.shape_of(x)
    ax = _axis(shape, axis, "distributed.reduce_scatter")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch
        import torch.distributed as tdist

        t, o, _, _ = _to_torch(x, st)
        n = st.world_size
        sizes = split_sizes(shape[ax], n)
        m = sizes[0] if sizes else 0
        # equal blocks (pad each piece to the largest), moved to the front axis: contiguous rows
        pieces = [_pad_to(p, m, ax) for p in torch.split(t, sizes, dim=ax)]
        send = torch.cat([p.movedim(ax, 0) for p in pieces], dim=0).contiguous()
        out = torch.empty((m,) + tuple(send.shape[1:]), dtype=send.dtype, device=send.device)
        with _quiet():
            w = tdist.reduce_scatter_tensor(out, send, op=_reduce_op(op), async_op=True)

        def finish() -> Any:
            if op == "mean":
                out.div_(n)
            mine = out.narrow(0, 0, sizes[st.rank]).movedim(0, ax).contiguous()
            return _from_torch(mine, o)
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
        _axis(backend_of(x).shape_of(x), axis, "distributed.scatter")

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch
        import torch.distributed as tdist

        meta: list[Any] = [None]
        if st.rank == src:
            t, o, _, _ = _to_torch(x, st)
            meta = [(tuple(t.shape), o.dtype, o.backend.name)]
        with _quiet():
            tdist.broadcast_object_list(meta, src=src, device=st.cuda_device if "nccl" == st.pg_backend else None)
        full_shape, dtype, src_backend = meta[0]
        ax = _axis(full_shape, axis, "distributed.scatter")
        sizes = split_sizes(full_shape[ax], st.world_size)
        m = sizes[0] if sizes else 0
        if st.rank == src:
            o_me = o
        else:
            b = backend_of(x) if x is not None else get_backend(backend or src_backend)
            if device is not None:
                from .api import _resolve

                dev = _resolve(b, device)
            else:
                dev = b.device_of(x) if x is not None else Device("cpu", 0)
            o_me = _Origin(b, dev, dtype, b.framework == "torch")
        piece_shape = list(full_shape)
        piece_shape[ax] = m
        moved = [piece_shape[ax]] + piece_shape[:ax] + piece_shape[ax + 1:]
        tdev = st.cuda_device if st.pg_backend == "nccl" else torch.device("cpu")
        tdtype = getattr(torch, dtype)
        out = torch.empty(moved, dtype=tdtype, device=tdev)
        chunks = None
        if st.rank == src:
            t2 = t.to(tdev)
            chunks = [_pad_to(p, m, ax).movedim(ax, 0).contiguous() for p in torch.split(t2, sizes, dim=ax)]
        with _quiet():
            w = tdist.scatter(out, scatter_list=chunks, src=src, async_op=True)

        def finish() -> Any:
            mine = out.narrow(0, 0, sizes[st.rank]).movedim(0, ax).contiguous()
            return _from_torch(mine, o_me)
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

