"""Compilation (D2L 12.1): every route ``md.compile`` may take for a function (each one ``auto``
measures) gives the eager result, also on inputs that take the other side of a data-dependent
branch than the inputs it was compiled with, or is refused with CapabilityError; and the
compiled function leaves its inputs readable and unchanged, call after call.

A backend whose compilers take only the framework's own module objects (Gluon blocks) refuses a
plain function in ``compile_routes``: those checks skip, saying so."""
from __future__ import annotations

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
        routes = b.compile_routes(fn)
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
