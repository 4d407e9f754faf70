"""Compilation (D2L 12.1): every route ``md.compile`` may take for a function (each one ``auto``
measures) gives the eager result, also on inputs that take the other side of a data-dependent
branch than the inputs it was compiled with, or is refused with CapabilityError; and the
compiled function leaves its inputs readable and unchanged, call after call.

A backend whose compilers take only the framework's own module objects (Gluon blocks) refuses a
plain function in ``compile_routes``: those checks skip, saying so."""
from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device
from multidev.errors import CapabilityError

from ._helpers import as_f64, ordered

pytestmark = [pytest.mark.md_feature("compile"), pytest.mark.md_requires("SupportsCompile")]


def _target(devices: list[Device]) -> Device:
    """The first accelerator, else the last CPU (a device other than cpu:0 where there is one)."""
    devs = ordered(devices)
    return devs[0] if devs[0].is_gpu else devs[-1]


def _branchy(x):  # unannotated: TorchScript reads x as a Tensor
    if x[0] > 0:
        return x * 2.0
    return x - 1.0


def _affine(x, y):
    return x * 2.0 + y


def _measured_routes(b: Any, fn: Callable[..., Any]) -> list[str]:
    """The routes ``auto`` would measure for ``fn``, or skip where the backend compiles no plain
    function."""
    try:
        routes = b.compiler.compile_routes(fn)
    except CapabilityError as e:
        pytest.skip(f"{b.name} compiles only its framework's own module objects, not a plain function: {e}")
    return [r for r, measured in routes.items() if measured]


def _host(b: Any, x: Any) -> np.ndarray:
    return np.asarray(as_f64(b, x), dtype=np.float64)


def test_compiled_function_follows_a_data_dependent_branch(md_backend: Any, md_devices: list) -> None:
    """Compiled with inputs whose first element is positive, called with one whose first element
    is not: the result is the other branch's, as the function gives it eagerly (a tracing
    compiler that froze the first branch must refuse the function instead)."""
    b = md_backend
    dev = _target(md_devices)
    pos_np = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    neg_np = np.array([-1.0, 2.0, 3.0], dtype=np.float32)
    compiled, refused = [], []
    for route in _measured_routes(b, _branchy):
        pos = md.asarray(pos_np, device=dev, backend=b.name)
        neg = md.asarray(neg_np, device=dev, backend=b.name)
        f = md.compile(_branchy, backend=b.name, route=route)
        try:
            first = f(pos)
        except CapabilityError:
            refused.append(route)  # refused: it cannot compile the branch faithfully
            continue
        compiled.append(route)
        other = f(neg)
        for got, want, what in ((first, pos_np * 2.0, "the branch it was compiled with"),
                                (other, neg_np - 1.0, "the other branch")):
            assert md.device_of(got) == dev, f"{route}: the result of {what} is on {md.device_of(got)}, not {dev}"
            np.testing.assert_array_equal(_host(b, got), want, err_msg=f"{route} on {what}: not the eager result")
    assert compiled, f"no route ran the function (refused: {refused}); eager at least must"


def test_compiled_function_leaves_its_inputs_readable_and_unchanged(md_backend: Any, md_devices: list) -> None:
    """Called twice with the same inputs, a compiled function gives the eager result both times,
    and its inputs stay readable with their values (no route donates, frees or writes them)."""
    b = md_backend
    dev = _target(md_devices)
    x_np = np.array([1.0, -2.0, 3.0, 0.5], dtype=np.float32)
    y_np = np.array([0.25, 4.0, -1.0, 2.0], dtype=np.float32)
    ran = []
    for route in _measured_routes(b, _affine):
        x = md.asarray(x_np, device=dev, backend=b.name)
        y = md.asarray(y_np, device=dev, backend=b.name)
        f = md.compile(_affine, backend=b.name, route=route)
        try:
            first = f(x, y)
        except CapabilityError:
            continue  # a route that cannot compile this function: nothing to check
        ran.append(route)
        second = f(x, y)
        for i, got in enumerate((first, second)):
            np.testing.assert_array_equal(_host(b, got), x_np * 2.0 + y_np, err_msg=f"{route}: call {i + 1}")
        for name, t, want in (("x", x, x_np), ("y", y, y_np)):
            try:
                host = _host(b, t)
            except Exception as e:  # noqa: BLE001 - any framework error: the input is gone
                pytest.fail(f"{route}: input {name} cannot be read after the calls "
                            f"({type(e).__name__}: {str(e)[:200]})")
            np.testing.assert_array_equal(host, want, err_msg=f"{route} changed its input {name}")
    assert ran, "no route ran the function; eager at least must"


def _scaled_by(k: float) -> Callable[..., Any]:
    def scaled(x):  # one __name__, __qualname__ and code object for every k
        return x * k
    return scaled


def _one_name() -> list[tuple[Callable[..., Any], float, float]]:
    """Functions that share a ``__name__`` (and ``__qualname__``) but not what they compute:
    closures of one code object, and two lambdas of different bodies, each with ``(scale, shift)``:
    ``f(x) == x * scale + shift``."""
    add = lambda x: x + 1.0
    mul = lambda x: x * 3.0
    for f in (add, mul):
        f.__name__ = f.__qualname__ = "step"
    return [(_scaled_by(2.0), 2.0, 0.0), (_scaled_by(-3.0), -3.0, 0.0), (add, 1.0, 1.0), (mul, 3.0, 0.0)]


def test_functions_of_one_name_get_their_own_executables(md_backend: Any, md_devices: list) -> None:
    """A compiled function is cached by what it is, never by what it is called: functions of one
    name (closures of one code object, lambdas renamed alike) compiled through each route, and
    through ``auto``, each give their own result, whatever was compiled before them."""
    b = md_backend
    dev = _target(md_devices)
    x_np = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    ran = []
    for route in [*_measured_routes(b, _affine), "auto"]:
        for fn, scale, shift in _one_name():
            x = md.asarray(x_np, device=dev, backend=b.name)
            f = md.compile(fn, backend=b.name, route=route)
            try:
                got = f(x)
            except CapabilityError:
                continue
            ran.append(route)
            np.testing.assert_array_equal(_host(b, got), x_np * scale + shift,
                                          err_msg=f"{route}: {fn.__name__} ({scale}x + {shift}) got another "
                                                  "function's executable")
    assert ran, "no route compiled these functions; eager at least must"


def _framework_compiler(b: Any, route: str) -> Callable[..., Any] | None:
    """The framework's own compiler a route is named after (``jax.jit``, ``torch.jit.script``,
    ``tf.function``: the route's dotted name read from the framework module, its first part the
    framework or its usual alias); None for a route named otherwise (``eager``, a mode after ``:``)."""
    if ":" in route or "." not in route:
        return None
    fw = sys.modules.get(b.framework)
    root, *path = route.split(".")
    if fw is None or (root != b.framework and root in sys.modules):
        return None
    obj: Any = fw
    for part in path:
        obj = getattr(obj, part, None)
    return obj if callable(obj) else None


def _faithful(compiler: Callable[..., Any], pos: Any, neg: Any, pos_np: np.ndarray, neg_np: np.ndarray,
              b: Any) -> bool:
    """Whether the framework's compiler, applied to ``_branchy`` as it is (no example inputs),
    follows both sides of its branch."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            g = compiler(_branchy)
            return bool(np.array_equal(_host(b, g(pos)), pos_np * 2.0)
                        and np.array_equal(_host(b, g(neg)), neg_np - 1.0))
        except Exception:  # noqa: BLE001 - the framework's compiler cannot compile it this way
            return False


def test_each_route_compiles_what_its_compiler_does(md_backend: Any, md_devices: list) -> None:
    """A route named after a framework compiler is that compiler: where the framework's own compiler
    compiles a function with a data-dependent branch faithfully (a scripting compiler), the route
    compiles it too (it does not refuse it, as a tracer would), follows both branches, and reports
    the route asked for."""
    b = md_backend
    dev = _target(md_devices)
    pos_np = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    neg_np = np.array([-1.0, 2.0, 3.0], dtype=np.float32)
    pos = md.asarray(pos_np, device=dev, backend=b.name)
    neg = md.asarray(neg_np, device=dev, backend=b.name)
    checked = []
    for route in _measured_routes(b, _branchy):
        compiler = _framework_compiler(b, route)
        if compiler is None or not _faithful(compiler, pos, neg, pos_np, neg_np, b):
            continue
        checked.append(route)
        f = md.compile(_branchy, backend=b.name, route=route)
        try:
            first = f(pos)
        except CapabilityError as e:
            pytest.fail(f"route {route} refused a function its compiler compiles faithfully by itself: {e}")
        assert f.route == route, f"asked for {route}, got {f.route}"
        np.testing.assert_array_equal(_host(b, first), pos_np * 2.0, err_msg=f"{route}: the compiled branch")
        np.testing.assert_array_equal(_host(b, f(neg)), neg_np - 1.0, err_msg=f"{route}: the other branch")
    if not checked:
        pytest.skip(f"no route of {b.name} is named after a framework compiler that compiles a data-dependent "
                    "branch by itself (tracing compilers refuse it: test_compiled_function_follows_a_data_"
                    "dependent_branch checks those)")
