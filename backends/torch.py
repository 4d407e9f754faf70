"""PyTorch backend: native ``torch.Tensor`` objects on ``cpu:0``, ``gpu:i`` (CUDA/ROCm) and ``mps:0``.

Mechanism. Devices map one to one: ``cpu:0`` is ``torch.device("cpu")``, ``gpu:i`` is
``torch.device("cuda", i)`` for every visible CUDA device, ``mps:0`` is Apple's Metal device where
torch has it. Creation passes ``device=``/``dtype=`` straight to torch, which places exactly.
CUDA work is queued on each device's current stream; ``start_move`` hands back a CUDA event to wait
on (pinned host buffers both ways). ``synchronize`` waits with
``torch.cuda.synchronize`` device by device (it only waits for one device per call), which also
raises any sticky asynchronous CUDA error. Torch refuses mixed-device arithmetic natively; this
adapter's own ops check devices first and raise :class:`~multidev.DeviceMismatchError` instead.
The native allreduce is ``torch.cuda.nccl.all_reduce`` (``torch.cuda.comm`` for sums where torch
has no NCCL) over one CUDA tensor per GPU.
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from multidev.adapter import (
    BaseBackend,
    Capabilities,
    CapabilityError,
    Device,
    InvalidDeviceError,
    NonBlockingMoves,
    StagingPlan,
    SupportsCompile,
    SupportsDLPack,
    SupportsNativeCollectives,
    SupportsTraining,
    is_floating,
    numpy_dtype,
    staged_upload,
)

_HOST = Device("cpu", 0)
_UNSIGNED_WIDE = ("uint16", "uint32", "uint64")
_TORCH_DTYPE_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                      "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
                      "complex128")
# ncclRedOp_t values (nccl.h: ncclSum=0, ncclProd=1, ncclMax=2, ncclMin=3); torch.cuda.nccl only
# exports SUM and passes the int straight through to NCCL.
_NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3}
# Element types torch.cuda.nccl converts (torch/csrc/cuda/nccl.cpp: to_nccl_data_type).
_NCCL_DTYPES = ("bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32",
                "float64")


class TorchBackend(BaseBackend, NonBlockingMoves, SupportsDLPack, SupportsNativeCollectives, SupportsTraining,
                   SupportsCompile):
    """The PyTorch backend (see module docstring)."""

    name: ClassVar[str] = "torch"
    framework: ClassVar[str] = "torch"

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._devof: dict[Any, Device] = {}  # torch.device -> Device, so device_of allocates nothing
        self._to_torch = {n: getattr(torch, n) for n in _TORCH_DTYPE_NAMES if hasattr(torch, n)}
        self._from_torch = {v: k for k, v in self._to_torch.items()}
        self._n_cuda = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
        mps = getattr(torch.backends, "mps", None)
        self._has_mps = bool(mps is not None and mps.is_available())
        devs = [_HOST] + [Device("gpu", i) for i in range(self._n_cuda)]
        if self._has_mps:
            devs.append(Device("mps", 0))
        self._devices = tuple(devs)
        self._native_devs = {d: self._make_native_device(d) for d in self._devices}
        self._copy_streams: dict[int, Any] = {}
        self._stream_lock = threading.Lock()
        #: How large pageable uploads are staged (multidev.adapter.StagingPlan; measured on an H200).
        self.staging = StagingPlan()
        self._plain_dtypes = {getattr(torch, n) for n in ("bool", "int8", "uint8", "int16", "int32", "int64",
                                                           "float16", "float32", "float64", "complex64",
                                                           "complex128")}
        dtypes = {n for n in self._to_torch if n not in _UNSIGNED_WIDE}
        dtypes |= {n for n in _UNSIGNED_WIDE if n in self._to_torch and self._unsigned_usable(n)}
        self._caps = Capabilities(
            mutable=True,
            async_execution=self._n_cuda > 0 or self._has_mps,
            pinned_memory=self._n_cuda > 0,
            dlpack=True,
            dlpack_streams=self._n_cuda > 0,
            native_collectives=frozenset({"allreduce"}) if self._n_cuda >= 2 else frozenset(),
            dtypes=frozenset(dtypes),
            raises_on_mixed_devices=True,
            # Apple's Metal has no 64-bit floats
            device_dtypes={Device("mps", 0): frozenset(dtypes) - {"float64", "complex128"}} if self._has_mps else {},
        )

    def _unsigned_usable(self, name: str) -> bool:
        """Whether this torch can do the arithmetic multidev needs on ``name`` (torch >= 2.3 has
        uint16/32/64 as storage-only "shell" dtypes: no add, maximum, minimum or arange on CPU)."""
        torch = self._torch
        dt = self._to_torch[name]
        try:
            a = torch.full((2,), 3, dtype=dt)
            b = torch.full((2,), 2, dtype=dt)
            ok = (torch.add(a, b), torch.mul(a, b), torch.maximum(a, b), torch.minimum(a, b),
                  torch.arange(0, 2, 1, dtype=dt))
            return int(ok[0][0]) == 5 and int(ok[2][0]) == 3 and int(ok[3][0]) == 2
        except (RuntimeError, NotImplementedError, TypeError):
            return False

    def _make_native_device(self, device: Device) -> Any:
        torch = self._torch
        if device.kind == "cpu":
            return torch.device("cpu")
        if device.kind == "gpu":
            return torch.device("cuda", device.index)
        return torch.device("mps", device.index)

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def tensor_types(self) -> tuple[type, ...]:
        return (self._torch.Tensor,)

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return list(self._devices)

    def to_native_device(self, device: Device) -> Any:
        nd = self._native_devs.get(device)
        return nd if nd is not None else self._make_native_device(device)

    def from_native_device(self, obj: Any) -> Device | None:
        torch = self._torch
        if not isinstance(obj, torch.device):
            return None
        if obj.type == "cpu":
            return Device("cpu", obj.index or 0)
        if obj.type == "cuda":  # ROCm builds use "cuda" too
            if obj.index is not None:
                return Device("gpu", obj.index)
            # torch.device("cuda") means the current device; without CUDA it would be device 0.
            return Device("gpu", torch.cuda.current_device() if torch.cuda.is_available() else 0)
        if obj.type == "mps":
            return Device("mps", obj.index or 0)
        return None

    # -- dtypes -----------------------------------------------------------------------------
    def to_native_dtype(self, dtype: str) -> Any:
        if dtype not in self._caps.dtypes:
            if dtype in _UNSIGNED_WIDE and dtype in self._to_torch:
                raise CapabilityError(
                    f"torch backend: torch {self.version()} stores {dtype} but has no add/max/min/"
                    "arange for it; use int32/int64 (or uint8) instead")
            raise CapabilityError(f"torch backend: torch {self.version()} has no dtype {dtype!r}; "
                                  f"supported: {', '.join(sorted(self._caps.dtypes))}")
        return self._to_torch[dtype]

    def dtype_of(self, x: Any) -> str:
        name = self._from_torch.get(x.dtype)
        if name is None:
            raise CapabilityError(f"torch backend: tensor dtype {x.dtype} has no multidev name; "
                                  "convert it with x.to(torch.float32) (or another standard dtype)")
        return name

    def _target(self, dtype: str, device: Device) -> tuple[Any, Any]:
        """(torch dtype, torch device) for a creation or copy, refusing what the device cannot hold."""
        if device.kind == "mps" and dtype in ("float64", "complex128"):
            raise CapabilityError(f"torch backend: {device} (Metal) has no {dtype}; use "
                                  f"{'float32' if dtype == 'float64' else 'complex64'} there")
        return self.to_native_dtype(dtype), self.to_native_device(device)

    # -- creation ---------------------------------------------------------------------------
    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        dt, dev = self._target(dtype, device)
        return self._torch.full(shape, value, dtype=dt, device=dev)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        dt, dev = self._target(dtype, device)
        return self._torch.empty(shape, dtype=dt, device=dev)

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        dt, dev = self._target(dtype, device)
        torch = self._torch
        if step != 0 and (stop - start) / step <= 0:
            # torch.arange raises on an empty range whose bounds disagree with step's sign.
            return torch.empty((0,), dtype=dt, device=dev)
        try:
            return torch.arange(start, stop, step, dtype=dt, device=dev)
        except NotImplementedError:
            # torch has no arange kernel for bool/complex: build it with NumPy's semantics.
            return self.asarray(np.arange(start, stop, step, dtype=numpy_dtype(dtype)), dtype, device)

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        torch = self._torch
        dt = None if dtype is None else self._target(dtype, device)[0]
        dev = self.to_native_device(device)
        if isinstance(obj, torch.Tensor):
            src = obj.detach()
        elif isinstance(obj, np.ndarray) or (hasattr(obj, "__array__")
                                             and not isinstance(obj, (list, tuple))):
            src = self._from_numpy(np.asarray(obj))  # NumPy arrays and other frameworks' tensors
        else:
            return torch.tensor(obj, dtype=dt, device=dev)  # torch's own inference for sequences
        if dt is None:
            dt = self._target(self.dtype_of(src), device)[0]
        if device.kind == "gpu" and src.device.type == "cpu" and src.dtype == dt and self._stageable(src):
            return self._upload(src.numpy(), dt, device)  # a large pageable upload: pipelined, pinned
        if src.device != dev and src.dtype == dt:
            return src.to(dev)  # another device: .to copies (the framework's own upload)
        return src.to(device=dev, dtype=dt, copy=True)

    def _from_numpy(self, arr: np.ndarray) -> Any:
        """A CPU tensor viewing ``arr`` (or a native-order, contiguous copy of it)."""
        torch = self._torch
        bf16 = arr.dtype.name == "bfloat16"
        if bf16:  # ml_dtypes.bfloat16: torch.from_numpy does not know it; carry the bits as int16
            arr = arr.view(np.int16)
        elif arr.dtype.byteorder not in ("=", "|"):
            arr = arr.astype(arr.dtype.newbyteorder("="))
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            # torch.from_numpy refuses negative strides and warns on read-only arrays.
            arr = np.array(arr, order="C", copy=True)
        if bf16:
            return torch.from_numpy(arr).view(torch.bfloat16)
        try:
            return torch.from_numpy(arr)
        except TypeError as e:
            raise CapabilityError(f"torch backend cannot hold NumPy dtype {arr.dtype}: {e}") from e

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        dt, dev = self._target(dtype, device)
        torch = self._torch
        gen = None
        if seed is not None:
            gen = torch.Generator(device=dev)
            gen.manual_seed(int(seed))
        # torch.rand only samples floating/complex dtypes; other dtypes get float32 samples cast.
        sample_dt = dt if is_floating(dtype) else torch.float32
        out = torch.rand(shape, generator=gen, dtype=sample_dt, device=dev)
        return out if sample_dt is dt else out.to(dt)

    # -- placement --------------------------------------------------------------------------
    def device_of(self, x: Any) -> Device:
        nd = x.device
        dev = self._devof.get(nd)
        if dev is not None:
            return dev
        dev = self.from_native_device(nd)
        if dev is not None and (nd.index is not None or nd.type == "cpu"):
            self._devof[nd] = dev
        if dev is None:
            raise InvalidDeviceError(
                f"torch backend: tensor is on {x.device}, a device multidev does not model "
                "(cpu, cuda, mps); move it with x.to('cpu') first")
        return dev

    def move(self, x: Any, device: Device) -> Any:
        if x.device.type == "cuda" and device.kind == "cpu":
            # Pageable device-to-host copies crawl (1.6 GB/s against 54 GB/s pinned at 64 MiB on an
            # H200): go through a pinned buffer and wait for it, never reading it early (pytorch#86264).
            y, waiter = self.start_move(x, device)
            if waiter is not None:
                waiter()
            return y
        self._target(self.dtype_of(x), device)
        if x.device.type == "cpu" and device.kind == "gpu" and self._stageable(x):
            return self._upload(x.detach().numpy(), x.dtype, device)
        return x.to(self.to_native_device(device))

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        """Device to host: on a copy stream of the source GPU, into a pinned buffer (torch's caching
        host allocator), starting once the work queued so far on x's stream is done, so later work
        overlaps with the copy. Host to device: pinned (large pageable sources through the staging
        pipeline), then an asynchronous copy ordered before later work on the target's stream."""
        torch = self._torch
        src = x.device
        if src.type != "cuda" and device.kind != "gpu":
            # No CUDA involved: the copy is synchronous (MPS work is drained by the waiter).
            y = self.move(x, device)
            return y, (torch.mps.synchronize if "mps" in (src.type, device.kind) else None)
        self._target(self.dtype_of(x), device)
        dev = self.to_native_device(device)
        if device.kind == "cpu":
            return self._start_download(x)
        if src.type == "cpu":
            if self._stageable(x):
                y = self._upload(x.detach().numpy(), x.dtype, device)
            else:
                if not x.requires_grad and not x.is_pinned():
                    x = x.pin_memory()  # a pinned snapshot makes the host-to-device copy asynchronous
                y = x.to(dev, non_blocking=True)
        else:
            y = x.to(dev, non_blocking=True)  # GPU to GPU joins the target's current stream
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(dev))
        return y, done.synchronize

    def _copy_stream(self, dev: Any) -> Any:
        """The dedicated copy stream of a GPU (made once)."""
        s = self._copy_streams.get(dev.index)
        if s is None:
            with self._stream_lock:
                s = self._copy_streams.get(dev.index)
                if s is None:
                    s = self._copy_streams[dev.index] = self._torch.cuda.Stream(dev)
        return s

    def _start_download(self, x: Any) -> tuple[Any, Callable[[], None]]:
        torch = self._torch
        dev = x.device
        producer = torch.cuda.current_stream(dev)
        cs = self._copy_stream(dev)
        ready = torch.cuda.Event()
        ready.record(producer)  # x is complete once the work queued on its stream so far is
        t = x.detach()
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        cs.wait_event(ready)
        with torch.cuda.stream(cs):
            host.copy_(t, non_blocking=True)
        t.record_stream(cs)  # the allocator keeps x's memory until the copy has read it
        done = torch.cuda.Event()
        done.record(cs)

        def waiter() -> None:
            done.synchronize()
            keep.clear()  # x may go now

        keep = [t]  # the handle holds the source until the copy has landed
        return host, waiter

    def _stageable(self, x: Any) -> bool:
        # The size first: is_pinned() asks the CUDA driver about the pointer.
        return (self._n_cuda > 0 and x.numel() * x.element_size() >= self.staging.threshold
                and not x.requires_grad and x.is_contiguous() and x.dtype in self._plain_dtypes
                and not x.is_conj() and not x.is_neg() and not x.is_pinned())

    def _upload(self, arr: np.ndarray, dt: Any, device: Device) -> Any:
        """A new tensor on ``device`` holding pageable ``arr`` (C-contiguous), uploaded through the
        staging pipeline (multidev.adapter.staged_upload) on the GPU's copy stream; ordered before
        later work on the device's current stream."""
        torch = self._torch
        dev = self.to_native_device(device)
        out = torch.empty(arr.shape, dtype=dt, device=dev)
        cs = self._copy_stream(dev)
        cur = torch.cuda.current_stream(dev)
        cs.wait_stream(cur)  # out's memory is free for writing once the device's queued work allows
        dst = out.view(-1).view(torch.uint8) if out.numel() else out

        def alloc(n: int) -> tuple[Any, np.ndarray]:
            buf = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            return buf, buf.numpy()

        def submit(buf: Any, n: int, off: int) -> Any:
            with torch.cuda.stream(cs):
                dst[off:off + n].copy_(buf[:n], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(cs)
            return ev

        staged_upload(np.ascontiguousarray(arr), alloc, submit, lambda ev: ev.synchronize(), self.staging)
        cur.wait_stream(cs)  # later work on the device sees the whole upload
        out.record_stream(cs)  # and out's memory outlives the copies into it
        return out

    def copy(self, x: Any, device: Device) -> Any:
        self._target(self.dtype_of(x), device)
        return x.to(self.to_native_device(device), copy=True)

    def to_numpy(self, x: Any) -> np.ndarray:
        torch = self._torch
        t = x.detach()
        if t.device.type == "cuda":
            host, waiter = self._start_download(t)  # pinned memory: 54 vs 1.6 GB/s pageable (H200)
            waiter()
            t = host
        elif t.device.type != "cpu":
            t = t.cpu()  # blocking: waits for the work that produces x on its stream
        t = t.resolve_conj().resolve_neg()  # numpy() refuses lazily conjugated/negated views
        if t.dtype == torch.bfloat16:
            try:
                import ml_dtypes
            except ImportError:
                raise CapabilityError(
                    "torch backend: NumPy has no bfloat16; install 'ml_dtypes' for it, or convert "
                    "first with x.to(torch.float32)") from None
            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return t.numpy()

    def synchronize(self, device: Device | None) -> None:
        torch = self._torch
        if device is None:
            if self._n_cuda and torch.cuda.is_initialized():  # no CUDA work exists before init
                has_ctx = (None if torch.version.hip  # HIP contexts differ: sync every device
                           else getattr(torch._C, "_cuda_hasPrimaryContext", None))
                for i in range(self._n_cuda):
                    # Skip devices never used: syncing them would only create a CUDA context.
                    if has_ctx is None or has_ctx(i):
                        torch.cuda.synchronize(i)
            if self._has_mps:
                torch.mps.synchronize()
        elif device.kind == "gpu":
            torch.cuda.synchronize(device.index)
        elif device.kind == "mps":
            torch.mps.synchronize()
        # cpu: torch runs CPU operations to completion before returning.

    def device_wait_fn(self, device: Device) -> Callable[[], Any] | None:
        """synchronize(device) with no adapter frame: torch's own barrier bound to the device (None
        on the CPU, where torch's operations finish before they return)."""
        torch = self._torch
        if device.kind == "gpu":
            return functools.partial(torch.cuda.synchronize, device.index)
        return torch.mps.synchronize if device.kind == "mps" else None

    # -- arithmetic for collectives ---------------------------------------------------------
    def combine(self, op: str, a: Any, b: Any) -> Any:
        self.same_device(op, (a, b))
        torch = self._torch
        if op in ("max", "min") and (a.is_complex() or b.is_complex()):
            raise CapabilityError(f"torch backend: {op} is not defined for complex tensors in torch")
        fn = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum, "prod": torch.mul}[op]
        try:
            return fn(a, b)
        except NotImplementedError as e:  # torch lacks the kernel for this dtype (e.g. uint16 add)
            raise CapabilityError(f"torch backend: {op} on {a.dtype} is not implemented by torch "
                                  f"{self.version()}: {e}") from e

    def divide(self, x: Any, n: int) -> Any:
        if x.is_floating_point() or x.is_complex():
            return x / n  # a Python scalar divisor keeps float16/bfloat16/complex64
        return self._torch.div(x, n, rounding_mode="trunc").to(x.dtype)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return x.reshape(shape)

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        xs = list(xs)
        self.same_device("concat", xs)
        return self._torch.cat(xs, dim=axis)

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        return list(self._torch.split(x, [int(s) for s in sizes], dim=axis))

    def assign(self, dst: Any, src: Any) -> None:
        self.same_device("assign", (dst, src))
        with self._torch.no_grad():  # autograd refuses in-place writes into leaves (parameters)
            dst.copy_(src)

    # -- interchange ------------------------------------------------------------------------
    def export_dlpack(self, x: Any) -> Any:
        t = x.detach()  # __dlpack__ refuses tensors that require grad
        if t.layout != self._torch.strided:
            raise CapabilityError(f"torch backend: DLPack takes dense tensors only, not {t.layout}; "
                                  "convert with x.to_dense()")
        if t.is_conj() or t.is_neg():
            raise CapabilityError("torch backend: a lazily conjugated/negated view cannot be exported "
                                  "without a copy; call x.resolve_conj().resolve_neg() first")
        return t  # torch.Tensor has __dlpack__/__dlpack_device__, strided layouts included

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        try:
            y = self._torch.from_dlpack(obj)
        except (RuntimeError, TypeError, BufferError, ValueError, AttributeError) as e:
            raise CapabilityError(
                f"torch backend cannot import {type(obj).__name__} through DLPack: {e}") from e
        if self.device_of(y) != device:
            raise CapabilityError(f"torch backend: a DLPack buffer of {device} arrived on "
                                  f"{self.device_of(y)}; torch has no {device} to share it on")
        return y

    # -- native fast paths ------------------------------------------------------------------
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        """NCCL allreduce over one CUDA tensor per GPU (``torch.cuda.comm`` for sums without NCCL).

        Out of place, on each device's current stream (asynchronous): contiguous inputs are reduced
        by NCCL straight into new outputs; other layouts (strided, conj/neg views, int16, complex)
        are first copied into private buffers that NCCL reduces in place. bool reduces as or/and (sum/prod),
        int16 through int32 (exact modulo 2**16), complex sums as pairs of reals.
        """
        torch = self._torch
        xs = list(xs)
        if any(x.device.type != "cuda" for x in xs):
            where = ", ".join(str(x.device) for x in xs)
            raise CapabilityError(
                f"torch backend: the native allreduce (NCCL) takes CUDA tensors on distinct GPUs; "
                f"got tensors on {where}. Use algorithm='naive' or 'auto'.")
        idx = [x.device.index for x in xs]
        if op not in _NCCL_OPS:
            raise CapabilityError(f"torch backend: native allreduce has no op {op!r}; use sum, max, min or prod")
        dtype = self.dtype_of(xs[0])
        base = op
        complex_ = dtype.startswith("complex")
        if complex_ and base != "sum":
            raise CapabilityError(f"torch backend: {base} is not defined for complex tensors")
        if not complex_ and dtype not in _NCCL_DTYPES and dtype != "int16":
            raise CapabilityError(f"torch backend: NCCL cannot reduce {dtype}; use algorithm='naive'")
        work_dt = torch.int32 if dtype == "int16" else xs[0].dtype  # NCCL has no int16
        code = _NCCL_OPS[base]
        if dtype == "bool":
            # NCCL reduces bool as uint8: a sum could store 2 in a bool; or/and are max/min.
            code = _NCCL_OPS["max"] if base in ("sum", "max") else _NCCL_OPS["min"]
        # Plain contiguous inputs go to NCCL out of place (no staging copy: as fast as in place).
        direct = (not complex_ and dtype != "int16" and len(xs) > 1
                  and all(x.is_contiguous() and not x.is_conj() and not x.is_neg() for x in xs))
        with torch.no_grad():
            bufs = []
            for x in xs:
                b = torch.empty(tuple(x.shape), dtype=work_dt, device=x.device)
                if not direct:
                    b.copy_(x.detach())  # materializes conj/neg views and strides; inputs never written
                bufs.append(b)
            if len(bufs) > 1 and bufs[0].numel() > 0:
                views = [torch.view_as_real(b) for b in bufs] if complex_ else bufs
                srcs = [x.detach() for x in xs] if direct else views
                if hasattr(torch._C, "_nccl_all_reduce") and torch.cuda.nccl.is_available(srcs):
                    try:
                        torch.cuda.nccl.all_reduce(srcs, views, op=code)
                    except RuntimeError as e:
                        if "Unconvertible NCCL type" in str(e):  # e.g. bfloat16 with an old NCCL
                            raise CapabilityError(f"torch backend: this NCCL cannot reduce {dtype}; "
                                                  "use algorithm='naive'") from e
                        raise
                elif base == "sum":
                    # No NCCL in this build: torch.cuda.comm sums onto one GPU and broadcasts back.
                    total = torch.cuda.comm.reduce_add([x.detach() for x in xs] if direct else bufs,
                                                       destination=idx[0])
                    bufs = list(torch.cuda.comm.broadcast(total, idx))
                else:
                    raise CapabilityError(f"torch backend: {base} allreduce needs NCCL, which this "
                                          "torch build lacks; use algorithm='naive'")
            if dtype == "int16":
                bufs = [b.to(torch.int16) for b in bufs]
        return bufs

    # -- optional extensions: training and compilation --------------------------------------
    def parameter_like(self, src: Any, y: Any) -> Any:
        # A copy of a tensor that requires grad is a non-leaf whose .grad stays None: cut it loose.
        return y.detach().requires_grad_(True) if src.requires_grad else y

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        torch = self._torch
        ps = [p.detach().requires_grad_(True) for p in params]  # private leaves: params' .grad untouched
        with torch.enable_grad():
            out = fn(ps, *args)
            total = out if out.ndim == 0 else out.sum()
            gs = torch.autograd.grad(total, ps, allow_unused=True)
        return total.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(ps, gs)]

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        with self._torch.no_grad():  # in place: leaves stay leaves
            for p, g in zip(params, grads):
                p.sub_(g, alpha=lr)
        return list(params)

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        # Measured for D2L 12.1 (batch 1; H200 and 2-core CPU): script < trace < eager < torch.compile,
        # whose compilation also takes seconds (20 s on the CPU): auto measures the first three.
        return {"torch.jit.script": True, "torch.jit.trace": True, "eager": True, "torch.compile": False,
                "torch.compile:reduce-overhead": False, "torch.compile:max-autotune": False}

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        import warnings

        torch = self._torch
        if route == "eager":
            return fn
        if route.startswith("torch.compile"):
            mode = route.partition(":")[2] or None
            return torch.compile(fn, mode=mode)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")  # torch >= 2.10 deprecates torch.jit: our choice, not the user's
            try:
                out = torch.jit.script(fn) if route == "torch.jit.script" else torch.jit.trace(fn, args)
            except Exception as e:  # any compiler error means "cannot compile this way"
                raise CapabilityError(f"torch backend: {route} cannot compile this function: "
                                      f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}") from e
        if any(issubclass(w.category, torch.jit.TracerWarning) for w in seen):
            raise CapabilityError("torch backend: torch.jit.trace would freeze data-dependent Python control "
                                  "flow of this function (TracerWarning); use torch.jit.script or eager")
        return out
