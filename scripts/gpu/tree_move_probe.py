"""Where md.to of a JAX pytree spends its time on a real host -> GPU move (issue 36's LeNet row: 1.33-1.35x
``jax.device_put(tree, device)`` on an H100 in the models suite after round 17): D2L's LeNet parameters (a
dict per layer, on JAX's CPU device) put on gpu:0 by ``md.to``, by ``jax.device_put`` of the tree, of
its leaves as a list and leaf by leaf, by the adapter's ``move_all`` alone, and by the floor of any
Python walk (``floor_to``: each node read once, each leaf's class and device read, the dicts' order
kept, one ``device_put`` of the list); every variant once per round in turn, the result waited for,
medians of 300 rounds; then cProfiles of md.to (top 30 by own and by cumulative time). ``--inner N``
times N calls back to back before the wait, as the bench's inner loop does (the copies then overlap
the next calls' Python, which adds in full). ``--device cpu:1`` runs it between two virtual CPU
devices instead.

    python scripts/gpu/tree_move_probe.py [--device gpu:0] [--inner 20] [--bench-sync]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time
from typing import Any

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="gpu:0")
ap.add_argument("--rounds", type=int, default=300)
ap.add_argument("--inner", type=int, default=1, help="calls per sample, back to back, then one wait (the bench's "
                "inner loop: dispatch overlaps the copies, so multidev's Python adds in full)")
ap.add_argument("--bench-sync", action="store_true", help="as the bench samples: every device synchronized by the "
                "adapter around each sample, the garbage collector off, torch loaded")
args = ap.parse_args()
if args.inner < 1 or args.rounds < 1:
    ap.error("--inner and --rounds take a positive count")
if args.device.startswith("cpu"):
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import multidev as md  # noqa: E402
from multidev.registry import cached_owner  # noqa: E402

if args.bench_sync:
    import gc

    import torch  # noqa: F401
    md.backend("torch")

b = md.backend("jax")
target = md.device(args.device)
dst = b.to_native_device(target)
host = b.to_native_device(md.device("cpu:0"))
rng = np.random.default_rng(0)
shapes = {"conv1": (6, 1, 5, 5), "conv2": (16, 6, 5, 5), "fc1": (400, 120), "fc2": (120, 84), "fc3": (84, 10)}
tree = jax.device_put({k: {"w": rng.normal(size=s).astype(np.float32), "b": np.zeros(s[0] if len(s) == 4 else s[1],
                                                                                    np.float32)}
                       for k, s in shapes.items()}, host)
leaves = jax.tree_util.tree_leaves(tree)
md.to(tree, target)  # (the JAX array class seen once)
owner = cached_owner(type(leaves[0]))


def floor_to(obj: Any, dev: md.Device) -> Any:
    """The least Python a move of a structure can do and keep ``md.to``'s contract: each node read once,
    each leaf's class known and its device read, the dicts' order kept, one ``device_put`` of the list,
    the structure rebuilt (no validation of anything else, no dedupe of tied tensors, no routes)."""
    shape: list[Any] = []
    xs: list[Any] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        cls = type(x)
        if cls is dict:
            keys = list(x)
            vals = [x[k] for k in keys]
            shape.append((dict, len(vals), keys))
            stack.extend(reversed(vals))
        elif cls is list or cls is tuple:
            vals = list(x)
            shape.append((cls, len(vals), None))
            stack.extend(reversed(vals))
        else:
            if cached_owner(cls) is not owner:
                raise TypeError(cls)
            xs.append(x)
            shape.append(None)
    away = [owner.device_of(x) is not dev for x in xs]
    ys = iter(jax.device_put([x for x, m in zip(xs, away) if m], dst))
    out = [next(ys) if m else x for x, m in zip(xs, away)]
    built: list[Any] = []
    i = len(out)
    for node in reversed(shape):
        if node is None:
            i -= 1
            built.append(out[i])
            continue
        c, n, keys = node
        items = built[len(built) - n:][::-1] if n else []
        del built[len(built) - n:]
        built.append(items if c is list else tuple(items) if c is tuple else dict(zip(keys, items)))
    return built[0]


variants = {
    "md.to(tree, device)": lambda: md.to(tree, target),
    "jax.device_put(tree, device)": lambda: jax.device_put(tree, dst),
    "jax.device_put(leaves, device)": lambda: jax.device_put(leaves, dst),
    "[jax.device_put(leaf, device) ...]": lambda: [jax.device_put(x, dst) for x in leaves],
    "b.move_all(leaves, device)": lambda: b.move_all(leaves, target),
    "floor: a minimal Python walk + device_put(list)": lambda: floor_to(tree, target),
}
times: dict[str, list[float]] = {k: [] for k in variants}
for _ in range(20):
    for f in variants.values():
        jax.block_until_ready(f())
devs = [md.device("cpu:0"), target]


def sync() -> None:
    if args.bench_sync:
        for d in devs:
            b.synchronize(d)


if args.bench_sync:
    gc.collect()
    gc.disable()
for _ in range(args.rounds):
    for k, f in variants.items():
        sync()
        t = time.perf_counter()
        for _ in range(args.inner):
            r = f()
        jax.block_until_ready(r)
        sync()
        times[k].append((time.perf_counter() - t) / args.inner)
        del r
base = statistics.median(times["jax.device_put(tree, device)"])
print(f"{len(leaves)} leaves, cpu:0 -> {target}, median of {args.rounds} alternating rounds, {args.inner} call(s) "
      "a sample:")
for k, v in times.items():
    m = statistics.median(v)
    print(f"  {m * 1e6:9.1f} us  ({m / base:4.2f}x the tree put)  {k}")
for sort in ("tottime", "cumulative"):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        jax.block_until_ready(md.to(tree, target))
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(sort).print_stats(30)
    print(s.getvalue())
