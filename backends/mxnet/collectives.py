"""The native allreduce for MXNet (:class:`~multidev.adapter.SupportsNativeCollectives`): sums
through a KVStore, the other ops on MXNet's engine."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from multidev.adapter import CapabilityError, Concern, SupportsNativeCollectives

from ._common import FLOATS
from .core import MxnetCore

#: KVStores kept for native_allreduce, one per (devices, shape, dtype), least recently used dropped.
_KVSTORES = 16


class MxnetCollectives(Concern, SupportsNativeCollectives):
    """KVStores kept per (contexts, shape, dtype) for sums, pairwise folds for max/min/prod."""

    core: MxnetCore

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
        dtype = self.core.dtype_of(xs[0])
        if op == "mean" and dtype not in FLOATS:
            raise CapabilityError(f"mxnet backend: mean of {dtype} tensors is refused; cast to a "
                                  "floating dtype first")
        if dtype == "bool":
            op = {"sum": "max", "prod": "min"}.get(op, op)  # NumPy: bool + is "or", bool * is "and"
        with self.core._scope():
            ns = [self.core._nd(x) for x in xs]
            if dtype == "bool":  # KVStore and arithmetic refuse bool (KVStore fails asynchronously)
                ns = [n.astype("int32") for n in ns]
            if op in ("sum", "mean"):
                outs = self._kvstore_sum(ns, any(self.core.device_of(x).is_gpu for x in xs))
            else:
                fn = self.core._binary(op)
                acc = ns[0]
                for n in ns[1:]:
                    acc = fn(acc, n.as_in_context(ns[0].context))
                if len(ns) == 1:
                    acc = acc.copy()
                outs = [acc] + [acc.copyto(n.context) for n in ns[1:]]
            if dtype == "bool":
                outs = [o.astype("bool") for o in outs]
            if op == "mean":
                outs = [self.core.divide(o, len(xs)) for o in outs]
            return [self.core._like(o, x) for o, x in zip(outs, xs)]

    def _kvstore_sum(self, ns: list[Any], gpu: bool) -> list[Any]:
        """Sum legacy NDArrays on distinct contexts through a KVStore; new outputs.

        One store per (contexts, shape, dtype), reused call after call as Gluon's Trainer reuses
        its own: a store created per call and dropped while its push/pull was still queued
        crashed MXNet's engine in long loops (SIGFPE, SIGSEGV, heap corruption). A store is only
        ever dropped (least recently used, beyond _KVSTORES, or at exit) after ``waitall``."""
        mx = self.core.mx
        shape, mdt = tuple(ns[0].shape), ns[0].dtype
        key = (gpu, tuple((n.context.device_typeid, n.context.device_id) for n in ns), shape, str(mdt))
        with self.core._kv_lock:
            kv = self.core._kv.get(key)
            if kv is None:
                if len(self.core._kv) >= _KVSTORES:
                    mx.nd.waitall()
                    self.core._kv.popitem(last=False)
                kv = mx.kv.create("device" if gpu else "local")
                kv.init(0, mx.nd.zeros(shape, ctx=ns[0].context, dtype=mdt))
                self.core._kv[key] = kv
            else:
                self.core._kv.move_to_end(key)
            outs = [mx.nd.empty(shape, ctx=n.context, dtype=mdt) for n in ns]
            kv.pushpull(0, ns, out=outs)
        return outs

    def drop_kvstores(self) -> None:
        """At exit (before MXNet's own shutdown hook): drain the engine, then drop the stores."""
        with self.core._kv_lock:
            if self.core._kv:
                try:
                    self.core.mx.nd.waitall()
                except Exception:  # noqa: BLE001 - a pending async error must not break exit
                    pass
                self.core._kv.clear()
