"""Structures, models and scopes: ``to``/``copy``/``device_of``/``to_host``/``convert`` of nested
containers of the backend's tensors on every device (the structure kept, resident tensors the same
objects, tied tensors one object), ``SupportsModels``' claim on what is no model, and
``SupportsDeviceScope``: the framework's own default device follows the scope, nested, restored
after it, per thread."""
from __future__ import annotations

import collections
import threading
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
        assert b.model_kind(obj) is None, f"{b.name}.model_kind claims {type(obj).__name__}"


@pytest.mark.md_requires("SupportsDeviceScope")
def test_the_framework_default_device_follows_the_scope(md_backend: Any, md_devices: list) -> None:
    """Inside ``md.device_scope(dev, backend=...)`` the framework's own default device is ``dev``
    (``current_device``), for every device; a nested scope wins and its exit restores the outer one;
    the exit of the outer scope restores what was there; another thread keeps its own default."""
    b = md_backend
    before = b.current_device()
    for dev in md_devices:
        with md.device_scope(dev, backend=b.name):
            assert b.current_device() == dev, f"inside device_scope({dev}) {b.name}'s default is {b.current_device()}"
            for inner in [d for d in md_devices if d != dev][:1]:
                with md.device_scope(inner, backend=b.name):
                    assert b.current_device() == inner
                assert b.current_device() == dev, "leaving a nested scope restores the outer one"
                seen: list[Any] = []
                t = threading.Thread(target=lambda out=seen: out.append(b.current_device()))
                t.start()
                t.join()
                assert seen == [before], f"another thread saw {seen}: a scope is per thread"
        assert b.current_device() == before, "leaving the scope restores the default it replaced"
