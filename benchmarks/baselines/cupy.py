"""The CuPy baseline for ``multidev bench``: CuPy's own calls for every row.

Host (``cpu:0``) rows use NumPy's calls, as CuPy users do. CuPy places work on its current device,
so GPU calls other than on the current device run under ``with cupy.cuda.Device(i)``, as idiomatic
CuPy code must. CuPy's matmul precision is fixed at import (``$CUPY_TF32``), so ``set_precision``
only reports it.
"""
from __future__ import annotations

import operator
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from multidev import Device

from ..baseline import Call, Native, nothing


class CupyNative(Native):
    framework = "cupy"
    #: suite ``startup``: the framework's import and first call, in a fresh interpreter
    startup_code = "import cupy; cupy.zeros(1)"
    env_vars = ("CUPY_TF32", "CUPY_ACCELERATORS", "CUPY_GPU_MEMORY_LIMIT", "CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE")

    def __init__(self, b: Any) -> None:
        super().__init__(b)
        import cupy
        import cupyx

        self.cp, self.cpx = cupy, cupyx

    def _dev(self, d: Device) -> Any:
        return self.cp.cuda.Device(d.index)

    def _under(self, d: Device, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` run with GPU ``d`` current."""
        dev = self._dev(d)

        def run(*a: Any) -> Any:
            with dev:
                return fn(*a)
        return run

    def _gpu(self, x: Any) -> bool:
        return isinstance(x, self.cp.ndarray)

    def mm(self, dev: Device) -> Callable[[Any, Any], Any]:
        return self._under(dev, self.cp.matmul) if dev.kind == "gpu" else np.matmul

    def op_to(self, x: Any, dev: Device) -> Call:
        cp = self.cp
        if dev.kind != "gpu":
            if self._gpu(x):
                return cp.asnumpy, (x,), "cupy.asnumpy(x)"
            return np.asarray, (x,), "np.asarray(x)"
        if self._gpu(x) and x.device.id == dev.index:
            return cp.asarray, (x,), "cupy.asarray(x)"
        return self._under(dev, cp.asarray), (x,), "with cupy.cuda.Device(i): cupy.asarray(x)"

    def op_move_async(self, x: Any, dev: Device) -> Call:
        fn, a, label = self.op_to(x, dev)
        return fn, a, label + " (CuPy has no non-blocking flag; from pageable memory it blocks)"

    def op_copy(self, x: Any, dev: Device) -> Call:
        cp = self.cp
        if dev.kind != "gpu":
            if self._gpu(x):
                return cp.asnumpy, (x,), "cupy.asnumpy(x)"
            return np.array, (x,), "np.array(x)"
        if self._gpu(x):
            return self._under(dev, operator.methodcaller("copy")), (x,), "with cupy.cuda.Device(i): x.copy()"
        return self._under(dev, cp.array), (x,), "with cupy.cuda.Device(i): cupy.array(x)"

    def op_device_of(self, x: Any) -> Call:
        return operator.attrgetter("device"), (x,), "x.device"

    def op_sync(self, dev: Device, x: Any = None) -> Call:
        if dev.kind == "gpu":
            return self._dev(dev).synchronize, (), "cupy.cuda.Device(i).synchronize()"
        return nothing, (), "nothing (host arrays are NumPy's: synchronous)"

    def op_wait(self, x: Any) -> Call:
        if self._gpu(x):
            return x.device.synchronize, (), "x.device.synchronize() (CuPy has no per-array wait)"
        return nothing, (), "nothing (host arrays are NumPy's: synchronous)"

    def op_zeros(self, shape: tuple, dev: Device) -> Call:
        if dev.kind != "gpu":
            return np.zeros, (shape, np.float32), "np.zeros(shape, float32)"
        cp = self.cp
        return self._under(dev, cp.zeros), (shape, cp.float32), "with cupy.cuda.Device(i): cupy.zeros(shape)"

    def op_h2d(self, a: np.ndarray, dev: Device) -> Call:
        if dev.kind != "gpu":
            return np.array, (a,), "np.array(a)"
        return self._under(dev, self.cp.asarray), (a,), "with cupy.cuda.Device(i): cupy.asarray(a)"

    def op_d2h(self, x: Any) -> Call:
        if not self._gpu(x):
            return np.asarray, (x,), "np.asarray(x)"
        return self.cp.asnumpy, (x,), "cupy.asnumpy(x)"

    def op_h2d_pinned(self, a: np.ndarray, dev: Device) -> Call | None:
        """The best native upload: ``set`` from a pinned host buffer filled beforehand (GPU only)."""
        if dev.kind != "gpu":
            return None
        cp = self.cp
        src = self.cpx.empty_pinned(a.shape, dtype=a.dtype)
        src[...] = a

        def up(p: np.ndarray) -> Any:
            y = cp.empty(p.shape, dtype=p.dtype)
            y.set(p)
            return y
        return self._under(dev, up), (src,), "y = cupy.empty(...); y.set(pinned) (pinned source filled beforehand)"

    def op_d2h_pinned(self, x: Any) -> Call | None:
        """The best native download: ``get`` into a pinned host buffer allocated beforehand."""
        if not self._gpu(x):
            return None
        cp = self.cp
        dst = self.cpx.empty_pinned(x.shape, dtype=x.dtype)

        def down(x: Any) -> np.ndarray:
            with x.device:
                s = cp.cuda.get_current_stream()
                x.get(stream=s, out=dst, blocking=False)
                s.synchronize()
            return dst
        return down, (x,), "x.get(stream, out=pinned, blocking=False); stream.synchronize() (pinned buffer beforehand)"

    def set_precision(self, mode: str) -> dict[str, Any]:
        return {"CUPY_TF32": os.environ.get("CUPY_TF32", "0 (unset)"),
                "note": "CuPy reads CUPY_TF32 at import; the mode is not switched at run time"}

    def device_name(self, dev: Device) -> str:
        if dev.kind == "gpu":
            props = self.cp.cuda.runtime.getDeviceProperties(dev.index)
            name = props.get("name", b"")
            return name.decode() if isinstance(name, bytes) else str(name)
        return super().device_name(dev)

    def op_allreduce_framework(self, bufs: list[Any]) -> Call | None:
        """NCCL's allreduce in place on preallocated buffers, one per GPU (``cupy.cuda.nccl``)."""
        if len(bufs) < 2 or not all(self._gpu(b) for b in bufs):
            return None
        try:
            from cupy.cuda import nccl
        except ImportError:
            return None
        if not getattr(nccl, "available", False):
            return None
        codes = {"float32": 7, "float64": 8, "float16": 6, "int32": 2, "int64": 4}
        code = codes.get(str(bufs[0].dtype))
        if code is None:
            return None
        comms = nccl.NcclCommunicator.initAll([b.device.id for b in bufs])
        cp = self.cp

        def allreduce(bufs: list[Any]) -> list[Any]:
            nccl.groupStart()
            for c, b in zip(comms, bufs):
                with b.device:
                    c.allReduce(b.data.ptr, b.data.ptr, b.size, code, 0, cp.cuda.get_current_stream().ptr)
            nccl.groupEnd()
            return bufs
        return allreduce, (bufs,), "cupy.cuda.nccl allReduce in place (grouped, one communicator per GPU)"

    def op_allreduce_d2l(self, bufs: list[Any]) -> Call | None:
        """D2L's allreduce written in CuPy: add everything into the first GPU, copy the sum back."""
        if len(bufs) < 2 or not all(self._gpu(b) for b in bufs):
            return None

        def d2l(bufs: list[Any]) -> list[Any]:
            with bufs[0].device:
                for b in bufs[1:]:
                    bufs[0][...] += b.copy()
            for b in bufs[1:]:
                with b.device:
                    b[...] = bufs[0].copy()
            return bufs
        return d2l, (bufs,), "D2L allreduce (copy-and-add into GPU 0, copy back)"
