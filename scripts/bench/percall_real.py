"""Where a real 2-process ``dist.allreduce`` spends its time above the engine's own call: per size,
rows run in turn (a barrier before each sample), each sample ``--calls`` calls back to back (``1``:
one call after the barrier, as the ``distributed`` bench suite samples them):

- ``native``: the engine's blocking call (mpi4py ``Allreduce``, torch ``all_reduce``; JAX: none);
- ``floor``: the least a call that can give up on a lost peer does (MPI ``Iallreduce`` then ``Test``
  in a loop; torch ``all_reduce(async_op=True)`` then ``wait(timeout)``);
- ``engine``: the engine's primitive, its timeout-bounded wait and its result, as the core calls them;
- ``contract``: ``engine`` plus the per-call checks a core makes over the adapter protocol (the group
  looked up, the tensor's class, dtype, op, writability, rank of dimensions and placement checked: one
  adapter call or table lookup each, as multidev's own call makes them, none of its layers); ``contract``
  less ``engine`` is what the checks cost;
- ``md``: ``dist.allreduce(x, inplace=True)``, checks off; ``md_checked``: the same, checks on.

Rank 0 prints the median microseconds per call of each row and ``md - floor``. Run under the engine::

    python -m multidev.distributed.launch -n 2 --engine mpi scripts/bench/percall_real.py --calls 1 20
    python -m multidev.distributed.launch -n 2 --engine torch scripts/bench/percall_real.py
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np

from multidev import distributed as dist
from multidev.distributed.group import current


def _rows(g: Any, n: int) -> dict[str, Callable[[], Any]]:
    eng = g.engine
    if eng.name == "mpi":
        MPI, comm = eng.MPI, eng.comm
        x: Any = np.ones(n, np.float32)

        def native() -> None:
            comm.Allreduce(MPI.IN_PLACE, [x, MPI.FLOAT])

        def floor() -> None:
            req = comm.Iallreduce(MPI.IN_PLACE, [x, MPI.FLOAT], MPI.SUM)
            while not req.Test():
                pass
    else:
        import torch
        import torch.distributed as tdist

        x = torch.ones(n)
        limit = timedelta(seconds=300)

        def native() -> None:
            tdist.all_reduce(x)

        def floor() -> None:
            tdist.all_reduce(x, async_op=True).wait(timeout=limit)

    def engine() -> Any:
        h = eng.allreduce(x, "sum")
        h.wait(g.timeout)
        return h.result()

    from multidev.distributed.collectives import _placement
    from multidev.distributed.consistency import MAX_DIMS
    from multidev.distributed.group import current as group
    from multidev.registry import backend_of
    from multidev.validate import check_op

    def contract() -> Any:
        gr = group()
        b = backend_of(x)
        dtype = b.dtype_of(x)
        check_op("sum", dtype, "allreduce")
        if gr.check or b.writable(x) is not True or len(b.shape_of(x)) > MAX_DIMS:
            raise AssertionError("the contract row times an unchecked call of a writable tensor")
        placed = _placement(gr, b, x, dtype, "allreduce")
        if placed[0] is not placed[2] or placed[1] != placed[3]:
            raise AssertionError("the contract row times the engine's own tensors")
        t, _ = eng.prepare(x)
        h = eng.allreduce(t, "sum")
        if not h.wait(gr.timeout):
            raise TimeoutError
        return h.result()

    def md() -> None:
        dist.allreduce(x, inplace=True)

    def md_checked() -> None:
        g.check = True
        try:
            dist.allreduce(x, inplace=True)
        finally:
            g.check = False

    return {"native": native, "floor": floor, "engine": engine, "contract": contract, "md": md,
            "md_checked": md_checked}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sizes", default="4096,65536,1048576", help="bytes, comma-separated")
    p.add_argument("--calls", type=int, nargs="+", default=[1, 20], help="calls per sample (one run per value)")
    p.add_argument("--samples", type=int, default=200, help="samples per row (at --calls 1; fewer for more calls)")
    a = p.parse_args()
    dist.init(timeout=120)
    dist.set_checks(False)
    g = current()
    for size in (int(s) for s in a.sizes.split(",")):
        rows = _rows(g, size // 4)
        for f in rows.values():
            for _ in range(5):
                f()
        for calls in a.calls:
            res: dict[str, list[float]] = {k: [] for k in rows}
            for _ in range(max(5, a.samples // calls)):
                for k, f in rows.items():
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        f()
                    res[k].append((time.perf_counter() - t0) / calls * 1e6)
            if g.rank == 0:
                med = {k: statistics.median(v) for k, v in res.items()}
                print(f"{g.engine.name} 2 processes {size} B, {calls} call(s) a sample (us): "
                      + ", ".join(f"{k} {v:.1f}" for k, v in med.items())
                      + f"; md - floor {med['md'] - med['floor']:+.1f}"
                      + f", contract - floor {med['contract'] - med['floor']:+.1f}"
                      + f", checked - md {med['md_checked'] - med['md']:+.1f}",
                      flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
