"""Flax's MNIST example (google/flax ``examples/mnist``: a CNN in ``flax.linen``, a ``TrainState``
with optax SGD and momentum, jitted steps, test accuracy per epoch), data-parallel with
``md.data_parallel(state)``::

    python examples/mnist_flax.py                          # one device
    python examples/mnist_flax.py --devices 2              # one process over 2 devices (virtual CPUs here)
    python -m multidev.distributed.launch -n 2 --engine jax examples/mnist_flax.py   # 2 JAX processes

Over several devices of one process the step is one jitted call on a ``Mesh`` (the batch sharded,
the state replicated); over several processes each takes its share of every global batch and the
gradients are averaged across them. The framework-only program's ``apply_model``/``update_model``
pair becomes one ``dp.step`` (docs/data-parallel.md shows the diff); the lines marked ``# md`` are
the added ones. Data: ``--data mnist.npz``, else upscaled digits (examples/mnist_data.py).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Flax MNIST example, data-parallel with multidev")
    p.add_argument("--batch-size", type=int, default=128, help="the global batch (all devices and ranks)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="at most this many steps per epoch (default: all)")
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--data", help="an MNIST .npz (x_train, y_train, x_test, y_test); default: upscaled digits")
    p.add_argument("--limit", type=int, default=None, help="the first rows of each split only")
    p.add_argument("--devices", type=int, default=1, help="devices of this process (virtual CPU devices on a CPU)")
    p.add_argument("--json", help="rank 0 writes the losses and the test accuracy here")
    args = p.parse_args(argv)
    if args.devices > 1:  # JAX's virtual CPU devices are fixed when it starts
        os.environ.setdefault("MULTIDEV_JAX_CPU_DEVICES", str(args.devices))
    return train_and_evaluate(args)


def train_and_evaluate(args: argparse.Namespace) -> int:
    import multidev as md  # md
    from multidev import distributed as dist  # md

    dist.init()                                                       # md: JAX's coordinator, or 1 process
    import jax
    import jax.numpy as jnp
    import optax
    from flax import linen as nn
    from flax.training import train_state

    if __package__:  # python -m multidev.examples.mnist_flax
        from .mnist_data import global_batches, load, mean_over_ranks
    else:  # python examples/mnist_flax.py
        from multidev.examples.mnist_data import global_batches, load, mean_over_ranks  # type: ignore[import-not-found,no-redef]

    class CNN(nn.Module):
        """A simple CNN model."""

        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.Conv(features=32, kernel_size=(3, 3))(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = nn.Conv(features=64, kernel_size=(3, 3))(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = x.reshape((x.shape[0], -1))
            x = nn.relu(nn.Dense(features=256)(x))
            return nn.Dense(features=10)(x)

    cnn = CNN()

    def loss_fn(params: Any, batch: tuple[Any, Any]) -> Any:          # md: apply_model's loss, as a function
        images, labels = batch
        logits = cnn.apply({"params": params}, images)
        return optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, 10)).mean()

    @jax.jit
    def evaluate(params: Any, images: Any, labels: Any) -> tuple[Any, Any]:
        logits = cnn.apply({"params": params}, images)
        loss = optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, 10)).mean()
        return loss, jnp.mean(jnp.argmax(logits, -1) == labels)

    x_train, y_train, x_test, y_test, source = load(args.data, limit=args.limit)
    x_train, x_test = x_train[..., None], x_test[..., None]           # NHWC, as the original's tfds images
    devices = md.devices(backend="jax")[:args.devices] if dist.world_size() == 1 else None   # md
    rng = jax.random.key(0)
    params = cnn.init(rng, jnp.ones([1, 28, 28, 1]))["params"]
    tx = optax.sgd(args.learning_rate, args.momentum)
    state = train_state.TrainState.create(apply_fn=cnn.apply, params=params, tx=tx)
    dp = md.data_parallel(state, devices=devices)                     # md: the one added line

    losses: list[float] = []
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        epoch_losses = []
        for idx in global_batches(len(x_train), args.batch_size, epoch, args.steps):
            batch = (jnp.asarray(x_train[idx]), jnp.asarray(y_train[idx].astype(np.int32)))
            epoch_losses.append(dp.step(dp.shard(batch), loss_fn))    # md: was apply_model + update_model
        epoch_losses = mean_over_ranks([float(v) for v in epoch_losses])
        state = dp.model                                              # the TrainState after the steps
        one = md.copy(state.params, md.devices(backend="jax")[0]) if devices and len(devices) > 1 else state.params
        test_loss, test_acc = evaluate(one, jnp.asarray(x_test), jnp.asarray(y_test.astype(np.int32)))
        accuracy = float(test_acc)
        losses += epoch_losses
        if dist.rank() == 0:
            print(f"epoch:{epoch:3}, train_loss: {np.mean(epoch_losses):.4f}, test_loss: {float(test_loss):.4f}, "
                  f"test_accuracy: {accuracy * 100:.2f}")
    dp.verify()                                                       # every replica bitwise equal
    if dist.rank() == 0:
        where = [str(d) for d in dp.devices]
        print(f"{source}; {dist.world_size()} process(es) x {where}; losses {[round(v, 4) for v in losses]}; "
              f"test accuracy {accuracy:.4f}; state.step {int(dp.model.step)}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"loss": losses, "accuracy": accuracy, "world_size": dist.world_size(), "devices": where,
                           "step": int(dp.model.step), "source": source}, f)
    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
