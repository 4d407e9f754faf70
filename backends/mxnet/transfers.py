"""Non-blocking moves for MXNet (:class:`~multidev.adapter.SupportsNonBlocking` through
:class:`~multidev.adapter.NonBlockingMoves`): copies queued on MXNet's engine."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from multidev.adapter import Capabilities, Device, NonBlockingMoves


class MxnetTransfers(NonBlockingMoves):
    """``start_move`` queues the copy (into pinned host memory from a GPU on CUDA builds); the waiter
    is the target's ``wait_to_read``."""

    _mx: Any
    _caps: Capabilities

    if TYPE_CHECKING:  # the core protocol (core.MxnetCore)
        def device_of(self, x: Any) -> Device: ...
        def move(self, x: Any, device: Device) -> Any: ...
        def _scope(self) -> Any: ...

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        """The copy is queued on MXNet's engine; the waiter is the target's ``wait_to_read`` (which
        raises the copy's asynchronous error). A GPU -> ``cpu:0`` copy lands in pinned host memory
        (``mx.cpu_pinned``, reported as ``cpu:0``) on CUDA builds."""
        src = self.device_of(x)
        if src.is_gpu and device == Device("cpu", 0) and self._caps.pinned_memory:
            with self._scope():
                y = x.copyto(self._mx.cpu_pinned(src.index))  # untested here: no CUDA build of MXNet
        else:
            y = self.move(x, device)
        return y, y.wait_to_read
