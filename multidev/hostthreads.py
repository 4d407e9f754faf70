"""Host loops cut over threads: the one thread pool multidev's own host work uses.

A reduction or copy of a large host array on one thread reaches a fraction of the machine's memory
bandwidth (one core's share); NumPy's ufuncs and copies release the GIL, so blocks of the array
worked on by several threads at once run on several cores. :func:`run_parts` cuts a list of
independent work items into contiguous parts, one per thread, and waits for all of them.

- Threads: ``MULTIDEV_HOST_THREADS`` (read once, at the first call), default the CPUs this process
  may run on, at most :data:`MAX_THREADS`; 1 runs everything on the calling thread.
- A part gets at least :data:`MIN_PART_BYTES` of work, so small calls stay on the calling thread.
- Each part runs in a copy of the caller's context (``contextvars``: NumPy's ``errstate`` included).
- Synchronous: returns once every part has finished; the first exception of a part is raised then,
  after the others finished (none is left running on the caller's buffers).
- Thread-safe; a call made from inside a part runs on that part's thread (no nested waiting).
"""
from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["MAX_THREADS", "MIN_PART_BYTES", "executor", "run_parts", "threads"]

T = TypeVar("T")
MAX_THREADS = 16
MIN_PART_BYTES = 1 << 20
_ENV = "MULTIDEV_HOST_THREADS"

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_count: int | None = None
_inside = threading.local()


def _forget_pool() -> None:
    """In a forked child: the parent's pool threads do not exist there; a new pool starts on demand."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()
    _inside.pool = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def threads() -> int:
    """How many threads :func:`run_parts` uses at most (``MULTIDEV_HOST_THREADS``, read once)."""
    global _count
    if _count is None:
        raw = os.environ.get(_ENV, "").strip()
        try:
            n = int(raw) if raw else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
                else (os.cpu_count() or 1)
        except ValueError:
            n = 1
        _count = max(1, min(MAX_THREADS, n))
    return _count


def executor() -> ThreadPoolExecutor:
    """The one pool of multidev's host threads (made at the first call; its threads start as work
    comes): :func:`run_parts`'s, and the staging uploads' (:mod:`multidev.staging`). Work given to
    it must not wait for other work of the pool."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(8, threads()), thread_name_prefix="multidev-host",
                                       initializer=lambda: setattr(_inside, "pool", True))
        return _pool


def run_parts(fn: Callable[[Sequence[T]], Any], items: Sequence[T], nbytes: int) -> None:
    """``fn(part)`` for contiguous parts of ``items`` (independent work items, in order, that touch
    ``nbytes`` of memory in all), on up to :func:`threads` threads, the calling one included; returns
    when all have finished, raising the first part's exception, if any."""
    k = min(threads(), len(items), nbytes // MIN_PART_BYTES)
    if k <= 1 or getattr(_inside, "pool", False):
        fn(items)
        return
    step = -(-len(items) // k)
    parts = [items[i:i + step] for i in range(0, len(items), step)]
    pool = executor()
    futures: list[Future[Any]] = [pool.submit(contextvars.copy_context().run, fn, p) for p in parts[1:]]
    error: BaseException | None = None
    _inside.pool = True  # a call from a part runs inline, on this thread as on the pool's
    try:
        fn(parts[0])
    except BaseException as e:  # noqa: BLE001 - raised below, once the other parts are done
        error = e
    finally:
        _inside.pool = False
    for f in futures:  # every part has ended before this returns or raises (they write the caller's memory)
        while True:
            try:
                e2 = None if f.cancelled() else f.exception()
                break
            except BaseException as e:  # noqa: BLE001 - an interrupt while waiting: the parts not started
                error = error or e  # are cancelled, the running ones awaited, then it is raised
                for g in futures:
                    g.cancel()
        if error is None and e2 is not None:
            error = e2
    if error is not None:
        raise error
