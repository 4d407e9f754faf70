"""D2L "GPUs", with multidev: which devices there are, tensors made on a device, D2L's ``copyto``
(``md.copy``: always a new buffer) against ``as_in_ctx`` (``md.to``: nothing happens when the
tensor is there already), a model put on a device with ``md.to(net, dev)``, the framework's own
calls on a multidev device (``md.native_device``), and framework code inside ``md.device_scope``.

The book's GPU 1 is the second device here: a second GPU, or a second (virtual) CPU device on a
machine without one, so the same program runs everywhere.

    python -m multidev.examples.d2l.use_gpu                       # every installed backend
    python -m multidev.examples.d2l.use_gpu --backend torch       # on cuda:0 where there is a GPU
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from .common import Report, pick_devices
from .common import main as common_main


def framework_part(md: Any, name: str, dev: Any, other: Any, rep: Report) -> None:
    """The framework's own objects on a multidev device: a native call, code in a scope, a model."""
    x = md.ones((2, 3), device=dev, backend=name)
    if name == "torch":
        import torch

        t = torch.ones(2, 3, device=md.native_device(dev, "torch"))      # torch's call, md's device
        rep.check("native call on native_device(dev)", md.device_of(t) == dev, f"torch.ones -> {md.device_of(t)}")
        with md.device_scope(dev, backend="torch"):                      # torch's default device too
            u = torch.zeros(2)
        rep.check("framework code in device_scope lands there", md.device_of(u) == dev, md.device_of(u))
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(3, 1))
        moved = md.to(net, dev)                                         # D2L: net = net.to(device=try_gpu())
        rep.check("md.to(net, dev) moves the module in place", moved is net and md.device_of(net) == dev,
                  f"same module: {moved is net}, on {md.device_of(net)}")
        rep.check("the model computes on its device", md.device_of(net(x)) == dev)
        rep.check("a resident module is a no-op", md.to(net, dev) is net and next(net.parameters()) is
                  next(moved.parameters()))
    elif name == "jax":
        import dataclasses

        import jax
        import jax.numpy as jnp

        t = jax.device_put(np.ones((2, 3), np.float32), md.native_device(dev, "jax"))
        rep.check("native call on native_device(dev)", md.device_of(t) == dev, f"jax.device_put -> {md.device_of(t)}")
        with md.device_scope(dev, backend="jax"):                        # jax.default_device
            u = jnp.zeros(2)
        rep.check("framework code in device_scope lands there", md.device_of(u) == dev, md.device_of(u))

        @jax.tree_util.register_dataclass
        @dataclasses.dataclass
        class Linear:                                                    # a flax/equinox-style module
            w: Any
            b: Any
            act: Any = dataclasses.field(default=jax.nn.relu, metadata={"static": True})

            def __call__(self, x: Any) -> Any:
                return self.act(x @ self.w + self.b)

        net = Linear(jnp.ones((3, 1)), jnp.zeros(1))
        moved = md.to(net, dev)                                         # a new tree: JAX arrays are immutable
        rep.check("md.to(net, dev) puts every leaf there, static fields kept",
                  md.device_of(moved) == dev and moved.act is jax.nn.relu and type(moved) is Linear,
                  md.device_of(moved))
        rep.check("the model computes on its device", md.device_of(moved(x)) == dev)
        rep.check("a resident tree is itself leaf by leaf", md.to(moved, dev).w is moved.w)
    elif name == "tensorflow":
        import keras
        import tensorflow as tf

        with tf.device(md.native_device(dev, "tensorflow")):             # TF's scope, md's device
            t = tf.ones((2, 3))
        rep.check("native call on native_device(dev)", md.device_of(t) == dev, f"tf.ones -> {md.device_of(t)}")
        with md.device_scope(dev, backend="tensorflow"):                 # tf.device too
            u = tf.zeros(2)
            net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])   # its variables are made here
        rep.check("framework code in device_scope lands there", md.device_of(u) == dev, md.device_of(u))
        rep.check("a model built in the scope lives there", md.device_of(net) == dev and md.to(net, dev) is net,
                  md.device_of(net))
        rep.check("the model computes on its device", md.device_of(net(x)) == dev)
        if other != dev:
            try:
                md.to(net, other)
                refused = ""
            except md.CapabilityError as e:                              # TF variables never move
                refused = str(e)
            rep.check("moving a Keras model is refused, naming the fix", "md.copy" in refused, refused[:120])
            clone = md.copy(net, other)                                  # clone_model under tf.device
            same = np.allclose(md.to_numpy(clone(md.to(x, other))), md.to_numpy(net(x)))
            rep.check("md.copy(net, other) clones it there with the weights", md.device_of(clone) == other and same,
                      md.device_of(clone))
    elif name == "mxnet":
        import mxnet as mx

        t = mx.nd.ones((2, 3), ctx=md.native_device(dev, "mxnet"))
        rep.check("native call on native_device(dev)", md.device_of(t) == dev, f"mx.nd.ones -> {md.device_of(t)}")
        with md.device_scope(dev, backend="mxnet"):                      # the default mx.Context
            u = mx.nd.zeros(2)
        rep.check("framework code in device_scope lands there", md.device_of(u) == dev, md.device_of(u))
        net = mx.gluon.nn.Dense(1, in_units=3)
        net.initialize(ctx=mx.cpu(0))
        moved = md.to(net, dev)                                         # collect_params().reset_ctx
        rep.check("md.to(net, dev) moves the block in place", moved is net and md.device_of(net) == dev,
                  md.device_of(net))
        rep.check("the model computes on its device", md.device_of(net(x)) == dev)
    elif name == "cupy":
        import cupy

        with md.native_device(dev, "cupy"):                             # a cupy.cuda.Device
            t = cupy.ones((2, 3))
        rep.check("native call on native_device(dev)", md.device_of(t) == dev, md.device_of(t))
    else:  # NumPy (and any array-API library): no models; a dict of parameters is the model
        net = {"w": md.ones((3, 1), backend=name), "b": md.zeros(1, backend=name)}
        moved = md.to(net, dev)
        rep.check("md.to of a dict of parameters keeps the dict", type(moved) is dict and md.device_of(moved) == dev,
                  md.device_of(moved))
        rep.check("native_device of a NumPy device is the Device itself", md.native_device(dev, name) == dev)


def run(md: Any, name: str, counts: list[int], args: argparse.Namespace, rep: Report) -> None:
    devs = md.devices(backend=name)
    dev = md.try_gpu(backend=name)                                       # GPU 0, or cpu:0
    rep.figure("devices", [str(d) for d in devs])
    rep.figure("num_gpus", md.num_gpus(backend=name))
    rep.check("try_gpu() is GPU 0 or cpu:0", dev == (next((d for d in devs if d.is_gpu), md.Device("cpu", 0))), dev)
    rep.check("try_gpu(10) falls back to cpu:0", md.try_gpu(10, backend=name) == md.Device("cpu", 0))
    every = md.try_all_gpus(backend=name)
    rep.check("try_all_gpus() is every GPU, or [cpu:0]", every == ([d for d in devs if d.is_gpu] or
                                                                   [md.Device("cpu", 0)]), every)
    # By default tensors are made on the CPU ...
    x = md.asarray([1.0, 2.0, 3.0], backend=name)
    rep.check("tensors are made on cpu:0 by default", md.device_of(x) == md.Device("cpu", 0), md.device_of(x))
    # ... or on the device asked for.
    X = md.ones((2, 3), device=dev, backend=name)
    rep.check("X = ones(..., device=try_gpu()) is there", md.device_of(X) == dev, md.device_of(X))
    # The book's second GPU: the second device (GPUs first, then CPU devices).
    both = pick_devices(md, name, 2)
    other = both[-1]
    Y = md.rand((2, 3), device=other, backend=name, seed=0)
    Z = md.copy(X, other)                                                # D2L: Z = X.cuda(1) / X.copyto(gpu(1))
    rep.check("copy(X, other) puts a new tensor there, X unchanged",
              md.device_of(Z) == other and md.device_of(X) == dev and Z is not X, f"Z on {md.device_of(Z)}")
    total = Y + Z                                                        # both on `other`: the sum is there too
    if name == "tensorflow" and md.device_of(total) != other:
        rep.note(f"TensorFlow ran Y + Z on {md.device_of(total)}: eager TF computes on its default device, not "
                 "where the inputs are; inside md.device_scope(dev, backend='tensorflow') it computes on dev")
        with md.device_scope(other, backend=name):
            total = Y + Z
    rep.check("Y + Z computes on their device", md.device_of(total) == other and
              np.allclose(md.to_numpy(total), md.to_numpy(Y) + 1.0), md.device_of(total))
    rep.check("to(Z, its device) is Z itself (as_in_ctx: no copy)", md.to(Z, other) is Z)
    W = md.copy(Z)                                                       # copyto on the same device: a new buffer
    rep.check("copy(Z) is always a new buffer, on Z's device",
              W is not Z and md.device_of(W) == other and np.array_equal(md.to_numpy(W), md.to_numpy(Z)))
    if other != dev:
        moved = md.to(X, other)
        rep.check("to(X, other) moves when X is elsewhere", moved is not X and md.device_of(moved) == other)
    batch = {"X": X, "labels": [md.zeros(2, device=dev, backend=name)]}
    there = md.to(batch, dev)                                            # a structure: each leaf as to() treats it
    rep.check("to() of a dict of tensors: structure kept, resident leaves the same objects",
              there["X"] is X and there["labels"][0] is batch["labels"][0] and md.device_of(there) == dev)
    framework_part(md, name, dev, other, rep)
    md.synchronize()


def main(argv: list[str] | None = None) -> int:
    return common_main("use_gpu", __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
