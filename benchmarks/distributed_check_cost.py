"""The cost of multidev.distributed's cross-rank consistency checks, as a share of the call they
guard: per engine, the exchange alone (a collective's record through the group's channel: the
shared-memory mailbox where every rank runs on one host, else :meth:`Engine.exchange`), an
allreduce with the checks off and on, and the engine's own primitive (no multidev layer), for a
tiny and a 1 MiB float32 NumPy array. Run under the engine's launcher::

    torchrun --nproc_per_node=2 -m multidev.benchmarks.distributed_check_cost [--json out.json]
    mpiexec -n 2 python -m multidev.benchmarks.distributed_check_cost
    python -m multidev.distributed.launch -n 2 --engine jax -m multidev.benchmarks.distributed_check_cost

The cases run in alternating blocks (a barrier before each, so every rank starts a block
together), each block timing ``--calls`` calls back to back; a case's figure is the median over
``--blocks`` blocks of the time per call, on rank 0, which prints one line per size and case and
the check's share: (checked - unchecked) / unchecked, in wall time and in the process's CPU time
(the work the check adds, without the waits: steadier on a loaded machine). The ``distributed`` bench
suite measures the same at every size against the engine's own call (variant ``md_checked`` of the
``dist allreduce`` rows, sampled alternately with the unchecked call).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

SIZES = {"4 floats": 4, "1 MiB": 1 << 18}


def _cases(x: Any) -> dict[str, Callable[[], Any]]:
    from multidev import distributed as dist
    from multidev.distributed.consistency import Call
    from multidev.distributed.group import current
    from multidev.distributed.transport import to_transport

    g = current()
    row = Call("allreduce", op="sum", dtype="float32", shape=tuple(x.shape), tkind="cpu").encode()
    t, _, _, _ = to_transport(np.zeros_like(x), g)  # zeros: the primitive sums in place, and stays 0

    def exchange() -> None:
        (g.channel or g.engine).exchange(g.seq, row, g.timeout)  # a call number of its own, on every rank alike
        g.seq += 1

    def unchecked() -> None:
        g.check = False
        try:
            dist.allreduce(x)
        finally:
            g.check = True

    def native() -> None:
        h = g.engine.allreduce(t, "sum")
        h.wait(g.timeout)
        h.result()

    return {"engine primitive": native, "exchange alone": exchange, "allreduce, checks off": unchecked,
            "allreduce, checks on": lambda: dist.allreduce(x)}


def measure(blocks: int, calls: dict[str, int]) -> dict[str, dict[str, float]]:
    """Median microseconds per call of each case, by size (rank 0's clock)."""
    from multidev import distributed as dist

    out: dict[str, dict[str, float]] = {}
    for name, n in SIZES.items():
        cases = _cases(np.ones(n, np.float32))
        per_block = calls[name]
        for f in cases.values():  # warm-up
            for _ in range(3):
                f()
        times: dict[str, list[float]] = {k: [] for k in cases}
        cpu: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(blocks):
            for label, f in cases.items():
                dist.barrier()
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(per_block):
                    f()
                times[label].append((time.perf_counter() - t0) / per_block)
                cpu[label].append((time.process_time() - c0) / per_block)
        out[name] = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        out[name].update({f"{k} (CPU)": statistics.median(v) * 1e6 for k, v in cpu.items()})
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--blocks", type=int, default=40, help="alternating blocks per case (the median is over them)")
    p.add_argument("--calls", type=int, default=10, help="calls per block at 1 MiB (the tiny size: 10x as many)")
    p.add_argument("--json", help="write the figures here (rank 0)")
    args = p.parse_args(argv)
    from multidev import distributed as dist
    from multidev.distributed.group import current

    info = dist.init(timeout=120)
    g = current()
    channel = "engine" if (g.channel or g.engine) is g.engine else "shared memory"
    rows = measure(args.blocks, {"4 floats": 10 * args.calls, "1 MiB": args.calls})
    rank = dist.rank()
    dist.shutdown()
    if rank != 0:
        return
    head = f"{info.engine} engine ({info.transport}), {info.world_size} processes, the records through {channel}"
    print(head)
    report: dict[str, Any] = {"engine": info.engine, "transport": info.transport, "world_size": info.world_size,
                              "channel": channel,
                              "blocks": args.blocks, "calls_per_block": args.calls, "sizes": {}}
    for name, r in rows.items():
        off, on = r["allreduce, checks off"], r["allreduce, checks on"]
        share = (on - off) / off
        ex = r["exchange alone"] / off
        cpu_share = (r["allreduce, checks on (CPU)"] - r["allreduce, checks off (CPU)"]) / off
        print(f"{name:9s} " + "  ".join(f"{k}: {v:8.1f} us" for k, v in r.items() if "CPU" not in k)
              + f"  check share: {share:+.1%} (exchange alone {ex:.1%}; this process's CPU time {cpu_share:+.1%})")
        report["sizes"][name] = {**{k: round(v, 2) for k, v in r.items()}, "check share": round(share, 4),
                                 "exchange share": round(ex, 4), "check CPU share": round(cpu_share, 4)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
