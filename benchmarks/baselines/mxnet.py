"""The mxnet baseline for ``multidev bench``: mxnet's own calls for every row."""
from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from multidev import Device

from ..baseline import Call, Native


class MxnetNative(Native):
    framework = "mxnet"
    #: suite ``startup``: the framework's import and first call, in a fresh interpreter
    startup_code = ("import numpy as np; np.bool = np.bool_; import mxnet as mx; "  # (as the adapter does for 1.9.1)
                    "mx.nd.zeros(1).wait_to_read()")
    env_vars = ("MXNET_ENGINE_TYPE", "MXNET_CUDA_ALLOW_TENSOR_CORE", "MXNET_CPU_WORKER_NTHREADS")

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

    def op_export_dlpack(self, x: Any) -> Call:
        """MXNet's own DLPack export (NDArray has no ``__dlpack__``): a fresh capsule per call,
        which the consumer's from_dlpack takes (the native side of convert(x, other))."""
        return self.mx.nd.to_dlpack_for_read, (x,), "mx.nd.to_dlpack_for_read(x)"

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

    def op_allreduce_framework(self, bufs: list[Any]) -> Call | None:
        """MXNet's own allreduce (suite ``collectives``): a ``'local'`` KVStore (``'device'`` with a
        GPU) made once, ``pushpull`` of every buffer into new arrays, one per buffer's context (the
        out-of-place contract md's allreduce keeps)."""
        mx = self.mx
        if len(bufs) < 2:
            return None
        gpu = any(b.context.device_type == "gpu" for b in bufs)
        kv = mx.kv.create("device" if gpu else "local")
        kv.init(0, mx.nd.zeros(bufs[0].shape, ctx=bufs[0].context, dtype=bufs[0].dtype))

        def allreduce(bufs: list[Any], kv: Any = kv) -> list[Any]:
            outs = [mx.nd.empty(b.shape, ctx=b.context, dtype=b.dtype) for b in bufs]
            kv.pushpull(0, bufs, out=outs)
            return outs
        return allreduce, (list(bufs),), "kv = mx.kv.create('local'); kv.pushpull(0, bufs, out=[new arrays])"

    def set_precision(self, mode: str) -> dict[str, Any]:
        return {"MXNET_CUDA_ALLOW_TENSOR_CORE": os.environ.get("MXNET_CUDA_ALLOW_TENSOR_CORE", ""),
                "NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE", ""),
                "note": "MXNet has no run-time TF32 switch; fp32 GEMMs use cuBLAS default math"}

    # -- D2L 12.1 (suite "compile"): the MLP and Gluon's hybridize ------------------------------
    def mlp_d2l(self, weights: list[np.ndarray], dev: Device) -> Callable[[], Any]:
        """Fresh Gluon ``HybridSequential`` MLPs (Dense + relu, as D2L) holding ``weights``, on ``dev``."""
        mx = self.mx
        nn = mx.gluon.nn
        ctx = self.dev(dev)

        def make() -> Any:
            net = nn.HybridSequential()
            n = len(weights) // 2
            for i in range(n):
                w = weights[2 * i]
                net.add(nn.Dense(w.shape[1], activation="relu" if i < n - 1 else None, in_units=w.shape[0]))
            net.initialize(ctx=ctx)
            for i, layer in enumerate(net):
                layer.weight.set_data(mx.nd.array(weights[2 * i].T, ctx=ctx))
                layer.bias.set_data(mx.nd.array(weights[2 * i + 1], ctx=ctx))
            return net
        return make

    def compiled_d2l(self, make: Callable[[], Any], x: Any, dev: Device, quick: bool) -> dict[str, Any]:
        """``hybridize()`` (D2L's) and ``hybridize(static_alloc=True, static_shape=True)``, each on a fresh net."""
        a, b = make(), make()
        a.hybridize()
        b.hybridize(static_alloc=True, static_shape=True)
        return {"hybridize()": a, "hybridize(static_alloc=True, static_shape=True)": b}

    # -- suite "models": the framework's own model and its move ----------------------------------
    def model_d2l(self, kind: str, dev: Device, seed: int = 0) -> Any:
        """D2L's LeNet (``"lenet"``) or an MLP (``"mlp:1024-4096-4096-10"``) as an initialized
        Gluon ``HybridSequential`` on ``dev``, seeded."""
        mx = self.mx
        nn = mx.gluon.nn
        mx.random.seed(seed)
        net = nn.HybridSequential()
        if kind == "lenet":
            net.add(nn.Conv2D(6, 5, padding=2, in_channels=1, activation="sigmoid"), nn.AvgPool2D(2, 2),
                    nn.Conv2D(16, 5, in_channels=6, activation="sigmoid"), nn.AvgPool2D(2, 2),
                    nn.Dense(120, in_units=400, activation="sigmoid"), nn.Dense(84, in_units=120, activation="sigmoid"),
                    nn.Dense(10, in_units=84))
        else:
            sizes = [int(s) for s in kind.split(":")[1].split("-")]
            for i in range(len(sizes) - 1):
                net.add(nn.Dense(sizes[i + 1], in_units=sizes[i], activation="relu" if i < len(sizes) - 2 else None))
        net.initialize(ctx=self.dev(dev))
        return net

    def op_model_to(self, model: Any, dev: Device) -> Call:
        """``net.collect_params().reset_ctx(ctx)``: Gluon's way to put a block on a context."""
        return (lambda m, c: m.collect_params().reset_ctx(c)), (model, self.dev(dev)), \
            "net.collect_params().reset_ctx(ctx)"
