"""The Python of ``md.to`` on a JAX pytree, without the copies: ``jax.device_put`` replaced by a function
that returns its input, so what is timed is multidev's walk, checks and routes against the floor walk
of ``scripts/gpu/tree_move_probe.py`` (``floor_to``) on the models suite's LeNet parameters (10
arrays in 5 dicts), and the parts of the call one by one. Best of 15 blocks of 2,000 calls (1,000 for
the whole call), each variant in turn; ``--profile`` adds a cProfile of ``md.to`` by own time.

    python scripts/bench/tree_move_python.py [--device gpu:0] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cpu:1")
ap.add_argument("--profile", action="store_true")
args = ap.parse_args()
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

import multidev as md  # noqa: E402
from multidev import api, trees  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lenet_tree import lenet_setup  # noqa: E402

s = lenet_setup(args.device)
jax, b, target, dst, tree, leaves, floor_to = s.jax, s.b, s.target, s.dst, s.tree, s.leaves, s.floor_to
jax.device_put = lambda xs, device=None, **kw: xs  # (md's adapter and the floor read it from the module)


def best(f: Callable[[], Any], n: int = 2000) -> float:
    for _ in range(200):
        f()
    out = float("inf")
    for _ in range(15):
        t = time.perf_counter()
        for _ in range(n):
            f()
        out = min(out, (time.perf_counter() - t) / n * 1e6)
    return out


ident = lambda xs: xs
rows = {
    "md.to(tree, device)": (lambda: md.to(tree, target), 1000),
    "floor_to(tree, device) (the probe's floor)": (lambda: floor_to(tree, target), 1000),
    "  trees._plain_map, identity batch": (lambda: trees._plain_map(None, tree, None, ident, "to"), 2000),
    "  api._moved_all(leaves)": (lambda: api._moved_all(leaves, target), 2000),
    "  b.move_all(leaves)": (lambda: b.move_all(leaves, target), 2000),
    "  b.device_of(x) for the 10 leaves": (lambda: [b.device_of(x) for x in leaves], 2000),
    "  x.sharding for the 10 leaves": (lambda: [x.sharding for x in leaves], 2000),
    "  trees.tree_map as md.to calls it, identity batch": (
        lambda: trees.tree_map(ident, tree, "to", module=ident, check=lambda b: api.resolve(b, target),
                               scalar=ident, batch=ident), 2000),
    "  api.resolve(b, device)": (lambda: api.resolve(b, target), 2000),
    "  md.device(device) spelled": (lambda: md.device(args.device), 2000),
}
sh = leaves[0].sharding
print(f"{type(sh).__name__} has _device: {hasattr(sh, '_device')}; device_of's class test: "
      f"{sh.__class__ is getattr(b, '_single', None)}")
print(f"jax {jax.__version__}, {len(leaves)} leaves, cpu:0 -> {target}, device_put stubbed; best of 15 blocks "
      "(us a call):")
for k, (f, n) in rows.items():
    print(f"  {best(f, n):8.2f}  {k}")
if args.profile:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20000):
        md.to(tree, target)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())
