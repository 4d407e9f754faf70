"""Where a checked collective's extra time goes (issue 36's consistency-check row): ``dist.allreduce``
of ``$ELEMS`` float32 elements (default 4) with the checks on and off, alternated call by call, and
the median time of each step of the call on rank 0: ``open`` (the argument checks and, checked, the
record), ``post`` (this rank's record written ahead), ``working`` (the transport tensor),
``close`` (the exchange: the other ranks' records read, waited for, compared) and ``run`` (the
primitive started, waited for, its result handed back). Run under the engine's launcher:

    ELEMS=262144 OMP_NUM_THREADS=1 mpiexec -n 2 -x ELEMS python scripts/bench/check_parts.py
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from multidev import distributed as dist
from multidev.distributed import collectives, consistency
from multidev.distributed.group import current


def main() -> None:
    dist.init()
    g = current()
    spent: dict[tuple[str, bool], list[float]] = {}

    def timed(module: Any, name: str) -> None:
        fn: Callable[..., Any] = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent.setdefault((name.strip("_"), g.check), []).append(time.perf_counter() - t)
        setattr(module, name, wrapper)

    for module, name in ((consistency, "_open"), (consistency, "_post"), (consistency, "_close"),
                         (collectives, "working"), (collectives, "run")):
        timed(module, name)
    x = np.ones(int(os.environ.get("ELEMS", "4")), np.float32)
    total: dict[bool, list[float]] = {True: [], False: []}
    for i in range(3000):
        g.check = i % 2 == 0
        t = time.perf_counter()
        dist.allreduce(x)
        total[g.check].append(time.perf_counter() - t)
        if i == 999:  # warm-up done
            spent.clear()
            total = {True: [], False: []}
    g.check = True
    if g.rank == 0:
        us = {k: statistics.median(v) * 1e6 for k, v in total.items()}
        print(f"{x.nbytes} bytes, {g.world_size} ranks: checks on {us[True]:.1f} us, off {us[False]:.1f} us "
              f"({(us[True] - us[False]) / us[False]:+.1%})")
        for (step, on), v in sorted(spent.items(), key=lambda kv: (not kv[0][1], kv[0][0])):
            print(f"  {'on ' if on else 'off'} {step:8s} {statistics.median(v) * 1e6:7.1f} us")
    dist.shutdown()


if __name__ == "__main__":
    main()
