"""Suite ``distributed``: ``multidev.distributed.allreduce`` across processes against the transport's
own ``all_reduce``, as nccl-tests reports it (busbw = algbw x 2(n-1)/n). Runs under ``torchrun``
(``WORLD_SIZE`` > 1); the runner joins the process group and rank 0 reports::

    torchrun --nproc_per_node=2 -m multidev.benchmarks.runner --suite distributed --backend torch --json d.json

Elsewhere every row says it needs several processes.
"""
from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import numpy as np

import multidev as md
from multidev import distributed as mdist

from . import Case, Context, Goal, MiB, Variant, benchmark, close, fmt_bytes

GOALS = (
    Goal("distributed allreduce busbw vs the transport", "dist allreduce", 0.9, metric="GBps_ratio",
         den=("native",), gpu_only=True, min_bytes=64 * MiB,
         note="multidev.distributed >= 0.9x torch.distributed busbw at >= 64 MiB"),
    Goal("distributed allreduce per-call overhead", "dist allreduce", 2.0, metric="time_ratio",
         den=("native",), gpu_only=True, max_bytes=1 * MiB, note="<= 2x native at 1 MiB"),
)


def _sizes(ctx: Context) -> list[int]:
    return ctx.pick(quick=[64 << 10], cpu=[1 * MiB, 16 * MiB], gpu=[1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB])


@benchmark("distributed", goals=GOALS)
def dist_allreduce(ctx: Context) -> Iterator[Case]:
    """multidev.distributed.allreduce (out of place and in place) against the transport's all_reduce."""
    if not mdist.is_initialized():
        yield Case("distributed allreduce: needs several processes", {},
                   params={"skipped": "run under torchrun --nproc_per_node=N (WORLD_SIZE > 1)"}, ratio=None)
        return
    r, w = mdist.rank(), mdist.world_size()
    dev = ctx.gpus[mdist.local_rank() % len(ctx.gpus)] if ctx.gpus else ctx.host
    for size in _sizes(ctx):
        elems = size // 4
        x = md.asarray(np.full(elems, r + 1, dtype=np.float32), device=dev, backend=ctx.backend)
        buf = md.copy(x)
        expect = np.full(4, w * (w + 1) / 2)

        def check(x: object = x, expect: np.ndarray = expect) -> tuple[bool, str]:
            y = mdist.allreduce(x)
            return close(md.to_numpy(y)[:4], expect, device=None)

        native = ctx.native_call("dist_allreduce", md.copy(x))
        if native is not None:
            native.inner = 1
        yield Case(f"dist allreduce {w} processes {fmt_bytes(size)}",
                   {"md": Variant(mdist.allreduce, (x,), inner=1, label="multidev.distributed.allreduce(x)"),
                    "md_inplace": (Variant(partial(mdist.allreduce, buf, inplace=True), (), inner=1,
                                           label="multidev.distributed.allreduce(x, inplace=True)")
                                   if ctx.b.capabilities.mutable else None),
                    "native": native},
                   devices=[dev], check=check, before=mdist.barrier,
                   params={"processes": w, "size": size, "dtype": "float32", "rank": r},
                   bytes=size, busbw_factor=2 * (w - 1) / w, group="dist allreduce")
