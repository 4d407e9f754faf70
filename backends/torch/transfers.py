"""Non-blocking moves for PyTorch (:class:`~multidev.adapter.SupportsNonBlocking`) and the machinery
the blocking moves share: one copy stream per GPU, downloads into pinned host buffers, and large
pageable uploads staged through pinned chunks (:func:`multidev.adapter.staged_upload`).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from multidev.adapter import Device, NonBlockingMoves, staged_upload

from .core import TorchCore


class TorchTransfers(NonBlockingMoves):
    """``start_move`` on CUDA events and copy streams (``start_to_numpy`` from it), and the
    streams, pinned downloads and staged uploads that the core's ``move``, ``asarray`` and
    ``to_numpy`` use too."""

    core: TorchCore

    def __init__(self, core: TorchCore) -> None:
        super().__init__(core)
        torch = core.torch
        self.copy_streams: dict[int, Any] = {}  # one per GPU, made on first use
        self.stream_lock = threading.Lock()
        #: dtypes a staged upload takes as plain bytes
        self.plain_dtypes = {getattr(torch, n) for n in ("bool", "int8", "uint8", "int16", "int32", "int64", "float16",
                                                         "float32", "float64", "complex64", "complex128")}

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        """Device to host: on a copy stream of the source GPU, into a pinned buffer (torch's caching
        host allocator), starting once the work queued so far on x's stream is done, so later work
        overlaps with the copy. Host to device: pinned (large pageable sources through the staging
        pipeline), then an asynchronous copy ordered before later work on the target's stream."""
        torch = self.core.torch
        src = x.device
        if src.type != "cuda" and device.kind != "gpu":
            # No CUDA involved: the copy is synchronous (MPS work is drained by the waiter).
            y = self.core.move(x, device)
            return y, (torch.mps.synchronize if "mps" in (src.type, device.kind) else None)
        self.core._target(self.core.dtype_of(x), device)
        dev = self.core.to_native_device(device)
        if device.kind == "cpu":
            return self.start_download(x)
        if src.type == "cpu":
            if self.stageable(x):
                y = self.upload(x.detach().numpy(), x.dtype, device)
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
        s = self.copy_streams.get(dev.index)
        if s is None:
            with self.stream_lock:
                s = self.copy_streams.get(dev.index)
                if s is None:
                    s = self.copy_streams[dev.index] = self.core.torch.cuda.Stream(dev)
        return s

    def download(self, x: Any) -> Any:
        """A CUDA tensor's values in a new pinned host tensor (torch's caching host allocator), waited
        for: the blocking reads' route. The copy is queued on the device's current stream, after the
        work that produces ``x``, and waited for on an event: no copy stream, nothing to overlap with,
        and none of a side stream's cross-stream events (on an H100 they cost 25-30 µs a copy: 1 MiB
        in 37 µs this way against 66 through the copy stream, 32 for a copy into a buffer kept from
        call to call; ``scripts/gpu/d2h_torch_probe.py``)."""
        torch = self.core.torch
        t = _resolved(x)
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)  # (on the current stream of t's device)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(t.device))
        done.synchronize()
        return host

    def start_download(self, x: Any) -> tuple[Any, Callable[[], None]]:
        torch = self.core.torch
        dev = x.device
        producer = torch.cuda.current_stream(dev)
        cs = self._copy_stream(dev)
        t = _resolved(x)  # (queued on the producer's stream: before the event)
        ready = torch.cuda.Event()
        ready.record(producer)  # x is complete once the work queued on its stream so far is
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

    def stageable(self, x: Any) -> bool:
        # The size first: is_pinned() asks the CUDA driver about the pointer.
        return (self.core._n_cuda > 0 and x.numel() * x.element_size() >= self.core.staging.threshold
                and not x.requires_grad and x.is_contiguous() and x.dtype in self.plain_dtypes
                and not x.is_conj() and not x.is_neg() and not x.is_pinned())

    def upload(self, arr: np.ndarray, dt: Any, device: Device) -> Any:
        """A new tensor on ``device`` holding pageable ``arr`` (C-contiguous), uploaded through the
        staging pipeline (multidev.adapter.staged_upload) on the GPU's copy stream; ordered before
        later work on the device's current stream."""
        torch = self.core.torch
        dev = self.core.to_native_device(device)
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

        staged_upload(np.ascontiguousarray(arr), alloc, submit, lambda ev: ev.synchronize(), self.core.staging)
        cur.wait_stream(cs)  # later work on the device sees the whole upload
        out.record_stream(cs)  # and out's memory outlives the copies into it
        return out


def _resolved(x: Any) -> Any:
    """``x`` detached, its lazy conjugation or negation applied (on its device; ``x`` itself, detached,
    where it has none): an asynchronous device-to-host copy of such a view into a plain host tensor
    applies the bit on the host before the copy lands, so the copy's values overwrite it
    (pytorch#146286)."""
    t = x.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t
