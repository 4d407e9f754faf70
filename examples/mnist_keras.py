"""Keras's "Simple MNIST convnet" (keras-io ``examples/vision/mnist_convnet.py``: a Sequential
convnet with dropout, Adam, categorical crossentropy on one-hot labels), data-parallel with
``md.data_parallel(model, optimizer)``::

    python examples/mnist_keras.py                       # one device
    python examples/mnist_keras.py --devices 2           # one process over 2 devices (logical CPUs here)
    mpiexec -n 2 python examples/mnist_keras.py          # one process per rank (the MPI engine)

``model.compile`` + ``model.fit`` become a loop of ``dp.step`` (the framework's ``GradientTape``
step, the gradients averaged over the devices and ranks); the model stays the Keras model, and
``model.evaluate`` still scores it. The lines marked ``# md`` are the added ones
(docs/data-parallel.md shows the diff). Data: ``--data mnist.npz``, else upscaled digits.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Simple MNIST convnet (Keras), data-parallel with multidev")
    p.add_argument("--batch-size", type=int, default=128, help="the global batch (all devices and ranks)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="at most this many steps per epoch (default: all)")
    p.add_argument("--data", help="an MNIST .npz (x_train, y_train, x_test, y_test); default: upscaled digits")
    p.add_argument("--limit", type=int, default=None, help="the first rows of each split only")
    p.add_argument("--devices", type=int, default=1, help="devices of this process (logical CPU devices on a CPU)")
    p.add_argument("--no-dropout", action="store_true", help="dropout off (runs that compare launches)")
    p.add_argument("--json", help="rank 0 writes the losses and the test accuracy here")
    args = p.parse_args(argv)
    if args.devices > 1:  # TensorFlow's logical CPU devices are fixed when it starts
        os.environ.setdefault("MULTIDEV_TF_CPU_DEVICES", str(args.devices))

    import multidev as md  # md
    from multidev import distributed as dist  # md

    dist.init()                                                           # md: mpiexec's ranks, or 1 process
    md.backend("tensorflow")                                              # md: its devices before TF starts
    import keras
    import tensorflow as tf
    from keras import layers

    if __package__:  # python -m multidev.examples.mnist_keras
        from .mnist_data import global_batches, load, mean_over_ranks
    else:  # python examples/mnist_keras.py
        from multidev.examples.mnist_data import global_batches, load, mean_over_ranks  # type: ignore[import-not-found,no-redef]

    num_classes, input_shape = 10, (28, 28, 1)
    x_train, y_train, x_test, y_test, source = load(args.data, limit=args.limit)
    x_train, x_test = np.expand_dims(x_train, -1), np.expand_dims(x_test, -1)   # images (28, 28, 1)
    y_train = keras.utils.to_categorical(y_train, num_classes)
    y_test = keras.utils.to_categorical(y_test, num_classes)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input(shape=input_shape),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.0 if args.no_dropout else 0.5),
        layers.Dense(num_classes, activation="softmax"),
    ])
    if dist.rank() == 0:
        model.summary()
    optimizer = keras.optimizers.Adam()
    devices = md.devices(backend="tensorflow")[:args.devices] if dist.world_size() == 1 else None   # md
    dp = md.data_parallel(model, optimizer, devices=devices)              # md: the one added line

    def loss_fn(m: keras.Model, batch: tuple[np.ndarray, np.ndarray]) -> tf.Tensor:   # md: compile's loss
        x, y = batch
        return tf.reduce_mean(keras.losses.categorical_crossentropy(y, m(x, training=True)))

    losses: list[float] = []
    for epoch in range(1, args.epochs + 1):                               # md: was model.fit(...)
        epoch_losses = [float(dp.step(dp.shard((x_train[idx], y_train[idx])), loss_fn))
                        for idx in global_batches(len(x_train), args.batch_size, epoch, args.steps)]
        losses += mean_over_ranks(epoch_losses)
        if dist.rank() == 0:
            print(f"Epoch {epoch}/{args.epochs} - loss: {np.mean(losses[-len(epoch_losses):]):.4f}")
    dp.verify()                                                           # every replica bitwise equal

    model.compile(loss="categorical_crossentropy", metrics=["accuracy"])  # for evaluate only
    score = model.evaluate(x_test, y_test, verbose=0)
    if dist.rank() == 0:
        print("Test loss:", score[0])
        print("Test accuracy:", score[1])
        where = [str(d) for d in dp.devices]
        print(f"{source}; {dist.world_size()} process(es) x {where}; losses {[round(v, 4) for v in losses]}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"loss": losses, "accuracy": float(score[1]), "world_size": dist.world_size(),
                           "devices": where, "source": source}, f)
    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
