"""DLPack interchange for CuPy (:class:`~multidev.adapter.SupportsDLPack`): GPU arrays through
``cupy.from_dlpack`` under the producer's device, host arrays through NumPy's."""
from __future__ import annotations

from typing import Any

import numpy as np

from multidev.adapter import CapabilityError, Concern, Device, SupportsDLPack

from ._common import CupyHostArray
from .core import CupyCore


class CupyDLPack(Concern, SupportsDLPack):
    """GPU arrays export themselves (``__dlpack__`` orders the consumer's stream by an event); host
    arrays as plain ndarrays."""

    core: CupyCore

    def export_dlpack(self, x: Any) -> Any:
        return x if self.core._is_gpu(x) else np.asarray(x).view(np.ndarray)

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        """A view of a DLPack producer: ``cupy.from_dlpack`` under the producer's GPU (the
        producer orders itself before CuPy's current stream), NumPy's for host buffers."""
        try:
            if device.kind == "cpu":
                return np.from_dlpack(obj).view(CupyHostArray)
            with self.core._gpu(device):
                y = self.core.cp.from_dlpack(obj)
        except (TypeError, ValueError, BufferError, RuntimeError, NotImplementedError, AttributeError) as e:
            raise CapabilityError(f"cupy backend cannot import {type(obj).__name__} through DLPack: {e}") from e
        if self.core.device_of(y) != device:
            raise CapabilityError(f"cupy backend: a DLPack buffer of {device} arrived on {self.core.device_of(y)}")
        return y
