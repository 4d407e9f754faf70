"""MXNet backend: ``mx.nd.NDArray`` and ``mx.np.ndarray`` on ``mx.cpu(i)`` / ``mx.gpu(i)`` contexts.

Environment. MXNet 1.9.1 is the last release and needs numpy<2: on NumPy 2 this backend raises
BackendNotAvailableError before importing mxnet. On NumPy 1.24-1.26 it sets ``np.bool = np.bool_``
(mxnet uses the removed alias at import) and silences mxnet's import-time DeprecationWarnings.

Tensors. Both array types are native tensors: ``mx.nd.NDArray`` (legacy) and ``mx.np.ndarray`` (a
user under ``npx.set_np()``; it subclasses NDArray). Every operation on an existing array returns the
caller's type (an ``mx.np.ndarray`` in, ``mx.np.ndarray`` out). Creation (full, empty, arange,
asarray, rand, import_dlpack) returns ``mx.nd.NDArray``; ``x.as_np_ndarray()`` converts without a copy.

Devices. ``cpu:i`` is ``mx.cpu(i)`` for ``i < $MULTIDEV_MXNET_CPU_DEVICES`` (default 2): distinct
contexts sharing host memory. ``gpu:i`` is ``mx.gpu(i)`` for every GPU a CUDA build sees (untested
here: CPU-only build). ``mx.cpu_pinned``/``mx.cpu_shared`` arrays report ``cpu:0``.

MXNet quirks handled here, each also commented where it is worked around:
- mixed contexts do not raise (MXNet computes on the first operand's context), so combine, concat
  and assign check devices and raise DeviceMismatchError; ``capabilities.raises_on_mixed_devices`` is False;
- legacy NDArray shape semantics treat ``()`` and 0-sized dims as "unknown", so every op runs under
  NumPy shape semantics (thread-local, restored on exit) and 0-d / empty arrays work;
- bool arrays are not accepted by MXNet's arithmetic, concat, slice or kvstore: those paths go
  through an integer cast (sum/max of bools is "or", min/prod is "and", as in NumPy);
- ``mx.nd.array`` turns float64 input into float32 unless told the dtype: dtypes are always passed.

Asynchronous errors. MXNet runs ops on its engine threads; an op's error is raised at the first of
``mx.nd.waitall()`` (``synchronize``), ``wait_to_read()`` (``wait``) or ``asnumpy()`` (``to_numpy``) on
the failed array or anything computed from it. MXNet reports each error once: whichever of those
calls comes first raises it and clears it (and waitall clears every pending error, raising the
first one). mxnet#13234 ("waitall hides errors") was fixed by mxnet#14397 before 1.9.1; this
module's tests check that ``synchronize()`` raises.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
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
    NonBlockingMoves,
    SupportsCompile,
    SupportsDLPack,
    SupportsNativeCollectives,
    SupportsTraining,
    canonical_dtype,
)

#: What MXNet 1.9.1 can create, compute with (through the casts above) and read back.
#: Not here: int16, uint16/32/64, complex (no such NDArray dtypes) and bfloat16 (no NumPy-visible
#: bfloat16 in 1.9.1: a DLPack import gives a structured uint16 dtype).
_MX_DTYPES = frozenset({"bool", "int8", "int32", "int64", "uint8", "float16", "float32", "float64"})
_FLOATS = ("float16", "float32", "float64")
_ENV_CPUS = "MULTIDEV_MXNET_CPU_DEVICES"
_WITH_MXNET_ENV = ('pip install torch==2.13.0 && pip install ".[all,mxnet]" in a multidev checkout '
                   '(it resolves numpy 1.26.4, JAX 0.7.1 and TF 2.21 beside MXNet 1.9.1)')
_FLOAT16_BELOW_ONE = 0.99951171875  # the largest float16 below 1.0
#: KVStores kept for native_allreduce, one per (devices, shape, dtype), least recently used dropped.
_KVSTORES = 16


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


class MxnetBackend(BaseBackend, NonBlockingMoves, SupportsDLPack, SupportsNativeCollectives, SupportsTraining,
                   SupportsCompile):
    """The MXNet backend (see module docstring)."""

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
        self._mx = mx
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
        atexit.register(self._drop_kvstores)
        self._caps = Capabilities(mutable=True, async_execution=True, pinned_memory=n_gpu > 0,
                                  dlpack=True, native_collectives=frozenset({"allreduce"}),
                                  dtypes=_MX_DTYPES, raises_on_mixed_devices=False)

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
            return self._mx.cpu(device.index)
        if device.kind == "gpu":
            return self._mx.gpu(device.index)
        raise DeviceNotFoundError(f"mxnet backend has no {device.kind} devices; available: "
                                  f"{', '.join(map(str, self.devices()))}")

    def from_native_device(self, obj: Any) -> Device | None:
        if not isinstance(obj, self._mx.Context):
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
        if dtype not in _MX_DTYPES:
            raise CapabilityError(f"mxnet backend: MXNet 1.9.1 has no usable {dtype} arrays; "
                                  f"supported: {', '.join(sorted(_MX_DTYPES))}")
        return np.dtype(dtype)

    def dtype_of(self, x: Any) -> str:
        return canonical_dtype(np.dtype(x.dtype))

    # -- creation ---------------------------------------------------------------------------
    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        nd = self.to_native_dtype(dtype)
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, bool):
            value = int(value)  # mx.nd.full parses its value from text: "False" is no number to it
        if nd.kind in "iu" and isinstance(value, int) and abs(value) > 2 ** 53:
            # mx.nd.full passes the value as a double: build huge integers on the host instead.
            return self.asarray(np.full(shape, value, dtype=nd), dtype, device)
        with self._scope():
            return self._mx.nd.full(shape, value, ctx=self._ctx(device), dtype=nd)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        with self._scope():
            return self._mx.nd.empty(shape, ctx=self._ctx(device), dtype=self.to_native_dtype(dtype))

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        # mx.nd.arange refuses empty ranges: NumPy computes the values, then one host copy.
        host = np.arange(start, stop, step, dtype=self.to_native_dtype(dtype))
        return self.asarray(host, dtype, device)

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        """A new NDArray on ``device``. ``dtype=None`` keeps a NumPy array's (or an MXNet array's)
        dtype; nested lists and scalars then get MXNet's own default, float32."""
        mx = self._mx
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

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        """Uniform [0, 1) samples from MXNet's generator of ``device``. A seed reseeds that generator
        (``mx.random.seed(seed, ctx)``), so the stream MXNet draws from afterwards restarts too;
        CPU contexts share one generator, so a seed gives the same values on every ``cpu:i``."""
        mx = self._mx
        ctx = self._ctx(device)
        nd = self.to_native_dtype(dtype)
        draw = dtype if dtype in _FLOATS else "float32"
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

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        """The copy is queued on MXNet's engine; the waiter is the target's ``wait_to_read`` (which
        raises the copy's asynchronous error). A GPU -> ``cpu:0`` copy lands in pinned host memory
        (``mx.cpu_pinned``, reported as ``cpu:0``) on CUDA builds."""
        src = self.device_of(x)
        if src.is_gpu and device == Device("cpu", 0) and self._caps.pinned_memory:
            with self._scope():
                y = x.copyto(self._mx.cpu_pinned(src.index))  # untested here: no CUDA build of MXNet
        else:
            y = self.move(x, device)
        return y, y.wait_to_read

    def copy(self, x: Any, device: Device) -> Any:
        with self._scope():
            return x.copyto(self._ctx(device))  # always a new buffer; keeps x's array type

    def to_numpy(self, x: Any) -> np.ndarray:
        # np.asarray(mx_array) is broken (no __array__); asnumpy waits and raises x's async error.
        with self._scope():
            return x.asnumpy()

    def synchronize(self, device: Device | None) -> None:
        """``mx.nd.waitall()``: MXNet has no per-context wait, so every device is waited for (also
        when ``device`` is given). Raises the first pending asynchronous error (see module doc)."""
        self._mx.nd.waitall()

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
                out = self._mx.nd.empty(shape, ctx=xn.context, dtype=xn.dtype)
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
            out = self._mx.nd.concat(*ns, dim=axis % ndim if ndim else axis)
            if is_bool:
                out = out.astype("bool")
            return self._like(out, xs[0])

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        mx = self._mx
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

    # -- interchange ------------------------------------------------------------------------
    def export_dlpack(self, x: Any) -> Any:
        """A legacy DLPack capsule (``mx.nd.to_dlpack_for_read``: MXNet arrays have no
        ``__dlpack__``). MXNet arrays are always compact, views included. bool cannot be exported."""
        if self.dtype_of(x) == "bool":
            raise CapabilityError("mxnet backend: MXNet cannot export bool arrays through DLPack; "
                                  "cast first (x.astype('uint8')) or go through multidev.to_numpy")
        return self._mx.nd.to_dlpack_for_read(self._nd(x))

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        """An NDArray sharing memory with ``obj`` (an object with ``__dlpack__`` or a legacy
        capsule). MXNet takes only compact (C-contiguous) tensors and not bool, int16 or bfloat16.
        A CPU tensor always lands on ``cpu:0``: MXNet's FromDLPack ignores the CPU device id, and
        no MXNet API labels foreign memory with another CPU context (convert then copies)."""
        capsule = obj.__dlpack__() if hasattr(obj, "__dlpack__") else obj
        try:
            with self._scope():
                y = self._mx.nd.from_dlpack(capsule)
        except self._error as e:
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise CapabilityError(
                f"mxnet backend cannot import this DLPack tensor ({msg}). MXNet takes only compact "
                "(C-contiguous) tensors of bool-free dtypes: make it contiguous or cast it first, or "
                "copy through NumPy"
            ) from e
        dt = np.dtype(y.dtype)
        if dt.names is not None or dt.name not in _MX_DTYPES:
            # bfloat16 arrives as a structured uint16 dtype that no MXNet op computes with.
            raise CapabilityError(f"mxnet backend: DLPack tensor of dtype {dt} cannot be used by MXNet "
                                  f"1.9.1; cast it to one of {', '.join(sorted(_MX_DTYPES))} first")
        if self.device_of(y) != device:
            raise CapabilityError(f"mxnet backend: a DLPack buffer of {device} arrived on "
                                  f"{self.device_of(y)}; MXNet cannot label foreign memory with another "
                                  "CPU context, so sharing works on cpu:0 only")
        return y

    # -- native fast paths ------------------------------------------------------------------
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        """MXNet's own allreduce, out of place (inputs untouched, results never alias them).

        ``sum`` (and ``mean``): a KVStore (``'device'`` when a GPU takes part, else ``'local'``):
        every input is pushed, the sum is pulled into a new array on each input's context.
        ``max``/``min``/``prod``: KVStore only sums, so these are reduced by MXNet's engine: pairwise
        in list order onto the first input's context, then copied to the others (asynchronous).
        bool reduces through int32 (sum/max is "or", min/prod is "and")."""
        if op not in ("sum", "mean", "max", "min", "prod"):
            raise CapabilityError(f"mxnet backend: native allreduce has no op {op!r}; "
                                  "use sum, mean, max, min or prod")
        xs = list(xs)
        dtype = self.dtype_of(xs[0])
        if op == "mean" and dtype not in _FLOATS:
            raise CapabilityError(f"mxnet backend: mean of {dtype} tensors is refused; cast to a "
                                  "floating dtype first")
        if dtype == "bool":
            op = {"sum": "max", "prod": "min"}.get(op, op)  # NumPy: bool + is "or", bool * is "and"
        with self._scope():
            ns = [self._nd(x) for x in xs]
            if dtype == "bool":  # KVStore and arithmetic refuse bool (KVStore fails asynchronously)
                ns = [n.astype("int32") for n in ns]
            if op in ("sum", "mean"):
                outs = self._kvstore_sum(ns, any(self.device_of(x).is_gpu for x in xs))
            else:
                fn = self._binary(op)
                acc = ns[0]
                for n in ns[1:]:
                    acc = fn(acc, n.as_in_context(ns[0].context))
                if len(ns) == 1:
                    acc = acc.copy()
                outs = [acc] + [acc.copyto(n.context) for n in ns[1:]]
            if dtype == "bool":
                outs = [o.astype("bool") for o in outs]
            if op == "mean":
                outs = [self.divide(o, len(xs)) for o in outs]
            return [self._like(o, x) for o, x in zip(outs, xs)]

    # -- internals ----------------------------------------------------------------------------
    def _scope(self) -> _NumpyShape:
        # Legacy NDArray ops reject () and 0-sized dims ("unknown" in legacy shape semantics).
        return _NumpyShape(self._mx.base._LIB)

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
        nd = self._mx.nd
        return {"sum": nd.broadcast_add, "max": nd.broadcast_maximum, "min": nd.broadcast_minimum,
                "prod": nd.broadcast_mul}[op]

    def _kvstore_sum(self, ns: list[Any], gpu: bool) -> list[Any]:
        """Sum legacy NDArrays on distinct contexts through a KVStore; new outputs.

        One store per (contexts, shape, dtype), reused call after call as Gluon's Trainer reuses
        its own: a store created per call and dropped while its push/pull was still queued
        crashed MXNet's engine in long loops (SIGFPE, SIGSEGV, heap corruption: 2 of 6 runs of
        20,000 calls). A store is only ever dropped (least recently used, beyond _KVSTORES, or at
        exit) after ``waitall``."""
        mx = self._mx
        shape, mdt = tuple(ns[0].shape), ns[0].dtype
        key = (gpu, tuple((n.context.device_typeid, n.context.device_id) for n in ns), shape, str(mdt))
        with self._kv_lock:
            kv = self._kv.get(key)
            if kv is None:
                if len(self._kv) >= _KVSTORES:
                    mx.nd.waitall()
                    self._kv.popitem(last=False)
                kv = mx.kv.create("device" if gpu else "local")
                kv.init(0, mx.nd.zeros(shape, ctx=ns[0].context, dtype=mdt))
                self._kv[key] = kv
            else:
                self._kv.move_to_end(key)
            outs = [mx.nd.empty(shape, ctx=n.context, dtype=mdt) for n in ns]
            kv.pushpull(0, ns, out=outs)
        return outs

    # -- optional extensions: training and compilation --------------------------------------
    def parameter_like(self, src: Any, y: Any) -> Any:
        if src.grad is not None:  # D2L's attach_grad: the replica gets its own gradient buffer
            y.attach_grad()
        return y

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        ps = [p.copy() for p in params]  # private copies with fresh (zero) buffers: params' .grad untouched
        for q in ps:
            q.attach_grad()
        with self._mx.autograd.record():
            out = fn(ps, *args)
        out.backward()  # the gradient of out's sum
        return out.sum(), [q.grad for q in ps]

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        for p, g in zip(params, grads):
            p -= lr * g  # in place: the array keeps its gradient buffer
        return list(params)

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        if not isinstance(fn, self._mx.gluon.HybridBlock):
            raise CapabilityError("mxnet backend compiles Gluon HybridBlocks (hybridize); MXNet has no compiler "
                                  f"for a plain {type(fn).__name__}: build the model from gluon.nn layers "
                                  "(nn.HybridSequential) or call the function as it is")
        # D2L 12.1 on the 2-core CPU: eager 203 µs, hybridize 69 µs, static_alloc+static_shape 50 µs a call.
        return {"hybridize:static": True, "hybridize": True, "eager": True}

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        if route == "eager":
            fn.hybridize(active=False)
        else:  # hybridize resets the cached graph and flags every time it is called
            static = route == "hybridize:static"
            fn.hybridize(static_alloc=static, static_shape=static)
        return fn

    def _drop_kvstores(self) -> None:
        """At exit (before MXNet's own shutdown hook): drain the engine, then drop the stores."""
        with self._kv_lock:
            if self._kv:
                try:
                    self._mx.nd.waitall()
                except Exception:  # noqa: BLE001 - a pending async error must not break exit
                    pass
                self._kv.clear()
