"""The JAX staged upload by size (round 27): a pageable NumPy array of 64 MiB to 1 GiB put on the GPU
- ``threads``: 16 MiB pieces put from the worker pool (``multidev.adapter.parallel_put``, round 2's way);
- ``list``: one ``device_put`` of the list of the 16 MiB pieces (``split_pieces``: the adapter's way now);
- ``whole``: one ``device_put`` of the array;
- ``md.asarray``: multidev's call (the list, joined);
each joined on the device (but ``whole``), K puts back to back a sample, then every result waited for;
once each, the source is written right after the call returns and the result checked unchanged;
the ways in turn, medians of ``--rounds``; GB/s a put. Each way's result is checked once.

    python scripts/gpu/staged_list_probe.py [--device gpu:0] [--rounds 8] [--sizes-mib 64,256,1024] [--k 1,3]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import multidev as md
from multidev.adapter import StagingPlan, parallel_put, split_pieces

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="gpu:0")
ap.add_argument("--rounds", type=int, default=8)
ap.add_argument("--sizes-mib", default="64,256,1024")
ap.add_argument("--k", default="1,3")
args = ap.parse_args()
target = md.device(args.device)
dst = md.backend("jax").to_native_device(target)
plan = StagingPlan(chunk=16 << 20, threshold=32 << 20)
join = jax.jit(lambda parts, shape: jnp.concatenate(parts).reshape(shape), static_argnums=1)
for mib in (int(v) for v in args.sizes_mib.split(",")):
    a = np.random.default_rng(0).random((mib << 20) // 4, dtype=np.float32)
    ways = {
        "threads": lambda a=a: join(tuple(parallel_put(a, lambda p: jax.device_put(p, dst), plan)), a.shape),
        "list": lambda a=a: join(tuple(jax.device_put(split_pieces(a, plan.chunk), dst)), a.shape),
        "whole": lambda a=a: jax.device_put(a, dst),
        "md.asarray": lambda a=a: md.asarray(a, device=target, backend="jax"),
    }
    for name, f in ways.items():
        ok = np.array_equal(np.asarray(f()), a)
        b = a.copy()
        y = f(b)  # (the source written once the call returns: the copy must not see it)
        b[:] = -1.0
        kept = np.array_equal(np.asarray(y), a)
        print(f"{mib} MiB {name}: result {'equal' if ok else 'DIFFERENT'}; source written after the call: "
              f"{'result unchanged' if kept else 'RESULT CHANGED'}", flush=True)
    for k in (int(v) for v in args.k.split(",")):
        times: dict[str, list[float]] = {n: [] for n in ways}
        for _ in range(args.rounds):
            for name, f in ways.items():
                kept: list[Any] = []
                t0 = time.perf_counter()
                for _ in range(k):
                    kept.append(f())
                jax.block_until_ready(kept)
                times[name].append((time.perf_counter() - t0) / k)
                del kept
        print(f"{mib} MiB, {k} put(s) a sample (GB/s a put, median of {args.rounds}): " + ", ".join(
            f"{n} {a.nbytes / statistics.median(v) / 1e9:.1f}" for n, v in times.items()), flush=True)
