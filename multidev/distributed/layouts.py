"""Tensors laid out across the processes of a group: a :class:`~multidev.Layout` over a
:class:`~multidev.distributed.ProcessMesh`, each rank holding its piece.

- :func:`distribute` (``multidev.to(x, layout)``, rank ``src``'s tensor) cuts a whole tensor into
  the layout's pieces, each rank keeping its own; :func:`from_local` builds the sharded tensor from
  each rank's piece (no data moves); :func:`gather` (``multidev.to_host``, ``multidev.to(x, device)``)
  brings the whole tensor back on every rank; a change of layout moves only what each rank lacks.
- The result is the framework's own sharded type where it has one for this group's engine
  (torch's ``DTensor`` under the torch engine, a global ``jax.Array`` with a ``NamedSharding``
  under the jax engine: the adapter's mesh concern says, ``process_sharding``), else a
  :class:`~multidev.ShardedTensor` holding this rank's one native piece (``shards``), which
  multidev manages: NumPy, TensorFlow, MXNet, CuPy, array-API libraries, and any framework under an
  engine that is not its own (torch or JAX under MPI).

Every call here is collective: every rank of the group calls it with the same layout, shape and
dtype. Those are compared in one agreed exchange first (CollectiveMismatchError on every rank,
naming the difference, before anything moves; a rank's own refusal raises its error there and
CollectiveMismatchError on the others), unless the group's consistency checks are off
(``set_checks(False)``: each rank's own checks only, as for the collectives). Then the data moves
with the framework's own calls where its sharded type has them (torch's ``distribute_tensor`` and
``full_tensor``, a jitted replication on JAX), else along the mesh's axes within the engine's
subgroups (as :func:`~multidev.distributed.allgather_along` and
:func:`~multidev.distributed.allreduce_along` do, under the one agreed exchange) or by
:func:`~multidev.distributed.broadcast`, with the group's timeouts and typed errors. Pieces follow
``numpy.array_split``'s sizes, as one process's layouts do.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CollectiveMismatchError, InvalidArgumentError, UnsupportedTensorError
from ..mesh import Layout, ProcessMesh
from ..protocol import Backend
from ..registry import backend_of, get_backend
from ..sharding import ShardedTensor, cut_piece
from .collectives import allgather, broadcast
from .consistency import MAX_DIMS
from .group import current
from .mesh import agree_call, all_to_all_along, allgather_along_one, allreduce_along_one, checked_input

__all__ = ["distribute", "from_local", "is_process_layout", "local_piece", "process_layout_of", "whole_of"]


def is_process_layout(layout: Any) -> bool:
    """Whether ``layout`` is a :class:`~multidev.Layout` over a process mesh."""
    return layout.__class__ is Layout and layout.mesh.__class__ is ProcessMesh


def _native_process_layout(b: Backend, x: Any) -> Layout | None:
    read = getattr(b.mesh, "process_layout_of", None) if b.mesh is not None else None
    return None if read is None else read(x)


def process_layout_of(x: Any) -> Layout | None:
    """The process layout of ``x``: a :class:`~multidev.ShardedTensor` over a process mesh, or a
    framework's own tensor sharded across processes (a ``DTensor``, a global ``jax.Array``); None
    otherwise. Never copies or waits."""
    if x.__class__ is ShardedTensor:
        return x.layout if is_process_layout(x.layout) else None
    try:
        b = backend_of(x)
    except UnsupportedTensorError:
        return None
    return _native_process_layout(b, x)


def local_piece(x: Any) -> tuple[Backend, Any, Layout, tuple[int, ...], str]:
    """``(backend, this rank's piece, layout, whole shape, dtype)`` of a tensor sharded across
    processes (no copy)."""
    if x.__class__ is ShardedTensor:
        return get_backend(x.backend), x.shards[0], x.layout, x.shape, x.dtype
    b = backend_of(x)
    lay = _native_process_layout(b, x)
    assert lay is not None
    pieces = b.mesh.local_pieces(x)  # type: ignore[union-attr]
    return b, pieces[0], lay, tuple(b.shape_of(x)), b.dtype_of(x)


def _agreed(what: str, check: Any) -> None:
    """This rank's checks of the call (``check()``), and every rank's record of it compared in one
    agreed exchange where the group checks its collectives' consistency (the default); with the
    checks off (``set_checks(False)``), this rank's own checks only, as the collectives do."""
    if current().check:
        agree_call(what, check)
    else:
        check()


def _world_mesh(layout: Layout, what: str) -> ProcessMesh:
    g = current()
    m = layout.mesh
    assert isinstance(m, ProcessMesh)
    if m.size != g.world_size:
        raise InvalidArgumentError(f"{what}: the layout's process mesh holds {m.size} ranks, the group {g.world_size}")
    return m


def _native_possible(b: Backend, layout: Layout, shape: tuple[int, ...] | None) -> bool:
    """Whether this rank would make the framework's own sharded type (its runtime runs the group's
    ranks, rank for rank): decided without building anything (a DeviceMesh is collective), and put
    in the call's agreed record, so ranks that would choose differently raise instead of hanging.
    ``shape`` None (worked out later): the runtime alone decides here."""
    decide = getattr(b.mesh, "process_native", None) if b.mesh is not None else None
    if decide is None:
        return getattr(b.mesh, "process_sharding", None) is not None if b.mesh is not None else False
    g = current()
    return bool(decide(layout, shape, g.info.engine, g.rank))


def _native_sharding(b: Backend, layout: Layout, shape: tuple[int, ...]) -> Any:
    """The framework's own sharding for ``layout`` in this group (its engine, this rank), or None
    (managed pieces)."""
    make = getattr(b.mesh, "process_sharding", None) if b.mesh is not None else None
    if make is None:
        return None
    g = current()
    return make(layout, shape, g.info.engine, g.rank)


def _build(b: Backend, piece: Any, layout: Layout, shape: tuple[int, ...], dtype: str, native: Any) -> Any:
    if native is not None:
        return b.mesh.from_local(piece, native, shape)  # type: ignore[union-attr]
    return ShardedTensor(layout, shape, dtype, b.name, (piece,))


def _local_piece_of(b: Backend, whole: Any, layout: Layout, rank: int, shape: tuple[int, ...], dtype: str,
                    fresh: bool) -> Any:
    """This rank's piece of ``whole`` (a new buffer unless ``fresh`` and uncut): zeros at a position
    other than the first along a partial axis."""
    m = layout.mesh
    c = m.coords(rank)
    box = layout.block(rank, shape)
    dev = b.device_of(whole)
    if any(c[m.axis(a)] != 0 for a in layout.partial):
        return b.full(tuple(e - s for s, e in box), False if dtype == "bool" else 0, dtype, dev)
    return cut_piece(b, whole, box, shape, dev, fresh)


def _check_layout(b: Backend, x: Any, layout: Layout, what: str) -> tuple[tuple[int, ...], str]:
    """x's shape and dtype, the layout checked against them."""
    if not is_process_layout(layout):
        raise InvalidArgumentError(f"{what} takes a multidev Layout over a ProcessMesh, got {layout!r:.80}")
    _world_mesh(layout, what)
    shape, dtype = tuple(b.shape_of(x)), b.dtype_of(x)
    layout.check_rank(len(shape), what)
    if layout.partial and dtype == "bool":
        raise InvalidArgumentError(f"{what}: partial sums of bool tensors are undefined; lay it out without partial")
    return shape, dtype


def distribute(x: Any, layout: Layout, src: int | None = 0) -> Any:
    """``x`` laid out across the group's processes by ``layout`` (over a process mesh of the
    group), each rank keeping its piece: the framework's own sharded tensor where it has one for
    this engine (a ``DTensor`` under torch, a global ``jax.Array`` under jax), else a
    :class:`~multidev.ShardedTensor` of this rank's native piece (a new buffer). Collective.

    ``src``: the rank whose ``x`` is the tensor (torch's ``src_data_rank``; the others pass a tensor
    of the same shape and dtype, which is broadcast over); ``None``: every rank's own ``x`` is taken
    as the whole (no data moves; ranks holding different values give a tensor whose pieces come
    from different wholes). Placing into a layout with partial sums puts the whole on the first
    rank along the partial axes and zeros on the others. A tensor already sharded across processes
    changes layout (moving only what each rank lacks); one sharded over one process's devices is gathered onto its
    first device first."""
    what = "distributed.distribute"
    from ..sharding import is_sharded, shards_of, unshard

    if process_layout_of(x) is not None:
        return _relayout(x, layout, what)
    if x.__class__ is ShardedTensor or is_sharded(x):
        x = unshard(x, backend_of(shards_of(x)[0]).device_of(shards_of(x)[0]))
    g = current()
    found: dict[str, Any] = {}

    def check() -> tuple[tuple[Any, ...], int]:
        if src is not None and (isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < g.world_size):
            raise InvalidArgumentError(f"{what}: src must be a rank of the group (0..{g.world_size - 1}) or None, "
                                       f"got {src!r:.40}")
        b, _ = checked_input(x, what)
        found["b"] = b
        found["shape"], found["dtype"] = _check_layout(b, x, layout, what)
        found["native"] = _native_possible(b, layout, found["shape"])
        return (layout, found["shape"], found["dtype"], src, found["native"]), 0

    _agreed(what, check)  # (the native sharding only after: making a DeviceMesh is collective)
    b, shape, dtype = found["b"], found["shape"], found["dtype"]
    native = _native_sharding(b, layout, shape) if found["native"] else None
    place = getattr(b.mesh, "process_place", None) if native is not None and b.mesh is not None else None
    if place is not None:  # the framework's own (torch's distribute_tensor: a scatter from src)
        placed = place(x, native, src)
        if placed is not None:
            return placed
    whole, fresh = x, False
    if src is not None and g.world_size > 1:
        whole = broadcast(x, src)
        fresh = whole is not x
    cut = getattr(b.mesh, "process_cut", None) if native is not None and not layout.partial else None
    if cut is not None:  # the framework's own cut of a whole it holds (JAX's make_array_from_callback)
        return cut(whole, native)
    piece = _local_piece_of(b, whole, layout, g.rank, shape, dtype, fresh)
    return _build(b, piece, layout, shape, dtype, native)


def _whole(b: Backend, piece: Any, layout: Layout, shape: tuple[int, ...], x: Any = None) -> Any:
    """The whole tensor on this rank's device, from every rank's piece (the call's record agreed
    already): the framework's own gather where its sharded type has one (``x`` native: a DTensor's
    ``full_tensor``), else partial sums added along the partial axes, then the pieces joined along
    each cut dimension's axes, within the engine's subgroups (a new buffer)."""
    if x is not None and x.__class__ is not ShardedTensor:
        native = getattr(b.mesh, "process_whole", None) if b.mesh is not None else None
        if native is not None:
            return native(x)
    m = layout.mesh
    assert isinstance(m, ProcessMesh)
    t = piece
    if layout.partial:
        t = allreduce_along_one(t, m, layout.partial, "sum", agreed=True)
    for d, entry in enumerate(layout.spec):
        if entry:
            lengths = [e - s for s, e in (layout.block(q, shape)[d] for q in range(m.size))]
            t = allgather_along_one(t, m, entry, d, agreed=lengths)
    if t is piece:  # replicated everywhere: still a new buffer
        t = b.copy(t, b.device_of(t))
    return t


def _agree_sharded(x: Any, what: str, extra: tuple[Any, ...] = ()) -> tuple[Backend, Any, Layout, tuple[int, ...],
                                                                           str]:
    """The record of a collective call on a tensor sharded across processes, agreed by every rank."""
    found: list[Any] = []

    def check() -> tuple[tuple[Any, ...], int]:
        b, piece, lay, shape, dtype = local_piece(x)
        _world_mesh(lay, what)
        found[:] = [b, piece, lay, shape, dtype]
        return (lay, shape, dtype, *extra), 0

    _agreed(what, check)
    b, piece, lay, shape, dtype = found
    return b, piece, lay, shape, dtype


def whole_of(x: Any) -> Any:
    """The whole of ``x`` (sharded across processes), as one new native tensor on this rank's
    device of its piece, on every rank (partial sums added). Collective."""
    b, piece, lay, shape, _ = _agree_sharded(x, "distributed.gather")
    return _whole(b, piece, lay, shape, x)


def _relayout(x: Any, layout: Layout, what: str) -> Any:
    """``x`` (sharded across processes) laid out by ``layout`` (over a process mesh): by the
    framework's own change of layout where both are its sharded type (a DTensor's ``redistribute``,
    a jitted resharding on JAX), else moving only what each rank lacks (:func:`_moved`); ``x`` itself
    where the layout is its own. A layout over another mesh of the group's ranks: gathered, then cut."""
    found: dict[str, Any] = {}

    def check() -> tuple[tuple[Any, ...], int]:
        b, piece, lay, shape, dtype = local_piece(x)
        found.update(b=b, piece=piece, lay=lay, shape=shape, dtype=dtype)
        _world_mesh(lay, what)
        if not is_process_layout(layout):
            raise InvalidArgumentError(f"{what} takes a multidev Layout over a ProcessMesh, got {layout!r:.80}")
        _world_mesh(layout, what)
        layout.check_rank(len(shape), what)
        if layout.partial and dtype == "bool":
            raise InvalidArgumentError(f"{what}: partial sums of bool tensors are undefined")
        found["native"] = lay != layout and _native_possible(b, layout, shape)
        return (lay, layout, shape, dtype, found["native"]), 0

    _agreed(what, check)
    if found["lay"] == layout:
        return x
    b, shape, dtype = found["b"], found["shape"], found["dtype"]
    native = _native_sharding(b, layout, shape) if found["native"] else None
    move = getattr(b.mesh, "process_relayout", None) if native is not None and x.__class__ is not ShardedTensor \
        else None
    if move is not None:
        moved = move(x, native)
        if moved is not None:
            return moved
    if found["lay"].mesh == layout.mesh:
        piece = _moved(b, found["piece"], found["lay"], layout, shape, dtype)
    else:  # another mesh of the group's ranks (its axes named or ordered otherwise): gathered, then cut
        whole = _whole(b, found["piece"], found["lay"], shape, x)
        piece = _local_piece_of(b, whole, layout, current().rank, shape, dtype, True)
    return _build(b, piece, layout, shape, dtype, native)


def _swaps(old: Layout, new: Layout, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """The dimension pairs ``(i, j)`` one all-to-all moves from ``old`` to ``new``: dimension ``i``
    cut along some axes in ``old`` and whole in ``new``, dimension ``j`` the reverse, along the
    same axes, ``i`` cut evenly (every member's tensor has one shape)."""
    def axes(lay: Layout, d: int) -> tuple[str, ...]:
        return lay.spec[d] if d < len(lay.spec) else ()

    out: list[tuple[int, int]] = []
    for i in range(len(shape)):
        a = axes(old, i)
        if not a or axes(new, i) or shape[i] % old.mesh.axis_size(a):
            continue
        for j in range(len(shape)):
            if j != i and axes(new, j) == a and not axes(old, j) and all(j not in p for p in out):
                out.append((i, j))
                break
    return out


def _moved(b: Backend, piece: Any, old: Layout, new: Layout, shape: tuple[int, ...], dtype: str) -> Any:
    """This rank's piece of the tensor laid out by ``old`` (``piece``; ``x`` the sharded tensor) in
    ``new`` (a new buffer), moving only what the ranks lack: partial sums added along ``old``'s
    partial axes; a dimension whose cut moves to another one along the same axes by one all-to-all;
    each dimension whose ``new`` piece some rank does not hold yet gathered along ``old``'s axes
    for it; then cut here. A dimension each rank already holds enough of moves nothing (from
    replicated to cut, or a finer cut). Every rank decides from the layouts and the shape alone,
    so all take the same steps. Both layouts lie on one mesh."""
    m = old.mesh
    assert isinstance(m, ProcessMesh) and m == new.mesh
    rank = current().rank
    cover = [list(old.block(r, shape)) for r in range(m.size)]  # what each rank's t holds, per dimension
    t = piece
    if old.partial:
        t = allreduce_along_one(t, m, old.partial, "sum", agreed=True)
    for i, j in _swaps(old, new, shape):
        a = old.spec[i]
        t = all_to_all_along(t, m, a, split_axis=j, concat_axis=i)
        for r in range(m.size):
            cover[r][i], cover[r][j] = (0, shape[i]), new.block(r, shape)[j]
    want = [new.block(r, shape) for r in range(m.size)]
    for d in range(len(shape)):
        if all(cover[r][d][0] <= want[r][d][0] and want[r][d][1] <= cover[r][d][1] for r in range(m.size)):
            continue  # every rank holds its new piece along d already
        a = old.spec[d] if d < len(old.spec) else ()  # (cut along d in old: a whole dimension covers all)
        t = allgather_along_one(t, m, a, d, agreed=[cover[q][d][1] - cover[q][d][0] for q in range(m.size)])
        for r in range(m.size):
            cover[r][d] = (0, shape[d])
    mine = cover[rank]
    box = tuple((s - c0, e - c0) for (s, e), (c0, _) in zip(want[rank], mine))
    if any(m.coords(rank)[m.axis(a)] != 0 for a in new.partial):  # zeros off the first rank along partial axes
        return b.full(tuple(e - s for s, e in box), False if dtype == "bool" else 0, dtype, b.device_of(t))
    return cut_piece(b, t, box, tuple(e - s for s, e in mine), b.device_of(t), t is not piece)


def from_local(piece: Any, layout: Layout, shape: Any = None) -> Any:
    """The tensor sharded across processes by ``layout`` whose piece on this rank is ``piece``
    (DTensor's ``from_local``; JAX's ``make_array_from_single_device_arrays``): the framework's own
    sharded type where it has one for this engine (no copy where it allows), else a
    :class:`~multidev.ShardedTensor` holding ``piece`` itself. Collective: the ranks' layouts,
    dtypes and ``shape`` are compared in one agreed exchange (a rank's own refusal raises there,
    CollectiveMismatchError on the others). ``shape``, the whole tensor's: given, each rank's piece
    must be its piece of it (InvalidArgumentError naming the rank); None, every rank's piece shape
    is exchanged too (one small allgather) and the pieces must make one whole
    (CollectiveMismatchError on every rank otherwise)."""
    what = "distributed.from_local"
    g = current()
    found: dict[str, Any] = {}

    def check() -> tuple[tuple[Any, ...], int]:
        if not is_process_layout(layout):
            raise InvalidArgumentError(f"{what} takes a multidev Layout over a ProcessMesh, got {layout!r:.80}")
        b, mine = checked_input(piece, what)
        m = _world_mesh(layout, what)
        layout.check_rank(len(mine), what)
        shp = None
        if shape is not None:
            if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
                raise InvalidArgumentError(f"{what}: shape must be a sequence of sizes or None, got {shape!r:.40}")
            shp = tuple(int(s) for s in shape)
            if len(shp) != len(mine) or any(s < 0 for s in shp):
                raise InvalidArgumentError(f"{what}: shape {shp} does not fit a piece of {len(mine)} dimensions")
            want = layout.shard_shape(g.rank, shp)
            if tuple(mine) != want:
                raise InvalidArgumentError(f"{what}: rank {g.rank}'s piece has shape {tuple(mine)}; its piece of {shp} "
                                           f"under {layout.spec_text()} over {m.shape} is {want}")
        dtype = b.dtype_of(piece)
        if layout.partial and dtype == "bool":
            raise InvalidArgumentError(f"{what}: partial sums of bool tensors are undefined")
        found.update(b=b, mine=tuple(mine), shp=shp, dtype=dtype)
        found["native"] = _native_possible(b, layout, shp)
        return (layout, shp, dtype, len(mine), found["native"]), 0

    _agreed(what, check)
    b, shp, dtype = found["b"], found["shp"], found["dtype"]
    if shp is None:
        shp = _agreed_shape(found["mine"], layout, what)
    native = _native_sharding(b, layout, shp) if found["native"] else None
    return _build(b, piece, layout, shp, dtype, native)


def _agreed_shape(mine: tuple[int, ...], layout: Layout, what: str) -> tuple[int, ...]:
    """The whole shape from every rank's piece shape (one allgather of a few integers)."""
    g = current()
    m = layout.mesh
    assert isinstance(m, ProcessMesh)
    words = [len(mine)] + [w for n in mine for w in divmod(int(n), 1 << 30)]  # (int32: every engine carries it)
    rows = allgather(np.asarray([words + [0] * (1 + 2 * MAX_DIMS - len(words))], dtype=np.int32), 0)
    shapes = [tuple(int(r[1 + 2 * i]) * (1 << 30) + int(r[2 + 2 * i]) for i in range(int(r[0])))
              for r in np.asarray(rows)]
    if len({len(s) for s in shapes}) > 1:
        raise CollectiveMismatchError(f"{what}: the ranks' pieces have different ranks: {shapes}")
    total = list(shapes[0])
    coords = [m.coords(r) for r in range(m.size)]
    for d, entry in enumerate(layout.spec):
        if entry:
            # the ranks of this rank's subgroup along the entry's axes: the same coordinates elsewhere
            other = [i for i, n in enumerate(m.axis_names) if n not in entry]
            here = [coords[g.rank][i] for i in other]
            firsts: dict[int, int] = {}
            for r, s in enumerate(shapes):
                if [coords[r][i] for i in other] == here:
                    firsts.setdefault(m.index_along(r, entry), s[d])
            total[d] = sum(firsts.values())
    shp = tuple(total)
    bad = [f"rank {r}: {s}, its piece of {shp} is {layout.shard_shape(r, shp)}"
           for r, s in enumerate(shapes) if s != layout.shard_shape(r, shp)]
    if bad:
        raise CollectiveMismatchError(f"{what}: the pieces do not make one tensor under {layout.spec_text()} over "
                                      f"{m.shape}: {'; '.join(bad[:4])}")
    return shp

