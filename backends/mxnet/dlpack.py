"""DLPack interchange for MXNet (:class:`~multidev.adapter.SupportsDLPack`): legacy capsules out,
compact tensors of MXNet's dtypes in (host buffers on ``cpu:0`` only)."""
from __future__ import annotations

from typing import Any

import numpy as np

from multidev.adapter import CapabilityError, Concern, Device, SupportsDLPack

from ._common import MX_DTYPES
from .core import MxnetCore


class MxnetDLPack(Concern, SupportsDLPack):
    """``mx.nd.to_dlpack_for_read`` out, ``mx.nd.from_dlpack`` in, refused where MXNet cannot
    compute with the result or label it with the device asked for."""

    core: MxnetCore

    def export_dlpack(self, x: Any) -> Any:
        """A legacy DLPack capsule (``mx.nd.to_dlpack_for_read``: MXNet arrays have no
        ``__dlpack__``). MXNet arrays are always compact, views included. bool cannot be exported."""
        if self.core.dtype_of(x) == "bool":
            raise CapabilityError("mxnet backend: MXNet cannot export bool arrays through DLPack; "
                                  "cast first (x.astype('uint8')) or go through multidev.to_numpy")
        return self.core.mx.nd.to_dlpack_for_read(self.core._nd(x))

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        """An array sharing memory with ``obj`` (an object with ``__dlpack__`` or a legacy capsule): an
        ``mx.np`` array in MXNet's numpy mode, else an NDArray. MXNet takes only compact (C-contiguous)
        tensors and not bool, int16 or bfloat16. A CPU tensor always lands on ``cpu:0``: MXNet's
        FromDLPack ignores the CPU device id, and no MXNet API labels foreign memory with another CPU
        context (convert then copies)."""
        capsule = obj.__dlpack__() if hasattr(obj, "__dlpack__") else obj
        try:
            with self.core._scope():
                y = self.core.mx.nd.from_dlpack(capsule)
        except self.core._error as e:
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise CapabilityError(
                f"mxnet backend cannot import this DLPack tensor ({msg}). MXNet takes only compact "
                "(C-contiguous) tensors of bool-free dtypes: make it contiguous or cast it first, or "
                "copy through NumPy"
            ) from e
        dt = np.dtype(y.dtype)
        if dt.names is not None or dt.name not in MX_DTYPES:
            # bfloat16 arrives as a structured uint16 dtype that no MXNet op computes with.
            raise CapabilityError(f"mxnet backend: DLPack tensor of dtype {dt} cannot be used by MXNet "
                                  f"1.9.1; cast it to one of {', '.join(sorted(MX_DTYPES))} first")
        if self.core.device_of(y) != device:
            raise CapabilityError(f"mxnet backend: a DLPack buffer of {device} arrived on "
                                  f"{self.core.device_of(y)}; MXNet cannot label foreign memory with another "
                                  "CPU context, so sharing works on cpu:0 only")
        return self.core._made(y)
