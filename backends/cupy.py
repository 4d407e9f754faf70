"""CuPy backend: native ``cupy.ndarray`` objects on ``gpu:i``, NumPy arrays for ``cpu:0``.

Mechanism.

- Devices: ``cpu:0`` and one ``gpu:i`` per CUDA device (``cupy.cuda.runtime.getDeviceCount()``);
  every call that makes or touches a GPU array runs under ``cupy.cuda.Device(i)``, so arrays land
  exactly where asked, whatever CuPy's current device is.
- The host mapping: CuPy has no host arrays, so ``cpu:0`` tensors are :class:`CupyHostArray`, a
  ``numpy.ndarray`` subclass with nothing added (every NumPy function takes it). The subclass
  only tells the registry which adapter owns a host array, so ``md.to(host, "gpu:0")`` works;
  ``to_numpy`` returns the plain ndarray view. Host buffers are 64-byte aligned (XLA's rule for
  sharing a host buffer with JAX or TensorFlow without a copy).
- Moves: host to GPU and GPU to host go through page-locked buffers (``cupyx.empty_pinned``):
  ``x.get(stream, out=pinned, blocking=False)`` downloads at the pinned rate (55 GB/s on an H200
  against 3.3 GB/s pageable), and an upload is staged through a pinned snapshot so ``set`` runs
  asynchronously. Each copy is queued on the current stream of the GPU involved, after the work
  that produces ``x``, and a ``cupy.cuda.Event`` recorded behind it is what ``start_move``'s
  waiter and the blocking moves wait on. GPU to GPU: the target's stream waits on an event of the
  source's stream, then CuPy's peer copy runs. Buffers an in-flight copy reads or writes are kept
  alive until its event completes (``_inflight``), whether or not the caller waits.
- ``synchronize(gpu:i)`` is ``cupy.cuda.Device(i).synchronize()`` (which raises a pending CUDA
  error); ``synchronize(None)`` does so for every GPU this adapter placed work on and CuPy's
  current device. The host side is synchronous.
- DLPack both ways: GPU arrays export themselves (``__dlpack__`` orders the consumer's stream
  after CuPy's by an event); ``cupy.from_dlpack`` imports GPU buffers under the producer's
  device, passing CuPy's current stream (so ``dlpack_streams``: ``convert`` between GPUs does not
  wait on the host); host arrays use NumPy's DLPack.
- The native allreduce is NCCL through ``cupy.cuda.nccl`` (one communicator per device list,
  ``initAll``, grouped ``allReduce`` calls on each device's current stream), advertised when NCCL
  is available and there are at least two GPUs.

On a machine without a CUDA device ``import cupy`` may still work; the adapter then raises
BackendNotAvailableError saying so, and the registry reports cupy as unavailable.
"""
from __future__ import annotations

import math
import threading
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
    NonBlockingMoves,
    StagingPlan,
    SupportsDLPack,
    SupportsNativeCollectives,
    aligned_empty,
    canonical_dtype,
    host_aligned,
    is_floating,
    numpy_dtype,
    staged_upload,
)

_HOST = Device("cpu", 0)
# ncclDataType_t (nccl.h) and ncclRedOp_t values.
_NCCL_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
                "float32": 7, "float64": 8, "bfloat16": 9}
_NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}
# dtypes NCCL lacks, reduced through a wider type (exact modulo the narrow width) or as pairs of reals
_NCCL_VIA = {"int16": "int32", "uint16": "uint32", "bool": "uint8"}


class CupyHostArray(np.ndarray):
    """A host (``cpu:0``) array of the CuPy backend: a plain ``numpy.ndarray`` subclass (see the
    module docstring); ``np.asarray(x)`` or ``x.view(np.ndarray)`` gives the plain array."""


def _host(a: np.ndarray) -> CupyHostArray:
    """``a`` (a fresh buffer) as a host array of this backend, 64-byte aligned."""
    return host_aligned(a).view(CupyHostArray)


class CupyBackend(BaseBackend, NonBlockingMoves, SupportsDLPack, SupportsNativeCollectives):
    """The CuPy backend (see module docstring)."""

    name: ClassVar[str] = "cupy"
    framework: ClassVar[str] = "cupy"

    def __init__(self) -> None:
        import cupy
        import cupyx

        self._cp = cupy
        self._cpx = cupyx
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
        self._devices = (_HOST, *self._gpus)
        self._cdev = tuple(cupy.cuda.Device(i) for i in range(self._n))
        self._touched: set[int] = set()
        self._inflight: list[tuple[Any, tuple[Any, ...]]] = []
        self._lock = threading.Lock()
        self._comms: dict[tuple[int, ...], list[Any]] = {}
        self._ndarray = cupy.ndarray
        #: How large pageable uploads are staged (multidev.adapter.StagingPlan, as for torch).
        self.staging = StagingPlan()
        dtypes = set(DTYPES) - {"bfloat16"}
        self._bf16: Any = None
        if self._bfloat16_usable():
            import ml_dtypes

            self._bf16 = np.dtype(ml_dtypes.bfloat16)
            dtypes.add("bfloat16")
        nccl = self._nccl()
        peer = False
        if self._n > 1:
            try:
                peer = any(cupy.cuda.runtime.deviceCanAccessPeer(i, j)
                           for i in range(self._n) for j in range(self._n) if i != j)
            except Exception:  # noqa: BLE001 - unknown: assume CuPy refuses mixed devices
                peer = False
        self._caps = Capabilities(
            mutable=True, async_execution=True, pinned_memory=True, dlpack=True,
            # from_dlpack passes CuPy's current stream; __dlpack__ orders a consumer's stream by an event
            dlpack_streams=True,
            native_collectives=frozenset({"allreduce"}) if nccl is not None and self._n >= 2 else frozenset(),
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
        major = int(str(self._cp.__version__).split(".")[0])
        npv = tuple(int(p) for p in np.__version__.split(".")[:3] if p.isdigit())
        return major >= 14 and npv >= (2, 1, 2)

    def _nccl(self) -> Any:
        try:
            from cupy.cuda import nccl
        except ImportError:
            return None
        return nccl if getattr(nccl, "available", False) else None

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def version(self) -> str:
        return str(self._cp.__version__)

    def tensor_types(self) -> tuple[type, ...]:
        return (self._cp.ndarray, CupyHostArray)

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return list(self._devices)

    def to_native_device(self, device: Device) -> Any:
        if device == _HOST:
            return _HOST  # no CuPy object for the host: the neutral value is the native one
        if device.kind == "gpu" and device.index < self._n:
            return self._cdev[device.index]
        raise InvalidDeviceError(f"cupy backend has no device {device}")

    def from_native_device(self, obj: Any) -> Device | None:
        if isinstance(obj, self._cp.cuda.Device):
            i = int(obj.id)
            return self._gpus[i] if 0 <= i < self._n else Device("gpu", i)
        if obj.__class__ is Device and obj == _HOST:
            return _HOST
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
    def _upload(self, a: np.ndarray, device: Device) -> Any:
        """A new GPU array on ``device`` holding host array ``a`` (synchronous). From
        ``staging.threshold`` bytes up, a C-contiguous pageable array goes through the staging
        pipeline (multidev.adapter.staged_upload: pinned chunks filled by several threads while
        the copy engine drains the previous one, on the device's current stream); smaller and
        strided ones CuPy's own way."""
        cp = self._cp
        with self._gpu(device):
            if (a.nbytes < self.staging.threshold or not a.flags.c_contiguous or a.ndim == 0
                    or a.dtype.kind not in "biufc"):  # (ml_dtypes' bfloat16 is kind V)
                # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
                return cp.array(a if a.flags.c_contiguous else a.copy(order="C"), copy=True)
            out = cp.empty(a.shape, dtype=a.dtype)
            dst = out.reshape(-1).view(np.uint8)
            stream = cp.cuda.get_current_stream()

            def alloc(n: int) -> tuple[Any, np.ndarray]:
                buf = self._cpx.empty_pinned((n,), dtype=np.uint8)
                return buf, buf

            def submit(buf: Any, n: int, off: int) -> Any:
                dst[off:off + n].set(buf[:n], stream=stream)  # from pinned memory: asynchronous
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(stream)
                return ev

            staged_upload(a, alloc, submit, lambda ev: ev.synchronize(), self.staging)
            stream.synchronize()  # CuPy's pinned pool reuses the buffers once dropped: every copy has landed
        return out

    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        dt = self.to_native_dtype(dtype)
        if device.kind == "cpu":
            out = aligned_empty(shape, dt)
            out.fill(value)
            return out.view(CupyHostArray)
        cp = self._cp
        with self._gpu(device):
            if dtype == "bfloat16":  # CuPy's bfloat16 support is minimal: fill in float32, cast
                return cp.full(shape, value, dtype=np.float32).astype(dt)
            if type(value) in (int, float, bool) and value == 0 and math.copysign(1.0, value) > 0:
                return cp.zeros(shape, dtype=dt)  # a memset, not a fill kernel (md.zeros was 5x cp.zeros)
            return cp.full(shape, value, dtype=dt)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        dt = self.to_native_dtype(dtype)
        if device.kind == "cpu":
            return aligned_empty(shape, dt).view(CupyHostArray)
        with self._gpu(device):
            return self._cp.empty(shape, dtype=dt)

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        dt = self.to_native_dtype(dtype)
        if device.kind == "cpu" or dtype in ("bfloat16", "float16", "complex64", "complex128"):
            # NumPy's values exactly (CuPy's arange kernels cover the real int and float types)
            ref = np.arange(start, stop, step, dtype=np.float64 if dtype == "bfloat16" else dt).astype(dt)
            return _host(ref) if device.kind == "cpu" else self._upload(ref, device)
        with self._gpu(device):
            return self._cp.arange(start, stop, step, dtype=dt)

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
            return _host(np.array(src, dtype=dt, copy=True))
        # The upload makes the new buffer: no host copy first (a cast copies only when one is asked
        # for). That copy made a 1 GiB upload 3.5x slower than cupy.asarray's on an H200 (411 ms).
        return self._upload(np.asarray(src, dtype=dt), device)

    def _on(self, y: Any, device: Device) -> Any:
        """GPU array ``y`` (a fresh buffer) on ``device``: itself when it is there."""
        return y if y.data.device_id == device.index else self.move(y, device)

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        dt = self.to_native_dtype(dtype)
        if device.kind == "cpu":
            return _host(np.random.default_rng(seed).random(shape).astype(dt))
        cp = self._cp
        with self._gpu(device):
            gen = cp.random.default_rng(seed)
            sample = np.float64 if dtype in ("float64", "complex128") else np.float32
            return gen.random(shape, dtype=sample).astype(dt)

    # -- placement --------------------------------------------------------------------------
    def device_of(self, x: Any) -> Device:
        if x.__class__ is self._ndarray or isinstance(x, self._ndarray):
            return self._gpus[x.data.device_id]
        return _HOST

    def move(self, x: Any, device: Device) -> Any:
        y, waiter = self.start_move(x, device)
        if waiter is not None and device.kind == "cpu":
            waiter()  # a host result is read by the host at once: it must have landed
        return y

    def _keep(self, event: Any, *objs: Any) -> None:
        """Hold ``objs`` until ``event`` completes (buffers of a copy in flight), dropping those done."""
        with self._lock:
            self._inflight = [(e, o) for e, o in self._inflight if not e.done]
            self._inflight.append((event, objs))

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        cp = self._cp
        dt = x.dtype
        if not self._is_gpu(x):  # host -> GPU, through a pinned snapshot
            if device.kind == "cpu":
                return self.copy(x, device), None
            a = np.asarray(x).view(np.ndarray)
            if a.size == 0:
                return self._upload(a, device), None
            pin = self._cpx.empty_pinned(a.shape, dtype=dt)
            np.copyto(pin, a)
            with self._gpu(device):
                y = cp.empty(a.shape, dtype=dt)
                y.set(pin)  # on the current stream: asynchronous from pinned memory
                done = cp.cuda.Event(disable_timing=True)
                done.record()
            self._keep(done, pin)
            return y, done.synchronize
        src = self.device_of(x)
        if device.kind == "cpu":  # GPU -> host, into a pinned buffer
            if x.size == 0:
                return aligned_empty(tuple(x.shape), dt).view(CupyHostArray), None
            with self._gpu(src):
                out = self._cpx.empty_pinned(tuple(x.shape), dtype=dt)
                x.get(stream=cp.cuda.get_current_stream(), out=out, blocking=False)
                done = cp.cuda.Event(disable_timing=True)
                done.record()
            self._keep(done, out, x)
            return out.view(CupyHostArray), done.synchronize
        # GPU -> GPU: the target's stream waits for the source's work, then CuPy's peer copy
        with self._gpu(src):
            contiguous = x.astype(x.dtype, order="C", copy=False)  # itself when already C-contiguous
            ready = cp.cuda.Event(disable_timing=True)
            ready.record()
        with self._gpu(device):
            cp.cuda.get_current_stream().wait_event(ready)
            y = contiguous.copy()
            done = cp.cuda.Event(disable_timing=True)
            done.record()
        self._keep(done, contiguous, x)
        return y, done.synchronize

    def copy(self, x: Any, device: Device) -> Any:
        if not self._is_gpu(x):
            if device.kind == "cpu":
                return _host(np.array(x.view(np.ndarray), copy=True))
            return self.move(x, device)
        if self.device_of(x) == device:
            with self._gpu(device):
                return x.copy()
        return self.move(x, device)

    def to_numpy(self, x: Any) -> np.ndarray:
        if not self._is_gpu(x):
            return np.asarray(x).view(np.ndarray)
        y, waiter = self.start_move(x, _HOST)
        if waiter is not None:
            waiter()
        return y.view(np.ndarray)

    def synchronize(self, device: Device | None) -> None:
        if device is None:
            ids = set(self._touched)
            try:
                ids.add(int(self._cp.cuda.runtime.getDevice()))
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
        return self._cdev[device.index].synchronize if device.kind == "gpu" else None

    def wait(self, x: Any) -> None:
        if not isinstance(x, np.ndarray):  # host arrays (NumPy's) are computed already
            x.device.synchronize()

    def tensor_wait_fn(self) -> Callable[[Any], Any]:
        """wait(x) in one frame: the array's device barrier, as ``x.device.synchronize()`` (CuPy has
        no per-array wait); host arrays (NumPy's) are computed already."""
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
        xp = self._cp if self._is_gpu(a) else np
        fn = {"sum": xp.add, "max": xp.maximum, "min": xp.minimum, "prod": xp.multiply}[op]
        if dtype == "bool":
            fn = xp.logical_or if op in ("sum", "max") else xp.logical_and
        with self._ctx(a):
            if dtype == "bfloat16" and xp is self._cp:  # through float32, rounded back once
                return fn(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
            out = fn(a, b)
        return out if xp is self._cp else _host(np.asarray(out))

    def divide(self, x: Any, n: int) -> Any:
        gpu = self._is_gpu(x)
        xp = self._cp if gpu else np
        dtype = self.dtype_of(x)
        with self._ctx(x):
            if is_floating(dtype):
                y = (x.astype(np.float32) / n).astype(x.dtype) if dtype == "bfloat16" and gpu else x / n
                y = y.astype(x.dtype, copy=False)
            else:
                q = xp.abs(x) // n  # truncating toward zero, in x's dtype
                y = xp.where(x < 0, -q, q).astype(x.dtype, copy=False)
        return y if gpu else _host(np.asarray(y))

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return x.reshape(shape)

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        xs = list(xs)
        self.same_device("concat", xs)
        if not self._is_gpu(xs[0]):
            return _host(np.concatenate([np.asarray(x).view(np.ndarray) for x in xs], axis=axis))
        with self._ctx(xs[0]):
            return self._cp.concatenate(xs, axis=axis)

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

    # -- interchange ------------------------------------------------------------------------
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

    # -- native fast paths ------------------------------------------------------------------
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        """NCCL allreduce (``cupy.cuda.nccl``) over one GPU array per device, out of place, on each
        device's current stream (asynchronous). Non-contiguous inputs are first copied; bool
        reduces as uint8 (or/and), int16/uint16 through 32 bits (exact modulo 2**16), complex sums
        as pairs of reals."""
        cp = self._cp
        xs = list(xs)
        if not all(self._is_gpu(x) for x in xs):
            where = ", ".join(str(self.device_of(x)) for x in xs)
            raise CapabilityError(f"cupy backend: the native allreduce (NCCL) takes GPU arrays on distinct GPUs; "
                                  f"got arrays on {where}. Use algorithm='naive' or 'auto'.")
        nccl = self._nccl()
        if nccl is None:
            raise CapabilityError("cupy backend: NCCL is not available to CuPy here; use algorithm='ring'")
        if op not in _NCCL_OPS:
            raise CapabilityError(f"cupy backend: native allreduce has no op {op!r}; use sum, max, min or prod")
        dtype = self.dtype_of(xs[0])
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
        work_dt = np.dtype(base) if base != "bfloat16" else self._bf16
        sends, recvs = [], []
        for x, i in zip(xs, ids):
            with self._gpu(self._gpus[i]):
                s = x.astype(x.dtype if cplx else work_dt, order="C", copy=False).reshape(-1)
                if cplx:
                    s = s.view(work_dt)  # (re, im) pairs
                sends.append(s)
                recvs.append(cp.empty_like(s))
        if sends[0].size:
            nccl.groupStart()
            try:
                for c, s, r, i in zip(comms, sends, recvs, ids):
                    with self._cdev[i]:
                        c.allReduce(s.data.ptr, r.data.ptr, s.size, _NCCL_DTYPES[base], code,
                                    cp.cuda.get_current_stream().ptr)
            finally:
                nccl.groupEnd()
        out = []
        for x, r, i in zip(xs, recvs, ids):
            with self._cdev[i]:
                if cplx:
                    y = r.view(x.dtype).reshape(x.shape)
                else:
                    y = r.reshape(x.shape).astype(x.dtype, copy=False)
            out.append(y)
        return out


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NULL = _NullContext()
