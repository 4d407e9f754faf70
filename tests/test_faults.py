"""Fault injection, in one process (issue 33, rows 7-14): a failed call changes nothing, structures of
any depth from callers of any depth, tuple subclasses, scopes misused (out of order, from another
thread) on every backend installed here, argument errors typed as ValueError/TypeError, capability
objects compared by value, ``md.to_host`` of one tensor. The multi-process rows (start-up faults, a
lost rank, the launcher's exit) are in ``tests/test_faults_engines.py``; the long soak is
``python -m tests.soak``."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import registry
from multidev.placement import scope_backend, scope_device

TESTS = Path(__file__).resolve().parent


def _have(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # a module installed by hand (tests/fake_cupy.py) has no spec
        return name in sys.modules


# -- row 7: validate the whole structure before moving any part -----------------------------------------
@pytest.mark.skipif(not _have("torch"), reason="needs torch (a model in a structure)")
def test_a_bad_leaf_anywhere_leaves_every_model_unmoved(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    b = md.backend("torch")
    moved: list[Any] = []
    real = type(b.models).move_module
    monkeypatch.setattr(type(b.models), "move_module", lambda self, m, d: moved.append(m) or real(self, m, d))
    net = torch.nn.Linear(2, 2)
    for bad in ([net, "bad"], {"model": net, "rest": [md.ones(2), object()]}, (net, [net, 3.0])):
        with pytest.raises(md.UnsupportedTensorError):
            md.to(bad, "cpu:0")
        with pytest.raises(md.UnsupportedTensorError):
            md.to(bad, "cpu:0", non_blocking=True)
    assert moved == [], "a model was moved by a call that then failed on another leaf"
    # a device one part cannot take: refused before the other parts move
    with pytest.raises(md.DeviceNotFoundError):
        md.to([md.ones(2, backend="numpy"), net], "cpu:1")
    assert moved == []
    assert md.to([net, md.ones(2, backend="numpy")], "cpu:0")[0] is net and moved == [net]


@pytest.mark.skipif(not _have("mxnet"), reason="needs MXNet (the with-MXNet lane): a Gluon block in a list")
def test_a_bad_leaf_leaves_a_gluon_block_where_it_was() -> None:
    md.backend("mxnet")  # the adapter imports mxnet (on NumPy >= 1.24 it needs the adapter's np.bool)
    import mxnet as mx

    net = mx.gluon.nn.Dense(2, in_units=2)
    net.initialize(ctx=mx.cpu(0))
    with pytest.raises(md.UnsupportedTensorError):
        md.to([net, "bad"], "cpu:1")
    assert {p.list_ctx()[0] for p in net.collect_params().values()} == {mx.cpu(0)}


@pytest.mark.skipif(not _have("torch"), reason="needs torch (models in a structure)")
def test_a_failing_model_move_says_which_models_were_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensors go first, then the models: when the second model's move fails, the error says
    that the first was moved (models move in place) and the second was not."""
    import torch

    b = md.backend("torch")
    first, second = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    calls: list[Any] = []

    def move(self: Any, m: Any, d: Any) -> Any:
        calls.append(m)
        if m is second:
            raise RuntimeError("cannot move the second")
        return m
    monkeypatch.setattr(type(b.models), "move_module", move)
    with pytest.raises(md.MultidevError) as e:
        md.to([first, md.ones(1, backend="torch"), second], "cpu:0")
    assert calls == [first, second]
    notes = " ".join(getattr(e.value, "__notes__", []))
    assert "[0]" in notes and "already changed" in notes and "[2]" in notes, notes


# -- row 8: tuple subclasses ----------------------------------------------------------------------------
class Pair(tuple):
    __slots__ = ()

    def __new__(cls, a: Any, b: Any) -> Pair:
        return super().__new__(cls, (a, b))


class Stubborn(tuple):
    __slots__ = ()

    def __new__(cls, tag: str, a: Any, b: Any) -> Stubborn:
        return super().__new__(cls, (a, b))


class Plain(tuple):
    __slots__ = ()


def test_tuple_subclasses_are_rebuilt_or_refused_before_anything_moves() -> None:
    x, y = md.ones(2), md.zeros(3)
    out = md.to(Pair(x, y), "cpu:1")
    assert type(out) is Pair and md.device_of(out) == md.Device("cpu", 1) and out[1].shape == (3,)
    out = md.copy([Plain((x, y))])
    assert type(out[0]) is Plain and out[0][0] is not x
    assert type(md.convert(Pair(x, y), "numpy")) is Pair
    with pytest.raises(md.UnsupportedTensorError, match=r"\[1\] is a .*Stubborn.*nothing was moved") as e:
        md.to([x, Stubborn("t", x, y)], "cpu:1")
    assert isinstance(e.value, TypeError)


# -- row 11: deep structures, deep callers ------------------------------------------------------------
def _nested(levels: int) -> Any:
    s: Any = md.ones(1)
    for i in range(levels):
        s = [s, md.full(1, float(i))] if i % 2 else {"k": s}
    return s


def _at_depth(frames: int, fn: Any) -> Any:
    return fn() if frames == 0 else _at_depth(frames - 1, fn)


@pytest.mark.parametrize("call", ["to", "copy", "device_of", "to_host", "convert", "synchronize"])
def test_a_200_level_structure_from_a_caller_600_frames_deep(call: str) -> None:
    s = _nested(200)
    fns = {"to": lambda: md.to(s, "cpu:1"), "copy": lambda: md.copy(s), "device_of": lambda: md.device_of(s),
           "to_host": lambda: md.to_host(s), "convert": lambda: md.convert(s, "numpy"),
           "synchronize": lambda: md.synchronize(s)}
    out = _at_depth(600, fns[call])
    if call in ("to", "copy", "to_host", "convert"):
        depth, node = 0, out
        while isinstance(node, (list, dict)):
            node = node["k"] if isinstance(node, dict) else node[0]
            depth += 1
        assert depth == 200


def test_too_deep_is_a_typed_error_even_from_a_deep_caller() -> None:
    with pytest.raises(md.InvalidArgumentError, match="nested deeper"):
        _at_depth(600, lambda: md.to(_nested(300), "cpu:1"))


# -- row 12: argument errors are ValueError/TypeError ------------------------------------------------------
def test_bad_arguments_are_value_or_type_errors() -> None:
    x = md.ones(2)
    with pytest.raises(md.InvalidArgumentError) as e:
        md.convert(x, "numpy", copy="yes")  # type: ignore[arg-type]
    assert isinstance(e.value, ValueError)
    from multidev import distributed as d

    for kwargs in ({"timeout": -1}, {"rank": "0"}, {"check": "yes"}, {"transport": ""}, {"master_addr": 3}):
        with pytest.raises(md.DistributedSetupError) as e2:
            d.init("torch", **kwargs)  # type: ignore[arg-type]
        assert isinstance(e2.value, ValueError) and isinstance(e2.value, md.DistributedError)
    assert not d.is_initialized()


# -- row 13: capabilities compared by value --------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:multidev. adapter 'faults_fresh' claims:RuntimeWarning")
def test_an_adapter_whose_capabilities_are_a_new_equal_object_each_read() -> None:
    class Fresh(type(md.backend("numpy"))):  # type: ignore[misc]
        name = "faults_fresh"

        @property
        def capabilities(self) -> md.Capabilities:
            return dataclasses.replace(super().capabilities)

    md.register_backend("faults_fresh", Fresh, replace=True)
    try:
        b = md.backend("faults_fresh")
        assert b.capabilities is not b.capabilities and b.capabilities == b.capabilities
        for _ in range(3):
            for fn in (md.zeros, md.ones, md.empty):
                assert fn((2, 3), backend="faults_fresh").shape == (2, 3)
        assert md.full(2, 1.5, backend="faults_fresh")[0] == 1.5
    finally:
        registry.unregister_backend("faults_fresh")


# -- row 14: to_host of one tensor -------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["numpy", "torch", "jax", "tensorflow", "mxnet"])
def test_to_host_of_one_tensor_is_one_array(backend: str) -> None:
    if not _have(backend):
        pytest.skip(f"{backend} is not installed in this environment")
    x = md.arange(12, backend=backend)
    y = md.to_host(x)
    assert isinstance(y, np.ndarray) and y.shape == (12,)
    np.testing.assert_array_equal(y, np.arange(12))
    z = md.to_host(md.arange(6, backend=backend), non_blocking=True).wait()
    assert isinstance(z, np.ndarray) and z.shape == (6,)
    assert [a.shape for a in md.to_host([x, x])] == [(12,), (12,)]


# -- rows 9, 10: scopes misused ------------------------------------------------------------------------------
def scope_misuse(backend: str) -> None:
    """Out-of-order and cross-thread exits of ``device_scope(..., backend=backend)``: a typed error
    naming the scope, and every thread's state (multidev's and the framework's) as before."""
    b = md.backend(backend)
    devs = md.devices(backend=backend)
    d1, d2 = devs[-1], devs[0]
    current = b.scope.current_device if b.scope is not None else (lambda: None)  # NumPy has no framework scope
    before = (scope_device.get(), scope_backend.get(), current())

    def state() -> tuple[Any, Any, Any]:
        return scope_device.get(), scope_backend.get(), current()

    outer, inner = md.device_scope(d1, backend=backend), md.device_scope(d2, backend=backend)
    outer.__enter__()
    inner.__enter__()
    with pytest.raises(md.ScopeError, match=r"device_scope\(.*exited before") as e:
        outer.__exit__(None, None, None)
    assert isinstance(e.value, RuntimeError) and str(d1) in str(e.value)
    assert state() == before, f"{backend}: out-of-order exit left {state()} (was {before})"
    inner.__exit__(None, None, None)  # closed already: nothing happens
    assert state() == before

    scope = md.device_scope(d1, backend=backend)
    assert scope.__enter__() == d1
    inside = state()
    errors: list[BaseException] = []
    seen: list[Any] = []

    def other() -> None:
        seen.append(state())
        try:
            scope.__exit__(None, None, None)
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)
        seen.append(state())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], md.ScopeError) and "thread" in str(errors[0]), errors
    assert seen[0] == seen[1], f"{backend}: the refused exit changed the other thread's state"
    assert state() == inside, f"{backend}: the refused exit changed the entering thread's scope"
    scope.__exit__(None, None, None)
    assert state() == before
    with pytest.raises(md.ScopeError, match="entered already"), scope:
        pass  # pragma: no cover
    with md.device_scope(d1, backend=backend), md.device_scope(d2, backend=backend):
        assert state()[0] == d2
    assert state() == before


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax", "tensorflow", "mxnet"])
def test_scopes_exited_out_of_order_or_from_another_thread(backend: str) -> None:
    if not _have(backend):
        pytest.skip(f"{backend} is not installed in this environment")
    scope_misuse(backend)


@pytest.mark.skipif(_have("cupy"), reason="a real CuPy is installed: the fake never shadows it")
def test_scopes_misused_on_fake_cupy() -> None:
    env = dict(os.environ, FAKE_CUPY_GPUS="2",
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", "import fake_cupy, test_faults; test_faults.scope_misuse('cupy')"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
