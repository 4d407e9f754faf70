"""``multidev.distributed.allreduce`` of ``$MB`` MiB (default 256) of float32 on the mpi engine, in place
and out of place, checks off, against mpi4py's in-place ``Allreduce``: the min and median of 3 calls
each after one untimed call, in ms (rank 0 prints). mpi4py is imported after ``dist.init``::

    MB=256 mpiexec -n 2 -x MB python scripts/gpu/mpi_big_probe.py
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from multidev import distributed as dist


def main() -> None:
    dist.init()
    dist.set_checks(False)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    mib = int(os.environ.get("MB", "256"))
    x = np.ones(mib * (1 << 20) // 4, np.float32)

    def timed(f: Callable[[], Any]) -> tuple[float, float]:
        f()
        ts = []
        for _ in range(3):
            comm.Barrier()
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        ts.sort()
        return round(ts[0] * 1e3, 1), round(ts[1] * 1e3, 1)

    rows = {"mpi4py Allreduce in place": timed(lambda: comm.Allreduce(MPI.IN_PLACE, x)),
            "md in place": timed(lambda: dist.allreduce(x, inplace=True)),
            "md out of place": timed(lambda: dist.allreduce(x))}
    if comm.rank == 0:
        print(f"{mib} MiB (min, median ms):", rows)
    dist.shutdown()


if __name__ == "__main__":
    main()
