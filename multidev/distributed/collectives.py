"""The collectives across processes, written once over the engine interface.

Each call: this rank's argument checks (they give its record of the call), the consistency
exchange (:mod:`.consistency`), then the engine's primitive on transport tensors
(:mod:`.transport`), its result turned back into a tensor of the input's backend, on its device.
What the engines do not do is done here, the same for all of them: ``mean`` (a sum and one
division), uneven pieces (padded to equal blocks, cut back after), ``inplace=True`` (written
through shared memory, or assigned), ``async_op`` (a :class:`Work`), structures of tensors
(every collective: the tensor collective leaf by leaf, one consistency exchange for the whole
structure, its tensors flattened into buckets of one dtype and device, the same plan on every rank,
one primitive per bucket; a gather's uneven lengths travel in the exchange, or for more than
MAX_DIMS leaves in one more small allgather).
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._device import Device, DeviceLike
from ..buckets import DEFAULT_BUCKET_MB, flatten, numel, plan_buckets, unflatten
from ..collectives import split_sizes
from ..dtypes import ITEMSIZE
from ..errors import CapabilityError, CollectiveInputError, MultidevError, translate_errors
from ..placement import resolve
from ..protocol import Backend
from ..registry import backend_of, cached_owner, get_backend, registry_generation
from ..structured import Leaves, rebuild, structure_leaves
from ..trees import owner_or_structure
from ..validate import OPS, check_axis, check_op, check_writable
from .consistency import ALWAYS, KINDS_OF_CALL, MAX_DIMS, Call, agree, agree_made, checked_here, unchecked
from .engine import Engine, Handle
from .group import Group, current
from .handles import Work, run
from .transport import Origin, Placement, from_transport, to_transport, transport_backend

__all__ = ["allgather", "allreduce", "barrier", "broadcast", "carries", "gather", "reduce", "reduce_scatter",
           "scatter"]

_HOST = Device("cpu", 0)


# -- this rank's checks ------------------------------------------------------------------------------
_CALL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Call)}
_BARE = {kind: Call(kind) for kind in KINDS_OF_CALL}
_RECORDS: dict[tuple[Any, ...], Call] = {}  # (kind, *arguments) -> this rank's record of such a call


def _record(g: Group, kind: str, **given: Any) -> Call:
    """This rank's record of a call: ``Call(kind, **given)``, built without the frozen dataclass's
    ``__init__`` (one ``object.__setattr__`` per field, a sixth of an unchecked allreduce's own
    time); a bare ``Call(kind)`` where :func:`agree` sends none (an unchecked call of a kind not
    in :data:`ALWAYS`), which it then never reads."""
    if not g.check and kind not in ALWAYS:
        return _BARE[kind]
    key = (kind, *given, *given.values())  # (flat: no pair made per argument)
    call = _RECORDS.get(key)
    if call is None:  # (records are frozen: one made for these arguments serves every call with them)
        call = object.__new__(Call)
        fields = vars(call)
        fields.update(_CALL_DEFAULTS)
        fields.update(given, kind=kind)
        if len(_RECORDS) < 256:
            _RECORDS[key] = call
    return call


def _agreed(g: Group, kind: str, local: Callable[[], Call], async_op: bool,
            made: list[Any] | dict[str, Any] | None,
            meanwhile: Callable[[], object] | None = None) -> list[Call] | Work | None:
    """:func:`agree` of a call whose ``local`` (or ``meanwhile``: :func:`agree`'s) also made what it
    sends (into ``made``): that is dropped where the call raises, so an exception kept by the caller
    keeps no copy of the tensors."""
    try:
        return agree(g, kind, local, async_op, meanwhile)
    except BaseException:
        if made is not None:
            made.clear()
        raise


def _shape(b: Backend, x: Any, what: str) -> tuple[int, ...]:
    shape = b.shape_of(x)
    if len(shape) > MAX_DIMS:
        raise CollectiveInputError(f"{what}: at most {MAX_DIMS} dimensions, got a {len(shape)}-d tensor")
    return shape


def carried_kind(g: Group, b: Backend, x: Any, dtype: str, what: str) -> str:
    """The kind of device x travels on; CapabilityError (naming the engine) for a dtype the group
    cannot carry."""
    return _placement(g, b, x, dtype, what)[3].kind


def _placement(g: Group, b: Backend, x: Any, dtype: str, what: str) -> Placement:
    """Where x travels (what :func:`working` takes, so a call finds it once); CapabilityError
    (naming the engine) for a dtype the group cannot carry. Kept by the group (:attr:`Group.placements`)."""
    dev = b.device_of(x)
    key = (b, dev, dtype)
    hit = g.placements.get(key)
    # (valid while the registry and the transport backend's capabilities are those it was found with:
    # JAX's change with jax_enable_x64, an adapter loaded may change the engine's transport; an
    # engine's dtypes() are its own for the group's life, as Engine.dtypes says)
    if hit is not None and hit[1] == registry_generation() and (
            hit[0][2].capabilities is hit[2] or hit[0][2].capabilities == hit[2]):
        return hit[0]
    generation = registry_generation()
    tb, tdev = transport_backend(g, dev, b)
    allowed = g.engine.dtypes()
    if allowed is not None and dtype not in allowed:
        raise CapabilityError(f"{what}: the {g.info.engine} engine cannot carry {dtype} tensors "
                              f"(it carries {', '.join(sorted(allowed))})")
    caps = tb.capabilities  # (read once: what is checked is what the kept answer is tied to)
    if dtype not in caps.dtypes_on(tdev):
        try:
            with translate_errors(what):
                tb.to_native_dtype(dtype)
        except CapabilityError as e:
            raise CapabilityError(f"{what}: the {g.info.engine} engine moves {tb.name} tensors, which cannot hold "
                                  f"{dtype} here: {e}") from None
        raise CapabilityError(f"{what}: the {g.info.engine} engine moves {tb.name} tensors, which cannot hold {dtype} "
                              f"on {tdev}")
    if len(g.placements) < 256 or key in g.placements:
        g.placements[key] = ((b, dev, tb, tdev), generation, caps)
    return b, dev, tb, tdev


def carries(dtype: str, device: DeviceLike | None = None, *, backend: str | None = None) -> bool:
    """Whether the current group can carry ``dtype`` tensors of ``backend`` (default: the default
    backend) on ``device`` (default: cpu:0): the collectives raise CapabilityError naming the engine
    otherwise (the JAX engine without ``jax_enable_x64`` has no 64-bit dtypes, say)."""
    g = current()
    b = get_backend(backend)
    dev = _HOST if device is None else resolve(b, device)
    tb, tdev = transport_backend(g, dev, b)
    allowed = g.engine.dtypes()
    return (allowed is None or dtype in allowed) and dtype in tb.capabilities.dtypes_on(tdev)


def _probe(b: Backend, x: Any) -> Any:
    """What the writability probe writes into: x's first row (``split`` gives views, which keep x's
    read-only or inference status), so that the probe of a large tensor costs one row, not two
    passes over it; x itself where it has no rows to spare (0-d, one row)."""
    shape = b.shape_of(x)
    if len(shape) == 0 or shape[0] <= 1:
        return x
    return b.split(x, [1, shape[0] - 1], 0)[0]


def _check_inplace(b: Backend, x: Any, what: str) -> None:
    """:func:`~multidev.validate.check_writable` for ``inplace=True``: passed at once where the
    adapter's flag says ``x`` is writable (so is every view of it), else the probe of
    :func:`_probe`'s row (what an immutable backend, a read-only or inference tensor meets)."""
    known = b.writable(x) if b.capabilities.mutable and hasattr(b, "writable") else None
    if known is True:
        return
    check_writable(b, x if known is False else _probe(b, x), f"{what}(inplace=True)")  # (False: refused there)


def _is_tree(x: Any) -> bool:
    """Whether ``x`` is a structure (a container or a framework's tree), not a tensor. Never
    raises: what is neither is the tensor path's to refuse, inside the exchange."""
    try:
        return owner_or_structure(x) is None
    except MultidevError:
        return False


def _tensor(x: Any, what: str) -> Backend:
    """The backend of tensor ``x`` (structures take their own path before this)."""
    return backend_of(x)


def _check_rank(r: Any, g: Group, what: str, name: str) -> int:
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < g.world_size:
        raise CollectiveInputError(f"{what}: {name}={r!r:.40} is not a rank of this world (0..{g.world_size - 1})")
    return r


# -- transport tensors -----------------------------------------------------------------------------
def _making(g: Group, x: Any, inplace: bool, placed: Placement, ready: list[Any], later: list[Any],
            exchanged: bool) -> None:
    """A one-tensor collective's checks: x's transport tensor (:func:`working`) made into ``ready``
    now, or, where the call's records are exchanged and x is the engine's own tensor on its device,
    which the engine admits (:meth:`Engine.admit`: it refuses here what it cannot carry), left to
    :func:`_made` (``placed`` into ``later``), which :func:`agree` runs while the records travel."""
    if exchanged and placed[0] is placed[2] and placed[1] == placed[3] and g.engine.admit(x):
        later.append(placed)
    else:
        ready.append(working(x, g, inplace, placed))


def _made(g: Group, x: Any, inplace: bool, ready: list[Any], later: list[Any]) -> Any:
    """``ready[0]``, x's transport tensor as :func:`working` gives it, made now where :func:`_making`
    left it to later."""
    if not ready:
        ready.append(working(x, g, inplace, later[0]))
    return ready[0]


def _writes_through(origin: Origin) -> bool:
    """Whether writing into memory shared through DLPack is a valid in-place update of the input:
    transport tensors, and synchronous mutable backends (NumPy). Asynchronous engines (MXNet) get an
    explicit ``assign`` so their dependency tracking sees the write."""
    caps = origin.backend.capabilities
    return origin.is_transport or (caps.mutable and not caps.async_execution)


def working(x: Any, g: Group, inplace: bool, placed: Placement | None = None,
            sent: tuple[Any, Origin, bool, str] | None = None) -> tuple[Any, Origin, bool, bool]:
    """The transport tensor a primitive may write into, ``(t, origin, shares x's memory, writes
    through)``: x's own memory only when ``inplace`` (the call is in place, or its primitive only
    reads: :meth:`Engine.allreduce_new`) and writes reach x; else a copy (none for engines that
    never write into their inputs). ``placed``: x's :func:`_placement`; ``sent``: x's
    :func:`to_transport`, where the call's checks made it."""
    t, origin, shared, _ = to_transport(x, g, placed) if sent is None else sent
    through = _writes_through(origin)
    t, shared = private(t, g, inplace, shared, through)
    return t, origin, shared, through


def private(t: Any, g: Group, inplace: bool, shared: bool, through: bool) -> tuple[Any, bool]:
    """``(t, shares x's memory)``: a copy of transport tensor ``t`` where the engine may write into
    it and the caller's memory must not change (:func:`working`'s rule), else ``t``."""
    if shared and g.engine.writes_inputs and not (inplace and through):
        tb = backend_of(t)
        t, _ = g.engine.prepare(tb.copy(t, tb.device_of(t)))
        shared = False
    return t, shared


def _landing(res: Any, t: Any, origin: Origin, x: Any, inplace: bool, shared: bool,
             through: bool) -> tuple[Any, Any]:
    """(what the caller gets, the value still to write into ``x``: None when nothing is)."""
    if not inplace:
        return from_transport(res, origin), None
    if shared and through and res is t:
        return x, None  # the primitive wrote into x's own memory
    return x, from_transport(res, origin)


def landed(res: Any, t: Any, origin: Origin, x: Any, inplace: bool, shared: bool, through: bool) -> Any:
    """A primitive's result ``res`` as the caller gets it: a tensor of x's backend on x's device, or
    ``x`` itself written (``inplace``: through shared memory, or assigned)."""
    out, pending = _landing(res, t, origin, x, inplace, shared, through)
    if pending is not None:
        origin.backend.assign(x, pending)
    return out


def holding(finish: Callable[[Any], Any], *buffers: Any) -> Callable[[Any], Any]:
    """``finish`` keeping ``buffers`` (what a primitive in flight reads) alive until its result is
    taken: an engine's nonblocking call (MPI's) need not hold its send buffer itself, and a freed
    one is memory the next allocation reuses while the engine still reads it."""
    return lambda res: (buffers, finish(res))[1]


def mean_of(res: Any, op: str, n: int) -> Any:
    return backend_of(res).divide(res, n) if op == "mean" else res


def pad_to(t: Any, length: int, ax: int) -> Any:
    tb = backend_of(t)
    shape = tb.shape_of(t)
    if shape[ax] == length:
        return t
    extra = list(shape)
    extra[ax] = length - shape[ax]
    return tb.concat([t, tb.full(tuple(extra), 0, tb.dtype_of(t), tb.device_of(t))], ax)


def narrow(t: Any, ax: int, n: int) -> Any:
    tb = backend_of(t)
    m = tb.shape_of(t)[ax]
    return t if m == n else tb.split(t, [n, m - n], ax)[0]


def blocks_of(g: Group, t: Any, sizes: list[int], ax: int) -> Any:
    """``t`` cut along ``ax`` into ``sizes`` pieces, each padded to the first's length, stacked on a
    new leading axis: a contiguous ``(world_size, *piece)`` tensor."""
    tb = backend_of(t)
    m = sizes[0] if sizes else 0
    pieces = [pad_to(p, m, ax) for p in tb.split(t, sizes, ax)]
    one = tb.shape_of(pieces[0])
    return g.engine.prepare(tb.concat([tb.reshape(p, (1, *one)) for p in pieces], 0))[0]


# -- structures --------------------------------------------------------------------------------------
class _Many(Handle):
    """Several primitives in flight as one (a structure's buckets): finished when all are; its
    result is theirs, in order."""

    def __init__(self, handles: Sequence[Handle]) -> None:
        self.handles = list(handles)

    def test(self) -> bool:
        return all(h.test() for h in self.handles)

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        return all(h.wait(max(0.0, end - time.monotonic())) for h in self.handles)

    def result(self) -> list[Any]:
        return [h.result() for h in self.handles]


def _tree_agree(g: Group, kind: str, x: Any, op: str | None, root: int | None, inplace: bool,
                async_op: bool, axis: Any = None, refuse: str | None = None, sends: list[Any] | None = None,
                leafwise: bool = False) -> tuple[Leaves, list[int], list[Call] | None] | Work:
    """The one consistency exchange of a collective over structure ``x``: this rank's checks of
    every leaf (one backend, each dtype's op, what the group carries, writability for
    ``inplace``, ``axis`` for each leaf's rank), then its record: the leaf count and the signature
    of the leaves' dtypes, shapes (a gather's without the joined axis: its lengths travel in the
    record's shape, up to MAX_DIMS leaves) and devices (and the kind of device each travels on).
    ``refuse``: an argument error of this rank's, raised (and told to the others) in the exchange.
    ``sends``: a list that gets what this rank sends, made in its checks (a leaf the engine cannot
    carry is refused there, on every rank alike): its buckets as :func:`_buckets` prepares them for
    ``inplace``, or with ``leafwise`` each leaf's ``(transport tensor, origin)``.
    Returns ``(leaves, each leaf's axis, every rank's record)``, or a failed Work."""
    what = f"distributed.{kind}"
    gather = kind in ("allgather", "gather")
    mine: dict[str, Any] = {}  # this rank's leaves and axes, which local() finds for the code below

    def local() -> Call:
        if refuse is not None:
            raise CollectiveInputError(f"{what}: {refuse}")
        if root is not None:
            _check_rank(root, g, what, "dst" if kind in ("reduce", "gather") else "src")
        if kind in ("allreduce", "reduce", "reduce_scatter") and (not isinstance(op, str) or op not in OPS):
            # (checked without leaves too, as for one tensor)
            raise CollectiveInputError(f"{what}: unknown op {op!r:.40}; expected one of {', '.join(OPS)}")
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, int)
                                 or not -MAX_DIMS <= axis < MAX_DIMS):
            raise CollectiveInputError(f"{what}: axis must be an int in -{MAX_DIMS}..{MAX_DIMS - 1}, got {axis!r:.40}")
        lv = structure_leaves(x, what)
        axes = [] if axis is None else [check_axis(axis, len(s), f"{what}: tensor {j}")
                                        for j, s in enumerate(lv.shapes)]
        tkinds: list[str] = []
        if lv.backend is not None:
            b = lv.backend
            seen: dict[tuple[str, Device], str] = {}
            for t, dtype, dev in zip(lv.tensors, lv.dtypes, lv.devices):
                key = (dtype, dev)
                if key not in seen:
                    if op is not None:
                        check_op(op, dtype, what)
                    seen[key] = carried_kind(g, b, t, dtype, what)
                tkinds.append(seen[key])
                if inplace:
                    _check_inplace(b, t, what)
        mine.update(leaves=lv, axes=axes)
        one = set(tkinds)
        lengths = masked = None
        if gather:
            lengths = tuple(s[a] for s, a in zip(lv.shapes, axes))
            if len(lengths) > MAX_DIMS and any(n >= 2**31 for n in lengths):  # _tree_lengths sends int32
                raise CollectiveInputError(f"{what}: a structure of more than {MAX_DIMS} tensors joins lengths "
                                           "below 2**31 along the axis only; gather the longest tensor alone")
            masked = [s[:a] + (-1,) + s[a + 1:] for s, a in zip(lv.shapes, axes)]
        if sends is not None:
            sends.append([to_transport(t, g)[:2] for t in lv.tensors] if leafwise else _buckets(g, lv, inplace))
        return Call(kind, op=op, root=root, axis=axis, tkind=one.pop() if len(one) == 1 else None,
                    leaves=len(lv.tensors), sig=lv.signature(tkinds, shapes=masked),
                    shape=lengths if lengths is not None and len(lengths) <= MAX_DIMS else None)

    calls = _agreed(g, kind, local, async_op or False, sends)
    if isinstance(calls, Work):
        return calls
    return mine["leaves"], mine["axes"], calls


def _tree_lengths(g: Group, kind: str, lv: Leaves, axes: list[int], calls: list[Call] | None) -> list[tuple[int, ...]]:
    """Every rank's leaf lengths along the gather's axis: from the records, or, for a structure of
    more leaves than a record holds, one small allgather of them (synchronous, as the exchange)."""
    if calls is not None and all(c.shape is not None for c in calls):
        return [tuple(c.shape) for c in calls if c.shape is not None]
    mine = np.asarray([s[a] for s, a in zip(lv.shapes, axes)], dtype=np.int32)
    t, _, _, _ = to_transport(mine, g)

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        return g.engine.allgather(t), lambda parts: [tuple(int(v) for v in backend_of(p).to_numpy(p).reshape(-1))
                                                     for p in parts]
    return list(run(g, f"distributed.{kind} (the leaves' lengths)", start, False))


def _buckets(g: Group, lv: Leaves, inplace: bool) -> list[tuple[list[int], Any, Origin, bool, bool]]:
    """A structure's leaves in buckets (one dtype and device each, up to
    :data:`~multidev.buckets.DEFAULT_BUCKET_MB`), each as the transport tensor it travels as (a lone
    tensor as the one-tensor collective sends it; several flattened into a new one), with
    :func:`working`'s origin and flags: ``(the leaves' indices, t, origin, shared, through)``."""
    b = lv.backend
    xs = lv.tensors
    sent: list[tuple[list[int], Any, Origin, bool, bool]] = []
    if b is None:  # (a structure without tensors sends nothing)
        return sent
    for idx in plan_buckets(b, xs, DEFAULT_BUCKET_MB * 2**20):
        if len(idx) == 1:
            t, origin, shared, through = working(xs[idx[0]], g, inplace)
        else:  # a new tensor of ours: the primitive may write into it
            t, origin, shared, through = working(flatten(b, [xs[i] for i in idx]), g, True)
        sent.append((idx, t, origin, shared, through))
    return sent


def _tree_run(g: Group, kind: str, x: Any, lv: Leaves, inplace: bool, async_op: bool, sent: list[Any],
              primitive: Callable[[Any], Handle], post: Callable[[Any], Any], keep: bool = True) -> Any:
    """``primitive`` on each of structure ``x``'s buckets (``sent``: :func:`_buckets`' for it), then
    ``post`` on each result, cut back into the leaves: written into them (``inplace``, returning
    ``x``) or ``x`` rebuilt with them; None where this rank gets nothing (``keep`` False)."""
    what = f"distributed.{kind}"
    xs = lv.tensors

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        handles = [primitive(t) for _, t, _, _, _ in sent]

        def finish(results: Any) -> Any:
            # Every bucket converted back before the first write into x: a conversion that fails
            # leaves x as it was (where the transport did not write into x's memory itself).
            if not keep:
                return None
            out: list[Any] = [None] * len(xs)
            writes: list[tuple[Any, Any, Any]] = []
            for (idx, t, origin, shared, through), res in zip(sent, results):
                res = post(res)
                if len(idx) == 1:
                    i = idx[0]
                    out[i], pending = _landing(res, t, origin, xs[i], inplace, shared, through)
                    if pending is not None:
                        writes.append((origin.backend, xs[i], pending))
                    continue
                pieces = unflatten(origin.backend, from_transport(res, origin), [lv.shapes[i] for i in idx])
                for i, p in zip(idx, pieces):
                    if inplace:
                        writes.append((origin.backend, xs[i], p))
                    out[i] = xs[i] if inplace else p
            for backend, dst, value in writes:
                backend.assign(dst, value)
            return x if inplace else rebuild(x, lv, out, what)

        return _Many(handles), finish

    return run(g, what, start, async_op)


def _cut_run(g: Group, kind: str, x: Any, lv: Leaves, axes: list[int], sends: list[tuple[Any, Origin]] | None,
             primitive: Callable[[Any, Any], Handle], post: Callable[[Any], Any]) -> Callable[[], Any]:
    """The ``start`` of a reduce_scatter or scatter of structure ``x``: per bucket, each leaf cut
    along its axis into ``world_size`` pieces (``numpy.array_split`` sizes, padded to the first),
    piece ``r`` of every leaf flattened into block ``r`` of one ``(world_size, L)`` transport tensor
    (where this rank sends: ``sends``, each leaf's transport tensor and origin), ``primitive(blocks
    or None, like)`` on it, and ``post`` on the ``(L,)`` result, cut back into this rank's pieces:
    ``x`` rebuilt with them."""
    what = f"distributed.{kind}"
    b = lv.backend
    n, me = g.world_size, g.rank
    sizes = [split_sizes(s[a], n) for s, a in zip(lv.shapes, axes)]
    padded = [s[:a] + (sz[0] if sz else 0,) + s[a + 1:] for s, a, sz in zip(lv.shapes, axes, sizes)]
    plan = [] if b is None else plan_buckets(b, lv.tensors, DEFAULT_BUCKET_MB * 2**20)

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        handles: list[Handle] = []
        sent: list[tuple[list[int], list[Origin]]] = []
        alive: list[Any] = []  # the send buffers, until every primitive is done (nonblocking engines read them)
        for idx in plan:
            assert b is not None
            origins: list[Origin] = []
            blocks = None
            if sends is not None:
                rows = []
                for i in idx:
                    t, origin = sends[i]
                    origins.append(origin)
                    blk = blocks_of(g, t, sizes[i], axes[i])
                    tb = backend_of(blk)
                    rows.append(tb.reshape(blk, (n, numel(padded[i]))))
                blocks = g.engine.prepare(rows[0] if len(rows) == 1 else backend_of(rows[0]).concat(rows, 1))[0]
                tb = backend_of(blocks)
                like = tb.empty((numel(tb.shape_of(blocks)[1:]),), lv.dtypes[idx[0]], tb.device_of(blocks))
            else:
                for i in idx:
                    tb, tdev = transport_backend(g, lv.devices[i], b)
                    origins.append(Origin(b, lv.devices[i], lv.dtypes[i], b is tb, lv.tensors[i]))
                tb, tdev = transport_backend(g, lv.devices[idx[0]], b)
                like = tb.empty((sum(numel(padded[i]) for i in idx),), lv.dtypes[idx[0]], tdev)
            like = g.engine.prepare(like)[0]
            handles.append(primitive(blocks, like))
            sent.append((idx, origins))
            alive.append((blocks, like))

        def finish(results: Any) -> Any:
            alive.clear()
            out: list[Any] = [None] * len(lv.tensors)
            for (idx, origins), res in zip(sent, results):
                res = post(res)
                tb = backend_of(res)
                flat = tb.reshape(res, (numel(tb.shape_of(res)),))
                parts = tb.split(flat, [numel(padded[i]) for i in idx], 0) if len(idx) > 1 else [flat]
                for i, origin, p in zip(idx, origins, parts):
                    piece = narrow(tb.reshape(p, padded[i]), axes[i], sizes[i][me])
                    out[i] = from_transport(piece, origin)
            return rebuild(x, lv, out, what)

        return _Many(handles), finish

    return start


def _gather_run(g: Group, kind: str, x: Any, lv: Leaves, axes: list[int], lengths: list[tuple[int, ...]],
                sends: list[tuple[Any, Origin]], primitive: Callable[[Any], Handle], keep: bool) -> Callable[[], Any]:
    """The ``start`` of an allgather or gather of structure ``x``: per bucket, this rank's leaves (as
    ``sends`` has them: each one's transport tensor and origin) flattened into one transport tensor,
    padded to the longest rank's, ``primitive`` on it; then
    every rank's part cut back into its leaves (their lengths along the axis: ``lengths[rank]``)
    and leaf ``i`` of every rank joined along its axis: ``x`` rebuilt with the joins (None where
    this rank gets nothing)."""
    what = f"distributed.{kind}"
    b = lv.backend
    shapes = [[s[:a] + (ln[i],) + s[a + 1:] for i, (s, a) in enumerate(zip(lv.shapes, axes))] for ln in lengths]
    # The same plan on every rank: each leaf counted at its largest rank's size.
    most = [max(numel(shp[i]) for shp in shapes) * ITEMSIZE.get(dt, 8) for i, dt in enumerate(lv.dtypes)]
    plan = [] if b is None else plan_buckets(b, lv.tensors, DEFAULT_BUCKET_MB * 2**20, sizes=most)

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        handles: list[Handle] = []
        sent: list[tuple[list[int], list[Origin]]] = []
        alive: list[Any] = []  # the send buffers, until every primitive is done (nonblocking engines read them)
        for idx in plan:
            ts, origins = [], []
            for i in idx:
                t, origin = sends[i]
                ts.append(t)
                origins.append(origin)
            tb = backend_of(ts[0])
            flat = tb.reshape(ts[0], (numel(lv.shapes[idx[0]]),)) if len(ts) == 1 else flatten(tb, ts)
            longest = max(sum(numel(shp[i]) for i in idx) for shp in shapes)
            send = g.engine.prepare(pad_to(flat, longest, 0))[0]
            handles.append(primitive(send))
            sent.append((idx, origins))
            alive.append(send)

        def finish(results: Any) -> Any:
            alive.clear()
            if not keep:
                return None
            out: list[Any] = [None] * len(lv.tensors)
            for (idx, origins), parts in zip(sent, results):
                cut = []  # cut[r][k]: leaf idx[k] of rank r
                for shp, part in zip(shapes, list(parts)):
                    tb = backend_of(part)
                    mine = narrow(part, 0, sum(numel(shp[i]) for i in idx))
                    cut.append(unflatten(tb, mine, [shp[i] for i in idx]))
                for k, (i, origin) in enumerate(zip(idx, origins)):
                    pieces = [c[k] for c in cut]
                    out[i] = from_transport(backend_of(pieces[0]).concat(pieces, axes[i]), origin)
            return rebuild(x, lv, out, what)

        return _Many(handles), finish

    return start


# -- the collectives ---------------------------------------------------------------------------------
def allreduce(x: Any, op: str = "sum", *, inplace: bool = False, async_op: bool = False) -> Any:
    """Reduce ``x`` elementwise over every rank; every rank gets the result.

    ``op``: sum, mean, max, min, prod (mean: integers refused). ``inplace=True`` writes into ``x``
    (mutable backends; CapabilityError elsewhere) and returns it. ``async_op=True`` returns a
    :class:`Work` whose ``wait()`` gives the result.

    ``x`` may be a structure, as :func:`multidev.to` takes one (lists, tuples, named tuples, dicts, a
    ``state_dict``, a framework's tree such as a JAX pytree) of tensors of one backend: one
    consistency exchange for the whole call (every rank's leaf count and the signature of its
    leaves' dtypes, shapes and devices; ranks that differ raise CollectiveMismatchError on every
    rank), the leaves flattened into buckets of one dtype and device (25 MiB each), one primitive
    per bucket; the result is ``x``'s structure rebuilt (same container types) with new tensors of
    its backend on each leaf's device, or ``x`` itself with every leaf written (``inplace=True``;
    every leaf is probed before any rank sends). Leaves follow :func:`multidev.to`'s rule: ``None``
    stays ``None``, a framework tree's static parts are kept, any other non-tensor (a Python
    number, a string) or a model is refused (UnsupportedTensorError naming its path), as are
    tensors of several backends (CollectiveInputError), on every rank before anything is sent. A
    structure without tensors is agreed like any other and sends nothing: its rebuilt copy (or
    itself, in place). ``op`` applies to every leaf (``mean`` refuses a structure holding integers).
    """
    g = current()
    what = "distributed.allreduce"
    if not async_op:
        out = _quick(g, x, op, inplace, what)
        if out is not _GENERAL:
            return out
    if _is_tree(x):
        sends: list[Any] = []
        tree = _tree_agree(g, "allreduce", x, op, None, inplace, async_op, sends=sends)
        if isinstance(tree, Work):
            return tree
        base = "sum" if op == "mean" else op
        return _tree_run(g, "allreduce", x, tree[0], inplace, async_op, sends[0], lambda t: g.engine.allreduce(t, base),
                         lambda res: mean_of(res, op, g.world_size))

    # a synchronous out-of-place call where the engine reduces into new memory: x's values are read, not copied
    fresh = not inplace and not async_op and type(g.engine).allreduce_new is not Engine.allreduce_new
    ready: list[Any] = []  # x as the transport tensor, which checks() makes for the code below (or _made)
    later: list[Any] = []

    def checks() -> Call:  # this rank's argument checks; its record of the call where one is sent
        b = backend_of(x)
        dtype = b.dtype_of(x)
        check_op(op, dtype, what)
        if inplace:
            _check_inplace(b, x, what)
        shape = _shape(b, x, what)
        placed = _placement(g, b, x, dtype, what)
        _making(g, x, inplace or fresh, placed, ready, later, not unsent)
        return _BARE["allreduce"] if unsent else _record(g, "allreduce", op=op, dtype=dtype, shape=shape,
                                                          tkind=placed[3].kind)

    def made() -> Any:
        return _made(g, x, inplace or fresh, ready, later)

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        t, origin, shared, through = made()
        base = "sum" if op == "mean" else op
        # (t not shared: a copy already, which the engine's allreduce reduces in place)
        h = g.engine.allreduce_new(t, base) if fresh and shared else None
        if h is None:
            if fresh:  # the engine declined: its primitive writes into a private copy, as for any other engine
                t, shared = private(t, g, False, shared, through)
            h = g.engine.allreduce(t, base)
        return h, lambda res: landed(mean_of(res, op, g.world_size), t, origin, x, inplace, shared, through)

    unsent = unchecked(g, "allreduce")
    if unsent:
        checked_here(checks, what)
        return run(g, what, start, async_op)
    agreed = _agreed(g, "allreduce", checks, async_op, ready, made)
    if isinstance(agreed, Work):
        return agreed
    return run(g, what, start, async_op)


def _quick(g: Group, x: Any, op: Any, inplace: bool, what: str) -> Any:
    """``allreduce(x, op, inplace=inplace)``, synchronous, of the engine's own tensor on its transport
    device (as it is, or the engine's copy of it; in place, that copy is written back after; out of
    place, only where the engine reduces into new memory, :meth:`Engine.allreduce_new`, or never
    writes its inputs, JAX's): the general path's checks (the same adapter calls, in its order), its
    record exchanged by :func:`agree_made` where the call is checked, and its primitive through
    :func:`run`, without its layers; ``_GENERAL`` where anything else applies (a structure, a class
    not seen before, a check that fails; out of place, an engine that writes its inputs without
    ``allreduce_new``, whose private copy of x the general path makes while the records travel),
    before anything is sent, so that the general path decides, and raises or reports the refusal to
    the other ranks, as ever. The engine's own copy of an x it cannot send as it is
    (:meth:`Engine.prepare`) is made before the records travel."""
    if getattr(g, "ahead", None) is not None:
        return _GENERAL
    b = cached_owner(type(x))
    if b is None:
        return _GENERAL
    eng = g.engine
    if not inplace and type(eng).allreduce_new is Engine.allreduce_new and eng.writes_inputs:
        return _GENERAL
    try:
        dtype = b.dtype_of(x)
        check_op(op, dtype, what)
        if inplace:
            writable = getattr(b, "writable", None)
            if writable is None or not b.capabilities.mutable or writable(x) is not True:
                return _GENERAL
        shape = b.shape_of(x)
        if len(shape) > MAX_DIMS:
            return _GENERAL
        placed = _placement(g, b, x, dtype, what)
        if placed[0] is not placed[2] or placed[1] != placed[3]:
            return _GENERAL
        t, still = eng.prepare(x)
    except Exception:  # noqa: BLE001 - the general path makes the same calls and raises what it must
        return _GENERAL
    if g.check:  # (every rank's record of the call compared, as the general path's)
        try:
            agree_made(g, "allreduce", _record(g, "allreduce", op=op, dtype=dtype, shape=shape,
                                               tkind=placed[3].kind))
        except BaseException:
            del t  # (an error the caller keeps holds no copy of x, as in the general path)
            raise
    base = "sum" if op == "mean" else op
    if inplace:
        def finish(res: Any) -> Any:
            res = mean_of(res, op, g.world_size) if op == "mean" else res
            if still and res is t:
                return x  # the primitive wrote into x's own memory
            # (the engine's copy of x, or a result in new memory: written into x, as the general path does)
            return landed(res, t, Origin(b, placed[1], dtype, True, x), x, True, still, True)

        return run(g, what, lambda: (eng.allreduce(t, base), finish), False)

    def new(res: Any) -> Any:
        res = mean_of(res, op, g.world_size) if op == "mean" else res
        # (the general path's from_transport: the result where x is, else moved there)
        return res if b.device_of(res) == placed[1] else landed(res, t, Origin(b, placed[1], dtype, True, x), x,
                                                                   False, False, True)

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        if not eng.writes_inputs and type(eng).allreduce_new is Engine.allreduce_new:
            return eng.allreduce(t, base), new  # (its primitives make new tensors: x is read, never written)
        h = eng.allreduce_new(t, base) if still else None
        if h is not None:
            return h, new
        u, _ = private(t, g, False, still, True)  # (the engine declined: a copy of x, reduced in place)
        return eng.allreduce(u, base), new

    return run(g, what, start, False)


_GENERAL = object()  # (_quick: the general path applies)


def broadcast(x: Any, src: int = 0, *, inplace: bool = False, async_op: bool = False) -> Any:
    """Rank ``src``'s ``x`` on every rank (each rank passes a tensor of the same shape and dtype;
    only ``src``'s values matter). ``inplace=True`` writes into ``x`` (mutable backends).

    ``x`` may be a structure of tensors, as :func:`allreduce` takes one (the same rules: one
    exchange, buckets, the structure rebuilt or written in place): each rank passes one of the same
    leaf count, dtypes and shapes."""
    g = current()
    what = "distributed.broadcast"
    if _is_tree(x):
        sends: list[Any] = []
        tree = _tree_agree(g, "broadcast", x, None, src, inplace, async_op, sends=sends)
        if isinstance(tree, Work):
            return tree
        return _tree_run(g, "broadcast", x, tree[0], inplace, async_op, sends[0], lambda t: g.engine.broadcast(t, src),
                         lambda res: res)

    ready: list[Any] = []  # x as the transport tensor, which local() makes for the code below (or _made)
    later: list[Any] = []

    def local() -> Call:
        _check_rank(src, g, what, "src")
        b = backend_of(x)
        dtype = b.dtype_of(x)
        if inplace:
            _check_inplace(b, x, what)
        shape = _shape(b, x, what)
        placed = _placement(g, b, x, dtype, what)
        _making(g, x, inplace, placed, ready, later, not unsent)
        return _record(g, "broadcast", root=src, dtype=dtype, shape=shape, tkind=placed[3].kind)

    def made() -> Any:
        return _made(g, x, inplace, ready, later)

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        t, origin, shared, through = made()
        return g.engine.broadcast(t, src), lambda res: landed(res, t, origin, x, inplace, shared, through)

    unsent = unchecked(g, "broadcast")
    if unsent:
        checked_here(local, what)
        return run(g, what, start, async_op)
    agreed = _agreed(g, "broadcast", local, async_op, ready, made)
    if isinstance(agreed, Work):
        return agreed
    return run(g, what, start, async_op)


def reduce(x: Any, dst: int = 0, op: str = "sum", *, async_op: bool = False) -> Any:
    """The reduction of every rank's ``x`` on rank ``dst`` (a new tensor); None on the other ranks.
    ``x`` may be a structure, as :func:`allreduce` takes one (one exchange, buckets): ``dst`` gets
    it rebuilt with the reductions."""
    g = current()
    what = "distributed.reduce"
    if _is_tree(x):
        sends: list[Any] = []
        tree = _tree_agree(g, "reduce", x, op, dst, False, async_op, sends=sends)
        if isinstance(tree, Work):
            return tree
        base = "sum" if op == "mean" else op
        return _tree_run(g, "reduce", x, tree[0], False, async_op, sends[0], lambda t: g.engine.reduce(t, dst, base),
                         lambda res: mean_of(res, op, g.world_size), keep=g.rank == dst)

    ready: list[Any] = []  # x as the transport tensor, which local() makes for the code below (or _made)
    later: list[Any] = []

    def local() -> Call:
        b = _tensor(x, what)
        _check_rank(dst, g, what, "dst")
        dtype = b.dtype_of(x)
        check_op(op, dtype, what)
        shape = _shape(b, x, what)
        placed = _placement(g, b, x, dtype, what)
        _making(g, x, False, placed, ready, later, g.check)
        return _record(g, "reduce", op=op, root=dst, dtype=dtype, shape=shape, tkind=placed[3].kind)

    def made() -> Any:
        return _made(g, x, False, ready, later)

    agreed = _agreed(g, "reduce", local, async_op, ready, made)
    if isinstance(agreed, Work):
        return agreed

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        t, origin, _, _ = made()

        def finish(res: Any) -> Any:
            return None if g.rank != dst else from_transport(mean_of(res, op, g.world_size), origin)
        return g.engine.reduce(t, dst, "sum" if op == "mean" else op), holding(finish, t)

    return run(g, what, start, async_op)


def _gather_call(g: Group, kind: str, x: Any, axis: Any, root: int | None,
                 async_op: bool) -> tuple[int, list[int], Any, Origin] | Work:
    """The gathers' agreement: ``(axis, every rank's length along it, x as the transport tensor, its
    origin)``, or a failed Work."""
    what = f"distributed.{kind}"
    mine: dict[str, Any] = {}  # this rank's checked axis and transport tensor, which local() finds for the code below

    def local() -> Call:
        if root is not None:
            _check_rank(root, g, what, "dst")
        b = _tensor(x, what)
        shape = _shape(b, x, what)
        mine["axis"] = check_axis(axis, len(shape), what)
        dtype = b.dtype_of(x)
        placed = _placement(g, b, x, dtype, what)
        mine["t"], mine["origin"], _, _ = to_transport(x, g, placed)
        return Call(kind, root=root, axis=mine["axis"], dtype=dtype, shape=shape, tkind=placed[3].kind)

    calls = _agreed(g, kind, local, async_op, mine)
    if isinstance(calls, Work):
        return calls
    assert calls is not None  # the gathers always exchange
    ax = mine["axis"]
    return ax, [c.shape[ax] if c.shape is not None else 0 for c in calls], mine["t"], mine["origin"]


def _tree_gather(g: Group, kind: str, x: Any, axis: Any, root: int | None, async_op: bool) -> Any:
    sends: list[Any] = []
    agreed = _tree_agree(g, kind, x, None, root, False, async_op, axis, sends=sends, leafwise=True)
    if isinstance(agreed, Work):
        return agreed
    lv, axes, calls = agreed
    lengths = _tree_lengths(g, kind, lv, axes, calls)
    if root is None:
        start = _gather_run(g, kind, x, lv, axes, lengths, sends[0], g.engine.allgather, True)
    else:
        start = _gather_run(g, kind, x, lv, axes, lengths, sends[0], lambda t: g.engine.gather(t, root),
                            g.rank == root)
    return run(g, f"distributed.{kind}", start, async_op)


def _padded_send(g: Group, t: Any, ax: int, lengths: list[int]) -> Any:
    return g.engine.prepare(pad_to(t, max(lengths), ax))[0]


def _joined(parts: list[Any], lengths: list[int], ax: int, origin: Origin) -> Any:
    pieces = [narrow(p, ax, n) for p, n in zip(parts, lengths)]
    return from_transport(backend_of(pieces[0]).concat(pieces, ax), origin)


def allgather(x: Any, axis: int = 0, *, async_op: bool = False) -> Any:
    """The concatenation of every rank's ``x`` along ``axis``, in rank order, on every rank.
    Lengths along ``axis`` may differ between ranks (the consistency exchange carries them).

    ``x`` may be a structure (one exchange, buckets): every rank passes one of the same leaf
    count, dtypes and shapes but along ``axis`` (counted per leaf); the result is ``x``'s structure
    rebuilt, leaf ``i`` every rank's leaf ``i`` joined along its axis. The leaves' lengths travel in
    the exchange for up to 32 leaves; a larger structure's lengths take one more small allgather."""
    g = current()
    if _is_tree(x):
        return _tree_gather(g, "allgather", x, axis, None, async_op)
    agreed = _gather_call(g, "allgather", x, axis, None, async_op)
    if isinstance(agreed, Work):
        return agreed
    ax, lengths, t, origin = agreed

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        send = _padded_send(g, t, ax, lengths)
        return g.engine.allgather(send), holding(lambda parts: _joined(list(parts), lengths, ax, origin), send)

    return run(g, "distributed.allgather", start, async_op)


def gather(x: Any, dst: int = 0, axis: int = 0, *, async_op: bool = False) -> Any:
    """The concatenation of every rank's ``x`` along ``axis`` on rank ``dst``; None elsewhere.
    Lengths along ``axis`` may differ between ranks. Structures: as :func:`allgather`'s, on ``dst``."""
    g = current()
    if _is_tree(x):
        return _tree_gather(g, "gather", x, axis, dst, async_op)
    agreed = _gather_call(g, "gather", x, axis, dst, async_op)
    if isinstance(agreed, Work):
        return agreed
    ax, lengths, t, origin = agreed

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        send = _padded_send(g, t, ax, lengths)

        def finish(parts: Any) -> Any:
            return None if g.rank != dst or parts is None else _joined(list(parts), lengths, ax, origin)
        return g.engine.gather(send, dst), holding(finish, send)

    return run(g, "distributed.gather", start, async_op)


def reduce_scatter(x: Any, op: str = "sum", axis: int = 0, *, async_op: bool = False) -> Any:
    """Reduce every rank's ``x`` elementwise and give rank ``r`` piece ``r`` of the result, cut along
    ``axis`` as ``numpy.array_split`` cuts (the first pieces one larger).

    ``x`` may be a structure, as :func:`allreduce` takes one (one exchange, buckets): rank ``r``
    gets it rebuilt with piece ``r`` of each leaf's reduction (``axis`` counted per leaf)."""
    g = current()
    what = "distributed.reduce_scatter"
    if _is_tree(x):
        sends: list[Any] = []
        tree = _tree_agree(g, "reduce_scatter", x, op, None, False, async_op, axis, sends=sends, leafwise=True)
        if isinstance(tree, Work):
            return tree
        lv, axes, _ = tree
        base = "sum" if op == "mean" else op
        return run(g, what, _cut_run(g, "reduce_scatter", x, lv, axes, sends[0],
                                     lambda blocks, like: g.engine.reduce_scatter(blocks, base),
                                     lambda res: mean_of(res, op, g.world_size)), async_op)
    mine: dict[str, Any] = {}  # this rank's shape, checked axis and transport tensor, which local() finds below

    def local() -> Call:
        b = _tensor(x, what)
        dtype = b.dtype_of(x)
        check_op(op, dtype, what)
        shp = _shape(b, x, what)
        mine.update(shape=shp, axis=check_axis(axis, len(shp), what))
        placed = _placement(g, b, x, dtype, what)
        mine["t"], mine["origin"], _, _ = to_transport(x, g, placed)
        return Call("reduce_scatter", op=op, axis=mine["axis"], dtype=dtype, shape=shp, tkind=placed[3].kind)

    agreed = _agreed(g, "reduce_scatter", local, async_op, mine)
    if isinstance(agreed, Work):
        return agreed
    shape, ax = mine["shape"], mine["axis"]

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        t, origin = mine["t"], mine["origin"]
        sizes = split_sizes(shape[ax], g.world_size)
        blocks = blocks_of(g, t, sizes, ax)
        h = g.engine.reduce_scatter(blocks, "sum" if op == "mean" else op)
        return h, holding(lambda piece: from_transport(narrow(mean_of(piece, op, g.world_size), ax, sizes[g.rank]),
                                                        origin), blocks)

    return run(g, what, start, async_op)


def scatter(x: Any, src: int = 0, axis: int = 0, *, backend: str | None = None,
            device: DeviceLike | None = None, async_op: bool = False) -> Any:
    """Rank ``src``'s ``x`` cut along ``axis`` (``numpy.array_split`` sizes); rank ``r`` gets piece ``r``.

    On the other ranks ``x`` may be None (or any tensor: only its backend and device are used): the
    piece is then a tensor of ``backend`` (default: src's backend) on ``device`` (default: x's device,
    else cpu:0). Shape and dtype travel from ``src`` in the consistency exchange.

    ``x`` may be a structure (one exchange, buckets): then every rank passes one of the same leaf
    count, dtypes and shapes (only ``src``'s values matter: the containers cannot travel, so a
    structure cannot arrive where None was passed), and rank ``r`` gets it rebuilt with piece ``r``
    of each of src's leaves (``axis`` counted per leaf).
    """
    g = current()
    what = "distributed.scatter"
    if _is_tree(x):
        # (only src sends: the other ranks' leaves give devices and dtypes)
        sends: list[Any] | None = [] if g.rank == src else None
        tree = _tree_agree(g, "scatter", x, None, src, False, async_op, axis,
                           None if backend is None and device is None else
                           "backend= and device= are for a tensor received where None was passed; a structure's "
                           "pieces land on its own leaves' devices, of its backend", sends=sends, leafwise=True)
        if isinstance(tree, Work):
            return tree
        lv, axes, _ = tree
        return run(g, what, _cut_run(g, "scatter", x, lv, axes, sends[0] if sends else None,
                                     lambda blocks, like: g.engine.scatter(blocks, like, src), lambda res: res),
                   async_op)

    sending: list[Any] = []  # on src: x as the transport tensor and its origin, which local() makes below

    def local() -> Call:
        _check_rank(src, g, what, "src")
        if isinstance(axis, bool) or not isinstance(axis, int) or not -MAX_DIMS <= axis < MAX_DIMS:
            raise CollectiveInputError(f"{what}: axis must be an int in -{MAX_DIMS}..{MAX_DIMS - 1}, got {axis!r:.40}")
        if g.rank != src:
            return Call("scatter", root=src, axis=axis)  # the axis as given: only src knows the rank
        if x is None:
            raise CollectiveInputError(f"{what}: the src rank must pass the tensor to scatter")
        b = _tensor(x, what)
        shape = _shape(b, x, what)
        check_axis(axis, len(shape), what)
        dtype = b.dtype_of(x)
        placed = _placement(g, b, x, dtype, what)
        sending.extend(to_transport(x, g, placed)[:2])
        return Call("scatter", root=src, axis=axis, dtype=dtype, shape=shape, tkind=placed[3].kind, backend=b.name)

    calls = _agreed(g, "scatter", local, async_op, sending)
    if isinstance(calls, Work):
        return calls
    assert calls is not None  # scatter always exchanges
    sent = calls[src]
    assert sent.shape is not None and sent.dtype is not None and sent.tkind is not None
    full_shape, dtype, tkind = sent.shape, sent.dtype, sent.tkind

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        ax = check_axis(axis, len(full_shape), what)
        sizes = split_sizes(full_shape[ax], g.world_size)
        piece = list(full_shape)
        piece[ax] = sizes[0] if sizes else 0
        if g.rank == src:
            t, origin = sending
            blocks = blocks_of(g, t, sizes, ax)
            tb = backend_of(blocks)
            like = tb.empty(tuple(piece), dtype, tb.device_of(blocks))
        else:
            b = backend_of(x) if x is not None else get_backend(backend or sent.backend)
            if device is not None:
                dev = resolve(b, device)
            else:
                dev = b.device_of(x) if x is not None else _HOST
            tb, tdev = transport_backend(g, Device(tkind, dev.index if dev.kind == tkind else 0), b)
            origin = Origin(b, dev, dtype, b is tb)
            blocks = None
            like = tb.empty(tuple(piece), dtype, tdev)
        h = g.engine.scatter(blocks, g.engine.prepare(like)[0], src)
        return h, holding(lambda res: from_transport(narrow(res, ax, sizes[g.rank]), origin), blocks)

    return run(g, what, start, async_op)


def barrier() -> None:
    """Wait until every rank gets here (DistributedTimeoutError naming the ranks that never do).
    The consistency exchange is the barrier: every rank's record must arrive before any returns."""
    g = current()
    agree(g, "barrier", lambda: Call("barrier"))
