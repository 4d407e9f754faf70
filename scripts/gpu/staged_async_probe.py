"""Could the staged upload of a large JAX CPU array be asynchronous (round 26)? D2L's MLP parameters
(1024-4096-4096-10, on JAX's CPU device; the arrays of 32 MiB and more cut into 16 MiB pieces, joined on
the device by one jitted concatenate, the rest put in one ``device_put`` of their list) put on the device:

- ``threads``: each piece's ``device_put`` of its NumPy view from a pool of 8 threads (multidev's staged
  upload, as ``parallel_put`` does it);
- ``numpy list``: one ``device_put`` of the list of the pieces' NumPy views;
- ``cpu alias``: the pieces' NumPy views put on the CPU device first (XLA aliases an aligned host
  buffer), then one ``device_put`` of that list of CPU arrays (a JAX array's put, which JAX need not
  finish reading before it returns);
- ``md.to``, ``md.to`` with its staged upload off (round 27), and ``jax.device_put(tree)``.

K moves back to back a sample (results kept), then waited for and the device synchronized; the variants
in turn, medians of ``--rounds`` rounds, per move; and, a move a sample, the time until the call returned
(before the wait). Each variant's result is checked against the tree once.

    python scripts/gpu/staged_async_probe.py [--device gpu:0] [--rounds 20] [--k 1,3]
"""
from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlp_tree import mlp_setup

setup = mlp_setup(20)
args, target, dst, host, tree = setup.args, setup.target, setup.dst, setup.host, setup.tree

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import multidev as md  # noqa: E402
from multidev.adapter import StagingPlan  # noqa: E402

CHUNK, BIG = 16 << 20, 32 << 20
pool = ThreadPoolExecutor(8)
join = jax.jit(lambda parts, shape: jnp.concatenate(parts).reshape(shape), static_argnums=1)


def cut(a: np.ndarray) -> list[np.ndarray]:
    flat = a.reshape(-1)
    step = CHUNK // flat.itemsize
    return [flat[i:i + step] for i in range(0, flat.size, step)]


def via(put_pieces: Any) -> Any:
    def move() -> Any:
        leaves, tdef = jax.tree_util.tree_flatten(tree)
        small = iter(jax.device_put([x for x in leaves if x.nbytes < BIG], dst))
        out = [join(tuple(put_pieces(cut(np.asarray(x)))), x.shape) if x.nbytes >= BIG else next(small)
               for x in leaves]
        return jax.tree_util.tree_unflatten(tdef, out)
    return move


jb = md.backend("jax")


def unstaged(f: Any) -> Any:
    """``f()`` with multidev's staged upload off (its threshold out of reach): the plain puts."""
    plan = jb.staging
    jb.staging = StagingPlan(chunk=plan.chunk, threshold=1 << 62)
    try:
        return f()
    finally:
        jb.staging = plan


variants = {
    "threads": via(lambda ps: [f.result() for f in [pool.submit(jax.device_put, p, dst) for p in ps]]),
    "numpy list": via(lambda ps: jax.device_put(ps, dst)),
    "cpu alias": via(lambda ps: jax.device_put(jax.device_put(ps, host), dst)),
    "md.to": lambda: md.to(tree, target),
    "md.to unstaged": lambda: unstaged(lambda: md.to(tree, target)),
    "jax.device_put(tree)": lambda: jax.device_put(tree, dst),
}
want = [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]
for name, f in variants.items():
    got = jax.tree_util.tree_leaves(f())
    ok = len(got) == len(want) and all(np.array_equal(np.asarray(g), w) for g, w in zip(got, want, strict=True))
    print(f"{name}: result {'equal' if ok else 'DIFFERENT'}; on {got[0].devices()}", flush=True)
pieces = cut(np.asarray(max(jax.tree_util.tree_leaves(tree), key=lambda x: x.nbytes)))  # (the 64 MiB weight's)
aliased = jax.device_put(pieces, host)
print(f"cpu alias shares the host buffer, {len(pieces)} pieces of the largest array:",
      [a.unsafe_buffer_pointer() == p.ctypes.data for a, p in zip(aliased, pieces, strict=True)], flush=True)
for k in (int(v) for v in args.k.split(",")):
    times: dict[str, list[float]] = {name: [] for name in variants}
    back: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, f in variants.items():
            kept: list[Any] = []
            t0 = time.perf_counter()
            for _ in range(k):
                kept.append(f())
            t1 = time.perf_counter()
            jax.block_until_ready(kept)
            md.synchronize(target)
            times[name].append((time.perf_counter() - t0) / k)
            back[name].append((t1 - t0) / k)
            del kept
    base = statistics.median(times["jax.device_put(tree)"])
    med = {n: (statistics.median(v), statistics.median(back[n])) for n, v in times.items()}
    print(f"{k} move(s) a sample (ms a move, median of {args.rounds}; returned after): " + ", ".join(
        f"{n} {t * 1e3:.2f} ({t / base:.2f}x; {r * 1e3:.2f})" for n, (t, r) in med.items()), flush=True)
