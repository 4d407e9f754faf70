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

Consistency checks (on by default): before each collective the ranks exchange a small record of
the call (which collective, its op, root and axis, the tensor's dtype and shape, a call counter),
so a rank that calls another collective, another op, or passes another shape or dtype makes every
rank raise :class:`CollectiveMismatchError` naming what differs, rank by rank, instead of an abort
in gloo or silently wrong values; a rank that refuses its own input (``mean`` of integers, say)
makes the others raise :class:`DistributedError` too. The group stays usable after either. The
cost is one extra small all-gather per call, the latency of one tiny collective (0.5 to 1.3 ms
on 2 gloo ranks of a loaded 2-core VM; see ``docs/collectives.md``); ``init(check=False)`` or
``MULTIDEV_DISTRIBUTED_CHECK=0`` turns it off (every rank must choose the same, which init
verifies), after which mismatched calls are undefined behaviour of torch.distributed. The gathers
always exchange lengths, so they are always checked.

Failure: a rank that dies, hangs or never arrives makes the others raise
:class:`DistributedTimeoutError` within the ``timeout`` given to :func:`init` (immediately, when
the peer's connection closes), never hang. Errors are classified by type: what the transport
raises during a collective (torch's ``DistError`` family, and the bare ``RuntimeError`` gloo uses
for a lost peer) is a lost or hung peer, since the inputs were checked before it was called;
argument errors are :class:`DistributedError`. The process group is then unusable: call
:func:`shutdown` and start again.

Exit: a process group that :func:`init` created is destroyed at interpreter exit when the script
did not call :func:`shutdown` (torch.distributed may otherwise abort a rank at exit).

``torch`` is imported by these functions only, so ``import multidev`` stays light.
"""
from __future__ import annotations

import atexit
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
from .errors import (
    CapabilityError,
    CollectiveInputError,
    CollectiveMismatchError,
    DistributedError,
    DistributedTimeoutError,
    MultidevError,
)
from .exchange import convert
from .placement import resolve
from .protocol import Backend
from .registry import backend_of, get_backend
from .validate import check_axis, check_op, framework_error

__all__ = [
    "CHECK_ENV",
    "DEFAULT_TIMEOUT",
    "TRANSPORT",
    "CollectiveMismatchError",
    "DistributedError",
    "DistributedTimeoutError",
    "Work",
    "allgather",
    "allreduce",
    "backend_name",
    "barrier",
    "broadcast",
    "checks_enabled",
    "gather",
    "init",
    "is_initialized",
    "local_rank",
    "rank",
    "reduce",
    "reduce_scatter",
    "scatter",
    "shutdown",
    "transport_path",
    "world_size",
]

#: Seconds a collective (and init's rendezvous) waits for the other ranks before raising.
DEFAULT_TIMEOUT = 300.0
#: The backend whose tensors torch.distributed moves: every other backend's tensor is converted to it.
TRANSPORT = "torch"
#: The environment variable that turns the cross-rank consistency checks off ("0", "false", "off",
#: "no") when init is not given ``check=``.
CHECK_ENV = "MULTIDEV_DISTRIBUTED_CHECK"


# -- process group state --------------------------------------------------------------------------
@dataclass
class _State:
    rank: int
    world_size: int
    local_rank: int
    pg_backend: str
    timeout: float
    cuda_device: Any  # torch.device of this rank's GPU, or None
    check: bool = True
    store: Any = None  # the TCPStore (kept alive with the group, dropped at shutdown)
    seq: int = 0  # collectives called so far (the consistency records carry it)
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
         timeout: float = DEFAULT_TIMEOUT, rendezvous_timeout: float | None = None,
         check: bool | None = None) -> None:
    """Join the process group.

    Every argument left as None is read from torchrun's environment: ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR`` (default 127.0.0.1), ``MASTER_PORT`` (default 29500), ``LOCAL_RANK`` (default
    ``RANK``). ``backend``: ``"gloo"``, ``"nccl"``, or None for ``"cpu:gloo,cuda:nccl"`` where CUDA
    and NCCL are present (CPU tensors through gloo, GPU tensors through NCCL) and ``"gloo"``
    elsewhere. ``timeout`` (seconds) bounds every collective: a dead or hung rank raises
    :class:`DistributedTimeoutError` in the others instead of hanging. ``rendezvous_timeout`` (default:
    ``timeout``) bounds the wait for every rank to arrive; a rank that never does makes init raise
    :class:`DistributedTimeoutError`. ``check``: the cross-rank consistency checks (see the module
    doc; default on, or ``$MULTIDEV_DISTRIBUTED_CHECK``); every rank must pass the same.

    Under torchrun (``TORCHELASTIC_USE_AGENT_STORE``) the ranks join the agent's store rather than
    host their own. The group is destroyed at interpreter exit if :func:`shutdown` was not called.
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
        checked = _check_setting(check)
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
            store = _store(tdist, addr, port, r, ws, float(rdv))
            tdist.init_process_group(backend, store=store, rank=r, world_size=ws,
                                     timeout=timedelta(seconds=float(timeout)), **kwargs)
        except Exception as e:
            raise _translate(e, f"init (rank {r} of {ws}, {addr}:{port})", float(rdv)) from e
        st = _State(r, ws, lr, backend, float(timeout), cuda_device, checked, store)
        try:
            settings = _gather_ints(st, [int(checked)])
        except Exception as e:
            with contextlib.suppress(Exception):
                tdist.destroy_process_group()
            raise _translate(e, f"init (rank {r} of {ws}, {addr}:{port})", float(rdv)) from e
        if len({row[0] for row in settings}) > 1:
            with contextlib.suppress(Exception):
                tdist.destroy_process_group()
            on = [i for i, row in enumerate(settings) if row[0]]
            raise DistributedError(
                f"init: the ranks disagree on the consistency checks (on for ranks {on}, off for the others); "
                f"pass the same check= (or ${CHECK_ENV}) to every rank")
        _state = st
        _register_exit_hook()


def _check_setting(check: bool | None) -> bool:
    if check is None:
        return os.environ.get(CHECK_ENV, "1").strip().lower() not in ("0", "false", "off", "no")
    if not isinstance(check, bool):
        raise DistributedError(f"check must be True, False or None, got {check!r:.40}")
    return check


def _store(tdist: Any, addr: str, port: int, rank: int, world: int, timeout: float) -> Any:
    """The rendezvous store. Under torchrun its agent already serves one on $MASTER_ADDR:$MASTER_PORT:
    at that address every rank joins it as a client (under the worker prefix torch's own ``env://``
    uses, plus one per init), so no rank tries to bind the port (c10d would print that the server
    socket failed to bind). Elsewhere rank 0 hosts it and waits up to ``timeout`` for every rank."""
    global _generation
    td = timedelta(seconds=timeout)
    agent = (os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
             and addr == os.environ.get("MASTER_ADDR") and str(port) == os.environ.get("MASTER_PORT"))
    if agent:
        client = tdist.TCPStore(addr, port, world, is_master=False, timeout=td)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        _generation += 1  # a later init (after shutdown) in the same job must not meet this one's keys
        return tdist.PrefixStore(f"/worker/attempt_{attempt}/multidev_{_generation}", client)
    return tdist.TCPStore(addr, port, world, is_master=(rank == 0), timeout=td, wait_for_workers=True)


_generation = 0


_exit_hook = False


def _register_exit_hook() -> None:
    global _exit_hook
    if not _exit_hook:
        atexit.register(_shutdown_at_exit)  # runs before torch's own exit handlers (registered earlier)
        _exit_hook = True


def _shutdown_at_exit() -> None:
    with contextlib.suppress(Exception):
        shutdown()


def is_initialized() -> bool:
    """True between :func:`init` and :func:`shutdown`."""
    return _state is not None


def checks_enabled() -> bool:
    """Whether this group checks every collective's consistency across ranks (see the module doc)."""
    return _st().check


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
        _state.store = None
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
    like: Any = None  # the input tensor: results take its array type (mx.np in, mx.np out)


def _transport() -> Backend:
    return get_backend(TRANSPORT)


def _to_transport(x: Any, st: _State) -> tuple[Any, _Origin, bool, str]:
    """``(t, origin, shared, path)``: a contiguous transport tensor with x's values on the device
    the process group takes; ``shared`` when it aliases x's memory; ``path`` is ``"native"`` (x is
    a transport tensor), ``"dlpack"`` (shared through DLPack) or ``"copy"``."""
    b = backend_of(x)
    tb = _transport()
    o = _Origin(b, b.device_of(x), b.dtype_of(x), b is tb, x)
    if o.is_transport:
        t, shared, path = x.detach(), True, "native"  # detach: collectives are not autograd ops
    else:
        # host memory of any (virtual) CPU device travels as the transport's CPU tensor
        at = Device("cpu", 0) if o.device.kind == "cpu" else None
        try:
            t, shared, path = convert(x, TRANSPORT, copy=False, device=at), True, "dlpack"
        except CapabilityError:
            t, shared, path = convert(x, TRANSPORT, copy=True, device=at), False, "copy"
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
    y = y if b.device_of(y) == o.device else b.move(y, o.device)
    return _as_type_of(b, y, o.like)


def _as_type_of(b: Backend, y: Any, like: Any) -> Any:
    """``y`` as a tensor of ``like``'s array type, for backends with several (MXNet's ``mx.nd`` and
    ``mx.np``: DLPack imports give the first), through the protocol: adapter operations return
    their first operand's type, so ``y`` is joined onto an empty piece of ``like`` (one copy, and
    only when the types differ)."""
    if like is None or type(y) is type(like):
        return y
    shape = b.shape_of(y)
    n = 1
    for d in shape:
        n *= d
    m = 1
    for d in b.shape_of(like):
        m *= d
    empty = b.split(b.reshape(like, (m,)), [0, m], 0)[0]
    if b.device_of(empty) != b.device_of(y):
        empty = b.move(empty, b.device_of(y))
    return b.reshape(b.concat([empty, b.reshape(y, (n,))], 0), shape)


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

    @classmethod
    def failed(cls, error: BaseException, what: str, st: _State) -> Work:
        """A handle whose ``wait()`` raises ``error`` (a collective that could not start)."""
        w = cls([], lambda: None, what, st)
        w._error, w._done = error, True
        return w

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


# -- cross-rank consistency -------------------------------------------------------------------------
_KINDS = ("allreduce", "broadcast", "reduce", "allgather", "gather", "reduce_scatter", "scatter", "barrier")
_GATHERS = ("allgather", "gather")  # they exchange lengths anyway: always checked
_OP_CODES = ("sum", "max", "min", "prod", "mean")
_DTYPE_NAMES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
                "complex64", "complex128", "uint16", "uint32", "uint64")
_REFUSALS = ("MultidevError", "CollectiveInputError", "CapabilityError", "UnsupportedTensorError",
             "InvalidDtypeError", "InvalidArgumentError", "DeviceMismatchError", "DeviceNotFoundError",
             "DistributedError", "BackendError")
#: Dimensions a consistency record holds (a tensor with more is refused on every rank).
MAX_DIMS = 32
_NONE = -(1 << 62)  # an absent root or axis in a record (a given axis may be negative)
#: What each collective's ranks must agree on (besides the collective itself and the call count).
_AGREE = {"allreduce": ("op", "dtype", "shape"), "broadcast": ("root", "dtype", "shape"),
          "reduce": ("root", "op", "dtype", "shape"), "allgather": ("axis", "dtype", "rest"),
          "gather": ("root", "axis", "dtype", "rest"), "reduce_scatter": ("op", "axis", "dtype", "shape"),
          "scatter": ("root", "axis"), "barrier": ()}


@dataclass(frozen=True)
class _Call:
    """One rank's record of a collective call, as the consistency exchange carries it."""

    kind: str
    op: str | None = None
    root: int | None = None
    axis: int | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    seq: int = 0
    refused: str | None = None  # the error class name of a rank that refused its own input

    def encode(self) -> list[int]:
        shape = self.shape or ()
        row = [self.seq, _KINDS.index(self.kind), _OP_CODES.index(self.op) if self.op else -1,
               _NONE if self.root is None else self.root, _NONE if self.axis is None else self.axis,
               _DTYPE_NAMES.index(self.dtype) if self.dtype in _DTYPE_NAMES else -1,
               -1 if self.shape is None else len(shape),
               -1 if self.refused is None else _REFUSALS.index(self.refused)]
        return row + list(shape) + [-1] * (MAX_DIMS - len(shape))

    @staticmethod
    def decode(row: Sequence[int]) -> _Call:
        def pick(names: Sequence[str], i: int) -> str | None:
            return names[i] if 0 <= i < len(names) else None
        ndim = row[6]
        return _Call(kind=pick(_KINDS, row[1]) or "?", op=pick(_OP_CODES, row[2]),
                     root=None if row[3] == _NONE else row[3], axis=None if row[4] == _NONE else row[4],
                     dtype=pick(_DTYPE_NAMES, row[5]), shape=None if ndim < 0 else tuple(row[8:8 + ndim]),
                     seq=row[0], refused=pick(_REFUSALS, row[7]))

    def field(self, name: str) -> Any:
        if name == "rest":
            if self.shape is None or self.axis is None or not 0 <= self.axis < len(self.shape):
                return self.shape
            return (len(self.shape), self.shape[:self.axis] + self.shape[self.axis + 1:])
        return getattr(self, name)


def _describe(name: str, value: Any) -> str:
    if name == "rest" and isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple):
        return f"{value[0]}-d, other dims {value[1]}"
    return str(value)


def _gather_ints(st: _State, row: list[int]) -> list[list[int]]:
    """Every rank's ``row`` (the same length on every rank), in rank order: one small all-gather."""
    import torch
    import torch.distributed as tdist

    dev = st.device_for("cpu")
    mine = torch.tensor(row, dtype=torch.int64, device=dev)
    out = torch.empty(st.world_size * len(row), dtype=torch.int64, device=dev)
    with _quiet():
        tdist.all_gather_into_tensor(out, mine)
    vals = out.tolist()
    n = len(row)
    return [vals[i * n:(i + 1) * n] for i in range(st.world_size)]


def _shape(b: Backend, x: Any, what: str) -> tuple[int, ...]:
    shape = b.shape_of(x)
    if len(shape) > MAX_DIMS:
        raise CollectiveInputError(f"{what}: at most {MAX_DIMS} dimensions, got a {len(shape)}-d tensor")
    return shape


def _agree(st: _State, kind: str, local: Callable[[], _Call], async_op: bool = False) -> list[_Call] | Work | None:
    """Run ``local`` (this rank's own argument checks, giving its record of the call), then, when the
    group checks consistency (always for the gathers), exchange the records and fail on every
    rank alike if any rank refused its input (DistributedError; that rank raises its own error) or
    the ranks disagree (CollectiveMismatchError). Returns every rank's record (None unchecked).

    This rank's own argument errors raise at once. Errors that come from the other ranks (a
    mismatch, a refusal, a peer that never arrives) raise here, or with ``async_op`` come back as a
    failed :class:`Work` whose ``wait()`` raises them, as the collective's own errors would."""
    try:
        calls = _exchange_calls(st, kind, local)
    except _PeerFailure as f:
        if async_op:
            return Work.failed(f.error, kind, st)
        raise f.error from f.error.__cause__
    return calls


class _PeerFailure(Exception):
    def __init__(self, error: DistributedError) -> None:
        super().__init__(str(error))
        self.error = error


def _exchange_calls(st: _State, kind: str, local: Callable[[], _Call]) -> list[_Call] | None:
    what = f"distributed.{kind}"
    err: MultidevError | None = None
    try:
        call = local()
    except Exception as e:  # noqa: BLE001 - reported to the other ranks, then raised here
        err = framework_error(e, what)
        name = type(err).__name__
        call = _Call(kind, refused=name if name in _REFUSALS else "MultidevError")
    if not st.check and kind not in _GATHERS:
        if err is not None:
            raise err
        return None
    if err is not None and not st.check:
        raise err
    call = _Call(**{**call.__dict__, "seq": st.seq})
    st.seq += 1
    try:
        calls = [_Call.decode(row) for row in _gather_ints(st, call.encode())]
    except Exception as e:  # noqa: BLE001 - classified by _fail and raised
        fail = _fail(st, e, f"{kind} (consistency exchange)")
        fail.__cause__ = e
        raise _PeerFailure(fail) from None
    if err is not None:
        raise err
    problem = _disagreement(calls, kind, what, st.rank)
    if problem is not None:
        raise _PeerFailure(problem)
    return calls


def _disagreement(calls: list[_Call], kind: str, what: str, rank: int) -> DistributedError | None:
    tail = "Every rank raises this error; the process group stays usable."
    refused = [(r, c) for r, c in enumerate(calls) if c.refused]
    if refused:
        who = ", ".join(f"rank {r} ({c.refused})" for r, c in refused)
        return DistributedError(f"{what} on rank {rank}: {who} refused its input, so no rank runs this "
                                f"collective (that rank's own error says why). {tail}")
    if len({(c.kind, c.seq) for c in calls}) > 1:
        who = ", ".join(f"rank {r}: {c.kind} (call #{c.seq})" for r, c in enumerate(calls))
        return CollectiveMismatchError(f"{what} on rank {rank}: the ranks called different collectives ({who}); "
                                       f"every rank must call the same collectives in the same order. {tail}")
    for name in _AGREE[kind]:
        values = [c.field(name) for c in calls]
        if len(set(values)) > 1:
            label = "shape (every dimension but axis)" if name == "rest" else name
            who = ", ".join(f"rank {r}: {_describe(name, v)}" for r, v in enumerate(values))
            return CollectiveMismatchError(f"{what} on rank {rank}: the ranks disagree on {label} ({who}). {tail}")
    return None


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

    def local() -> _Call:
        b = backend_of(x)
        dtype = b.dtype_of(x)
        check_op(op, dtype, "distributed.allreduce")
        _check_inplace(x, inplace, "distributed.allreduce")
        return _Call("allreduce", op=op, dtype=dtype, shape=_shape(b, x, "distributed.allreduce"))

    agreed = _agree(st, "allreduce", local, async_op)
    if isinstance(agreed, Work):
        return agreed

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

    def local() -> _Call:
        _check_rank(src, st, "distributed.broadcast", "src")
        b = backend_of(x)
        _check_inplace(x, inplace, "distributed.broadcast")
        return _Call("broadcast", root=src, dtype=b.dtype_of(x), shape=_shape(b, x, "distributed.broadcast"))

    agreed = _agree(st, "broadcast", local, async_op)
    if isinstance(agreed, Work):
        return agreed

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

    def local() -> _Call:
        b = backend_of(x)
        _check_rank(dst, st, "distributed.reduce", "dst")
        dtype = b.dtype_of(x)
        check_op(op, dtype, "distributed.reduce")
        return _Call("reduce", op=op, root=dst, dtype=dtype, shape=_shape(b, x, "distributed.reduce"))

    agreed = _agree(st, "reduce", local, async_op)
    if isinstance(agreed, Work):
        return agreed

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


def _pad_to(t: Any, length: int, axis: int) -> Any:
    import torch

    if t.shape[axis] == length:
        return t
    shape = list(t.shape)
    shape[axis] = length - t.shape[axis]
    return torch.cat([t, torch.zeros(shape, dtype=t.dtype, device=t.device)], dim=axis)


def _padded_send(x: Any, st: _State, ax: int, lengths: list[int]) -> tuple[Any, _Origin]:
    """For the gathers: x as a transport tensor, padded along ``ax`` to the longest rank's length
    (``lengths``: every rank's, from the consistency exchange), with its origin."""
    t, o, _, _ = _to_transport(x, st)
    return _pad_to(t, max(lengths), ax).contiguous(), o


def _gather_call(st: _State, kind: str, x: Any, axis: Any, root: int | None,
                 async_op: bool) -> tuple[int, list[int]] | Work:
    """The gathers' agreement: ``(axis, every rank's length along it)``, or a failed Work."""
    what = f"distributed.{kind}"
    ax_box: list[int] = []

    def local() -> _Call:
        if root is not None:
            _check_rank(root, st, what, "dst")
        b = backend_of(x)
        shape = _shape(b, x, what)
        ax_box.append(check_axis(axis, len(shape), what))
        return _Call(kind, root=root, axis=ax_box[0], dtype=b.dtype_of(x), shape=shape)

    calls = _agree(st, kind, local, async_op)
    if isinstance(calls, Work):
        return calls
    assert calls is not None  # the gathers always exchange
    ax = ax_box[0]
    return ax, [c.shape[ax] if c.shape is not None else 0 for c in calls]


def allgather(x: Any, axis: int = 0, *, async_op: bool = False) -> Any:
    """The concatenation of every rank's ``x`` along ``axis``, in rank order, on every rank.
    Lengths along ``axis`` may differ between ranks (a first small exchange finds them)."""
    st = _st()
    agreed = _gather_call(st, "allgather", x, axis, None, async_op)
    if isinstance(agreed, Work):
        return agreed
    ax, lengths = agreed

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch
        import torch.distributed as tdist

        send, o = _padded_send(x, st, ax, lengths)
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
    agreed = _gather_call(st, "gather", x, axis, dst, async_op)
    if isinstance(agreed, Work):
        return agreed
    ax, lengths = agreed

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch
        import torch.distributed as tdist

        send, o = _padded_send(x, st, ax, lengths)
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
    box: list[Any] = []

    def local() -> _Call:
        b = backend_of(x)
        dtype = b.dtype_of(x)
        check_op(op, dtype, "distributed.reduce_scatter")
        shp = _shape(b, x, "distributed.reduce_scatter")
        box[:] = [shp, check_axis(axis, len(shp), "distributed.reduce_scatter")]
        return _Call("reduce_scatter", op=op, axis=box[1], dtype=dtype, shape=shp)

    agreed = _agree(st, "reduce_scatter", local, async_op)
    if isinstance(agreed, Work):
        return agreed
    shape, ax = box

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

    def local() -> _Call:
        _check_rank(src, st, "distributed.scatter", "src")
        if isinstance(axis, bool) or not isinstance(axis, int) or not -MAX_DIMS <= axis < MAX_DIMS:
            raise CollectiveInputError(f"distributed.scatter: axis must be an int in -{MAX_DIMS}..{MAX_DIMS - 1}, "
                                       f"got {axis!r:.40}")
        if st.rank != src:
            return _Call("scatter", root=src, axis=axis)  # the axis as given: only src knows the rank
        if x is None:
            raise CollectiveInputError("distributed.scatter: the src rank must pass the tensor to scatter")
        b = backend_of(x)
        shape = _shape(b, x, "distributed.scatter")
        check_axis(axis, len(shape), "distributed.scatter")
        return _Call("scatter", root=src, axis=axis, dtype=b.dtype_of(x), shape=shape)

    agreed = _agree(st, "scatter", local, async_op)
    if isinstance(agreed, Work):
        return agreed

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
    _agree(st, "barrier", lambda: _Call("barrier"))

    def start() -> tuple[list[Any], Callable[[], Any]]:
        import torch.distributed as tdist

        with _quiet():
            w = tdist.barrier(async_op=True)
        return [w], lambda: None

    _run(st, "barrier", start, False)
