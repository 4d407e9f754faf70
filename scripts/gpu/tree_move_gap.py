"""Where md.to of a JAX pytree loses time against ``jax.device_put(tree)`` on a real move (issue 36's LeNet
row), split at the transfer's start: ``jax.device_put`` is wrapped to note when it is entered and left,
so each sample reads the Python before the transfer (call -> device_put entered), the put's own call,
the Python after it (device_put left -> the variant returned) and the whole sample (to the result
waited for). The variants, each once per round in turn (medians of ``--rounds``):

- the tree put, the adapter's ``move_all`` of the leaves, ``api._moved_all`` (md.to's batch: the
  leaves' devices read, then ``move_all``), ``md.to``, and the probe's floor walk
  (``scripts/gpu/tree_move_probe.py``'s ``floor_to``);
- the floor with 10 us of spinning Python added before its put, and after it: what serial Python
  costs a real move at each place (1:1 before the transfer starts; after it, hidden under the copy
  where the copy is longer).

    python scripts/gpu/tree_move_gap.py [--device gpu:0] [--rounds 300]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="gpu:0")
ap.add_argument("--rounds", type=int, default=300)
args = ap.parse_args()
if args.rounds < 1:
    ap.error("--rounds takes a positive count")
if args.device.startswith("cpu"):
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import multidev as md  # noqa: E402
from multidev import api  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from lenet_tree import lenet_setup  # noqa: E402

s = lenet_setup(args.device)
jax, b, target, dst, tree, leaves, floor_to = s.jax, s.b, s.target, s.dst, s.tree, s.leaves, s.floor_to

marks = [0.0, 0.0]
put = jax.device_put


def noted_put(*a: Any, **k: Any) -> Any:
    marks[0] = time.perf_counter()
    r = put(*a, **k)
    marks[1] = time.perf_counter()
    return r


jax.device_put = noted_put  # (the adapter and the floor read it from the module at each call)


def spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def floor_spun_before() -> Any:
    spin(10)
    return floor_to(tree, target)


def floor_spun_after() -> Any:
    r = floor_to(tree, target)
    spin(10)
    return r


variants = {
    "jax.device_put(tree, device)": lambda: noted_put(tree, dst),
    "b.move_all(leaves, device)": lambda: b.move_all(leaves, target),
    "api._moved_all(leaves, device)": lambda: api._moved_all(leaves, target),
    "md.to(tree, device)": lambda: md.to(tree, target),
    "floor_to(tree, device)": lambda: floor_to(tree, target),
    "floor, 10 us of Python before its put": floor_spun_before,
    "floor, 10 us of Python after its put": floor_spun_after,
}
parts: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in variants}
for _ in range(20):
    for f in variants.values():
        jax.block_until_ready(f())
for _ in range(args.rounds):
    for k, f in variants.items():
        t0 = time.perf_counter()
        r = f()
        t2 = time.perf_counter()
        jax.block_until_ready(r)
        t3 = time.perf_counter()
        parts[k].append((marks[0] - t0, marks[1] - marks[0], t2 - marks[1], t3 - t0))
        del r
base = statistics.median(p[3] for p in parts["jax.device_put(tree, device)"])
print(f"jax {jax.__version__}, {len(leaves)} leaves, cpu:0 -> {target}, medians of {args.rounds} alternating rounds "
      "(us): before the put | the put's call | after it | whole sample (ratio to the tree put)")
for k, v in parts.items():
    m = [statistics.median(p[i] for p in v) * 1e6 for i in range(4)]
    print(f"  {m[0]:7.1f} | {m[1]:7.1f} | {m[2]:7.1f} | {m[3]:8.1f} ({m[3] / (base * 1e6):4.2f}x)  {k}")
