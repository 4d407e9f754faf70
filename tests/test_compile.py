"""multidev.compile on every installed backend (same values as eager, on the inputs' device, the
route recorded, explicit routes, typed errors), and the core's route choice with a fake adapter.
Each backend's checks run in one subprocess (2 virtual devices; TorchScript needs the functions'
source, so the worker is a file)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import compilation as mc
from multidev.errors import CapabilityError, InvalidArgumentError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workers import installed, run_worker

# Per framework: make_net(device) -> (net, x) with x on `device`; kw_fn(x, scale=...) a function with
# a keyword; bad: a function no compiler route takes (None where every function compiles).
FRAMEWORK = {
    "numpy": """
        W = md.asarray(np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32), device=DEV, backend=NAME)
        def make_net():
            return (lambda x: np.maximum(x @ W, 0)), md.rand((3, 8), device=DEV, backend=NAME, seed=1)
        def kw_fn(x, scale=1.0):
            return x * scale
        bad = None
    """,
    "torch": """
        import torch
        def make_net():
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(
                md.backend(NAME).to_native_device(DEV))
            return net, md.rand((3, 8), device=DEV, backend=NAME, seed=1)
        def kw_fn(x, scale: float = 1.0):
            return x * scale
        def bad(x):
            s = sum(v for v in [x, x])  # TorchScript has no generator expressions ...
            return s if s.sum() > 0 else -s  # ... and a trace would freeze this branch
    """,
    "jax": """
        import jax
        W = md.asarray(np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32), device=DEV, backend=NAME)
        def make_net():
            return (lambda x: jax.nn.relu(x @ W)), md.rand((3, 8), device=DEV, backend=NAME, seed=1)
        def kw_fn(x, scale=1.0):
            return x * scale
        def bad(x):
            return x if x.sum() > 0 else -x  # Python control flow on a traced value
    """,
    "tensorflow": """
        import tensorflow as tf
        W = md.asarray(np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32), device=DEV, backend=NAME)
        def make_net():
            return (lambda x: tf.nn.relu(x @ W)), md.rand((3, 8), device=DEV, backend=NAME, seed=1)
        def kw_fn(x, scale=1.0):
            return x * scale
        def bad(x):
            return tf.constant(x.numpy() * 2)  # a symbolic tensor has no value
    """,
    "mxnet": """
        import mxnet as mx
        from mxnet.gluon import nn
        def make_net():
            net = nn.HybridSequential()
            net.add(nn.Dense(16, activation="relu"), nn.Dense(2))
            net.initialize(ctx=md.backend(NAME).to_native_device(DEV))
            return net, md.rand((3, 8), device=DEV, backend=NAME, seed=1)
        kw_fn = None  # MXNet compiles blocks only
        def bad(x):
            return x * 2
    """,
}

WORKER = """
from multidev.errors import CapabilityError, InvalidArgumentError
DEV = md.devices(backend=NAME)[-1]  # the last device: results must stay off the default one
FRAMEWORK

@check
def auto_matches_eager_on_the_inputs_device():
    net, x = make_net()
    want = host(net(x))
    c = md.compile(net, backend=NAME)
    assert c.route is None and c.backend == NAME
    out = c(x)
    np.testing.assert_allclose(host(out), want, rtol=1e-5, atol=1e-6)
    assert md.device_of(out) == DEV, md.device_of(out)
    assert c.route in c.routes and c.routes[c.route], (c.route, c.routes)
    measured = [r for r, m in c.routes.items() if m]
    assert set(c.timings) | set(c.errors) == set(measured) or len(measured) == 1, (c.timings, c.errors)
    if c.timings:
        assert c.timings[c.route] == min(c.timings.values())
    out2 = c(x)  # later calls: the chosen route
    np.testing.assert_allclose(host(out2), want, rtol=1e-5, atol=1e-6)
    if NAME == "mxnet":  # the block is left configured as the chosen route
        assert net._active == (c.route != "eager")
        assert dict(net._flags).get("static_alloc", False) == (c.route == "hybridize:static")

@check
def backend_inferred_from_the_first_call():
    net, x = make_net()
    c = md.compile(net)
    c(x)
    assert c.backend == NAME

@check
def every_measured_route_explicitly():
    net, x = make_net()
    want = host(net(x))
    for r, measured in md.compile(net, backend=NAME).routes.items():
        if not measured:
            continue
        c = md.compile(net, backend=NAME, route=r)
        out = c(x)
        np.testing.assert_allclose(host(out), want, rtol=1e-5, atol=1e-6, err_msg=r)
        assert md.device_of(out) == DEV and c.route == r and c.timings == {}, r

@check
def keywords_pass_through():
    if kw_fn is None:
        return
    _, x = make_net()
    c = md.compile(kw_fn, backend=NAME)
    np.testing.assert_allclose(host(c(x, scale=3.0)), 3 * host(x), rtol=1e-6)

@check
def unknown_route_is_refused():
    net, _ = make_net()
    try:
        md.compile(net, backend=NAME, route="no-such-route")
    except InvalidArgumentError as e:
        assert "its routes" in str(e)
    else:
        raise AssertionError("no error")

@check
def what_cannot_compile_raises_capability_error():
    if bad is None:
        return
    _, x = make_net()
    try:
        c = md.compile(bad, backend=NAME)
        c(x)
    except CapabilityError as e:
        assert NAME in str(e), e
    else:
        raise AssertionError(f"compiled by {c.route}")

@check
def the_functions_own_error_propagates():
    net, x = make_net()
    def broken(x):
        raise ValueError("boom")
    if NAME == "mxnet":
        return  # a block's forward is the framework's; covered by the other checks
    try:
        md.compile(broken, backend=NAME)(x)
    except ValueError as e:
        assert "boom" in str(e)
    else:
        raise AssertionError("no error")
"""

CHECKS = ["auto_matches_eager_on_the_inputs_device", "backend_inferred_from_the_first_call",
          "every_measured_route_explicitly", "keywords_pass_through", "unknown_route_is_refused",
          "what_cannot_compile_raises_capability_error", "the_functions_own_error_propagates"]

_CACHE: dict[str, dict[str, str]] = {}


def _results(name: str, tmp: Path) -> dict[str, str]:
    if name not in _CACHE:
        code = WORKER.replace("FRAMEWORK", textwrap.dedent(FRAMEWORK[name]))
        _CACHE[name] = run_worker(code, name, tmp / f"compile_worker_{name}.py")
    return _CACHE[name]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", installed())
def test_backend(name: str, check: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    got = _results(name, tmp_path_factory.getbasetemp())
    assert got.get(check) == "OK", got.get(check, f"check {check} did not run")


@pytest.mark.slow
def test_torch_compile_route(tmp_path: Path) -> None:
    """The routes auto leaves out (seconds of compilation) still map to torch.compile."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    code = textwrap.dedent("""
        import torch, multidev as md
        net = torch.nn.Linear(4, 2)
        x = torch.ones(1, 4)
        c = md.compile(net, backend="torch", route="torch.compile")
        assert torch.allclose(c(x), net(x)) and c.route == "torch.compile" and not c.routes["torch.compile"]
        print("OK")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-3000:]


# -- the core's route choice, over a fake adapter (no framework, no clock) ------------------------
class _Fake:
    """Routes: "slow" and "fast" (new callables), "inplace" (reconfigures fn itself), "broken"
    (CapabilityError), "eager"; every call of a compiled function is logged."""

    name = "fake"

    def __init__(self, routes: dict[str, bool]) -> None:
        self.routes = routes
        self.compiled: list[str] = []
        self.compiler = self  # its own compile concern

    def tensor_types(self) -> tuple[type, ...]:
        return (np.ndarray,)

    def wait(self, x: Any) -> None:
        pass

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        return dict(self.routes)

    def compile(self, fn: Any, route: str, args: tuple) -> Any:
        self.compiled.append(route)
        if route == "broken":
            raise CapabilityError("fake backend: broken cannot compile this")
        if route in ("inplace", "inplace2"):
            fn.mode = route
            return fn
        if route == "eager":
            return fn
        return lambda *a, **k: (route, fn(*a, **k))


class _Fn:
    mode = "eager"

    def __call__(self, x: Any) -> Any:
        return x


def _compiled(routes: dict[str, bool], monkeypatch: pytest.MonkeyPatch, times: dict[str, float],
              fn: Any = None) -> tuple[mc.Compiled, _Fake]:
    fake = _Fake(routes)
    fn = fn if fn is not None else _Fn()
    order = iter(times)
    monkeypatch.setattr(mc, "_time", lambda b, f, a, k: times[next(order)])
    c = mc.Compiled(fn, "auto")
    c._bind(fake)  # type: ignore[arg-type]
    return c, fake


def test_auto_keeps_the_fastest_route_and_records_every_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    c, _ = _compiled({"slow": True, "fast": True, "eager": True, "never": False}, monkeypatch,
                     {"slow": 3e-6, "fast": 1e-6, "eager": 2e-6})
    assert c(np.ones(1)) == ("fast", np.ones(1))
    assert c.route == "fast" and c.timings == {"slow": 3e-6, "fast": 1e-6, "eager": 2e-6} and c.errors == {}


def test_auto_skips_routes_that_cannot_compile_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    c, _ = _compiled({"broken": True, "fast": True, "eager": True}, monkeypatch, {"fast": 1e-6, "eager": 2e-6})
    c(np.ones(1))
    assert c.route == "fast" and "cannot compile" in c.errors["broken"]


def test_auto_raises_when_only_eager_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    c, _ = _compiled({"broken": True, "eager": True}, monkeypatch, {"eager": 1e-6})
    with pytest.raises(CapabilityError, match="fake backend cannot compile.*broken cannot compile"):
        c(np.ones(1))


def test_auto_reapplies_an_in_place_route_that_was_overwritten(monkeypatch: pytest.MonkeyPatch) -> None:
    fn = _Fn()
    c, fake = _compiled({"inplace": True, "inplace2": True}, monkeypatch, {"inplace": 1e-6, "inplace2": 2e-6}, fn)
    c(np.ones(1))
    assert c.route == "inplace" and fn.mode == "inplace" and fake.compiled == ["inplace", "inplace2", "inplace"]


def test_a_single_candidate_is_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    c, fake = _compiled({"fast": True, "slow": False}, monkeypatch, {})
    c(np.ones(1))
    assert c.route == "fast" and c.timings == {} and fake.compiled == ["fast"]


def test_explicit_route_is_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Fake({"fast": True, "slow": False})
    c = mc.Compiled(_Fn(), "slow")
    c._bind(fake)  # type: ignore[arg-type]
    assert c(np.ones(1))[0] == "slow" and c.timings == {} and fake.compiled == ["slow"]


def test_numpy_compiles_to_the_function_itself() -> None:
    def f(x: Any) -> Any:
        return x + 1

    c = md.compile(f, backend="numpy")
    assert c.routes == {"identity": True} and c.__name__ == "f" and c.__wrapped__ is f
    x = md.ones(3, backend="numpy")
    assert np.array_equal(c(x), x + 1) and c.route == "identity" and c._call is f


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="takes a function"):
        md.compile(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="route"):
        md.compile(len, route="")
    with pytest.raises(InvalidArgumentError, match="no route 'jit'"):
        md.compile(len, backend="numpy", route="jit")


def test_goal_against_the_fastest_of_a_prefix() -> None:
    from multidev.benchmarks import Goal

    g = Goal("best", "G", 1.1, metric="time_ratio_best", den=("native:*",))
    rec = {"group": "G", "variants": {"md": {"median_s": 2.0}, "native:a": {"median_s": 1.9},
                                      "native:b": {"median_s": 4.0}, "eager": {"median_s": 1.0}}}
    assert g.applies(rec) and g.value(rec) == pytest.approx(2.0 / 1.9) and g.met(g.value(rec))
    assert not g.met(1.2) and "min(native:*)" in g.describe()
    assert g.value({"group": "G", "variants": {"md": {"median_s": 1.0}, "eager": {"median_s": 1.0}}}) is None


def test_an_adapter_without_the_extensions_is_valid_and_says_what_it_lacks() -> None:
    from multidev.adapter import (
        CONCERNS,
        OPTIONAL_METHODS,
        PROTOCOL_METHODS,
        Capabilities,
        check_adapter,
        validate_adapter,
    )

    attrs: dict[str, Any] = {m: (lambda self, *a: None) for m in PROTOCOL_METHODS
                             if m not in OPTIONAL_METHODS and m != "capabilities"}
    attrs.update(name="bare", framework="bare", tensor_types=lambda self: (np.ndarray,),
                 capabilities=property(lambda self: Capabilities(False, False, False,
                                                                 dtypes=frozenset({"float32"}))))
    bare = type("Bare", (), attrs)()
    assert check_adapter(bare) == []
    validate_adapter(bare, "bare")  # no BaseBackend: every concern attribute is set to None
    assert all(getattr(bare, a) is None for a in CONCERNS)
    c = mc.Compiled(len, "auto")
    with pytest.raises(CapabilityError, match="bare backend has no compiler .its compiler concern is None"):
        c._bind(bare)  # type: ignore[arg-type]
