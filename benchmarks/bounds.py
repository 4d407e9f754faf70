"""The host's memory bandwidth, measured in the run that uses it as a bound: ``memcpy`` between two
preallocated NumPy arrays (``np.copyto``, which runs without the GIL), on one thread and split over
every core, the best of several copies per size.

It is the bound of every row that moves host memory (CPU devices, virtual devices on one host): no
copy of ``n`` bytes takes less than ``n / memcpy`` seconds, so a row reading faster than that (by
more than :data:`multidev.benchmarks.report.BOUND_SLACK`) did not do the work it names (a view, a
cached value, an alias) and is refused. The collectives' bounds are counted in these copies
(``Case.bound_copies``): the least memory traffic the operation needs, in copies of its size.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["memcpy_at", "memcpy_bandwidth", "memcpy_sizes"]

KiB, MiB = 1 << 10, 1 << 20


def memcpy_sizes(max_bytes: int) -> list[int]:
    """4 KiB, 16 KiB, ... (powers of 4) up to ``max_bytes``."""
    out, n = [], 4 * KiB
    while n <= max_bytes:
        out.append(n)
        n *= 4
    return out or [4 * KiB]


def _copy_time(dst: np.ndarray, src: np.ndarray, threads: int, reps: int) -> float:
    """The best time of ``reps`` copies of ``src`` into ``dst`` on ``threads`` threads."""
    if threads <= 1:
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - t0)
        return best
    parts = np.array_split(np.arange(src.size), threads)
    cuts = [(int(p[0]), int(p[-1]) + 1) for p in parts if p.size]
    best = float("inf")
    for _ in range(reps):
        barrier = threading.Barrier(len(cuts) + 1)

        def work(a: int, b: int, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            np.copyto(dst[a:b], src[a:b])

        ts = [threading.Thread(target=work, args=c) for c in cuts]
        for t in ts:
            t.start()
        t0 = time.perf_counter()
        barrier.wait()
        for t in ts:
            t.join()
        best = min(best, time.perf_counter() - t0)
    return best


def memcpy_bandwidth(sizes: Sequence[int], reps: int = 5, threads: int | None = None) -> dict[str, Any]:
    """The memcpy bandwidth (GB/s, 10**9 bytes) per size, on one thread and on ``threads`` (default:
    every core), each the best of ``reps`` copies after one untimed copy (first touch). The bound of
    a size is the better of the two; ``peak_GBps`` is the best over all sizes."""
    threads = threads or os.cpu_count() or 1
    one: dict[int, float] = {}
    many: dict[int, float] = {}
    for n in sizes:
        src = np.ones(max(1, n // 8), np.float64)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # first touch: the pages exist before the clock starts
        r = reps if n >= MiB else reps * 20
        one[n] = src.nbytes / _copy_time(dst, src, 1, r) / 1e9
        if threads > 1 and n >= 256 * KiB:  # below that, starting threads costs more than the copy
            many[n] = src.nbytes / _copy_time(dst, src, threads, reps) / 1e9
        del src, dst
    best = {n: max(one[n], many.get(n, 0.0)) for n in sizes}
    return {"how": f"np.copyto between preallocated float64 arrays, the best of {reps}+ copies per size, on one "
                   f"thread and on {threads} threads (the better one is the bound)",
            "threads": threads, "GBps": {str(n): v for n, v in best.items()},
            "one_thread_GBps": {str(n): v for n, v in one.items()},
            "all_threads_GBps": {str(n): v for n, v in many.items()},
            "peak_GBps": max(best.values()) if best else None}


def memcpy_at(bounds: dict[str, Any] | None, nbytes: int) -> float | None:
    """The measured memcpy GB/s at the measured size nearest ``nbytes`` (by ratio), or None."""
    table = (bounds or {}).get("GBps") or {}
    if not table:
        return None
    sizes = sorted(int(k) for k in table)
    near = min(sizes, key=lambda s: abs(np.log(max(s, 1) / max(nbytes, 1))))
    return float(table[str(near)])
