"""Training (D2L 12.5): the SGD step ``train_batch`` applies keeps every parameter's dtype and
device; replicas of a parameter are trainable the framework's own way (a leaf that fills its
``.grad``, an array with its own gradient buffer, a Variable a tape watches); the framework's
autodiff (``value_and_grad``) gives the gradient of a known function, and two loss functions each
their own gradient.

The framework's own idiom is found by what its tensors and module expose (``requires_grad_``,
``attach_grad``, ``Variable`` with ``GradientTape``), never by the backend's name; a framework with
none of these (JAX, whose arrays carry no autograd state) trains replicas by ``value_and_grad``."""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device

from ._helpers import as_f64, need_dtype, ordered

pytestmark = [pytest.mark.md_feature("training"), pytest.mark.md_requires("SupportsTraining")]

#: The parameter dtypes an SGD step is checked in (each skipped where the backend lacks it).
PARAM_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _target(devices: list[Device]) -> Device:
    """The first accelerator, else the last CPU (a device other than cpu:0 where there is one)."""
    devs = ordered(devices)
    return devs[0] if devs[0].is_gpu else devs[-1]


def _vec(b: Any, values: list[float], device: Device) -> Any:
    return md.asarray(np.array(values, dtype=np.float32), device=device, backend=b.name)


def _values(b: Any, x: Any) -> np.ndarray:
    return np.asarray(as_f64(b, x), dtype=np.float64).reshape(-1)


# -- the SGD step ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", PARAM_DTYPES)
def test_sgd_update_keeps_every_parameters_dtype_and_device(md_backend: Any, md_devices: list, dtype: str) -> None:
    """``train_batch``'s update (the adapter's ``sgd_update``) leaves every replica in its dtype, on
    its device, with the values ``p - lr * g`` (exact here in every float dtype)."""
    b = md_backend
    devs = ordered(md_devices)[:2]
    need_dtype(b, dtype, *devs)
    src = md.full((4,), 1.0, dtype=dtype, device=devs[0], backend=b.name)
    replicas = md.replicate([src], devs)

    def grad(ps: list[Any], X: Any, y: Any) -> tuple[float, list[Any]]:  # a hand-written gradient: 0.5
        p = ps[0]
        return 0.0, [md.full((4,), 0.5, dtype=md.dtype_of(p), device=md.device_of(p), backend=b.name)]

    X = md.zeros((len(devs), 1), device=devs[0], backend=b.name)
    md.train_batch(X, X, replicas, devs, lr=0.25, grad=grad, batch_size=1)
    expect = np.full(4, 1.0 - 0.25 * 0.5 * len(devs))  # the gradient summed over the devices
    for d, ps in zip(devs, replicas):
        p = ps[0]
        assert isinstance(p, b.tensor_types()), f"the update gave a {type(p).__name__}, not a {b.name} tensor"
        assert md.dtype_of(p) == dtype, f"the SGD update turned a {dtype} parameter on {d} into {md.dtype_of(p)}"
        assert md.device_of(p) == d, f"the SGD update moved a parameter of {d} to {md.device_of(p)}"
        np.testing.assert_array_equal(_values(b, p), expect, err_msg=f"p - lr * g on {d} in {dtype}")


# -- replicas are parameters, the framework's way ----------------------------------------------------
def _framework(b: Any) -> Any:
    return sys.modules.get(b.framework)


def _as_parameter(b: Any, x: Any, device: Device) -> tuple[Any, str | None]:
    """``x`` made a training parameter the way its framework makes one, and that way's name."""
    if callable(getattr(x, "requires_grad_", None)):
        return x.requires_grad_(True), "requires_grad"
    if callable(getattr(x, "attach_grad", None)):
        x.attach_grad()
        return x, "attach_grad"
    fw = _framework(b)
    variable = getattr(fw, "Variable", None)
    if isinstance(variable, type) and hasattr(fw, "GradientTape") and hasattr(fw, "device"):
        with fw.device(b.to_native_device(device)):
            return variable(x), "Variable"
    return x, None  # arrays without autograd state: every array is a parameter


def _is_parameter(b: Any, idiom: str | None, r: Any, src: Any) -> str | None:
    """Why replica ``r`` of ``src`` is not a parameter the framework's way (None: it is)."""
    if idiom == "requires_grad":
        if not (r.requires_grad and r.is_leaf):
            return (f"it is not a leaf that requires grad (requires_grad={r.requires_grad}, is_leaf={r.is_leaf}): "
                    ".backward() leaves its .grad empty")
    elif idiom == "attach_grad":
        if r.grad is None:
            return "it has no gradient buffer (attach_grad)"
        if r.grad is src.grad:
            return "it shares its source's gradient buffer"
    elif idiom == "Variable" and not (isinstance(r, _framework(b).Variable) and r.trainable):
        return f"it is a {type(r).__name__}, not a trainable Variable"
    return None


def _idiom_grad(b: Any, idiom: str | None, r: Any) -> Any:
    """The gradient of ``sum(r * r)`` computed the framework's own way (D2L's loop): ``backward()``
    filling ``r.grad``, ``autograd.record()`` then ``backward()``, a ``GradientTape`` watching the
    Variable by itself. None where the framework has no such way."""
    fw = _framework(b)
    if idiom == "requires_grad":
        (r * r).sum().backward()
        g = r.grad
        r.grad = None
        return g
    if idiom == "attach_grad":
        with fw.autograd.record():
            out = r * r
        out.backward()
        return r.grad
    if idiom == "Variable":
        with fw.GradientTape() as tape:
            out = r * r
        return tape.gradient(out, r)
    return None


def _square_loss(ps: list[Any], X: Any, *labels: Any) -> Any:
    """``p * p * X`` elementwise (its sum is the loss; train_batch's labels are not used)."""
    return ps[0] * ps[0] * X


def _grad_state(x: Any) -> Any:
    """What the source's own gradient slot holds, as host values (None where it has none)."""
    g = getattr(x, "grad", None)
    try:
        return None if g is None else np.array(md.to_numpy(g))
    except Exception:  # noqa: BLE001 - a framework whose tensors have no readable .grad
        return None


def test_replicas_are_trainable_in_the_frameworks_idiom(md_backend: Any, md_devices: list) -> None:
    """``md.replicate`` of a parameter gives, on every device, a new parameter of the same kind:
    the framework's own gradient computation on it works (its ``.grad`` fills, its gradient
    buffer is its own, a tape watches it), its source's gradient stays untouched, autodiff
    differentiates it, and ``train_batch`` trains it in place, leaving it a parameter."""
    b = md_backend
    devs = ordered(md_devices)[:2]
    src, idiom = _as_parameter(b, _vec(b, [3.0], devs[0]), devs[0])
    src_grad = _grad_state(src)
    replicas = md.replicate([src], devs)
    assert len(replicas) == len(devs) and all(len(r) == 1 for r in replicas)
    for d, (r,) in zip(devs, replicas):
        assert r is not src, f"the replica on {d} is its source itself"
        assert md.device_of(r) == d and md.dtype_of(r) == "float32", f"the replica on {d}: {md.device_of(r)}"
        np.testing.assert_array_equal(_values(b, r), [3.0])
        why = _is_parameter(b, idiom, r, src)
        assert why is None, f"the replica on {d} of a {idiom} parameter is not trainable that way: {why}"
        g = _idiom_grad(b, idiom, r)
        if idiom is not None:
            assert g is not None, f"the framework's own gradient of the replica on {d} is None (not a parameter)"
            np.testing.assert_array_equal(_values(b, g), [6.0], err_msg=f"d(r*r)/dr of the replica on {d}")
        X = _vec(b, [1.0], d)
        _, (vg,) = b.training.value_and_grad(_square_loss, [r], (X,))
        np.testing.assert_array_equal(_values(b, vg), [6.0], err_msg=f"value_and_grad of the replica on {d}")
    after = _grad_state(src)
    assert (src_grad is None) == (after is None) and (after is None or np.array_equal(after, src_grad)), (
        "training a replica changed its source's gradient: the replica is tied to its source")

    X = md.ones((len(devs), 1), device=devs[0], backend=b.name)
    before = [r[0] for r in replicas]
    md.train_batch(X, X, replicas, devs, lr=0.25, loss=_square_loss)
    for d, (r,), old in zip(devs, replicas, before):
        np.testing.assert_array_equal(_values(b, r), [1.5], err_msg=f"train_batch's step on {d}: 3 - 0.25 * 6")
        if idiom is not None:
            assert r is old, f"train_batch replaced the parameter on {d} instead of updating it in place"
            why = _is_parameter(b, idiom, r, src)
            assert why is None, f"after train_batch the replica on {d} is no parameter: {why}"


# -- the framework's autodiff ----------------------------------------------------------------------
def test_value_and_grad_of_a_known_function(md_backend: Any, md_devices: list) -> None:
    """``value_and_grad`` of ``sum(w * w * X + 3 * c)`` gives that value and the gradients
    ``2 w X``, ``3`` and zeros for a parameter the loss does not use, each with its parameter's
    shape, dtype and device; the parameters (and their gradient slots) are left as they were."""
    b = md_backend
    dev = _target(md_devices)
    w0, c0, u0, X0 = [1.0, -2.0, 3.0], [0.5, 0.25, -1.0], [4.0, 5.0, 6.0], [2.0, 1.0, -1.0]
    params = [_vec(b, v, dev) for v in (w0, c0, u0)]
    X = _vec(b, X0, dev)
    slots = [_grad_state(p) for p in params]

    def loss(ps: list[Any], X: Any) -> Any:  # elementwise: its sum is the loss
        return ps[0] * ps[0] * X + 3.0 * ps[1]

    value, grads = b.training.value_and_grad(loss, params, (X,))
    w, c, Xn = (np.array(v) for v in (w0, c0, X0))
    np.testing.assert_allclose(float(_values(b, value).sum()), float(np.sum(w * w * Xn + 3 * c)), rtol=1e-6,
                               err_msg="the loss value")
    assert len(grads) == 3, f"{len(grads)} gradients for 3 parameters"
    for i, (g, expect) in enumerate(zip(grads, (2 * w * Xn, np.full(3, 3.0), np.zeros(3)))):
        assert md.device_of(g) == dev, f"gradient {i} on {md.device_of(g)}, its parameter on {dev}"
        assert md.dtype_of(g) == "float32", f"gradient {i} in {md.dtype_of(g)}"
        assert b.shape_of(g) == (3,), f"gradient {i} has shape {b.shape_of(g)}"
        np.testing.assert_allclose(_values(b, g), expect, rtol=1e-6, err_msg=f"gradient {i}")
    for i, (p, v, slot) in enumerate(zip(params, (w0, c0, u0), slots)):
        np.testing.assert_array_equal(_values(b, p), v, err_msg=f"value_and_grad changed parameter {i}")
        after = _grad_state(p)
        assert (slot is None) == (after is None), f"value_and_grad filled parameter {i}'s own gradient slot"


def _scaled(k: float) -> Callable[..., Any]:
    return lambda ps, X: ps[0] * X * k  # one code object, a closure per k


def test_two_losses_give_their_own_gradients(md_backend: Any, md_devices: list) -> None:
    """Each loss function gets its own gradient, however alike they look (lambdas of one name,
    closures of one code object), called in any order, directly and through ``train_batch``."""
    b = md_backend
    dev = _target(md_devices)
    w = _vec(b, [3.0], dev)
    X = _vec(b, [2.0], dev)
    losses: list[tuple[Callable[..., Any], float]] = [
        (lambda ps, X: ps[0] * X, 2.0),             # d/dw (w X) = X
        (lambda ps, X: ps[0] * ps[0] * X, 12.0),    # d/dw (w w X) = 2 w X
        (_scaled(5.0), 10.0),
        (_scaled(-1.0), -2.0),
    ]
    for order in (losses, losses[::-1]):
        for i, (fn, expect) in enumerate(order):
            _, (g,) = b.training.value_and_grad(fn, [w], (X,))
            np.testing.assert_allclose(_values(b, g), [expect], rtol=1e-6,
                                       err_msg=f"loss {i} got another loss's gradient")
    # through train_batch (its losses wrapped alike: one name, one code object), from the same start
    y = _vec(b, [2.0], dev)
    X1 = b.reshape(y, (1, 1))
    for i, (fn, expect) in enumerate(losses):
        replicas = md.replicate([_vec(b, [3.0], dev)], [dev])
        md.train_batch(X1, y, replicas, [dev], lr=0.5, loss=lambda ps, X, y, fn=fn: fn(ps, y))
        np.testing.assert_allclose(_values(b, replicas[0][0]), [3.0 - 0.5 * expect], rtol=1e-6,
                                   err_msg=f"train_batch with loss {i} stepped along another loss's gradient")
