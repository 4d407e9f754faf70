"""The core protocol for TensorFlow: identity, devices, dtypes, creation, placement, synchronize,
host copies, and the arithmetic the portable collectives are built from; every op in a device scope
with its result's placement checked (``_placed``)."""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from multidev.adapter import (
    DTYPES,
    FLOAT_DTYPES,
    BaseBackend,
    Capabilities,
    CapabilityError,
    Device,
    DeviceNotFoundError,
    UnsupportedTensorError,
    canonical_dtype,
    numpy_dtype,
)

from ._common import SILENT

_ENV_CPU = "MULTIDEV_TF_CPU_DEVICES"
_KIND_OF_TF = {"CPU": "cpu", "GPU": "gpu"}


class TensorflowCore(BaseBackend):
    """The core protocol of the TensorFlow adapter; the state every concern uses is made here."""

    name: ClassVar[str] = "tensorflow"
    framework: ClassVar[str] = "tensorflow"
    virtual_devices_env: ClassVar[str | None] = _ENV_CPU

    def __init__(self) -> None:
        if "tensorflow" not in sys.modules:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's C++ start-up logs quiet
        import tensorflow as tf
        from tensorflow.python.eager import context

        self.tf = tf
        self._context = context
        self._configure_cpu_devices()
        devs: list[Device] = []
        self._names: dict[Device, str] = {}
        for tf_kind in ("CPU", "GPU"):
            for ld in tf.config.list_logical_devices(tf_kind):
                spec = tf.DeviceSpec.from_string(ld.name)
                dev = Device(_KIND_OF_TF[tf_kind], int(spec.device_index or 0))
                devs.append(dev)
                self._names[dev] = f"/device:{tf_kind}:{dev.index}"
        self._devices = sorted(devs)
        self.check_virtual_devices(sum(1 for d in devs if d.kind == "cpu"))
        self._parsed: dict[str, Device] = {}  # tensor.device string -> Device, cached
        has_gpu = any(d.is_gpu for d in self._devices)
        self._caps = Capabilities(
            mutable=False,
            async_execution=has_gpu or bool(context.is_async()),
            pinned_memory=False,  # TF stages host<->GPU copies in its own pinned pool; no user API
            dtypes=frozenset(DTYPES),
            raises_on_mixed_devices=False,
        )

    def _configure_cpu_devices(self) -> None:
        """Split the CPU into $MULTIDEV_TF_CPU_DEVICES logical devices, if still possible."""
        tf = self.tf
        try:
            n = int(os.environ.get(_ENV_CPU, "0"))
        except ValueError:
            return
        if n < 2:
            return
        cpus = tf.config.list_physical_devices("CPU")  # does not initialize the runtime
        if not cpus or tf.config.get_logical_device_configuration(cpus[0]) is not None:
            return  # someone configured the CPU already: keep their split
        try:
            tf.config.set_logical_device_configuration(
                cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        except RuntimeError:
            pass  # TF's runtime is already initialized: its devices cannot change any more

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def tensor_types(self) -> tuple[type, ...]:
        return (self.tf.Tensor, self.tf.Variable)

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return list(self._devices)

    def to_native_device(self, device: Device) -> Any:
        """The TF device string, ``"/device:CPU:1"`` or ``"/device:GPU:0"`` (what ``tf.device`` takes)."""
        name = self._names.get(device)
        if name is None:
            raise DeviceNotFoundError(
                f"tensorflow has no device {device}; available: {', '.join(map(str, self._devices))}. "
                "Set MULTIDEV_TF_CPU_DEVICES=N before TensorFlow initializes for N CPU devices.")
        return name

    def from_native_device(self, obj: Any) -> Device | None:
        """A Device for a TF device string (``"/device:CPU:1"``, what to_native_device gives, and
        the full ``/job:.../device:GPU:0`` form), ``tf.config.LogicalDevice``,
        ``tf.config.PhysicalDevice`` (its physical index) or ``tf.DeviceSpec``; None for anything else
        or for device types other than CPU/GPU."""
        tf = self.tf
        if isinstance(obj, str):
            try:
                obj = tf.DeviceSpec.from_string(obj)
            except ValueError:
                return None
        if isinstance(obj, (tf.config.LogicalDevice, tf.config.PhysicalDevice)):
            kind = _KIND_OF_TF.get(obj.device_type)
            if kind is None:
                return None
            tail = obj.name.rsplit(":", 1)[-1]
            return Device(kind, int(tail)) if tail.isdigit() else None
        if isinstance(obj, tf.DeviceSpec):
            kind = _KIND_OF_TF.get((obj.device_type or "").upper())
            return None if kind is None else Device(kind, int(obj.device_index or 0))
        return None

    # -- dtypes -----------------------------------------------------------------------------
    def to_native_dtype(self, dtype: str) -> Any:
        if dtype not in self._caps.dtypes:
            raise CapabilityError(f"tensorflow backend: dtype {dtype!r} is not supported; use one of "
                                  f"{', '.join(sorted(self._caps.dtypes))}")
        return self.tf.as_dtype(dtype)

    def dtype_of(self, x: Any) -> str:
        try:
            return canonical_dtype(x.dtype.name)
        except TypeError:
            raise CapabilityError(f"tensorflow backend: tensors of dtype {x.dtype.name} are outside "
                                  "multidev's dtypes") from None

    # -- creation ---------------------------------------------------------------------------
    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        tf = self.tf
        nd = self.to_native_dtype(dtype)
        # tf.constant refuses lossy Python values (1.5 for int32); cast on the host as np.full does.
        host = np.asarray(value).astype(numpy_dtype(dtype))
        with tf.device(self.to_native_device(device)):
            y = tf.fill(list(shape), tf.constant(host, dtype=nd))
        return self._placed(y, device, "full")

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        tf = self.tf
        with tf.device(self.to_native_device(device)):
            y = tf.raw_ops.Empty(shape=list(shape), dtype=self.to_native_dtype(dtype), init=False)
        return self._placed(y, device, "empty")

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        tf = self.tf
        nd = self.to_native_dtype(dtype)
        with tf.device(self.to_native_device(device)):
            if dtype not in ("bfloat16", "float16", "float32", "float64", "int32", "int64"):
                # tf.range has no CPU kernel for the other dtypes: count in a wide type and cast.
                ints = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
                wide = tf.int64 if ints else tf.float64
                y = tf.cast(tf.range(start, stop, step, dtype=wide), nd)
            else:
                y = tf.range(start, stop, step, dtype=nd)
        return self._placed(y, device, "arange")

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        """Always a new buffer: TF values are deep-copied on ``device``; host data (lists, scalars,
        NumPy arrays, other frameworks' CPU tensors) is uploaded. ``dtype=None`` keeps a NumPy array's
        dtype and otherwise uses TF's inference (Python floats become float32, ints int32)."""
        tf = self.tf
        nd = None if dtype is None else self.to_native_dtype(dtype)
        with tf.device(self.to_native_device(device)):
            if isinstance(obj, self.tensor_types()):
                src = self._read(obj)
                y = tf.raw_ops.DeepCopy(x=src if nd is None else tf.cast(src, nd))
            elif isinstance(obj, (np.ndarray, np.generic)):
                arr = obj if dtype is None else obj.astype(numpy_dtype(dtype))
                y = tf.constant(arr, dtype=nd)  # tf.constant copies NumPy memory (never aliases)
            elif nd is None:
                y = tf.constant(obj)
            else:
                try:
                    y = tf.constant(obj, dtype=nd)
                except (TypeError, ValueError):
                    # tf.constant refuses lossy conversions (1.5 -> int32); NumPy casts, as np.array does.
                    y = tf.constant(np.asarray(obj).astype(numpy_dtype(dtype or "float32")), dtype=nd)
        return self._placed(y, device, "asarray")

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        """Uniform [0, 1) drawn in ``dtype`` for floating dtypes (``stateless_uniform`` with a seed
        pair when seeded, ``tf.random.uniform`` otherwise); other dtypes draw float64 and cast, as
        the NumPy reference does."""
        tf = self.tf
        nd = self.to_native_dtype(dtype)
        draw = nd if dtype in FLOAT_DTYPES else tf.float64  # TF's uniform takes only float dtypes
        with tf.device(self.to_native_device(device)):
            if seed is None:
                y = tf.random.uniform(list(shape), dtype=draw)
            else:
                s = int(seed)
                pair = tf.constant([s % 2**62, (s // 2**62) % 2**62], dtype=tf.int64)
                y = tf.random.stateless_uniform(list(shape), seed=pair, dtype=draw)
            if draw != nd:
                y = tf.cast(y, nd)
        return self._placed(y, device, "rand")

    # -- placement --------------------------------------------------------------------------
    def device_of(self, x: Any) -> Device:
        name = x.device
        dev = self._parsed.get(name)
        if dev is not None:
            return dev
        if not name:
            raise UnsupportedTensorError(
                "tensorflow backend: this tensor has no device (a symbolic tensor inside tf.function "
                "or a graph). multidev works on eager tensors; call it outside tf.function.")
        spec = self.tf.DeviceSpec.from_string(name)
        kind = _KIND_OF_TF.get((spec.device_type or "").upper())
        if kind is None:
            raise UnsupportedTensorError(f"tensorflow backend: tensor on device {name!r}, which is "
                                         "neither a CPU nor a GPU")
        dev = Device(kind, int(spec.device_index or 0))
        self._parsed[name] = dev
        return dev

    def move(self, x: Any, device: Device) -> Any:
        """``x`` on ``device``; a Tensor stays a Tensor (tf.identity in a device scope, which may
        share memory between logical CPU devices: TF values are immutable), a Variable becomes a new
        Variable on ``device``."""
        tf = self.tf
        with tf.device(self.to_native_device(device)):
            if isinstance(x, tf.Variable):
                return self._new_variable(x, device, tf.identity(self._read(x)))
            y = tf.identity(x)
        return self._placed(y, device, "move")

    def copy(self, x: Any, device: Device) -> Any:
        """A distinct buffer on ``device`` (DeepCopy: tf.identity would alias on the same device and
        between logical CPUs). Keeps the type: a Variable gives a new, independent tf.Variable."""
        tf = self.tf
        with tf.device(self.to_native_device(device)):
            y = self._deep_copy(self._read(x))
            if isinstance(x, tf.Variable):
                return self._new_variable(x, device, y)
        return self._placed(y, device, "copy")

    def to_numpy(self, x: Any) -> np.ndarray:
        # .numpy() waits for x and raises its asynchronous error, if any; for a 0-d tensor it gives a
        # NumPy scalar, not an ndarray: np.asarray makes that a 0-d array (and copies nothing else).
        return np.asarray(x.numpy())

    def synchronize(self, device: Device | None) -> None:
        """Runs TF's SyncDevice op on each device (``device``, or all of them), then async_wait.
        TF has no per-device wait for its async eager queue: async_wait drains all of it."""
        tf = self.tf
        if device is None and hasattr(tf.test.experimental, "sync_devices"):
            tf.test.experimental.sync_devices()  # TF >= 2.13: SyncDevice on every device + async_wait
            return
        if hasattr(tf.raw_ops, "SyncDevice"):
            for d in self._devices if device is None else [device]:
                with tf.device(self.to_native_device(d)):
                    tf.raw_ops.SyncDevice()
        self._context.async_wait()

    # -- arithmetic for collectives ---------------------------------------------------------
    def combine(self, op: str, a: Any, b: Any) -> Any:
        """Elementwise op on a's device; DeviceMismatchError when b is elsewhere (TF would copy it
        silently). bool follows NumPy (sum/max = or, prod/min = and); complex max/min compare
        lexicographically with NaN propagation, as np.maximum does."""
        tf = self.tf
        dev = self.same_device(op, [a, b], SILENT)
        dtype = self.dtype_of(a)
        with tf.device(self.to_native_device(dev)):
            a, b = self._read(a), self._read(b)
            if dtype == "bool":  # TF's Add/Maximum/Mul have no bool kernels
                y = (tf.logical_or if op in ("sum", "max") else tf.logical_and)(a, b)
            elif dtype.startswith("complex") and op in ("max", "min"):  # no complex Maximum kernel
                y = self._complex_extreme(op, a, b)
            else:
                fn = {"sum": tf.add, "max": tf.maximum, "min": tf.minimum, "prod": tf.multiply}[op]
                y = fn(a, b)
        return self._placed(y, dev, "combine")

    def divide(self, x: Any, n: int) -> Any:
        tf = self.tf
        dev = self.device_of(x)
        with tf.device(self.to_native_device(dev)):
            v = self._read(x)
            if v.dtype.is_floating or v.dtype.is_complex:
                y = v / tf.cast(n, v.dtype)
            else:
                y = tf.cast(tf.math.truediv(v, n), v.dtype)  # truncates, as NumPy's astype does
        return self._placed(y, dev, "divide")

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        tf = self.tf
        dev = self.device_of(x)
        with tf.device(self.to_native_device(dev)):
            y = tf.reshape(self._read(x), list(shape))
        return self._placed(y, dev, "reshape")

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        tf = self.tf
        dev = self.same_device("concat", list(xs), SILENT)
        with tf.device(self.to_native_device(dev)):
            y = tf.concat([self._read(x) for x in xs], axis=axis)
        return self._placed(y, dev, "concat")

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        tf = self.tf
        dev = self.device_of(x)
        with tf.device(self.to_native_device(dev)):
            parts = tf.split(self._read(x), [int(s) for s in sizes], axis=axis)
        return [self._placed(p, dev, "split") for p in parts]

    def assign(self, dst: Any, src: Any) -> None:
        """``dst.assign(src)`` for a tf.Variable on src's device; CapabilityError for a tf.Tensor."""
        tf = self.tf
        if not isinstance(dst, tf.Variable):
            raise CapabilityError(
                "tensorflow backend: tf.Tensor is immutable and cannot be written in place. Hold the "
                "data in a tf.Variable (tf.Variable(x)) to assign into it, or rebind the result "
                "(x = new_value; allreduce(..., inplace=False)).")
        dev = self.same_device("assign", [dst, src], SILENT)
        with tf.device(self.to_native_device(dev)):
            dst.assign(self._read(src))

    # -- helpers ----------------------------------------------------------------------------
    def _placed(self, y: Any, device: Device, what: str) -> Any:
        """``y`` checked to be on ``device``; moved there once if TF placed it elsewhere."""
        if self.device_of(y) == device:
            return y
        tf = self.tf
        # TF may keep some results in host memory (int32 on GPU, constants): copy them over.
        with tf.device(self.to_native_device(device)):
            y2 = tf.identity(y)
        if self.device_of(y2) != device:
            raise CapabilityError(f"tensorflow backend: {what} produced a {self.dtype_of(y)} tensor on "
                                  f"{self.device_of(y2)} instead of {device}, and TF would not move it")
        return y2

    def _read(self, x: Any) -> Any:
        """A Variable's value read in the current device scope (TF would read it onto CPU:0
        otherwise), or a Tensor unchanged."""
        if isinstance(x, self.tf.Variable):
            return x.read_value()
        return x

    def _deep_copy(self, v: Any) -> Any:
        tf = self.tf
        try:
            return tf.raw_ops.DeepCopy(x=v)
        except tf.errors.NotFoundError:
            return tf.raw_ops.Snapshot(input=v)  # no DeepCopy kernel here: Snapshot copies a shared input

    def _new_variable(self, like: Any, device: Device, value: Any) -> Any:
        tf = self.tf
        with tf.device(self.to_native_device(device)):
            v = tf.Variable(value, trainable=like.trainable, dtype=like.dtype)
        if self.device_of(v) != device:
            raise CapabilityError(f"tensorflow backend: TF created the variable on {self.device_of(v)} "
                                  f"instead of {device}")
        return v

    def _complex_extreme(self, op: str, a: Any, b: Any) -> Any:
        tf = self.tf
        ar, ai, br, bi = tf.math.real(a), tf.math.imag(a), tf.math.real(b), tf.math.imag(b)
        if op == "max":
            a_wins = (ar > br) | ((ar == br) & (ai >= bi))
        else:
            a_wins = (ar < br) | ((ar == br) & (ai <= bi))
        nan_a = tf.math.is_nan(ar) | tf.math.is_nan(ai)
        nan_b = tf.math.is_nan(br) | tf.math.is_nan(bi)
        return tf.where(nan_a | (~nan_b & a_wins), a, b)
