"""The core protocol for PyTorch: identity, devices, dtypes, creation, placement, synchronize and its
hooks, host copies, and the arithmetic the portable collectives are built from.

Moves and host copies of CUDA tensors go through the transfer machinery of :mod:`.transfers`
(pinned buffers; the blocking reads on the tensor's stream, the asynchronous ones on copy streams;
staged uploads).
"""
from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from multidev.adapter import (
    BaseBackend,
    Capabilities,
    CapabilityError,
    Device,
    DeviceMismatchError,
    InvalidDeviceError,
    StagingPlan,
    is_floating,
    numpy_dtype,
)

_HOST = Device("cpu", 0)


def _finished(x: Any) -> None:
    """The wait of a tensor whose operations finished before they returned (torch on a CPU)."""
    return None


_REAL = (int, bool, float)
_UNSIGNED_WIDE = ("uint16", "uint32", "uint64")
_TORCH_DTYPE_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                      "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
                      "complex128")


class TorchCore(BaseBackend):
    """The core protocol of the PyTorch backend; the state every concern uses is made here."""

    name: ClassVar[str] = "torch"
    framework: ClassVar[str] = "torch"

    @classmethod
    def install_hint(cls) -> str | None:
        """PyPI's Linux wheels of torch are CUDA builds of several GB: on a Linux machine without an
        NVIDIA driver, the CPU build first (PyTorch's CPU index), then the extra adds nothing."""
        import platform

        if platform.system() == "Linux" and not os.path.exists("/proc/driver/nvidia"):
            return ("No NVIDIA GPU here, so take PyTorch's CPU build first: `pip install torch --index-url "
                    "https://download.pytorch.org/whl/cpu` then `pip install \"multidev[torch]\"` (a plain "
                    "`pip install torch` on Linux downloads the multi-GB CUDA build).")
        return None

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self._devof: dict[Any, Device] = {}  # torch.device -> Device, so device_of allocates nothing
        self._plain: dict[type, bool] = {}  # tensor class -> whether it is no DTensor (one lookup per call)
        self._targets: dict[tuple[str, Device], tuple[Any, Any]] = {}  # (dtype, Device) -> torch's pair
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
        #: How large pageable uploads are staged (multidev.adapter.StagingPlan; see docs/transfers.md).
        self.staging = StagingPlan()
        dtypes = {n for n in self._to_torch if n not in _UNSIGNED_WIDE}
        dtypes |= {n for n in _UNSIGNED_WIDE if n in self._to_torch and self._unsigned_usable(n)}
        self._caps = Capabilities(
            mutable=True,
            async_execution=self._n_cuda > 0 or self._has_mps,
            pinned_memory=self._n_cuda > 0,
            dlpack_streams=self._n_cuda > 0,
            dtypes=frozenset(dtypes),
            raises_on_mixed_devices=True,
            # Apple's Metal has no 64-bit floats
            device_dtypes={Device("mps", 0): frozenset(dtypes) - {"float64", "complex128"}} if self._has_mps else {},
        )

    def _unsigned_usable(self, name: str) -> bool:
        """Whether this torch can do the arithmetic multidev needs on ``name`` (torch >= 2.3 has
        uint16/32/64 as storage-only "shell" dtypes: no add, maximum, minimum or arange on CPU)."""
        torch = self.torch
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
        torch = self.torch
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
        return (self.torch.Tensor,)

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return list(self._devices)

    def to_native_device(self, device: Device) -> Any:
        nd = self._native_devs.get(device)
        return nd if nd is not None else self._make_native_device(device)

    def from_native_device(self, obj: Any) -> Device | None:
        torch = self.torch
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

    def shape_of(self, x: Any) -> tuple[int, ...]:
        return tuple(x.shape)  # (torch.Size holds Python ints)

    def dtype_of(self, x: Any) -> str:
        name = self._from_torch.get(x.dtype)
        if name is None:
            raise CapabilityError(f"torch backend: tensor dtype {x.dtype} has no multidev name; "
                                  "convert it with x.to(torch.float32) (or another standard dtype)")
        return name

    def _target(self, dtype: str, device: Device) -> tuple[Any, Any]:
        """(torch dtype, torch device) for a creation or copy, refusing what the device cannot hold
        (the answers remembered per pair)."""
        hit = self._targets.get((dtype, device))
        if hit is not None:
            return hit
        hit = self._check_target(dtype, device)
        if len(self._targets) < 1024:
            self._targets[(dtype, device)] = hit
        return hit

    def _check_target(self, dtype: str, device: Device) -> tuple[Any, Any]:
        if device.kind == "mps" and dtype in ("float64", "complex128"):
            raise CapabilityError(f"torch backend: {device} (Metal) has no {dtype}; use "
                                  f"{'float32' if dtype == 'float64' else 'complex64'} there")
        return self.to_native_dtype(dtype), self.to_native_device(device)

    # -- creation ---------------------------------------------------------------------------
    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        dt, dev = self._targets.get((dtype, device)) or self._target(dtype, device)
        if value.__class__ in _REAL and (value == 1 or (value == 0 and math.copysign(1.0, value) > 0)):
            # torch's own zeros/ones: the same bits (a +0), without torch.full's fill path
            make = self.torch.ones if value == 1 else self.torch.zeros
            return make(*shape, dtype=dt, device=dev) if shape else make(shape, dtype=dt, device=dev)
        return self.torch.full(shape, value, dtype=dt, device=dev)

    def filler(self, value: Any, dtype: str, device: Device) -> Any:
        """torch's own zeros/ones/full with the dtype and device bound (what :meth:`full` calls); a
        subclass that overrides ``full`` gets the default filler, its ``full``."""
        if type(self).full is not TorchCore.full:
            return super().filler(value, dtype, device)
        dt, dev = self._target(dtype, device)
        torch = self.torch
        if value.__class__ in _REAL and (value == 1 or (value == 0 and math.copysign(1.0, value) > 0)):
            fn = functools.partial(torch.ones if value == 1 else torch.zeros, dtype=dt, device=dev)

            def make(shape: tuple[int, ...]) -> Any:
                # (the sizes as arguments: torch parses a tuple about 0.5 us slower than ints)
                return fn(*shape) if shape else fn(shape)
            return make
        return functools.partial(torch.full, fill_value=value, dtype=dt, device=dev)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        dt, dev = self._target(dtype, device)
        if shape:  # (the sizes as arguments: torch parses a tuple about 0.5 us slower than ints)
            return self.torch.empty(*shape, dtype=dt, device=dev)
        return self.torch.empty(shape, dtype=dt, device=dev)

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        dt, dev = self._target(dtype, device)
        torch = self.torch
        if step != 0 and (stop - start) / step <= 0:
            # torch.arange raises on an empty range whose bounds disagree with step's sign.
            return torch.empty((0,), dtype=dt, device=dev)
        try:
            return torch.arange(start, stop, step, dtype=dt, device=dev)
        except NotImplementedError:
            # torch has no arange kernel for bool/complex: build it with NumPy's semantics.
            return self.asarray(np.arange(start, stop, step, dtype=numpy_dtype(dtype)), dtype, device)

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        torch = self.torch
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
        if device.kind == "gpu" and src.device.type == "cpu" and src.dtype == dt and self.transfers.stageable(src):
            return self.transfers.upload(src.numpy(), dt, device)  # a large pageable upload: pipelined, pinned
        if src.device != dev and src.dtype == dt:
            return src.to(dev)  # another device: .to copies (the framework's own upload)
        return src.to(device=dev, dtype=dt, copy=True)

    def _from_numpy(self, arr: np.ndarray) -> Any:
        """A CPU tensor viewing ``arr`` (or a native-order, contiguous copy of it)."""
        torch = self.torch
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
        torch = self.torch
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
        if self._plain.get(x.__class__) is not True:
            self._sharded_device(x)
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

    def _sharded_device(self, x: Any) -> None:
        """DeviceMismatchError for a DTensor over several ranks (its pieces lie in several processes,
        as a JAX array over several devices has no one device); a class seen once is remembered."""
        cls = x.__class__
        mod = sys.modules.get("torch.distributed.tensor")
        plain = mod is None or not issubclass(cls, mod.DTensor)
        if plain:
            self._plain[cls] = True
            return
        size = x.device_mesh.size()
        if size > 1:
            raise DeviceMismatchError(
                f"torch backend: this DTensor lies across the {size} ranks of its DeviceMesh (this rank's piece is "
                f"on {x.device}), so it has no single device; multidev.layout_of(x) says where each piece is, "
                "multidev.to_host(x) or multidev.to(x, device) gathers it (on every rank), x.to_local() is this "
                "rank's piece")

    def move(self, x: Any, device: Device) -> Any:
        if x.device.type == "cuda" and device.kind == "cpu":
            # Pageable device-to-host copies are many times slower than pinned ones (docs/transfers.md):
            # go through a pinned buffer and wait for it, never reading it early (pytorch#86264).
            self._target(self.dtype_of(x), device)
            return self.transfers.download(x)
        self._target(self.dtype_of(x), device)
        if x.device.type == "cpu" and device.kind == "gpu" and self.transfers.stageable(x):
            return self.transfers.upload(x.detach().numpy(), x.dtype, device)
        return x.to(self.to_native_device(device))

    def copy(self, x: Any, device: Device) -> Any:
        self._target(self.dtype_of(x), device)
        return x.to(self.to_native_device(device), copy=True)

    def to_numpy(self, x: Any) -> np.ndarray:
        torch = self.torch
        t = x.detach() if x.requires_grad else x  # numpy() refuses a tensor that requires grad
        if not t.is_cpu:
            if t.is_cuda:
                t = self.transfers.download(t)  # through pinned memory, far faster than pageable
            else:
                t = t.cpu()  # blocking: waits for the work that produces x on its stream
        try:  # (a plain host tensor: its view, with none of the checks below)
            return t.numpy()
        except (RuntimeError, TypeError):  # a lazily conjugated or negated view, bfloat16: below
            pass
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
        torch = self.torch
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
        if self._redefines("synchronize", TorchCore):
            return super().device_wait_fn(device)
        torch = self.torch
        if device.kind == "gpu":
            return functools.partial(torch.cuda.synchronize, device.index)
        return torch.mps.synchronize if device.kind == "mps" else None

    def tensor_wait_fn(self) -> Callable[[Any], Any]:
        """wait(x) in one frame: torch's own barrier of x's device (``torch.cuda.synchronize(i)``,
        ``torch.mps.synchronize()``), nothing for a CPU tensor, whose operations finished before
        they returned; without a GPU, a function that returns at once."""
        if self._redefines("wait", TorchCore) or self._redefines("synchronize", TorchCore):
            return super().tensor_wait_fn()  # (the inherited wait calls synchronize)
        torch = self.torch
        if not self._n_cuda and not self._has_mps:
            return _finished
        cuda_sync, mps = torch.cuda.synchronize, self._has_mps

        def wait(x: Any) -> None:
            if x.is_cuda:
                cuda_sync(x.get_device())
            elif mps and x.is_mps:
                torch.mps.synchronize()
        return wait

    # -- arithmetic for collectives ---------------------------------------------------------
    def combine(self, op: str, a: Any, b: Any) -> Any:
        self.same_device(op, (a, b))
        torch = self.torch
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
        return self.torch.div(x, n, rounding_mode="trunc").to(x.dtype)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return x.reshape(shape)

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        xs = list(xs)
        self.same_device("concat", xs)
        return self.torch.cat(xs, dim=axis)

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        return list(self.torch.split(x, [int(s) for s in sizes], dim=axis))

    def writable(self, x: Any) -> bool | None:
        """True for a plain contiguous tensor (what ``assign``, under ``no_grad``, always writes);
        False for one whose elements share memory (a stride of 0 over more than one element: an
        expanded tensor, which torch refuses to write into); None (the core probes) for inference
        tensors, other layouts and other strided views."""
        if x.layout is not self.torch.strided or x.is_inference():
            return None
        if x.is_contiguous():
            return True
        return False if any(st == 0 and n > 1 for st, n in zip(x.stride(), x.shape)) else None

    def assign(self, dst: Any, src: Any) -> None:
        self.same_device("assign", (dst, src))
        with self.torch.no_grad():  # autograd refuses in-place writes into leaves (parameters)
            dst.copy_(src)
