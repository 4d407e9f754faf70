"""The cost of multidev.distributed's cross-rank consistency checks, quickly: microseconds per
allreduce with the checks off and on (``set_checks``, in one group), on any engine, for a tiny and
a 1M-float NumPy array. Run under the engine's launcher::

    torchrun --nproc_per_node=2 -m multidev.benchmarks.distributed_check_cost
    mpiexec -n 2 python -m multidev.benchmarks.distributed_check_cost
    python -m multidev.distributed.launch -n 2 --engine jax -m multidev.benchmarks.distributed_check_cost

Rank 0 prints one line per case. The ``distributed`` bench suite measures the same at every size
against the engine's own call (``dist allreduce checked`` rows).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np


def _per_call(fn: Any, n: int) -> float:
    from multidev import distributed as dist

    for _ in range(max(5, n // 20)):
        fn()
    dist.barrier()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main() -> None:
    from multidev import distributed as dist

    info = dist.init(timeout=60)
    rows: dict[str, dict[str, float]] = {}
    for check in (False, True):
        dist.set_checks(check)
        label = "checks on" if check else "checks off"
        for name, x, n in (("4 floats", np.ones(4, np.float32), 500), ("1M floats", np.ones(1 << 20, np.float32), 30)):
            rows.setdefault(name, {})[label] = _per_call(lambda x=x: dist.allreduce(x), n)
    rank = dist.rank()
    dist.shutdown()
    if rank == 0:
        print(f"{info.engine} engine ({info.transport}), {info.world_size} processes")
        for name, r in rows.items():
            cost = r["checks on"] - r["checks off"]
            print(f"{name:10s} " + "  ".join(f"{k}: {v:9.1f} us" for k, v in r.items()) + f"  check: {cost:+.1f} us")


if __name__ == "__main__":
    main()
