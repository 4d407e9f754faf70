"""``dist.allreduce(x, inplace=True)`` of float32 arrays in a loop (checks on; ``CHECKS=0`` off): rank 0
prints the microseconds a call per size, the mean of ``--calls`` calls after 20 to warm up. Run under a
launcher, e.g. more ranks than cores::

    mpiexec --oversubscribe -n 3 -x CHECKS python scripts/bench/allreduce_loop.py
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from multidev import distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sizes", default="4096,1048576", help="bytes, comma-separated")
    p.add_argument("--calls", type=int, default=200)
    a = p.parse_args()
    info = dist.init(timeout=60)
    dist.set_checks(os.environ.get("CHECKS", "1") == "1")
    for size in (int(s) for s in a.sizes.split(",")):
        x = np.ones(size // 4, np.float32)
        for _ in range(20):
            dist.allreduce(x, inplace=True)
        t = time.perf_counter()
        for _ in range(a.calls):
            dist.allreduce(x, inplace=True)
        dt = (time.perf_counter() - t) / a.calls
        if dist.rank() == 0:
            print(f"{info.engine}, {info.world_size} ranks on {os.cpu_count()} cores, {size} B, checks "
                  f"{'on' if dist.checks_enabled() else 'off'}: {dt * 1e6:.1f} us a call", flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
