"""The consistency protocol: before a collective, every rank's record of the call is exchanged
(:meth:`Engine.exchange`), so ranks that disagree raise :class:`CollectiveMismatchError` on every
rank, naming what each passed, instead of an abort or silently wrong values in the engine.

A record holds which collective, its op, root and axis, the tensor's dtype and shape, the kind of
device it travels on, for a structure of tensors its leaf count and signature (a digest of every
leaf's dtype, shape and device: :meth:`multidev.structured.Leaves.signature`; one record for the
whole structure), a call counter, and, for a rank that refused its own input (``mean`` of integers,
a read-only tensor for ``inplace=True``, a bad ``src``), the class of its error: every other rank
then raises DistributedError naming it, and nothing is sent, so the group stays usable.

The exchange is one small all-to-all of integer rows per call, through the group's channel: a
shared-memory mailbox where every rank runs on one host (:mod:`.mailbox`), else the engine's.
Checked calls (the default), every gather (they need every rank's length), every scatter (the
tensor's shape and dtype travel from ``src`` in it) and every barrier (the exchange is the
barrier) make it; ``init(check=False)`` skips it for the rest.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from .._device import KINDS
from ..errors import CollectiveMismatchError, DistributedError, MultidevError, translate_errors
from .engine import missing_ranks_error
from .group import Group, current
from .handles import Work
from .hangs import classify_lost

__all__ = ["MAX_DIMS", "Ahead", "Call", "agree", "ahead", "set_checks"]

KINDS_OF_CALL = ("allreduce", "broadcast", "reduce", "allgather", "gather", "reduce_scatter", "scatter", "barrier",
                 "set_checks", "along", "batch")
#: Calls that exchange whatever the group's check setting: the gathers need every rank's length, a
#: scatter carries src's shape and dtype, the exchange is the barrier, a setting must agree, a
#: collective along process-mesh axes carries each rank's length along its gathered axis.
ALWAYS = ("allgather", "gather", "scatter", "barrier", "set_checks", "along")
_OP_CODES = ("sum", "max", "min", "prod", "mean")
_DTYPE_NAMES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64",
                "complex64", "complex128", "uint16", "uint32", "uint64")
_REFUSALS = ("MultidevError", "CollectiveInputError", "CapabilityError", "UnsupportedTensorError",
             "InvalidDtypeError", "InvalidArgumentError", "DeviceMismatchError", "DeviceNotFoundError",
             "DistributedError", "BackendError", "OutOfMemoryError", "BackendNotAvailableError")
#: Dimensions a consistency record holds (a tensor with more is refused on every rank).
MAX_DIMS = 32
_NAME_WORDS = 4  # a backend name of up to 32 bytes, for scatter's default backend on the other ranks
_NONE = -(1 << 62)  # an absent root or axis in a record (a given axis may be negative)
_HEAD = 11
#: What each collective's ranks must agree on (besides the collective itself and the call count).
#: ``leaves`` first: one tensor against a structure is named as such. A structure's gather carries
#: its leaves' lengths along the axis in ``shape`` (which then differs by rank: ``rest`` is None).
_AGREE: dict[str, tuple[str, ...]] = {
    "allreduce": ("leaves", "op", "dtype", "shape", "tkind", "sig"),
    "broadcast": ("leaves", "root", "dtype", "shape", "tkind", "sig"),
    "reduce": ("leaves", "root", "op", "dtype", "shape", "tkind", "sig"),
    "allgather": ("leaves", "axis", "dtype", "rest", "tkind", "sig"),
    "gather": ("leaves", "root", "axis", "dtype", "rest", "tkind", "sig"),
    "reduce_scatter": ("leaves", "op", "axis", "dtype", "shape", "tkind", "sig"),
    "scatter": ("leaves", "root", "axis", "sig"), "barrier": (), "set_checks": ("root",),
    # (mesh.py's collectives along axes: ``sig`` a digest of the call's record, ``shape`` a length)
    "along": ("sig",),
    # (a data-parallel step of one program over every rank, data_parallel.py: its batch's tensors)
    "batch": ("leaves", "sig")}


_ROWS: dict[Call, list[int]] = {}  # a record (its call count 0) -> its row after the count (Call.encode)


def _with_seq(call: Call, seq: int) -> Call:
    """``dataclasses.replace(call, seq=seq)`` in a fraction of its time (a hot path: every checked call)."""
    out = object.__new__(Call)
    vars(out).update(vars(call), seq=seq)
    return out


def _pick(names: Sequence[str], i: int) -> str | None:
    return names[i] if 0 <= i < len(names) else None


def _encode_name(name: str | None) -> list[int]:
    raw = (name or "").encode()[: 8 * _NAME_WORDS].ljust(8 * _NAME_WORDS, b"\0")
    return [int.from_bytes(raw[i:i + 8], "little", signed=True) for i in range(0, len(raw), 8)]


def _decode_name(words: Sequence[int]) -> str | None:
    raw = b"".join(int(w).to_bytes(8, "little", signed=True) for w in words).rstrip(b"\0")
    return raw.decode(errors="replace") or None


@dataclass(frozen=True)
class Call:
    """One rank's record of a collective call, as the exchange carries it."""

    kind: str
    op: str | None = None
    root: int | None = None
    axis: int | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    tkind: str | None = None  # the kind of device the tensor travels on (engine.transport_for)
    backend: str | None = None  # the tensor's backend (scatter's src: the other ranks' default)
    seq: int = 0
    refused: str | None = None  # the error class name of a rank that refused its own input
    leaves: int | None = None  # a structure's tensor count (None: one tensor)
    sig: int | None = None  # a structure's signature (62 bits: its leaves' dtypes, shapes, devices)

    def encode(self, seq: int | None = None) -> list[int]:
        """The record as a row of integers (``seq`` in place of :attr:`seq` where given). The rows
        of a record other than its call count are kept (up to 256 records), so a collective called
        again with the same arguments encodes in one dictionary lookup."""
        tail = vars(self).get("_tail")  # (a record made once and used again: collectives._record)
        if tail is None:
            key = self if self.seq == 0 else _with_seq(self, 0)
            tail = _ROWS.get(key)
            if tail is None:
                tail = key._encode()[1:]
                if len(_ROWS) < 256:
                    _ROWS[key] = tail
            object.__setattr__(self, "_tail", tail)  # (not a field: equality, hashing and repr ignore it)
        return [self.seq if seq is None else seq, *tail]

    def _encode(self) -> list[int]:
        shape = self.shape or ()
        row = [self.seq, KINDS_OF_CALL.index(self.kind), _OP_CODES.index(self.op) if self.op else -1,
               _NONE if self.root is None else self.root, _NONE if self.axis is None else self.axis,
               _DTYPE_NAMES.index(self.dtype) if self.dtype in _DTYPE_NAMES else -1,
               -1 if self.shape is None else len(shape),
               -1 if self.refused is None else _REFUSALS.index(self.refused),
               KINDS.index(self.tkind) if self.tkind in KINDS else -1,
               -1 if self.leaves is None else self.leaves, -1 if self.sig is None else self.sig]
        return row + _encode_name(self.backend) + list(shape) + [-1] * (MAX_DIMS - len(shape))

    @staticmethod
    def decode(row: Sequence[int]) -> Call:
        ndim = row[6]
        shape_at = _HEAD + _NAME_WORDS
        return Call(kind=_pick(KINDS_OF_CALL, row[1]) or "?", op=_pick(_OP_CODES, row[2]),
                    root=None if row[3] == _NONE else row[3], axis=None if row[4] == _NONE else row[4],
                    dtype=_pick(_DTYPE_NAMES, row[5]),
                    shape=None if ndim < 0 else tuple(row[shape_at:shape_at + ndim]),
                    tkind=_pick(KINDS, row[8]), backend=_decode_name(row[_HEAD:shape_at]), seq=row[0],
                    refused=_pick(_REFUSALS, row[7]), leaves=None if row[9] < 0 else row[9],
                    sig=None if row[10] < 0 else row[10])

    def field(self, name: str) -> Any:
        if name == "rest":
            if self.leaves is not None:  # a structure: its shapes are in sig, its lengths in shape
                return None
            if self.shape is None or self.axis is None or not 0 <= self.axis < len(self.shape):
                return self.shape
            return (len(self.shape), self.shape[:self.axis] + self.shape[self.axis + 1:])
        return getattr(self, name)


def _describe(name: str, value: Any) -> str:
    if name == "leaves":
        return "one tensor" if value is None else f"a structure of {value} tensors"
    if name == "sig":
        return "-" if value is None else f"{value:016x}"
    if name == "rest" and isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple):
        return f"{value[0]}-d, other dims {value[1]}"
    return str(value)


class PeerFailure(Exception):
    """An error that comes from the other ranks (a mismatch, a refusal, a missing peer): raised by
    the collective, or handed to a failed Work when it was called with ``async_op=True``."""

    def __init__(self, error: DistributedError) -> None:
        super().__init__(str(error))
        self.error = error


def agree(g: Group, kind: str, local: Callable[[], Call], async_op: bool = False,
          meanwhile: Callable[[], object] | None = None) -> list[Call] | Work | None:
    """Run ``local`` (this rank's own argument checks, giving its record of the call), then, when
    the group checks consistency (always for :data:`ALWAYS`), exchange the records and fail on
    every rank alike if any rank refused its input (DistributedError; that rank raises its own
    error) or the ranks disagree (CollectiveMismatchError). Returns every rank's record (None
    when unchecked).

    A collective of one tensor makes its transport tensor in ``local`` too, so that a tensor the
    engine cannot carry (a sparse one, say) is this rank's refusal, seen by every rank, not a
    failure after the ranks agreed, which breaks the group; where the engine admits the tensor
    without making it (:meth:`Engine.admit`), ``local`` leaves the making to ``meanwhile``, run
    while the records travel (between :meth:`Engine.post` and the exchange) when this rank's
    checks passed; its error is swallowed here (the caller makes it again, after the exchange,
    where it raises: only an allocation can fail there).

    Where every rank's record equals this rank's (the common case), each entry of the list is
    this rank's record as ``local`` made it: its :attr:`Call.seq` may be an earlier call's.

    This rank's own argument errors raise at once. Errors that come from the other ranks raise
    here, or with ``async_op`` come back as a failed :class:`Work` whose ``wait()`` raises them, as
    the collective's own errors would."""
    try:
        opened = _open(g, kind, local)
        if opened is None:
            return None
        call, row, err, seq = opened
        if meanwhile is not None and err is None:
            _post(g, kind, seq, row)
            try:
                meanwhile()
            except Exception:  # noqa: BLE001 - the caller's own step raises it again, after the exchange
                pass
        return _close(g, kind, call, row, err, seq)
    except PeerFailure as f:
        if async_op:
            return Work.failed(f.error, f"distributed.{kind}", g)
        raise f.error from f.error.__cause__


def agree_made(g: Group, kind: str, call: Call) -> None:
    """:func:`agree` of a call whose record ``call`` is made and whose checks passed on this rank (a
    collective's short path), where the group checks and no record was sent ahead: the records
    exchanged and compared, without agree's layers. Raises what :func:`agree` raises."""
    seq = g.seq
    g.seq = seq + 1
    try:
        _close(g, kind, call, call.encode(seq), None, seq)
    except PeerFailure as f:
        raise f.error from f.error.__cause__


def unchecked(g: Group, kind: str) -> bool:
    """Whether call ``kind`` goes unchecked now (the checks off, not a kind of :data:`ALWAYS`, no
    record sent ahead to settle first): then the call may run its checks with :func:`checked_here`
    instead of :func:`agree`, which would exchange nothing (a small unchecked call's own Python)."""
    return not g.check and kind not in ALWAYS and getattr(g, "ahead", None) is None


def checked_here(checks: Callable[[], object], what: str) -> None:
    """This rank's argument ``checks`` of an :func:`unchecked` call, their errors raised at once as
    :func:`agree` raises them (framework errors translated)."""
    try:
        checks()
    except Exception as e:  # noqa: BLE001 - as translate_errors' exit would (without entering it: a hot path)
        translate_errors(what).reraise(e)


class Ahead:
    """A call's record sent ahead of the call (:func:`ahead`): :meth:`settle` completes the
    exchange, where the call runs. Until then the group's next checked call settles it first, so
    records are always exchanged in the order they were made."""

    def __init__(self, g: Group, kind: str, call: Call, row: list[int], err: MultidevError | None,
                 seq: int) -> None:
        self.g, self.kind, self.call, self.row, self.err, self.seq = g, kind, call, row, err, seq
        self.rows: list[Call] | None = None
        self.failure: PeerFailure | None = None
        self.done = False

    def settle(self) -> list[Call]:
        """Every rank's record of the call (exchanged now, or already by a call in between);
        raises what :func:`agree` raises, as PeerFailure for errors from the other ranks."""
        if not self.done:
            self.done = True
            if getattr(self.g, "ahead", None) is self:
                self.g.ahead = None
            try:
                self.rows = _close(self.g, self.kind, self.call, self.row, self.err, self.seq)
            except PeerFailure as f:
                self.failure = f
                raise
        if self.failure is not None:
            raise self.failure
        assert self.rows is not None
        return self.rows

    def wait(self) -> list[Call]:
        """:meth:`settle`, raising the errors that come from the other ranks as :func:`agree` does."""
        try:
            return self.settle()
        except PeerFailure as f:
            raise f.error from f.error.__cause__


def ahead(g: Group, kind: str, local: Callable[[], Call]) -> Ahead | None:
    """Send this rank's record of a call that comes later (:meth:`Engine.post`) and return what
    settles it (:meth:`Ahead.settle`, where the call runs), so the round trip overlaps the work in
    between; None where the group does not check this call. This rank's own argument error, and
    an engine that cannot send ahead, make the whole exchange now (an error raises here)."""
    try:
        opened = _open(g, kind, local)
        if opened is None:
            return None
        call, row, err, seq = opened
        if err is None:
            _post(g, kind, seq, row)
            g.ahead = sent = Ahead(g, kind, call, row, err, seq)
            return sent
        _close(g, kind, call, row, err, seq)  # (raises err, or what came from the other ranks)
    except PeerFailure as f:
        raise f.error from f.error.__cause__
    return None  # (settle raised this rank's own error)


def _post(g: Group, kind: str, seq: int, row: list[int]) -> None:
    """This rank's ``row`` of call ``seq`` sent ahead (:meth:`Engine.post`); an engine error is
    classified, the group marked unusable, as an exchange's."""
    try:
        (g.channel or g.engine).post(seq, row)
    except Exception as e:  # noqa: BLE001 - classified, the group marked unusable, and raised
        fail = classify_lost(e, f"distributed.{kind} (call #{seq}, consistency exchange) on rank {g.rank}", g)
        g.fail(str(fail))
        raise PeerFailure(fail) from None


def _open(g: Group, kind: str, local: Callable[[], Call]) -> tuple[Call, list[int], MultidevError | None, int] | None:
    """This rank's record of the call, its row, its own error and its number (None when the call
    goes unchecked): a record sent ahead by an earlier call settles first, so the ranks exchange
    records in one order."""
    pending = getattr(g, "ahead", None)
    if pending is not None:
        pending.settle()
    err: MultidevError | None = None
    try:
        try:
            call = local()
        except Exception as e:  # noqa: BLE001 - as translate_errors' exit would (without entering it: a hot path)
            translate_errors(f"distributed.{kind}").reraise(e)
    except MultidevError as e:  # reported to the other ranks, then raised here
        err = e
        name = type(e).__name__
        call = Call(kind, refused=name if name in _REFUSALS else "MultidevError")
    if not g.check and kind not in ALWAYS:
        if err is not None:
            raise err
        return None
    seq = g.seq
    g.seq += 1
    return call, call.encode(seq), err, seq


def _close(g: Group, kind: str, call: Call, row: list[int], err: MultidevError | None, seq: int) -> list[Call]:
    try:
        rows = (g.channel or g.engine).exchange(seq, row, g.timeout)
    except Exception as e:  # noqa: BLE001 - classified, the group marked unusable, and raised
        fail = classify_lost(e, f"distributed.{kind} (call #{seq}, consistency exchange) on rank {g.rank}", g)
        g.fail(str(fail))
        raise PeerFailure(fail) from None
    if err is not None:
        if any(r is None for r in rows):
            _missing(g, kind, rows, seq)
        raise err
    for r in rows:  # the common case: every rank's record is this rank's (the mailbox hands back `row`)
        if r is not row and r != row:
            break
    else:
        return [call] * len(rows)
    if any(r is None for r in rows):
        _missing(g, kind, rows, seq)
    what = f"distributed.{kind}"
    calls = [Call.decode(row) for row in rows if row is not None]
    problem = _disagreement(calls, kind, what, g.rank)
    if problem is not None:
        raise PeerFailure(problem)
    return calls


def _missing(g: Group, kind: str, rows: list[list[int] | None], seq: int) -> NoReturn:
    what = f"distributed.{kind}"
    fail = missing_ranks_error(f"{what} on rank {g.rank}", rows, g.timeout, f"{what} (call #{seq})")
    g.fail(str(fail))
    raise PeerFailure(fail)


def set_checks(enabled: bool) -> None:
    """Turn the consistency checks on or off for the rest of the group's life. A collective: every
    rank must call it with the same value, which it verifies (DistributedError on every rank
    otherwise). Off, mismatched calls are the engine's undefined behaviour."""
    if not isinstance(enabled, bool):
        raise DistributedError(f"set_checks takes True or False, got {enabled!r:.40}")
    g = current()
    agree(g, "set_checks", lambda: Call("set_checks", root=int(enabled)))
    g.check = enabled


def _disagreement(calls: list[Call], kind: str, what: str, rank: int) -> DistributedError | None:
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
            label = {"rest": "shape (every dimension but axis)", "tkind": "the kind of device the tensors travel on",
                     "leaves": "what they pass (one tensor, or a structure and its tensor count)" + (
                         "; a structure's scatter needs a structure like src's on every rank (the same "
                         "tensors: its containers cannot travel), not None" if kind == "scatter" else ""),
                     "sig": "the structure's tensors (their dtypes, shapes or devices differ; signatures)",
                     "root": "root (src/dst)" if kind != "set_checks" else "the setting"}.get(name, name)
            who = ", ".join(f"rank {r}: {_describe(name, v)}" for r, v in enumerate(values))
            return CollectiveMismatchError(f"{what} on rank {rank}: the ranks disagree on {label} ({who}). {tail}")
    return None
