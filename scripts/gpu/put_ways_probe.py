"""Where md.asarray's time goes onto a GPU (round 28): JAX's device_put of the caller's array, of a
fresh copy, of an aligned copy (multidev.adapter.aligned_empty), the adapter's put_host (as it is,
copying everything under 32 MiB, waiting for everything), and md.asarray, alternated; median us
until the call returns and until the result is ready.

    python scripts/gpu/put_ways_probe.py [--device gpu:0] [--reps 21]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import jax
import numpy as np

import multidev as md
from multidev.adapter import aligned_empty

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from put_timing import returns_and_ready

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="gpu:0")
ap.add_argument("--reps", type=int, default=21)
ap.add_argument("--sizes-kib", default="4,256,1024,4096,16384")
args = ap.parse_args()
target = md.device(args.device)
jb = md.backend("jax")
dst = jb.to_native_device(target)


def aligned(a):
    o = aligned_empty(a.shape, a.dtype)
    np.copyto(o, a)
    return o


def put_host_with(copy_below: int):
    def put(a):
        old, jb.transfers.copy_below = jb.transfers.copy_below, copy_below
        try:
            return jb.transfers.put_host(a, dst)
        finally:
            jb.transfers.copy_below = old
    return put


ways = {
    "device_put(a)": lambda a: jax.device_put(a, dst),
    "device_put(a.copy())": lambda a: jax.device_put(a.copy(), dst),
    "device_put(aligned copy)": lambda a: jax.device_put(aligned(a), dst),
    "aligned copy alone": aligned,
    "put_host": lambda a: jb.transfers.put_host(a, dst),
    "put_host, copy < 32 MiB": put_host_with(32 << 20),
    "put_host, always waits": put_host_with(0),
    "jb.asarray": lambda a: jb.asarray(a, "float32", target),
    "md.asarray": lambda a: md.asarray(a, device=target, backend="jax"),
}
for kib in (int(v) for v in args.sizes_kib.split(",")):
    src = np.random.default_rng(0).random((kib << 10) // 4, dtype=np.float32)
    ret: dict[str, list[float]] = {k: [] for k in ways}
    rdy: dict[str, list[float]] = {k: [] for k in ways}
    for f in ways.values():
        jax.block_until_ready(f(src))
    for _ in range(args.reps):
        for k, f in ways.items():
            r, d = returns_and_ready(f, src)
            ret[k].append(r)
            rdy[k].append(d)
    for k in ways:
        print(f"{kib:6d} KiB {k:26s} returns {statistics.median(ret[k]):9.1f} ready {statistics.median(rdy[k]):9.1f}",
              flush=True)
