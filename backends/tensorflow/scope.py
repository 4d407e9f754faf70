"""TensorFlow's default device (:class:`~multidev.adapter.SupportsDeviceScope`): ``tf.device``, so
ops and variables created inside ``md.device_scope(dev, backend="tensorflow")`` land on ``dev``.
Per thread, nested as TensorFlow nests it."""
from __future__ import annotations

from typing import Any

from multidev.adapter import Concern, Device, SupportsDeviceScope

from .core import TensorflowCore


class TensorflowScope(Concern, SupportsDeviceScope):
    """``with tf.device(name):``."""

    core: TensorflowCore

    def device_scope(self, device: Device) -> Any:
        return self.core.tf.device(self.core.to_native_device(device))

    def current_device(self) -> Device:
        # TF resolves the scope (and, without one, its own placement) only when an op runs: a
        # scalar made where an op made now would land.
        return self.core.device_of(self.core.tf.constant(0.0))
