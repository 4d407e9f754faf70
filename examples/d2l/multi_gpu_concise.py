"""D2L 12.6 "Concise Implementation for Multiple GPUs", with multidev: the framework's own model
(a torch ``nn.Module``, a Gluon block, a Keras model, a JAX pytree model: a class registered with
``jax.tree_util``, and flax and equinox models where those are installed; on NumPy a dict of
arrays) put on a device with ``md.to(net, dev)``, its parameters replicated with
``md.replicate``, and trained data-parallel with ``md.train_batch``, the loss calling the model
with the replica's parameters (``torch.func.functional_call``, ``keras.Model.stateless_call``,
Gluon's ``hybrid_forward``, the pytree rebuilt from its leaves). After training, the model itself
takes the trained parameters and predicts what the replicas predict, and ``md.copy(net, dev)``
gives an independent model on another device that predicts the same.

This is the portable model path: ``md.to`` / ``md.copy`` for the model, its parameters as a list
for ``md.replicate`` and ``md.train_batch``. The model is the same LeNet as in
``multi_gpu_scratch`` (the same initial weights), so the same tolerances apply and are imported
from there: N devices learn what one device learns.

    python -m multidev.examples.d2l.multi_gpu_concise --backend torch,tensorflow --devices 2
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .common import (
    CLASSES,
    Report,
    accuracy,
    digits,
    lenet_weights,
    mixed,
    mlp_weights,
    numpy_mlp_forward,
    numpy_mlp_grad,
    pick_devices,
)
from .common import main as common_main
from .multi_gpu_scratch import (
    ACCURACY_TOLERANCE,
    EPOCHS,
    LENET_LR,
    LOSS_RTOL,
    LR,
    MIXED_LOSS_RTOL,
    QUICK_N_EPOCHS,
    Model,
    check_in_sync,
    check_learning,
    compare,
    report_runs,
    train,
)

#: The model's own forward pass against the functional one, after loading the trained parameters.
PREDICT_RTOL = 1e-4


@dataclass
class Net:
    """A framework's model for this program."""

    label: str
    net: Any                                           # the framework's model, on the first device
    params: Callable[[], list[Any]]                    # its parameters, in the functional call's order
    model: Model                                       # what multi_gpu_scratch.train needs
    predict: Callable[[Any, Any], Any]                 # (a model, X) -> logits, the model called itself
    load: Callable[[list[Any]], None]                  # trained parameters -> into the model


def torch_net(md: Any, dev: Any) -> Net:
    import torch
    import torch.nn.functional as F
    from torch import nn

    net = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                        nn.Conv2d(6, 16, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                        nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, CLASSES))
    with torch.no_grad():  # the shared initial weights (nn.Linear keeps out x in)
        for p, w in zip(net.parameters(), lenet_weights()):
            p.copy_(torch.from_numpy(w.T.copy() if w.ndim == 2 else w))
    net = md.to(net, dev)                                   # D2L: net.to(devices[0]); the same module
    names = [n for n, _ in net.named_parameters()]

    def forward(ps: list[Any], X: Any) -> Any:
        return torch.func.functional_call(net, dict(zip(names, ps)), (X,))

    def loss(ps: list[Any], X: Any, y: Any) -> Any:
        return F.cross_entropy(forward(ps, X), y, reduction="sum")

    def load(trained: list[Any]) -> None:
        with torch.no_grad():
            for p, t in zip(net.parameters(), trained):
                p.copy_(t)

    model = Model(lambda d: list(net.parameters()), forward, None, {"loss": loss})
    return Net("torch.nn.Sequential", net, lambda: list(net.parameters()), model, lambda n, X: n(X), load)


def keras_net(md: Any, dev: Any) -> Net:
    import keras
    import tensorflow as tf

    with md.device_scope(dev, backend="tensorflow"):        # TF variables live where they are made
        net = keras.Sequential([keras.Input((8, 8, 1)),
                                keras.layers.Conv2D(6, 3, padding="same", activation="relu"),
                                keras.layers.AveragePooling2D(2),
                                keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                                keras.layers.AveragePooling2D(2),
                                keras.layers.Permute((3, 1, 2)), keras.layers.Flatten(),  # NCHW order, as the others
                                keras.layers.Dense(32, activation="relu"), keras.layers.Dense(CLASSES)])
    net.set_weights([w.transpose(2, 3, 1, 0) if w.ndim == 4 else w for w in lenet_weights()])
    net = md.to(net, dev)                                   # resident: the model itself (a move is refused)

    def forward(ps: list[Any], X: Any) -> Any:
        out, _ = net.stateless_call(ps, net.non_trainable_variables, X)
        return out

    def loss(ps: list[Any], X: Any, y: Any) -> Any:
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=forward(ps, X)))

    def load(trained: list[Any]) -> None:
        for v, t in zip(net.trainable_variables, trained):
            v.assign(t)

    def params() -> list[Any]:
        return [v.value if hasattr(v, "value") and isinstance(v.value, tf.Variable) else v
                for v in net.trainable_variables]

    model = Model(lambda d: params(), forward, None, {"loss": loss}, images=lambda X: X.transpose(0, 2, 3, 1),
                  labels=lambda y: y.astype(np.int32))
    return Net("keras.Sequential", net, params, model, lambda n, X: n(X), load)


def gluon_net(md: Any, dev: Any) -> Net:
    import mxnet as mx
    from mxnet import nd
    from mxnet.gluon import nn

    net = nn.HybridSequential()
    net.add(nn.Conv2D(6, 3, padding=1, in_channels=1, activation="relu"), nn.AvgPool2D(2),
            nn.Conv2D(16, 3, padding=1, in_channels=6, activation="relu"), nn.AvgPool2D(2),
            nn.Dense(32, in_units=64, activation="relu"), nn.Dense(CLASSES, in_units=32))
    net.initialize(ctx=mx.cpu(0))
    for p, w in zip(net.collect_params().values(), lenet_weights()):
        p.set_data(nd.array(w.T if w.ndim == 2 else w))  # Dense keeps out x in
    net = md.to(net, dev)                                   # D2L: net.collect_params().reset_ctx(ctx)

    def forward(ps: list[Any], X: Any) -> Any:  # each layer's hybrid_forward with the given arrays
        it = iter(ps)
        h = X
        for layer in net:
            kw = {name[len(layer.prefix):]: next(it) for name in layer.collect_params()}
            h = layer.hybrid_forward(nd, h, **kw)
        return h

    def loss(ps: list[Any], X: Any, y: Any) -> Any:
        return -nd.pick(nd.log_softmax(forward(ps, X)), y).sum()

    def params() -> list[Any]:
        return [p.data() for p in net.collect_params().values()]

    def load(trained: list[Any]) -> None:
        for p, t in zip(net.collect_params().values(), trained):
            p.set_data(t)

    model = Model(lambda d: params(), forward, None, {"loss": loss}, labels=lambda y: y.astype(np.float32))
    return Net("gluon.nn.HybridSequential", net, params, model, lambda n, X: n(X), load)


def jax_nets(md: Any, dev: Any) -> list[Net]:
    """The registered-class model always; flax (linen) and equinox models where installed."""
    import dataclasses
    import importlib.util

    import jax
    import jax.numpy as jnp

    def ce(logits: Any, y: Any) -> Any:
        return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1).sum()

    def conv(x: Any, w: Any, b: Any) -> Any:
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + b[None, :, None, None]

    def pool(x: Any) -> Any:
        n, c, h, w = x.shape
        return x.reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class LeNet:                                            # a flax.struct / equinox-style module
        w1: Any
        b1: Any
        w2: Any
        b2: Any
        w3: Any
        b3: Any
        w4: Any
        b4: Any
        act: Any = dataclasses.field(default=jax.nn.relu, metadata={"static": True})

        def __call__(self, X: Any) -> Any:
            h = pool(self.act(conv(X, self.w1, self.b1)))
            h = pool(self.act(conv(h, self.w2, self.b2)))
            return self.act(h.reshape(h.shape[0], -1) @ self.w3 + self.b3) @ self.w4 + self.b4

    def as_net(label: str, tree: Any, call: Callable[[Any, Any], Any]) -> Net:
        """A pytree model (``tree``) and how to call it: the portable path, leaves in and out."""
        box = {"tree": md.to(tree, dev)}                    # every array leaf on dev, static parts kept
        treedef = jax.tree_util.tree_structure(box["tree"])

        def forward(ps: list[Any], X: Any) -> Any:
            return call(jax.tree_util.tree_unflatten(treedef, ps), X)

        def params() -> list[Any]:
            return jax.tree_util.tree_leaves(box["tree"])

        def load(trained: list[Any]) -> None:
            box["tree"] = jax.tree_util.tree_unflatten(treedef, list(trained))

        model = Model(lambda d: params(), forward, None, {"loss": lambda ps, X, y: ce(forward(ps, X), y)},
                      labels=lambda y: y.astype(np.int32))
        return Net(label, box, params, model, lambda b, X: call(b["tree"], X), load)

    nets = [as_net("jax.tree_util-registered LeNet", LeNet(*[jnp.asarray(w) for w in lenet_weights()]),
                   lambda m, X: m(X))]
    if importlib.util.find_spec("flax") is not None:
        import flax.linen as fnn

        class FlaxLeNet(fnn.Module):
            @fnn.compact
            def __call__(self, x: Any) -> Any:  # NCHW in, as the others; flax convolves NHWC
                x = jnp.transpose(x, (0, 2, 3, 1))
                x = fnn.avg_pool(fnn.relu(fnn.Conv(6, (3, 3), padding="SAME")(x)), (2, 2), (2, 2))
                x = fnn.avg_pool(fnn.relu(fnn.Conv(16, (3, 3), padding="SAME")(x)), (2, 2), (2, 2))
                x = jnp.transpose(x, (0, 3, 1, 2)).reshape(x.shape[0], -1)
                x = fnn.relu(fnn.Dense(32)(x))  # created first: Dense_0
                return fnn.Dense(CLASSES)(x)

        flax_model = FlaxLeNet()
        variables = flax_model.init(jax.random.key(0), jnp.zeros((1, 1, 8, 8)))
        w = lenet_weights()  # the shared initial weights, in flax's layouts (kernels HWIO, dense in x out)
        given = {"Conv_0": (w[0].transpose(2, 3, 1, 0), w[1]), "Conv_1": (w[2].transpose(2, 3, 1, 0), w[3]),
                 "Dense_0": (w[4], w[5]), "Dense_1": (w[6], w[7])}
        params = dict(variables["params"])
        for layer, (kernel, bias) in given.items():
            assert params[layer]["kernel"].shape == kernel.shape, (layer, params[layer]["kernel"].shape)
            params[layer] = {"kernel": jnp.asarray(kernel), "bias": jnp.asarray(bias)}
        nets.append(as_net("flax.linen LeNet", {**variables, "params": params},
                           lambda v, X: flax_model.apply(v, X)))
    if importlib.util.find_spec("equinox") is not None:
        import equinox as eqx

        keys = jax.random.split(jax.random.key(0), 4)
        eq_model = eqx.nn.Sequential([
            eqx.nn.Conv2d(1, 6, 3, padding=1, key=keys[0]), eqx.nn.Lambda(jax.nn.relu), eqx.nn.AvgPool2d(2, 2),
            eqx.nn.Conv2d(6, 16, 3, padding=1, key=keys[1]), eqx.nn.Lambda(jax.nn.relu), eqx.nn.AvgPool2d(2, 2),
            eqx.nn.Lambda(jnp.ravel), eqx.nn.Linear(64, 32, key=keys[2]), eqx.nn.Lambda(jax.nn.relu),
            eqx.nn.Linear(32, CLASSES, key=keys[3])])
        w = lenet_weights()  # the shared initial weights, in equinox's layouts (Linear: out x in)
        eq_model = eqx.tree_at(
            lambda m: (m.layers[0].weight, m.layers[0].bias, m.layers[3].weight, m.layers[3].bias,
                       m.layers[7].weight, m.layers[7].bias, m.layers[9].weight, m.layers[9].bias),
            eq_model, (jnp.asarray(w[0]), jnp.asarray(w[1]).reshape(6, 1, 1), jnp.asarray(w[2]),
                       jnp.asarray(w[3]).reshape(16, 1, 1), jnp.asarray(w[4].T), jnp.asarray(w[5]),
                       jnp.asarray(w[6].T), jnp.asarray(w[7])))
        arrays, static = eqx.partition(eq_model, eqx.is_array)  # the module's static parts stay out of the tree
        nets.append(as_net("equinox.nn.Sequential LeNet", arrays,
                           lambda a, X: jax.vmap(eqx.combine(a, static))(X)))
    return nets


def numpy_net(md: Any, dev: Any) -> Net:
    ws = mlp_weights()
    net = {k: md.asarray(w, backend="numpy") for k, w in zip(("W1", "b1", "W2", "b2"), ws)}  # a dict is the model
    box = {"net": md.to(net, dev)}

    def params() -> list[Any]:
        return list(box["net"].values())

    def load(trained: list[Any]) -> None:
        box["net"] = dict(zip(box["net"], trained))

    model = Model(lambda d: params(), numpy_mlp_forward, None, {"grad": numpy_mlp_grad},
                  images=lambda X: X.reshape(len(X), -1), labels=lambda y: np.eye(CLASSES, dtype=np.float32)[y])
    return Net("a dict of NumPy arrays", box, params, model, lambda b, X: numpy_mlp_forward(list(b["net"].values()), X),
               load)


def nets_for(md: Any, name: str, dev: Any) -> list[Net]:
    if name == "torch":
        return [torch_net(md, dev)]
    if name == "tensorflow":
        return [keras_net(md, dev)]
    if name == "mxnet":
        return [gluon_net(md, dev)]
    if name == "jax":
        return jax_nets(md, dev)
    if name == "numpy":
        return [numpy_net(md, dev)]
    raise SystemExit(f"multi_gpu_concise has no model for backend {name!r} (numpy, torch, jax, tensorflow, mxnet)")


def run(md: Any, name: str, counts: list[int], args: argparse.Namespace, rep: Report) -> None:
    Xtr, ytr, Xte, yte, _ = digits()
    data = (Xtr, ytr, Xte, yte)
    epochs = args.epochs or (4 if args.quick else EPOCHS)
    lr = LR.get(name, LENET_LR)
    first = pick_devices(md, name, 1)[0]
    for net in nets_for(md, name, first):
        tag = net.label
        rep.check(f"{tag}: md.to(net, {first}) put it there", md.device_of(net.params()) == first,
                  md.device_of(net.params()))
        runs: dict[int, dict[str, dict[str, Any]]] = {}
        for count in [1, *counts]:
            devices = pick_devices(md, name, count)
            if len(devices) < count:
                rep.note(f"{name} has {len(devices)} device(s) here, so no {count}-device run"
                         + (" (torch has one CPU device: its multi-device runs need GPUs)" if name == "torch" else ""))
                continue
            short = args.quick and count > 1
            r = train(md, name, net.model, devices, "md.train_batch", data,
                      min(epochs, QUICK_N_EPOCHS) if short else epochs, lr)
            runs[count] = {"md.train_batch": r}
            rep.note(f"{tag}, {count} device(s) [{', '.join(r['devices'])}]: loss "
                     + " ".join(f"{v:.4f}" for v in r["loss"]) + f", accuracy {r['accuracy'][-1]:.3f}, "
                     f"{np.median(r['epoch_s']) * 1e3:.0f} ms/epoch")
            check_learning(rep, f"{tag}, {count} device(s)", r, full=not short)
            if count > 1:
                check_in_sync(rep, f"{tag}, {count} devices", r, devices)
                compare(rep, f"{tag}, {count} devices against 1", runs[1]["md.train_batch"], r,
                        MIXED_LOSS_RTOL if mixed(devices) else LOSS_RTOL, ACCURACY_TOLERANCE)
        report_runs(rep, {c: {f"{tag}": v["md.train_batch"]} for c, v in runs.items()})
        # The model itself, with the 1-device run's parameters, predicts what the replicas predicted.
        one = runs[1]["md.train_batch"]
        X_test = md.asarray(net.model.images(Xte), device=first, backend=name)
        functional = np.asarray(md.to_numpy(net.model.forward(one["_live"][0], X_test)))
        net.load(one["_live"][0])
        own = np.asarray(md.to_numpy(net.predict(net.net, X_test)))
        scale = max(float(np.abs(functional).max()), 1.0)
        rep.check(f"{tag}: the model with the trained parameters predicts what the replicas did",
                  np.allclose(own, functional, rtol=PREDICT_RTOL, atol=PREDICT_RTOL * scale),
                  f"accuracy {accuracy(own, yte):.3f}")
        # md.copy: an independent model on another device that predicts the same.
        other = pick_devices(md, name, 2)[-1]
        twin = md.copy(net.net, other)
        X_other = md.to(X_test, other)
        theirs = np.asarray(md.to_numpy(net.predict(twin, X_other)))
        rtol = 1e-2 if mixed([first, other]) else PREDICT_RTOL
        rep.check(f"{tag}: md.copy(net, {other}) is a model there that predicts the same",
                  md.device_of(twin) == other and np.allclose(theirs, own, rtol=rtol, atol=rtol * scale),
                  f"on {md.device_of(twin)}")


def main(argv: list[str] | None = None) -> int:
    return common_main("multi_gpu_concise", __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
