"""The core protocol for MXNet: identity, devices, dtypes, creation, placement, synchronize, host
copies, and the arithmetic the portable collectives are built from; every op under NumPy shape
semantics (``_scope``)."""
from __future__ import annotations

import atexit
import ctypes
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from multidev.adapter import (
    BackendNotAvailableError,
    BaseBackend,
    Capabilities,
    CapabilityError,
    Device,
    DeviceNotFoundError,
    InvalidDeviceError,
    canonical_dtype,
)

from ._common import FLOATS, MX_DTYPES

_ENV_CPUS = "MULTIDEV_MXNET_CPU_DEVICES"
_WITH_MXNET_ENV = ('pip install torch==2.13.0 && pip install ".[all,mxnet]" in a multidev checkout '
                   '(it resolves numpy 1.26.4, JAX 0.7.1 and TF 2.21 beside MXNet 1.9.1)')
_FLOAT16_BELOW_ONE = 0.99951171875  # the largest float16 below 1.0


class _NumpyShape:
    """NumPy shape semantics for this thread inside the block, the previous state restored after.

    Calls the C API itself: ``mx.util.np_shape`` logs through the root logger on first use, which
    installs a stderr handler on the user's root logger (logging.basicConfig)."""

    __slots__ = ("_lib", "_prev")

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._prev = ctypes.c_int()

    def __enter__(self) -> None:
        # 1 = thread-local on; the previous value (0 off, 1 thread-local, 2 global) is kept as is.
        if self._lib.MXSetIsNumpyShape(ctypes.c_int(1), ctypes.byref(self._prev)) != 0:
            raise RuntimeError("mxnet backend: MXSetIsNumpyShape failed")

    def __exit__(self, *exc: Any) -> None:
        if self._prev.value != 1:
            self._lib.MXSetIsNumpyShape(self._prev, ctypes.byref(ctypes.c_int()))


def _numpy_major() -> int:
    try:
        return int(np.__version__.split(".")[0])
    except ValueError:
        return 0


class MxnetCore(BaseBackend):
    """The core protocol of the MXNet backend; the state every concern uses is made here."""

    name: ClassVar[str] = "mxnet"
    framework: ClassVar[str] = "mxnet"
    virtual_devices_env: ClassVar[str | None] = _ENV_CPUS

    def __init__(self) -> None:
        import importlib.util

        if importlib.util.find_spec("mxnet") is None:
            raise ImportError("No module named 'mxnet'")  # not installed: say that, not the numpy rule
        # Checked before `import mxnet`, so a refusal leaves no half-imported mxnet behind.
        if _numpy_major() >= 2:
            raise BackendNotAvailableError(
                f"mxnet needs numpy<2 (MXNet 1.9.1 is its last release) but numpy {np.__version__} is "
                f"installed; multidev does not support MXNet on NumPy 2. Use the \"with MXNet\" "
                f"environment: {_WITH_MXNET_ENV}."
            )
        self._devof: dict[tuple[int, int], Device] = {}  # (device_typeid, id) -> Device cache
        raw = os.environ.get(_ENV_CPUS, "2")
        try:
            self._n_cpu = int(raw)
        except ValueError:
            self._n_cpu = 0
        if self._n_cpu < 1:
            raise InvalidDeviceError(f"mxnet backend: ${_ENV_CPUS} must be an integer >= 1, got {raw!r}")
        if "bool" not in vars(np):
            setattr(np, "bool", np.bool_)  # noqa: B010 - mxnet 1.9.1 uses np.bool, removed in NumPy 1.24
        try:
            with warnings.catch_warnings():
                # mxnet's import touches distutils and NumPy's removed financial functions.
                warnings.simplefilter("ignore", DeprecationWarning)
                import mxnet as mx
        except ImportError:
            raise
        except Exception as e:  # a broken install (missing shared library, NumPy alias): not available
            raise BackendNotAvailableError(
                f"backend 'mxnet' is not available: importing mxnet failed with {type(e).__name__}: {e}. "
                f"The tested environment is: {_WITH_MXNET_ENV}."
            ) from e
        self.mx = mx
        self._nd_type: Any = mx.nd.NDArray
        self._np_type: Any = mx.np.ndarray
        self._error: Any = mx.base.MXNetError
        try:
            n_gpu = int(mx.context.num_gpus())
        except Exception:  # noqa: BLE001 - a CPU-only build may raise instead of answering 0
            n_gpu = 0
        self._n_gpu = n_gpu
        # native_allreduce's KVStores (see _kvstore_sum), and the exit hook that drains them
        self._kv: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._kv_lock = threading.Lock()
        atexit.register(self.collectives.drop_kvstores)
        self._caps = Capabilities(mutable=True, async_execution=True, pinned_memory=n_gpu > 0,
                                  dtypes=MX_DTYPES, raises_on_mixed_devices=False)

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def tensor_types(self) -> tuple[type, ...]:
        return (self._nd_type, self._np_type)

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return ([Device("cpu", i) for i in range(self._n_cpu)]
                + [Device("gpu", i) for i in range(self._n_gpu)])

    def to_native_device(self, device: Device) -> Any:
        if device.kind == "cpu":
            return self.mx.cpu(device.index)
        if device.kind == "gpu":
            return self.mx.gpu(device.index)
        raise DeviceNotFoundError(f"mxnet backend has no {device.kind} devices; available: "
                                  f"{', '.join(map(str, self.devices()))}")

    def from_native_device(self, obj: Any) -> Device | None:
        if not isinstance(obj, self.mx.Context):
            return None
        kind = obj.device_type
        if kind == "gpu":
            return Device("gpu", int(obj.device_id))
        if kind == "cpu":
            return Device("cpu", int(obj.device_id))
        if kind in ("cpu_pinned", "cpu_shared"):
            return Device("cpu", 0)  # host memory; a pinned context's id names its GPU, not a CPU
        return None

    # -- dtypes -----------------------------------------------------------------------------
    def to_native_dtype(self, dtype: str) -> Any:
        if dtype not in MX_DTYPES:
            raise CapabilityError(f"mxnet backend: MXNet 1.9.1 has no usable {dtype} arrays; "
                                  f"supported: {', '.join(sorted(MX_DTYPES))}")
        return np.dtype(dtype)

    def dtype_of(self, x: Any) -> str:
        return canonical_dtype(np.dtype(x.dtype))

    # -- creation ---------------------------------------------------------------------------
    # Under MXNet's numpy mode (``npx.set_np()``, per thread), what multidev makes is an ``mx.np``
    # array (a view of the NDArray built here, no copy); otherwise a legacy ``mx.nd.NDArray``.
    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        return self._made(self._full_nd(shape, value, dtype, device))

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        return self._made(self._empty_nd(shape, dtype, device))

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        """A new array on ``device`` (an ``mx.np`` array in numpy mode, else an NDArray). ``dtype=None``
        keeps a NumPy array's (or an MXNet array's) dtype; nested lists and scalars then get MXNet's
        own default, float32 (multidev's core passes its documented default instead)."""
        return self._made(self._asarray_nd(obj, dtype, device))

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        """Uniform [0, 1) samples from MXNet's generator of ``device``. A seed reseeds that generator
        (``mx.random.seed(seed, ctx)``), so the stream MXNet draws from afterwards restarts too;
        CPU contexts share one generator, so a seed gives the same values on every ``cpu:i``."""
        return self._made(self._rand_nd(shape, dtype, device, seed))

    def _made(self, y: Any) -> Any:
        """``y`` (an NDArray made here) as the array kind the caller's mode asks for."""
        return y.as_np_ndarray() if self._np_mode() else y

    def _np_mode(self) -> bool:
        return bool(self.mx.util.is_np_array())

    def _full_nd(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        nd = self.to_native_dtype(dtype)
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, bool):
            value = int(value)  # mx.nd.full parses its value from text: "False" is no number to it
        huge = nd.kind in "iu" and isinstance(value, int) and abs(value) > 2 ** 53
        if huge or (nd.kind == "f" and nd.itemsize == 8):
            # mx.nd.full passes the value as a double, in text: build huge integers, and float64 values
            # (1.7976931348623157e+308 came back one ulp off), on the host instead.
            return self._asarray_nd(np.full(shape, value, dtype=nd), dtype, device)
        with self._scope():
            return self.mx.nd.full(shape, value, ctx=self._ctx(device), dtype=nd)

    def _empty_nd(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        with self._scope():
            return self.mx.nd.empty(shape, ctx=self._ctx(device), dtype=self.to_native_dtype(dtype))

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        # mx.nd.arange refuses empty ranges: NumPy computes the values, then one host copy.
        host = np.arange(start, stop, step, dtype=self.to_native_dtype(dtype))
        return self._made(self._asarray_nd(host, dtype, device))

    def _asarray_nd(self, obj: Any, dtype: str | None, device: Device) -> Any:
        mx = self.mx
        ctx = self._ctx(device)
        with self._scope():
            if isinstance(obj, self._nd_type):
                y = self._nd(obj).copyto(ctx)
                if dtype is not None and self.dtype_of(y) != dtype:
                    y = y.astype(self.to_native_dtype(dtype))
                return y
            if dtype is None:
                dtype = (canonical_dtype(obj.dtype) if isinstance(obj, (np.ndarray, np.generic))
                         else "float32")
            nd = self.to_native_dtype(dtype)
            host = np.asarray(obj, dtype=nd, order="C")  # (ascontiguousarray would make 0-d 1-d)
            # mx.nd.array makes float32 of float64 input unless the dtype is passed, and warns
            # (scipy.sparse.csr DeprecationWarning) on every call: its dense half is used directly.
            return mx.nd.ndarray.array(host, ctx=ctx, dtype=nd)

    def _rand_nd(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        mx = self.mx
        ctx = self._ctx(device)
        nd = self.to_native_dtype(dtype)
        draw = dtype if dtype in FLOATS else "float32"
        with self._scope():
            if seed is not None:
                mx.random.seed(int(seed), ctx=ctx)
            x = mx.nd.random.uniform(0, 1, shape, ctx=ctx, dtype=draw)
            if draw == "float16":
                x = mx.nd.minimum(x, _FLOAT16_BELOW_ONE)  # rounding to float16 can give 1.0
            return x if draw == dtype else x.astype(nd)

    # -- placement --------------------------------------------------------------------------
    def device_of(self, x: Any) -> Device:
        ctx = x.ctx  # (mx.np arrays warn on .context)
        key = (ctx.device_typeid, ctx.device_id)
        dev = self._devof.get(key)
        if dev is not None:
            return dev
        dev = self.from_native_device(ctx)
        if dev is not None:
            self._devof[key] = dev
        if dev is None:
            raise DeviceNotFoundError(f"mxnet backend: unknown context {ctx!r}")
        return dev

    def move(self, x: Any, device: Device) -> Any:
        with self._scope():
            ctx = self._ctx(device)
            if isinstance(x, self._np_type):
                return x.as_in_ctx(ctx)  # (mx.np arrays warn on as_in_context)
            return x.as_in_context(ctx)  # x itself when already there

    def copy(self, x: Any, device: Device) -> Any:
        with self._scope():
            return x.copyto(self._ctx(device))  # always a new buffer; keeps x's array type

    def to_numpy(self, x: Any) -> np.ndarray:
        # np.asarray(mx_array) is broken (no __array__); asnumpy waits and raises x's async error.
        with self._scope():
            return x.asnumpy()

    def synchronize(self, device: Device | None) -> None:
        """``mx.nd.waitall()``: MXNet has no per-context wait, so every device is waited for (also
        when ``device`` is given). Raises the first pending asynchronous error (see the package docstring)."""
        self.mx.nd.waitall()

    def wait(self, x: Any) -> None:
        x.wait_to_read()

    # -- arithmetic for collectives ---------------------------------------------------------
    def combine(self, op: str, a: Any, b: Any) -> Any:
        self.same_device(op, [a, b], self._silent(a))
        is_bool = self.dtype_of(a) == "bool"
        if is_bool:
            op = {"sum": "max", "prod": "min"}.get(op, op)  # NumPy: bool + is "or", bool * is "and"
        fn = self._binary(op)
        with self._scope():
            an, bn = self._nd(a), self._nd(b)
            if is_bool:  # MXNet's arithmetic refuses bool operands
                out = fn(an.astype("uint8"), bn.astype("uint8")).astype("bool")
            else:
                out = fn(an, bn)
            return self._like(out, a)

    def divide(self, x: Any, n: int) -> Any:
        with self._scope():
            xn = self._nd(x)
            out = xn / n
            if out.dtype != xn.dtype:
                out = out.astype(xn.dtype)
            return self._like(out, x)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        shape = tuple(int(s) for s in shape)
        with self._scope():
            xn = self._nd(x)
            if 0 in shape:
                # NDArray.reshape reads 0 as "keep this dim"; an empty result has no data to share.
                if int(np.prod(shape)) != int(np.prod(xn.shape)):
                    raise ValueError(f"mxnet backend: cannot reshape {xn.shape} into {shape}")
                out = self.mx.nd.empty(shape, ctx=xn.context, dtype=xn.dtype)
            else:
                out = xn.reshape(shape)  # a view
            return self._like(out, x)

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        xs = list(xs)
        self.same_device("concat", xs, self._silent(xs[0]))
        with self._scope():
            ns = [self._nd(x) for x in xs]
            is_bool = self.dtype_of(xs[0]) == "bool"
            if is_bool:  # MXNet's concat refuses bool ("Unknown type enum 7")
                ns = [n.astype("uint8") for n in ns]
            ndim = len(ns[0].shape)
            ax = axis % ndim if ndim else axis
            if ax == 0 and ndim and len(ns) > 1:
                # Along the first axis: each piece copied into its slice of one new array (a view
                # there). MXNet 1.9's concat kernel runs several times slower than its copies.
                rows = [int(n_.shape[0]) for n_ in ns]
                out = self.mx.nd.empty((sum(rows),) + tuple(ns[0].shape[1:]), ctx=ns[0].context,
                                        dtype=ns[0].dtype)
                at = 0
                for n_, r in zip(ns, rows):
                    if r:
                        n_.copyto(out[at:at + r])
                    at += r
            else:
                out = self.mx.nd.concat(*ns, dim=ax)
            if is_bool:
                out = out.astype("bool")
            return self._like(out, xs[0])

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        mx = self.mx
        with self._scope():
            xn = self._nd(x)
            shape = tuple(int(s) for s in xn.shape)
            axis = axis % len(shape)
            is_bool = self.dtype_of(x) == "bool"
            src = xn.astype("uint8") if is_bool else xn  # slice_axis refuses bool
            out, begin = [], 0
            for size in sizes:
                size = int(size)
                if size == 0:  # slice_axis refuses begin == end
                    piece = mx.nd.empty(shape[:axis] + (0,) + shape[axis + 1:], ctx=xn.context,
                                        dtype=src.dtype)
                elif axis == 0:
                    piece = src[begin:begin + size]  # a view (slice_axis would copy every piece)
                else:
                    piece = mx.nd.slice_axis(src, axis=axis, begin=begin, end=begin + size)
                if is_bool:
                    piece = piece.astype("bool")
                out.append(self._like(piece, x))
                begin += size
            return out

    def assign(self, dst: Any, src: Any) -> None:
        self.same_device("assign", [dst, src], self._silent(dst))
        if dst is src:
            return
        with self._scope():
            dn, sn = self._nd(dst), self._nd(src)
            if tuple(dn.shape) != tuple(sn.shape):
                raise ValueError(f"mxnet backend: assign needs one shape; got {dn.shape} and {sn.shape}")
            if sn.dtype != dn.dtype:
                sn = sn.astype(dn.dtype)
            sn.copyto(dn)  # legacy view of dst shares its memory: the write lands in dst

    # -- internals ----------------------------------------------------------------------------
    def _scope(self) -> _NumpyShape:
        # Legacy NDArray ops reject () and 0-sized dims ("unknown" in legacy shape semantics).
        return _NumpyShape(self.mx.base._LIB)

    def _nd(self, x: Any) -> Any:
        """The legacy NDArray view of x (shares memory; legacy ops refuse mx.np arrays)."""
        return x.as_nd_ndarray() if isinstance(x, self._np_type) else x

    def _like(self, y: Any, x: Any) -> Any:
        """``y`` (a legacy NDArray) as the array type of ``x``, without copying."""
        return y.as_np_ndarray() if isinstance(x, self._np_type) else y

    def _ctx(self, device: Device) -> Any:
        return self.to_native_device(device)

    def _silent(self, first: Any) -> str:
        # MXNet itself would silently compute on the first operand's context.
        return f" (MXNet would silently compute on {self.device_of(first)})"

    def _binary(self, op: str) -> Any:
        nd = self.mx.nd
        return {"sum": nd.broadcast_add, "max": nd.broadcast_maximum, "min": nd.broadcast_minimum,
                "prod": nd.broadcast_mul}[op]
