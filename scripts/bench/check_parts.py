"""Where a checked collective's extra time goes (issue 36's consistency-check row): ``dist.allreduce``
of ``$ELEMS`` float32 elements (default 4) with the checks on and off, alternated call by call, and
the median time of each step of the call on rank 0: ``open`` (the argument checks and, checked, the
record), ``post`` (this rank's record written ahead), ``working`` (the transport tensor),
``close`` (the exchange: the other ranks' records read, waited for, compared) and ``run`` (the
primitive started, waited for, its result handed back). ``INPLACE=1`` times ``allreduce(x,
inplace=True)`` (the distributed bench's row) instead of the out-of-place call; on the mpi engine
a third call is alternated with them, the floor: mpi4py's ``Iallreduce`` in place on the engine's
communicator, then ``Test()`` until done. Run under the engine's launcher:

    ELEMS=262144 INPLACE=1 OMP_NUM_THREADS=1 mpiexec -n 2 -x ELEMS -x INPLACE python scripts/bench/check_parts.py
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
    inplace = os.environ.get("INPLACE", "0") == "1"
    floor: Callable[[], Any] | None = None
    if dist.engine_name() == "mpi":
        from mpi4py import MPI
        comm, buf = g.engine.comm, x.copy()

        def mpi_floor() -> None:
            req = comm.Iallreduce(MPI.IN_PLACE, buf)
            while not req.Test():
                pass
        floor = mpi_floor
    kinds = ["on", "off"] + (["floor"] if floor is not None else [])
    total: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(1000 + 1000 * len(kinds)):
        kind = kinds[i % len(kinds)]
        g.check = kind == "on"
        t = time.perf_counter()
        if kind == "floor":
            assert floor is not None
            floor()
        else:
            dist.allreduce(x, inplace=inplace)
        total[kind].append(time.perf_counter() - t)
        if i == 999:  # warm-up done
            spent.clear()
            total = {k: [] for k in kinds}
    g.check = True
    if g.rank == 0:
        us = {k: statistics.median(v) * 1e6 for k, v in total.items()}
        extra = f", floor {us['floor']:.1f} us" if "floor" in us else ""
        print(f"{x.nbytes} bytes, {g.world_size} ranks, {'in place' if inplace else 'out of place'}: checks on "
              f"{us['on']:.1f} us, off {us['off']:.1f} us ({(us['on'] - us['off']) / us['off']:+.1%}){extra}")
        for (step, on), v in sorted(spent.items(), key=lambda kv: (not kv[0][1], kv[0][0])):
            print(f"  {'on ' if on else 'off'} {step:8s} {statistics.median(v) * 1e6:7.1f} us")
    dist.shutdown()


if __name__ == "__main__":
    main()
