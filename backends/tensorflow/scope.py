"""TensorFlow's default device (:class:`~multidev.adapter.SupportsDeviceScope`): ``tf.device``, so
ops and variables created inside ``md.device_scope(dev, backend="tensorflow")`` land on ``dev``.
Per thread, nested as TensorFlow nests it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multidev.adapter import Device, SupportsDeviceScope


class TensorflowScope(SupportsDeviceScope):
    """``with tf.device(name):``."""

    _tf: Any

    if TYPE_CHECKING:  # the core's
        def to_native_device(self, device: Device) -> Any: ...
        def device_of(self, x: Any) -> Device: ...

    def device_scope(self, device: Device) -> Any:
        return self._tf.device(self.to_native_device(device))

    def current_device(self) -> Device:
        # TF resolves the scope (and, without one, its own placement) only when an op runs: a
        # scalar made where an op made now would land.
        return self.device_of(self._tf.constant(0.0))
