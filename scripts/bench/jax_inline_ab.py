"""The JAX engine's own dispatch of a costly collective (the caller's) against its dispatch thread's,
alternated in one process: a 2-process ``dist.allreduce`` of ``ELEMS`` float32 values (default
16384), checks off, 100 calls one by one a block, ``ROUNDS`` blocks each way (default 12, the order
swapped every round); rank 0 prints the median of the block medians. The thread's blocks empty the
engine's set of functions the caller may dispatch (``_costly_fns``), the caller's restore it::

    ELEMS=262144 python -m multidev.distributed.launch -n 2 --engine jax scripts/bench/jax_inline_ab.py
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

from multidev import distributed as dist
from multidev.distributed.group import current


def alternated(ways: dict[str, Callable[[], object]], call: Callable[[], object]) -> dict[str, list[float]]:
    """Per way (its set-up called first), the median µs of ``call`` over blocks of 100 calls timed one
    by one, ``ROUNDS`` blocks each (default 12), the ways in turn, the order reversed every round."""
    res: dict[str, list[float]] = {w: [] for w in ways}
    for r in range(int(os.environ.get("ROUNDS", "12"))):
        for way in list(ways) if r % 2 == 0 else list(ways)[::-1]:
            ways[way]()
            each = []
            for _ in range(100):
                t = time.perf_counter()
                call()
                each.append(time.perf_counter() - t)
            res[way].append(statistics.median(each) * 1e6)
    return res


def main() -> None:
    dist.init()
    import jax.numpy as jnp  # (after init: JAX's rule for jax.distributed)

    dist.set_checks(False)
    eng = current().engine
    n = int(os.environ.get("ELEMS", "16384"))
    x = jnp.ones(n, jnp.float32)
    for _ in range(20):
        dist.allreduce(x)
    costly = set(eng._costly_fns)
    res = alternated({"caller": lambda: setattr(eng, "_costly_fns", costly),
                      "thread": lambda: setattr(eng, "_costly_fns", set())}, lambda: dist.allreduce(x))
    eng._costly_fns = costly
    if dist.rank() == 0:
        c, t = statistics.median(res["caller"]), statistics.median(res["thread"])
        print(f"{n * 4} B dist.allreduce, jax engine, 2 processes, one by one (us, median of {len(res['caller'])} "
              f"block medians of 100): the caller's dispatch {c:.0f} {[round(v) for v in res['caller']]}, the "
              f"thread's {t:.0f} {[round(v) for v in res['thread']]}; caller/thread {c / t:.2f}"
              + ("" if costly else " (no function costly enough: both the thread's)"), flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
