"""Non-blocking moves for TensorFlow (:class:`~multidev.adapter.SupportsNonBlocking` through
:class:`~multidev.adapter.NonBlockingMoves`): TF enqueues GPU copies itself."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from multidev.adapter import Device, NonBlockingMoves

from .core import TensorflowCore


class TensorflowTransfers(NonBlockingMoves):
    """``start_move`` is ``move`` with a waiter that synchronizes the devices involved."""

    core: TensorflowCore

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        """``move`` (TF enqueues GPU copies and kernels itself); the waiter synchronizes the source
        and target devices, or is None when both are CPUs executing synchronously."""
        src = self.core.device_of(x)
        y = self.core.move(x, device)
        if not (src.is_gpu or device.is_gpu or self.core._context.is_async()):
            return y, None

        def waiter() -> None:
            for d in sorted({src, device}):
                self.core.synchronize(d)

        return y, waiter
