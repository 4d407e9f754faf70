"""multidev's own time per ``dist.allreduce`` call when the caches are cold, as after a real collective:
the stubbed call of ``percall_stub.py`` (the engine's primitive already complete), each call timed alone,
with ``EVICT`` bytes of a NumPy buffer written before it (what a transfer of that size does to the CPU's
caches: it evicts multidev's code and data). Rows, in turn call by call: ``md``
(``dist.allreduce(x, inplace=True)`` of 1,024 float32 values; checks off, ``CHECKS=1`` on), ``engine``
(the engine's primitive, wait and result, as the core calls them), ``stub`` (the stubbed primitive as the
floor makes it). Medians of ``--calls`` calls per row and eviction size. Run in a one-process world::

    python -m multidev.distributed.launch -n 1 --engine mpi scripts/bench/percall_cold.py
    python -m multidev.distributed.launch -n 1 --engine torch scripts/bench/percall_cold.py
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from multidev import distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--evict", default="0,262144,1048576,4194304,16777216", help="bytes written before each call")
    p.add_argument("--calls", type=int, default=3000)
    a = p.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import percall_stub  # (its stubs: the primitive complete at once)

    g, name, x, engine, stub = percall_stub.stubbed("percall_cold.py")
    rows = {"md": lambda: dist.allreduce(x, inplace=True), "engine": engine, "stub": stub}
    for evict in (int(v) for v in a.evict.split(",")):
        buf = np.ones(max(evict, 8) // 8)
        res: dict[str, list[float]] = {k: [] for k in rows}
        for _ in range(a.calls):
            for k, f in rows.items():
                if evict:
                    np.add(buf, 1.0, out=buf)
                t = time.perf_counter()
                f()
                res[k].append(time.perf_counter() - t)
        med = {k: statistics.median(v) * 1e6 for k, v in res.items()}
        print(f"{name} engine, checks {'on' if g.check else 'off'}, {evict >> 10} KiB written before each call "
              f"(us a call, median of {a.calls}): " + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
              + f"; md - engine {med['md'] - med['engine']:.2f}, engine - stub {med['engine'] - med['stub']:.2f}",
              flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
