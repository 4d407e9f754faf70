"""CuPy's current device (:class:`~multidev.adapter.SupportsDeviceScope`): ``cupy.cuda.Device(i)``
as a context manager, so ``cupy.ones(2)`` inside ``md.device_scope("gpu:1", backend="cupy")`` lands
on GPU 1. ``cpu:0`` holds NumPy arrays, which have no current device: its scope changes nothing."""
from __future__ import annotations

import contextlib
from typing import Any

from multidev.adapter import Device, SupportsDeviceScope


class CupyScope(SupportsDeviceScope):
    """``with cupy.cuda.Device(i):``."""

    _cp: Any

    def device_scope(self, device: Device) -> Any:
        if device.kind != "gpu":
            return contextlib.nullcontext()
        return self._cp.cuda.Device(device.index)
