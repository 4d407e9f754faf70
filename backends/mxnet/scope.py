"""MXNet's default context (:class:`~multidev.adapter.SupportsDeviceScope`): an ``mx.Context`` as a
context manager, so ``mx.nd.ones(2)`` (and ``mx.np``) inside ``md.device_scope(dev,
backend="mxnet")`` lands on ``dev``. Per thread, nested as MXNet nests it."""
from __future__ import annotations

from typing import Any

from multidev.adapter import Concern, Device, SupportsDeviceScope

from .core import MxnetCore


class MxnetScope(Concern, SupportsDeviceScope):
    """``with mx.cpu(i):`` / ``with mx.gpu(i):``."""

    core: MxnetCore

    def device_scope(self, device: Device) -> Any:
        return self.core.to_native_device(device)  # an mx.Context is its own context manager

    def current_device(self) -> Device:
        dev = self.core.from_native_device(self.core.mx.context.current_context())
        return dev if dev is not None else Device("cpu", 0)
