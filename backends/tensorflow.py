"""TensorFlow backend: eager ``tf.Tensor`` and ``tf.Variable`` on TF's logical CPU and GPU devices.

Mechanism. Devices are TF's *logical* devices (``tf.config.list_logical_devices``): ``/device:CPU:i``
is ``cpu:i`` and ``/device:GPU:i`` is ``gpu:i``. Every operation the adapter runs is wrapped in
``with tf.device(...)`` and the result's ``.device`` is checked, because eager TF places an op with
no device scope on the default device (``CPU:0``/``GPU:0``), whatever its inputs' devices, and copies
operands across devices silently. For the same reason TF arithmetic never raises on mixed devices
(``capabilities.raises_on_mixed_devices`` is False): the adapter's own ``combine``, ``concat`` and ``assign``
check devices and raise DeviceMismatchError.

Several CPU devices. ``$MULTIDEV_TF_CPU_DEVICES=N`` (N >= 2) splits the physical CPU into N logical
devices when the adapter is created, provided TF's runtime is not initialized yet and nobody has
configured the CPU's logical devices already; otherwise the existing devices are kept.

Mutability. Creation returns immutable ``tf.Tensor`` values (``capabilities.mutable`` is False);
``assign`` works when the destination is a ``tf.Variable``. ``move`` and ``copy`` keep the type:
a Variable in gives a new Variable out (so it stays assignable), a Tensor in gives a Tensor out.

Execution is synchronous on CPUs unless ``tf.config.experimental.set_synchronous_execution(False)``
was called; GPU kernels are asynchronous. ``synchronize`` runs TF's ``SyncDevice`` op on each device
and then ``async_wait``, which raises pending asynchronous errors.
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
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
    NonBlockingMoves,
    SupportsCompile,
    SupportsDLPack,
    SupportsNativeCollectives,
    SupportsTraining,
    UnsupportedTensorError,
    canonical_dtype,
    dlpack_info,
    numpy_dtype,
)

_ENV_CPU = "MULTIDEV_TF_CPU_DEVICES"
_KIND_OF_TF = {"CPU": "cpu", "GPU": "gpu"}
_TF_OF_KIND = {"cpu": "CPU", "gpu": "GPU"}

# CollectiveReduceV2 computes in these dtypes. Narrower integers and bool are widened (cast);
# complex sums reduce as (real, imag) pairs and uint64 as int64 (bitcast, exact; for max/min with
# the sign bit flipped, which maps unsigned order onto signed order).
_COLLECTIVE_NATIVE = ("bfloat16", "float16", "float32", "float64", "int32", "int64")
_COLLECTIVE_WIDEN = {"int8": "int64", "int16": "int64", "uint8": "int64", "uint16": "int64",
                     "uint32": "int64", "bool": "int32"}
_COLLECTIVE_BITCAST = {"complex64": ("float32", ("sum", "mean")),
                       "complex128": ("float64", ("sum", "mean")),
                       "uint64": ("int64", ("sum", "prod", "max", "min"))}
_MERGE_OP = {"sum": "Add", "mean": "Add", "prod": "Mul", "max": "Max", "min": "Min"}
# Group keys of multidev's collectives start far from tf.distribute's own (which count from 1).
_GROUP_KEY_BASE = 0x4D440000
_SILENT = " (TF itself would copy them silently)"
# Eigen's alignment (EIGEN_MAX_ALIGN_BYTES): TF checks every buffer it computes on against it.
_ALIGN = 64


class TensorflowBackend(BaseBackend, NonBlockingMoves, SupportsDLPack, SupportsNativeCollectives, SupportsTraining,
                        SupportsCompile):
    """The TensorFlow adapter (see module docstring)."""

    name: ClassVar[str] = "tensorflow"
    framework: ClassVar[str] = "tensorflow"
    # TF aborts the interpreter on host buffers it cannot take (Check failed: IsAligned())
    virtual_devices_env: ClassVar[str | None] = _ENV_CPU

    def __init__(self) -> None:
        if "tensorflow" not in sys.modules:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's C++ start-up logs quiet
        import tensorflow as tf
        from tensorflow.python.eager import context

        self._tf = tf
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
        self._parsed: dict[str, Device] = {}  # tensor.device string -> Device, cached
        self._lock = threading.Lock()
        self._tokens: dict[Device, Any] = {}  # per-device ordering tokens of native_allreduce
        self._groups: dict[tuple[Device, ...], int] = {}
        self._fns: dict[tuple[Any, ...], Any] = {}
        self._group_locks: dict[tuple[Device, ...], threading.Lock] = {}
        self._instance_keys: dict[tuple[Any, ...], Any] = {}  # call signature -> instance key tensor
        has_gpu = any(d.is_gpu for d in self._devices)
        self._caps = Capabilities(
            mutable=False,
            async_execution=has_gpu or bool(context.is_async()),
            pinned_memory=False,  # TF stages host<->GPU copies in its own pinned pool; no user API
            dlpack=True,
            native_collectives=frozenset({"allreduce"}),
            dtypes=frozenset(DTYPES),
            raises_on_mixed_devices=False,
        )

    def _configure_cpu_devices(self) -> None:
        """Split the CPU into $MULTIDEV_TF_CPU_DEVICES logical devices, if still possible."""
        tf = self._tf
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
        return (self._tf.Tensor, self._tf.Variable)

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
        tf = self._tf
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
        return self._tf.as_dtype(dtype)

    def dtype_of(self, x: Any) -> str:
        try:
            return canonical_dtype(x.dtype.name)
        except TypeError:
            raise CapabilityError(f"tensorflow backend: tensors of dtype {x.dtype.name} are outside "
                                  "multidev's dtypes") from None

    # -- creation ---------------------------------------------------------------------------
    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        tf = self._tf
        nd = self.to_native_dtype(dtype)
        # tf.constant refuses lossy Python values (1.5 for int32); cast on the host as np.full does.
        host = np.asarray(value).astype(numpy_dtype(dtype))
        with tf.device(self.to_native_device(device)):
            y = tf.fill(list(shape), tf.constant(host, dtype=nd))
        return self._placed(y, device, "full")

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        tf = self._tf
        with tf.device(self.to_native_device(device)):
            y = tf.raw_ops.Empty(shape=list(shape), dtype=self.to_native_dtype(dtype), init=False)
        return self._placed(y, device, "empty")

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        tf = self._tf
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
        tf = self._tf
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
        tf = self._tf
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
        spec = self._tf.DeviceSpec.from_string(name)
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
        tf = self._tf
        with tf.device(self.to_native_device(device)):
            if isinstance(x, tf.Variable):
                return self._new_variable(x, device, tf.identity(self._read(x)))
            y = tf.identity(x)
        return self._placed(y, device, "move")

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        """``move`` (TF enqueues GPU copies and kernels itself); the waiter synchronizes the source
        and target devices, or is None when both are CPUs executing synchronously."""
        src = self.device_of(x)
        y = self.move(x, device)
        if not (src.is_gpu or device.is_gpu or self._context.is_async()):
            return y, None

        def waiter() -> None:
            for d in sorted({src, device}):
                self.synchronize(d)

        return y, waiter

    def copy(self, x: Any, device: Device) -> Any:
        """A distinct buffer on ``device`` (DeepCopy: tf.identity would alias on the same device and
        between logical CPUs). Keeps the type: a Variable gives a new, independent tf.Variable."""
        tf = self._tf
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
        tf = self._tf
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
        tf = self._tf
        dev = self.same_device(op, [a, b], _SILENT)
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
        tf = self._tf
        dev = self.device_of(x)
        with tf.device(self.to_native_device(dev)):
            v = self._read(x)
            if v.dtype.is_floating or v.dtype.is_complex:
                y = v / tf.cast(n, v.dtype)
            else:
                y = tf.cast(tf.math.truediv(v, n), v.dtype)  # truncates, as NumPy's astype does
        return self._placed(y, dev, "divide")

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        tf = self._tf
        dev = self.device_of(x)
        with tf.device(self.to_native_device(dev)):
            y = tf.reshape(self._read(x), list(shape))
        return self._placed(y, dev, "reshape")

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        tf = self._tf
        dev = self.same_device("concat", list(xs), _SILENT)
        with tf.device(self.to_native_device(dev)):
            y = tf.concat([self._read(x) for x in xs], axis=axis)
        return self._placed(y, dev, "concat")

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        tf = self._tf
        dev = self.device_of(x)
        with tf.device(self.to_native_device(dev)):
            parts = tf.split(self._read(x), [int(s) for s in sizes], axis=axis)
        return [self._placed(p, dev, "split") for p in parts]

    def assign(self, dst: Any, src: Any) -> None:
        """``dst.assign(src)`` for a tf.Variable on src's device; CapabilityError for a tf.Tensor."""
        tf = self._tf
        if not isinstance(dst, tf.Variable):
            raise CapabilityError(
                "tensorflow backend: tf.Tensor is immutable and cannot be written in place. Hold the "
                "data in a tf.Variable (tf.Variable(x)) to assign into it, or rebind the result "
                "(x = new_value; allreduce(..., inplace=False)).")
        dev = self.same_device("assign", [dst, src], _SILENT)
        with tf.device(self.to_native_device(dev)):
            dst.assign(self._read(src))

    # -- interchange ------------------------------------------------------------------------
    def export_dlpack(self, x: Any) -> Any:
        """The eager tensor itself (it has ``__dlpack__``/``__dlpack_device__``). Every TF dtype
        exports, bool and bfloat16 included (NumPy cannot import bfloat16; torch can). A tf.Variable
        is refused: its buffer is replaced on assign, so no export can share memory with it."""
        tf = self._tf
        if isinstance(x, tf.Variable):
            raise CapabilityError(
                "tensorflow backend: a tf.Variable cannot be exported through DLPack (TF swaps its "
                "buffer on assign). Export a snapshot: multidev.copy(tf.convert_to_tensor(v)).")
        if hasattr(x, "__dlpack__"):
            return x
        return tf.experimental.dlpack.to_dlpack(x)  # TF releases without EagerTensor.__dlpack__

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        """A tf.Tensor sharing memory with ``obj`` (an object with ``__dlpack__``, or a legacy
        ``"dltensor"`` capsule). TF takes only compact row-major tensors and unversioned capsules;
        anything else raises CapabilityError."""
        tf = self._tf
        cap = obj.__dlpack__() if hasattr(obj, "__dlpack__") else obj
        info = dlpack_info(cap)  # reads the header only; the capsule stays unconsumed
        if not info.aligned(_ALIGN) or not info.row_major:
            # TF takes any buffer here but aborts the process later (Check failed: IsAligned())
            # when an op reads one that is not 64-byte aligned: refuse it before TF sees it.
            raise CapabilityError(
                f"tensorflow backend cannot share this DLPack buffer: TF needs contiguous (row-major) data at a "
                f"{_ALIGN}-byte aligned address (this one is at {info.address:#x}, strides {info.strides}). "
                "Copy it instead (multidev.convert does so when copy is not False).")
        try:
            y = tf.experimental.dlpack.from_dlpack(cap)
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError, TypeError) as e:
            raise CapabilityError(
                f"tensorflow backend cannot import this DLPack tensor: {str(e).splitlines()[0]}. TF "
                "takes compact row-major tensors through legacy 'dltensor' capsules; make the source "
                "contiguous first (np.ascontiguousarray, tensor.contiguous()).") from e
        got = self.device_of(y)
        if got == device:
            return y
        if got.kind == device.kind == "cpu":
            with tf.device(self.to_native_device(device)):
                return tf.identity(y)  # between logical CPUs identity relabels, it does not copy
        raise CapabilityError(f"tensorflow backend: a DLPack buffer of {device} arrived on {got}")

    # -- native fast paths ------------------------------------------------------------------
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        """TF's collective all-reduce (``CollectiveReduceV2``, one op per device launched together in
        one tf.function; ring on CPUs, NCCL hinted on GPUs); out of place, result i on xs[i]'s device.

        Ops sum, mean (floating dtypes), max, min, prod. Computes natively in bfloat16, float16,
        float32, float64, int32, int64; bool and narrower integers are widened and cast back (exact:
        results wrap as NumPy's do); complex sum/mean reduce (real, imag) pairs and uint64 reduces
        as int64 (bitcasts); complex prod raises CapabilityError. Devices must be all CPUs or all
        GPUs.
        """
        tf = self._tf
        xs = list(xs)
        if op not in _MERGE_OP:
            raise CapabilityError(f"tensorflow native_allreduce has no op {op!r}; use one of {', '.join(_MERGE_OP)}")
        devs = tuple(self.device_of(x) for x in xs)
        if len({d.kind for d in devs}) > 1:
            raise CapabilityError("tensorflow native_allreduce cannot mix CPU and GPU devices in one "
                                  "collective group; use algorithm='naive'")
        dtype = self.dtype_of(xs[0])
        wide = _COLLECTIVE_WIDEN.get(dtype)
        bitcast = None
        if dtype in _COLLECTIVE_BITCAST:
            bitcast, ops = _COLLECTIVE_BITCAST[dtype]
            if op not in ops:
                raise CapabilityError(f"tensorflow native_allreduce cannot compute op={op!r} on {dtype} "
                                      "tensors (CollectiveReduceV2 has no kernel and no exact "
                                      "rewrite); use algorithm='naive'")
        elif dtype not in _COLLECTIVE_NATIVE and wide is None:
            raise CapabilityError(f"tensorflow native_allreduce cannot reduce {dtype} tensors; use "
                                  "algorithm='naive'")
        if len(xs) == 1 or 0 in self.shape_of(xs[0]):
            # A group of one would forward the input buffer (results never alias inputs), and
            # CollectiveReduceV2 segfaults on tensors with no elements: both reduce to a copy.
            return [self.copy(x, d) for x, d in zip(xs, devs)]
        merge, final = _MERGE_OP[op], ("Div" if op == "mean" else "Id")
        if dtype == "bool":  # over {0, 1}: or = max, and = min
            merge = "Max" if op in ("sum", "max") else "Min"
        flip = dtype == "uint64" and op in ("max", "min")
        ins = []
        for x, d in zip(xs, devs):
            with tf.device(self.to_native_device(d)):
                v = self._read(x)
                if wide:
                    v = tf.cast(v, wide)
                elif bitcast:
                    v = tf.bitcast(v, bitcast)
                    if flip:
                        v = tf.bitwise.bitwise_xor(v, tf.constant(-(2**63), tf.int64))
                ins.append(v)
        fn = self._collective_fn(devs, merge, final, ins[0].dtype)
        # One instance key per call signature (group, shape, dtype, op), reused call after call as a
        # traced tf.distribute step reuses its keys: TF keeps a record for every instance key it
        # sees, so a fresh key per call grew RSS by ~1.3 KB a call; and one key reused for another
        # shape or dtype aborts that collective and every later one. Calls of one group are
        # serialized so that no two share a key concurrently.
        sig = (devs, tuple(self.shape_of(ins[0])), ins[0].dtype.name, merge, final)
        with self._lock:
            group_lock = self._group_locks.setdefault(devs, threading.Lock())
            instance = self._instance_keys.get(sig)
            if instance is None:
                with tf.device(self.to_native_device(Device("cpu", 0))):
                    instance = tf.constant(len(self._instance_keys) % (2**31 - 2) + 1, dtype=tf.int32)
                self._instance_keys[sig] = instance
        with group_lock:
            outs = fn(ins, instance)
        nd = self.to_native_dtype(dtype)
        res = []
        for y, d in zip(outs, devs):
            with tf.device(self.to_native_device(d)):
                # A tf.function's host-memory outputs come back labelled CPU:0 (TF reports the host
                # device for them): tf.identity in the device's scope relabels without copying.
                if wide:
                    y = tf.cast(y, nd)
                elif bitcast:
                    if flip:
                        y = tf.bitwise.bitwise_xor(y, tf.constant(-(2**63), tf.int64))
                    y = tf.bitcast(y, nd)
                else:
                    y = tf.identity(y)
            res.append(self._placed(y, d, "native_allreduce"))
        return res

    # -- helpers ----------------------------------------------------------------------------
    def _placed(self, y: Any, device: Device, what: str) -> Any:
        """``y`` checked to be on ``device``; moved there once if TF placed it elsewhere."""
        if self.device_of(y) == device:
            return y
        tf = self._tf
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
        if isinstance(x, self._tf.Variable):
            return x.read_value()
        return x

    def _deep_copy(self, v: Any) -> Any:
        tf = self._tf
        try:
            return tf.raw_ops.DeepCopy(x=v)
        except tf.errors.NotFoundError:
            return tf.raw_ops.Snapshot(input=v)  # no DeepCopy kernel here: Snapshot copies a shared input

    def _new_variable(self, like: Any, device: Device, value: Any) -> Any:
        tf = self._tf
        with tf.device(self.to_native_device(device)):
            v = tf.Variable(value, trainable=like.trainable, dtype=like.dtype)
        if self.device_of(v) != device:
            raise CapabilityError(f"tensorflow backend: TF created the variable on {self.device_of(v)} "
                                  f"instead of {device}")
        return v

    def _complex_extreme(self, op: str, a: Any, b: Any) -> Any:
        tf = self._tf
        ar, ai, br, bi = tf.math.real(a), tf.math.imag(a), tf.math.real(b), tf.math.imag(b)
        if op == "max":
            a_wins = (ar > br) | ((ar == br) & (ai >= bi))
        else:
            a_wins = (ar < br) | ((ar == br) & (ai <= bi))
        nan_a = tf.math.is_nan(ar) | tf.math.is_nan(ai)
        nan_b = tf.math.is_nan(br) | tf.math.is_nan(bi)
        return tf.where(nan_a | (~nan_b & a_wins), a, b)

    def _collective_fn(self, devs: tuple[Device, ...], merge: str, final: str, dtype: Any) -> Any:
        """A cached tf.function launching one CollectiveReduceV2 per device, concurrently; traced
        once per (devices, op, dtype), for every shape."""
        tf = self._tf
        with self._lock:
            fkey = (devs, merge, final, dtype)
            fn = self._fns.get(fkey)
            if fn is not None:
                return fn
            group = self._groups.setdefault(devs, _GROUP_KEY_BASE + len(self._groups))
            tokens = []
            for d in devs:
                if d not in self._tokens:
                    # Collectives are stateful: without a per-device ordering token, tf.function's
                    # automatic control dependencies run them one after another, and they deadlock.
                    with tf.init_scope(), tf.device(self.to_native_device(d)):
                        self._tokens[d] = tf.Variable(0.0, trainable=False)
                tokens.append(self._tokens[d])
            names = [self.to_native_device(d) for d in devs]
            hint = "nccl" if devs[0].is_gpu else "auto"

            sig = [[tf.TensorSpec(None, dtype) for _ in devs], tf.TensorSpec([], tf.int32)]

            @tf.function(input_signature=sig, autograph=False)
            def allreduce(ins: list[Any], instance: Any) -> list[Any]:
                outs = []
                for name, x, tok in zip(names, ins, tokens):
                    with tf.device(name):
                        outs.append(tf.raw_ops.CollectiveReduceV2(
                            input=x, group_size=len(names), group_key=group, instance_key=instance,
                            ordering_token=[tok.handle], merge_op=merge, final_op=final,
                            communication_hint=hint))
                return outs

            # Each group's function traces once, but all share one code object, which TF's retracing
            # detector counts together: silence its "excessive retracing" warning for them.
            allreduce._omit_frequent_tracing_warning = True
            self._fns[fkey] = allreduce
            return allreduce

    # -- optional extensions: training and compilation --------------------------------------
    def parameter_like(self, src: Any, y: Any) -> Any:
        tf = self._tf
        if isinstance(src, tf.Variable) and not isinstance(y, tf.Variable):
            return self._new_variable(src, self.device_of(y), y)
        return y  # move and copy keep Variables Variables already

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        tf = self._tf
        ps = list(params)
        dev = self.same_device("value_and_grad", ps, _SILENT)
        with tf.device(self.to_native_device(dev)):  # eager TF would run the ops on its default device
            with tf.GradientTape() as tape:
                tape.watch(ps)
                total = tf.reduce_sum(fn(ps, *args))
            gs = tape.gradient(total, ps)
            grads = [tf.zeros_like(self._read(p)) if g is None else tf.convert_to_tensor(g) for p, g in zip(ps, gs)]
        return total, [self._placed(g, dev, "value_and_grad") for g in grads]

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        tf = self._tf
        out = []
        for p, g in zip(params, grads):
            with tf.device(p.device):
                if isinstance(p, tf.Variable):
                    p.assign_sub(lr * g)  # in place: a Variable stays the same Variable
                    out.append(p)
                else:
                    out.append(p - lr * g)
        return out

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        # D2L 12.1 on the 2-core CPU: a plain function's tf.function is slower than eager, XLA faster.
        return {"tf.function": True, "tf.function:jit_compile": True, "eager": True}

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        tf = self._tf
        f = fn if route == "eager" else tf.function(fn, jit_compile=route.endswith(":jit_compile"))
        if route != "eager":
            try:
                f.get_concrete_function(*args)  # trace now: a function TF cannot trace fails here, typed
            except (TypeError, ValueError, AttributeError, NotImplementedError, tf.errors.OpError) as e:
                raise CapabilityError(f"tensorflow backend: {route} cannot trace this function: "
                                      f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}") from e
        types: Any = self.tensor_types()
        devs = self.devices()
        default = next((d for d in devs if d.is_gpu), devs[0])  # where TF runs ops given no device scope
        where = next((a for a in args if isinstance(a, types)), None)

        def placed(*a: Any, **k: Any) -> Any:
            # Eager TF and tf.function place ops on the default device, not the inputs': keep the inputs'.
            x = next((x for x in a if isinstance(x, types)), where)
            if x is None or self.device_of(x) == default:
                return f(*a, **k)  # no scope needed (a scope costs ~10 µs a call)
            with tf.device(x.device):
                return f(*a, **k)
        return placed
