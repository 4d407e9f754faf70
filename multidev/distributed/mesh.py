"""A mesh of the processes of a ``multidev.distributed`` group, and collectives along its axes.

:func:`process_mesh` lays the group's ranks out on a grid with named axes, row-major (rank ``r`` at
the ``r``-th place: the last axis over neighbouring ranks, which launchers put on one machine). The
subgroups along some axes are the ranks that differ only there (:meth:`ProcessMesh.groups`); the
collectives along axes reduce, gather, scatter or exchange within each subgroup at once, every rank
of the group taking part (as ``jax.lax.psum(x, "data")`` inside ``shard_map``, or torch's
``all_reduce(t, group=mesh.get_group("data"))`` called on every rank). :func:`all_to_all` and the
ring :func:`sendrecv` act on the whole group. Each takes a tensor or a structure of tensors (lists,
tuples, named tuples, dicts, a framework's tree: one agreed exchange of its leaf count and
signature, then leaf by leaf, the structure rebuilt around the results).

How: every call is one small checked exchange over the whole group (each rank's record of the
call: which collective, the mesh, the axes, the op and axes of the tensor, its length along the
gathered axis; ranks that disagree raise CollectiveMismatchError on every rank, naming them, before
anything else moves), then the data moves within each subgroup only, on the engine's own subgroups
(:meth:`Engine.split`: torch's ``new_subgroups_by_enumeration``, MPI's ``Comm.Split``, a JAX
computation over the subgroup's devices; made once per partition, at its first use), with the
timeouts and typed errors of the whole-group collectives. An engine without subgroups runs them
over one whole-group allgather (every rank receives ``world_size`` times the tensor's bytes), each
rank computing its part locally, in a fixed order. :func:`all_to_all` sends each member its block
(the engine's all-to-all: torch's ``all_to_all_single``, MPI's ``Ialltoall``, a jitted transpose
on JAX), or gathers every block within the subgroup where the engine has no all-to-all. The ring
:func:`sendrecv` sends each rank's tensor to one neighbour (point-to-point, :mod:`.p2p`) on engines
whose messages match by peer, as a collective elsewhere.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import (
    CapabilityError,
    CollectiveInputError,
    CollectiveMismatchError,
    DistributedError,
    InvalidArgumentError,
    UnsupportedTensorError,
    translate_errors,
)
from ..mesh import AxisNames, ProcessMesh, check_axis_names, mesh_shape
from ..registry import backend_of, get_backend, installed_backends
from ..structured import rebuild, structure_leaves
from ..trees import owner_or_structure
from ..validate import check_axis, check_op, check_writable
from .collectives import allgather, blocks_of, carried_kind, holding, landed, mean_of, narrow, pad_to, working
from .consistency import MAX_DIMS, Call, agree
from .engine import Engine, Handle
from .group import current
from .handles import run
from .p2p import recv, send
from .transport import Origin, from_transport, to_transport

__all__ = ["ProcessMesh", "all_to_all", "all_to_all_along", "allgather_along", "allreduce_along", "from_native_mesh",
           "process_mesh", "reduce_scatter_along", "sendrecv", "to_native_mesh"]


def process_mesh(shape: int | Sequence[int], axis_names: AxisNames) -> ProcessMesh:
    """The current group's ranks on a grid of ``shape`` (``prod(shape) == world_size``) with
    ``axis_names``; InvalidArgumentError where the sizes do not fit the world."""
    shp = mesh_shape(shape)
    names = check_axis_names(axis_names)
    if len(names) != len(shp) or len(set(names)) != len(names):
        raise InvalidArgumentError(f"process_mesh: {len(shp)} axis sizes {shp} need as many distinct names, "
                                   f"got {names}")
    n = current().world_size
    if math.prod(shp) != n:
        raise InvalidArgumentError(f"process_mesh: a grid of {shp} holds {math.prod(shp)} ranks, the group has {n}")
    return ProcessMesh(shp, names)


def to_native_mesh(mesh: ProcessMesh, backend: str | None = None) -> Any:
    """The framework's own mesh of the group's processes, laid out as ``mesh``: torch's
    ``DeviceMesh`` under the torch engine, a ``jax.sharding.Mesh`` of each process's device under
    the jax engine. CapabilityError where the backend has none, or not under this engine."""
    if not isinstance(mesh, ProcessMesh):
        raise InvalidArgumentError(f"to_native_mesh takes a ProcessMesh (multidev.distributed.process_mesh), got "
                                   f"{type(mesh).__name__}; a mesh of one process's devices: multidev.to_native_mesh")
    g = current()
    if mesh.size != g.world_size:
        raise InvalidArgumentError(f"to_native_mesh: the process mesh holds {mesh.size} ranks, the group "
                                   f"{g.world_size}")
    b = get_backend(backend)
    make = getattr(b.mesh, "to_native_process_mesh", None) if b.mesh is not None else None
    if make is None:
        raise CapabilityError(f"{b.name} has no mesh of processes of its own (torch: DeviceMesh; jax: "
                              "jax.sharding.Mesh)")
    with translate_errors(f"{b.name} to_native_mesh"):
        return make(mesh.shape, mesh.axis_names, g.info.engine)


def from_native_mesh(obj: Any) -> ProcessMesh:
    """The process mesh of a framework's own mesh over the group's processes (a ``DeviceMesh``,
    a ``jax.sharding.Mesh`` of one device per process), ranks row-major; CapabilityError for one
    laid out otherwise, InvalidArgumentError for what is no such mesh."""
    g = current()
    root = type(obj).__module__.split(".")[0]
    for name, framework in installed_backends().items():
        if framework.split(".")[0] != root:  # only the backend of the object's own framework
            continue
        b = get_backend(name)
        read = getattr(b.mesh, "from_native_process_mesh", None) if b.mesh is not None else None
        if read is None:
            continue
        with translate_errors(f"{name} from_native_mesh"):
            found = read(obj)
        if found is not None:
            shape, names = found
            if math.prod(shape) != g.world_size:
                raise CapabilityError(f"from_native_mesh: the mesh holds {math.prod(shape)} processes, the group "
                                      f"{g.world_size}")
            return ProcessMesh(tuple(int(n) for n in shape), tuple(names))
    raise InvalidArgumentError(f"from_native_mesh: {type(obj).__name__} is no framework's mesh of processes that a "
                               "loaded backend knows (torch DeviceMesh, jax.sharding.Mesh)")


# -- the agreed call -------------------------------------------------------------------------------
def _fingerprint(*parts: Any) -> int:
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


def agree_call(what: str, check: Callable[[], tuple[tuple[Any, ...], int]],
               made: dict[str, Any] | None = None) -> list[int]:
    """This rank's checks (``check()`` gives its record of the call and its length along the
    gathered axis), then every rank's record compared in one consistency exchange (the group's
    channel, as every collective's): a rank whose own checks failed raises its error and the
    others CollectiveMismatchError naming it; ranks that called differently raise
    CollectiveMismatchError on every rank. Returns every rank's length. ``made``: what ``check``
    made for the call (its transport tensor), dropped where the call raises."""
    g = current()
    mine: list[Any] = []

    def local() -> Call:
        record, length = check()
        mine.append(record)
        return Call("along", sig=_fingerprint(what, *record), shape=(length,))

    try:
        try:
            calls = agree(g, "along", local)
        except BaseException:
            if made is not None:
                made.clear()  # (an exception the caller keeps keeps no copy of the tensors)
            raise
    except CollectiveMismatchError as e:
        raise CollectiveMismatchError(f"{what}: the ranks called it differently (the mesh, axes, op, shape or dtype "
                                      f"differ from rank {g.rank}'s {mine[0] if mine else '?'}): {e}") from None
    except DistributedError as e:
        if type(e) is not DistributedError:  # a timeout: as it is
            raise
        raise CollectiveMismatchError(f"{what}: {e}") from None  # another rank refused its own input
    assert isinstance(calls, list)  # "along" always exchanges; never async
    return [int(c.shape[0]) if c.shape else 0 for c in calls]


def _everyone(x: Any) -> tuple[Any, list[Any]]:
    """Every rank's ``x`` (same shape), on this rank: ``(backend, [x of rank 0, ...])``."""
    b = backend_of(x)
    shape = b.shape_of(x)
    stacked = allgather(b.reshape(x, (1, *shape)), 0)
    return b, [b.reshape(p, shape) for p in b.split(stacked, [1] * current().world_size, 0)]


def _split(mesh: ProcessMesh, axes: AxisNames, group: tuple[int, ...]) -> Engine | None:
    """The engine of the subgroups along ``axes`` (None: none, or a subgroup of one rank, whose
    collectives are local)."""
    if len(group) == 1:
        return None
    return current().split(mesh.groups(axes))


def _within(what: str, x: Any, start: Callable[[Any], tuple[Handle, tuple[Any, ...]]],
            finish: Callable[[Any, Origin], Any], sent: Any = None) -> Any:
    """A primitive of a subgroup's engine on x's transport tensor (a private copy where the engine
    writes into its inputs; ``sent``: x's transport, as :func:`checked_input` made it), waited for
    with the group's timeout and errors; ``finish`` turns its result into the caller's."""
    g = current()

    def go() -> tuple[Handle, Callable[[Any], Any]]:
        t, origin, _, _ = working(x, g, False, sent=sent)
        h, held = start(t)
        return h, holding(lambda res: finish(res, origin), t, *held)

    return run(g, what, go, False, probe=False)


def _fold(b: Any, parts: Sequence[Any], op: str) -> Any:
    acc = parts[0]
    for p in parts[1:]:
        acc = b.combine("sum" if op == "mean" else op, acc, p)
    if len(parts) == 1:
        acc = b.copy(acc, b.device_of(acc))
    return b.divide(acc, len(parts)) if op == "mean" else acc


def checked_input(x: Any, what: str) -> tuple[Any, tuple[int, ...]]:
    """x's backend and shape, and that the group can carry its dtype (CapabilityError naming the
    engine otherwise) and its engine would take x (:meth:`Engine.admit`, for the engine's own kind
    of tensor: a deleted JAX array, a sparse torch tensor): refused inside the agreed exchange,
    before anything moves, also where the transport tensor is made later (``agreed`` calls)."""
    try:
        b = backend_of(x)
    except UnsupportedTensorError as e:
        raise CollectiveInputError(f"{what} takes a tensor: {e}") from None
    g = current()
    carried_kind(g, b, x, b.dtype_of(x), what)
    if b.name == g.engine.tensors:
        g.engine.admit(x)
    return b, b.shape_of(x)


def _sent(x: Any, group: tuple[int, ...], agreed: bool = False) -> Any:
    """x's transport tensor (:func:`to_transport`'s), made in the call's checks so that a tensor the
    engine cannot send (a sparse one) is refused there, before any rank sends, where a subgroup of
    several ranks will send it; None (made where the primitive starts, if at all) where the subgroup
    is this rank alone, or where the caller's exchange was agreed already (a failure then marks the
    group unusable, as the primitive's start does)."""
    return to_transport(x, current()) if len(group) > 1 and not agreed else None


def _group(mesh: Any, axes: AxisNames) -> tuple[int, ...]:
    """This rank's subgroup along ``axes`` of ``mesh``; InvalidArgumentError for what is no process
    mesh or names none of its axes."""
    if not isinstance(mesh, ProcessMesh):
        raise InvalidArgumentError(f"expected a ProcessMesh (multidev.distributed.process_mesh), got "
                                   f"{type(mesh).__name__}")
    return mesh.group_of(current().rank, axes)


def _op_name(op: Any, what: str) -> str:
    """``op``, a reduction's name (the dtype rules are checked per tensor)."""
    check_op(op, "float32", what)
    return str(op)


def _over_leaves(x: Any, what: str, one: Callable[[Any], Any], gathered: int | None = None,
                 valid: Callable[[], Any] | None = None) -> Any:
    """``one(x)`` for a tensor; for a structure (lists, tuples, named tuples, dicts, a framework's
    tree), one agreed exchange of its leaf count and signature first (ranks whose leaves differ
    raise CollectiveMismatchError on every rank; a structure this rank refuses, its own error),
    then ``one`` leaf by leaf, the structure rebuilt around the results. ``gathered``: the axis
    whose lengths may differ between ranks (left out of the signature); ``valid``: the checks of the
    call's other arguments, made inside the agreed exchange."""
    try:
        tree = owner_or_structure(x) is None
    except (UnsupportedTensorError, CollectiveInputError):
        tree = False  # neither: one(x) refuses it, inside its agreed exchange
    if not tree:
        return one(x)
    found: dict[str, Any] = {}

    def check() -> tuple[tuple[Any, ...], int]:
        if valid is not None:  # the call's own arguments, even for a structure without tensors
            valid()
        found["lv"] = lv = structure_leaves(x, what)
        shapes = None
        if gathered is not None:
            axes = [check_axis(gathered, len(shp), what) for shp in lv.shapes]
            shapes = [shp[:a] + shp[a + 1:] for shp, a in zip(lv.shapes, axes)]
        return ("structure", len(lv.tensors), lv.signature(shapes=shapes)), 0

    agree_call(what, check)
    lv = found["lv"]
    return rebuild(x, lv, [one(t) for t in lv.tensors], what)


def _sizes(length: int, n: int) -> list[int]:
    q, r = divmod(length, n)
    return [q + 1] * r + [q] * (n - r)


# -- collectives along axes ------------------------------------------------------------------------
def allreduce_along(x: Any, mesh: ProcessMesh, axes: AxisNames, op: str = "sum", *, inplace: bool = False) -> Any:
    """The reduction (``op``: sum, mean, max, min, prod) of ``x`` over this rank's subgroup along
    ``axes``, reduced in group order; a new tensor of x's backend on x's device, or with
    ``inplace=True`` ``x`` itself written (mutable backends; CapabilityError elsewhere, agreed by
    every rank before anything moves) and returned (a structure: each leaf written)."""
    return _over_leaves(x, "distributed.allreduce_along", lambda t: allreduce_along_one(t, mesh, axes, op, inplace),
                        valid=lambda: (_group(mesh, axes), _op_name(op, "distributed.allreduce_along")))


def allreduce_along_one(x: Any, mesh: ProcessMesh, axes: AxisNames, op: str = "sum", inplace: bool = False,
                     agreed: bool = False) -> Any:
    """:func:`allreduce_along` of one tensor (``agreed``: the caller's own agreed exchange covered
    this call's record, so none here: :mod:`.layouts` gathers under one exchange)."""
    what = "distributed.allreduce_along"
    found: dict[str, Any] = {}

    def check() -> tuple[tuple[Any, ...], int]:
        b, shape = checked_input(x, what)
        check_op(op, b.dtype_of(x), what)
        if not isinstance(inplace, bool):
            raise InvalidArgumentError(f"{what}: inplace must be True or False, got {inplace!r:.40}")
        if inplace:
            check_writable(b, x, f"{what}(inplace=True)")
        found["group"] = _group(mesh, axes)
        found["sent"] = _sent(x, found["group"], agreed)
        return (mesh, check_axis_names(axes), op, shape, b.dtype_of(x), inplace), 0

    if agreed:
        check()
    else:
        agree_call(what, check, found)
    group = found["group"]
    if len(group) == 1:  # a subgroup of one rank (an axis of size 1): its own tensor, nothing moves
        if inplace:
            return x
        b = backend_of(x)
        return b.copy(x, b.device_of(x))
    sub = _split(mesh, axes, group)
    g = current()
    if sub is not None:
        n, base = len(group), "sum" if op == "mean" else op

        def go() -> tuple[Handle, Callable[[Any], Any]]:
            t, origin, shared, through = working(x, g, inplace, sent=found["sent"])
            return sub.allreduce(t, base), holding(
                lambda res: landed(mean_of(res, op, n), t, origin, x, inplace, shared, through), t)
        return run(g, what, go, False, probe=False)
    b, parts = _everyone(x)
    out = _fold(b, [parts[r] for r in group], op)
    if inplace:
        b.assign(x, out)
        return x
    return out


def allgather_along(x: Any, mesh: ProcessMesh, axes: AxisNames, axis: int = 0) -> Any:
    """The concatenation along ``axis`` of the subgroup's tensors, in group order (lengths along
    ``axis`` may differ); a new tensor on x's device."""
    return _over_leaves(x, "distributed.allgather_along", lambda t: allgather_along_one(t, mesh, axes, axis), axis,
                        valid=lambda: _group(mesh, axes))


def allgather_along_one(x: Any, mesh: ProcessMesh, axes: AxisNames, axis: int = 0,
                     agreed: list[int] | None = None) -> Any:
    """:func:`allgather_along` of one tensor (``agreed``: every rank's length along ``axis``, known
    to the caller, whose own agreed exchange covered this call's record: none here)."""
    what = "distributed.allgather_along"
    found: dict[str, Any] = {}

    def check() -> tuple[tuple[Any, ...], int]:
        b, shape = checked_input(x, what)
        found["axis"] = ax = check_axis(axis, len(shape), what)
        found["group"] = _group(mesh, axes)
        found["sent"] = _sent(x, found["group"], agreed is not None)
        return (mesh, check_axis_names(axes), ax, len(shape), b.dtype_of(x)), shape[ax]

    if agreed is not None:
        check()
        lengths = agreed
    else:
        lengths = agree_call(what, check, found)
    b, ax, group = backend_of(x), found["axis"], found["group"]
    if len(group) == 1:  # a subgroup of one rank: its own tensor, nothing moves
        return b.copy(x, b.device_of(x))
    sub = _split(mesh, axes, group)
    if sub is not None:
        mine = [lengths[r] for r in group]

        def gather(t: Any) -> tuple[Handle, tuple[Any, ...]]:
            p = current().engine.prepare(pad_to(t, max(mine), ax))[0]
            return sub.allgather(p), (p,)

        def joined(res: Any, origin: Origin) -> Any:
            parts = [narrow(p, ax, n) for p, n in zip(res, mine)]
            return from_transport(backend_of(parts[0]).concat(parts, ax), origin)
        return _within(what, x, gather, joined, found["sent"])
    pieces = b.split(allgather(x, ax), lengths, ax)
    out = b.concat([pieces[r] for r in group], ax)
    return b.copy(out, b.device_of(out)) if len(group) == 1 else out


def reduce_scatter_along(x: Any, mesh: ProcessMesh, axes: AxisNames, op: str = "sum", axis: int = 0) -> Any:
    """Piece ``k`` (``numpy.array_split`` sizes along ``axis``) of the subgroup's reduction, on the
    subgroup's ``k``-th rank."""
    return _over_leaves(x, "distributed.reduce_scatter_along", lambda t: _reduce_scatter_along(t, mesh, axes, op, axis),
                        valid=lambda: (_group(mesh, axes), _op_name(op, "distributed.reduce_scatter_along")))


def _reduce_scatter_along(x: Any, mesh: ProcessMesh, axes: AxisNames, op: str = "sum", axis: int = 0) -> Any:
    what = "distributed.reduce_scatter_along"
    found: dict[str, Any] = {}

    def check() -> tuple[tuple[Any, ...], int]:
        b, shape = checked_input(x, what)
        check_op(op, b.dtype_of(x), what)
        found.update(axis=check_axis(axis, len(shape), what), group=_group(mesh, axes), shape=shape)
        found["sent"] = _sent(x, found["group"])
        return (mesh, check_axis_names(axes), op, found["axis"], shape, b.dtype_of(x)), 0

    agree_call(what, check, found)
    group, ax = found["group"], found["axis"]
    if len(group) == 1:  # a subgroup of one rank: the whole of its own tensor, nothing moves
        b = backend_of(x)
        return b.copy(x, b.device_of(x))
    sub = _split(mesh, axes, group)
    if sub is not None:
        sizes, k, base = _sizes(found["shape"][ax], len(group)), group.index(current().rank), \
            "sum" if op == "mean" else op

        def scatter(t: Any) -> tuple[Handle, tuple[Any, ...]]:
            blocks = blocks_of(current(), t, sizes, ax)
            return sub.reduce_scatter(blocks, base), (blocks,)
        return _within(what, x, scatter, lambda res, origin: from_transport(
            mean_of(narrow(res, ax, sizes[k]), op, len(group)), origin), found["sent"])
    b, parts = _everyone(x)
    total = _fold(b, [parts[r] for r in group], op)
    piece = b.split(total, _sizes(found["shape"][ax], len(group)), ax)[group.index(current().rank)]
    return b.copy(piece, b.device_of(total))


def all_to_all_along(x: Any, mesh: ProcessMesh, axes: AxisNames, split_axis: int = 0, concat_axis: int = 0) -> Any:
    """Within the subgroup along ``axes``: rank ``k`` gets piece ``k`` (``numpy.array_split`` sizes
    along ``split_axis``) of every member's tensor, joined along ``concat_axis`` in group order."""
    return _over_leaves(x, "distributed.all_to_all_along",
                        lambda t: _all_to_all_along(t, mesh, axes, split_axis, concat_axis),
                        valid=lambda: _group(mesh, axes))


def _all_to_all_along(x: Any, mesh: ProcessMesh, axes: AxisNames, split_axis: int = 0, concat_axis: int = 0) -> Any:
    what = "distributed.all_to_all_along"
    found: dict[str, Any] = {}

    def check() -> tuple[tuple[Any, ...], int]:
        b, shape = checked_input(x, what)
        found.update(sa=check_axis(split_axis, len(shape), what), ca=check_axis(concat_axis, len(shape), what),
                     group=_group(mesh, axes), shape=shape)
        found["sent"] = _sent(x, found["group"])
        return (mesh, check_axis_names(axes), found["sa"], found["ca"], shape, b.dtype_of(x)), 0

    agree_call(what, check, found)
    group, sa, ca = found["group"], found["sa"], found["ca"]
    if len(group) == 1:  # a subgroup of one rank: its own tensor, nothing moves
        b = backend_of(x)
        return b.copy(x, b.device_of(x))
    sizes, k = _sizes(found["shape"][sa], len(group)), group.index(current().rank)
    sub = _split(mesh, axes, group)
    if sub is not None:
        e = type(sub)
        if e.all_to_all is not Engine.all_to_all:  # each block to its member: the tensor's bytes move once
            def exchange(t: Any) -> tuple[Handle, tuple[Any, ...]]:
                blocks = blocks_of(current(), t, sizes, sa)
                return sub.all_to_all(blocks), (blocks,)

            def joined(res: Any, origin: Origin) -> Any:
                parts = [narrow(p, sa, sizes[k]) for p in res]
                return from_transport(backend_of(parts[0]).concat(parts, ca), origin)
            return _within(what, x, exchange, joined, found["sent"])

        def swapped(res: Any, origin: Origin) -> Any:
            tb = backend_of(res[0])
            return from_transport(tb.concat([tb.split(p, sizes, sa)[k] for p in res], ca), origin)
        return _within(what, x, lambda t: (sub.allgather(t), ()), swapped, found["sent"])
    b, parts = _everyone(x)
    out = b.concat([b.split(parts[r], sizes, sa)[k] for r in group], ca)
    return b.copy(out, b.device_of(out)) if len(group) == 1 else out


def all_to_all(x: Any, split_axis: int = 0, concat_axis: int = 0) -> Any:
    """Over the whole group: rank ``r`` gets piece ``r`` of every rank's tensor (``numpy.array_split``
    sizes along ``split_axis``), joined along ``concat_axis`` in rank order."""
    n = current().world_size
    return all_to_all_along(x, ProcessMesh((n,), ("world",)), "world", split_axis, concat_axis)


def sendrecv(x: Any, shift: int = 1) -> Any:
    """The ring exchange: rank ``r`` sends ``x`` to rank ``(r + shift) % world_size`` and returns
    the tensor rank ``(r - shift) % world_size`` sent (same shape and dtype on every rank)."""
    return _over_leaves(x, "distributed.sendrecv", lambda t: _sendrecv(t, shift))


def _sendrecv(x: Any, shift: int = 1) -> Any:
    what = "distributed.sendrecv"
    g = current()

    def check() -> tuple[tuple[Any, ...], int]:
        if isinstance(shift, bool) or not isinstance(shift, int):
            raise CollectiveInputError(f"{what}: shift must be an int, got {shift!r:.40}")
        b, shape = checked_input(x, what)
        if len(shape) > MAX_DIMS:  # (a message's header holds that many)
            raise CollectiveInputError(f"{what}: at most {MAX_DIMS} dimensions, got a {len(shape)}-d tensor")
        return (shift % g.world_size, shape, b.dtype_of(x)), 0

    agree_call(what, check)
    e = type(g.engine)
    if shift % g.world_size and e.matches_by_peer and e.send is not Engine.send and e.recv is not Engine.recv:
        b = backend_of(x)
        out = send(x, (g.rank + shift) % g.world_size, async_op=True)
        got = recv((g.rank - shift) % g.world_size, backend=b.name, device=b.device_of(x))
        assert out is not None
        out.wait()
        return got
    b, parts = _everyone(x)
    src = parts[(g.rank - shift) % g.world_size]
    return b.copy(src, b.device_of(src))
