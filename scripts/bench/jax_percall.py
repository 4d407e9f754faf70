"""Per-call time of ``dist.allreduce`` of a 4 KiB float32 JAX array on the jax engine (checks off;
``CHECKS=1`` on): the median over 7 blocks of 100 calls, after 50 warm-up calls, rank 0's clock, and
the median of 700 calls timed one by one (each call's result waited for: its latency, which a
block's mean hides behind the slowest calls).
Run under the launcher, e.g. alternating two checkouts (each imported whole)::

    PYTHONPATH=$(bash scripts/bench/shadow_tree.sh OLD) python -m multidev.distributed.launch -n 2 \\
        --engine jax scripts/bench/jax_percall.py
"""
from __future__ import annotations

import os
import statistics
import time

from multidev import distributed as dist


def main() -> None:
    dist.init()
    import jax.numpy as jnp  # (after init: JAX's rule for jax.distributed)

    dist.set_checks(os.environ.get("CHECKS", "0") == "1")
    x = jnp.ones(1024, jnp.float32)
    for _ in range(50):
        y = dist.allreduce(x)
    blocks = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(100):
            y = dist.allreduce(x)
        y.block_until_ready()
        blocks.append((time.perf_counter() - t) / 100 * 1e6)
    each = []
    for _ in range(700):
        t = time.perf_counter()
        dist.allreduce(x).block_until_ready()
        each.append((time.perf_counter() - t) * 1e6)
    if dist.rank() == 0:
        q = statistics.quantiles(each, n=10)
        print(f"4 KiB dist.allreduce, jax engine, 2 processes: median {statistics.median(blocks):.0f} us "
              f"(blocks {[round(b) for b in blocks]}); one by one: median {statistics.median(each):.0f} us "
              f"(10th-90th percentile {q[0]:.0f}-{q[-1]:.0f} us)", flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
