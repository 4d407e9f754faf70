"""The JAX engine's dispatch from the caller against its dispatch thread, alternated in one process: a
``dist.allreduce`` of SIZE bytes (default 4 KiB) of float32, checks off, each call's result waited for,
the median of 300 calls one by one per block, ROUNDS (default 6) blocks of each in turn; the engine's
``_enqueues`` switched between blocks (False: every dispatch through the thread, as before round 22).
Rank 0 prints both medians of blocks and their ratio. Run under the launcher::

    python -m multidev.distributed.launch -n 2 --engine jax scripts/bench/jax_inline_ab.py
"""
from __future__ import annotations

import os
import statistics
import time

from multidev import distributed as dist
from multidev.distributed.group import current


def main() -> None:
    dist.init()
    import jax.numpy as jnp  # (after init: JAX's rule for jax.distributed)

    dist.set_checks(False)
    eng = current().engine
    size, rounds = int(os.environ.get("SIZE", "4096")), int(os.environ.get("ROUNDS", "6"))
    x = jnp.ones(size // 4, jnp.float32)
    meds: dict[str, list[float]] = {"caller": [], "thread": []}
    enqueues = eng._enqueues
    for _ in range(rounds):
        for k in meds:
            eng._enqueues = enqueues and k == "caller"
            for _ in range(30):
                dist.allreduce(x).block_until_ready()
            each = []
            for _ in range(300):
                t = time.perf_counter()
                dist.allreduce(x).block_until_ready()
                each.append((time.perf_counter() - t) * 1e6)
            meds[k].append(statistics.median(each))
    eng._enqueues = enqueues
    if dist.rank() == 0:
        c, t = statistics.median(meds["caller"]), statistics.median(meds["thread"])
        print(f"{size} B dist.allreduce, jax engine, {dist.world_size()} processes, one by one (us, median of "
              f"{rounds} blocks of 300): dispatched by the caller {c:.0f} {[round(v) for v in meds['caller']]}, "
              f"by the thread {t:.0f} {[round(v) for v in meds['thread']]}; caller/thread {c / t:.2f}", flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
