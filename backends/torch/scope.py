"""torch's default device (:class:`~multidev.adapter.SupportsDeviceScope`): the ``torch.device``
context manager, so ``torch.ones(2)`` inside ``md.device_scope(dev, backend="torch")`` lands on
``dev``. Per thread, nested as torch nests it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multidev.adapter import Device, SupportsDeviceScope


class TorchScope(SupportsDeviceScope):
    """``with torch.device(d):`` (torch's own default-device mode)."""

    _torch: Any

    if TYPE_CHECKING:  # the core's
        def to_native_device(self, device: Device) -> Any: ...
        def from_native_device(self, obj: Any) -> Device | None: ...

    def device_scope(self, device: Device) -> Any:
        return self.to_native_device(device)  # a torch.device is its own context manager

    def current_device(self) -> Device:
        dev = self.from_native_device(self._torch.get_default_device())
        return dev if dev is not None else Device("cpu", 0)
