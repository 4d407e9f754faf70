"""A stand-in for CuPy on machines without a GPU: it tests the CuPy adapter's logic, never CuPy.

Importing this module installs modules named ``cupy``, ``cupy.cuda``, ``cupy.cuda.nccl``,
``cupy.random`` and ``cupyx`` into ``sys.modules`` (only where no real CuPy is importable). "GPU"
arrays are NumPy arrays tagged with a device id; ``$FAKE_CUPY_GPUS`` GPUs exist (default 2, 0 makes
``cupy.cuda.is_available()`` False). What it enforces, as CuPy does:

- a kernel (arithmetic, astype, concatenate, setitem) runs on the *current* device, and refuses
  operands living on another GPU (no peer access) or host NumPy arrays;
- ``np.asarray`` of a GPU array raises TypeError (no implicit host conversion);
- ``get``/``set`` need exactly matching dtype and shape; ``from_dlpack`` refuses host producers;
- NCCL ``allReduce`` takes raw pointers inside ``groupStart``/``groupEnd`` and reduces at
  ``groupEnd`` over the communicators ``initAll`` made together.

Streams and events are bookkeeping only (every copy here is synchronous), so nothing about
asynchrony, pinned memory or real DLPack between devices is tested through it: that is the GPU
run's job (``scripts/gpu/cupy.sh``).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import threading
import types
from typing import Any

import numpy as np

__version__ = "14.2.0"
_state: dict[str, Any] = {"ptrs": {}, "group": None}
_thread = threading.local()  # the current device is per thread, as CUDA's is


def _n() -> int:
    return int(os.environ.get("FAKE_CUPY_GPUS", "2"))


def _cur() -> int:
    return int(getattr(_thread, "current", 0))


class _Mem:
    def __init__(self, arr: ndarray) -> None:
        self.device_id = arr._dev
        self.ptr = int(arr._a.ctypes.data)
        if arr._a.flags.c_contiguous:
            _state["ptrs"][self.ptr] = arr._a.reshape(-1)


class Device:
    def __init__(self, i: int | None = None) -> None:
        self.id = _cur() if i is None else int(i)
        self._prev: list[int] = []

    def __enter__(self) -> Device:
        if not 0 <= self.id < _n():
            raise RuntimeError(f"cudaErrorInvalidDevice: {self.id}")
        self._prev.append(_cur())
        _thread.current = self.id
        return self

    def __exit__(self, *exc: Any) -> None:
        _thread.current = self._prev.pop()

    def synchronize(self) -> None:
        return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("fake-cuda", self.id))

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


def _unwrap(v: Any, dev: int, what: str) -> Any:
    if isinstance(v, ndarray):
        if v._dev != dev:
            raise ValueError(f"{what}: the array on device {v._dev} is not on the current device {dev} "
                             "(peer access is unavailable)")
        return v._a
    if isinstance(v, np.ndarray) and v.ndim > 0:
        raise TypeError(f"{what}: unsupported type {type(v).__name__} (no implicit host operand)")
    return v


def _kernel(what: str, *xs: Any) -> int:
    dev = _cur()
    for x in xs:
        _unwrap(x, dev, what)
    return dev


class ndarray:
    __array_ufunc__ = None  # NumPy refuses to mix a host array with one of these, as with CuPy's

    def __init__(self, a: np.ndarray, dev: int) -> None:
        self._a = a
        self._dev = dev

    shape = property(lambda self: tuple(self._a.shape))
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: int(self._a.size))
    ndim = property(lambda self: self._a.ndim)
    nbytes = property(lambda self: int(self._a.nbytes))
    data = property(lambda self: _Mem(self))
    device = property(lambda self: Device(self._dev))
    T = property(lambda self: ndarray(self._a.T, self._dev))

    def __array__(self, *a: Any, **k: Any) -> Any:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()`")

    def __repr__(self) -> str:
        return f"fake_cupy.array({self._a!r}, device={self._dev})"

    def __getitem__(self, key: Any) -> ndarray:
        return ndarray(self._a[key], self._dev)

    def __setitem__(self, key: Any, v: Any) -> None:
        dev = _kernel("setitem", self)
        self._a[key] = _unwrap(v, dev, "setitem")

    def astype(self, dtype: Any, order: str = "K", copy: bool = True) -> ndarray:
        dev = _kernel("astype", self)
        return ndarray(self._a.astype(dtype, order=order, copy=copy), dev)

    def copy(self) -> ndarray:  # CuPy copies to the current device, from any device
        return ndarray(self._a.copy(), _cur())

    def reshape(self, *shape: Any) -> ndarray:
        return ndarray(self._a.reshape(*shape), self._dev)

    def view(self, dtype: Any) -> ndarray:
        return ndarray(self._a.view(dtype), self._dev)

    def get(self, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True) -> np.ndarray:
        if out is None:
            return self._a.copy()
        if not isinstance(out, np.ndarray) or out.dtype != self.dtype or out.shape != self.shape:
            raise TypeError("out must be a numpy.ndarray of the same dtype and shape")
        np.copyto(out, self._a)
        return out

    def set(self, arr: Any, stream: Any = None) -> None:
        if not isinstance(arr, np.ndarray) or arr.dtype != self.dtype or arr.shape != self.shape:
            raise TypeError("set takes a numpy.ndarray of the same dtype and shape")
        self._a[...] = arr

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self._dev)

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._a.__dlpack__()  # the header says CPU: only fake_cupy.from_dlpack reads it back

    def _bin(self, other: Any, fn: Any) -> ndarray:
        dev = _kernel("op", self, other)
        return ndarray(np.asarray(fn(self._a, _unwrap(other, dev, "op"))), dev)

    def __add__(self, o: Any) -> ndarray:
        return self._bin(o, np.add)

    def __radd__(self, o: Any) -> ndarray:
        return self._bin(o, np.add)

    def __mul__(self, o: Any) -> ndarray:
        return self._bin(o, np.multiply)

    def __rmul__(self, o: Any) -> ndarray:
        return self._bin(o, np.multiply)

    def __sub__(self, o: Any) -> ndarray:
        return self._bin(o, np.subtract)

    def __rsub__(self, o: Any) -> ndarray:
        return self._bin(o, lambda a, b: np.subtract(b, a))

    def __truediv__(self, o: Any) -> ndarray:
        return self._bin(o, np.true_divide)

    def __floordiv__(self, o: Any) -> ndarray:
        return self._bin(o, np.floor_divide)

    def __lt__(self, o: Any) -> ndarray:
        return self._bin(o, np.less)

    def __neg__(self) -> ndarray:
        _kernel("neg", self)
        return ndarray(-self._a, self._dev)


def _make(fn: Any) -> Any:
    def made(*args: Any, **kwargs: Any) -> ndarray:
        return ndarray(np.asarray(fn(*args, **kwargs)), _kernel(fn.__name__))
    made.__name__ = fn.__name__
    return made


full, empty, arange, zeros = _make(np.full), _make(np.empty), _make(np.arange), _make(np.zeros)
float32 = np.float32


def asnumpy(x: ndarray) -> np.ndarray:
    return x.get()


def array(obj: Any, dtype: Any = None, copy: bool = True) -> ndarray:
    if isinstance(obj, ndarray):
        if obj._dev != _cur():  # CuPy copies an array of another device to the current one
            return ndarray(obj._a.astype(obj.dtype if dtype is None else dtype), _cur())
        return obj.astype(obj.dtype if dtype is None else dtype)
    return ndarray(np.array(obj, dtype=dtype, copy=True), _kernel("array"))


asarray = array


def ascontiguousarray(x: ndarray) -> ndarray:
    dev = _kernel("ascontiguousarray", x)
    return ndarray(np.ascontiguousarray(x._a), dev)


def empty_like(x: ndarray) -> ndarray:
    return ndarray(np.empty_like(x._a), _kernel("empty_like"))


def concatenate(xs: list, axis: int = 0) -> ndarray:
    dev = _kernel("concatenate", *xs)
    return ndarray(np.concatenate([x._a for x in xs], axis=axis), dev)


def _ufunc(fn: Any) -> Any:
    def u(*xs: Any) -> ndarray:
        dev = _kernel(fn.__name__, *xs)
        return ndarray(np.asarray(fn(*[_unwrap(x, dev, fn.__name__) for x in xs])), dev)
    return u


add, maximum, minimum, multiply = _ufunc(np.add), _ufunc(np.maximum), _ufunc(np.minimum), _ufunc(np.multiply)
matmul = _ufunc(np.matmul)
logical_or, logical_and, abs, where = _ufunc(np.logical_or), _ufunc(np.logical_and), _ufunc(np.abs), _ufunc(np.where)


def from_dlpack(obj: Any, *, device: Any = None, copy: Any = None) -> ndarray:
    kind, dev = obj.__dlpack_device__()
    if kind == 1:
        raise TypeError("CPU arrays cannot be directly imported to CuPy.")
    if isinstance(obj, ndarray):
        return ndarray(obj._a, dev)
    raise TypeError(f"fake cupy imports only its own arrays, not {type(obj).__name__}")


class _Generator:
    def __init__(self, seed: Any) -> None:
        self._g = np.random.default_rng(seed)

    def random(self, size: Any = None, dtype: Any = np.float64) -> ndarray:
        return ndarray(self._g.random(size).astype(dtype), _kernel("random"))


class _Stream:
    ptr = 0

    def wait_event(self, event: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None


class Event:
    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        self.recorded = True

    @property
    def done(self) -> bool:
        return self.recorded

    def synchronize(self) -> None:
        if not self.recorded:
            raise RuntimeError("event synchronized before it was recorded")


class _Clique:
    def __init__(self, n: int) -> None:
        self.n = n
        self.calls: list[tuple] = []


class NcclCommunicator:
    def __init__(self, clique: _Clique, rank: int, device: int) -> None:
        self._clique, self._rank, self._device = clique, rank, device

    @staticmethod
    def initAll(devices: Any) -> list[NcclCommunicator]:
        devs = list(range(devices)) if isinstance(devices, int) else list(devices)
        clique = _Clique(len(devs))
        return [NcclCommunicator(clique, r, d) for r, d in enumerate(devs)]

    def device_id(self) -> int:
        return self._device

    def rank_id(self) -> int:
        return self._rank

    def allReduce(self, send: int, recv: int, count: int, datatype: int, op: int, stream: int) -> None:
        if _cur() != self._device:
            raise RuntimeError("ncclInvalidUsage: the current device is not the communicator's")
        if _state["group"] is None:
            raise RuntimeError("fake nccl: allReduce outside groupStart/groupEnd would deadlock one process")
        _state["group"].append((self._clique, self._rank, send, recv, count, datatype, op))


_NCCL_NP: dict[int, Any] = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
                            6: np.float16, 7: np.float32, 8: np.float64}
try:
    import ml_dtypes

    _NCCL_NP[9] = ml_dtypes.bfloat16
except ImportError:
    pass


def groupStart() -> None:
    _state["group"] = []


def groupEnd() -> None:
    calls, _state["group"] = _state["group"], None
    by: dict[int, list] = {}
    for c in calls:
        by.setdefault(id(c[0]), []).append(c)
    for group in by.values():
        clique = group[0][0]
        if sorted(c[1] for c in group) != list(range(clique.n)):
            raise RuntimeError("fake nccl: not every rank of the communicator joined (a hang on real NCCL)")
        dt = _NCCL_NP[group[0][5]]
        ins = [np.asarray(_state["ptrs"][c[2]]).view(dt)[: c[4]] for c in group]
        red = {0: np.sum, 1: np.prod, 2: np.max, 3: np.min}[group[0][6]](np.stack(ins), axis=0).astype(dt)
        for c in group:
            np.asarray(_state["ptrs"][c[3]]).view(dt)[: c[4]] = red


def _install() -> None:
    if "cupy" in sys.modules or importlib.util.find_spec("cupy") is not None:
        return  # a real CuPy is there: never shadow it
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    runtime = types.ModuleType("cupy.cuda.runtime")
    nccl = types.ModuleType("cupy.cuda.nccl")
    rnd = types.ModuleType("cupy.random")
    cupyx = types.ModuleType("cupyx")
    me = sys.modules[__name__]
    for name in ("ndarray", "full", "empty", "arange", "array", "asarray", "ascontiguousarray", "empty_like",
                 "concatenate", "add", "maximum", "minimum", "multiply", "logical_or", "logical_and", "abs",
                 "where", "from_dlpack", "__version__", "zeros", "float32", "asnumpy", "matmul"):
        setattr(cupy, name, getattr(me, name))
    ndarray.__module__ = "cupy"
    Device.__module__ = "cupy.cuda.device"
    cuda.Device, cuda.Event = Device, Event
    cuda.is_available = lambda: _n() > 0
    cuda.get_current_stream = lambda: _Stream()
    cuda.runtime = runtime

    def count() -> int:
        if _n() == 0:
            raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")
        return _n()
    runtime.getDeviceCount = count
    runtime.getDevice = _cur
    runtime.deviceCanAccessPeer = lambda i, j: 0
    runtime.getDeviceProperties = lambda i: {"name": b"fake GPU"}
    nccl.available = True
    nccl.NcclCommunicator, nccl.groupStart, nccl.groupEnd = NcclCommunicator, groupStart, groupEnd
    cuda.nccl = nccl
    rnd.default_rng = _Generator
    cupy.cuda, cupy.random = cuda, rnd
    cupyx.empty_pinned = lambda shape, dtype=float, order="C": np.empty(shape, dtype=dtype, order=order)
    sys.modules.update({"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.runtime": runtime, "cupy.cuda.nccl": nccl,
                        "cupy.random": rnd, "cupyx": cupyx})


_install()
