"""Pipelined uploads of pageable host memory through pinned staging buffers, written once for every
adapter with a copy engine (CUDA, ROCm).

A copy from pageable memory to a GPU runs at a fraction of the bus (docs/transfers.md has the
measured figures and the commands that made them): the driver stages it through a small pinned
buffer, one piece at a time, on one thread. :func:`staged_upload` does the staging itself,
overlapped: several threads copy the next chunk into one pinned buffer (``np.copyto`` releases
the GIL) while the copy engine drains the previous one, ``depth`` buffers deep. The adapter supplies three primitives:

- ``alloc(nbytes) -> (buffer, host_view)``: a pinned host buffer and a writable ``uint8`` NumPy view
  of it (called ``depth`` times per upload; the framework's caching host allocator makes it cheap
  after the first upload);
- ``submit(buffer, n, offset) -> event``: enqueue the asynchronous copy of the buffer's first ``n``
  bytes to ``offset`` in the destination, on the adapter's copy stream, and return something to
  wait on;
- ``wait(event)``: block until that copy has finished with the buffer.

Thread-safe: each upload has its own buffers; the worker threads are multidev's one pool of host
threads (:func:`multidev.hostthreads.executor`). The source must
not be written until :func:`staged_upload` returns (it returns after the last chunk was copied
into pinned memory; the copies to the device may still be running on the copy stream, ordered
before later work by the adapter).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .hostthreads import executor

__all__ = ["StagingPlan", "parallel_put", "split_pieces", "staged_upload"]

def _workers() -> int:
    return max(1, min(8, (os.cpu_count() or 2)))


class StagingPlan:
    """How an upload is cut: ``chunk`` bytes per pinned buffer, ``depth`` buffers in flight,
    ``threads`` host copies per chunk. The defaults were chosen by measurement (the bandwidth suite's
    committed results, docs/transfers.md); ``threshold``: uploads smaller than this go the framework's own way."""

    def __init__(self, chunk: int = 32 << 20, depth: int = 3, threads: int | None = None,
                 threshold: int = 32 << 20) -> None:
        if chunk <= 0 or depth < 1:
            raise ValueError("a staging plan needs chunk > 0 and depth >= 1")
        self.chunk, self.depth, self.threshold = int(chunk), int(depth), int(threshold)
        self.threads = int(threads) if threads else _workers()

    def __repr__(self) -> str:
        return (f"StagingPlan(chunk={self.chunk >> 20} MiB, depth={self.depth}, threads={self.threads}, "
                f"threshold={self.threshold >> 20} MiB)")


def _copy_into(dst: np.ndarray, src: np.ndarray, parts: int) -> None:
    """``dst[:] = src`` (same length, uint8) split over ``parts`` threads of the shared pool."""
    n = src.nbytes
    if parts <= 1 or n < (4 << 20):
        np.copyto(dst, src)
        return
    step = -(-n // parts)
    step = (step + 4095) & ~4095  # page-aligned pieces
    futures = [executor().submit(np.copyto, dst[o:o + step], src[o:o + step]) for o in range(0, n, step)]
    for f in futures:
        f.result()


def staged_upload(src: np.ndarray, alloc: Callable[[int], tuple[Any, np.ndarray]],
                  submit: Callable[[Any, int, int], Any], wait: Callable[[Any], None],
                  plan: StagingPlan | None = None) -> None:
    """Copy the bytes of C-contiguous ``src`` to the destination behind ``submit``, chunk by chunk
    through ``plan.depth`` pinned buffers (see the module docstring). Raises what the primitives
    raise; buffers are released by the framework once their copies finish."""
    plan = plan or StagingPlan()
    flat = src.reshape(-1).view(np.uint8) if src.nbytes else np.empty(0, np.uint8)
    total = flat.nbytes
    if total == 0:
        return
    chunk = min(plan.chunk, total)
    bufs: list[tuple[Any, np.ndarray]] = [alloc(chunk) for _ in range(min(plan.depth, -(-total // chunk)))]
    pending: list[Any] = [None] * len(bufs)
    for i, off in enumerate(range(0, total, chunk)):
        b = i % len(bufs)
        if pending[b] is not None:
            wait(pending[b])  # that buffer's previous copy has left it
        n = min(chunk, total - off)
        buf, view = bufs[b]
        _copy_into(view[:n], flat[off:off + n], plan.threads)
        pending[b] = submit(buf, n, off)


def split_pieces(src: np.ndarray, chunk: int) -> list[np.ndarray]:
    """C-contiguous ``src`` flattened and cut into views of ``chunk`` bytes each, in order (the last
    one shorter; one view of an empty ``src``). No copy."""
    flat = src.reshape(-1)
    step = max(1, chunk // max(1, src.itemsize))
    return [flat[i:i + step] for i in range(0, flat.size, step)] or [flat]


def parallel_put(src: np.ndarray, put: Callable[[np.ndarray], Any], plan: StagingPlan | None = None) -> list[Any]:
    """``put`` of each ``plan.chunk``-byte piece of C-contiguous ``src`` (flattened, in order; the
    last piece shorter), from the shared worker pool; the results in order. For frameworks whose
    own upload releases the GIL and reads pageable memory faster in pieces from several threads
    than whole (JAX's ``device_put``, docs/transfers.md has the figures). Synchronous: the source
    may be written again once it returns, unless ``put`` itself keeps reading it. Raises the first
    error ``put`` raised (after every piece is done)."""
    plan = plan or StagingPlan()
    pieces = split_pieces(src, plan.chunk)
    if len(pieces) == 1 or plan.threads <= 1:
        return [put(p) for p in pieces]
    futures = [executor().submit(put, p) for p in pieces]
    errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e
    return [f.result() for f in futures]
