"""The native allreduce for TensorFlow (:class:`~multidev.adapter.SupportsNativeCollectives`):
``CollectiveReduceV2``, one op per device launched together in one ``tf.function``."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from multidev.adapter import CapabilityError, Concern, Device, SupportsNativeCollectives

from .core import TensorflowCore

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


class TensorflowCollectives(Concern, SupportsNativeCollectives):
    """TF's collective all-reduce over the inputs' devices, one traced function per (devices, op, dtype)."""

    core: TensorflowCore

    def __init__(self, core: TensorflowCore) -> None:
        super().__init__(core)
        self._lock = threading.Lock()
        self._tokens: dict[Device, Any] = {}  # per-device ordering tokens of native_allreduce
        self._groups: dict[tuple[Device, ...], int] = {}
        self._fns: dict[tuple[Any, ...], Any] = {}
        self._group_locks: dict[tuple[Device, ...], threading.Lock] = {}
        self._instance_keys: dict[tuple[Any, ...], Any] = {}  # call signature -> instance key tensor

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        """TF's collective all-reduce (``CollectiveReduceV2``, one op per device launched together in
        one tf.function; ring on CPUs, NCCL hinted on GPUs); out of place, result i on xs[i]'s device.

        Ops sum, mean (floating dtypes), max, min, prod. Computes natively in bfloat16, float16,
        float32, float64, int32, int64; bool and narrower integers are widened and cast back (exact:
        results wrap as NumPy's do); complex sum/mean reduce (real, imag) pairs and uint64 reduces
        as int64 (bitcasts); complex prod raises CapabilityError. Devices must be all CPUs or all
        GPUs.
        """
        tf = self.core.tf
        xs = list(xs)
        if op not in _MERGE_OP:
            raise CapabilityError(f"tensorflow native_allreduce has no op {op!r}; use one of {', '.join(_MERGE_OP)}")
        devs = tuple(self.core.device_of(x) for x in xs)
        if len({d.kind for d in devs}) > 1:
            raise CapabilityError("tensorflow native_allreduce cannot mix CPU and GPU devices in one "
                                  "collective group; use algorithm='naive'")
        dtype = self.core.dtype_of(xs[0])
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
        if len(xs) == 1 or 0 in self.core.shape_of(xs[0]):
            # A group of one would forward the input buffer (results never alias inputs), and
            # CollectiveReduceV2 segfaults on tensors with no elements: both reduce to a copy.
            return [self.core.copy(x, d) for x, d in zip(xs, devs)]
        merge, final = _MERGE_OP[op], ("Div" if op == "mean" else "Id")
        if dtype == "bool":  # over {0, 1}: or = max, and = min
            merge = "Max" if op in ("sum", "max") else "Min"
        flip = dtype == "uint64" and op in ("max", "min")
        ins = []
        for x, d in zip(xs, devs):
            with tf.device(self.core.to_native_device(d)):
                v = self.core._read(x)
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
        # sees, so a fresh key per call grew the process's memory with every call; and one key
        # reused for another shape or dtype aborts that collective and every later one. Calls of one
        # group are serialized so that no two share a key concurrently.
        sig = (devs, tuple(self.core.shape_of(ins[0])), ins[0].dtype.name, merge, final)
        with self._lock:
            group_lock = self._group_locks.setdefault(devs, threading.Lock())
            instance = self._instance_keys.get(sig)
            if instance is None:
                with tf.device(self.core.to_native_device(Device("cpu", 0))):
                    instance = tf.constant(len(self._instance_keys) % (2**31 - 2) + 1, dtype=tf.int32)
                self._instance_keys[sig] = instance
        with group_lock:
            outs = fn(ins, instance)
        nd = self.core.to_native_dtype(dtype)
        res = []
        for y, d in zip(outs, devs):
            with tf.device(self.core.to_native_device(d)):
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
            res.append(self.core._placed(y, d, "native_allreduce"))
        return res

    def _collective_fn(self, devs: tuple[Device, ...], merge: str, final: str, dtype: Any) -> Any:
        """A cached tf.function launching one CollectiveReduceV2 per device, concurrently; traced
        once per (devices, op, dtype), for every shape."""
        tf = self.core.tf
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
                    with tf.init_scope(), tf.device(self.core.to_native_device(d)):
                        self._tokens[d] = tf.Variable(0.0, trainable=False)
                tokens.append(self._tokens[d])
            names = [self.core.to_native_device(d) for d in devs]
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
