"""torch's default device (:class:`~multidev.adapter.SupportsDeviceScope`): the ``torch.device``
context manager, so ``torch.ones(2)`` inside ``md.device_scope(dev, backend="torch")`` lands on
``dev``. Per thread, nested as torch nests it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multidev.adapter import Device, SupportsDeviceScope


class TorchScope(SupportsDeviceScope):
    """``with torch.device(d):`` (torch's own default-device mode)."""

    if TYPE_CHECKING:  # the core's
        def to_native_device(self, device: Device) -> Any: ...

    def device_scope(self, device: Device) -> Any:
        return self.to_native_device(device)  # a torch.device is its own context manager
