"""CuPy's current device (:class:`~multidev.adapter.SupportsDeviceScope`): ``cupy.cuda.Device(i)``
as a context manager, so ``cupy.ones(2)`` inside ``md.device_scope("gpu:1", backend="cupy")`` lands
on GPU 1. ``cpu:0`` holds NumPy arrays, which have no current device: its scope changes nothing."""
from __future__ import annotations

import threading
from typing import Any

from multidev.adapter import Concern, Device, SupportsDeviceScope

from .core import CupyCore


class CupyScope(Concern, SupportsDeviceScope):
    """``with cupy.cuda.Device(i):``."""

    core: CupyCore

    def device_scope(self, device: Device) -> Any:
        return _Scope(self.core.cp.cuda.Device(device.index) if device.kind == "gpu" else None)

    def current_device(self) -> Device:
        stack = getattr(_SCOPES, "stack", None)
        if stack and stack[-1] is None:
            return Device("cpu", 0)
        return Device("gpu", int(self.core.cp.cuda.Device().id))


_SCOPES = threading.local()  # per thread: the open scopes, innermost last (None for cpu:0)


class _Scope:
    """One ``md.device_scope`` on CuPy: a GPU's enters ``cupy.cuda.Device(i)`` (CuPy's current device
    is per thread); ``cpu:0``'s changes no CuPy state (NumPy arrays have no current device) but,
    while it is the innermost scope in this thread, :meth:`CupyScope.current_device` says ``cpu:0``
    (multidev's own creation calls follow ``md.device_scope``)."""

    def __init__(self, cuda_device: Any) -> None:
        self.cuda_device = cuda_device

    def __enter__(self) -> None:
        if self.cuda_device is not None:
            self.cuda_device.__enter__()
        if not hasattr(_SCOPES, "stack"):
            _SCOPES.stack = []
        _SCOPES.stack.append(self.cuda_device)

    def __exit__(self, *exc: Any) -> None:
        _SCOPES.stack.pop()
        if self.cuda_device is not None:
            self.cuda_device.__exit__(*exc)
