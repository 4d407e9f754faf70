"""Where a jitted collective of the JAX engine waits for a missing rank: in its dispatch, or after it (in
``block_until_ready``). Two processes; rank 1 leaves after LATE seconds (default 12) without calling, rank
0 dispatches an allreduce of a function already run once (``ran``) or of a new shape (``fresh``) through the
engine's dispatch thread, and says when the dispatch returned and when the result (or the error) came.
Run once per case::

    python -m multidev.distributed.launch -n 2 --grace 60 --engine jax scripts/bench/jax_first_dispatch.py ran
    python -m multidev.distributed.launch -n 2 --grace 60 --engine jax scripts/bench/jax_first_dispatch.py fresh
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
    case = sys.argv[1] if len(sys.argv) > 1 else "ran"
    x = jnp.ones(1024, jnp.float32)
    dist.allreduce(x).block_until_ready()  # (the function of x's shape has run once on both ranks)
    if dist.rank() == 1:
        time.sleep(float(os.environ.get("LATE", "12")))
        os._exit(0)  # (leaves without calling: rank 0's collective has no peer)
    y = x if case == "ran" else jnp.ones(777, jnp.float32)
    eng._enqueues = False  # (through the thread, to see where the dispatch waits)
    t = time.perf_counter()
    h = eng.allreduce(y, "sum")
    try:
        out = h.fut.result()
        print(f"rank 0, {case}: the dispatch returned after {time.perf_counter() - t:.3f} s", flush=True)
        out.block_until_ready()
        print(f"rank 0, {case}: the result after {time.perf_counter() - t:.3f} s", flush=True)
    except Exception as e:  # noqa: BLE001 - what the missing peer gives, reported
        where = "in" if h.fut.exception() is not None else "after"
        print(f"rank 0, {case}: raised after {time.perf_counter() - t:.3f} s ({where} the dispatch): "
              f"{type(e).__name__}: {str(e)[:160]}", flush=True)
    os._exit(0)  # (the group has lost a rank: no orderly shutdown)


if __name__ == "__main__":
    main()
