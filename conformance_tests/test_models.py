"""Structures, models and scopes: ``to``/``copy``/``device_of``/``to_host``/``convert`` of nested
containers of the backend's tensors on every device (the structure kept, resident tensors the same
objects, tied tensors one object), ``SupportsModels``' claim on what is no model, and
``SupportsDeviceScope``: the framework's own default device follows the scope, nested, restored
after it, per thread."""
from __future__ import annotations

import collections
import importlib.util
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device

from ._helpers import as_f64

pytestmark = pytest.mark.md_feature("models")

Pair = collections.namedtuple("Pair", "w b")


def _tree(b: Any, dev: Device) -> dict[str, Any]:
    w = md.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), device=dev, backend=b.name)
    return {"layers": [Pair(w, md.zeros(3, device=dev, backend=b.name)), Pair(w, None)], "step": (w,)}


def test_structures_move_whole_and_keep_their_shape(md_backend: Any, md_device: Device, md_devices: list) -> None:
    """The core's structure path over this backend's tensors (no adapter method of its own: the
    adapter's moves, copies and host copies, leaf by leaf)."""
    b = md_backend
    t = _tree(b, md_device)
    same = md.to(t, md_device)
    assert same["layers"][0].w is t["layers"][0].w, "a resident tensor of a structure is the same object"
    assert type(same["layers"][0]) is Pair and same["layers"][1].b is None and isinstance(same["step"], tuple)
    assert md.device_of(t) == md_device
    others = [d for d in md_devices if d != md_device]
    if not others:
        return  # one device: the resident half is what can be checked
    target = others[0]
    moved = md.to(t, target)
    assert md.device_of(moved) == target and md.device_of(t) == md_device
    assert moved["layers"][0].w is moved["layers"][1].w is moved["step"][0], "tied tensors stay one object"
    np.testing.assert_array_equal(as_f64(b, moved["layers"][1].w), np.arange(6).reshape(2, 3))
    landed = md.to(t, target, non_blocking=True).wait()
    assert md.device_of(landed) == target
    host = md.to_host(moved)
    assert type(host["layers"][0]) is Pair and type(host["layers"][0].w) is np.ndarray
    c = md.copy(t)
    assert c["step"][0] is not t["step"][0] and md.device_of(c) == md_device
    with pytest.raises(md.DeviceMismatchError, match="2 devices"):
        md.device_of([t, moved])


@pytest.mark.md_requires("SupportsModels")
def test_model_kind_claims_no_tensor_and_no_plain_container(md_backend: Any, md_device: Device) -> None:
    """``model_kind`` names the framework's own trees and models only: never one of its tensors, a
    Python container, a scalar or a string (claiming them would take every call's tensors apart)."""
    b = md_backend
    x = md.ones(2, device=md_device, backend=b.name)
    for obj in (x, [x], (x,), {"a": x}, Pair(x, x), 1.5, "s", None, np.ones(2)):
        assert b.models.model_kind(obj) is None, f"{b.name}.model_kind claims {type(obj).__name__}"


@pytest.mark.md_requires("SupportsDeviceScope")
def test_the_framework_default_device_follows_the_scope(md_backend: Any, md_devices: list) -> None:
    """Inside ``md.device_scope(dev, backend=...)`` the framework's own default device is ``dev``
    (``current_device``), for every device; a nested scope wins and its exit restores the outer one;
    the exit of the outer scope restores what was there; another thread keeps its own default."""
    b = md_backend
    before = b.scope.current_device()
    for dev in md_devices:
        with md.device_scope(dev, backend=b.name):
            now = b.scope.current_device()
            assert now == dev, f"inside device_scope({dev}) {b.name}'s default is {now}"
            for inner in [d for d in md_devices if d != dev][:1]:
                with md.device_scope(inner, backend=b.name):
                    assert b.scope.current_device() == inner
                assert b.scope.current_device() == dev, "leaving a nested scope restores the outer one"
                seen: list[Any] = []
                t = threading.Thread(target=lambda out=seen: out.append(b.scope.current_device()))
                t.start()
                t.join()
                assert seen == [before], f"another thread saw {seen}: a scope is per thread"
        assert b.scope.current_device() == before, "leaving the scope restores the default it replaced"


# -- the framework's own modules: moved in place, copied whole, buffers included ----------------------
def _framework(b: Any) -> Any:
    return sys.modules.get(b.framework)


def _module_kit(b: Any) -> Any:
    """The framework module, where it has modules of the ``nn.Module`` kind (a base class with
    ``register_buffer``, a ``Parameter`` type): found by what the framework exposes, never by name."""
    fw = _framework(b)
    nn = getattr(fw, "nn", None)
    base, param = getattr(nn, "Module", None), getattr(nn, "Parameter", None)
    if not (isinstance(base, type) and isinstance(param, type) and hasattr(base, "register_buffer")):
        pytest.skip(f"{b.name}'s framework has no nn.Module with nn.Parameter and register_buffer (the models "
                    "these checks build; its own models are checked by model_kind and the structure checks)")
    return fw


_CLASSES: dict[tuple[int, str], type] = {}


def _user_class(fw: Any, kind: str) -> type:
    """A user's own subclass of the framework's module base (one class per framework and kind, so
    a scripting compiler sees one definition): ``"full"`` has a parameter, a buffer and a
    non-persistent buffer; ``"buffer"`` and ``"scratch"`` hold only a buffer, persistent or not."""
    key = (id(fw), kind)
    if key in _CLASSES:
        return _CLASSES[key]

    class UserModel(fw.nn.Module):
        def __init__(self, w: Any, stat: Any, scratch: Any) -> None:
            super().__init__()
            if w is not None:
                self.w = fw.nn.Parameter(w)
            if stat is not None:
                self.register_buffer("stat", stat)
            if scratch is not None:
                self.register_buffer("scratch", scratch, persistent=False)

        def forward(self, x):  # unannotated: a scripting compiler reads x as a tensor
            return x * self.w + self.stat

    _CLASSES[key] = UserModel
    return UserModel


def _model(b: Any, fw: Any, dev: Device, kind: str = "full") -> Any:
    t = {name: md.asarray(np.arange(3, dtype=np.float32) + k, device=dev, backend=b.name)
         for k, name in enumerate(("w", "stat", "scratch"))}
    if kind == "buffer":
        t["w"] = t["scratch"] = None
    elif kind == "scratch":
        t["w"] = t["stat"] = None
    return _user_class(fw, kind)(t["w"], t["stat"], t["scratch"])


def _tensors(m: Any) -> list[Any]:
    """Every parameter and buffer of ``m`` as the framework lists them (not the adapter's list)."""
    return [*m.parameters(), *m.buffers()]


def _quiet(fn: Callable[..., Any], *args: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecations of the framework's own compilers
        return fn(*args)


@pytest.mark.md_requires("SupportsModels")
def test_a_model_moves_in_place_and_its_optimizer_follows(md_backend: Any, md_devices: list) -> None:
    """``md.to(model, dev)`` is the same model, moved in place (its Parameters the same objects, on
    ``dev``), on its own device and on every other: an optimizer built before the move then updates
    the tensors the model uses (not those of a copy left behind)."""
    b = md_backend
    fw = _module_kit(b)
    home = md_devices[0]
    for target in md_devices:
        m = _model(b, fw, home)
        params = list(m.parameters())
        sgd = getattr(getattr(fw, "optim", None), "SGD", None)
        opt = sgd(m.parameters(), lr=0.5) if sgd is not None else None
        moved = md.to(m, target)
        assert moved is m, f"md.to(model, {target}) from {home} gave another model, not the same one moved in place"
        assert all(p is q for p, q in zip(m.parameters(), params)), "the move replaced the model's Parameter objects"
        assert md.device_of(m) == target and all(md.device_of(t) == target for t in _tensors(m))
        if opt is None:
            continue
        m.w.grad = md.ones(3, device=target, backend=b.name)
        opt.step()
        np.testing.assert_array_equal(as_f64(b, moved.w), np.arange(3) - 0.5,
                                      err_msg="an optimizer built before md.to did not update the moved model")


@pytest.mark.md_requires("SupportsModels")
def test_a_model_copy_shares_nothing_with_the_original(md_backend: Any, md_devices: list) -> None:
    """``md.copy(model[, dev])`` is a new model of the same class with equal values whose every
    tensor (parameters and both kinds of buffer) is its own buffer: writing the copy leaves the
    original as it was."""
    b = md_backend
    fw = _module_kit(b)
    home = md_devices[0]
    for dest in dict.fromkeys([None, *md_devices]):
        m = _model(b, fw, home)
        c = md.copy(m) if dest is None else md.copy(m, dest)
        assert c is not m and type(c) is type(m), f"md.copy(model, {dest}) gave {type(c).__name__}"
        assert md.device_of(c) == (home if dest is None else dest)
        mine, theirs = _tensors(m), _tensors(c)
        assert len(theirs) == len(mine) == 3, f"the copy holds {len(theirs)} tensors, the model {len(mine)}"
        for t, u in zip(mine, theirs):
            assert t is not u, "the copy shares a tensor object with the original"
            np.testing.assert_array_equal(as_f64(b, u), as_f64(b, t))
        if b.capabilities.mutable:
            for u in theirs:
                b.assign(u, md.full(b.shape_of(u), 9.0, device=md.device_of(u), backend=b.name))
        for k, t in enumerate(mine):
            np.testing.assert_array_equal(as_f64(b, t), np.arange(3) + k,
                                          err_msg=f"writing the copy (to {dest}) changed the original's tensor {k}")


@pytest.mark.md_requires("SupportsModels")
def test_a_models_buffers_are_among_its_tensors(md_backend: Any, md_devices: list) -> None:
    """A model's buffers, persistent or not, are its tensors: ``device_of`` of a model holding only a
    buffer is that buffer's device, and ``md.to`` takes a normalisation layer's running statistics
    along (every buffer on the target)."""
    b = md_backend
    fw = _module_kit(b)
    for dev in md_devices:
        for kind in ("buffer", "scratch"):
            m = _model(b, fw, dev, kind)
            assert md.device_of(m) == dev, f"device_of a model holding only a {kind} buffer"
            md.synchronize(m)
    norm = getattr(fw.nn, "BatchNorm1d", None)
    if norm is None:
        return
    for target in md_devices:
        layer = md.to(norm(3), md_devices[0])
        moved = md.to(layer, target)
        stats = list(moved.buffers())
        assert len(stats) >= 2 and all(md.device_of(s) == target for s in stats), (
            f"md.to(BatchNorm, {target}) left statistics on {[str(md.device_of(s)) for s in stats]}")
        assert md.device_of(moved) == target


@pytest.mark.md_requires("SupportsModels")
def test_user_subclasses_and_scripted_modules_are_models(md_backend: Any, md_devices: list) -> None:
    """A user's own subclass of the framework's module base is a model, as the built-in layers
    are, and so is its scripted form (the framework's scripting compiler, where it has one):
    ``model_kind`` names them, and ``to``, ``copy`` and ``device_of`` take them."""
    b = md_backend
    fw = _module_kit(b)
    dev = md_devices[-1]
    m = _model(b, fw, dev)
    kinds = {"a built-in layer": getattr(fw.nn, "Linear", None) and fw.nn.Linear(2, 2), "a user's subclass": m}
    script = getattr(getattr(fw, "jit", None), "script", None)
    if callable(script):
        kinds["a scripted user's module"] = _quiet(script, m)
    for what, obj in kinds.items():
        if obj is None:
            continue
        assert b.models.model_kind(obj) == "module", f"{b.name}.model_kind of {what} ({type(obj).__name__}) is " \
                                              f"{b.models.model_kind(obj)!r}, not 'module'"
        obj = md.to(obj, dev)
        assert md.to(obj, dev) is obj and md.device_of(obj) == dev, what
        c = md.copy(obj)
        assert c is not obj and md.device_of(c) == dev, what
        for t, u in zip(_tensors(obj), _tensors(c)):
            assert t is not u, f"the copy of {what} shares a tensor"
            np.testing.assert_array_equal(as_f64(b, u), as_f64(b, t))


# -- registered tree nodes with auxiliary data ---------------------------------------------------------
_NODES: dict[int, list[tuple[str, Callable[..., Any]]]] = {}


def _node_makers(fw: Any) -> list[tuple[str, Callable[..., Any]]]:
    """Ways to make a registered tree node holding ``(w, b)`` and auxiliary data (a name and a
    scale), each registered once per framework: a class registered with
    ``tree_util.register_pytree_node_class``, one registered with ``register_pytree_node``, and a
    flax struct dataclass (where flax is installed)."""
    if id(fw) in _NODES:
        return _NODES[id(fw)]
    tu = fw.tree_util

    @tu.register_pytree_node_class
    class Layer:
        def __init__(self, w: Any, b: Any, name: str, scale: float) -> None:
            self.w, self.b, self.name, self.scale = w, b, name, scale

        def tree_flatten(self) -> tuple[tuple[Any, Any], tuple[str, float]]:
            return (self.w, self.b), (self.name, self.scale)

        @classmethod
        def tree_unflatten(cls, aux: tuple[str, float], children: Any) -> Any:
            w, b = children
            return cls(w, b, *aux)

    class Pair:  # equinox-style: fields, some of them static
        def __init__(self, w: Any, b: Any, name: str, scale: float) -> None:
            self.w, self.b, self.name, self.scale = w, b, name, scale

    tu.register_pytree_node(Pair, lambda p: ((p.w, p.b), (p.name, p.scale)),
                            lambda aux, ch: Pair(ch[0], ch[1], *aux))
    makers: list[tuple[str, Callable[..., Any]]] = [("register_pytree_node_class", Layer),
                                                    ("register_pytree_node", Pair)]
    if importlib.util.find_spec("flax") is not None:
        import dataclasses

        from flax import struct

        @struct.dataclass
        class Struct:
            w: Any
            b: Any
            name: str = struct.field(pytree_node=False)
            scale: float = struct.field(pytree_node=False)

        assert dataclasses.is_dataclass(Struct)
        makers.append(("flax.struct.dataclass", Struct))
    _NODES[id(fw)] = makers
    return makers


@pytest.mark.md_requires("SupportsModels")
def test_registered_tree_nodes_are_rebuilt_from_their_new_children(md_backend: Any, md_devices: list) -> None:
    """A tree node the framework knows (registered classes, flax structs: auxiliary data beside
    the children) moved to another device or copied is the same class rebuilt from the NEW
    children: every leaf on the target, the auxiliary data kept; nested in Python containers too."""
    b = md_backend
    fw = _framework(b)
    if not callable(getattr(getattr(fw, "tree_util", None), "register_pytree_node_class", None)):
        pytest.skip(f"{b.name}'s framework registers no tree nodes of its own (tree_util.register_pytree_node_class)")
    home = md_devices[0]
    for how, make in _node_makers(fw):
        w = md.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), device=home, backend=b.name)
        node = make(w, md.ones(3, device=home, backend=b.name), "layer", 2.5)
        assert b.models.model_kind(node) == "tree", f"{how}: model_kind is {b.models.model_kind(node)!r}"
        for target in md_devices:
            for what, out in (("to", md.to({"net": [node]}, target)["net"][0]),
                              ("copy", md.copy({"net": [node]}, target)["net"][0])):
                assert type(out) is type(node) and (out.name, out.scale) == ("layer", 2.5), (
                    f"{how}: md.{what}(node, {target}) lost the node's class or auxiliary data")
                for leaf, want in ((out.w, np.arange(6).reshape(2, 3)), (out.b, np.ones(3))):
                    assert md.device_of(leaf) == target, (
                        f"{how}: after md.{what}(node, {target}) a leaf is on {md.device_of(leaf)}: the node was "
                        "rebuilt from its old children")
                    np.testing.assert_array_equal(as_f64(b, leaf), want)
                assert md.device_of(out) == target
                if what == "copy":
                    assert out.w is not node.w, f"{how}: md.copy(node) kept the original leaf"
