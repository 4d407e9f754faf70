"""Does a NumPy source written right after an upload returns change the uploaded result, and what does
making the source free on return cost? (rounds 27-28)

Part 1, for each size, ``--trials`` times: a NumPy array put on the GPU by ``jax.device_put`` (whole),
by one ``device_put`` of its 16 MiB pieces' list, and by ``md.asarray(..., backend="jax")`` (this
checkout's, which copies a small source first and waits for a larger one's transfer), the source
overwritten at once, the result compared with the original values afterwards.

Part 2, the caller's time per upload (median over ``--reps`` alternated rounds), for each size: JAX's
own ``device_put`` (which may still read the source), ``device_put`` of a fresh copy, ``device_put``
then the wait for its transfer, and md.asarray; one upload a sample ("alone": the time until the call
returns, then the time until the result is ready) and ``--row`` uploads of distinct sources in a row
(the time until the last call returns, per upload).

    python scripts/gpu/put_source_probe.py [--device gpu:0] [--trials 5] [--sizes-mib 1,4,16,32,64,256]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

import multidev as md
from multidev.adapter import split_pieces

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from put_timing import returns_and_ready

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="gpu:0")
ap.add_argument("--trials", type=int, default=5)
ap.add_argument("--sizes-mib", default="1,4,16,32,64,256")
ap.add_argument("--time-sizes-kib", default="4,64,256,1024,4096,16384,65536")
ap.add_argument("--reps", type=int, default=15)
ap.add_argument("--row", type=int, default=8)
args = ap.parse_args()
target = md.device(args.device)
dst = md.backend("jax").to_native_device(target)
ways = {
    "device_put whole": lambda a: jax.device_put(a, dst),
    "device_put of 16 MiB pieces": lambda a: jax.device_put(split_pieces(a, 16 << 20), dst),
    "md.asarray": lambda a: md.asarray(a, device=target, backend="jax"),
}
print("== part 1: the source written at once after the call returns", flush=True)
for mib in (int(v) for v in args.sizes_mib.split(",")):
    want = np.random.default_rng(mib).random((mib << 20) // 4, dtype=np.float32)
    for name, put in ways.items():
        changed = 0
        for _ in range(args.trials):
            a = want.copy()
            y = put(a)
            a[:] = -1.0  # (at once, as a caller reusing its buffer would)
            got = np.concatenate([np.asarray(p) for p in y]) if isinstance(y, list) else np.asarray(y)
            changed += not np.array_equal(got, want)
        print(f"{mib} MiB, {name}: result changed by the later write in {changed} of {args.trials}", flush=True)


def put_waited(a):
    y = jax.device_put(a, dst)
    y.block_until_ready()
    return y


timed = {
    "jax device_put": lambda a: jax.device_put(a, dst),
    "device_put(copy)": lambda a: jax.device_put(a.copy(), dst),
    "device_put+wait": put_waited,
    "md.asarray": lambda a: md.asarray(a, device=target, backend="jax"),
}
print(f"== part 2: the caller's time (us), median of {args.reps} alternated rounds; 'row': {args.row} in a row",
      flush=True)
for kib in (int(v) for v in args.time_sizes_kib.split(",")):
    srcs = [np.random.default_rng(i).random((kib << 10) // 4, dtype=np.float32) for i in range(args.row)]
    ret: dict[str, list[float]] = {k: [] for k in timed}
    done: dict[str, list[float]] = {k: [] for k in timed}
    row: dict[str, list[float]] = {k: [] for k in timed}
    for put in timed.values():  # warm-up (compiles md's join where it stages)
        jax.block_until_ready([put(s) for s in srcs[:2]])
    for _ in range(args.reps):
        for name, put in timed.items():
            r, d = returns_and_ready(put, srcs[0])
            ret[name].append(r)
            done[name].append(d)
            t0 = time.perf_counter()
            ys = [put(s) for s in srcs]
            t1 = time.perf_counter()
            jax.block_until_ready(ys)
            row[name].append((t1 - t0) * 1e6 / len(srcs))
            del ys
    base = statistics.median(ret["jax device_put"])
    for name in timed:
        r, d, w = (statistics.median(v[name]) for v in (ret, done, row))
        print(f"{kib} KiB {name:18s} alone: returns {r:9.1f} ({r / base:5.2f}x JAX's), ready {d:9.1f};"
              f" in a row {w:9.1f} a put", flush=True)
