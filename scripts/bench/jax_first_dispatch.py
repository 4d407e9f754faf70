"""Where a jitted collective of the JAX engine waits for a missing rank: in its dispatch (which then holds
its caller), or after it (in ``block_until_ready``). Two processes; rank 1 leaves after LATE seconds
(default 12) without calling; rank 0 dispatches, through the engine's dispatch thread, an allreduce of N
float32 values (default 1024) whose function has run once on both ranks, or with ``fresh`` one of N
values run for the first time (the warm-up used N + 1), and says when the dispatch returned and when the
result (or the error) came. XLA's CPU client runs a computation of under 1,000 flops inside its dispatch
on every call, and a first one, whatever its cost, too::

    python -m multidev.distributed.launch -n 2 --grace 60 --engine jax scripts/bench/jax_first_dispatch.py N [fresh]
"""
from __future__ import annotations

import os
import sys
import time

from multidev import distributed as dist
from multidev.distributed.group import current


def main() -> None:
    dist.init(timeout=60)
    import jax.numpy as jnp  # (after init: JAX's rule for jax.distributed)

    dist.set_checks(False)
    eng = current().engine
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    fresh = len(sys.argv) > 2 and sys.argv[2] == "fresh"
    dist.allreduce(jnp.ones(n + 1 if fresh else n, jnp.float32)).block_until_ready()  # (run once on both)
    if dist.rank() == 1:
        time.sleep(float(os.environ.get("LATE", "12")))
        os._exit(0)  # (leaves without calling: rank 0's collective has no peer)
    case = f"{n} values, {'first run' if fresh else 'run before'}"
    t = time.perf_counter()
    h = eng.allreduce(jnp.ones(n, jnp.float32), "sum")
    try:
        out = h.fut.result()
        print(f"rank 0, {case}: the dispatch returned after {time.perf_counter() - t:.3f} s", flush=True)
        out.block_until_ready()
        print(f"rank 0, {case}: the result after {time.perf_counter() - t:.3f} s", flush=True)
    except Exception as e:  # noqa: BLE001 - what the missing peer gives, reported
        where = "in" if h.fut.exception() is not None else "after"
        print(f"rank 0, {case}: raised after {time.perf_counter() - t:.3f} s ({where} the dispatch): "
              f"{type(e).__name__}: {str(e)[:120]}", flush=True)
    os._exit(0)  # (the group has lost a rank: no orderly shutdown)


if __name__ == "__main__":
    main()
