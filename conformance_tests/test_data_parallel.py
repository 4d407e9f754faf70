"""Data parallelism (``SupportsDataParallel``, :func:`multidev.data_parallel`): a model trained over
several devices of one process follows one device on the same batches within float tolerance;
its replicas stay bitwise equal after every step (the replica's fingerprints, ``dp.verify()``);
every replica starts from the model given, and a replica's ``load`` (what the broadcast of rank 0's
state writes on the other ranks) reaches every device it spans. With ``--multiprocess``: 2 ranks
seeded apart hold rank 0's state after ``data_parallel()``, follow one process on the whole batch
and stay bitwise equal.

The model is the framework's own, made the way the framework makes one, found by what it exposes
(never by the backend's name): a module with ``nn.Linear`` and ``optim.SGD`` (torch's idiom), a
Keras ``Dense`` layer with a Keras optimizer, a Gluon ``Dense`` block with its ``Trainer``, else a
tree of the backend's tensors with a plain SGD transformation (``init``/``update``, optax's
interface). A tiny linear model, a few steps: the whole suite runs on every backend in CI."""
from __future__ import annotations

import functools
import itertools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device

from ._helpers import as_f64, need_devices, ordered

pytestmark = [pytest.mark.md_feature("data_parallel"), pytest.mark.md_requires("SupportsDataParallel")]

#: Steps each check trains, rows of each batch (a multiple of every device count used: JAX shards
#: rows evenly), the learning rate of the plain SGD every idiom uses.
STEPS, ROWS, LR = 3, 8, 0.1
#: Devices the several-device checks use at most (the suite's virtual CPU devices give 4).
MAX_DEVICES = 4
#: float32 parameters after a few steps over differently split batches: sums in another order.
RTOL, ATOL = 1e-5, 1e-6


@dataclass
class Model:
    """A framework's own linear model (3 inputs, 2 outputs: one layer, or a stack of layers of
    ``sizes``), its optimizer and a mean-squared-error loss ``loss_fn(model, (X, y))``, made by one
    of the idioms below."""

    model: Any
    optimizer: Any
    loss_fn: Callable[..., Any]
    idiom: str


#: The one layer of the default model (3 inputs, 2 outputs).
ONE_LAYER = (3, 2)


def _weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    return g.standard_normal((3, 2)).astype(np.float32), g.standard_normal(2).astype(np.float32)


def _layers(seed: int, sizes: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each layer's weight (inputs x outputs) and bias: :func:`_weights` for the one-layer model."""
    if tuple(sizes) == ONE_LAYER:
        return [_weights(seed)]
    g = np.random.default_rng(seed)
    return [((g.standard_normal((a, c)) / np.sqrt(a)).astype(np.float32), g.standard_normal(c).astype(np.float32))
            for a, c in itertools.pairwise(sizes)]


def _torch_like(fw: Any, b: Any, dev: Device, seed: int, momentum: float, sizes: tuple[int, ...]) -> Model | None:
    nn: Any = getattr(fw, "nn", None)
    optim: Any = getattr(fw, "optim", None)
    if not (hasattr(nn, "Linear") and hasattr(nn, "Sequential") and hasattr(optim, "SGD") and hasattr(fw, "no_grad")):
        return None
    layers = [nn.Linear(W.shape[0], W.shape[1]) for W, _ in _layers(seed, sizes)]
    with fw.no_grad():
        for lin, (W, bias) in zip(layers, _layers(seed, sizes)):
            lin.weight.copy_(fw.as_tensor(W.T.copy()))
            lin.bias.copy_(fw.as_tensor(bias))
    net = md.to(layers[0] if len(layers) == 1 else nn.Sequential(*layers), dev)

    def loss_fn(m: Any, batch: Any) -> Any:
        d = m(batch[0]) - batch[1]
        return (d * d).mean()

    return Model(net, optim.SGD(net.parameters(), lr=LR, momentum=momentum), loss_fn, "nn.Module + optim.SGD")


def _keras_like(fw: Any, b: Any, dev: Device, seed: int, momentum: float, sizes: tuple[int, ...]) -> Model | None:
    keras: Any = sys.modules.get("keras") or getattr(fw, "keras", None)
    if not (hasattr(getattr(keras, "layers", None), "Dense") and hasattr(fw, "GradientTape")
            and hasattr(fw, "device") and hasattr(fw, "reduce_mean")):
        return None
    with fw.device(b.to_native_device(dev)):
        net = keras.Sequential([keras.Input((sizes[0],)), *(keras.layers.Dense(c) for c in sizes[1:])])
        net.set_weights([a for layer in _layers(seed, sizes) for a in layer])
        opt = keras.optimizers.SGD(learning_rate=LR, momentum=momentum)

    def loss_fn(m: Any, batch: Any) -> Any:
        d = m(batch[0]) - batch[1]
        return fw.reduce_mean(d * d)

    return Model(net, opt, loss_fn, "Keras Dense + keras.optimizers.SGD")


def _gluon_like(fw: Any, b: Any, dev: Device, seed: int, momentum: float, sizes: tuple[int, ...]) -> Model | None:
    gluon: Any = getattr(fw, "gluon", None)
    if not (hasattr(getattr(gluon, "nn", None), "Dense") and hasattr(gluon, "Trainer") and hasattr(fw, "nd")):
        return None
    ctx = b.to_native_device(dev)
    dense = [gluon.nn.Dense(W.shape[1], in_units=W.shape[0]) for W, _ in _layers(seed, sizes)]
    if len(dense) == 1:
        net = dense[0]
    else:
        net = gluon.nn.Sequential()
        net.add(*dense)
    net.initialize(ctx=ctx)
    for layer, (W, bias) in zip(dense, _layers(seed, sizes)):
        layer.weight.set_data(fw.nd.array(W.T.copy(), ctx=ctx))
        layer.bias.set_data(fw.nd.array(bias, ctx=ctx))
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR, "momentum": momentum})

    def loss_fn(m: Any, batch: Any) -> Any:
        d = m(batch[0]) - batch[1]
        return (d * d).mean()

    return Model(net, trainer, loss_fn, "Gluon Dense + gluon.Trainer")


class PlainSGD:
    """SGD with momentum (``v = momentum * v + g``, ``p - lr * v``) as an optax-style
    transformation (``init``/``update``) over a dict of tensors; its state is ``v``."""

    def __init__(self, lr: float, momentum: float) -> None:
        self.lr, self.momentum = lr, momentum

    def init(self, params: Any) -> Any:
        return {k: p * 0 for k, p in params.items()}

    def update(self, grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        v = {k: state[k] * self.momentum + g for k, g in grads.items()}
        return {k: u * -self.lr for k, u in v.items()}, v


def _tree_like(fw: Any, b: Any, dev: Device, seed: int, momentum: float, sizes: tuple[int, ...]) -> Model | None:
    layers = _layers(seed, sizes)
    tags = [""] if len(layers) == 1 else [str(k) for k in range(len(layers))]
    params = {}
    for tag, (W, bias) in zip(tags, layers):
        params[f"b{tag}"] = md.asarray(bias, device=dev, backend=b.name)
        params[f"w{tag}"] = md.asarray(W, device=dev, backend=b.name)

    def loss_fn(p: Any, batch: Any) -> Any:
        h = batch[0]
        for tag in tags:
            h = h @ p[f"w{tag}"] + p[f"b{tag}"]
        d = h - batch[1]
        return (d * d).mean()

    return Model(params, PlainSGD(LR, momentum), loss_fn, "a tree of tensors + an init/update SGD")


def make_model(b: Any, dev: Device, seed: int = 0, momentum: float = 0.0, sizes: tuple[int, ...] = ONE_LAYER) -> Model:
    """The framework's own model on ``dev`` (SGD with ``momentum``; linear layers of ``sizes``, no
    activation between them), or skip where the suite knows no idiom of it that ``data_parallel``
    takes."""
    fw = sys.modules.get(b.framework)
    for idiom in (_torch_like, _keras_like, _gluon_like, _tree_like):
        m = idiom(fw, b, dev, seed, momentum, tuple(sizes))
        if m is not None and b.parallel.data_parallel_replica(m.model, m.optimizer, [dev]) is not None:
            return m
    pytest.skip(f"{b.name}: the suite knows no way to make a {b.framework} model that data_parallel takes "
                "(a torch-like module, a Keras model, a Gluon block, a tree of tensors with an init/update optimizer)")


def wrap(b: Any, m: Model, **kwargs: Any) -> Any:
    """``md.data_parallel`` of ``m``, its replica made by the adapter under test (another loaded
    adapter of the framework must not take the model for its own)."""
    devs = [md.device(d) for d in kwargs.get("devices") or ()]
    try:
        dp = md.data_parallel(m.model, m.optimizer, **kwargs)
    except md.CapabilityError as e:
        if len({d.kind for d in devs}) > 1:  # (cpu:0 beside one GPU: the suite's only "several")
            pytest.skip(f"{b.name} refuses data parallelism over devices of several kinds, typed: {e}")
        raise
    owner = dp.replica.backend
    assert owner.name == b.name, f"data_parallel took the {m.idiom} model for {owner.name}'s, not {b.name}'s"
    return dp


def _host_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(100 + step)
    return g.standard_normal((ROWS, 3)).astype(np.float32), g.standard_normal((ROWS, 2)).astype(np.float32)


def batch(b: Any, dev: Device, step: int) -> tuple[Any, Any]:
    X, y = _host_batch(step)
    return md.asarray(X, device=dev, backend=b.name), md.asarray(y, device=dev, backend=b.name)


def concatenated(b: Any, dev: Device, steps: range) -> tuple[Any, Any]:
    """The batches of ``steps`` as one batch (their rows one after another)."""
    parts = [_host_batch(k) for k in steps]
    return (md.asarray(np.concatenate([p[0] for p in parts]), device=dev, backend=b.name),
            md.asarray(np.concatenate([p[1] for p in parts]), device=dev, backend=b.name))


#: Micro-batches of an accumulated step (all but the last inside ``no_sync``), the batches they use,
#: and the layers of the model the accumulation and bucket checks train (several parameters).
MICRO, MICRO_BATCHES, LAYERS = 3, range(10, 13), (3, 5, 4, 2)


def scaled(loss_fn: Callable[..., Any], k: int) -> Callable[..., Any]:
    """``loss_fn`` divided by ``k``: ``k`` micro-batches' gradients add up to the mean over their rows."""
    def micro_loss(model: Any, bt: Any) -> Any:
        return loss_fn(model, bt) * (1.0 / k)
    return micro_loss


def params_of(b: Any, dp: Any) -> list[tuple[str, np.ndarray]]:
    """The replica's parameters now (its first device's), as float64 host copies."""
    return [(n, as_f64(b, t)) for n, t in dp.replica.parameters()]


def one_kind(md_devices: list) -> list[Device]:
    """The devices in the suite's order (accelerators first), those of one kind where a kind has two
    or more (GPUs first): a replica over one GPU and cpu:0 is the fallback, not the rule."""
    devs = ordered(md_devices)
    for kind in dict.fromkeys(d.kind for d in devs):
        same = [d for d in devs if d.kind == kind]
        if len(same) >= 2:
            return same
    return devs


def several(md_devices: list) -> list[Device]:
    """2 to MAX_DEVICES devices of the backend (of one kind where it can, accelerators first), or skip."""
    devs = one_kind(md_devices)
    need_devices(devs, 2)
    return devs[:MAX_DEVICES]


def assert_replicas_equal(dp: Any, n: int, when: str) -> None:
    rows = dp.replica.fingerprints()
    assert len(rows) == n, f"{when}: the replica over {n} devices gives {len(rows)} fingerprint rows (one per device)"
    for d, row in enumerate(rows[1:], 1):
        diff = [name for (name, _), a, c in zip(dp.replica.parameters(), rows[0], row) if a != c]
        assert row == rows[0], (f"{when}: the replica on {dp.devices[d]} differs bitwise from the one on "
                                f"{dp.devices[0]} ({', '.join(diff) or 'buffers'})")
    dp.verify()


# -- several devices of one process ---------------------------------------------------------------
def test_data_parallel_over_devices_matches_one_device(md_backend: Any, md_devices: list) -> None:
    """K steps over N devices on batch B give one device's parameters on batch B (within float
    tolerance: the gradient is averaged over the devices, weighted by rows), and the loss is the
    whole batch's; the parameters moved (the steps did something)."""
    b = md_backend
    devs = several(md_devices)
    one_m, many_m = make_model(b, devs[0]), make_model(b, devs[0])
    one = wrap(b, one_m)
    many = wrap(b, many_m, devices=devs)
    start = params_of(b, one)
    for k in range(STEPS):
        X, y = batch(b, devs[0], k)
        l1 = as_f64(b, one.step((X, y), one_m.loss_fn))
        ln = as_f64(b, many.step((X, y), many_m.loss_fn))
        np.testing.assert_allclose(ln, l1, rtol=RTOL, atol=ATOL,
                                   err_msg=f"step {k}: the loss over {len(devs)} devices is not the batch's")
        for (name, p1), (_, pn) in zip(params_of(b, one), params_of(b, many)):
            np.testing.assert_allclose(pn, p1, rtol=RTOL, atol=ATOL, err_msg=(
                f"step {k} ({many_m.idiom}): {name} over {len(devs)} devices is not one device's on the same batch "
                "(the gradients are not averaged over the devices)"))
    moved = [name for (name, p0), (_, p1) in zip(start, params_of(b, one)) if not np.array_equal(p0, p1)]
    assert moved, f"{STEPS} steps left every parameter as it was"


def test_data_parallel_replicas_stay_bitwise_equal(md_backend: Any, md_devices: list) -> None:
    """After every step every device's replica holds bitwise the same parameters (one fingerprint
    row per device, all equal; ``dp.verify()`` passes), and with ``verify=True`` the step checks it
    itself."""
    b = md_backend
    devs = several(md_devices)
    m = make_model(b, devs[0])
    dp = wrap(b, m, devices=devs, verify=True)
    assert_replicas_equal(dp, len(devs), "before the first step")
    for k in range(STEPS):
        dp.step(batch(b, devs[0], k), m.loss_fn)
        assert_replicas_equal(dp, len(devs), f"after step {k}")


# -- the start, and what the broadcast writes -------------------------------------------------------
def _devices_for_start(md_devices: list) -> list[Device]:
    devs = one_kind(md_devices)
    return devs[:min(MAX_DEVICES, len(devs))]


def test_data_parallel_replicas_start_from_the_model_given(md_backend: Any, md_devices: list) -> None:
    """Every device's replica starts with the parameters of the model given (bitwise), before any
    step: nothing re-initialised, nothing left at another value on a further device."""
    b = md_backend
    devs = _devices_for_start(md_devices)
    m = make_model(b, devs[0], seed=3)
    W, bias = _weights(3)
    dp = wrap(b, m, devices=devs)
    got = sorted((sorted(p.shape), p.ravel().tolist()) for _, p in params_of(b, dp))
    want = sorted((sorted(a.shape), a.ravel().tolist()) for a in (W, bias))
    want_t = sorted((sorted(a.shape), a.ravel().tolist()) for a in (W.T.copy(), bias))
    assert got in (want, want_t), f"the replica's parameters are not the model's ({m.idiom})"
    assert_replicas_equal(dp, len(devs), "after data_parallel()")


def test_data_parallel_load_reaches_every_device(md_backend: Any, md_devices: list) -> None:
    """``Replica.load`` (what the broadcast of rank 0's state, and ``broadcast_state``, write on
    the other ranks) makes the given values the parameters on every device of the replica; the next
    step starts from them (one device given the same values steps the same)."""
    b = md_backend
    devs = _devices_for_start(md_devices)
    m, ref_m = make_model(b, devs[0], seed=1), make_model(b, devs[0], seed=2)
    dp = wrap(b, m, devices=devs)
    ref = wrap(b, ref_m)  # seed 2: other values
    new = [t for _, t in ref.replica.parameters()]
    want = [as_f64(b, t) for t in new]
    assert any(not np.array_equal(a, c) for (_, a), c in zip(params_of(b, dp), want)), "seeds 1 and 2 gave one model"
    dp.replica.load(new, None)
    for (name, got), w in zip(params_of(b, dp), want):
        np.testing.assert_array_equal(got, w, err_msg=f"after load, {name} is not the value loaded ({m.idiom})")
    assert_replicas_equal(dp, len(devs), "after load")
    X, y = batch(b, devs[0], 0)
    dp.step((X, y), m.loss_fn)
    ref.step((X, y), ref_m.loss_fn)
    for (name, got), (_, w) in zip(params_of(b, dp), params_of(b, ref)):
        np.testing.assert_allclose(got, w, rtol=RTOL, atol=ATOL, err_msg=f"the step after load did not start from "
                                   f"the loaded {name}")
    assert_replicas_equal(dp, len(devs), "after a step from the loaded values")


def test_data_parallel_accumulation_matches_one_step_on_the_concatenated_batch(md_backend: Any,
                                                                              md_devices: list) -> None:
    """``MICRO - 1`` steps inside ``dp.no_sync()`` leave the parameters as they are (the gradients
    only accumulate); the step after the block, on the last micro-batch, gives what one step on
    the micro-batches' rows together does (each micro-batch's loss divided by ``MICRO``), within
    float tolerance, over the backend's devices (up to MAX_DEVICES; one where it has one)."""
    b = md_backend
    devs = _devices_for_start(md_devices)
    m, ref_m = make_model(b, devs[0], sizes=LAYERS), make_model(b, devs[0], sizes=LAYERS)
    dp = wrap(b, m, devices=devs)
    ref = wrap(b, ref_m)
    start = params_of(b, dp)
    micro = scaled(m.loss_fn, MICRO)
    with dp.no_sync():
        for k in MICRO_BATCHES[:-1]:
            dp.step(batch(b, devs[0], k), micro)
    for (name, p0), (_, p1) in zip(start, params_of(b, dp)):
        np.testing.assert_array_equal(p1, p0, err_msg=f"a step inside no_sync() changed {name} (it only accumulates)")
    dp.step(batch(b, devs[0], MICRO_BATCHES[-1]), micro)
    ref.step(concatenated(b, devs[0], MICRO_BATCHES), ref_m.loss_fn)
    for (name, got), (_, want) in zip(params_of(b, dp), params_of(b, ref)):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=(
            f"{name} after {MICRO - 1} micro-batches in no_sync() and one step over {len(devs)} device(s) is not one "
            f"step's on their rows together ({m.idiom}): the accumulated gradients are not their sum"))
    assert_replicas_equal(dp, len(devs), "after the accumulated step")


# -- one process per device (with --multiprocess) --------------------------------------------------
#: The ranks of the cross-process checks, and the seconds their rendezvous and collectives may take.
WORLD, WORKER_TIMEOUT = 2, 20.0
#: The momentum of the cross-process checks' SGD: its state must be rank 0's too (broadcast).
MOMENTUM = 0.9
#: The gradient bucket of the bucket checks, in bytes: the float32 parameters of LAYERS (in a torch
#: module's order 15, 5, 20, 4, 8 and 2 values, planned last layer first) fall into 4 buckets: 2 + 8
#: + 4 values (a bucket of three parameters), 20 (one larger than a bucket, alone), 5, and an
#: odd-sized last of 15 (a tree's sorted leaves give another plan of 4).
BUCKET_BYTES = 64


@functools.cache
def engine() -> str:
    """The engine the cross-process checks run on: the one plain ``init()`` has served since before
    engines were pluggable (gloo, on every machine), one launch per backend rather than one per
    engine (the collectives themselves are the distributed checks')."""
    from multidev.distributed.engine import legacy_engine

    return legacy_engine()


def _host_lists(b: Any, dp: Any) -> list[list[float]]:
    return [p.ravel().tolist() for _, p in params_of(b, dp)]


@functools.cache
def _processes(backend: str) -> list[dict[str, Any]]:
    """One launch of ``WORLD`` ranks on :func:`engine`: each makes the model from its own seed
    (its rank) and, past rank 0, trains it a step alone first (its optimizer state apart too),
    then ``data_parallel`` and ``STEPS`` steps on its share of the same global batches; each
    reports its parameters and fingerprints after ``data_parallel()`` and after every step. Then
    each trains a model of LAYERS with buckets of BUCKET_BYTES: ``STEPS`` steps, then ``MICRO - 1``
    micro-batches inside ``no_sync()`` and one after it, reporting the bucket plan, the bucket
    collectives each phase started (``dp.sync.collectives``) and the parameters after each."""
    from .plugin import imports_of, spec_of
    from .test_distributed import launch_group, worker_env

    extra = {"MULTIDEV_CONFORMANCE_IMPORT": ",".join(imports_of()), "MULTIDEV_JAX_CPU_DEVICES": "2"}
    argv = [sys.executable, "-m", "multidev.conformance.test_data_parallel", spec_of(backend), str(WORKER_TIMEOUT)]
    return launch_group(engine(), WORLD, argv, env=worker_env(**extra), what=f"{backend}/data_parallel")


def _across(b: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ranks' reports, and what one process on one device does from rank 0's model and
    optimizer state on the whole batches (``start``, then ``steps``: parameters after each)."""
    from .test_distributed import need_engine

    need_engine(engine(), b.name)
    dev = b.devices()[0]
    m = make_model(b, dev, seed=0, momentum=MOMENTUM)
    ref = wrap(b, m)
    want: dict[str, Any] = {"start": _host_lists(b, ref), "steps": []}
    for k in range(STEPS):
        ref.step(batch(b, dev, k), m.loss_fn)
        want["steps"].append(_host_lists(b, ref))
    reports = _processes(b.name)
    for rep in reports:
        if rep["rc"] != 0 or not rep.get("ok"):
            pytest.fail(f"rank {rep['rank']} of the data-parallel launch exited with {rep['rc']}:\n"
                        f"{rep.get('err', '')[-4000:]}")
    return reports, want


def _across_buckets(b: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ranks' reports, and what one process on one device does with the model of LAYERS: the
    parameters after each of ``STEPS`` steps on the whole batches, then after one step on the
    micro-batches' rows together."""
    reports, _ = _across(b)
    dev = b.devices()[0]
    m = make_model(b, dev, seed=7, momentum=MOMENTUM, sizes=LAYERS)
    ref = wrap(b, m)
    want: dict[str, Any] = {"steps": []}
    for k in range(STEPS):
        ref.step(batch(b, dev, k), m.loss_fn)
        want["steps"].append(_host_lists(b, ref))
    ref.step(concatenated(b, dev, MICRO_BATCHES), m.loss_fn)
    want["accumulated"] = _host_lists(b, ref)
    for rep in reports:
        n = len(rep["buckets"])
        assert n >= 3 and sum(rep["buckets"]) == len(want["steps"][0]), (
            f"rank {rep['rank']}: buckets of {BUCKET_BYTES} bytes over the {len(want['steps'][0])} parameters of "
            f"{LAYERS} gave the plan {rep['buckets']} (several buckets, every parameter in one)")
    return reports, want


def _assert_close(got: list[list[float]], want: list[list[float]], what: str) -> None:
    for i, (g, e) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=f"{what}: parameter {i}")


@pytest.mark.multiprocess
def test_data_parallel_across_processes_averages_every_bucket(md_backend: Any) -> None:
    """With buckets of BUCKET_BYTES (several: a bucket of three parameters, one parameter larger
    than a bucket, an odd-sized last one), each step starts one collective per bucket and every
    parameter, on every rank, is what one process does on the whole batch (within float
    tolerance): no bucket's gradients stay local or are left out, and the ranks stay bitwise
    equal."""
    reports, want = _across_buckets(md_backend)
    for rep in reports:
        n = len(rep["buckets"])
        assert rep["bucket_collectives"] == [n] * STEPS, (
            f"rank {rep['rank']}: the steps started {rep['bucket_collectives']} bucket collectives, not one per "
            f"bucket ({n})")
        for k, (got, expect) in enumerate(zip(rep["bucket_steps"], want["steps"])):
            _assert_close(got, expect, f"rank {rep['rank']}, step {k} with {n} buckets {rep['buckets']}: not one "
                          "process's on the whole batch (a bucket's gradients were not averaged over the ranks)")
        assert rep["bucket_fingerprint"] == reports[0]["bucket_fingerprint"], (
            f"rank {rep['rank']}'s model differs bitwise from rank 0's after the bucketed steps")


@pytest.mark.multiprocess
def test_data_parallel_across_processes_no_sync_does_not_communicate(md_backend: Any) -> None:
    """``MICRO - 1`` steps inside ``dp.no_sync()`` start no bucket collective and leave the
    parameters as they are; the step after it starts one per bucket, and then every rank holds
    what one process's one step on all the micro-batches' rows gives (their losses divided by
    ``MICRO``): the accumulated gradients are averaged once, and their sum is right."""
    reports, want = _across_buckets(md_backend)
    for rep in reports:
        r, n = rep["rank"], len(rep["buckets"])
        assert rep["no_sync_collectives"] == 0, (
            f"rank {r}: {MICRO - 1} steps inside no_sync() started {rep['no_sync_collectives']} bucket collectives "
            "(accumulation must not communicate)")
        assert rep["no_sync_params"] == rep["bucket_steps"][-1], (
            f"rank {r}: a step inside no_sync() changed the parameters (it only accumulates)")
        assert rep["closing_collectives"] == n, (
            f"rank {r}: the step after no_sync() started {rep['closing_collectives']} bucket collectives, not {n}")
        _assert_close(rep["accumulated"], want["accumulated"], f"rank {r}: after {MICRO - 1} micro-batches in "
                      "no_sync() and one step, not one step's on their rows together")
        assert rep["accumulated_fingerprint"] == reports[0]["accumulated_fingerprint"], (
            f"rank {r}'s model differs bitwise from rank 0's after the accumulated step")


@pytest.mark.multiprocess
def test_data_parallel_across_processes_starts_from_rank_0(md_backend: Any) -> None:
    """Ranks that made their models from different seeds (and stepped them apart) hold rank 0's
    parameters, bitwise, once ``data_parallel()`` returns: the initial broadcast reached them."""
    reports, want = _across(md_backend)
    for rep in reports:
        assert rep["start"] == want["start"], (
            f"rank {rep['rank']}'s parameters after data_parallel() are not rank 0's (the initial broadcast did not "
            f"reach them): {rep['start']} vs {want['start']}")
        assert rep["start_fingerprint"] == reports[0]["start_fingerprint"], f"rank {rep['rank']} after data_parallel()"


@pytest.mark.multiprocess
def test_data_parallel_across_processes_averages_gradients(md_backend: Any) -> None:
    """Each of ``WORLD`` ranks stepping on its share of a batch gives, after every step, what one
    process does on the whole batch (within float tolerance): the gradients are averaged over the
    ranks, with rank 0's optimizer state."""
    reports, want = _across(md_backend)
    for rep in reports:
        for k, (got, expect) in enumerate(zip(rep["steps"], want["steps"])):
            for i, (g, e) in enumerate(zip(got, expect)):
                np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=(
                    f"rank {rep['rank']}, step {k}: parameter {i} is not one process's on the whole batch (the "
                    "gradients are not the mean over the ranks)"))


@pytest.mark.multiprocess
def test_data_parallel_across_processes_keeps_ranks_bitwise_equal(md_backend: Any) -> None:
    """After every step every rank holds bitwise rank 0's parameters (equal fingerprints), and
    ``dp.verify()`` on every rank agrees."""
    reports, _ = _across(md_backend)
    for rep in reports[1:]:
        for k, (mine, first) in enumerate(zip(rep["fingerprints"], reports[0]["fingerprints"])):
            assert mine == first, f"after step {k} rank {rep['rank']}'s replica differs bitwise from rank 0's"
    for rep in reports:
        assert rep["verify"] == "ok", f"rank {rep['rank']}: dp.verify() after the steps: {rep['verify']}"


def _worker(spec: str, timeout: float) -> int:
    """A rank of :func:`_processes`."""
    import importlib

    from multidev import distributed as dist
    from multidev.registry import prefer

    for mod in filter(None, os.environ.get("MULTIDEV_CONFORMANCE_IMPORT", "").split(",")):
        importlib.import_module(mod)
    dist.init(timeout=timeout)
    r = dist.rank()
    b: Any = md.backend(spec)
    out: dict[str, Any] = {"rank": r}
    with prefer(b.name):
        dev = b.devices()[0]
        m = make_model(b, dev, seed=r, momentum=MOMENTUM)
        if r:  # apart on purpose: other parameters, and an optimizer state of its own
            alone = b.parallel.data_parallel_replica(m.model, m.optimizer, [dev])
            alone.backward(batch(b, dev, 50 + r), m.loss_fn, None)
            alone.apply(None)
            m.model = alone.model
        dp = wrap(b, m)
        out.update(start=_host_lists(b, dp), start_fingerprint=dp.replica.fingerprints()[0], steps=[],
                   fingerprints=[])
        for k in range(STEPS):
            dp.step(dp.shard(batch(b, dev, k)), m.loss_fn)
            out["steps"].append(_host_lists(b, dp))
            out["fingerprints"].append(dp.replica.fingerprints()[0])
        try:
            dp.verify()
            out["verify"] = "ok"
        except md.ReplicaMismatchError as e:
            out["verify"] = str(e)
        out.update(_buckets_and_accumulation(b, dev))
    dist.shutdown()
    print("MDREPORT " + json.dumps({**out, "ok": True}), flush=True)
    return 0


def _buckets_and_accumulation(b: Any, dev: Device) -> dict[str, Any]:
    """The bucketed and accumulated steps of a rank (:func:`_processes`)."""
    m = make_model(b, dev, seed=7, momentum=MOMENTUM, sizes=LAYERS)
    dp = wrap(b, m, bucket_mb=BUCKET_BYTES / 2**20)
    sync = dp.sync
    out: dict[str, Any] = {"buckets": [len(k) for k in sync.buckets], "bucket_collectives": [], "bucket_steps": []}
    for k in range(STEPS):
        before = sync.collectives
        dp.step(dp.shard(batch(b, dev, k)), m.loss_fn)
        out["bucket_collectives"].append(sync.collectives - before)
        out["bucket_steps"].append(_host_lists(b, dp))
    out["bucket_fingerprint"] = dp.replica.fingerprints()[0]
    micro = scaled(m.loss_fn, MICRO)
    before = sync.collectives
    with dp.no_sync():
        for k in MICRO_BATCHES[:-1]:
            dp.step(dp.shard(batch(b, dev, k)), micro)
    out["no_sync_collectives"] = sync.collectives - before
    out["no_sync_params"] = _host_lists(b, dp)
    before = sync.collectives
    dp.step(dp.shard(batch(b, dev, MICRO_BATCHES[-1])), micro)
    out["closing_collectives"] = sync.collectives - before
    out["accumulated"] = _host_lists(b, dp)
    out["accumulated_fingerprint"] = dp.replica.fingerprints()[0]
    return out


if __name__ == "__main__":
    rc = 1
    try:
        rc = _worker(sys.argv[1], float(sys.argv[2]))
    finally:
        from multidev.distributed import detect_launch

        found = detect_launch()
        print(f"MDDONE {int(found[0].rank or 0) if found else 0} {rc}", flush=True)
    sys.exit(rc)
