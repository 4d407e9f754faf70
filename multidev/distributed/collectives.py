"""The collectives across processes, written once over the engine interface.

Each call: this rank's argument checks (they give its record of the call), the consistency
exchange (:mod:`.consistency`), then the engine's primitive on transport tensors
(:mod:`.transport`), its result turned back into a tensor of the input's backend, on its device.
What the engines do not do is done here, the same for all of them: ``mean`` (a sum and one
division), uneven pieces (padded to equal blocks, cut back after), ``inplace=True`` (written
through shared memory, or assigned), ``async_op`` (a :class:`Work`), structures of tensors
(``allreduce`` and ``broadcast``: one consistency exchange for the whole structure, its tensors
flattened into buckets of one dtype and device, one primitive per bucket).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .._device import Device, DeviceLike
from ..buckets import DEFAULT_BUCKET_MB, flatten, plan_buckets, unflatten
from ..collectives import split_sizes
from ..errors import CapabilityError, CollectiveInputError, MultidevError, UnsupportedTensorError, translate_errors
from ..placement import resolve
from ..protocol import Backend
from ..registry import backend_of, get_backend
from ..structured import Leaves, rebuild, structure_leaves
from ..trees import owner_or_structure
from ..validate import check_axis, check_op, check_writable
from .consistency import MAX_DIMS, Call, agree
from .engine import Handle
from .group import Group, current
from .handles import Work, run
from .transport import Origin, from_transport, to_transport, transport_backend

__all__ = ["allgather", "allreduce", "barrier", "broadcast", "carries", "gather", "reduce", "reduce_scatter",
           "scatter"]

_HOST = Device("cpu", 0)


# -- this rank's checks ------------------------------------------------------------------------------
def _shape(b: Backend, x: Any, what: str) -> tuple[int, ...]:
    shape = b.shape_of(x)
    if len(shape) > MAX_DIMS:
        raise CollectiveInputError(f"{what}: at most {MAX_DIMS} dimensions, got a {len(shape)}-d tensor")
    return shape


def _carried(g: Group, b: Backend, x: Any, dtype: str, what: str) -> str:
    """The kind of device x travels on; CapabilityError (naming the engine) for a dtype the group
    cannot carry."""
    tb, tdev = transport_backend(g, b.device_of(x), b)
    allowed = g.engine.dtypes()
    if allowed is not None and dtype not in allowed:
        raise CapabilityError(f"{what}: the {g.info.engine} engine cannot carry {dtype} tensors "
                              f"(it carries {', '.join(sorted(allowed))})")
    if dtype not in tb.capabilities.dtypes_on(tdev):
        try:
            with translate_errors(what):
                tb.to_native_dtype(dtype)
        except CapabilityError as e:
            raise CapabilityError(f"{what}: the {g.info.engine} engine moves {tb.name} tensors, which cannot hold "
                                  f"{dtype} here: {e}") from None
        raise CapabilityError(f"{what}: the {g.info.engine} engine moves {tb.name} tensors, which cannot hold {dtype} "
                              f"on {tdev}")
    return tdev.kind


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


def _is_tree(x: Any) -> bool:
    """Whether ``x`` is a structure (a container or a framework's tree), not a tensor. Never
    raises: what is neither is the tensor path's to refuse, inside the exchange."""
    try:
        return owner_or_structure(x) is None
    except MultidevError:
        return False


def _tensor(x: Any, what: str) -> Backend:
    """The backend of tensor ``x``; a structure is refused by a clear CollectiveInputError (only
    allreduce and broadcast take structures)."""
    try:
        return backend_of(x)
    except UnsupportedTensorError:
        if _is_tree(x):
            raise CollectiveInputError(
                f"{what} takes one tensor, not a structure: only allreduce and broadcast take structures "
                "(a gather's pieces may differ in length on each rank, leaf by leaf, which one consistency "
                "record cannot carry); call it once per tensor") from None
        raise


def _check_rank(r: Any, g: Group, what: str, name: str) -> int:
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < g.world_size:
        raise CollectiveInputError(f"{what}: {name}={r!r:.40} is not a rank of this world (0..{g.world_size - 1})")
    return r


# -- transport tensors -----------------------------------------------------------------------------
def _writes_through(origin: Origin) -> bool:
    """Whether writing into memory shared through DLPack is a valid in-place update of the input:
    transport tensors, and synchronous mutable backends (NumPy). Asynchronous engines (MXNet) get an
    explicit ``assign`` so their dependency tracking sees the write."""
    caps = origin.backend.capabilities
    return origin.is_transport or (caps.mutable and not caps.async_execution)


def _working(x: Any, g: Group, inplace: bool) -> tuple[Any, Origin, bool, bool]:
    """The transport tensor a primitive may write into, ``(t, origin, shares x's memory, writes
    through)``: x's own memory only when the call is in place and writes reach x; else a copy
    (none for engines that never write into their inputs)."""
    t, origin, shared, _ = to_transport(x, g)
    through = _writes_through(origin)
    if shared and g.engine.writes_inputs and not (inplace and through):
        tb = backend_of(t)
        t, _ = g.engine.prepare(tb.copy(t, tb.device_of(t)))
        shared = False
    return t, origin, shared, through


def _landing(res: Any, t: Any, origin: Origin, x: Any, inplace: bool, shared: bool,
             through: bool) -> tuple[Any, Any]:
    """(what the caller gets, the value still to write into ``x``: None when nothing is)."""
    if not inplace:
        return from_transport(res, origin), None
    if shared and through and res is t:
        return x, None  # the primitive wrote into x's own memory
    return x, from_transport(res, origin)


def _result(res: Any, t: Any, origin: Origin, x: Any, inplace: bool, shared: bool, through: bool) -> Any:
    out, pending = _landing(res, t, origin, x, inplace, shared, through)
    if pending is not None:
        origin.backend.assign(x, pending)
    return out


def _mean(res: Any, op: str, n: int) -> Any:
    return backend_of(res).divide(res, n) if op == "mean" else res


def _pad(t: Any, length: int, ax: int) -> Any:
    tb = backend_of(t)
    shape = tb.shape_of(t)
    if shape[ax] == length:
        return t
    extra = list(shape)
    extra[ax] = length - shape[ax]
    return tb.concat([t, tb.full(tuple(extra), 0, tb.dtype_of(t), tb.device_of(t))], ax)


def _narrow(t: Any, ax: int, n: int) -> Any:
    tb = backend_of(t)
    m = tb.shape_of(t)[ax]
    return t if m == n else tb.split(t, [n, m - n], ax)[0]


def _blocks(g: Group, t: Any, sizes: list[int], ax: int) -> Any:
    """``t`` cut along ``ax`` into ``sizes`` pieces, each padded to the first's length, stacked on a
    new leading axis: a contiguous ``(world_size, *piece)`` tensor."""
    tb = backend_of(t)
    m = sizes[0] if sizes else 0
    pieces = [_pad(p, m, ax) for p in tb.split(t, sizes, ax)]
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


def _tree_agree(g: Group, kind: str, x: Any, op: str | None, src: int | None, inplace: bool,
                async_op: bool) -> Leaves | Work:
    """The one consistency exchange of a collective over structure ``x``: this rank's checks of
    every leaf (one backend, each dtype's op, what the group carries, writability for
    ``inplace``), then its record: the leaf count and the signature of the leaves' dtypes, shapes
    and devices (and the kind of device each travels on). Returns the leaves, or a failed Work."""
    what = f"distributed.{kind}"
    mine: dict[str, Leaves] = {}  # this rank's leaves, which local() finds for the code below

    def local() -> Call:
        if src is not None:
            _check_rank(src, g, what, "src")
        lv = structure_leaves(x, what)
        tkinds: list[str] = []
        if lv.backend is not None:
            b = lv.backend
            seen: dict[tuple[str, Device], str] = {}
            for t, dtype, dev in zip(lv.tensors, lv.dtypes, lv.devices):
                key = (dtype, dev)
                if key not in seen:
                    if op is not None:
                        check_op(op, dtype, what)
                    seen[key] = _carried(g, b, t, dtype, what)
                tkinds.append(seen[key])
                if inplace:
                    check_writable(b, _probe(b, t), f"{what}(inplace=True)")
        mine["leaves"] = lv
        one = set(tkinds)
        return Call(kind, op=op, root=src, tkind=one.pop() if len(one) == 1 else None, leaves=len(lv.tensors),
                    sig=lv.signature(tkinds))

    agreed = agree(g, kind, local, async_op)
    if isinstance(agreed, Work):
        return agreed
    return mine["leaves"]


def _tree_run(g: Group, kind: str, x: Any, lv: Leaves, inplace: bool, async_op: bool,
              primitive: Callable[[Any], Handle], post: Callable[[Any], Any]) -> Any:
    """Structure ``x``'s leaves in buckets (one dtype and device each, up to
    :data:`~multidev.buckets.DEFAULT_BUCKET_MB`), ``primitive`` on each bucket's transport tensor
    (a lone tensor as the one-tensor collective sends it; several flattened into a new one), then
    ``post`` on each result, cut back into the leaves: written into them (``inplace``, returning
    ``x``) or ``x`` rebuilt with them."""
    what = f"distributed.{kind}"
    b = lv.backend
    xs = lv.tensors
    plan = [] if b is None else plan_buckets(b, xs, DEFAULT_BUCKET_MB * 2**20)

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        sent: list[tuple[list[int], Any, Origin, bool, bool]] = []
        handles: list[Handle] = []
        for idx in plan:
            if len(idx) == 1:
                t, origin, shared, through = _working(xs[idx[0]], g, inplace)
            else:  # a new tensor of ours: the primitive may write into it
                assert b is not None
                t, origin, shared, through = _working(flatten(b, [xs[i] for i in idx]), g, True)
            handles.append(primitive(t))
            sent.append((idx, t, origin, shared, through))

        def finish(results: Any) -> Any:
            # Every bucket converted back before the first write into x: a conversion that fails
            # leaves x as it was (where the transport did not write into x's memory itself).
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
    if _is_tree(x):
        lv = _tree_agree(g, "allreduce", x, op, None, inplace, async_op)
        if isinstance(lv, Work):
            return lv
        base = "sum" if op == "mean" else op
        return _tree_run(g, "allreduce", x, lv, inplace, async_op, lambda t: g.engine.allreduce(t, base),
                         lambda res: _mean(res, op, g.world_size))

    def local() -> Call:
        b = backend_of(x)
        dtype = b.dtype_of(x)
        check_op(op, dtype, what)
        if inplace:
            check_writable(b, _probe(b, x), f"{what}(inplace=True)")
        return Call("allreduce", op=op, dtype=dtype, shape=_shape(b, x, what), tkind=_carried(g, b, x, dtype, what))

    agreed = agree(g, "allreduce", local, async_op)
    if isinstance(agreed, Work):
        return agreed

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        t, origin, shared, through = _working(x, g, inplace)
        h = g.engine.allreduce(t, "sum" if op == "mean" else op)
        return h, lambda res: _result(_mean(res, op, g.world_size), t, origin, x, inplace, shared, through)

    return run(g, what, start, async_op)


def broadcast(x: Any, src: int = 0, *, inplace: bool = False, async_op: bool = False) -> Any:
    """Rank ``src``'s ``x`` on every rank (each rank passes a tensor of the same shape and dtype;
    only ``src``'s values matter). ``inplace=True`` writes into ``x`` (mutable backends).

    ``x`` may be a structure of tensors, as :func:`allreduce` takes one (the same rules: one
    exchange, buckets, the structure rebuilt or written in place): each rank passes one of the same
    leaf count, dtypes and shapes."""
    g = current()
    what = "distributed.broadcast"
    if _is_tree(x):
        lv = _tree_agree(g, "broadcast", x, None, src, inplace, async_op)
        if isinstance(lv, Work):
            return lv
        return _tree_run(g, "broadcast", x, lv, inplace, async_op, lambda t: g.engine.broadcast(t, src),
                         lambda res: res)

    def local() -> Call:
        _check_rank(src, g, what, "src")
        b = backend_of(x)
        dtype = b.dtype_of(x)
        if inplace:
            check_writable(b, _probe(b, x), f"{what}(inplace=True)")
        return Call("broadcast", root=src, dtype=dtype, shape=_shape(b, x, what), tkind=_carried(g, b, x, dtype, what))

    agreed = agree(g, "broadcast", local, async_op)
    if isinstance(agreed, Work):
        return agreed

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        t, origin, shared, through = _working(x, g, inplace)
        return g.engine.broadcast(t, src), lambda res: _result(res, t, origin, x, inplace, shared, through)

    return run(g, what, start, async_op)


def reduce(x: Any, dst: int = 0, op: str = "sum", *, async_op: bool = False) -> Any:
    """The reduction of every rank's ``x`` on rank ``dst`` (a new tensor); None on the other ranks."""
    g = current()
    what = "distributed.reduce"

    def local() -> Call:
        b = _tensor(x, what)
        _check_rank(dst, g, what, "dst")
        dtype = b.dtype_of(x)
        check_op(op, dtype, what)
        return Call("reduce", op=op, root=dst, dtype=dtype, shape=_shape(b, x, what),
                    tkind=_carried(g, b, x, dtype, what))

    agreed = agree(g, "reduce", local, async_op)
    if isinstance(agreed, Work):
        return agreed

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        t, origin, _, _ = _working(x, g, False)

        def finish(res: Any) -> Any:
            return None if g.rank != dst else from_transport(_mean(res, op, g.world_size), origin)
        return g.engine.reduce(t, dst, "sum" if op == "mean" else op), finish

    return run(g, what, start, async_op)


def _gather_call(g: Group, kind: str, x: Any, axis: Any, root: int | None,
                 async_op: bool) -> tuple[int, list[int]] | Work:
    """The gathers' agreement: ``(axis, every rank's length along it)``, or a failed Work."""
    what = f"distributed.{kind}"
    mine: dict[str, int] = {}  # this rank's checked axis, which local() finds for the code below

    def local() -> Call:
        if root is not None:
            _check_rank(root, g, what, "dst")
        b = _tensor(x, what)
        shape = _shape(b, x, what)
        mine["axis"] = check_axis(axis, len(shape), what)
        dtype = b.dtype_of(x)
        return Call(kind, root=root, axis=mine["axis"], dtype=dtype, shape=shape, tkind=_carried(g, b, x, dtype, what))

    calls = agree(g, kind, local, async_op)
    if isinstance(calls, Work):
        return calls
    assert calls is not None  # the gathers always exchange
    ax = mine["axis"]
    return ax, [c.shape[ax] if c.shape is not None else 0 for c in calls]


def _padded_send(g: Group, x: Any, ax: int, lengths: list[int]) -> tuple[Any, Origin]:
    t, origin, _, _ = to_transport(x, g)
    return g.engine.prepare(_pad(t, max(lengths), ax))[0], origin


def _joined(parts: list[Any], lengths: list[int], ax: int, origin: Origin) -> Any:
    pieces = [_narrow(p, ax, n) for p, n in zip(parts, lengths)]
    return from_transport(backend_of(pieces[0]).concat(pieces, ax), origin)


def allgather(x: Any, axis: int = 0, *, async_op: bool = False) -> Any:
    """The concatenation of every rank's ``x`` along ``axis``, in rank order, on every rank.
    Lengths along ``axis`` may differ between ranks (the consistency exchange carries them). One
    tensor only: a structure is refused (CollectiveInputError on this rank, DistributedError on the
    others), since every leaf's length on every rank would not fit one consistency record."""
    g = current()
    agreed = _gather_call(g, "allgather", x, axis, None, async_op)
    if isinstance(agreed, Work):
        return agreed
    ax, lengths = agreed

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        send, origin = _padded_send(g, x, ax, lengths)
        return g.engine.allgather(send), lambda parts: _joined(list(parts), lengths, ax, origin)

    return run(g, "distributed.allgather", start, async_op)


def gather(x: Any, dst: int = 0, axis: int = 0, *, async_op: bool = False) -> Any:
    """The concatenation of every rank's ``x`` along ``axis`` on rank ``dst``; None elsewhere.
    Lengths along ``axis`` may differ between ranks."""
    g = current()
    agreed = _gather_call(g, "gather", x, axis, dst, async_op)
    if isinstance(agreed, Work):
        return agreed
    ax, lengths = agreed

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        send, origin = _padded_send(g, x, ax, lengths)

        def finish(parts: Any) -> Any:
            return None if g.rank != dst or parts is None else _joined(list(parts), lengths, ax, origin)
        return g.engine.gather(send, dst), finish

    return run(g, "distributed.gather", start, async_op)


def reduce_scatter(x: Any, op: str = "sum", axis: int = 0, *, async_op: bool = False) -> Any:
    """Reduce every rank's ``x`` elementwise and give rank ``r`` piece ``r`` of the result, cut along
    ``axis`` as ``numpy.array_split`` cuts (the first pieces one larger)."""
    g = current()
    what = "distributed.reduce_scatter"
    mine: dict[str, Any] = {}  # this rank's shape and checked axis, which local() finds for the code below

    def local() -> Call:
        b = _tensor(x, what)
        dtype = b.dtype_of(x)
        check_op(op, dtype, what)
        shp = _shape(b, x, what)
        mine.update(shape=shp, axis=check_axis(axis, len(shp), what))
        return Call("reduce_scatter", op=op, axis=mine["axis"], dtype=dtype, shape=shp,
                    tkind=_carried(g, b, x, dtype, what))

    agreed = agree(g, "reduce_scatter", local, async_op)
    if isinstance(agreed, Work):
        return agreed
    shape, ax = mine["shape"], mine["axis"]

    def start() -> tuple[Handle, Callable[[Any], Any]]:
        t, origin, _, _ = to_transport(x, g)
        sizes = split_sizes(shape[ax], g.world_size)
        h = g.engine.reduce_scatter(_blocks(g, t, sizes, ax), "sum" if op == "mean" else op)
        return h, lambda piece: from_transport(_narrow(_mean(piece, op, g.world_size), ax, sizes[g.rank]), origin)

    return run(g, what, start, async_op)


def scatter(x: Any, src: int = 0, axis: int = 0, *, backend: str | None = None,
            device: DeviceLike | None = None, async_op: bool = False) -> Any:
    """Rank ``src``'s ``x`` cut along ``axis`` (``numpy.array_split`` sizes); rank ``r`` gets piece ``r``.

    On the other ranks ``x`` may be None (or any tensor: only its backend and device are used): the
    piece is then a tensor of ``backend`` (default: src's backend) on ``device`` (default: x's device,
    else cpu:0). Shape and dtype travel from ``src`` in the consistency exchange.
    """
    g = current()
    what = "distributed.scatter"

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
        return Call("scatter", root=src, axis=axis, dtype=dtype, shape=shape, tkind=_carried(g, b, x, dtype, what),
                    backend=b.name)

    calls = agree(g, "scatter", local, async_op)
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
            t, origin, _, _ = to_transport(x, g)
            blocks = _blocks(g, t, sizes, ax)
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
        return h, lambda res: from_transport(_narrow(res, ax, sizes[g.rank]), origin)

    return run(g, what, start, async_op)


def barrier() -> None:
    """Wait until every rank gets here (DistributedTimeoutError naming the ranks that never do).
    The consistency exchange is the barrier: every rank's record must arrive before any returns."""
    g = current()
    agree(g, "barrier", lambda: Call("barrier"))
