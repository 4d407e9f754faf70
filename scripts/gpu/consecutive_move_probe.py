"""Consecutive large moves (round 25: the models suite's MLP move, 84 MB cpu:0 -> gpu:0, read 0.67-0.89x
``jax.device_put(tree, device)`` one move a sample, but 1.16-1.19x at ``--sample-time 20``, three moves a
sample): D2L's MLP parameters (1024-4096-4096-10, on JAX's CPU device) put on the device by ``md.to``, by
``md.to`` with the staged upload off (the adapter's staging threshold raised past the largest array), and
by ``jax.device_put`` of the tree; K moves back to back a sample (each result dropped as the next comes, as
the bench's inner loop does, or all kept), then waited for (every result kept, and the device synchronized,
as the bench's samples end); the variants in turn, medians of
``--rounds`` rounds, per move.

    python scripts/gpu/consecutive_move_probe.py [--device gpu:0] [--rounds 30] [--k 1,3]
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlp_tree import mlp_setup

setup = mlp_setup(30)
args, target, dst, host, tree = setup.args, setup.target, setup.dst, setup.host, setup.tree

import jax  # noqa: E402

import multidev as md  # noqa: E402

b = md.backend("jax")
staging = b.staging
threshold = staging.threshold


def md_to() -> Any:
    return md.to(tree, target)


def md_unstaged() -> Any:
    staging.threshold = 1 << 62
    try:
        return md.to(tree, target)
    finally:
        staging.threshold = threshold


def native() -> Any:
    return jax.device_put(tree, dst)


variants = {"md.to": md_to, "md.to, not staged": md_unstaged, "jax.device_put(tree)": native}
for f in variants.values():
    jax.block_until_ready(f())
for k in (int(v) for v in args.k.split(",")):
    for keep in (False, True):
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, f in variants.items():
                kept: list[Any] = []
                r = None
                t0 = time.perf_counter()
                for _ in range(k):
                    r = f()
                    if keep:
                        kept.append(r)
                jax.block_until_ready(kept or r)
                md.synchronize(target)  # (and the device's every transfer, as the bench's samples end)
                times[name].append((time.perf_counter() - t0) / k)
                del r, kept
        base = statistics.median(times["jax.device_put(tree)"])
        print(f"{k} move(s) a sample, results {'kept' if keep else 'dropped as the next comes'} (ms a move, median of "
              f"{args.rounds}): " + ", ".join(f"{n} {statistics.median(v) * 1e3:.3f} "
                                              f"({statistics.median(v) / base:.2f}x)" for n, v in times.items()),
              flush=True)
