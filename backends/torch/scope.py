"""torch's default device (:class:`~multidev.adapter.SupportsDeviceScope`): the ``torch.device``
context manager, so ``torch.ones(2)`` inside ``md.device_scope(dev, backend="torch")`` lands on
``dev``. Per thread, nested as torch nests it."""
from __future__ import annotations

from typing import Any

from multidev.adapter import Concern, Device, SupportsDeviceScope

from .core import TorchCore


class TorchScope(Concern, SupportsDeviceScope):
    """``with torch.device(d):`` (torch's own default-device mode)."""

    core: TorchCore

    def device_scope(self, device: Device) -> Any:
        return self.core.to_native_device(device)  # a torch.device is its own context manager

    def current_device(self) -> Device:
        dev = self.core.from_native_device(self.core.torch.get_default_device())
        return dev if dev is not None else Device("cpu", 0)
