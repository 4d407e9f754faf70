"""The native baselines: each framework's own calls, written directly against the framework.

``multidev bench`` times every row through multidev and through these, in the same process. Each
class imports its framework in ``__init__``; :func:`native_for` returns ``None`` for a backend whose
framework has no class here (a third-party adapter gets multidev-only rows) or fails to import.

``call(op, *args)`` returns ``(fn, args, label)`` so the runner times ``fn(*args)`` with no wrapper
frame where the framework offers a bound call (``x.to``, ``jax.device_put``), keeping the
comparison fair. Ops:

- ``to(x, dev)``: the idiomatic "put x on dev" (a no-op when x is there: torch ``x.to``,
  ``jax.device_put``, MXNet ``as_in_context``, ``tf.identity`` under ``tf.device``);
- ``move_async(x, dev)``: the same with the framework's non-blocking flag where it has one;
- ``copy(x, dev)``: always a new buffer on ``dev``;
- ``device_of(x)``, ``sync(dev, x)`` (idle device), ``wait(x)`` (one tensor), ``zeros(shape, dev)``,
  ``h2d(ndarray, dev)``, ``d2h(x)``.
"""
from __future__ import annotations

import functools
import operator
import os
import platform
from typing import Any, Callable

import numpy as np

from multidev._device import Device

__all__ = ["Native", "native_for", "cpu_name"]

Call = tuple[Callable[..., Any], tuple, str]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nothing() -> None:
    return None


class Native:
    """Base: every op missing (returns None)."""

    framework = ""
    #: Whether native results carry a device multidev can read back (NumPy's do not: its devices
    #: are multidev's virtual ones, so checks skip the device of NumPy's native results).
    tracks_devices = True

    def __init__(self, b: Any) -> None:
        self.b = b

    def call(self, op: str, *args: Any) -> Call | None:
        m = getattr(self, "op_" + op, None)
        return None if m is None else m(*args)

    def mm(self, dev: Device) -> Callable[[Any, Any], Any]:
        """The framework's matmul for operands on ``dev``."""
        raise NotImplementedError

    def mover(self, dev: Device, non_blocking: bool = False) -> Callable[[Any], Any]:
        """A one-argument function putting a tensor on ``dev`` the framework's way (for loops)."""
        op = "move_async" if non_blocking else "to"

        def move(x: Any) -> Any:
            fn, a, _ = self.call(op, x, dev)
            return fn(*a)
        return move

    def set_precision(self, mode: str) -> dict[str, Any]:
        """Set f32 matmul precision: ``fp32`` (full), ``tf32``, or ``default`` (leave as is).
        Returns the flags as they now read."""
        return {}

    def save_precision(self) -> Any:
        """The precision state, for :meth:`restore_precision` once the run is over."""
        return None

    def restore_precision(self, state: Any) -> None:
        return None

    def device_name(self, dev: Device) -> str:
        return cpu_name() if not dev.is_gpu else str(dev)


class NumpyNative(Native):
    framework = "numpy"
    tracks_devices = False

    def op_sync(self, dev: Device, x: Any = None) -> Call:
        return _nothing, (), "nothing (NumPy is synchronous)"

    def op_wait(self, x: Any) -> Call:
        return _nothing, (), "nothing (NumPy is synchronous)"

    def mm(self, dev: Device) -> Callable[[Any, Any], Any]:
        return np.matmul

    def op_to(self, x: Any, dev: Device) -> Call:
        if self.b.device_of(x) != dev:  # another (virtual) device: NumPy's equivalent is a copy
            return np.array, (x,), "np.array(x)"
        return np.asarray, (x,), "np.asarray(x)"

    def op_copy(self, x: Any, dev: Device) -> Call:
        return np.array, (x,), "np.array(x)"

    def op_move_async(self, x: Any, dev: Device) -> Call:
        return self.op_to(x, dev)

    def op_zeros(self, shape: tuple, dev: Device) -> Call:
        return np.zeros, (shape, np.float32), "np.zeros(shape, float32)"

    def op_h2d(self, a: np.ndarray, dev: Device) -> Call:
        return np.array, (a,), "np.array(a)"

    def op_d2h(self, x: Any) -> Call:
        return np.asarray, (x,), "np.asarray(x)"

    def set_precision(self, mode: str) -> dict[str, Any]:
        return {"matmul": "float32 (BLAS)"}


class TorchNative(Native):
    framework = "torch"

    def __init__(self, b: Any) -> None:
        super().__init__(b)
        import torch

        self.torch = torch

    def dev(self, d: Device) -> Any:
        t = self.torch
        return t.device("cuda", d.index) if d.kind == "gpu" else t.device("mps") if d.kind == "mps" else t.device("cpu")

    def mm(self, dev: Device) -> Callable[[Any, Any], Any]:
        return self.torch.mm

    def op_to(self, x: Any, dev: Device) -> Call:
        return x.to, (self.dev(dev),), "x.to(device)"

    def mover(self, dev: Device, non_blocking: bool = False) -> Callable[[Any], Any]:
        d = self.dev(dev)
        return lambda x: x.to(d, non_blocking=non_blocking)

    def op_move_async(self, x: Any, dev: Device) -> Call:
        return functools.partial(x.to, self.dev(dev), non_blocking=True), (), "x.to(device, non_blocking=True)"

    def op_copy(self, x: Any, dev: Device) -> Call:
        return functools.partial(x.to, self.dev(dev), copy=True), (), "x.to(device, copy=True)"

    def op_device_of(self, x: Any) -> Call:
        return operator.attrgetter("device"), (x,), "x.device"

    def _sync_fn(self, dev: Device) -> Call:
        t = self.torch
        if dev.kind == "gpu":
            return t.cuda.synchronize, (self.dev(dev),), "torch.cuda.synchronize(device)"
        if dev.kind == "mps":
            return t.mps.synchronize, (), "torch.mps.synchronize()"
        return t.cpu.synchronize, (), "torch.cpu.synchronize()"

    def op_sync(self, dev: Device, x: Any = None) -> Call:
        return self._sync_fn(dev)

    def op_wait(self, x: Any) -> Call:
        fn, a, label = self._sync_fn(self.b.device_of(x))
        return fn, a, label + " (torch has no per-tensor wait)"

    def op_zeros(self, shape: tuple, dev: Device) -> Call:
        t = self.torch
        return functools.partial(t.zeros, shape, dtype=t.float32, device=self.dev(dev)), (), \
            "torch.zeros(shape, device=device)"

    def op_h2d(self, a: np.ndarray, dev: Device) -> Call:
        t = self.torch
        if dev.kind == "cpu":  # from_numpy(a).to('cpu') would alias a: copy, as md.asarray does
            return (lambda arr: t.from_numpy(arr).clone()), (a,), "torch.from_numpy(a).clone()"
        return (lambda arr, d: t.from_numpy(arr).to(d)), (a, self.dev(dev)), "torch.from_numpy(a).to(device)"

    def op_d2h(self, x: Any) -> Call:
        return (lambda t: t.cpu().numpy()), (x,), "x.cpu().numpy()"

    def op_h2d_pinned(self, a: np.ndarray, dev: Device) -> Call | None:
        """The best native upload: from a preallocated pinned host tensor (GPU only)."""
        t = self.torch
        if dev.kind != "gpu":
            return None
        src = t.from_numpy(a).pin_memory()
        d = self.dev(dev)
        return (lambda s: s.to(d, non_blocking=True)), (src,), \
            "pinned.to(device, non_blocking=True) (pinned source allocated beforehand)"

    def op_d2h_pinned(self, x: Any) -> Call | None:
        """The best native download: into a preallocated pinned host tensor (GPU only)."""
        t = self.torch
        if x.device.type != "cuda":
            return None
        dst = t.empty(x.shape, dtype=x.dtype, pin_memory=True)

        def down(x: Any) -> Any:
            dst.copy_(x, non_blocking=True)
            t.cuda.current_stream(x.device).synchronize()
            return dst.numpy()
        return down, (x,), "pinned.copy_(x, non_blocking=True); stream sync (pinned buffer allocated beforehand)"

    def set_precision(self, mode: str) -> dict[str, Any]:
        t = self.torch
        if mode in ("fp32", "tf32"):
            t.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            t.backends.cudnn.allow_tf32 = mode == "tf32"
        return {"torch.backends.cuda.matmul.allow_tf32": bool(t.backends.cuda.matmul.allow_tf32),
                "torch.backends.cudnn.allow_tf32": bool(t.backends.cudnn.allow_tf32),
                "torch.get_float32_matmul_precision()": t.get_float32_matmul_precision(),
                "torch.get_num_threads()": t.get_num_threads()}

    def save_precision(self) -> Any:
        t = self.torch
        return t.backends.cuda.matmul.allow_tf32, t.backends.cudnn.allow_tf32

    def restore_precision(self, state: Any) -> None:
        self.torch.backends.cuda.matmul.allow_tf32, self.torch.backends.cudnn.allow_tf32 = state

    def device_name(self, dev: Device) -> str:
        if dev.kind == "gpu":
            return self.torch.cuda.get_device_name(dev.index)
        return super().device_name(dev)


class JaxNative(Native):
    framework = "jax"

    def __init__(self, b: Any) -> None:
        super().__init__(b)
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp

    def dev(self, d: Device) -> Any:
        return self.b.to_native_device(d)

    def mm(self, dev: Device) -> Callable[[Any, Any], Any]:
        return self.jnp.matmul

    def op_to(self, x: Any, dev: Device) -> Call:
        return self.jax.device_put, (x, self.dev(dev)), "jax.device_put(x, device)"

    op_move_async = op_to  # device_put is asynchronous already

    def mover(self, dev: Device, non_blocking: bool = False) -> Callable[[Any], Any]:
        return functools.partial(self.jax.device_put, device=self.dev(dev))

    def op_copy(self, x: Any, dev: Device) -> Call:
        if self.b.device_of(x) == dev:
            return self.jnp.copy, (x,), "jnp.copy(x)"
        return self.jax.device_put, (x, self.dev(dev)), "jax.device_put(x, device)"

    def op_device_of(self, x: Any) -> Call:
        return operator.attrgetter("device"), (x,), "x.device"

    def op_sync(self, dev: Device, x: Any = None) -> Call | None:
        if x is None:
            return None
        return x.block_until_ready, (), "x.block_until_ready() (JAX has no device-level sync)"

    def op_wait(self, x: Any) -> Call:
        return x.block_until_ready, (), "x.block_until_ready()"

    def op_zeros(self, shape: tuple, dev: Device) -> Call:
        jnp = self.jnp
        return functools.partial(jnp.zeros, shape, jnp.float32, device=self.dev(dev)), (), \
            "jnp.zeros(shape, device=device)"

    def op_h2d(self, a: np.ndarray, dev: Device) -> Call:
        return self.jax.device_put, (a, self.dev(dev)), "jax.device_put(a, device)"

    def op_d2h(self, x: Any) -> Call:
        return np.asarray, (x,), "np.asarray(x)"

    def set_precision(self, mode: str) -> dict[str, Any]:
        if mode in ("fp32", "tf32"):
            self.jax.config.update("jax_default_matmul_precision", "highest" if mode == "fp32" else "tensorfloat32")
        return {"jax_default_matmul_precision": self.jax.config.jax_default_matmul_precision,
                "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                "jax_enable_x64": bool(self.jax.config.jax_enable_x64)}

    def save_precision(self) -> Any:
        return self.jax.config.jax_default_matmul_precision

    def restore_precision(self, state: Any) -> None:
        self.jax.config.update("jax_default_matmul_precision", state)

    def device_name(self, dev: Device) -> str:
        if dev.kind == "gpu":
            return str(self.dev(dev).device_kind)
        return super().device_name(dev)


class TensorflowNative(Native):
    framework = "tensorflow"

    def __init__(self, b: Any) -> None:
        super().__init__(b)
        import tensorflow as tf

        self.tf = tf

    def dev(self, d: Device) -> str:
        return {"gpu": "/GPU:", "cpu": "/CPU:"}.get(d.kind, "/GPU:") + str(d.index)

    def mm(self, dev: Device) -> Callable[[Any, Any], Any]:
        tf, name = self.tf, self.dev(dev)

        def matmul(a: Any, b: Any) -> Any:
            with tf.device(name):
                return tf.linalg.matmul(a, b)
        return matmul

    def op_to(self, x: Any, dev: Device) -> Call:
        tf = self.tf

        def identity_on(t: Any, name: str) -> Any:
            with tf.device(name):
                return tf.identity(t)
        return identity_on, (x, self.dev(dev)), "with tf.device(d): tf.identity(x)"

    op_move_async = op_to

    def op_copy(self, x: Any, dev: Device) -> Call:
        tf = self.tf

        def deep_copy_on(t: Any, name: str) -> Any:
            with tf.device(name):  # tf.identity may alias (same device, logical CPU devices): force a copy
                try:
                    return tf.raw_ops.DeepCopy(x=t)
                except tf.errors.NotFoundError:  # no DeepCopy kernel for this device/dtype
                    return tf.raw_ops.Snapshot(input=t)
        return deep_copy_on, (x, self.dev(dev)), "with tf.device(d): tf.raw_ops.DeepCopy(x=x)"

    def op_device_of(self, x: Any) -> Call:
        return operator.attrgetter("device"), (x,), "x.device"

    def op_sync(self, dev: Device, x: Any = None) -> Call | None:
        f = getattr(getattr(self.tf.test, "experimental", None), "sync_devices", None)
        return None if f is None else (f, (), "tf.test.experimental.sync_devices()")

    def op_wait(self, x: Any) -> Call | None:
        return self.op_sync(self.b.device_of(x))

    def op_zeros(self, shape: tuple, dev: Device) -> Call:
        tf = self.tf

        def zeros_on(s: tuple, name: str) -> Any:
            with tf.device(name):
                return tf.zeros(s, tf.float32)
        return zeros_on, (shape, self.dev(dev)), "with tf.device(d): tf.zeros(shape)"

    def op_h2d(self, a: np.ndarray, dev: Device) -> Call:
        tf = self.tf

        def constant_on(arr: np.ndarray, name: str) -> Any:
            with tf.device(name):
                return tf.identity(tf.constant(arr))  # identity: places it on d (constants start on host)
        return constant_on, (a, self.dev(dev)), "with tf.device(d): tf.identity(tf.constant(a))"

    def op_d2h(self, x: Any) -> Call:
        return (lambda t: t.numpy()), (x,), "x.numpy()"

    def set_precision(self, mode: str) -> dict[str, Any]:
        tf = self.tf
        if mode in ("fp32", "tf32"):
            tf.config.experimental.enable_tensor_float_32_execution(mode == "tf32")
        return {"tf.config.experimental.tensor_float_32_execution_enabled()":
                bool(tf.config.experimental.tensor_float_32_execution_enabled()),
                "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "")}

    def save_precision(self) -> Any:
        return self.tf.config.experimental.tensor_float_32_execution_enabled()

    def restore_precision(self, state: Any) -> None:
        self.tf.config.experimental.enable_tensor_float_32_execution(state)

    def device_name(self, dev: Device) -> str:
        if dev.kind == "gpu":
            try:
                gpu = self.tf.config.list_physical_devices("GPU")[dev.index]
                return str(self.tf.config.experimental.get_device_details(gpu).get("device_name", dev))
            except Exception:  # noqa: BLE001 - a label only
                return str(dev)
        return super().device_name(dev)


class MxnetNative(Native):
    framework = "mxnet"

    def __init__(self, b: Any) -> None:
        super().__init__(b)
        import mxnet as mx

        self.mx = mx

    def dev(self, d: Device) -> Any:
        return self.mx.gpu(d.index) if d.kind == "gpu" else self.mx.cpu(d.index)

    def mm(self, dev: Device) -> Callable[[Any, Any], Any]:
        return self.mx.nd.dot

    def op_to(self, x: Any, dev: Device) -> Call:
        return x.as_in_context, (self.dev(dev),), "x.as_in_context(ctx)"

    op_move_async = op_to

    def mover(self, dev: Device, non_blocking: bool = False) -> Callable[[Any], Any]:
        c = self.dev(dev)
        return lambda x: x.as_in_context(c)

    def op_copy(self, x: Any, dev: Device) -> Call:
        return x.copyto, (self.dev(dev),), "x.copyto(ctx)"

    def op_device_of(self, x: Any) -> Call:
        return operator.attrgetter("context"), (x,), "x.context"

    def op_sync(self, dev: Device, x: Any = None) -> Call:
        return self.mx.nd.waitall, (), "mx.nd.waitall()"

    def op_wait(self, x: Any) -> Call:
        return x.wait_to_read, (), "x.wait_to_read()"

    def op_zeros(self, shape: tuple, dev: Device) -> Call:
        mx = self.mx
        return functools.partial(mx.nd.zeros, shape, ctx=self.dev(dev), dtype="float32"), (), \
            "mx.nd.zeros(shape, ctx=ctx)"

    def op_h2d(self, a: np.ndarray, dev: Device) -> Call:
        mx = self.mx
        return (lambda arr, c: mx.nd.array(arr, ctx=c, dtype=arr.dtype)), (a, self.dev(dev)), \
            "mx.nd.array(a, ctx=ctx)"

    def op_d2h(self, x: Any) -> Call:
        return x.asnumpy, (), "x.asnumpy()"

    def set_precision(self, mode: str) -> dict[str, Any]:
        return {"MXNET_CUDA_ALLOW_TENSOR_CORE": os.environ.get("MXNET_CUDA_ALLOW_TENSOR_CORE", ""),
                "NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE", ""),
                "note": "MXNet has no run-time TF32 switch; fp32 GEMMs use cuBLAS default math"}


_CLASSES: dict[str, type[Native]] = {c.framework: c for c in
                                     (NumpyNative, TorchNative, JaxNative, TensorflowNative, MxnetNative)}


def native_for(b: Any) -> Native | None:
    """The native baseline for adapter ``b`` (by its framework), or None."""
    cls = _CLASSES.get(getattr(b, "framework", ""))
    if cls is None:
        return None
    try:
        return cls(b)
    except ImportError:
        return None
