"""Meshes and layouts on the backend under test: ``make_mesh`` over its devices; the framework's own
mesh both ways (``SupportsMesh``); ``multidev.to(x, layout)`` for every kind of layout (a dimension
cut along one axis, two axes, replicated, partial sums): each piece on its device with its piece's
shape and values, the whole tensor back through ``to_host`` and ``to(x, device)``, ``layout_of``,
changes of layout, ``from_shards``, and ``convert`` to each partner keeping the layout. The
framework's own sharded type (``SupportsSharding``) where it has one, multidev's ``ShardedTensor``
elsewhere; uneven pieces follow ``numpy.array_split`` or are refused with CapabilityError by a
native sharded type that cannot hold them. Runs on 1, 2 or 4 devices (a 1x1, 2x1 or 2x2 mesh).
What multidev's core decides alone (argument checks, copies) is tested in ``tests/test_mesh.py``."""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev.errors import CapabilityError, DeviceNotFoundError, InvalidArgumentError

from ._helpers import as_f64, need_dtype, sample

pytestmark = pytest.mark.md_feature("mesh")

#: The layouts of a 2-d tensor on a mesh with axes ``a`` and ``b``: (spec, partial).
LAYOUTS = [
    (("a", None), ()), ((None, "b"), ()), (("a", "b"), ()), (("b", "a"), ()), ((("a", "b"),), ()),
    ((), ()), (("a",), ("b",)), ((), ("a", "b")),
]
IDS = ["a_", "_b", "ab", "ba", "(ab)", "rep", "a+pb", "p(ab)"]
#: A shape every layout above cuts evenly on a 2x2 mesh, and one that 2 and 4 pieces cut unevenly.
EVEN, UNEVEN = (4, 8), (5, 3)


def _mesh(b: Any) -> md.Mesh:
    """A 2x2 mesh (2x1, 1x1 where fewer) over the backend's devices of one kind: the kind it has
    most of (GPUs on a tie), named explicitly (``make_mesh`` alone takes the accelerators, which a
    machine with one GPU and virtual CPU devices has too few of)."""
    devs = b.devices()
    kinds = {k: [d for d in devs if d.kind == k] for k in {d.kind for d in devs}}
    pool = max(kinds.values(), key=lambda ds: (len(ds), ds[0].is_gpu))
    n = len(pool)
    shape = (2, 2) if n >= 4 else (2, 1) if n >= 2 else (1, 1)
    return md.make_mesh(shape, ("a", "b"), devices=pool[:shape[0] * shape[1]], backend=b.name)


def _whole(b: Any, ref: np.ndarray, dtype: str) -> Any:
    return md.asarray(ref, dtype=dtype, device=b.devices()[0], backend=b.name)


def _check_pieces(b: Any, y: Any, layout: md.Layout, ref: np.ndarray) -> None:
    """Each piece on its mesh device with its piece's shape; the pieces add up to the tensor: a cut
    piece holds its slice, replicas hold equal copies, partial pieces sum to their slice."""
    m = layout.mesh
    pieces = md.shards_of(y)
    assert len(pieces) == m.size, f"{len(pieces)} pieces for a mesh of {m.size} devices"
    sums: dict[tuple, np.ndarray] = {}
    for dev, p in zip(m.devices, pieces):
        assert md.device_of(p) == dev, f"the piece for {dev} is on {md.device_of(p)}"
        assert tuple(md.backend_of(p).shape_of(p)) == layout.shard_shape(dev, ref.shape), (dev, layout)
        box = layout.block(dev, ref.shape)
        rest = tuple(i for n, i in zip(m.axis_names, m.coords(dev)) if n not in layout.partial)
        key = (box, rest)
        v = as_f64(b, p)
        sums[key] = sums[key] + v if key in sums else v
    for (box, _), total in sums.items():
        want = ref[tuple(slice(s, e) for s, e in box)].astype(np.float64)
        np.testing.assert_array_equal(total, want, err_msg=f"the pieces of {box} under {layout}")


def _refuses_uneven(b: Any, layout: md.Layout, shape: tuple[int, ...]) -> bool:
    """Whether the backend's own sharded type would hold ``layout`` but not ``shape``'s uneven
    pieces: it must then refuse with CapabilityError (checked here, before anything moves)."""
    if not (layout.uneven(shape) and not layout.partial and b.sharding is not None):
        return False
    x = _whole(b, sample("float32", shape), "float32")
    with pytest.raises(CapabilityError):
        md.to(x, layout)
    return True


# -- meshes ------------------------------------------------------------------------------------------
def test_make_mesh_uses_distinct_devices_of_the_backend(md_backend: Any) -> None:
    b = md_backend
    m = _mesh(b)
    assert set(m.devices) <= set(b.devices()) and len(set(m.devices)) == m.size == m.shape[0] * m.shape[1]
    assert len({d.kind for d in m.devices}) == 1
    assert sorted(d for g in m.groups("a") for d in g) == sorted(m.devices)
    assert m == md.Mesh(m.shape, m.axis_names, m.devices) and hash(m) == hash(md.Mesh(m.shape, ("a", "b"), m.devices))
    assert pickle.loads(pickle.dumps(m)) == m
    again = md.make_mesh(m.shape, ("a", "b"), devices=list(m.devices[::-1]), backend=b.name)
    assert sorted(again.devices) == sorted(m.devices)  # (the framework may reorder them for its hardware)
    with pytest.raises(DeviceNotFoundError):
        md.make_mesh((len(b.devices()) + 1,), ("a",), backend=b.name)


@pytest.mark.md_requires("SupportsMesh")
def test_native_mesh_round_trip(md_backend: Any) -> None:
    b = md_backend
    m = _mesh(b)
    for kind in b.mesh.native_mesh_kinds():
        try:
            native = md.to_native_mesh(m, b.name, kind=kind)
        except CapabilityError as e:
            pytest.skip(f"{b.name} cannot make a {kind} mesh of {m.size} devices in one process: {str(e)[:160]}")
        assert md.from_native_mesh(native, backend=b.name) == m, f"{kind}: {native!r}"


# -- layouts -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["made", "reversed"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize(("spec", "partial"), LAYOUTS, ids=IDS)
def test_layout_places_each_piece_on_its_device(md_backend: Any, spec: tuple, partial: tuple, dtype: str,
                                                 order: str) -> None:
    """On make_mesh's mesh and on one whose devices run the other way (so mesh order is not the
    devices' own order)."""
    b = md_backend
    need_dtype(b, dtype)
    m = _mesh(b)
    if order == "reversed":
        m = md.Mesh(m.shape, m.axis_names, m.devices[::-1])
    layout = md.Layout(m, spec, partial=partial)
    ref = sample(dtype, EVEN, low=-3, high=4)
    x = _whole(b, ref, dtype)
    y = md.to(x, layout)
    assert md.layout_of(y) == layout
    if isinstance(y, md.ShardedTensor):
        assert y.backend == b.name and y.dtype == dtype and y.shape == EVEN
    else:
        assert md.backend_of(y).name == b.name, "a native sharded tensor of the backend itself"
    _check_pieces(b, y, layout, ref)
    np.testing.assert_array_equal(as_f64(b, x), ref.astype(np.float64), err_msg="placement changed its source")


@pytest.mark.parametrize(("spec", "partial"), LAYOUTS, ids=IDS)
def test_layout_round_trip(md_backend: Any, spec: tuple, partial: tuple) -> None:
    """to_host and to(x, device) give the whole tensor back (partial pieces added up)."""
    b = md_backend
    layout = md.Layout(_mesh(b), spec, partial=partial)
    for shape in (EVEN, UNEVEN):
        if _refuses_uneven(b, layout, shape):
            continue
        ref = sample("float32", shape, low=-3, high=4)
        y = md.to(_whole(b, ref, "float32"), layout)
        np.testing.assert_array_equal(md.to_host(y), ref, err_msg=f"to_host of {layout}")
        for dev in (layout.mesh.devices[-1], b.devices()[0]):
            z = md.to(y, dev)
            assert md.device_of(z) == dev
            np.testing.assert_array_equal(as_f64(b, z), ref.astype(np.float64), err_msg=f"to({dev}) of {layout}")


def test_uneven_pieces_follow_array_split(md_backend: Any) -> None:
    b = md_backend
    m = _mesh(b)
    layout = md.Layout(m, (("a", "b"),))
    if m.size == 1:
        pytest.skip("one device: no piece is uneven")
    if _refuses_uneven(b, layout, UNEVEN):
        return
    ref = sample("float32", UNEVEN)
    y = md.to(_whole(b, ref, "float32"), layout)
    sizes = [len(p) for p in np.array_split(np.arange(UNEVEN[0]), m.size)]
    assert [md.backend_of(p).shape_of(p)[0] for p in md.shards_of(y)] == sizes
    _check_pieces(b, y, layout, ref)


@pytest.mark.parametrize(("spec", "partial"), LAYOUTS, ids=IDS)
def test_change_of_layout(md_backend: Any, spec: tuple, partial: tuple) -> None:
    """From each layout to every other one: pieces on their devices, values kept."""
    b = md_backend
    m = _mesh(b)
    ref = sample("float32", EVEN, low=-3, high=4)
    y = md.to(_whole(b, ref, "float32"), md.Layout(m, spec, partial=partial))
    for spec2, partial2 in LAYOUTS:
        target = md.Layout(m, spec2, partial=partial2)
        z = md.to(y, target)
        assert md.layout_of(z) == target
        _check_pieces(b, z, target, ref)
    assert md.to(y, md.Layout(m, spec, partial=partial)) is y, "placing by its own layout is a no-op"
    np.testing.assert_array_equal(md.to_host(y), ref, err_msg="a change of layout changed its source")


@pytest.mark.parametrize(("spec", "partial"), LAYOUTS, ids=IDS)
def test_from_shards_rebuilds_the_tensor(md_backend: Any, spec: tuple, partial: tuple) -> None:
    b = md_backend
    layout = md.Layout(_mesh(b), spec, partial=partial)
    ref = sample("float32", EVEN, low=-3, high=4)
    y = md.to(_whole(b, ref, "float32"), layout)
    z = md.from_shards(md.shards_of(y), layout)
    assert md.layout_of(z) == layout
    np.testing.assert_array_equal(md.to_host(z), ref)
    with pytest.raises(InvalidArgumentError):
        md.from_shards(list(reversed(md.shards_of(y))), layout) if layout.mesh.size > 1 else \
            md.from_shards([], layout)


def test_convert_keeps_the_layout(md_backend: Any, md_partner_name: str) -> None:
    """convert of a sharded tensor, piece by piece: the partner's pieces on the same devices, the
    same layout, the same values (no gather)."""
    b = md_backend
    m = _mesh(b)
    missing = [str(d) for d in m.devices if d not in md.devices(backend=md_partner_name)]
    if missing:
        pytest.skip(f"{md_partner_name} has no device {', '.join(missing)} (where the pieces live)")
    ref = sample("float32", EVEN, low=-3, high=4)
    for spec, partial in LAYOUTS:
        layout = md.Layout(m, spec, partial=partial)
        y = md.to(_whole(b, ref, "float32"), layout)
        c = md.convert(y, md_partner_name)
        assert md.layout_of(c) == layout
        assert all(md.backend_of(p).name == md_partner_name for p in md.shards_of(c))
        _check_pieces(md.backend(md_partner_name), c, layout, ref)


# -- collectives along mesh axes -------------------------------------------------------------------
#: Axis selections of a mesh with axes a and b: each alone, both (either order).
AXES = ["a", "b", ("a", "b"), ("b", "a")]


def _locals(b: Any, m: md.Mesh, shape: tuple[int, ...], dtype: str) -> tuple[list[np.ndarray], list[Any]]:
    refs = [sample(dtype, shape, seed=i, low=-3, high=4) for i in range(m.size)]
    return refs, [md.asarray(r, dtype=dtype, device=d, backend=b.name) for r, d in zip(refs, m.devices)]


def _groups(m: md.Mesh, axes: Any) -> list[list[int]]:
    return [[m.devices.index(d) for d in g] for g in m.groups(axes)]


@pytest.mark.parametrize("axes", AXES, ids=["a", "b", "ab", "ba"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_collectives_along_mesh_axes(md_backend: Any, axes: Any, dtype: str) -> None:
    """allreduce, allgather, reduce_scatter and all_to_all within each group along the axes, against
    NumPy per group; results on their devices; inputs unchanged."""
    b = md_backend
    need_dtype(b, dtype)
    m = _mesh(b)
    refs, xs = _locals(b, m, (5, 3), dtype)
    for op, fn in (("sum", np.sum), ("max", np.max)):
        out = md.allreduce_along(xs, m, axes, op)
        for g in _groups(m, axes):
            want = fn(np.stack([refs[i] for i in g]).astype(np.float64), axis=0)
            for i in g:
                np.testing.assert_array_equal(as_f64(b, out[i]), want, err_msg=f"{op} along {axes}, device {i}")
    gathered = md.allgather_along(xs, m, axes, axis=1)
    scattered = md.reduce_scatter_along(xs, m, axes, "sum", axis=0)
    swapped = md.all_to_all_along(xs, m, axes, split_axis=0, concat_axis=1)
    for g in _groups(m, axes):
        total = np.sum(np.stack([refs[i] for i in g]).astype(np.float64), axis=0)
        for k, i in enumerate(g):
            np.testing.assert_array_equal(as_f64(b, gathered[i]), np.concatenate([refs[j] for j in g], 1))
            np.testing.assert_array_equal(as_f64(b, scattered[i]), np.array_split(total, len(g), 0)[k])
            np.testing.assert_array_equal(
                as_f64(b, swapped[i]), np.concatenate([np.array_split(refs[j], len(g), 0)[k] for j in g], 1))
    for outs in (gathered, scattered, swapped):
        assert [md.device_of(y) for y in outs] == list(m.devices)
    for r, x in zip(refs, xs):
        np.testing.assert_array_equal(as_f64(b, x), r.astype(np.float64), err_msg="a collective changed its input")
    with pytest.raises(md.CollectiveInputError):
        md.allreduce_along(xs[::-1] if m.size > 1 else xs[:0], m, axes)


@pytest.mark.parametrize(("split_axis", "concat_axis"), [(0, 0), (0, 1), (1, 0)])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_all_to_all_matches_numpy(md_backend: Any, n: int, split_axis: int, concat_axis: int) -> None:
    """Device i sends piece j of its tensor (array_split along split_axis, pieces may be empty) to
    device j, which joins what it gets along concat_axis in list order."""
    b = md_backend
    devs = [d for d in b.devices() if d.kind == b.devices()[0].kind]
    if len(devs) < n:
        pytest.skip(f"needs {n} devices; this backend has {len(devs)} here")
    refs = [sample("int32", (5, 2), seed=i, low=-9, high=9) for i in range(n)]
    xs = [md.asarray(r, dtype="int32", device=d, backend=b.name) for r, d in zip(refs, devs)]
    out = md.all_to_all(xs, split_axis, concat_axis)
    for j, (y, d) in enumerate(zip(out, devs)):
        want = np.concatenate([np.array_split(r, n, split_axis)[j] for r in refs], concat_axis)
        assert md.device_of(y) == d
        np.testing.assert_array_equal(as_f64(b, y), want.astype(np.float64))
    for r, x in zip(refs, xs):
        np.testing.assert_array_equal(as_f64(b, x), r.astype(np.float64))
