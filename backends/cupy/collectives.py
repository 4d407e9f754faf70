"""The native allreduce for CuPy (:class:`~multidev.adapter.SupportsNativeCollectives`): NCCL through
``cupy.cuda.nccl``."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from multidev.adapter import CapabilityError, Concern, SupportsNativeCollectives

from .core import CupyCore

# ncclDataType_t (nccl.h) and ncclRedOp_t values.
_NCCL_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
                "float32": 7, "float64": 8, "bfloat16": 9}
_NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}
# dtypes NCCL lacks, reduced through a wider type (exact modulo the narrow width) or as pairs of reals
_NCCL_VIA = {"int16": "int32", "uint16": "uint32", "bool": "uint8"}


class CupyCollectives(Concern, SupportsNativeCollectives):
    """One NCCL communicator per device list (``initAll``), grouped ``allReduce`` calls on each
    device's current stream."""

    core: CupyCore

    def __init__(self, core: CupyCore) -> None:
        super().__init__(core)
        self._lock = threading.Lock()
        self._comms: dict[tuple[int, ...], list[Any]] = {}  # device ids -> their NCCL communicators

    @classmethod
    def available_on(cls, core: Any) -> bool:
        """NCCL needs two GPUs, and a CuPy built with it."""
        return sum(d.kind == "gpu" for d in core.devices()) >= 2 and cls.nccl() is not None

    @staticmethod
    def nccl() -> Any:
        """``cupy.cuda.nccl`` where CuPy has NCCL, else None."""
        try:
            from cupy.cuda import nccl
        except ImportError:
            return None
        return nccl if getattr(nccl, "available", False) else None

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        """NCCL allreduce (``cupy.cuda.nccl``) over one GPU array per device, out of place, on each
        device's current stream (asynchronous). Non-contiguous inputs are first copied; bool
        reduces as uint8 (or/and), int16/uint16 through 32 bits (exact modulo 2**16), complex sums
        as pairs of reals."""
        cp = self.core.cp
        xs = list(xs)
        if not all(self.core._is_gpu(x) for x in xs):
            where = ", ".join(str(self.core.device_of(x)) for x in xs)
            raise CapabilityError(f"cupy backend: the native allreduce (NCCL) takes GPU arrays on distinct GPUs; "
                                  f"got arrays on {where}. Use algorithm='naive' or 'auto'.")
        nccl = self.nccl()
        if nccl is None:
            raise CapabilityError("cupy backend: NCCL is not available to CuPy here; use algorithm='ring'")
        if op not in _NCCL_OPS:
            raise CapabilityError(f"cupy backend: native allreduce has no op {op!r}; use sum, max, min or prod")
        dtype = self.core.dtype_of(xs[0])
        cplx = dtype.startswith("complex")
        if cplx and op != "sum":
            raise CapabilityError(f"cupy backend: {op} is not defined for complex arrays")
        base = {"complex64": "float32", "complex128": "float64"}.get(dtype, _NCCL_VIA.get(dtype, dtype))
        if base not in _NCCL_DTYPES:
            raise CapabilityError(f"cupy backend: NCCL cannot reduce {dtype}; use algorithm='ring'")
        code = _NCCL_OPS[op]
        if dtype == "bool":  # or/and as max/min of 0/1 bytes
            code = _NCCL_OPS["max"] if op in ("sum", "max") else _NCCL_OPS["min"]
        ids = tuple(int(x.data.device_id) for x in xs)
        with self._lock:
            comms = self._comms.get(ids)
            if comms is None:
                comms = self._comms[ids] = list(nccl.NcclCommunicator.initAll(list(ids)))
        work_dt = np.dtype(base) if base != "bfloat16" else self.core._bf16
        sends, recvs = [], []
        for x, i in zip(xs, ids):
            with self.core._gpu(self.core._gpus[i]):
                s = x.astype(x.dtype if cplx else work_dt, order="C", copy=False).reshape(-1)
                if cplx:
                    s = s.view(work_dt)  # (re, im) pairs
                sends.append(s)
                recvs.append(cp.empty_like(s))
        if sends[0].size:
            nccl.groupStart()
            try:
                for c, s, r, i in zip(comms, sends, recvs, ids):
                    with self.core._cdev[i]:
                        c.allReduce(s.data.ptr, r.data.ptr, s.size, _NCCL_DTYPES[base], code,
                                    cp.cuda.get_current_stream().ptr)
            finally:
                nccl.groupEnd()
        out = []
        for x, r, i in zip(xs, recvs, ids):
            with self.core._cdev[i]:
                if cplx:
                    y = r.view(x.dtype).reshape(x.shape)
                else:
                    y = r.reshape(x.shape).astype(x.dtype, copy=False)
            out.append(y)
        return out
