"""Non-blocking moves for MXNet (:class:`~multidev.adapter.SupportsNonBlocking` through
:class:`~multidev.adapter.NonBlockingMoves`): copies queued on MXNet's engine."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from multidev.adapter import Device, NonBlockingMoves

from .core import MxnetCore


class MxnetTransfers(NonBlockingMoves):
    """``start_move`` queues the copy (into pinned host memory from a GPU on CUDA builds); the waiter
    is the target's ``wait_to_read``."""

    core: MxnetCore

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        """The copy is queued on MXNet's engine; the waiter is the target's ``wait_to_read`` (which
        raises the copy's asynchronous error). A GPU -> ``cpu:0`` copy lands in pinned host memory
        (``mx.cpu_pinned``, reported as ``cpu:0``) on CUDA builds."""
        src = self.core.device_of(x)
        if src.is_gpu and device == Device("cpu", 0) and self.core._caps.pinned_memory:
            with self.core._scope():
                y = x.copyto(self.core.mx.cpu_pinned(src.index))  # untested here: no CUDA build of MXNet
        else:
            y = self.core.move(x, device)
        return y, y.wait_to_read
