"""md.asarray of a NumPy array onto a JAX CPU device, against round 27's way (``jnp.array(copy=True)``,
which copies after it returns) and the bandwidth suite's native row: the caller's time until the
call returns and until the result is ready (median of ``--reps`` alternated rounds), and in how many
rounds a write into the source right after the call returned reached the result (round 28)::

    python scripts/bench/asarray_source.py [--reps 15] [--sizes-kib 4,1024,32768]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import multidev as md

sys.path.insert(0, str(Path(__file__).resolve().parent))
from put_timing import returns_and_ready

ap = argparse.ArgumentParser()
ap.add_argument("--reps", type=int, default=15)
ap.add_argument("--sizes-kib", default="4,1024,32768")
args = ap.parse_args()
d = jax.devices("cpu")[0]
ways = {
    "md.asarray": lambda a: md.asarray(a, device="cpu:0", backend="jax"),
    "jnp.array(copy=True) (round 27's)": lambda a: jnp.array(a, copy=True, device=d),
    "device_put(may_alias=False)": lambda a: jax.device_put(a, d, may_alias=False),
}
print(f"jax {jax.__version__}, numpy {np.__version__}; us, median of {args.reps} alternated rounds")
for kib in (int(v) for v in args.sizes_kib.split(",")):
    want = np.random.default_rng(0).random((kib << 10) // 4, dtype=np.float32)
    ret: dict[str, list[float]] = {k: [] for k in ways}
    ready: dict[str, list[float]] = {k: [] for k in ways}
    changed = dict.fromkeys(ways, 0)
    for _ in range(args.reps):
        for name, f in ways.items():
            back, done = returns_and_ready(f, want.copy())
            ret[name].append(back)
            ready[name].append(done)
            a = want.copy()
            y = f(a)
            a[-1] = -1.0  # written at once, its last element first
            a[...] = -1.0
            changed[name] += not np.array_equal(np.asarray(y), want)
    for name in ways:
        print(f"{kib:6d} KiB {name:36s} returns {statistics.median(ret[name]):9.1f}  ready "
              f"{statistics.median(ready[name]):9.1f}  source written at once reached it in "
              f"{changed[name]} of {args.reps}")
