"""NumPy reference backend: plain NumPy arrays on virtual CPU devices.

Mechanism. NumPy has one memory space, so devices are virtual. An array placed on ``cpu:0`` (the host, the default
device) is a plain ``numpy.ndarray``: native in, native out. An array placed on another virtual device is a
``VirtualDeviceArray``: a ``numpy.ndarray`` subclass whose only addition is a device tag (``_md_device``). It is a
real ndarray (every NumPy function takes it, no copy is made to tag it), and the tag travels with views
(``__array_finalize__``) and with results of ufuncs and NumPy functions
(``__array_ufunc__``/``__array_function__``). Those hooks refuse operands from two devices with DeviceMismatchError,
as a GPU framework would, so code tested here keeps its device discipline elsewhere. An untagged ndarray (or NumPy
scalar) is on ``cpu:0``; 0-d untagged arrays mix with any device, like torch's CPU scalars.

The number of virtual devices is ``$MULTIDEV_NUMPY_DEVICES`` (default 2), or ``set_device_count(n)`` at run time.
Execution is synchronous; ``synchronize`` returns at once.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from collections.abc import Callable, Sequence
from math import prod
from typing import Any, ClassVar

import numpy as np

from multidev.adapter import (
    DTYPES,
    HOST_ALIGNMENT,
    BaseBackend,
    Capabilities,
    CapabilityError,
    Concern,
    Device,
    InvalidDeviceError,
    SupportsCompile,
    SupportsDLPack,
    aligned_empty,
    canonical_dtype,
    concern,
    host_aligned,
    host_threads,
    numpy_dtype,
    run_parts,
    same_device,
)

_HOST = Device("cpu", 0)
_count_lock = threading.Lock()
_DEVICE_LISTS: dict[int, tuple[Device, ...]] = {}  # device count -> its devices (devices())
_DTYPE_NAMES: dict[Any, str] = {}  # NumPy dtype -> canonical name (dtype_of)
_NATIVE_DTYPES: dict[str, Any] = {}  # canonical name -> NumPy dtype, once to_native_dtype allowed it
_BLOCK_BYTES = 1 << 18  # the smallest block shared_memory_allreduce reduces at a time
_REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}  # combine's ufuncs
_address = ctypes.addressof
_first_byte = ctypes.c_char.from_buffer  # (an array's address without building __array_interface__)


def _block(e: Any, lo: int, hi: int, flat: list[Any], outs: list[Any], fn: Any, direct: bool) -> tuple[Any, int]:
    """Elements ``lo:hi`` of shared_memory_allreduce's expression ``e`` and its leftmost input's index (a module
    function: a recursive closure is a reference cycle, which kept the call's results until a garbage collection)."""
    if isinstance(e, int):
        return flat[e][lo:hi], e
    a, i = _block(e[0], lo, hi, flat, outs, fn, direct)
    return fn(a, _block(e[1], lo, hi, flat, outs, fn, direct)[0], out=outs[i][lo:hi] if direct else None), i


def _aligned(shape: tuple[int, ...], dt: Any) -> np.ndarray:
    """A new, uninitialised C-contiguous array of ``shape`` and ``dt`` whose buffer is
    HOST_ALIGNMENT-aligned: aligned_empty's (recycled from 256 KiB), in fewer steps below that."""
    dt = np.dtype(dt)
    nbytes = prod(shape) * dt.itemsize
    if nbytes >= 1 << 18:  # multidev.hostpool.MIN_BYTES: a buffer nothing refers to any more, if one is free
        return aligned_empty(shape, dt)
    raw = np.empty(nbytes + HOST_ALIGNMENT, np.uint8)
    out = raw[(off := -_address(_first_byte(raw)) % HOST_ALIGNMENT):off + nbytes].view(dt)  # type: ignore[arg-type]
    return out if len(shape) == 1 else out.reshape(shape)


def _copied(src: np.ndarray, dt: Any = None) -> np.ndarray:
    """An aligned copy of ``src`` (cast to ``dt`` as ``np.array(src, dtype=dt)`` casts): one copy."""
    out = _aligned(src.shape, src.dtype if dt is None else dt)
    np.copyto(out, src, casting="unsafe")
    return out


def _finished(x: Any) -> None:
    """The wait of a NumPy array: its operations finished before they returned (returns None)."""
_ENV = "MULTIDEV_NUMPY_DEVICES"


def _count_from_env() -> int:
    raw = os.environ.get(_ENV, "2")
    n = int(raw) if raw.strip().isdigit() else 0
    if n < 1:
        raise InvalidDeviceError(f"${_ENV} must be an integer >= 1, got {raw!r:.40}")
    return n


_device_count: int | None = None


def set_device_count(n: int) -> None:
    """Set how many virtual CPU devices the NumPy backend has (at least 1)."""
    global _device_count
    if not isinstance(n, int) or n < 1:
        raise InvalidDeviceError(f"the NumPy backend needs at least one device, got {n!r}")
    with _count_lock:
        _device_count = n


def _dev(a: Any) -> Device | None:
    """The device an operand pins, or None where it mixes with anything (scalars, 0-d host arrays)."""
    if isinstance(a, VirtualDeviceArray):
        return a._md_device
    return _HOST if isinstance(a, np.ndarray) and a.ndim > 0 else None


def _collect(obj: Any, out: list[Device]) -> None:
    if isinstance(obj, np.ndarray):
        d = _dev(obj)
        if d is not None:
            out.append(d)
    elif isinstance(obj, (list, tuple, dict)):
        for o in obj.values() if isinstance(obj, dict) else obj:
            _collect(o, out)


def _common_device(what: str, *objs: Any) -> Device:
    devs: list[Device] = []
    for o in objs:
        _collect(o, devs)
    return same_device("numpy", what, devs) or _HOST


def _plain(obj: Any) -> Any:
    if isinstance(obj, VirtualDeviceArray):
        return obj.view(np.ndarray)
    if isinstance(obj, list):
        return [_plain(o) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_plain(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _tag(obj: Any, device: Device) -> Any:
    """``obj`` tagged with ``device``: on cpu:0 (the host itself) a plain ``numpy.ndarray``, native in, native
    out; on another virtual device a VirtualDeviceArray. NumPy turns 0-d results into scalars, which carry no
    tag: on a device other than cpu:0 they become 0-d arrays, so the device is never lost."""
    if device is _HOST or device == _HOST:
        return obj.view(np.ndarray) if isinstance(obj, VirtualDeviceArray) else (
            [_tag(o, device) for o in obj] if isinstance(obj, list) else
            tuple(_tag(o, device) for o in obj) if isinstance(obj, tuple) else obj)
    if isinstance(obj, np.generic):
        obj = np.asarray(obj)
    if isinstance(obj, np.ndarray):
        v = obj.view(VirtualDeviceArray)
        v._md_device = device
        return v
    if isinstance(obj, tuple):
        return tuple(_tag(o, device) for o in obj)
    if isinstance(obj, list):
        return [_tag(o, device) for o in obj]
    return obj


class VirtualDeviceArray(np.ndarray):
    """A NumPy array tagged with the virtual device it lives on (see the module docstring)."""

    _md_device: Device = _HOST

    def __array_finalize__(self, obj: Any) -> None:
        self._md_device = getattr(obj, "_md_device", _HOST)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        dev = _common_device(f"{ufunc.__name__}.{method}" if method != "__call__" else ufunc.__name__,
                             inputs, kwargs.get("out", ()))
        result = getattr(ufunc, method)(*_plain(inputs), **_plain(kwargs))
        if method == "at" or result is NotImplemented:
            return result
        return _tag(result, dev)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        dev = _common_device(getattr(func, "__name__", "function"), args, kwargs)
        return _tag(func(*_plain(args), **_plain(kwargs)), dev)

    def __setitem__(self, key: Any, value: Any) -> None:
        _common_device("__setitem__", self, value)
        self.view(np.ndarray)[_plain(key)] = _plain(value)

    def __reduce__(self) -> Any:
        reduced: Any = super().__reduce__()  # ndarray's is (fn, args, state)
        fn, args, state = reduced
        return fn, args, (state, self._md_device)

    def __setstate__(self, state: Any) -> None:
        base, dev = state
        super().__setstate__(base)
        self._md_device = dev

    def __repr__(self) -> str:
        return f"{np.array_repr(self.view(np.ndarray))[:-1]}, device='{self._md_device}')"


class NumpyDLPack(Concern, SupportsDLPack):
    """DLPack for host arrays: the array itself out, ``numpy.from_dlpack`` in, tagged with its virtual device."""

    def export_dlpack(self, x: Any) -> Any:
        return _plain(x)  # ndarray has __dlpack__, strided layouts included

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        if device.kind != "cpu":
            raise CapabilityError(f"numpy backend holds host memory only; cannot take a {device} buffer")
        return _tag(np.from_dlpack(obj), device)  # a view: tagging the virtual device copies nothing


class NumpyCompile(Concern, SupportsCompile):
    """NumPy has no compiler: one route, ``identity``, runs the function as it is."""

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        return {"identity": True}

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        return fn


class NumpyBackend(BaseBackend):
    """The NumPy reference backend (see module docstring)."""

    name: ClassVar[str] = "numpy"
    framework: ClassVar[str] = "numpy"
    virtual_devices_env: ClassVar[str | None] = _ENV
    dlpack = concern(NumpyDLPack)
    compiler = concern(NumpyCompile)

    @classmethod
    def configure_devices(cls, count: int, strict: bool = False) -> bool:
        """Virtual devices can change at any time: applies at once unless the user set $MULTIDEV_NUMPY_DEVICES
        (then ``strict=True`` raises CapabilityError where it differs)."""
        if _ENV in os.environ:
            ok = os.environ[_ENV] == str(count)
            if not ok and strict:
                raise CapabilityError(f"numpy backend: ${_ENV}={os.environ[_ENV]!r} is set; unset it for "
                                      f"{count} devices")
            return ok
        set_device_count(count)
        return True

    def __init__(self) -> None:
        global _device_count
        with _count_lock:
            if _device_count is None:
                _device_count = _count_from_env()
        dtypes = set(DTYPES) - {"bfloat16"}
        # bfloat16 for NumPy where ml_dtypes is installed: found, not imported (its import costs
        # more than all of this backend's start-up; it is imported when a bfloat16 array is made)
        if importlib.util.find_spec("ml_dtypes") is not None:
            dtypes.add("bfloat16")
        self._caps = Capabilities(mutable=True, async_execution=False, pinned_memory=False,
                                  dtypes=frozenset(dtypes), raises_on_mixed_devices=True)

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def version(self) -> str:
        return np.__version__

    def tensor_types(self) -> tuple[type, ...]:
        return (np.ndarray, np.generic)

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        n = _device_count or 1
        devs = _DEVICE_LISTS.get(n)
        if devs is None:
            devs = _DEVICE_LISTS[n] = tuple(Device("cpu", i) for i in range(n))
        return list(devs)

    def to_native_device(self, device: Device) -> Any:
        return device  # NumPy has no device objects; the neutral value is the native one.

    def from_native_device(self, obj: Any) -> Device | None:
        return obj if isinstance(obj, Device) else None

    # -- dtypes -----------------------------------------------------------------------------
    def to_native_dtype(self, dtype: str) -> Any:
        if dtype not in self._caps.dtypes:
            raise CapabilityError(f"numpy backend: dtype {dtype!r} needs the 'ml_dtypes' package")
        nd = _NATIVE_DTYPES[dtype] = np.dtype(numpy_dtype(dtype))
        return nd

    def dtype_of(self, x: Any) -> str:
        dt = getattr(x, "dtype", None)
        if dt is None:
            dt = np.asarray(x).dtype
        name = _DTYPE_NAMES.get(dt)
        if name is None:
            name = canonical_dtype(dt)
            if len(_DTYPE_NAMES) < 256:
                _DTYPE_NAMES[dt] = name
        return name

    # -- creation ---------------------------------------------------------------------------
    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        out = _aligned(tuple(shape), _NATIVE_DTYPES.get(dtype) or self.to_native_dtype(dtype))
        out.fill(value)  # (a value the core checked fits the dtype)
        return _tag(out, device)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        return _tag(_aligned(tuple(shape), self.to_native_dtype(dtype)), device)

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        return _tag(host_aligned(np.arange(start, stop, step, dtype=self.to_native_dtype(dtype))), device)

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        _common_device("asarray", obj)  # reading another backend's memory is fine; tagging is ours
        nd = None if dtype is None else self.to_native_dtype(dtype)
        src = np.asarray(_plain(obj))  # (a view where obj is an array: the one copy is below)
        if src.dtype.kind in "OUSV":
            src = np.array(_plain(obj), dtype=nd, copy=True)  # NumPy's own refusals and conversions
        return _tag(_copied(src, nd), device)

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        vals = np.random.default_rng(seed).random(shape)
        return _tag(host_aligned(vals.astype(self.to_native_dtype(dtype))), device)

    # -- placement --------------------------------------------------------------------------
    def device_of(self, x: Any) -> Device:
        return x._md_device if isinstance(x, VirtualDeviceArray) else _HOST

    def move(self, x: Any, device: Device) -> Any:
        return _tag(_copied(np.asarray(_plain(x))), device)

    def copy(self, x: Any, device: Device) -> Any:
        return _tag(_copied(np.asarray(_plain(x))), device)

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(_plain(x))

    def synchronize(self, device: Device | None) -> None:
        return None  # NumPy runs every operation to completion before returning.

    def device_wait_fn(self, device: Device) -> Callable[[], Any] | None:
        if self._redefines("synchronize", NumpyBackend):
            return super().device_wait_fn(device)
        return None  # nothing is ever queued

    def tensor_wait_fn(self) -> Callable[[Any], Any]:
        if self._redefines("wait", NumpyBackend) or self._redefines("synchronize", NumpyBackend):
            return super().tensor_wait_fn()  # (the inherited wait calls synchronize)
        return _finished

    # -- arithmetic for collectives ---------------------------------------------------------
    def combine(self, op: str, a: Any, b: Any) -> Any:
        dev = _common_device(op, a, b)
        return _tag(_REDUCE[op](_plain(a), _plain(b)), dev)

    def divide(self, x: Any, n: int) -> Any:
        p = _plain(x)
        return _tag((p / n).astype(p.dtype, copy=False), self.device_of(x))

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return _tag(np.reshape(_plain(x), shape), self.device_of(x))

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        dev = _common_device("concat", list(xs))
        return _tag(np.concatenate(_plain(list(xs)), axis=axis), dev)

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        cuts = np.cumsum(list(sizes))[:-1]
        return _tag(list(np.split(_plain(x), cuts, axis=axis)), self.device_of(x))

    def shared_memory_allreduce(self, xs: Sequence[Any], op: str, orders: Sequence[tuple[int, int, Any]],
                                divide_by: int | None, inplace: bool) -> list[Any] | None:
        """The core's allreduce over virtual devices in one synchronous pass: per block each input read once, reduced
        in ``orders``' fixed order (``(lo, hi, expr)`` on the flat elements, ``expr`` an input or a pair ``combine(op,
        left, right)``), divided as :meth:`divide` does, written into each result: the inputs with ``inplace``
        (nothing allocated), else the rows of one allocation. None: declined (0-d, not C-contiguous; in place:
        overlapping, or NumPy set to raise mid-way)."""
        flat = [np.asarray(_plain(x)) for x in xs]
        shape, dt, size = flat[0].shape, flat[0].dtype, flat[0].size
        if not shape or not all(a.flags.c_contiguous for a in flat) or (inplace and (any(np.may_share_memory(
                a, c) for i, a in enumerate(flat) for c in flat[i + 1:]) or "raise" in np.geterr().values())):
            return None
        flat, unit = [a.reshape(-1) for a in flat], max(1, HOST_ALIGNMENT // dt.itemsize)  # (rows start aligned)
        outs = flat if inplace else list(_aligned((len(xs), -(-size // unit) * unit), dt)[:, :size])
        blk = max(_BLOCK_BYTES // dt.itemsize, -(-size // host_threads()))  # ~one a thread: each holds the GIL
        fn, blk, err, call = _REDUCE[op], -(-blk // unit) * unit, np.geterr(), np.geterrcall()
        state: dict[str, Any] = {**err, **({} if call is None else {"call": call})}
        # A partial result goes where its leftmost input's result goes (in place: that input), but complex products:
        direct = not (op == "prod" and dt.kind == "c")  # new blocks (NumPy rounds them otherwise into an operand)

        def run(part: Sequence[tuple[int, int, Any]]) -> None:  # blocks (lo, hi, expr), on one thread
            with np.errstate(**state):  # the caller's, its callback too (NumPy 1 keeps it per thread)
                for lo, hi, e in part:
                    v, at = _block(e, lo, hi, flat, outs, fn, direct)
                    if isinstance(e, int) and outs[at] is not flat[at]:  # one input, out of place: its copy
                        outs[at][lo:hi], v = v, outs[at][lo:hi]
                    elif not direct:
                        at = -1  # (a new block: written into every result)
                    if divide_by is not None:
                        np.divide(v, divide_by, out=v, casting="unsafe")  # = (v / n).astype(v.dtype)
                    for k, o in enumerate(outs):
                        if k != at:
                            o[lo:hi] = v
        blocks = [(a, min(hi, a + blk), e) for lo, hi, e in orders for a in range(lo, hi, blk)]
        run_parts(run, blocks, 2 * len(xs) * size * dt.itemsize)  # every block independent: on several cores
        return list(xs) if inplace else [_tag(o.reshape(shape), self.device_of(x)) for o, x in zip(outs, xs)]

    def writable(self, x: Any) -> bool | None:
        """NumPy's own flag: ``copyto`` refuses exactly the arrays whose ``writeable`` flag is off."""
        return bool(x.flags.writeable)

    def assign(self, dst: Any, src: Any) -> None:
        _common_device("assign", dst, src)
        np.copyto(_plain(dst), _plain(src))
