"""The cost of multidev.distributed's cross-rank consistency checks: microseconds per allreduce with
the checks on and off, against torch.distributed's own all_reduce, on 2+ ranks (gloo; CUDA tensors
through NCCL where there are GPUs, the check's exchange then going over gloo).

    torchrun --nproc_per_node=2 -m multidev.benchmarks.distributed_check_cost

Each rank joins twice (checks on, then off, on separate ports); rank 0 prints one line per case.
"""
from __future__ import annotations

import os
import time
from typing import Any


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
    import numpy as np
    import torch
    import torch.distributed as tdist

    from multidev import distributed as dist

    port = int(os.environ.get("MASTER_PORT", "29500"))
    rows: dict[str, dict[str, float]] = {}
    for i, check in enumerate((True, False)):
        dist.init(master_port=port + 1 + i, timeout=60, check=check)
        label = "checks on" if check else "checks off"
        cases = [("torch, 4 floats", torch.ones(4), 1000), ("numpy, 4 floats", np.ones(4, np.float32), 1000),
                 ("torch, 1M floats", torch.ones(1 << 20), 50)]
        if torch.cuda.is_available():  # NCCL for CUDA tensors; the check's exchange goes over gloo
            gpu = torch.device("cuda", dist.local_rank() % torch.cuda.device_count())
            cases += [("torch cuda, 4 floats", torch.ones(4, device=gpu), 1000),
                      ("torch cuda, 1M floats", torch.ones(1 << 20, device=gpu), 200)]
        for name, x, n in cases:
            rows.setdefault(name, {})[label] = _per_call(lambda x=x: dist.allreduce(x), n)
        raw, t4 = "torch.distributed.all_reduce, 4 floats", torch.ones(4)
        rows.setdefault(raw, {})[label] = _per_call(lambda t=t4: tdist.all_reduce(t), 1000)
        rank = dist.rank()
        dist.shutdown()
    if rank == 0:
        for name, r in rows.items():
            print(f"{name:42s} " + "  ".join(f"{k}: {v:8.1f} us" for k, v in r.items()))


if __name__ == "__main__":
    main()
