"""The mesh and layouts: what multidev's core decides alone, on NumPy's virtual devices (the values
``Mesh`` and ``Layout``, argument checks, copies, the rules for partial sums and uneven pieces, which
pieces a change of layout moves, the frozen container). The adapters' side is the conformance
suite's (``conformance_tests/test_mesh.py``); the frameworks' own meshes and sharded arrays are in
``tests/test_mesh_frameworks.py``."""
from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import multidev as md
from multidev.adapters import numpy as npa
from multidev.mesh import block_bounds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cycles import cyclic_garbage


@pytest.fixture
def four() -> Iterator[None]:
    """NumPy with four virtual devices, restored afterwards."""
    old = len(md.devices(backend="numpy"))
    npa.set_device_count(4)
    yield
    npa.set_device_count(old)


def _m(shape: tuple[int, ...] = (2, 2), names: tuple[str, ...] = ("a", "b")) -> md.Mesh:
    return md.Mesh(shape, names, [md.cpu(i) for i in range(int(np.prod(shape)))])


# -- Mesh ---------------------------------------------------------------------------------------------
def test_mesh_is_a_frozen_hashable_value() -> None:
    m = _m()
    assert m == _m() and hash(m) == hash(_m()) and len({m, _m()}) == 1
    assert m != md.Mesh((2, 2), ("a", "b"), [md.cpu(i) for i in (1, 0, 2, 3)])
    assert m != md.Mesh((4,), ("a",), m.devices) and m != _m((2, 2), ("a", "c"))
    assert pickle.loads(pickle.dumps(m)) == m
    with pytest.raises(AttributeError):
        m.shape = (4,)  # type: ignore[misc]
    assert repr(m) == "Mesh({'a': 2, 'b': 2}, devices=[cpu:0, cpu:1, cpu:2, cpu:3])"
    assert str(m).splitlines() == ["Mesh a=2 x b=2", "   cpu:0  cpu:1", "   cpu:2  cpu:3"]
    assert (m.size, m.ndim, m.sizes) == (4, 2, {"a": 2, "b": 2})


def test_mesh_positions_and_groups() -> None:
    m = _m((2, 3), ("x", "y"))
    assert m.coords(md.cpu(4)) == (1, 1) and m.device_at((1, 2)) == md.cpu(5)
    assert [m.device_at(m.coords(d)) for d in m.devices] == list(m.devices)
    assert m.groups("y") == ((md.cpu(0), md.cpu(1), md.cpu(2)), (md.cpu(3), md.cpu(4), md.cpu(5)))
    assert m.groups("x") == ((md.cpu(0), md.cpu(3)), (md.cpu(1), md.cpu(4)), (md.cpu(2), md.cpu(5)))
    assert m.groups(("y", "x"))[0] == (md.cpu(0), md.cpu(3), md.cpu(1), md.cpu(4), md.cpu(2), md.cpu(5))
    assert m.groups(()) == tuple((d,) for d in m.devices)
    assert [m.index_along(d, ("x", "y")) for d in m.devices] == list(range(6))
    assert [m.index_along(d, ("y", "x")) for d in m.devices] == [0, 2, 4, 1, 3, 5]
    assert m.axis_size(("x", "y")) == 6


@pytest.mark.parametrize(("args", "match"), [
    (((0,), ("a",), []), "ints >= 1"), (((2,), ("a", "b"), [md.cpu(0), md.cpu(1)]), "1 axis sizes"),
    (((2, 1), ("a", "a"), [md.cpu(0), md.cpu(1)]), "distinct"), (((2,), ("a",), [md.cpu(0)]), "needs 2 devices"),
    (((2,), ("a",), [md.cpu(0), md.cpu(0)]), "distinct"), (((1,), ("a",), ["cpu:0"]), "Device values"),
    (((1,), ("",), [md.cpu(0)]), "non-empty"), ((True, ("a",), [md.cpu(0)]), "int or a sequence"),
])
def test_mesh_refuses_what_does_not_fit(args: tuple, match: str) -> None:
    with pytest.raises(md.InvalidArgumentError, match=match):
        md.Mesh(*args)
    with pytest.raises(md.InvalidArgumentError, match="no axis 'z'"):
        _m().axis("z")
    with pytest.raises(md.InvalidArgumentError, match="not on this mesh"):
        _m().coords(md.cpu(9))


# -- Layout -------------------------------------------------------------------------------------------
def test_layout_is_a_normalized_value() -> None:
    m = _m()
    assert md.Layout(m, ("a", None)) == md.Layout(m, ["a"]) == md.Layout(m, (("a",), ()))
    assert md.Layout(m, (None, None)) == md.Layout(m) and md.Layout(m).replicated == ("a", "b")
    lay = md.Layout(m, (("a", "b"), None), partial=())
    assert lay.spec == (("a", "b"),) and lay.pieces(0) == 4 and lay.pieces(1) == 1
    assert md.Layout(m, ("a",), partial="b").partial == ("b",)
    assert md.Layout(m, ("a",), partial="b") != md.Layout(m, ("a",))
    assert pickle.loads(pickle.dumps(lay)) == lay and hash(lay) == hash(md.Layout(m, [("a", "b")]))
    assert repr(md.Layout(m, (None, "b"), partial="a")).endswith("(None, 'b'), partial=('a',))")
    assert md.Layout(m, ("a",)).spec_text() == "('a',)"


@pytest.mark.parametrize(("spec", "partial", "match"), [
    (("c",), (), "no axis 'c'"), (("a", "a"), (), "named more than once"), (("a",), ("a",), "more than once"),
    ("a", (), "one entry per tensor dimension"), ((3,), (), "name or a sequence of names"), (([3],), (), "non-empty strings"), ((), ("z",), "no axis"),
])
def test_layout_refuses_unknown_or_repeated_axes(spec: Any, partial: Any, match: str) -> None:
    with pytest.raises(md.InvalidArgumentError, match=match):
        md.Layout(_m(), spec, partial=partial)
    with pytest.raises(md.InvalidArgumentError, match="takes a multidev Mesh"):
        md.Layout("mesh", ())  # type: ignore[arg-type]


def test_pieces_follow_array_split() -> None:
    m = _m()
    lay = md.Layout(m, (("a", "b"),))
    sizes = [len(p) for p in np.array_split(np.arange(7), 4)]
    assert [lay.shard_shape(d, (7, 3)) for d in m.devices] == [(s, 3) for s in sizes]
    assert [block_bounds(7, 4, i) for i in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert [block_bounds(2, 4, i)[1] - block_bounds(2, 4, i)[0] for i in range(4)] == [1, 1, 0, 0]
    assert lay.uneven((7, 3)) == [(0, 7, 4)] and lay.uneven((8, 3)) == []
    b = md.Layout(m, ("b", "a"))
    assert b.block(md.cpu(1), (4, 6)) == ((2, 4), (0, 3)) and b.block(md.cpu(2), (4, 6)) == ((0, 2), (3, 6))


# -- make_mesh ----------------------------------------------------------------------------------------
def test_make_mesh_over_numpy_devices(four: None) -> None:
    m = md.make_mesh((2, 2), ("a", "b"), backend="numpy")
    assert m == _m()
    assert md.make_mesh(3, "x", backend="numpy").devices == (md.cpu(0), md.cpu(1), md.cpu(2))
    given = md.make_mesh((2,), ("x",), devices=["cpu:3", md.cpu(1)], backend="numpy")
    assert given.devices == (md.cpu(3), md.cpu(1)), "without a mesh factory of its own, the order given"
    with pytest.raises(md.DeviceNotFoundError, match="MULTIDEV_NUMPY_DEVICES=8"):
        md.make_mesh((2, 4), ("a", "b"), backend="numpy")
    with pytest.raises(md.InvalidArgumentError, match="needs 2 devices, got 1"):
        md.make_mesh((2,), ("x",), devices=["cpu:0"], backend="numpy")
    with pytest.raises(md.InvalidArgumentError, match="distinct"):
        md.make_mesh((2,), ("x",), devices=["cpu:0", "cpu:0"], backend="numpy")
    with pytest.raises(md.DeviceNotFoundError):
        md.make_mesh((2,), ("x",), devices=["cpu:0", "cpu:7"], backend="numpy")
    with pytest.raises(md.CapabilityError, match="no mesh type of its own"):
        md.to_native_mesh(m, "numpy")


def test_from_native_mesh_reads_any_mesh_of_device_spellings() -> None:
    class KerasLike:  # a Keras DeviceMesh's attributes, no framework needed
        shape = (2, 2)
        axis_names: ClassVar[list[str]] = ["a", "b"]
        devices = np.array([["cpu:0", "cpu:1"], ["cpu:2", "cpu:3"]])

    assert md.from_native_mesh(KerasLike()) == _m()
    assert md.from_native_mesh(_m()) == _m()
    with pytest.raises(md.InvalidArgumentError, match="no mesh"):
        md.from_native_mesh(object())


# -- placement: managed shards ------------------------------------------------------------------------
def _x(shape: tuple[int, ...] = (4, 6), dtype: str = "float32") -> tuple[np.ndarray, Any]:
    ref = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    return ref, md.asarray(ref, device="cpu:0", backend="numpy")


def test_placement_copies_and_is_a_no_op_by_its_own_layout(four: None) -> None:
    ref, x = _x()
    ys = [md.to(x, md.Layout(_m(), spec)) for spec in [("a", "b"), (), (None, "b")]]
    x[...] = -1
    for y in ys:
        np.testing.assert_array_equal(md.to_host(y), ref)
        for p in y.shards:
            assert not np.shares_memory(md.to_numpy(p), md.to_numpy(x))
    y = ys[0]
    assert md.to(y, y.layout) is y
    y.shards[0][...] = 7  # the pieces are the framework's own writable tensors
    assert (md.to_host(y)[:2, :3] == 7).all()
    back = md.to(y, "cpu:0")
    assert not any(np.shares_memory(md.to_numpy(back), md.to_numpy(p)) for p in y.shards)


def test_whole_tensor_into_partial_sums(four: None) -> None:
    """The value lands on the first device along the partial axes, zeros on the others."""
    ref, x = _x()
    y = md.to(x, md.Layout(_m(), ("a",), partial="b"))
    assert [float(np.abs(p).sum()) > 0 for p in y.shards] == [True, False, True, False]
    np.testing.assert_array_equal(md.to_numpy(y.shards[2]), ref[2:])
    np.testing.assert_array_equal(md.to_host(y), ref)
    s = md.to(y, md.Layout(_m(), ("a",)))  # partial sums added along b
    np.testing.assert_array_equal(md.to_numpy(s.shards[1]), ref[:2])
    kept = md.to(y, md.Layout(_m(), (None, "a"), partial="b"))  # the partial axis kept: no sums
    assert float(np.abs(kept.shards[1]).sum()) == 0 and float(np.abs(kept.shards[3]).sum()) == 0
    np.testing.assert_array_equal(md.to_host(kept), ref)


def test_a_change_of_layout_moves_only_missing_pieces(four: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """('a', None) -> ('a', 'b'): every device cuts its piece from what it has; ('a', 'b') -> ('a',
    None): each device fetches one piece (an allgather along b), never the whole tensor."""
    ref, x = _x()
    y = md.to(x, md.Layout(_m(), ("a",)))
    b = md.backend("numpy")
    moved: list[tuple[int, ...]] = []
    real = type(b).move

    def counting(self: Any, t: Any, dev: Any) -> Any:
        moved.append(t.shape)
        return real(self, t, dev)

    monkeypatch.setattr(type(b), "move", counting)
    z = md.to(y, md.Layout(_m(), ("a", "b")))
    assert moved == []
    np.testing.assert_array_equal(md.to_host(z), ref)
    w = md.to(z, md.Layout(_m(), ("a",)))
    assert moved == [(2, 3)] * 4
    np.testing.assert_array_equal(md.to_host(w), ref)


def test_the_container_is_frozen_and_reports_itself(four: None) -> None:
    _, x = _x()
    lay = md.Layout(_m(), ("a", "b"))
    y = md.to(x, lay)
    assert isinstance(y, md.ShardedTensor) and (y.shape, y.dtype, y.backend, y.ndim) == ((4, 6), "float32", "numpy", 2)
    assert md.layout_of(y) == lay and md.shards_of(y) == list(y.shards) and y.devices == lay.mesh.devices
    assert md.dtype_of(y) == "float32"  # the public query answers for the container as device_of does
    assert y.shard("cpu:3") is y.shards[3]
    assert repr(y).startswith("ShardedTensor(numpy float32[4, 6], Layout(")
    with pytest.raises(AttributeError, match="frozen"):
        y.layout = lay  # type: ignore[misc]
    with pytest.raises(AttributeError, match="frozen"):
        del y.shards
    with pytest.raises(TypeError, match="to_host"):
        pickle.dumps(y)
    with pytest.raises(md.DeviceMismatchError, match="layout_of"):
        md.device_of(y)
    one = md.to(x, md.Layout(md.Mesh((1,), ("a",), [md.cpu(2)]), ("a",)))
    assert md.device_of(one) == md.cpu(2)
    assert md.layout_of(x) is None and md.shards_of(x) == [x]
    with pytest.raises(md.UnsupportedTensorError):
        md.layout_of("x")
    md.synchronize(y)  # every piece
    h = md.to_host(y, non_blocking=True)
    assert isinstance(h, md.Transfer) and h.wait().shape == (4, 6)


def test_bad_placements_are_refused_and_change_nothing(four: None) -> None:
    ref, x = _x()
    m = _m()
    with pytest.raises(md.InvalidArgumentError, match="cuts 3 dimensions"):
        md.to(x, md.Layout(m, ("a", None, "b")))
    with pytest.raises(md.InvalidArgumentError, match="bool"):
        md.to(md.asarray(ref > 3, backend="numpy"), md.Layout(m, (), partial="a"))
    with pytest.raises(md.DeviceNotFoundError):
        md.to(x, md.Layout(md.Mesh((2,), ("a",), [md.cpu(0), md.cpu(9)]), ("a",)))
    with pytest.raises(md.InvalidArgumentError, match="non_blocking"):
        md.to(x, md.Layout(m, ("a",)), non_blocking=True)
    for structure in ([x], {"w": x}):
        with pytest.raises(md.InvalidArgumentError, match="takes one tensor"):
            md.to(structure, md.Layout(m, ("a",)))
    np.testing.assert_array_equal(x, ref)
    y = md.to(x, md.Layout(m, ("a",)))
    with pytest.raises(md.InvalidArgumentError, match="keeps its mesh"):
        md.convert(y, "numpy", device="cpu:0")


def test_from_shards_checks_the_pieces(four: None) -> None:
    ref, x = _x((7, 2))
    lay = md.Layout(_m(), (("a", "b"),))
    pieces = md.shards_of(md.to(x, lay))
    assert [p.shape[0] for p in pieces] == [2, 2, 2, 1]
    z = md.from_shards(pieces, lay)
    assert z.shape == (7, 2) and all(a is b for a, b in zip(z.shards, pieces)), "no copy"
    np.testing.assert_array_equal(md.to_host(z), ref)
    with pytest.raises(md.InvalidArgumentError, match="4 devices, got 3"):
        md.from_shards(pieces[:3], lay)
    with pytest.raises(md.InvalidArgumentError, match="piece 0 on cpu:1, not cpu:0"):
        md.from_shards([pieces[1], pieces[0], *pieces[2:]], lay)
    with pytest.raises(md.InvalidArgumentError, match="piece 3 on cpu:3 has shape"):
        md.from_shards(pieces, lay, shape=(8, 2))
    with pytest.raises(md.InvalidArgumentError, match="several dtypes"):
        md.from_shards([*pieces[:3], md.zeros((1, 2), dtype="int32", device="cpu:3", backend="numpy")], lay)


def test_edge_shapes_and_dtypes(four: None) -> None:
    """0-d, empty and length-1 tensors, bfloat16, complex and wrapping int8 partial sums, and a
    change of layout onto another mesh over the same devices in another order."""
    m = _m()
    x = md.asarray(np.float32(3.5), backend="numpy")
    for lay in (md.Layout(m), md.Layout(m, (), partial="a")):
        y = md.to(x, lay)
        assert [p.shape for p in y.shards] == [()] * 4 and float(md.to_host(y)) == 3.5
        assert float(md.to_numpy(md.to(y, "cpu:2"))) == 3.5
    empty = md.to(md.asarray(np.zeros((0, 3), np.float32), backend="numpy"), md.Layout(m, ("a", "b")))
    assert [p.shape for p in empty.shards] == [(0, 2), (0, 1), (0, 2), (0, 1)] and md.to_host(empty).shape == (0, 3)
    one = md.to(md.asarray(np.array([7.0]), backend="numpy"), md.Layout(m, (("a", "b"),)))
    assert [p.shape for p in one.shards] == [(1,), (0,), (0,), (0,)]
    assert md.to_numpy(md.to(one, "cpu:3")).tolist() == [7.0]
    if "bfloat16" in md.backend("numpy").capabilities.dtypes:
        bf = md.asarray(np.arange(8.0, dtype=np.float32).reshape(4, 2), dtype="bfloat16", backend="numpy")
        y = md.to(bf, md.Layout(m, ("a",), partial="b"))
        assert md.to_host(y).dtype.name == "bfloat16"
        assert md.to_host(md.to(y, md.Layout(m, (None, "b")))).astype(np.float32).ravel().tolist() == list(range(8))
    c = md.asarray(np.arange(4.0) + 1j, dtype="complex64", backend="numpy")
    np.testing.assert_array_equal(md.to_host(md.to(c, md.Layout(m, (), partial=("a", "b")))), np.arange(4.0) + 1j)
    i8 = md.asarray(np.array([100, -100], np.int8), backend="numpy")
    part = md.to(i8, md.Layout(m, (), partial="a"))
    assert md.to_host(md.to(part, md.Layout(m))).tolist() == [100, -100]
    other = md.Mesh((4,), ("z",), [md.cpu(i) for i in (3, 1, 0, 2)])
    ref = np.arange(12.0).reshape(6, 2)
    y = md.to(md.asarray(ref, backend="numpy"), md.Layout(m, ("a",), partial="b"))
    for lay in (md.Layout(other, ("z",)), md.Layout(other, (), partial="z")):
        z = md.to(y, lay)
        assert [md.device_of(p) for p in z.shards] == list(other.devices)
        np.testing.assert_array_equal(md.to_host(z), ref)


def test_creation_replans_when_the_device_is_gone(four: None) -> None:
    """md.zeros/ones keep a plan per (backend, device, dtype); a device the backend no longer has
    (NumPy's virtual devices made fewer) is refused, not created on."""
    assert md.device_of(md.zeros(3, device="cpu:3", backend="numpy")) == md.cpu(3)
    npa.set_device_count(2)
    with pytest.raises(md.DeviceNotFoundError, match="cpu:3"):
        md.zeros(3, device="cpu:3", backend="numpy")
    with pytest.raises(md.DeviceNotFoundError, match="cpu:3"):
        md.ones((2, 2), device="cpu:3", backend="numpy")


def test_structures_of_sharded_tensors(four: None) -> None:
    """A structure may hold ShardedTensors beside tensors: to a device gathers them, to_host gives
    whole arrays, copy copies every piece (layout kept) or gathers into a new buffer, synchronize
    waits on every piece, device_of names the devices; each as for the ShardedTensor alone."""
    ref, x = _x()
    m = _m()
    s = md.to(x, md.Layout(m, ("a", "b")))
    tree = {"w": s, "b": x, "n": None, "t": (s,)}
    moved = md.to(tree, "cpu:1")
    assert moved["n"] is None and md.device_of(moved["w"]) == md.cpu(1) == md.device_of(moved["t"][0])
    assert (md.to_numpy(moved["w"]) == ref).all() and (md.to_numpy(moved["t"][0]) == ref).all()
    host = md.to_host(tree)
    assert isinstance(host["w"], np.ndarray) and (host["w"] == ref).all() and (host["t"][0] == ref).all()
    copied = md.copy(tree)
    assert md.layout_of(copied["w"]) == md.layout_of(s)
    for a, b in zip(md.shards_of(copied["w"]), md.shards_of(s)):
        assert md.device_of(a) == md.device_of(b) and (md.to_numpy(a) == md.to_numpy(b)).all()
        assert not np.shares_memory(np.asarray(a), np.asarray(b))
    whole = md.copy(s, "cpu:2")
    assert md.device_of(whole) == md.cpu(2) and (md.to_numpy(whole) == ref).all()
    replicated = md.to(x, md.Layout(m, ()))
    one = md.copy(replicated, "cpu:0")
    assert all(not np.shares_memory(np.asarray(one), np.asarray(p)) for p in md.shards_of(replicated))
    md.synchronize(tree)
    with pytest.raises(md.DeviceMismatchError, match="4 devices"):
        md.device_of({"w": s})
    assert md.device_of({"w": md.to(x, md.Layout(md.Mesh((1,), ("a",), [md.cpu(2)]), ("a",)))}) == md.cpu(2)
    with pytest.raises(md.UnsupportedTensorError):  # a collective takes tensors: a sharded leaf is refused, typed
        md.allreduce([{"w": s}, {"w": s}])


def test_creation_follows_the_default_backend_and_refuses_huge_shapes_of_numpy_ints(four: None) -> None:
    """md.zeros/ones without backend= follow set_default_backend (their plans are per backend name);
    a shape of NumPy integers is checked against the host memory as one of ints is."""
    pytest.importorskip("torch")
    md.backend("torch")
    try:
        md.set_default_backend("torch")
        assert type(md.zeros(3)).__module__.startswith("torch")
        md.set_default_backend("numpy")
        assert isinstance(md.zeros(3), np.ndarray) and isinstance(md.ones((2,)), np.ndarray)
    finally:
        md.set_default_backend(None)
    for shape in ((np.int64(10**5), np.int64(10**6)), (10**5, np.int64(10**6)), [10**5, 10**6]):
        with pytest.raises(md.OutOfMemoryError, match="more than this machine"):
            md.zeros(shape, backend="numpy")


def test_non_blocking_moves_of_structures_gather_their_sharded_leaves(four: None) -> None:
    ref, x = _x()
    s = md.to(x, md.Layout(_m(), ("a", "b")))
    t = md.to({"w": s, "b": x}, "cpu:2", non_blocking=True)
    out = t.wait()
    assert md.device_of(out["w"]) == md.cpu(2) and (md.to_numpy(out["w"]) == ref).all()
    with pytest.raises(md.DeviceMismatchError, match=r"\['w'\]"):
        md.device_of({"w": s})


def test_the_ring_between_devices_and_along_an_axis(four: None) -> None:
    """md.sendrecv: device i gets device (i - shift)'s tensor, a copy on its own device; along a mesh
    axis the ring runs within each group."""
    devs = md.devices("numpy")
    xs = [md.asarray(np.full(3, float(i)), device=d, backend="numpy") for i, d in enumerate(devs[:4])]
    ys = md.sendrecv(xs, shift=1)
    assert [float(md.to_numpy(y)[0]) for y in ys] == [3.0, 0.0, 1.0, 2.0]
    assert [md.device_of(y) for y in ys] == devs[:4] and not any(y is x for y, x in zip(ys, xs))
    assert [float(md.to_numpy(y)[0]) for y in md.sendrecv(xs, shift=-1)] == [1.0, 2.0, 3.0, 0.0]
    mesh = md.make_mesh((2, 2), ("a", "b"), devices=devs[:4], backend="numpy")
    zs = md.sendrecv_along([xs[devs.index(d)] for d in mesh.devices], mesh, "b")
    for g in mesh.groups("b"):
        pos = [mesh.devices.index(d) for d in g]
        got = [float(md.to_numpy(zs[p])[0]) for p in pos]
        sent = [float(md.to_numpy(xs[devs.index(mesh.devices[p])])[0]) for p in pos]
        assert got == [sent[-1], *sent[:-1]]
    with pytest.raises(md.CollectiveInputError, match="shift"):
        md.sendrecv(xs, shift=0.5)  # type: ignore[arg-type]
    with pytest.raises(md.CollectiveInputError, match="one shape"):
        md.sendrecv([xs[0], md.asarray(np.ones(2), device=devs[1], backend="numpy")])


def test_placement_leaves_no_reference_cycle(four: None) -> None:
    """Placing, relaying out and gathering a sharded tensor free their temporaries (the source pieces a
    move made) by reference counting: the recursive helper that stitches a block used to be a closure
    cycle that held them until a garbage collection (100, 132 and 47 objects a call)."""
    mesh = md.Mesh((2, 2), ("a", "b"), [md.cpu(i) for i in range(4)])
    x = md.asarray(np.arange(24.0).reshape(4, 6), backend="numpy")
    y = md.to(x, md.Layout(mesh, ("a", "b")))
    calls = {"place": lambda: md.to(x, md.Layout(mesh, ("a", "b"))),
             "relayout": lambda: md.to(y, md.Layout(mesh, ("b", None))),
             "gather": lambda: md.to(y, md.cpu(1))}
    for name, make in calls.items():
        make()
        found = cyclic_garbage(make)
        assert not found[-1], f"{name} left cyclic garbage on every call: {found}"
