"""D2L 12.6 "Concise Implementation for Multiple GPUs" with ``md.data_parallel``: the framework's
own model and its own optimizer, made data-parallel by one line, the same script on one device,
several devices of one process, or one process per device under a launcher::

    python -m multidev.examples.concise_data_parallel --backend torch              # one device
    python -m multidev.examples.concise_data_parallel --backend jax --devices 2    # 2 devices, 1 process
    torchrun --nproc_per_node=2 -m multidev.examples.concise_data_parallel --backend torch
    mpiexec -n 2 python -m multidev.examples.concise_data_parallel --backend torch

The book's program, and what changes (torch)::

    net = nn.DataParallel(net, device_ids=devices)      ->  net = md.to(net, devices[0])
    trainer = torch.optim.SGD(net.parameters(), lr)         trainer = torch.optim.SGD(net.parameters(), lr)
                                                            dp = md.data_parallel(net, trainer, devices=devices)
    for X, y in train_iter:                                 for X, y in train_iter:
        trainer.zero_grad()                                     dp.step(dp.shard((X, y)), lambda net, b:
        X, y = X.to(devices[0]), y.to(devices[0])                       loss(net(b[0]), b[1]))
        l = loss(net(X), y)
        l.backward()
        trainer.step()

The model is LeNet for the 8x8 digits (``examples/d2l``'s, the same initial weights on every
framework); the global batch of every step is the same whatever the devices and processes, so
N devices or processes learn what one device learns (``--json`` writes the losses to compare).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

from .d2l.common import CLASSES, accuracy, batches, digits, lenet_weights

EPOCHS, BATCH, LR = 2, 64, 0.3


def torch_lenet() -> Any:
    import torch
    from torch import nn

    net = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2),
                        nn.Conv2d(6, 16, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                        nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, CLASSES))
    with torch.no_grad():  # the shared initial weights (nn.Linear keeps out x in)
        for p, w in zip(net.parameters(), lenet_weights()):
            p.copy_(torch.from_numpy(w.T.copy() if w.ndim == 2 else w))
    return net


def epoch_loss(total: float) -> float:
    """The epoch's summed loss over the whole batches: each rank's summed means, averaged over the
    ranks (equal shares), so every launch reports the same figure."""
    from multidev import distributed as dist

    if dist.is_initialized() and dist.world_size() > 1:
        return float(dist.allreduce(np.array([total], np.float32), "mean")[0])
    return total


def train_torch(md: Any, devices: list[Any], epochs: int) -> dict[str, Any]:
    import torch
    from torch import nn

    Xtr, ytr, Xte, yte, _ = digits()
    net = md.to(torch_lenet(), devices[0])                  # D2L: nn.DataParallel(net, device_ids=devices)
    trainer = torch.optim.SGD(net.parameters(), lr=LR)
    dp = md.data_parallel(net, trainer, devices=devices)    # the one added line
    loss = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(epochs):
        total = 0.0
        for idx in batches(len(Xtr), BATCH, epoch):
            X, y = torch.from_numpy(Xtr[idx]), torch.from_numpy(ytr[idx])
            total += float(dp.step(dp.shard((X, y)), lambda net, b: loss(net(b[0]), b[1])))
        losses.append(epoch_loss(total))
    with torch.no_grad():
        logits = net(md.to(torch.from_numpy(Xte), devices[0]))
    return {"loss": losses, "accuracy": accuracy(md.to_numpy(logits), yte)}


def jax_lenet_forward(params: list[Any], X: Any) -> Any:
    import jax

    def conv(x: Any, w: Any, b: Any) -> Any:
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return jax.nn.relu(y + b[None, :, None, None])

    def pool(x: Any) -> Any:
        n, c, h, w = x.shape
        return x.reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))

    h = pool(conv(X, params[0], params[1]))
    h = pool(conv(h, params[2], params[3])).reshape(X.shape[0], -1)
    h = jax.nn.relu(h @ params[4] + params[5])
    return h @ params[6] + params[7]


def train_jax(md: Any, devices: list[Any], epochs: int) -> dict[str, Any]:
    import jax.numpy as jnp
    import optax

    Xtr, ytr, Xte, yte, _ = digits()

    def loss(params: list[Any], b: Any) -> Any:
        return optax.softmax_cross_entropy_with_integer_labels(jax_lenet_forward(params, b[0]), b[1]).mean()

    params = md.to([jnp.asarray(w) for w in lenet_weights()], devices[0])
    dp = md.data_parallel(params, optax.sgd(LR), devices=devices)   # the one added line
    losses = []
    for epoch in range(epochs):
        total = 0.0
        for idx in batches(len(Xtr), BATCH, epoch):
            X, y = jnp.asarray(Xtr[idx]), jnp.asarray(ytr[idx].astype(np.int32))
            total += float(dp.step(dp.shard((X, y)), loss))
        losses.append(epoch_loss(total))
    logits = jax_lenet_forward(md.copy(dp.model, devices[0]), md.to(jnp.asarray(Xte), devices[0]))
    return {"loss": losses, "accuracy": accuracy(md.to_numpy(logits), yte)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--backend", choices=("torch", "jax"), default="torch")
    p.add_argument("--devices", type=int, default=1, help="devices of this process (default 1)")
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--json", help="write the losses and the test accuracy here (rank 0)")
    args = p.parse_args(argv)
    if args.backend == "jax" and args.devices > 1:  # virtual CPU devices are fixed when JAX starts
        os.environ.setdefault("MULTIDEV_JAX_CPU_DEVICES", str(args.devices))
    import multidev as md
    from multidev import distributed as dist

    if dist.detect_launch():
        dist.init()
    devs = md.devices(backend=args.backend)
    devices = ([d for d in devs if d.is_gpu] + [d for d in devs if not d.is_gpu])[:args.devices]
    if dist.is_initialized() and dist.world_size() > 1 and any(d.is_gpu for d in devices):
        devices = [d for d in devs if d.is_gpu][dist.local_rank():][:1]   # one GPU per process
    result = (train_torch if args.backend == "torch" else train_jax)(md, devices, args.epochs)
    rank = dist.rank() if dist.is_initialized() else 0
    result.update(backend=args.backend, devices=[str(d) for d in devices],
                  world_size=dist.world_size() if dist.is_initialized() else 1)
    if rank == 0:
        print(f"{args.backend} on {result['world_size']} process(es) x {devices}: loss per epoch "
              f"{[round(v, 3) for v in result['loss']]}, test accuracy {result['accuracy']:.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)
    if dist.is_initialized():
        dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
