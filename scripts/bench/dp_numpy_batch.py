"""A data-parallel step on JAX with a NumPy batch (one CPU device), median µs a step over 15 blocks of
20 steps (round 28: the step copies a NumPy batch; run it with two checkouts' shadow trees on
PYTHONPATH, ``scripts/bench/shadow_tree.sh``, to compare them)::

    python scripts/bench/dp_numpy_batch.py ROWS FEATURES     # e.g. 256 784
"""
from __future__ import annotations

import statistics
import sys
import time

import jax.numpy as jnp
import numpy as np
import optax

import multidev as md

rows, feat = int(sys.argv[1]), int(sys.argv[2])
rng = np.random.default_rng(0)
X = rng.standard_normal((rows, feat), np.float32)
y = rng.standard_normal((rows, 1), np.float32)


def loss_fn(p, b):
    xs, ys = b
    return ((jnp.tanh(xs @ p["w1"]) @ p["w2"] - ys) ** 2).mean()


dp = md.data_parallel({"w1": jnp.zeros((feat, 256)), "w2": jnp.zeros((256, 1))}, optax.sgd(1e-3),
                      devices=md.devices(backend="jax")[:1])
for _ in range(5):
    float(dp.step((X, y), loss_fn))
per_step = []
for _ in range(15):
    t0 = time.perf_counter()
    for _ in range(20):
        loss = dp.step((X, y), loss_fn)
    float(loss)
    per_step.append((time.perf_counter() - t0) / 20 * 1e6)
print(md.__file__, rows, feat, "step us", round(statistics.median(per_step), 1))
