"""Collectives along the axes of a mesh, in one process: the subgroups are the devices that differ
only along the named axes (:meth:`multidev.Mesh.groups`), and each group runs the one-process
collective of :mod:`multidev.collectives` on its own tensors (what ``jax.lax.psum(x, "data")`` does
inside ``shard_map``, or ``torch.distributed.all_reduce(t, group=mesh.get_group("data"))``).

Lists in, lists out, in mesh order: ``tensors[i]`` is the tensor of ``mesh.devices[i]`` and lives
there, result ``i`` too. A :class:`~multidev.ShardedTensor`'s pieces are such a list
(``multidev.shards_of(x)``). Several axes act as one (row-major over them, in the order given), so
``allreduce_along(xs, mesh, ("a", "b"))`` reduces over the whole 2-d mesh. Everything is validated
before anything is computed; results are new tensors (none aliases an input); the semantics of
``op``, uneven pieces and determinism are the one-process collectives'.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .collectives import all_to_all, allgather, allreduce, reduce_scatter, sendrecv
from .errors import CollectiveInputError, UnsupportedTensorError, translate_errors
from .mesh import AxisNames, Mesh
from .registry import backend_of
from .validate import check_axis, check_op

__all__ = ["all_to_all_along", "allgather_along", "allreduce_along", "reduce_scatter_along", "sendrecv_along"]


def _per_device(tensors: Sequence[Any], mesh: Mesh, axes: AxisNames, what: str, *, same_shape: bool,
                op: str | None = None) -> tuple[list[Any], tuple[tuple[int, ...], ...]]:
    """The tensors, one per mesh device in mesh order on that device, of one backend and dtype
    (and shape where ``same_shape``); and the groups along ``axes`` as positions in mesh order."""
    if not isinstance(mesh, Mesh):
        raise CollectiveInputError(f"{what} takes a multidev Mesh, got {type(mesh).__name__}")
    if isinstance(tensors, (str, bytes)) or not isinstance(tensors, Sequence):
        raise CollectiveInputError(f"{what} takes a list of tensors, one per mesh device in mesh order "
                                   f"(multidev.shards_of(x) for a sharded tensor), got {type(tensors).__name__}")
    xs = list(tensors)
    if len(xs) != mesh.size:
        raise CollectiveInputError(f"{what}: the mesh has {mesh.size} devices, got {len(xs)} tensors")
    try:
        backs = [backend_of(x) for x in xs]
    except UnsupportedTensorError as e:
        raise CollectiveInputError(f"{what}: {e}") from None
    if len({b.name for b in backs}) > 1:
        raise CollectiveInputError(f"{what} got tensors of several backends ({sorted({b.name for b in backs})})")
    b = backs[0]
    dtypes = {b.dtype_of(x) for x in xs}
    if len(dtypes) > 1:
        raise CollectiveInputError(f"{what} needs one dtype; got {sorted(dtypes)}")
    wrong = [f"tensor {i} is on {b.device_of(x)}, mesh device {i} is {d}"
             for i, (x, d) in enumerate(zip(xs, mesh.devices)) if b.device_of(x) != d]
    if wrong:
        raise CollectiveInputError(f"{what}: tensors go in mesh order, each on its device: {'; '.join(wrong[:3])}")
    if same_shape and len({b.shape_of(x) for x in xs}) > 1:
        raise CollectiveInputError(f"{what} needs one shape; got {sorted({b.shape_of(x) for x in xs})}")
    if op is not None:
        check_op(op, dtypes.pop(), what)
    try:
        groups = mesh.groups(axes)
    except ValueError as e:
        raise CollectiveInputError(f"{what}: {e}") from None
    pos = {d: i for i, d in enumerate(mesh.devices)}
    return xs, tuple(tuple(pos[d] for d in g) for g in groups)


def _run(xs: list[Any], groups: tuple[tuple[int, ...], ...], fn: Callable[[list[Any]], list[Any]]) -> list[Any]:
    out: list[Any] = [None] * len(xs)
    for g in groups:
        for i, y in zip(g, fn([xs[i] for i in g])):
            out[i] = y
    return out


@translate_errors()
def allreduce_along(tensors: Sequence[Any], mesh: Mesh, axes: AxisNames, op: str = "sum", *,
                    algorithm: str = "auto", deterministic: bool = False) -> list[Any]:
    """:func:`multidev.allreduce` within each group along ``axes``: every device gets its group's
    reduction (``op``, ``algorithm`` and ``deterministic`` as there). Out of place."""
    xs, groups = _per_device(tensors, mesh, axes, "allreduce_along", same_shape=True, op=op)
    return _run(xs, groups, lambda g: allreduce(g, op, algorithm=algorithm, deterministic=deterministic))


@translate_errors()
def allgather_along(tensors: Sequence[Any], mesh: Mesh, axes: AxisNames, axis: int = 0) -> list[Any]:
    """:func:`multidev.allgather` within each group along ``axes``: every device gets its group's
    tensors joined along ``axis``, in group order (pieces may differ in length along ``axis``)."""
    xs, groups = _per_device(tensors, mesh, axes, "allgather_along", same_shape=False)
    b = backend_of(xs[0])
    ranks = {len(b.shape_of(x)) for x in xs}
    if len(ranks) > 1:
        raise CollectiveInputError(f"allgather_along needs tensors of one rank; got ranks {sorted(ranks)}")
    check_axis(axis, ranks.pop(), "allgather_along")
    return _run(xs, groups, lambda g: allgather(g, axis))


@translate_errors()
def reduce_scatter_along(tensors: Sequence[Any], mesh: Mesh, axes: AxisNames, op: str = "sum",
                         axis: int = 0) -> list[Any]:
    """:func:`multidev.reduce_scatter` within each group along ``axes``: device ``k`` of a group
    gets piece ``k`` (``numpy.array_split``'s sizes along ``axis``) of its group's reduction."""
    xs, groups = _per_device(tensors, mesh, axes, "reduce_scatter_along", same_shape=True, op=op)
    ndim = len(backend_of(xs[0]).shape_of(xs[0]))
    check_axis(axis, ndim, "reduce_scatter_along")
    return _run(xs, groups, lambda g: reduce_scatter(g, op, axis))


@translate_errors()
def all_to_all_along(tensors: Sequence[Any], mesh: Mesh, axes: AxisNames, split_axis: int = 0,
                     concat_axis: int = 0) -> list[Any]:
    """:func:`multidev.all_to_all` within each group along ``axes``: device ``k`` of a group gets
    piece ``k`` of every member's tensor (cut along ``split_axis``), joined along ``concat_axis``
    in group order."""
    xs, groups = _per_device(tensors, mesh, axes, "all_to_all_along", same_shape=True)
    ndim = len(backend_of(xs[0]).shape_of(xs[0]))
    check_axis(split_axis, ndim, "all_to_all_along")
    check_axis(concat_axis, ndim, "all_to_all_along")
    return _run(xs, groups, lambda g: all_to_all(g, split_axis, concat_axis))


@translate_errors()
def sendrecv_along(tensors: Sequence[Any], mesh: Mesh, axes: AxisNames, shift: int = 1) -> list[Any]:
    """:func:`multidev.sendrecv` within each group along ``axes``: device ``k`` of a group gets the
    tensor of the group's device ``(k - shift) % len(group)`` (the ring along an axis, ``jax.lax.ppermute``
    with a shift's permutation). New tensors, each on its device."""
    xs, groups = _per_device(tensors, mesh, axes, "sendrecv_along", same_shape=True)
    if isinstance(shift, bool) or not isinstance(shift, int):
        raise CollectiveInputError(f"sendrecv_along: shift must be an int, got {shift!r:.40}")
    return _run(xs, groups, lambda g: sendrecv(g, shift))
