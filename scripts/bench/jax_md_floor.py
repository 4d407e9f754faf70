"""multidev's own time in a ``dist.allreduce`` of the jax engine, without a peer: one process (the
collective a local sum, so what is timed is the Python around it), ``ELEMS`` float32 values (default
16384), checks off, the caller's own dispatch (``FORCE=0``: the engine's rule, which sends this
one-process sum to its dispatch thread). Against the floor: the global array made from the caller's
array by ``jax.make_array_from_single_device_arrays``, the jitted sum, this process's piece taken.
``ROUNDS`` (default 20) blocks of 200 calls timed one by one each way, alternated; prints the
medians and the median of the paired blocks' differences. Run each checkout imported whole, from a
folder other than a checkout's root::

    PYTHONPATH=$(bash scripts/bench/shadow_tree.sh TREE) python -m multidev.distributed.launch -n 1 \\
        --engine jax scripts/bench/jax_md_floor.py
"""
from __future__ import annotations

import os
import statistics
import time

from multidev import distributed as dist
from multidev.distributed.group import current


def main() -> None:
    dist.init()
    import jax
    import jax.numpy as jnp

    dist.set_checks(False)
    eng = current().engine
    n = int(os.environ.get("ELEMS", "16384"))
    x = jnp.ones(n, jnp.float32)
    for _ in range(20):
        dist.allreduce(x)
    if os.environ.get("FORCE", "1") == "1":
        eng._costly_fns = set(eng._fns.values())
    f = jax.jit(lambda a: a.reshape((1, n)).sum(0), out_shardings=eng.whole)

    def md() -> object:
        return dist.allreduce(x).block_until_ready()

    def floor() -> object:
        g = jax.make_array_from_single_device_arrays((n,), eng.sharded, [x])
        return f(g).addressable_data(0).block_until_ready()

    res: dict[str, list[float]] = {"md": [], "floor": []}
    for r in range(int(os.environ.get("ROUNDS", "20"))):
        for name, w in (("md", md), ("floor", floor)) if r % 2 == 0 else (("floor", floor), ("md", md)):
            ts = []
            for _ in range(200):
                t = time.perf_counter()
                w()
                ts.append(time.perf_counter() - t)
            res[name].append(statistics.median(ts) * 1e6)
    diff = statistics.median([a - b for a, b in zip(res["md"], res["floor"], strict=True)])
    m, fl = statistics.median(res["md"]), statistics.median(res["floor"])
    print(f"{os.environ.get('TAG', '')} {n * 4} B, one process, JAX {jax.__version__}: md {m:.1f} floor {fl:.1f} "
          f"md-floor (median of paired blocks) {diff:.1f} us", flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
