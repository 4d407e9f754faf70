"""The core protocol over an array-API namespace: identity, devices, dtypes, creation, placement,
synchronize, host copies, and the arithmetic the portable collectives are built from, all probed
or called through the library's namespace (``__array_namespace_info__`` and the standard's
functions)."""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from multidev.adapter import (
    DTYPES,
    HOST_ALIGNMENT,
    BackendNotAvailableError,
    BaseBackend,
    Capabilities,
    CapabilityError,
    Device,
    InvalidDeviceError,
    canonical_dtype,
    dlpack_info,
    host_aligned,
    is_floating,
    numpy_dtype,
)

#: The library plain ``array_api`` selects: the standard's reference implementation.
DEFAULT_LIBRARY = "array_api_strict"


class ArrayApiCore(BaseBackend):
    """The core protocol of the array-API adapter; the state every concern uses is made here."""

    name: ClassVar[str] = "array_api:" + DEFAULT_LIBRARY
    framework: ClassVar[str] = DEFAULT_LIBRARY
    #: The namespace module this class serves (``importlib.import_module`` name).
    library: ClassVar[str] = DEFAULT_LIBRARY

    def __init__(self) -> None:
        xp = importlib.import_module(self.library)
        info_fn = getattr(xp, "__array_namespace_info__", None)
        if not callable(info_fn):
            raise BackendNotAvailableError(
                f"{self.name}: {self.library} is not an array-API namespace (it has no __array_namespace_info__; "
                "for CuPy, PyTorch or Dask use their own adapter or array_api_compat's namespace)")
        self.xp = xp
        self._info = info = info_fn()
        native = [d for d in info.devices() if d is not None]
        try:
            default = info.default_device()
        except Exception:  # noqa: BLE001 - JAX returns None; others may not implement it
            default = None
        if default in native:
            native.remove(default)
            native.insert(0, default)
        self._to_native: dict[Device, Any] = {}
        self._from_native: dict[Any, Device] = {}
        counts: dict[str, int] = {}
        pending: list[tuple[Device, Any]] = []
        for nd in native:
            try:
                probe = xp.empty((0,), device=nd)
                kind_pair = probe.__dlpack_device__()
                kind = Device.from_dlpack((int(kind_pair[0]), 0)).kind
            except Exception:  # noqa: BLE001 - a device we cannot make arrays on is not ours
                continue
            if kind == "cpu":
                dev = Device("cpu", counts.get("cpu", 0))
                counts["cpu"] = dev.index + 1
            else:
                dev = Device(kind, int(kind_pair[1]))
            if dev not in self._to_native:
                pending.append((dev, nd))
                self._to_native[dev] = nd
        if Device("cpu", 0) not in self._to_native:
            raise BackendNotAvailableError(f"{self.name}: {self.library} has no host device; multidev needs cpu:0")
        pending.sort(key=lambda p: (p[0].kind != "cpu", p[0].kind, p[0].index))
        self._devices = tuple(d for d, _ in pending)
        for d, nd in pending:
            try:
                self._from_native[nd] = d
            except TypeError:  # unhashable device objects: looked up by equality instead
                pass
        self._native_list = [(nd, d) for d, nd in pending]
        self._host = Device("cpu", 0)
        # dtypes, per device
        self._dt: dict[str, Any] = {}
        per_device: dict[Device, frozenset[str]] = {}
        for d, nd in pending:
            try:
                got = info.dtypes(device=nd)
            except TypeError:
                got = info.dtypes()
            names = frozenset(n for n in got if n in DTYPES)
            for n in names:
                self._dt.setdefault(n, got[n])
            per_device[d] = names
        every = frozenset().union(*per_device.values())
        self._from_dt: dict[Any, str] = {}
        for n, t in self._dt.items():
            try:
                self._from_dt[t] = n
            except TypeError:
                pass
        # behaviour probes, on the default device
        host = self._to_native[self._host]
        a = xp.full((2,), 1, dtype=self._dt.get("float32"), device=host)
        try:
            a[...] = xp.full((2,), 2, dtype=self._dt.get("float32"), device=host)
            mutable = True
        except Exception:  # noqa: BLE001 - immutable arrays (JAX) raise TypeError
            mutable = False
        mixed_raises = True
        if len(pending) > 1:
            b = xp.full((2,), 1, dtype=self._dt.get("float32"), device=pending[1][1])
            try:
                a + b
                mixed_raises = False
            except Exception:  # noqa: BLE001 - the library refuses mixed devices (array-api-strict)
                mixed_raises = True
        self._async = callable(getattr(a, "block_until_ready", None))
        self._array_type = type(a)
        self._caps = Capabilities(
            mutable=mutable, async_execution=self._async, pinned_memory=False,
            dtypes=every, raises_on_mixed_devices=mixed_raises,
            device_dtypes={d: ds for d, ds in per_device.items() if ds != every})

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def version(self) -> str:
        top = importlib.import_module(self.framework)
        return str(getattr(self.xp, "__version__", None) or getattr(top, "__version__", "unknown"))

    def tensor_types(self) -> tuple[type, ...]:
        return (self._array_type,)

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return list(self._devices)

    def to_native_device(self, device: Device) -> Any:
        try:
            return self._to_native[device]
        except KeyError:
            raise InvalidDeviceError(f"{self.name} has no device {device}") from None

    def from_native_device(self, obj: Any) -> Device | None:
        try:
            got = self._from_native.get(obj)
        except TypeError:
            got = None
        if got is not None:
            return got
        for nd, d in self._native_list:
            if type(obj) is type(nd) and obj == nd:
                return d
        return None

    # -- dtypes -----------------------------------------------------------------------------
    def to_native_dtype(self, dtype: str) -> Any:
        t = self._dt.get(dtype)
        if t is None:
            raise CapabilityError(f"{self.name}: {self.library} has no dtype {dtype!r}; supported: "
                                  f"{', '.join(sorted(self._caps.dtypes))}")
        return t

    def dtype_of(self, x: Any) -> str:
        try:
            name = self._from_dt.get(x.dtype)
        except TypeError:
            name = None
        return name if name is not None else canonical_dtype(x.dtype)

    def _place(self, dtype: str, device: Device) -> tuple[Any, Any]:
        if dtype not in self._caps.dtypes_on(device):
            raise CapabilityError(f"{self.name}: {device} cannot hold {dtype}; it holds "
                                  f"{', '.join(sorted(self._caps.dtypes_on(device)))}")
        return self.to_native_dtype(dtype), self.to_native_device(device)

    def _host_aligned(self, y: Any, device: Device) -> Any:
        """``y`` itself when it is not a host array or its buffer is 64-byte aligned, else an
        aligned copy (same device, dtype and values)."""
        if device.kind != "cpu" or self.dlpack is None:
            return y
        try:
            info = dlpack_info(y.__dlpack__())
        except Exception:  # noqa: BLE001 - a producer that cannot say: left as it is
            return y
        if info.aligned(HOST_ALIGNMENT) or not info.shape or 0 in info.shape:
            return y
        buf = host_aligned(np.from_dlpack(y))
        nd = self.to_native_device(device)
        try:
            # asarray(copy=False) wraps the buffer writable (NumPy 1.x marks DLPack imports read-only)
            return self.xp.asarray(buf, device=nd, copy=False)
        except Exception:  # noqa: BLE001 - a library that cannot wrap it: DLPack, else its own buffer
            try:
                return self.xp.from_dlpack(buf, device=nd)
            except Exception:  # noqa: BLE001
                return y

    # -- creation ---------------------------------------------------------------------------
    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        dt, nd = self._place(dtype, device)
        return self._host_aligned(self.xp.full(shape, value, dtype=dt, device=nd), device)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        dt, nd = self._place(dtype, device)
        return self._host_aligned(self.xp.empty(shape, dtype=dt, device=nd), device)

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        dt, nd = self._place(dtype, device)
        if (stop - start) / step <= 0:
            return self.xp.empty((0,), dtype=dt, device=nd)
        return self._host_aligned(self.xp.arange(start, stop, step, dtype=dt, device=nd), device)

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        nd = self.to_native_device(device)
        if dtype is None and not isinstance(obj, (np.ndarray, self._array_type)):
            # nested sequences and scalars: the library's own inference (int32 where int64 is missing)
            return self._host_aligned(self.xp.asarray(obj, device=nd, copy=True), device)
        if isinstance(obj, self._array_type):
            src = obj
        else:
            src = np.array(obj, copy=True)
            if dtype is not None:
                src = src.astype(numpy_dtype(dtype), copy=False)
        dt = self._place(dtype if dtype is not None else self.dtype_of(src), device)[0]
        return self._host_aligned(self.xp.asarray(src, dtype=dt, device=nd, copy=True), device)

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        """NumPy's generator (the standard has none), cast to ``dtype`` and placed on ``device``."""
        self._place(dtype, device)
        vals = np.random.default_rng(seed).random(shape)
        return self.asarray(vals.astype(numpy_dtype(dtype)), dtype, device)

    # -- placement --------------------------------------------------------------------------
    def device_of(self, x: Any) -> Device:
        nd = x.device
        try:
            got = self._from_native.get(nd)
        except TypeError:
            got = None
        if got is None:
            got = self.from_native_device(nd)
            if got is None:
                raise InvalidDeviceError(f"{self.name}: array is on {nd!r}, a device this adapter does not list")
        return got

    def move(self, x: Any, device: Device) -> Any:
        self._place(self.dtype_of(x), device)
        y = self.xp.asarray(x, device=self.to_native_device(device), copy=True)
        return self._host_aligned(y, device)

    def copy(self, x: Any, device: Device) -> Any:
        return self.move(x, device)

    def to_numpy(self, x: Any) -> np.ndarray:
        self.wait(x)
        try:
            if self.device_of(x).kind == "cpu":
                return np.from_dlpack(x)  # a view of the host buffer
            return np.from_dlpack(x, device="cpu", copy=True)
        except (TypeError, BufferError, ValueError, RuntimeError):
            # NumPy 1.x refuses read-only buffers and the device keyword: a copy through the default device
            return np.asarray(self.xp.asarray(x, device=self._to_native[self._host], copy=True))

    def synchronize(self, device: Device | None) -> None:
        return None  # the standard has no queue to wait for; JAX arrays are waited for one by one

    def wait(self, x: Any) -> None:
        if self._async:
            x.block_until_ready()

    # -- arithmetic for collectives ---------------------------------------------------------
    def _arr(self, y: Any) -> Any:
        """``y`` as an array (NumPy's namespace turns 0-d results into scalars)."""
        return y if isinstance(y, self._array_type) else self.xp.asarray(y)

    def combine(self, op: str, a: Any, b: Any) -> Any:
        self.same_device(op, (a, b))
        xp = self.xp
        if self.dtype_of(a) == "bool":
            fn = xp.logical_or if op in ("sum", "max") else xp.logical_and
        elif op in ("max", "min") and self.dtype_of(a).startswith("complex"):
            raise CapabilityError(f"{self.name}: {op} is not defined for complex arrays")
        else:
            fn = {"sum": xp.add, "max": xp.maximum, "min": xp.minimum, "prod": xp.multiply}[op]
        return self._arr(fn(a, b))

    def divide(self, x: Any, n: int) -> Any:
        if is_floating(self.dtype_of(x)):
            return self._arr(x / n)
        xp = self.xp
        q = xp.abs(x) // n  # integer division truncating toward zero, in x's dtype
        return self._arr(xp.where(x < 0, -q, q))

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self.xp.reshape(x, shape)

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        xs = list(xs)
        self.same_device("concat", xs)
        return self.xp.concat(xs, axis=axis)

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        out, at = [], 0
        lead = (slice(None),) * (axis % x.ndim)  # a negative axis counts from the end
        for s in sizes:
            out.append(x[(*lead, slice(at, at + int(s)), ...)])
            at += int(s)
        return out

    def assign(self, dst: Any, src: Any) -> None:
        if not self._caps.mutable:
            raise CapabilityError(f"{self.name}: {self.library} arrays are immutable; rebind the result instead")
        self.same_device("assign", (dst, src))
        try:
            dst[...] = src
        except (ValueError, TypeError) as e:
            raise CapabilityError(f"{self.name}: cannot write into this array: {e}") from e
