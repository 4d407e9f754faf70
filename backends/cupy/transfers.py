"""Non-blocking moves for CuPy (:class:`~multidev.adapter.SupportsNonBlocking` through
:class:`~multidev.adapter.NonBlockingMoves`) and the machinery the blocking moves share: pinned
snapshots and downloads, events on the current streams, buffers held while a copy is in flight,
and large pageable uploads staged through pinned chunks (:func:`multidev.adapter.staged_upload`).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from multidev.adapter import Device, NonBlockingMoves, aligned_empty, staged_upload

from ._common import CupyHostArray
from .core import CupyCore


class CupyTransfers(NonBlockingMoves):
    """``start_move`` on CUDA events (``start_to_numpy`` from it); the staged uploads that the
    core's creation uses too."""

    core: CupyCore

    def __init__(self, core: CupyCore) -> None:
        super().__init__(core)
        self._lock = threading.Lock()
        #: (event, objects) of the copies in flight: kept alive until the event completes
        self._inflight: list[tuple[Any, tuple[Any, ...]]] = []

    def upload(self, a: np.ndarray, device: Device) -> Any:
        """A new GPU array on ``device`` holding host array ``a`` (synchronous). From
        ``staging.threshold`` bytes up, a C-contiguous pageable array goes through the staging
        pipeline (multidev.adapter.staged_upload: pinned chunks filled by several threads while
        the copy engine drains the previous one, on the device's current stream); smaller and
        strided ones CuPy's own way."""
        cp = self.core.cp
        with self.core._gpu(device):
            if (a.nbytes < self.core.staging.threshold or not a.flags.c_contiguous or a.ndim == 0
                    or a.dtype.kind not in "biufc"):  # (ml_dtypes' bfloat16 is kind V)
                # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
                return cp.array(a if a.flags.c_contiguous else a.copy(order="C"), copy=True)
            out = cp.empty(a.shape, dtype=a.dtype)
            dst = out.reshape(-1).view(np.uint8)
            stream = cp.cuda.get_current_stream()

            def alloc(n: int) -> tuple[Any, np.ndarray]:
                buf = self.core.cpx.empty_pinned((n,), dtype=np.uint8)
                return buf, buf

            def submit(buf: Any, n: int, off: int) -> Any:
                dst[off:off + n].set(buf[:n], stream=stream)  # from pinned memory: asynchronous
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(stream)
                return ev

            staged_upload(a, alloc, submit, lambda ev: ev.synchronize(), self.core.staging)
            stream.synchronize()  # CuPy's pinned pool reuses the buffers once dropped: every copy has landed
        return out

    def _keep(self, event: Any, *objs: Any) -> None:
        """Hold ``objs`` until ``event`` completes (buffers of a copy in flight), dropping those done."""
        with self._lock:
            self._inflight = [(e, o) for e, o in self._inflight if not e.done]
            self._inflight.append((event, objs))

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        cp = self.core.cp
        dt = x.dtype
        if not self.core._is_gpu(x):  # host -> GPU, through a pinned snapshot
            if device.kind == "cpu":
                return self.core.copy(x, device), None
            a = np.asarray(x).view(np.ndarray)
            if a.size == 0:
                return self.upload(a, device), None
            pin = self.core.cpx.empty_pinned(a.shape, dtype=dt)
            np.copyto(pin, a)
            with self.core._gpu(device):
                y = cp.empty(a.shape, dtype=dt)
                y.set(pin)  # on the current stream: asynchronous from pinned memory
                done = cp.cuda.Event(disable_timing=True)
                done.record()
            self._keep(done, pin)
            return y, done.synchronize
        src = self.core.device_of(x)
        if device.kind == "cpu":  # GPU -> host, into a pinned buffer
            if x.size == 0:
                return aligned_empty(tuple(x.shape), dt).view(CupyHostArray), None
            with self.core._gpu(src):
                out = self.core.cpx.empty_pinned(tuple(x.shape), dtype=dt)
                x.get(stream=cp.cuda.get_current_stream(), out=out, blocking=False)
                done = cp.cuda.Event(disable_timing=True)
                done.record()
            self._keep(done, out, x)
            return out.view(CupyHostArray), done.synchronize
        # GPU -> GPU: the target's stream waits for the source's work, then CuPy's peer copy
        with self.core._gpu(src):
            contiguous = x.astype(x.dtype, order="C", copy=False)  # itself when already C-contiguous
            ready = cp.cuda.Event(disable_timing=True)
            ready.record()
        with self.core._gpu(device):
            cp.cuda.get_current_stream().wait_event(ready)
            y = contiguous.copy()
            done = cp.cuda.Event(disable_timing=True)
            done.record()
        self._keep(done, contiguous, x)
        return y, done.synchronize
