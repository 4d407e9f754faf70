"""multidev.replicate, broadcast of parameters, the None-gradient error and multidev.train_batch on
every installed backend. Each backend's checks run in one subprocess with 2 virtual devices (device
counts are fixed when a framework starts); each check is reported and asserted separately."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev.errors import CapabilityError, CollectiveInputError, InvalidArgumentError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workers import installed, run_worker

# Per framework: make(host array, device) -> a parameter in the framework's idiom; is_param(x) ->
# whether x is one; loss(params, X, y) summed squared error; plain(x) a tensor that is no parameter.
FRAMEWORK = {
    "numpy": """
        make = lambda a, d: md.asarray(a, device=d, backend=NAME)
        is_param = lambda x: True
        plain = make
        loss = None
        def grad(ps, X, y):
            w, b = ps
            r = X @ w + b - y
            return (r * r).sum(keepdims=True) / 2, [X.T @ r, r.sum(axis=0)]
    """,
    "torch": """
        import torch
        make = lambda a, d: md.asarray(a, device=d, backend=NAME).requires_grad_()
        is_param = lambda x: x.is_leaf and x.requires_grad
        plain = lambda a, d: md.asarray(a, device=d, backend=NAME)
        def loss(ps, X, y):
            w, b = ps
            return ((X @ w + b - y) ** 2).sum() / 2
    """,
    "jax": """
        import jax
        make = plain = lambda a, d: md.asarray(a, device=d, backend=NAME)
        is_param = lambda x: isinstance(x, jax.Array)
        def loss(ps, X, y):
            w, b = ps
            return ((X @ w + b - y) ** 2).sum() / 2
    """,
    "tensorflow": """
        import tensorflow as tf
        def make(a, d):
            with tf.device(md.backend(NAME).to_native_device(d)):
                return tf.Variable(md.asarray(a, device=d, backend=NAME))
        is_param = lambda x: isinstance(x, tf.Variable)
        plain = lambda a, d: md.asarray(a, device=d, backend=NAME)
        def loss(ps, X, y):
            w, b = ps
            return tf.reduce_sum((X @ w + b - y) ** 2) / 2
    """,
    "mxnet": """
        from mxnet import autograd, nd
        def make(a, d):
            x = md.asarray(a, device=d, backend=NAME)
            x.attach_grad()
            return x
        is_param = lambda x: x.grad is not None
        plain = lambda a, d: md.asarray(a, device=d, backend=NAME)
        def loss(ps, X, y):
            w, b = ps
            return ((nd.dot(X, w) + b - y) ** 2).sum() / 2
    """,
}

WORKER = """
FRAMEWORK
devs = md.devices(backend=NAME)[:2]
rng = np.random.default_rng(0)
W = rng.normal(size=(4, 1)).astype(np.float32)
Xh = rng.normal(size=(48, 4)).astype(np.float32)
yh = (Xh @ W + 0.5).astype(np.float32)

@check
def replicate_gives_parameters():
    src = [make(W, devs[0]), make(np.zeros(1, np.float32), devs[0])]
    reps = md.replicate(src, devs)
    assert len(reps) == len(devs) and all(len(r) == 2 for r in reps)
    for d, r in zip(devs, reps):
        for p, s in zip(r, src):
            assert md.device_of(p) == d and is_param(p), (d, type(p))
            assert p is not s and np.array_equal(host(p), host(s))

@check
def broadcast_of_a_parameter_is_a_parameter():
    for p, d in zip(md.broadcast(make(W, devs[0]), devs), devs):
        assert md.device_of(p) == d and is_param(p)

@check
def replicate_of_plain_tensors_stays_plain():
    r = md.replicate([plain(W, devs[0])], devs)
    if NAME == "torch":
        assert not r[0][0].requires_grad
    if NAME == "mxnet":
        assert r[0][0].grad is None
    if NAME == "tensorflow":
        import tensorflow as tf
        assert not isinstance(r[-1][0], tf.Variable)

@check
def d2l_manual_loop_has_gradients():
    if NAME not in ("torch", "mxnet"):
        return  # the .grad idiom: frameworks with gradient buffers
    reps = md.replicate([make(W, devs[0]), make(np.zeros(1, np.float32), devs[0])], devs)
    X = md.asarray(Xh, device=devs[0], backend=NAME)
    y = md.asarray(yh, device=devs[0], backend=NAME)
    Xs, ys = md.split_batch(X, y, devs)
    if NAME == "torch":
        for ps, a, b in zip(reps, Xs, ys):
            loss(ps, a, b).backward()
    else:
        for ps, a, b in zip(reps, Xs, ys):
            with autograd.record():
                l = loss(ps, a, b)
            l.backward()
    for i in range(2):
        md.allreduce([ps[i].grad for ps in reps], inplace=True)  # no None: the replicas are leaves
    assert np.allclose(host(reps[0][0].grad), host(reps[-1][0].grad))
    assert np.abs(host(reps[0][0].grad)).sum() > 0

def train(n, steps=30):
    devices = devs[:n]
    reps = md.replicate([make(np.zeros((4, 1), np.float32), devs[0]), make(np.zeros(1, np.float32), devs[0])],
                        devices)
    X = md.asarray(Xh, device=devs[0], backend=NAME)
    y = md.asarray(yh, device=devs[0], backend=NAME)
    kw = {"loss": loss} if loss is not None else {"grad": grad}
    first = reps[0][0]
    losses = [md.train_batch(X, y, reps, devices, 0.1, **kw) for _ in range(steps)]
    return reps, losses, first

@check
def train_batch_on_two_devices_matches_one():
    r1, l1, _ = train(1)
    r2, l2, _ = train(len(devs))
    assert l1[-1] < l1[0] / 100, l1
    np.testing.assert_allclose(l1, l2, rtol=1e-4, atol=1e-6)
    for a, b in zip(r1[0], r2[-1]):
        np.testing.assert_allclose(host(a), host(b), rtol=1e-4, atol=1e-6)
    for r in r2[1:]:
        for a, b in zip(r2[0], r):
            assert np.array_equal(host(a), host(b)), "replicas diverged"

@check
def train_batch_keeps_parameters_parameters():
    reps, _, first = train(len(devs), steps=2)
    for d, r in zip(devs, reps):
        for p in r:
            assert is_param(p) and md.device_of(p) == d
    if NAME in ("torch", "mxnet", "tensorflow"):
        assert reps[0][0] is first  # updated in place
    if NAME == "torch":
        assert reps[0][0].grad is None  # train_batch never fills .grad

@check
def value_and_grad_zeros_for_unused_parameters():
    if loss is None:
        return
    b = md.backend(NAME)
    ps = [make(W, devs[0]), make(np.ones(3, np.float32), devs[0])]
    X = md.asarray(Xh, device=devs[0], backend=NAME)
    y = md.asarray(yh, device=devs[0], backend=NAME)
    value, gs = b.training.value_and_grad(lambda ps, X, y: loss([ps[0], ps[0][0] * 0], X, y), ps, (X, y))
    assert np.allclose(host(gs[1]), 0) and host(gs[1]).shape == (3,)
    assert md.device_of(gs[0]) == devs[0] and md.device_of(gs[1]) == devs[0]
    r = Xh @ W - yh
    np.testing.assert_allclose(host(gs[0]), Xh.T @ r, rtol=1e-4, atol=1e-4)
    assert np.isclose(float(np.sum(host(value))), float((r * r).sum() / 2), rtol=1e-4)
"""

_CACHE: dict[str, dict[str, str]] = {}


def _results(name: str) -> dict[str, str]:
    if name not in _CACHE:
        _CACHE[name] = run_worker(WORKER.replace("FRAMEWORK", textwrap.dedent(FRAMEWORK[name])), name)
    return _CACHE[name]


CHECKS = ["replicate_gives_parameters", "broadcast_of_a_parameter_is_a_parameter",
          "replicate_of_plain_tensors_stays_plain", "d2l_manual_loop_has_gradients",
          "train_batch_on_two_devices_matches_one", "train_batch_keeps_parameters_parameters",
          "value_and_grad_zeros_for_unused_parameters"]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", installed())
def test_backend(name: str, check: str) -> None:
    got = _results(name)
    assert got.get(check) == "OK", got.get(check, f"check {check} did not run")


# -- core behaviour, on the NumPy backend (no framework in this process) -------------------------
def _grad(ps: list[Any], X: Any, y: Any) -> tuple[Any, list[Any]]:
    w, b = ps
    r = X @ w + b - y
    return (r * r).sum(keepdims=True) / 2, [X.T @ r, r.sum(axis=0)]


def _setup() -> tuple[list[Any], list[list[Any]], Any, Any]:
    devs = md.devices(backend="numpy")[:2]
    reps = md.replicate([md.zeros((3, 1), backend="numpy"), md.zeros(1, backend="numpy")], devs)
    X = md.asarray(np.ones((8, 3), np.float32), backend="numpy")
    y = md.asarray(np.ones((8, 1), np.float32), backend="numpy")
    return devs, reps, X, y


def test_none_gradient_says_what_to_check() -> None:
    with pytest.raises(CollectiveInputError, match="requires grad.*backward"):
        md.allreduce([None, None])
    devs, reps, X, y = _setup()
    with pytest.raises(InvalidArgumentError, match="parameter 1 .* is None"):
        md.train_batch(X, y, reps, devs, 0.1, grad=lambda ps, X, y: (X.sum(keepdims=True), [X.T @ X[:, :1], None]))


def test_train_batch_arguments_are_checked_before_anything_changes() -> None:
    devs, reps, X, y = _setup()
    before = [[np.array(p) for p in r] for r in reps]
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        md.train_batch(X, y, reps, devs, 0.1)
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        md.train_batch(X, y, reps, devs, 0.1, loss=_grad, grad=_grad)
    with pytest.raises(InvalidArgumentError, match="one per device"):
        md.train_batch(X, y, reps[:1], devs, 0.1, grad=_grad)
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        md.train_batch(X, y, reps, devs, 0.1, grad=_grad, batch_size=0)
    with pytest.raises(InvalidArgumentError, match="2 gradients for 3"):
        md.train_batch(X, y, [r + [r[0]] for r in reps], devs, 0.1, grad=lambda ps, X, y: _grad(ps[:2], X, y))
    assert all(np.array_equal(a, np.array(p)) for ra, r in zip(before, reps) for a, p in zip(ra, r))


def test_numpy_has_no_autodiff() -> None:
    devs, reps, X, y = _setup()
    with pytest.raises(CapabilityError, match="no automatic differentiation.*grad="):
        md.train_batch(X, y, reps, devs, 0.1, loss=lambda ps, X, y: X.sum())


def test_train_batch_uses_the_global_batch_size() -> None:
    devs, reps, X, y = _setup()
    md.train_batch(X, y, reps, devs, 0.1, grad=_grad)
    # one step from zero: w = 0.1 * X^T y / 8 = 0.1 on every weight, b = 0.1
    assert np.allclose(np.array(reps[1][0]), 0.1) and np.allclose(np.array(reps[1][1]), 0.1)
    devs, reps2, X, y = _setup()
    md.train_batch(X, y, reps2, devs, 0.1, grad=_grad, batch_size=4)
    assert np.allclose(np.array(reps2[0][0]), 0.2)


def test_replicate_refuses_what_is_no_parameter_list() -> None:
    devs = md.devices(backend="numpy")[:2]
    with pytest.raises(InvalidArgumentError):
        md.replicate(md.zeros(3, backend="numpy"), devs)
    with pytest.raises(InvalidArgumentError):
        md.replicate([], devs)
