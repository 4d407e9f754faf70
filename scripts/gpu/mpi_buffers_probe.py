"""Why multidev's out-of-place MPI allreduce costs several times the in-place primitive at 1 MiB
(issue 36's multi-process row: 1,386 against 319 us on the quiet H200 host): mpi4py's own
Allreduce on a buffer used again and again, on a new buffer each call (a copy of the input reduced
in place, freed or kept; MPI's out-of-place call into new memory, blocking and nonblocking), cycling
through 10 long-lived buffers, and through one reused staging buffer (copy in, reduce, copy back),
MPI's nonblocking Iallreduce (waited, and polled with Test as the engine does), the engine's own
primitive, then multidev's allreduce (checks off) out of place and in place. Medians of alternating blocks;
run under ``mpiexec -n 2``."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import multidev as md  # noqa: F401
from multidev import distributed as dist
from multidev.distributed.group import current

# mpi4py is imported after dist.init: MPI starts there, with the engine's settings (Open MPI's nonblocking
# allreduce algorithm), so mpi4py's own calls below run with the same ones
MPI: Any = None
comm: Any = None


def cases(mib: int, g: Any) -> tuple[Callable[[], None], ...]:
    """The calls timed at ``mib`` MiB, each on its own buffers."""
    x = np.ones(mib << 18, np.float32)
    fixed, pool = x.copy(), x.copy()
    ring = [x.copy() for _ in range(10)]
    keep: list[np.ndarray] = []
    state = {"i": 0}

    def reuse() -> None:
        comm.Allreduce(MPI.IN_PLACE, fixed)

    def iallreduce_wait() -> None:
        comm.Iallreduce(MPI.IN_PLACE, fixed).Wait()

    def iallreduce_test() -> None:
        r = comm.Iallreduce(MPI.IN_PLACE, fixed)
        while not r.Test():
            pass

    def engine() -> None:
        h = g.engine.allreduce(fixed, "sum")
        h.wait(60)
        h.result()

    def fresh_freed() -> None:
        b = np.copy(x)
        comm.Allreduce(MPI.IN_PLACE, b)

    def out_of_place() -> None:  # mpi4py's own out-of-place call, into new memory
        comm.Allreduce(x, np.empty_like(x))

    def iallreduce_out() -> None:
        out = np.empty_like(x)  # held: mpi4py's request does not keep it, and MPI writes into it until Wait
        comm.Iallreduce(x, out).Wait()

    def fresh_kept() -> None:
        b = np.copy(x)
        keep.append(b)
        if len(keep) > 64:
            keep.pop(0)
        comm.Allreduce(MPI.IN_PLACE, b)

    def cycle10() -> None:
        b = ring[state["i"] % 10]
        state["i"] += 1
        comm.Allreduce(MPI.IN_PLACE, b)

    def staged() -> None:
        b = np.copy(x)
        np.copyto(pool, b)
        comm.Allreduce(MPI.IN_PLACE, pool)
        np.copyto(b, pool)

    def md_out() -> None:
        dist.allreduce(x)

    def md_in() -> None:
        dist.allreduce(fixed, inplace=True)

    return (reuse, iallreduce_wait, iallreduce_test, engine, fresh_freed, out_of_place, iallreduce_out, fresh_kept,
            cycle10, staged, md_out, md_in)


def main() -> None:
    global MPI, comm
    dist.init(timeout=120)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    g = current()
    g.check = False
    for mib in (1, 16):
        fs = cases(mib, g)
        per = max(4, 40 // mib)
        times: dict[str, list[float]] = {f.__name__: [] for f in fs}
        for f in fs:
            for _ in range(3):
                f()
        for _ in range(15):
            for f in fs:
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(per):
                    f()
                times[f.__name__].append((time.perf_counter() - t0) / per * 1e6)
        if comm.rank == 0:
            print(f"{mib} MiB: " + "  ".join(f"{k} {statistics.median(v):8.1f}" for k, v in times.items()) + "  (us)")
    dist.shutdown()


if __name__ == "__main__":
    main()
