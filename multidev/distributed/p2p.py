"""Point-to-point messages: :func:`send` from one rank, :func:`recv` on another.

A message is a small header, then the tensor, both through the engine's :meth:`Engine.send` /
:meth:`Engine.recv`. The header carries what the receiver needs and checks: the tensor's dtype,
shape, backend and the kind of device it travels on, the sender's ``tag``, the message's count on
this pair of ranks, or the class of the error of a sender that refused its own tensor (then no
tensor follows). The receiver allocates from it (``recv`` needs no shape), or checks it against
``out``: a tensor that does not fit, or a tag that differs, is taken whole and dropped, and the
receiver raises CollectiveMismatchError naming both sides; the sender has handed its message over
(as MPI's send has, whose receiver reports a truncation), and the group stays usable. Messages
between two ranks arrive in the order they were sent (tags are checked, not matched).

A send returns once the engine has sent the message; on torch.distributed and MPI that may wait for
the receiver's ``recv`` (a large message, rendezvous protocols), on JAX it always does (each message
is a program both ranks run). Every wait has the group's timeout: a peer that never comes raises
DistributedTimeoutError naming it, and the group is unusable after it (a message may be left half
way), as after a collective's timeout.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._device import KINDS, Device, DeviceLike
from ..errors import (
    CapabilityError,
    CollectiveInputError,
    CollectiveMismatchError,
    DistributedError,
    DistributedTimeoutError,
    InvalidArgumentError,
    MultidevError,
    UnsupportedTensorError,
    translate_errors,
)
from ..placement import resolve
from ..registry import backend_of, get_backend, registered_backends
from ..validate import check_writable
from .collectives import holding, working
from .consistency import MAX_DIMS
from .engine import Engine, Handle
from .group import Group, current
from .handles import Kept, Work
from .transport import Origin, from_transport, to_transport, transport_backend

__all__ = ["recv", "send"]

_HOST = Device("cpu", 0)
_MAGIC = 0x6D6450  # "mdP"
_NAME = 8  # int32 words of the sender's backend name (32 bytes)
_HEAD = 7
_ROW = _HEAD + _NAME + 2 * MAX_DIMS  # every field an int32: the JAX engine carries no int64 without x64
_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
           "complex64", "complex128", "uint16", "uint32", "uint64")
_REFUSALS = ("MultidevError", "CollectiveInputError", "CapabilityError", "UnsupportedTensorError",
             "InvalidDtypeError", "InvalidArgumentError", "DeviceMismatchError", "DistributedError")


# -- the header -----------------------------------------------------------------------------------
def _header(count: int, tag: int, dtype: str | None, shape: tuple[int, ...], tkind: str | None,
            refused: str | None, backend: str | None) -> np.ndarray:
    row = np.zeros(_ROW, np.int32)
    row[:_HEAD] = [_MAGIC, count, tag, _DTYPES.index(dtype) if dtype in _DTYPES else -1, len(shape),
                   KINDS.index(tkind) if tkind in KINDS else -1,
                   -1 if refused is None else _REFUSALS.index(refused) if refused in _REFUSALS else 0]
    name = (backend or "").encode()[: 4 * _NAME].ljust(4 * _NAME, b"\0")
    row[_HEAD:_HEAD + _NAME] = np.frombuffer(name, dtype="<i4")
    dims = np.array(shape, dtype=np.int64)
    row[_HEAD + _NAME:_HEAD + _NAME + 2 * len(shape):2] = (dims >> 31).astype(np.int32)
    row[_HEAD + _NAME + 1:_HEAD + _NAME + 2 * len(shape):2] = (dims & 0x7FFFFFFF).astype(np.int32)
    return row


def _read(row: np.ndarray) -> dict[str, Any]:
    r = [int(v) for v in np.asarray(row, dtype=np.int64).reshape(-1)]
    if len(r) != _ROW or r[0] != _MAGIC:
        raise DistributedError("distributed.recv: what arrived is not a multidev message header (another kind of "
                               "message on this channel, or a group whose messages fell out of step)")
    ndim = r[4]
    dims = r[_HEAD + _NAME:_HEAD + _NAME + 2 * ndim]
    name = np.array(r[_HEAD:_HEAD + _NAME], dtype="<i4").tobytes().rstrip(b"\0").decode(errors="replace")
    return {"count": r[1], "tag": r[2], "dtype": _DTYPES[r[3]] if 0 <= r[3] < len(_DTYPES) else None,
            "shape": tuple((dims[i] << 31) | dims[i + 1] for i in range(0, 2 * ndim, 2)),
            "tkind": KINDS[r[5]] if 0 <= r[5] < len(KINDS) else None,
            "refused": None if r[6] < 0 else _REFUSALS[r[6]], "backend": name or None}


# -- checks ---------------------------------------------------------------------------------------
def _peer(r: Any, g: Group, what: str, name: str) -> int:
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < g.world_size:
        raise CollectiveInputError(f"{what}: {name}={r!r:.40} is not a rank of this world (0..{g.world_size - 1})")
    if r == g.rank:
        raise CollectiveInputError(f"{what}: {name}={r} is this rank; a rank sends to and receives from other ranks")
    return r


def _tag(tag: Any, what: str) -> int:
    if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag < 2 ** 31:
        raise CollectiveInputError(f"{what}: tag must be an int in 0..2**31-1, got {tag!r:.40}")
    return tag


def _engine_sends(g: Group, what: str) -> None:
    e = type(g.engine)
    if e.send is Engine.send or e.recv is Engine.recv:
        raise CapabilityError(f"{what}: the {g.info.engine} engine has no point-to-point messages (collectives only)")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _host_row(g: Group, row: np.ndarray) -> Any:
    """The header as a transport tensor."""
    return to_transport(get_backend("numpy").asarray(row, None, _HOST), g)[0]


def _row_buffer(g: Group) -> Any:
    tb, tdev = transport_backend(g, _HOST, get_backend("numpy"))
    return g.engine.prepare(tb.empty((_ROW,), "int32", tdev))[0]


class _Both(Handle):
    """Several sends in flight: done when all are."""

    def __init__(self, *handles: Handle) -> None:
        self.handles = handles

    def test(self) -> bool:
        return all(h.test() for h in self.handles)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(h.wait(max(0.0, deadline - time.monotonic())) for h in self.handles)

    def result(self) -> Any:
        return None


class _Then(Handle):
    """The header's receive, then the tensor's (started by ``then`` from the header's result, once,
    under a lock: ``is_completed`` may ask from another thread). An error while reading the header
    or starting the tensor's receive leaves the tensor in flight: it breaks the group
    (DistributedError), the outcomes the receiver reports (a mismatch, a refusal) come from
    ``then``'s caller after the tensor was taken."""

    def __init__(self, head: Handle, then: Callable[[Any], Handle | None], what: str) -> None:
        self.head, self.then, self.what = head, then, what
        self.body: Handle | None = None
        self.started = False
        self.lock = threading.Lock()

    def _advance(self) -> None:
        with self.lock:
            if self.started:
                return
            raw = self.head.result()
            try:
                self.body = self.then(raw)
            except DistributedError:
                raise
            except Exception as e:  # the message's tensor is left in flight: the group breaks
                raise DistributedError(f"{self.what}: the message's tensor could not be received ({e}); it is left "
                                       "in flight, so the group is unusable now: shutdown()") from e
            finally:
                self.started = True

    def advanced(self, timeout: float) -> bool:
        """Wait (up to ``timeout``) for the header and start the tensor's receive; whether it did."""
        if not self.started:
            if not self.head.wait(timeout):
                return False
            self._advance()
        return True

    def test(self) -> bool:
        if not self.started:
            if not self.head.test():
                return False
            self._advance()
        return self.body is None or self.body.test()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        if not self.advanced(timeout):
            return False
        return self.body is None or self.body.wait(max(0.0, deadline - time.monotonic()))

    def result(self) -> Any:
        return None if self.body is None else self.body.result()


# -- the calls ------------------------------------------------------------------------------------
def send(x: Any, dst: int, *, tag: int = 0, async_op: bool = False) -> Work | None:
    """Send tensor ``x`` to rank ``dst``, which calls :func:`recv` with this rank as ``src``.

    Returns None once the engine has sent it (see the module's note on when that waits for the
    receiver), or with ``async_op=True`` a :class:`Work` at once (its ``wait()`` returns None);
    ``x`` must not be written until then. ``tag`` (0..2**31-1) travels with the message and the
    receiver checks it. Messages between two ranks arrive in the order they were sent. This rank's
    own errors (a ``dst`` that is no other rank, a structure, a dtype the group cannot carry) raise
    here; all but a bad ``dst`` also reach the receiver, whose ``recv`` raises DistributedError
    naming them. CapabilityError on engines without point-to-point messages."""
    g = current()
    what = "distributed.send"
    _peer(dst, g, what, "dst")
    _tag(tag, what)
    _engine_sends(g, what)
    refused: MultidevError | None = None
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    tkind = name = None
    try:
        with translate_errors(what):
            b = backend_of(x)
            dtype = b.dtype_of(x)
            shape = tuple(b.shape_of(x))
            if len(shape) > MAX_DIMS:
                raise CollectiveInputError(f"{what}: at most {MAX_DIMS} dimensions, got a {len(shape)}-d tensor")
            tb, tdev = transport_backend(g, b.device_of(x), b)
            allowed = g.engine.dtypes()
            if (allowed is not None and dtype not in allowed) or dtype not in tb.capabilities.dtypes_on(tdev):
                raise CapabilityError(f"{what}: the {g.info.engine} engine cannot carry {dtype} tensors here")
            if tb is b:  # (the engine's own tensor: what its prepare would refuse, refused in the header)
                g.engine.admit(x)
            tkind, name = tdev.kind, b.name
    except UnsupportedTensorError as e:
        refused = CollectiveInputError(f"{what} sends one tensor (a structure: send each of its tensors): {e}")
    except MultidevError as e:
        refused = e
    count = g.pairs.get((g.rank, dst), 0)
    row = _header(count, tag, None if refused is not None else dtype, () if refused is not None else shape,
                  None if refused is not None else tkind, None if refused is None else type(refused).__name__, name)
    g.pairs[(g.rank, dst)] = count + 1

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        head = _host_row(g, row)
        h = g.engine.send(head, dst)
        if refused is not None or _numel(shape) == 0:
            return h, holding(lambda res: None, head)
        t = to_transport(x, g)[0]
        return _Both(h, g.engine.send(t, dst)), holding(lambda res: None, head, t)

    w = _start(g, f"{what} to rank {dst}", dst, start)
    if refused is not None:
        w.wait()  # the receiver learns of the refusal; then this rank's own error
        raise refused
    return w if async_op else w.wait()


def recv(src: int, *, out: Any = None, tag: int = 0, backend: str | None = None, device: DeviceLike | None = None,
         async_op: bool = False) -> Any:
    """The next tensor rank ``src`` sends to this rank (:func:`send`).

    A new tensor of ``backend`` (default: the sender's; the default backend where only ``device``
    is given) on ``device`` (default: the current default device, ``multidev.device_scope``'s or
    cpu:0), with the sender's shape and dtype; or, with
    ``out``, written into ``out`` (a writable tensor of that shape and dtype), which is returned.
    ``tag`` must equal the sender's. With ``async_op=True`` a :class:`Work` at once, whose
    ``wait()`` gives the tensor. A message that does not fit ``out`` or carries another tag is taken
    and dropped (``out`` untouched) and CollectiveMismatchError names both sides; a sender that
    refused its own tensor gives DistributedError naming its error; the group stays usable after
    both. This rank's own argument errors raise before anything is received (the message stays for
    the next ``recv`` from ``src``)."""
    g = current()
    what = "distributed.recv"
    _peer(src, g, what, "src")
    _tag(tag, what)
    ob = None
    if out is not None:
        if backend is not None or device is not None:
            raise InvalidArgumentError(f"{what}: out= decides the backend and device; leave backend= and device= "
                                       "unset")
        try:
            ob = backend_of(out)
        except UnsupportedTensorError as e:
            raise CollectiveInputError(f"{what}: out must be a tensor: {e}") from None
        check_writable(ob, out, f"{what}(out=...)")
    named = get_backend(backend) if backend is not None or device is not None else None
    dev = resolve(named, device) if named is not None else None  # checked before anything is received
    _engine_sends(g, what)
    # a receive from src still waiting for its header: it takes its tensor first (messages from one
    # rank match the receives in the order they are posted)
    earlier = g.receiving.get(src)
    if earlier is not None and not earlier.advanced(g.timeout):
        raise DistributedTimeoutError(f"{what} on rank {g.rank}: an earlier receive from rank {src} got nothing within "
                                      f"{g.timeout:g} s")
    count = g.pairs.get((src, g.rank), 0)
    g.pairs[(src, g.rank)] = count + 1
    buf = _row_buffer(g)
    side = f"rank {g.rank}"
    landed: dict[str, Any] = {}

    def body(raw: Any) -> Handle | None:
        h = _read(np.asarray(backend_of(raw).to_numpy(raw)))
        landed["head"] = h
        if h["refused"] is not None:
            landed["error"] = DistributedError(
                f"{what} on {side}: rank {src} refused its own tensor ({h['refused']}; its error says why), so no "
                "tensor came. The group stays usable.")
            return None
        shape, dtype = h["shape"], h["dtype"]
        problems = []
        if h["count"] != count:
            problems.append(f"message #{h['count']} from rank {src} arrived where #{count} was expected")
        if h["tag"] != tag:
            problems.append(f"rank {src} sent tag {h['tag']}, this rank expects tag {tag}")
        if ob is not None and (tuple(ob.shape_of(out)) != shape or ob.dtype_of(out) != dtype):
            problems.append(f"rank {src} sent a {dtype} tensor of shape {shape}; out is {ob.dtype_of(out)} of shape "
                            f"{tuple(ob.shape_of(out))}")
        tb, tdev = transport_backend(g, Device(h["tkind"] or "cpu", 0))
        if problems or ob is None:
            if problems:
                kept = "out is untouched" if ob is not None else "nothing returned"
                landed["error"] = CollectiveMismatchError(
                    f"{what} on {side}: {'; '.join(problems)}. The message was taken and dropped ({kept}); the "
                    "group stays usable.")
            like = g.engine.prepare(tb.empty(shape, dtype, tdev))[0]
            landed["into"] = None
        else:
            t, origin, shared, through = working(out, g, True)
            like, landed["into"] = t, (t, origin, shared, through)
        landed["like"] = like
        return None if _numel(shape) == 0 else g.engine.recv(like, src)

    def finish(res: Any) -> Any:
        if "error" in landed:
            raise Kept(landed["error"])
        h = landed["head"]
        got = landed["like"] if res is None else res  # an empty tensor: nothing travelled
        if landed["into"] is not None:
            t, origin, shared, through = landed["into"]
            if shared and through and got is t:
                return out
            origin.backend.assign(out, from_transport(got, origin))
            return out
        b = named
        if b is None:  # the sender's backend where this process has it, else the default backend
            try:
                b = get_backend(h["backend"]) if h["backend"] in registered_backends() else None
            except MultidevError:
                b = None
            b = b or get_backend(None)
        at = resolve(b, dev)
        tb = backend_of(got)
        return from_transport(got, Origin(b, at, h["dtype"], b is tb))

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        h = _Then(g.engine.recv(buf, src), body, f"{what} from rank {src} on rank {g.rank}")
        g.receiving[src] = h
        return h, holding(finish, buf)

    w = _start(g, f"{what} from rank {src}", src, start)
    return w if async_op else w.wait()


class _Peer(Handle):
    """A message in flight, whose timeout names the peer it waited for."""

    def __init__(self, h: Handle, what: str, peer: int, timeout: float) -> None:
        self.h, self.what, self.peer, self.timeout = h, what, peer, timeout

    def _named(self, e: DistributedTimeoutError) -> DistributedTimeoutError:
        return DistributedTimeoutError(f"{self.what}: rank {self.peer} did not take part within {self.timeout:g} s "
                                       f"(dead, hung, or busy elsewhere): {e}. The group is unusable now: "
                                       "shutdown(), and restart the job")

    def test(self) -> bool:
        try:
            return self.h.test()
        except DistributedTimeoutError as e:
            raise self._named(e) from e

    def wait(self, timeout: float) -> bool:
        try:
            done = self.h.wait(timeout)
        except DistributedTimeoutError as e:
            raise self._named(e) from e
        if not done:
            raise self._named(DistributedTimeoutError("the message did not complete"))
        return True

    def result(self) -> Any:
        return self.h.result()


def _start(g: Group, what: str, peer: int, start: Callable[[], tuple[Handle, Callable[[Any], Any]]]) -> Work:
    """Start a message; a failure to start it breaks the group (a message may be half sent)."""
    try:
        h, finish = start()
    except MultidevError as e:
        g.fail(f"{what} could not start on rank {g.rank}: {e}")
        raise
    full = f"{what} on rank {g.rank}"
    return Work(_Peer(h, full, peer, g.timeout), finish, full, g, probe=False)
