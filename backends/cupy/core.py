"""The core protocol for CuPy: identity, devices, dtypes, creation, placement, synchronize and its
hooks, host copies, and the arithmetic the portable collectives are built from; every GPU call
under its ``cupy.cuda.Device``.

Moves and uploads go through the transfer machinery (pinned buffers, staged uploads, events) of
:mod:`.transfers`.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from multidev.adapter import (
    DTYPES,
    BackendNotAvailableError,
    BaseBackend,
    Capabilities,
    CapabilityError,
    Device,
    InvalidDeviceError,
    StagingPlan,
    aligned_empty,
    canonical_dtype,
    is_floating,
    numpy_dtype,
)

from ._common import HOST, CupyHostArray, host_array


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NULL = _NullContext()


class CupyCore(BaseBackend):
    """The core protocol of the CuPy backend; the state every concern uses is made here."""

    name: ClassVar[str] = "cupy"
    framework: ClassVar[str] = "cupy"

    @classmethod
    def install_hint(cls) -> str | None:
        """CuPy needs CUDA: say so where no NVIDIA driver is loaded, else the wheel for CUDA 12 or 13."""
        if not os.path.exists("/proc/driver/nvidia"):
            return ("CuPy needs an NVIDIA GPU with its driver, and this machine shows none; on one, "
                    "`pip install cupy-cuda13x` (or `cupy-cuda12x`, to match the CUDA driver).")
        return "Install the wheel that matches the CUDA driver: `pip install cupy-cuda13x` (or `cupy-cuda12x`)."

    def __init__(self) -> None:
        import cupy
        import cupyx

        self.cp = cupy
        self.cpx = cupyx
        if not cupy.cuda.is_available():
            why = ""
            try:
                cupy.cuda.runtime.getDeviceCount()
            except Exception as e:  # noqa: BLE001 - the reason, for the message
                why = f" ({type(e).__name__}: {e})"
            raise BackendNotAvailableError(f"cupy {cupy.__version__} is installed but finds no CUDA device{why}; "
                                           "the cupy backend needs a GPU")
        self._n = int(cupy.cuda.runtime.getDeviceCount())
        self._gpus = tuple(Device("gpu", i) for i in range(self._n))
        self._devices = (HOST, *self._gpus)
        self._cdev = tuple(cupy.cuda.Device(i) for i in range(self._n))
        self._touched: set[int] = set()
        self._ndarray = cupy.ndarray
        #: How large pageable uploads are staged (multidev.adapter.StagingPlan's defaults).
        self.staging = StagingPlan()
        dtypes = set(DTYPES) - {"bfloat16"}
        self._bf16: Any = None
        if self._bfloat16_usable():
            import ml_dtypes

            self._bf16 = np.dtype(ml_dtypes.bfloat16)
            dtypes.add("bfloat16")
        peer = False
        if self._n > 1:
            try:
                peer = any(cupy.cuda.runtime.deviceCanAccessPeer(i, j)
                           for i in range(self._n) for j in range(self._n) if i != j)
            except Exception:  # noqa: BLE001 - unknown: assume CuPy refuses mixed devices
                peer = False
        self._caps = Capabilities(
            mutable=True, async_execution=True, pinned_memory=True,
            # from_dlpack passes CuPy's current stream; __dlpack__ orders a consumer's stream by an event
            dlpack_streams=True,
            dtypes=frozenset(dtypes),
            # a host array and a GPU array never mix (CuPy refuses NumPy operands); two GPUs with
            # peer access do: CuPy then computes across them.
            raises_on_mixed_devices=not peer)

    def _bfloat16_usable(self) -> bool:
        """CuPy >= 14 holds ml_dtypes.bfloat16 (with NumPy >= 2.1.2); decided without touching a GPU."""
        try:
            import ml_dtypes  # noqa: F401
        except ImportError:
            return False
        major = int(str(self.cp.__version__).split(".")[0])
        npv = tuple(int(p) for p in np.__version__.split(".")[:3] if p.isdigit())
        return major >= 14 and npv >= (2, 1, 2)

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def version(self) -> str:
        return str(self.cp.__version__)

    def tensor_types(self) -> tuple[type, ...]:
        return (self.cp.ndarray, CupyHostArray)

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return list(self._devices)

    def to_native_device(self, device: Device) -> Any:
        if device == HOST:
            return HOST  # no CuPy object for the host: the neutral value is the native one
        if device.kind == "gpu" and device.index < self._n:
            return self._cdev[device.index]
        raise InvalidDeviceError(f"cupy backend has no device {device}")

    def from_native_device(self, obj: Any) -> Device | None:
        if isinstance(obj, self.cp.cuda.Device):
            i = int(obj.id)
            return self._gpus[i] if 0 <= i < self._n else Device("gpu", i)
        if obj.__class__ is Device and obj == HOST:
            return HOST
        return None

    def _gpu(self, device: Device) -> Any:
        """The cupy.cuda.Device of ``device`` (a GPU), marked as used."""
        self._touched.add(device.index)
        return self._cdev[device.index]

    # -- dtypes -----------------------------------------------------------------------------
    def to_native_dtype(self, dtype: str) -> Any:
        if dtype not in self._caps.dtypes:
            raise CapabilityError(f"cupy backend: dtype {dtype!r} needs CuPy >= 14 with ml_dtypes and NumPy >= 2.1.2"
                                  if dtype == "bfloat16" else f"cupy backend has no dtype {dtype!r}")
        return self._bf16 if dtype == "bfloat16" else numpy_dtype(dtype)

    def dtype_of(self, x: Any) -> str:
        return canonical_dtype(x.dtype)

    def _is_gpu(self, x: Any) -> bool:
        return isinstance(x, self._ndarray)

    # -- creation ---------------------------------------------------------------------------
    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        dt = self.to_native_dtype(dtype)
        if device.kind == "cpu":
            out = aligned_empty(shape, dt)
            out.fill(value)
            return out.view(CupyHostArray)
        cp = self.cp
        with self._gpu(device):
            if dtype == "bfloat16":  # CuPy's bfloat16 support is minimal: fill in float32, cast
                return cp.full(shape, value, dtype=np.float32).astype(dt)
            if type(value) in (int, float, bool) and value == 0 and math.copysign(1.0, value) > 0:
                return cp.zeros(shape, dtype=dt)  # a memset, not a fill kernel (much faster)
            return cp.full(shape, value, dtype=dt)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        dt = self.to_native_dtype(dtype)
        if device.kind == "cpu":
            return aligned_empty(shape, dt).view(CupyHostArray)
        with self._gpu(device):
            return self.cp.empty(shape, dtype=dt)

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        dt = self.to_native_dtype(dtype)
        if device.kind == "cpu" or dtype in ("bfloat16", "float16", "complex64", "complex128"):
            # NumPy's values exactly (CuPy's arange kernels cover the real int and float types)
            ref = np.arange(start, stop, step, dtype=np.float64 if dtype == "bfloat16" else dt).astype(dt)
            return host_array(ref) if device.kind == "cpu" else self.transfers.upload(ref, device)
        with self._gpu(device):
            return self.cp.arange(start, stop, step, dtype=dt)

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        dt = None if dtype is None else self.to_native_dtype(dtype)
        if self._is_gpu(obj):
            with self._ctx(obj):
                src = obj.astype(obj.dtype if dt is None else dt)  # a new buffer on obj's GPU
            if device.kind == "cpu":
                return self.to_numpy(src).view(CupyHostArray)
            return self._on(src, device)
        src = obj.view(np.ndarray) if isinstance(obj, np.ndarray) else obj
        if device.kind == "cpu":
            return host_array(np.array(src, dtype=dt, copy=True))
        # for). That copy made large uploads several times slower than cupy.asarray's.
        return self.transfers.upload(np.asarray(src, dtype=dt), device)

    def _on(self, y: Any, device: Device) -> Any:
        """GPU array ``y`` (a fresh buffer) on ``device``: itself when it is there."""
        return y if y.data.device_id == device.index else self.move(y, device)

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        dt = self.to_native_dtype(dtype)
        if device.kind == "cpu":
            return host_array(np.random.default_rng(seed).random(shape).astype(dt))
        cp = self.cp
        with self._gpu(device):
            gen = cp.random.default_rng(seed)
            sample = np.float64 if dtype in ("float64", "complex128") else np.float32
            return gen.random(shape, dtype=sample).astype(dt)

    # -- placement --------------------------------------------------------------------------
    def device_of(self, x: Any) -> Device:
        if x.__class__ is self._ndarray or isinstance(x, self._ndarray):
            return self._gpus[x.data.device_id]
        return HOST

    def move(self, x: Any, device: Device) -> Any:
        y, waiter = self.transfers.start_move(x, device)
        if waiter is not None and device.kind == "cpu":
            waiter()  # a host result is read by the host at once: it must have landed
        return y

    def copy(self, x: Any, device: Device) -> Any:
        if not self._is_gpu(x):
            if device.kind == "cpu":
                return host_array(np.array(x.view(np.ndarray), copy=True))
            return self.move(x, device)
        if self.device_of(x) == device:
            with self._gpu(device):
                return x.copy()
        return self.move(x, device)

    def to_numpy(self, x: Any) -> np.ndarray:
        if not self._is_gpu(x):
            return np.asarray(x).view(np.ndarray)
        y, waiter = self.transfers.start_move(x, HOST)
        if waiter is not None:
            waiter()
        return y.view(np.ndarray)

    def synchronize(self, device: Device | None) -> None:
        if device is None:
            ids = set(self._touched)
            try:
                ids.add(int(self.cp.cuda.runtime.getDevice()))
            except Exception:  # noqa: BLE001 - no current device yet: nothing queued there
                pass
            for i in sorted(ids):
                if i < self._n:
                    self._cdev[i].synchronize()
        elif device.kind == "gpu":
            self._cdev[device.index].synchronize()
        # cpu: host arrays are NumPy's, computed when the call returns

    def device_wait_fn(self, device: Device) -> Callable[[], Any] | None:
        """synchronize(device) with no adapter frame: the CuPy Device's own barrier (None on the CPU)."""
        if self._redefines("synchronize", CupyCore):
            return super().device_wait_fn(device)
        return self._cdev[device.index].synchronize if device.kind == "gpu" else None

    def wait(self, x: Any) -> None:
        if not isinstance(x, np.ndarray):  # host arrays (NumPy's) are computed already
            x.device.synchronize()

    def tensor_wait_fn(self) -> Callable[[Any], Any]:
        """wait(x) in one frame: the array's device barrier, as ``x.device.synchronize()`` (CuPy has
        no per-array wait); host arrays (NumPy's) are computed already."""
        if self._redefines("wait", CupyCore):
            return super().tensor_wait_fn()
        host = np.ndarray

        def wait(x: Any) -> None:
            if not isinstance(x, host):
                x.device.synchronize()
        return wait

    # -- arithmetic for collectives ---------------------------------------------------------
    def _ctx(self, x: Any) -> Any:
        """A context making x's GPU current (a no-op context for host arrays)."""
        if self._is_gpu(x):
            return self._cdev[x.data.device_id]
        return _NULL

    def combine(self, op: str, a: Any, b: Any) -> Any:
        self.same_device(op, (a, b))
        dtype = self.dtype_of(a)
        if op in ("max", "min") and dtype.startswith("complex"):
            raise CapabilityError(f"cupy backend: {op} is not defined for complex arrays")
        xp = self.cp if self._is_gpu(a) else np
        fn = {"sum": xp.add, "max": xp.maximum, "min": xp.minimum, "prod": xp.multiply}[op]
        if dtype == "bool":
            fn = xp.logical_or if op in ("sum", "max") else xp.logical_and
        with self._ctx(a):
            if dtype == "bfloat16" and xp is self.cp:  # through float32, rounded back once
                return fn(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
            out = fn(a, b)
        return out if xp is self.cp else host_array(np.asarray(out))

    def divide(self, x: Any, n: int) -> Any:
        gpu = self._is_gpu(x)
        xp = self.cp if gpu else np
        dtype = self.dtype_of(x)
        with self._ctx(x):
            if is_floating(dtype):
                y = (x.astype(np.float32) / n).astype(x.dtype) if dtype == "bfloat16" and gpu else x / n
                y = y.astype(x.dtype, copy=False)
            else:
                q = xp.abs(x) // n  # truncating toward zero, in x's dtype
                y = xp.where(x < 0, -q, q).astype(x.dtype, copy=False)
        return y if gpu else host_array(np.asarray(y))

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return x.reshape(shape)

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        xs = list(xs)
        self.same_device("concat", xs)
        if not self._is_gpu(xs[0]):
            return host_array(np.concatenate([np.asarray(x).view(np.ndarray) for x in xs], axis=axis))
        with self._ctx(xs[0]):
            return self.cp.concatenate(xs, axis=axis)

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        out, at = [], 0
        lead = (slice(None),) * (axis % x.ndim)  # a negative axis counts from the end
        for s in sizes:
            out.append(x[(*lead, slice(at, at + int(s)))])
            at += int(s)
        return out

    def assign(self, dst: Any, src: Any) -> None:
        self.same_device("assign", (dst, src))
        try:
            with self._ctx(dst):
                dst[...] = src
        except ValueError as e:  # a read-only host array
            raise CapabilityError(f"cupy backend: cannot write into this array: {e}") from e
