"""DLPack interchange for CuPy (:class:`~multidev.adapter.SupportsDLPack`): GPU arrays through
``cupy.from_dlpack`` under the producer's device, host arrays through NumPy's."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from multidev.adapter import CapabilityError, Device, SupportsDLPack

from ._common import CupyHostArray


class CupyDLPack(SupportsDLPack):
    """GPU arrays export themselves (``__dlpack__`` orders the consumer's stream by an event); host
    arrays as plain ndarrays."""

    _cp: Any

    if TYPE_CHECKING:  # the core protocol (core.CupyCore)
        def device_of(self, x: Any) -> Device: ...
        def _gpu(self, device: Device) -> Any: ...
        def _is_gpu(self, x: Any) -> bool: ...

    def export_dlpack(self, x: Any) -> Any:
        return x if self._is_gpu(x) else np.asarray(x).view(np.ndarray)

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        """A view of a DLPack producer: ``cupy.from_dlpack`` under the producer's GPU (the
        producer orders itself before CuPy's current stream), NumPy's for host buffers."""
        try:
            if device.kind == "cpu":
                return np.from_dlpack(obj).view(CupyHostArray)
            with self._gpu(device):
                y = self._cp.from_dlpack(obj)
        except (TypeError, ValueError, BufferError, RuntimeError, NotImplementedError, AttributeError) as e:
            raise CapabilityError(f"cupy backend cannot import {type(obj).__name__} through DLPack: {e}") from e
        if self.device_of(y) != device:
            raise CapabilityError(f"cupy backend: a DLPack buffer of {device} arrived on {self.device_of(y)}")
        return y
