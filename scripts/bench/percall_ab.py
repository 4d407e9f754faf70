"""Per-call cost of ``dist.allreduce`` of 4 float32 values on the mpi engine, and mpi4py beside it
(issue 36's small-size rows): multidev's out-of-place and in-place calls with the checks off and on,
mpi4py's blocking ``Allreduce`` and the floor of a call that can give up on a lost peer (``Iallreduce``
then ``Test()`` in a loop). Median of 7 blocks of 4,000 calls each, after 1,000 warm-up calls. Run it
under mpiexec; ``percall_ab.sh`` alternates two checkouts with it:

    OMP_NUM_THREADS=1 mpiexec -n 2 python scripts/bench/percall_ab.py
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from multidev import distributed as dist


def main() -> None:
    dist.init()
    from mpi4py import MPI  # (after init: the engine picks Open MPI's algorithms before MPI starts)

    comm = MPI.COMM_WORLD
    x = np.ones(4, np.float32)
    out = np.empty_like(x)

    def floor() -> None:
        req = comm.Iallreduce(x, out)
        while not req.Test():
            pass

    def timed(f: Callable[[], Any]) -> float:
        for _ in range(1000):
            f()
        blocks = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(4000):
                f()
            blocks.append((time.perf_counter() - t) / 4000 * 1e6)
        return statistics.median(blocks)

    rows: dict[str, float] = {}
    for checked in (False, True):
        dist.set_checks(checked)
        label = "checks on" if checked else "checks off"
        rows[f"dist.allreduce(x), {label}"] = timed(lambda: dist.allreduce(x))
        rows[f"dist.allreduce(x, inplace=True), {label}"] = timed(lambda: dist.allreduce(x, inplace=True))
    rows["mpi4py Allreduce(x, out)"] = timed(lambda: comm.Allreduce(x, out))
    rows["floor: mpi4py Iallreduce(x, out) + Test() loop"] = timed(floor)
    if dist.rank() == 0:
        for k, v in rows.items():
            print(f"{v:8.2f} us  {k}")
    dist.shutdown()


if __name__ == "__main__":
    main()
