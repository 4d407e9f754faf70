"""Whole structures through the tensor calls (issue: real programs move containers and models):
``to``, ``copy``, ``device_of``, ``synchronize``, ``to_host`` and ``convert`` take nested lists,
tuples, named tuples and dicts, keep the structure, treat every leaf as the tensor call would, and
refuse what is no tensor with a typed error naming where it is. On NumPy's virtual devices here;
the frameworks' own trees and models are checked in their adapters' tests and the suite."""
from __future__ import annotations

import collections
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import multidev as md

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cycles import cyclic_garbage

P = collections.namedtuple("P", "w b")


def _tree(dev: str = "cpu:0") -> dict[str, Any]:
    w = md.ones((2, 3), device=dev)
    return {"layers": [P(w, md.zeros(3, device=dev)), P(md.full(3, 2.0, device=dev), None)],
            "tied": w, "step": (md.arange(3, device=dev),)}


def test_to_keeps_the_structure_and_resident_leaves_are_the_same_objects() -> None:
    t = _tree()
    same = md.to(t, "cpu:0")
    assert same["tied"] is t["tied"] and same["layers"][0].w is t["layers"][0].w
    assert type(same["layers"][0]) is P and same["layers"][1].b is None and isinstance(same["step"], tuple)
    moved = md.to(t, "cpu:1")
    assert md.device_of(moved) == md.Device("cpu", 1)
    assert moved["tied"] is moved["layers"][0].w, "a tensor reached twice (tied) stays one object"
    assert moved["tied"] is not t["tied"] and md.device_of(t) == md.Device("cpu", 0)  # the source is untouched
    np.testing.assert_array_equal(md.to_numpy(moved["layers"][1].w), np.full(3, 2.0, np.float32))


def test_dict_subclasses_and_named_tuples_come_back_as_themselves() -> None:
    x = md.ones(2)
    od = collections.OrderedDict([("b", x), ("a", x)])
    dd: collections.defaultdict[str, Any] = collections.defaultdict(list, {"k": x})
    out = md.to([od, dd], "cpu:1")
    assert type(out[0]) is collections.OrderedDict and list(out[0]) == ["b", "a"]
    assert type(out[1]) is collections.defaultdict and out[1].default_factory is list
    assert md.device_of(out) == md.Device("cpu", 1)


def test_copy_of_a_structure_copies_every_tensor() -> None:
    t = _tree()
    c = md.copy(t)
    assert c["tied"] is not t["tied"] and c["tied"] is c["layers"][0].w
    c["tied"][0, 0] = 7
    assert md.to_numpy(t["tied"])[0, 0] == 1
    assert md.device_of(md.copy(t, "cpu:1")) == md.Device("cpu", 1)


def test_device_of_a_structure_is_its_one_device_or_a_mismatch_naming_where() -> None:
    assert md.device_of(_tree("cpu:1")) == md.Device("cpu", 1)
    mixed = {"a": md.ones(1), "b": [md.ones(1, device="cpu:1")]}
    with pytest.raises(md.DeviceMismatchError, match=r"2 devices \(cpu:0: \['a'\]; cpu:1: \['b'\]\[0\]\)"):
        md.device_of(mixed)
    with pytest.raises(md.InvalidArgumentError, match="holds no tensor"):
        md.device_of([None, ()])


def test_non_blocking_to_and_to_host_of_structures() -> None:
    t = _tree()
    h = md.to(t, "cpu:1", non_blocking=True)
    got = h.wait()
    assert md.device_of(got) == md.Device("cpu", 1) and type(got["layers"][0]) is P
    host = md.to_host(t)
    assert type(host["layers"][0]) is P and type(host["layers"][0].w) is np.ndarray
    np.testing.assert_array_equal(host["step"][0], np.arange(3))
    assert md.to_host(t, non_blocking=True).wait()["tied"].shape == (2, 3)
    gen = md.to_host(x for x in [md.ones(1), [md.zeros(1)]])  # an iterable: a list, items as given
    assert isinstance(gen, list) and type(gen[1]) is list and gen[1][0][0] == 0


def test_synchronize_and_convert_take_structures() -> None:
    t = _tree()
    md.synchronize(t)
    c = md.convert(t, "numpy")
    assert c["tied"] is t["tied"], "converting to the tensor's own backend on its device is a no-op"


@pytest.mark.parametrize("call", ["to", "copy", "device_of", "convert", "to_host", "synchronize", "to_nb"])
def test_a_leaf_that_is_no_tensor_is_refused_with_its_path(call: str) -> None:
    bad = {"ok": md.ones(1), "bad": [md.ones(1), "not a tensor"]}
    calls = {"to": lambda: md.to(bad, "cpu:1"), "copy": lambda: md.copy(bad), "device_of": lambda: md.device_of(bad),
             "convert": lambda: md.convert(bad, "numpy"), "to_host": lambda: md.to_host(bad),
             "synchronize": lambda: md.synchronize(bad), "to_nb": lambda: md.to(bad, "cpu:1", non_blocking=True)}
    with pytest.raises(md.UnsupportedTensorError, match=r"\['bad'\]\[1\] is a builtins.str"):
        calls[call]()


@pytest.mark.parametrize("obj", [None, 3, object(), "x"])
def test_what_is_no_structure_keeps_the_tensor_error(obj: Any) -> None:
    for call in (lambda: md.to(obj, "cpu:0"), lambda: md.copy(obj), lambda: md.device_of(obj),
                 lambda: md.convert(obj, "numpy")):
        with pytest.raises(md.UnsupportedTensorError):
            call()


def test_a_circular_structure_is_refused_not_a_recursion_error() -> None:
    loop: list[Any] = [md.ones(1)]
    loop.append(loop)
    with pytest.raises(md.InvalidArgumentError, match="nested deeper"):
        md.to(loop, "cpu:1")


def test_native_device_and_device_scope_on_numpy() -> None:
    assert md.native_device("cpu:1") == md.Device("cpu", 1)  # NumPy's own devices are multidev's
    with pytest.raises(md.DeviceNotFoundError):
        md.native_device("gpu:0")
    with md.device_scope("cpu:1", backend="numpy") as d:
        assert d == md.Device("cpu", 1) and md.device_of(md.ones(2)) == d
    with pytest.raises(md.DeviceNotFoundError), md.device_scope("gpu:3", backend="numpy"):
        pass  # pragma: no cover


def test_structure_calls_leave_no_reference_cycle_holding_their_results() -> None:
    """A structure call's results are freed when the caller drops them, not at the next garbage
    collection: a cycle through tree_map's recursive helper kept md.to_host's pinned buffers alive on
    an H200 (CuPy then paid a fresh 50 ms cudaHostAlloc for every 64 MiB copy)."""
    import weakref

    x = md.ones((16,), device="cpu:0", backend="numpy")
    calls = {"to_host": lambda s: md.to_host(s), "to": lambda s: md.to(s, "cpu:0"),
             "copy": lambda s: md.copy(s, "cpu:0"), "device_of": md.device_of,
             "to_host non_blocking": lambda s: md.to_host(s, non_blocking=True).wait()}
    for name, call in calls.items():
        def dropped(out: Any, name: str = name) -> Callable[[], None]:
            probe = weakref.ref(out["a"][0]) if isinstance(out, dict) and hasattr(out["a"][0], "shape") else None

            def check() -> None:
                if probe is not None and probe() is not None and probe() is not x:
                    raise AssertionError(f"md.{name}'s result outlived the caller's last reference")
            return check
        found = cyclic_garbage(lambda call=call: call({"a": [x, (x, x)], "b": x}), dropped)
        assert found[-1] == 0, f"md.{name} of a structure left a reference cycle on every call: {found}"


def test_numpy_default_device_is_native_in_native_out() -> None:
    """On cpu:0 (the host) every call gives a plain numpy.ndarray, as md.to always did; the other
    virtual devices keep their tagged subclass."""
    import numpy as np

    import multidev as md

    x = np.arange(4.0)
    made = [md.copy(x, "cpu:0"), md.asarray([1.0], device="cpu:0", backend="numpy"), md.zeros(3, backend="numpy"),
            md.full(2, 1.0, backend="numpy"), md.to(md.copy(x, "cpu:1"), "cpu:0"),
            md.allreduce([md.copy(x, "cpu:0"), md.copy(x, "cpu:1")])[0], md.copy(x, "cpu:0") + 1]
    assert [type(a) for a in made] == [np.ndarray] * len(made)
    assert all(md.device_of(a) == md.device("cpu:0") for a in made)
    other = md.copy(x, "cpu:1")
    assert type(other) is not np.ndarray and md.device_of(other + 1) == md.device("cpu:1")
def test_to_of_a_resident_tuple_or_list_walks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """md.to((data, target), dev) with both already there: the tuple itself, a list as a new list of
    the same tensors, without tree_map's walk; one tensor elsewhere takes the walk and moves."""
    import multidev.api as api
    from multidev.trees import resident_container

    a = md.ones((3,), device="cpu:0", backend="numpy")
    b = md.zeros((2,), device="cpu:0", backend="numpy")
    md.device_of(a), md.device_of(b)  # the class's owner is known from here on
    walked: list[Any] = []
    real = api.tree_map
    monkeypatch.setattr(api, "tree_map", lambda *args, **kw: walked.append(args) or real(*args, **kw))
    tup = (a, b)
    assert resident_container(tup, md.device("cpu:0"))
    assert md.to(tup, "cpu:0") is tup
    lst = [a, b]
    out = md.to(lst, "cpu:0")
    assert out is not lst and out == lst and all(x is y for x, y in zip(out, lst))
    dct = {"x": a, "y": b}
    got = md.to(dct, "cpu:0")
    assert got is not dct and got == dct and all(got[k] is dct[k] for k in dct)
    assert walked == [], "a resident (data, target) is not walked"
    moved = md.to((a, b), "cpu:1")
    assert walked and all(md.device_of(t) == md.device("cpu:1") for t in moved)
    np.testing.assert_array_equal(md.to_numpy(moved[0]), np.ones(3))
    assert not resident_container((a, [b]), md.device("cpu:0")), "nested: the walk"
    assert not resident_container((), md.device("cpu:0")) and not resident_container((a, "x"), md.device("cpu:0"))


@pytest.mark.parametrize("make", [list, tuple, lambda xs: {f"k{i}": x for i, x in enumerate(xs)}])
def test_a_flat_container_of_tensors_maps_as_the_walk_does(make: Any) -> None:
    """A plain list, tuple or dict of tensors skips the walk (``_plain_map``) and gives what the walk
    gives: a tensor reached twice called once and one object, ``check`` once per adapter first, the
    container rebuilt; ``batch`` gets the distinct tensors once, in order."""
    from multidev.trees import _NOT_FLAT, _plain_map, tree_map

    a, b = md.ones(2, device="cpu:0", backend="numpy"), md.zeros(3, device="cpu:0", backend="numpy")
    md.device_of(a)  # the class's owner is known from here on
    obj = make([a, b, a])
    assert _plain_map(lambda t: t, obj, None, None, "x") is not _NOT_FLAT
    calls: list[Any] = []
    checked: list[Any] = []
    out = tree_map(lambda t: calls.append(t) or t + 1, obj, "x", check=checked.append)
    assert type(out) is type(obj) and len(calls) == 2 and checked == [md.backend("numpy")]
    vals = list(out.values()) if isinstance(out, dict) else list(out)
    assert vals[0] is vals[2] and np.array_equal(vals[1], np.ones(3))
    if isinstance(out, dict):
        assert list(out) == ["k0", "k1", "k2"]
    batches: list[list[Any]] = []
    out = tree_map(lambda t: pytest.fail("leaf called with batch="), obj, "x",
                   batch=lambda ts: batches.append(ts) or [t * 2 for t in ts])
    assert len(batches) == 1 and [id(t) for t in batches[0]] == [id(a), id(b)]
    vals = list(out.values()) if isinstance(out, dict) else list(out)
    assert vals[0] is vals[2] and np.array_equal(vals[0], np.full(2, 2.0))
    with pytest.raises(RuntimeError, match="gave 1 results for 2 tensors"):
        tree_map(lambda t: t, obj, "x", batch=lambda ts: ts[:1])


def test_batch_takes_the_distinct_tensors_of_a_nested_structure_in_order() -> None:
    """Through the walk (a nested structure, a named tuple, None kept): ``batch`` once, the distinct
    tensors in pre-order, each result put back where its tensor was (a tied tensor one object)."""
    from multidev.trees import tree_map

    t = _tree()
    seen: list[list[Any]] = []
    out = tree_map(lambda x: pytest.fail("leaf called with batch="), t, "x",
                   batch=lambda ts: seen.append(ts) or [x + 10 for x in ts])
    order = [t["layers"][0].w, t["layers"][0].b, t["layers"][1].w, t["step"][0]]
    assert len(seen) == 1 and [id(x) for x in seen[0]] == [id(x) for x in order]
    assert out["tied"] is out["layers"][0].w and out["layers"][1].b is None and type(out["layers"][0]) is P
    np.testing.assert_array_equal(out["step"][0], np.arange(3) + 10)


def test_a_flat_container_with_a_stranger_takes_the_walk_and_its_error() -> None:
    a = md.ones(2, device="cpu:0", backend="numpy")
    md.device_of(a)
    with pytest.raises(md.UnsupportedTensorError, match=r"\[1\]"):
        md.to([a, "x"], "cpu:1")
    assert md.to([], "cpu:1") == [] and md.to({}, "cpu:1") == {}


def test_to_host_of_one_tensor_and_of_a_flat_list_gives_arrays() -> None:
    """The blocking to_host of one tensor (no walk) and of a list (one walk, every copy started
    first): NumPy arrays of the values, a tensor reached twice one array."""
    a = md.arange(4, device="cpu:1")
    assert type(md.to_host(a)) is np.ndarray and md.to_host(a).tolist() == [0, 1, 2, 3]
    got = md.to_host([a, md.ones(2, device="cpu:1"), a])
    assert [type(x) for x in got] == [np.ndarray] * 3 and got[0] is got[2] and got[1].tolist() == [1, 1]


def test_a_flat_container_is_read_once_before_any_call() -> None:
    """A dict or list changed while its tensors are mapped (another thread, a leaf call with side
    effects) gives each result under its own key, from the container as it was read."""
    from multidev.trees import tree_map

    ts = {k: np.full(1, float(i)) for i, k in enumerate("abc")}
    for t in ts.values():
        md.device_of(t), md.device_of(t)  # the class's owner is cached: the walk is skipped
    d = dict(ts)

    def leaf(t: Any) -> Any:
        v = d.pop("a")  # re-inserted last: the dict's order changes mid-call
        d["a"] = v
        return t + 10

    out = tree_map(leaf, d, "x")
    assert {k: float(v[0]) for k, v in out.items()} == {"a": 10.0, "b": 11.0, "c": 12.0}
    xs = [ts["a"], ts["b"]]
    out_l = tree_map(lambda t: xs.append(t) or t, xs, "x")
    assert len(out_l) == 2


def test_nested_plain_containers_map_as_the_walk_does() -> None:
    """Python's own lists, tuples and dicts nested (empty ones too) skip the walk and give what it
    gives: the same types, keys in their order, a tied tensor one object, each tensor called once in
    pre-order; anything else inside (None, a named tuple) takes the walk."""
    from multidev.trees import _NOT_FLAT, _plain_map, tree_map

    a, b = np.ones(2), np.zeros(3)
    md.device_of(a), md.device_of(a)  # the class's owner is cached
    objs = [{"z": [a, (b, a)], "y": {}, "x": ([], {"k": b})}, [[a], (b,), {"q": a}], (a, [b, [a, (b,)]])]
    for obj in objs:
        order: list[Any] = []
        fast = tree_map(order.append, obj, "x")
        walk = tree_map(lambda t: t * 2, obj, "x", is_leaf=lambda v: False)  # (is_leaf: the walk)
        assert _plain_map(lambda t: t, obj, None, None, "x") is not _NOT_FLAT
        assert repr(tree_map(lambda t: t * 2, obj, "x")) == repr(walk)
        assert [id(t) for t in order] == [id(a), id(b)] and fast is not obj
    tied = tree_map(lambda t: t + 1, {"p": [a, a], "q": (a,)}, "x")
    assert tied["p"][0] is tied["p"][1] is tied["q"][0]
    assert list(tree_map(lambda t: t, {"z": a, "a": b}, "x")) == ["z", "a"]
    for other in ([a, None], [P(a, b)], [a, [None]], {"k": [a, "s"]}):
        assert _plain_map(lambda t: t, other, None, None, "x") is _NOT_FLAT


def test_the_nested_path_keeps_the_depth_limit_past_its_container_count() -> None:
    """``_plain_map`` counts depths only in a structure of more than MAX_DEPTH containers (no smaller
    one can be deeper): a wide one of many containers still maps, a chain deeper than the limit (with
    many containers beside it, so the count is passed before the chain is reached) still goes to the
    walk, which refuses it by name."""
    from multidev.trees import _NOT_FLAT, MAX_DEPTH, _plain_map, tree_map

    a = np.ones(2)
    md.device_of(a)
    wide = [{"w": a, "b": (a,)} for _ in range(3 * MAX_DEPTH)]
    got = tree_map(lambda t: t, wide, "x")
    assert len(got) == len(wide) and got[-1]["b"][0] is a
    assert _plain_map(lambda t: t, wide, None, None, "x") is not _NOT_FLAT
    chain: Any = [a]
    for _ in range(MAX_DEPTH + 5):
        chain = [chain]
    for deep in (chain, [*[(a,)] * (2 * MAX_DEPTH), chain], [chain, *[(a,)] * (2 * MAX_DEPTH)]):
        assert _plain_map(lambda t: t, deep, None, None, "x") is _NOT_FLAT
        with pytest.raises(md.InvalidArgumentError, match="nested deeper"):
            md.to(deep, "cpu:1")
    ok: Any = [a]
    for _ in range(MAX_DEPTH - 2):
        ok = [ok]
    assert _plain_map(lambda t: t, [*[(a,)] * (2 * MAX_DEPTH), ok], None, None, "x") is not _NOT_FLAT


def test_the_nested_path_checks_adapters_in_the_order_their_tensors_come(monkeypatch: pytest.MonkeyPatch) -> None:
    """``check`` runs once per adapter in the order of each one's first tensor (so the error of a target
    several adapters lack names the first leaf's), and a structure of more than RESIDENT_MAX nodes
    (counting those still to read) is left to the walk."""
    import types

    from multidev import trees

    class T1:
        pass

    class T2:
        pass

    owners = {T1: types.SimpleNamespace(name="one"), T2: types.SimpleNamespace(name="two")}
    monkeypatch.setattr(trees, "cached_owner", owners.get)
    for obj, want in (({"a": [T2()], "b": (T1(), T2())}, ["two", "one"]),
                      ({"a": [T1()], "b": (T2(), T1())}, ["one", "two"])):
        seen: list[str] = []
        trees._plain_map(lambda t: t, obj, lambda b, seen=seen: seen.append(b.name), None, "x")
        assert seen == want
    monkeypatch.undo()
    a = np.ones(1)
    md.device_of(a)
    m = trees.RESIDENT_MAX
    assert trees._plain_map(lambda t: t, [[a] * (m - 10), *[a] * (m - 10)], None, None, "x") is trees._NOT_FLAT
    assert trees._plain_map(lambda t: t, [[a] * 10, *[a] * (m - 20)], None, None, "x") is not trees._NOT_FLAT
