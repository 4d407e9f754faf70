"""Non-blocking moves for PyTorch (:class:`~multidev.adapter.SupportsNonBlocking`) and the machinery
the blocking moves share: one copy stream per GPU, downloads into pinned host buffers, and large
pageable uploads staged through pinned chunks (:func:`multidev.adapter.staged_upload`).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from multidev.adapter import Device, NonBlockingMoves, StagingPlan, staged_upload


class TorchTransfers(NonBlockingMoves):
    """``start_move`` on CUDA events and copy streams (``start_to_numpy`` from it), and the
    streams, pinned downloads and staged uploads that the core's ``move``, ``asarray`` and
    ``to_numpy`` use too."""

    _torch: Any
    _n_cuda: int
    _copy_streams: dict[int, Any]
    _stream_lock: threading.Lock
    _plain_dtypes: set[Any]
    staging: StagingPlan

    if TYPE_CHECKING:  # the core protocol (core.TorchCore)
        def to_native_device(self, device: Device) -> Any: ...
        def dtype_of(self, x: Any) -> str: ...
        def move(self, x: Any, device: Device) -> Any: ...
        def _target(self, dtype: str, device: Device) -> tuple[Any, Any]: ...

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        """Device to host: on a copy stream of the source GPU, into a pinned buffer (torch's caching
        host allocator), starting once the work queued so far on x's stream is done, so later work
        overlaps with the copy. Host to device: pinned (large pageable sources through the staging
        pipeline), then an asynchronous copy ordered before later work on the target's stream."""
        torch = self._torch
        src = x.device
        if src.type != "cuda" and device.kind != "gpu":
            # No CUDA involved: the copy is synchronous (MPS work is drained by the waiter).
            y = self.move(x, device)
            return y, (torch.mps.synchronize if "mps" in (src.type, device.kind) else None)
        self._target(self.dtype_of(x), device)
        dev = self.to_native_device(device)
        if device.kind == "cpu":
            return self._start_download(x)
        if src.type == "cpu":
            if self._stageable(x):
                y = self._upload(x.detach().numpy(), x.dtype, device)
            else:
                if not x.requires_grad and not x.is_pinned():
                    x = x.pin_memory()  # a pinned snapshot makes the host-to-device copy asynchronous
                y = x.to(dev, non_blocking=True)
        else:
            y = x.to(dev, non_blocking=True)  # GPU to GPU joins the target's current stream
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(dev))
        return y, done.synchronize

    def _copy_stream(self, dev: Any) -> Any:
        """The dedicated copy stream of a GPU (made once)."""
        s = self._copy_streams.get(dev.index)
        if s is None:
            with self._stream_lock:
                s = self._copy_streams.get(dev.index)
                if s is None:
                    s = self._copy_streams[dev.index] = self._torch.cuda.Stream(dev)
        return s

    def _start_download(self, x: Any) -> tuple[Any, Callable[[], None]]:
        torch = self._torch
        dev = x.device
        producer = torch.cuda.current_stream(dev)
        cs = self._copy_stream(dev)
        ready = torch.cuda.Event()
        ready.record(producer)  # x is complete once the work queued on its stream so far is
        t = x.detach()
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        cs.wait_event(ready)
        with torch.cuda.stream(cs):
            host.copy_(t, non_blocking=True)
        t.record_stream(cs)  # the allocator keeps x's memory until the copy has read it
        done = torch.cuda.Event()
        done.record(cs)

        def waiter() -> None:
            done.synchronize()
            keep.clear()  # x may go now

        keep = [t]  # the handle holds the source until the copy has landed
        return host, waiter

    def _stageable(self, x: Any) -> bool:
        # The size first: is_pinned() asks the CUDA driver about the pointer.
        return (self._n_cuda > 0 and x.numel() * x.element_size() >= self.staging.threshold
                and not x.requires_grad and x.is_contiguous() and x.dtype in self._plain_dtypes
                and not x.is_conj() and not x.is_neg() and not x.is_pinned())

    def _upload(self, arr: np.ndarray, dt: Any, device: Device) -> Any:
        """A new tensor on ``device`` holding pageable ``arr`` (C-contiguous), uploaded through the
        staging pipeline (multidev.adapter.staged_upload) on the GPU's copy stream; ordered before
        later work on the device's current stream."""
        torch = self._torch
        dev = self.to_native_device(device)
        out = torch.empty(arr.shape, dtype=dt, device=dev)
        cs = self._copy_stream(dev)
        cur = torch.cuda.current_stream(dev)
        cs.wait_stream(cur)  # out's memory is free for writing once the device's queued work allows
        dst = out.view(-1).view(torch.uint8) if out.numel() else out

        def alloc(n: int) -> tuple[Any, np.ndarray]:
            buf = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            return buf, buf.numpy()

        def submit(buf: Any, n: int, off: int) -> Any:
            with torch.cuda.stream(cs):
                dst[off:off + n].copy_(buf[:n], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(cs)
            return ev

        staged_upload(np.ascontiguousarray(arr), alloc, submit, lambda ev: ev.synchronize(), self.staging)
        cur.wait_stream(cs)  # later work on the device sees the whole upload
        out.record_stream(cs)  # and out's memory outlives the copies into it
        return out
