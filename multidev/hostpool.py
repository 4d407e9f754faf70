"""Large host buffers of multidev's own making, recycled instead of faulted in again.

Every large NumPy buffer multidev makes (a copy, a collective's result, a staging buffer) is new
memory. glibc serves it from its heap or a fresh mapping, and when the buffer is freed often gives
the pages back to the OS (trimming the heap's top, or unmapping a chunk above its mmap threshold),
so the next buffer of the same size page-faults in again: the kernel zeroes and maps every 4 KiB
page on first touch, which costs several times the copy that fills it. This pool keeps the buffers
it handed out and gives one again once nothing else refers to it.

- A buffer is free again when nothing but the pool refers to the array that owns its memory:
  CPython's reference count is exact, and every view, buffer-protocol export, DLPack capsule or
  ``torch.from_numpy`` tensor of it holds a reference to that owner.
- Buffers from :data:`MIN_BYTES` (256 KiB) to :data:`MAX_BYTES` (128 MiB: half the default cap, so a
  call making the largest buffer while its caller still holds the last call's is served; an
  out-of-place collective's results are one buffer), sizes rounded up to 64 KiB; at most 4 per
  size, and :data:`DEFAULT_CAP_MB` (256 MiB) held in all, in use or free. Past the cap, free buffers
  of the least recently used sizes are let go first; a request that still does not fit is an
  ordinary allocation.
- ``MULTIDEV_HOST_POOL_MB`` sets the cap (read once, at the first large allocation); 0 turns the
  pool off. :func:`clear` lets every free buffer go.
- Thread-safe (one lock). The buffers are uninitialised, as ``numpy.empty``'s, and
  :data:`HOST_ALIGNMENT`-aligned.
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["DEFAULT_CAP_MB", "HOST_ALIGNMENT", "MAX_BYTES", "MIN_BYTES", "clear", "empty", "held_bytes"]

#: Byte alignment of the host buffers multidev allocates (XLA shares a host buffer zero-copy only at
#: a multiple of 64 bytes).
HOST_ALIGNMENT = 64
MIN_BYTES = 256 << 10
MAX_BYTES = 128 << 20
DEFAULT_CAP_MB = 256
_ENV = "MULTIDEV_HOST_POOL_MB"
_ROUND = 64 << 10
_PER_SIZE = 4

_lock = threading.Lock()
_sizes: dict[int, list[tuple[np.ndarray, int]]] = {}  # rounded size -> [(owner, aligned offset)]
_used: dict[int, int] = {}  # rounded size -> the tick of its last request (the least recent go first)
_tick = 0
_held = 0
_cap: int | None = None  # bytes; read from the environment at the first large request
_free_refs: int | None = None  # an owner's reference count, seen from _is_free, when only the pool holds it


def _refs(entry: tuple[np.ndarray, int]) -> int:
    return sys.getrefcount(entry[0])


def _is_free(entry: tuple[np.ndarray, int]) -> bool:
    # one place for the count, so the baseline measured below is the one every check sees
    return _refs(entry) == _free_refs


def _calibrate() -> int:
    """The reference count of a pooled owner that nothing else holds, measured the way
    :func:`_is_free` sees it; 0 (the pool off) where a view does not show in the count (an
    interpreter whose counts are not exact)."""
    global _free_refs
    entry = (np.empty(8, np.uint8), 0)
    pool = [entry]
    del entry
    _free_refs = _refs(pool[0])
    alone = _is_free(pool[0])
    view = pool[0][0][2:]
    held = not _is_free(pool[0])
    del view
    again = _is_free(pool[0])
    return 1 if alone and held and again else 0


def _read_cap() -> int:
    raw = os.environ.get(_ENV, "")
    try:
        mb = float(raw) if raw.strip() else float(DEFAULT_CAP_MB)
    except ValueError:
        mb = float(DEFAULT_CAP_MB)
    return max(0, int(mb * (1 << 20))) if _calibrate() else 0


def _evict(need: int) -> None:
    """Let free buffers go, least recently used sizes first, until ``need`` more bytes fit."""
    global _held
    assert _cap is not None
    for size in sorted(_sizes, key=lambda s: _used.get(s, 0)):
        if _held + need <= _cap:
            return
        entries = _sizes[size]
        keep = []
        for e in entries:
            if _held + need > _cap and _is_free(e):
                _held -= size
            else:
                keep.append(e)
        if keep:
            _sizes[size] = keep
        else:
            del _sizes[size]
            _used.pop(size, None)


def empty(shape: Sequence[int], dtype: Any, nbytes: int | None = None) -> np.ndarray | None:
    """A C-contiguous, uninitialised, :data:`HOST_ALIGNMENT`-aligned array of ``shape`` and
    ``dtype`` from the pool, or None where the pool does not serve it (a size outside
    [MIN_BYTES, MAX_BYTES], the pool off or full): the caller allocates it itself."""
    global _cap, _tick, _held
    dt = np.dtype(dtype)
    if nbytes is None:
        nbytes = dt.itemsize
        for n in shape:
            nbytes *= int(n)
    if nbytes < MIN_BYTES or nbytes > MAX_BYTES:
        return None
    size = -(-nbytes // _ROUND) * _ROUND
    with _lock:
        if _cap is None:
            _cap = _read_cap()
        if not _cap:
            return None
        _tick += 1
        _used[size] = _tick
        entries = _sizes.setdefault(size, [])
        found = next((e for e in entries if _is_free(e)), None)
        if found is None:
            if len(entries) >= _PER_SIZE:
                return None
            if _held + size > _cap:
                _evict(size)
                if _held + size > _cap:
                    return None
                entries = _sizes.setdefault(size, [])
                _used[size] = _tick  # (eviction may have let this size's last free buffer go)
            owner = np.empty(size + HOST_ALIGNMENT, np.uint8)
            found = (owner, (-owner.ctypes.data) % HOST_ALIGNMENT)
            entries.append(found)
            _held += size
        owner, off = found
        out = owner[off:off + nbytes].view(dt)
    shape = tuple(int(n) for n in shape)
    return out if len(shape) == 1 else out.reshape(shape)


def clear() -> int:
    """Let every free buffer go (those still in use stay tracked); returns the bytes let go."""
    global _held
    gone = 0
    with _lock:
        for size in list(_sizes):
            keep = [e for e in _sizes[size] if not _is_free(e)]
            gone += size * (len(_sizes[size]) - len(keep))
            if keep:
                _sizes[size] = keep
            else:
                del _sizes[size]
                _used.pop(size, None)
        _held -= gone
    return gone


def held_bytes() -> tuple[int, int]:
    """(bytes the pool holds in all, bytes of them free now)."""
    with _lock:
        free = sum(size for size, entries in _sizes.items() for e in entries if _is_free(e))
        return _held, free
