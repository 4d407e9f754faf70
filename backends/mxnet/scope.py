"""MXNet's default context (:class:`~multidev.adapter.SupportsDeviceScope`): an ``mx.Context`` as a
context manager, so ``mx.nd.ones(2)`` (and ``mx.np``) inside ``md.device_scope(dev,
backend="mxnet")`` lands on ``dev``. Per thread, nested as MXNet nests it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multidev.adapter import Device, SupportsDeviceScope


class MxnetScope(SupportsDeviceScope):
    """``with mx.cpu(i):`` / ``with mx.gpu(i):``."""

    _mx: Any

    if TYPE_CHECKING:  # the core's
        def to_native_device(self, device: Device) -> Any: ...
        def from_native_device(self, obj: Any) -> Device | None: ...

    def device_scope(self, device: Device) -> Any:
        return self.to_native_device(device)  # an mx.Context is its own context manager

    def current_device(self) -> Device:
        dev = self.from_native_device(self._mx.context.current_context())
        return dev if dev is not None else Device("cpu", 0)
