"""``md.data_parallel`` on GPUs (issue 32's GPU rows), one JSON of checks and figures on stdout's
last line (``MDRESULT {...}``): run by ``scripts/gpu/data-parallel.sh``.

- torch, one GPU: ``dp.step`` against the plain loop on ``gpu:0`` (bitwise the same parameters) and
  their median step times (the ratio: issue 32's goal is <= 1.03x);
- torch, every GPU of the process (two or more): ``devices=[gpu:0, gpu:1, ...]`` against one GPU on
  the same batches (float tolerance), the replicas bitwise equal (``verify``);
- JAX, every GPU: the sharded step against one GPU, the replicated parameters bitwise equal.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from typing import Any

import numpy as np

import multidev as md

results: dict[str, Any] = {}


def check(fn: Any) -> Any:
    try:
        out = fn()
        results[fn.__name__] = {"ok": True, **(out or {})}
    except Exception:  # noqa: BLE001 - reported
        results[fn.__name__] = {"ok": False, "error": traceback.format_exc(limit=6)}
    return fn


def torch_net(torch: Any) -> Any:
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * 7 * 7, 256), nn.ReLU(), nn.Linear(256, 10))


@check
def torch_one_gpu() -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.deterministic = True
    dev = md.gpu(0)
    a, b = md.to(torch_net(torch), dev), md.to(torch_net(torch), dev)
    oa = torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9)
    ob = torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.9)
    dp = md.data_parallel(a, oa)
    g = torch.Generator(device="cuda").manual_seed(0)
    X = torch.randn(256, 1, 28, 28, device="cuda", generator=g)
    y = torch.randint(0, 10, (256,), device="cuda", generator=g)

    def loss_fn(m: Any, batch: Any) -> Any:
        return F.cross_entropy(m(batch[0]), batch[1])

    def plain() -> None:
        ob.zero_grad()
        loss_fn(b, (X, y)).backward()
        ob.step()

    times: dict[str, list[float]] = {"md": [], "native": []}
    for i in range(130):
        for label, fn in (("md", lambda: dp.step((X, y), loss_fn)), ("native", plain)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            if i >= 30:
                times[label].append(time.perf_counter() - t0)
    same = all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    assert same, "the wrapped step's parameters differ from the plain loop's"
    return {"md_ms": med["md"], "native_ms": med["native"], "ratio": med["md"] / med["native"],
            "params_bitwise_equal": same}


@check
def torch_all_gpus() -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    n = torch.cuda.device_count()
    if n < 2:
        return {"skipped": f"{n} GPU: the several-GPU mode needs two"}
    devs = [md.gpu(i) for i in range(n)]
    one, many = md.to(torch_net(torch), devs[0]), md.to(torch_net(torch), devs[0])
    o1 = torch.optim.SGD(one.parameters(), lr=0.05, momentum=0.9)
    on = torch.optim.SGD(many.parameters(), lr=0.05, momentum=0.9)
    d1, dn = md.data_parallel(one, o1), md.data_parallel(many, on, devices=devs, verify=True)
    g = torch.Generator().manual_seed(0)

    def loss_fn(m: Any, batch: Any) -> Any:
        return F.cross_entropy(m(batch[0]), batch[1])

    for _ in range(5):
        X, y = torch.randn(64 * n, 1, 28, 28, generator=g), torch.randint(0, 10, (64 * n,), generator=g)
        d1.step((X.cuda(), y.cuda()), loss_fn)
        dn.step((X, y), loss_fn)
    diff = max(float((p - q).abs().max()) for p, q in zip(one.parameters(), many.parameters()))
    assert diff < 1e-3, diff  # BatchNorm: each GPU normalises with its own rows' statistics
    return {"gpus": n, "max_param_diff": diff}


@check
def jax_all_gpus() -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import optax

    gpus = [d for d in md.devices(backend="jax") if d.is_gpu]
    if not gpus:
        return {"skipped": "no JAX GPU"}
    rng = np.random.default_rng(0)
    p0 = {"w1": jnp.asarray(rng.standard_normal((784, 256), np.float32) * 0.05), "b1": jnp.zeros(256),
          "w2": jnp.asarray(rng.standard_normal((256, 10), np.float32) * 0.05), "b2": jnp.zeros(10)}

    def loss(p: Any, b: Any) -> Any:
        h = jax.nn.relu(b[0] @ p["w1"] + p["b1"])
        return optax.softmax_cross_entropy_with_integer_labels(h @ p["w2"] + p["b2"], b[1]).mean()

    one = md.data_parallel(md.to(p0, gpus[0]), optax.adam(1e-3), devices=gpus[:1])
    many = md.data_parallel(md.to(p0, gpus[0]), optax.adam(1e-3), devices=gpus, verify=True)
    for k in range(5):
        r = np.random.default_rng(10 + k)
        b = (jnp.asarray(r.standard_normal((64 * len(gpus), 784), np.float32)),
             jnp.asarray(r.integers(0, 10, 64 * len(gpus))))
        one.step(b, loss)
        many.step(b, loss)
    diff = max(float(jnp.abs(md.copy(many.model[k], gpus[0]) - one.model[k]).max()) for k in p0)
    assert diff < 1e-4, diff
    return {"gpus": len(gpus), "max_param_diff": diff}


@check
def jax_one_gpu() -> dict[str, Any]:
    """The wrapped step on one GPU against the JAX user's own: one jitted value_and_grad + optax
    update (the goal is <= 1.03x), parameters compared after the same steps."""
    import jax
    import jax.numpy as jnp
    import optax

    gpus = [d for d in md.devices(backend="jax") if d.is_gpu]
    if not gpus:
        return {"skipped": "no JAX GPU"}
    rng = np.random.default_rng(0)
    p0 = {"w1": jnp.asarray(rng.standard_normal((784, 1024), np.float32) * 0.05), "b1": jnp.zeros(1024),
          "w2": jnp.asarray(rng.standard_normal((1024, 10), np.float32) * 0.05), "b2": jnp.zeros(10)}
    tx = optax.adam(1e-3)

    def loss(p: Any, b: Any) -> Any:
        h = jax.nn.relu(b[0] @ p["w1"] + p["b1"])
        return optax.softmax_cross_entropy_with_integer_labels(h @ p["w2"] + p["b2"], b[1]).mean()

    @jax.jit
    def native_step(p: Any, s: Any, b: Any) -> Any:
        lv, g = jax.value_and_grad(loss)(p, b)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, lv

    dev = jax.devices("gpu")[0]
    b = (jax.device_put(jnp.asarray(rng.standard_normal((512, 784), np.float32)), dev),
         jax.device_put(jnp.asarray(rng.integers(0, 10, 512)), dev))
    dp = md.data_parallel(md.to(p0, gpus[0]), tx, devices=gpus[:1])
    p, s = jax.device_put(p0, dev), tx.init(jax.device_put(p0, dev))
    times: dict[str, list[float]] = {"md": [], "native": []}
    for i in range(230):
        t0 = time.perf_counter()
        lv = dp.step(b, loss)
        jax.block_until_ready((dp.model, lv))
        t1 = time.perf_counter()
        p, s, lv = native_step(p, s, b)
        jax.block_until_ready((p, lv))
        t2 = time.perf_counter()
        if i >= 30:
            times["md"].append(t1 - t0)
            times["native"].append(t2 - t1)
    diff = max(float(jnp.abs(dp.model[k] - p[k]).max()) for k in p0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    assert diff < 1e-5, diff
    return {"md_ms": med["md"], "native_ms": med["native"], "ratio": med["md"] / med["native"],
            "max_param_diff": diff}


ok = all(r["ok"] for r in results.values())
print("MDRESULT " + json.dumps(results))
sys.exit(0 if ok else 1)
