"""The tensorflow baseline for ``multidev bench``: tensorflow's own calls for every row."""
from __future__ import annotations

import operator
import os
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from multidev import Device

from ..baseline import Call, Native


class TensorflowNative(Native):
    framework = "tensorflow"
    #: suite ``startup``: the framework's import and first call, in a fresh interpreter
    startup_code = "import tensorflow as tf; tf.zeros(1)"
    env_vars = ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR")

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

    #: group and instance keys of the baseline's own collectives, far from tf.distribute's and md's
    _keys: ClassVar[dict[Any, int]] = {}

    def op_allreduce_framework(self, bufs: list[Any]) -> Call | None:
        """TF's own allreduce (suite ``collectives``): ``tf.raw_ops.CollectiveReduceV2`` on each
        buffer's device, launched together in one ``tf.function`` (with per-device ordering tokens,
        as tf.distribute does), out of place."""
        tf = self.tf
        if len(bufs) < 2:
            return None
        names = tuple(x.device for x in bufs)
        keys = type(self)._keys
        group = keys.setdefault(names, 0x42420000 + len(keys))
        sig = (names, tuple(bufs[0].shape), bufs[0].dtype.name)
        instance = keys.setdefault(sig, 0x1000 + len(keys))  # one instance key per shape: TF's rule
        toks = []
        for name in names:
            with tf.init_scope(), tf.device(name):
                toks.append(tf.Variable(0.0, trainable=False))
        with tf.device("/device:CPU:0"):
            ikey = tf.constant(instance, tf.int32)
        n = len(names)

        @tf.function(autograph=False)
        def allreduce(ins: list[Any]) -> list[Any]:
            outs = []
            for name, x, tok in zip(names, ins, toks):
                with tf.device(name):
                    outs.append(tf.raw_ops.CollectiveReduceV2(
                        input=x, group_size=n, group_key=group, instance_key=ikey, ordering_token=[tok.handle],
                        merge_op="Add", final_op="Id", communication_hint="auto"))
            return outs
        return allreduce, (list(bufs),), "tf.function: tf.raw_ops.CollectiveReduceV2 on every device (TF's own)"

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

    # -- D2L 12.1 (suite "compile"): the MLP and TF's own compilers -----------------------------
    def mlp_d2l(self, weights: list[np.ndarray], dev: Device) -> Callable[[], Any]:
        """Fresh Keras ``Sequential`` MLPs (Dense + relu, as D2L) holding ``weights``, built on ``dev``."""
        tf = self.tf
        name = self.dev(dev)

        def make() -> Any:
            n = len(weights) // 2
            layers = [tf.keras.layers.Dense(weights[2 * i].shape[1], activation="relu" if i < n - 1 else None)
                      for i in range(n)]
            net = tf.keras.Sequential(layers)
            with tf.device(name):
                net(tf.zeros((1, weights[0].shape[0])))  # build the variables on the device
                net.set_weights(weights)
            return net
        return make

    def compiled_d2l(self, make: Callable[[], Any], x: Any, dev: Device, quick: bool) -> dict[str, Any]:
        """``tf.function`` (D2L's) and ``tf.function(jit_compile=True)`` (XLA), each on a fresh net."""
        tf = self.tf
        return {"tf.function": tf.function(make()),
                "tf.function(jit_compile=True)": tf.function(make(), jit_compile=True)}
