"""CuPy's current device (:class:`~multidev.adapter.SupportsDeviceScope`): ``cupy.cuda.Device(i)``
as a context manager, so ``cupy.ones(2)`` inside ``md.device_scope("gpu:1", backend="cupy")`` lands
on GPU 1. ``cpu:0`` holds NumPy arrays, which have no current device: its scope changes nothing."""
from __future__ import annotations

import threading
from typing import Any

from multidev.adapter import Device, SupportsDeviceScope


class CupyScope(SupportsDeviceScope):
    """``with cupy.cuda.Device(i):``."""

    _cp: Any

    def device_scope(self, device: Device) -> Any:
        if device.kind != "gpu":
            return _HostScope(self)
        return self._cp.cuda.Device(device.index)

    def current_device(self) -> Device:
        if getattr(_HOST_SCOPES, "depth", 0):
            return Device("cpu", 0)
        return Device("gpu", int(self._cp.cuda.Device().id))


_HOST_SCOPES = threading.local()  # per thread: how deep inside cpu:0 scopes it is


class _HostScope:
    """``cpu:0``'s scope: CuPy has no current host device; inside it (in this thread),
    :meth:`CupyScope.current_device` says ``cpu:0`` (multidev's own creation calls follow
    ``md.device_scope``)."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def __enter__(self) -> None:
        _HOST_SCOPES.depth = getattr(_HOST_SCOPES, "depth", 0) + 1

    def __exit__(self, *exc: Any) -> None:
        _HOST_SCOPES.depth -= 1
