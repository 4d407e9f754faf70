"""PyTorch's MNIST example (pytorch/examples ``mnist/main.py``: a two-convolution net with dropout,
Adadelta with StepLR, a train and a test loop), data-parallel with ``md.data_parallel``::

    python examples/mnist_torch.py                            # one process (a 1-process group)
    torchrun --nproc_per_node=2 examples/mnist_torch.py       # one process per CPU core or GPU
    mpiexec -n 2 python examples/mnist_torch.py               # the same under MPI
    python examples/mnist_torch.py --devices 2                # one process over 2 GPUs

The framework-only program and this one differ by the lines marked ``# md``: ``dist.init()``,
``md.data_parallel(model, optimizer)``, and a step that takes this rank's share of each global
batch (docs/data-parallel.md shows the diff). Every launch trains on the same global batches, so
it learns what one process learns. Data: ``--data mnist.npz`` (Keras's layout), else upscaled
digits (examples/mnist_data.py); nothing is downloaded.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import StepLR

import multidev as md  # md
from multidev import distributed as dist  # md

if __package__:  # python -m multidev.examples.mnist_torch
    from .mnist_data import global_batches, load, mean_over_ranks
else:  # python examples/mnist_torch.py
    from multidev.examples.mnist_data import global_batches, load, mean_over_ranks  # type: ignore[import-not-found,no-redef]

MEAN, STD = 0.1307, 0.3081  # MNIST's pixel statistics, as the original normalises


class Net(nn.Module):
    def __init__(self, dropout: bool = True) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25 if dropout else 0.0)
        self.dropout2 = nn.Dropout(0.5 if dropout else 0.0)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        x = self.fc2(self.dropout2(x))
        return F.log_softmax(x, dim=1)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    data, target = batch
    return F.nll_loss(model(data), target)


def tensors(x: np.ndarray, y: np.ndarray, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.from_numpy((x[:, None] - MEAN) / STD)
    return md.to(data, device), md.to(torch.from_numpy(y), device)


def train(args: argparse.Namespace, dp: Any, device: Any, x: np.ndarray, y: np.ndarray, epoch: int) -> list[float]:
    dp.model.train()
    losses = []
    for i, idx in enumerate(global_batches(len(x), args.batch_size, epoch, args.steps)):
        loss = dp.step(dp.shard(tensors(x[idx], y[idx], device)), loss_fn)   # md: was zero_grad/backward/step
        losses.append(loss.item())
        if i % args.log_interval == 0 and dist.rank() == 0:
            print(f"Train Epoch: {epoch} [{i * args.batch_size}/{len(x)}]\tLoss: {losses[-1]:.6f}")
    return mean_over_ranks(losses)


def test(model: nn.Module, device: Any, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(x), 1000):
            data, target = tensors(x[start:start + 1000], y[start:start + 1000], device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += int((output.argmax(dim=1) == target).sum().item())
    test_loss /= len(x)
    if dist.rank() == 0:
        print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{len(x)} "
              f"({100.0 * correct / len(x):.0f}%)\n")
    return test_loss, correct / len(x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="PyTorch MNIST Example, data-parallel with multidev")
    p.add_argument("--batch-size", type=int, default=64, help="the global batch (all ranks together)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="at most this many steps per epoch (default: all)")
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=0.7, help="StepLR's factor per epoch")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--data", help="an MNIST .npz (x_train, y_train, x_test, y_test); default: upscaled digits")
    p.add_argument("--limit", type=int, default=None, help="the first rows of each split only")
    p.add_argument("--devices", type=int, default=1, help="devices of this process (GPUs; torch has one CPU)")
    p.add_argument("--no-dropout", action="store_true", help="dropout off (runs that compare launches)")
    p.add_argument("--json", help="rank 0 writes the losses and the test accuracy here")
    args = p.parse_args(argv)

    dist.init()                                                       # md: the launcher's group, or 1 process
    torch.manual_seed(args.seed)
    gpus = md.devices(backend="torch", kind="gpu")
    pool = gpus or md.devices(backend="torch")
    if dist.world_size() > 1 and gpus:
        devices = [gpus[dist.local_rank() % len(gpus)]]               # one GPU per process
    elif args.devices > len(pool):
        p.error(f"--devices {args.devices}: torch has {len(pool)} device(s) here ({'GPUs' if gpus else 'one CPU'}): "
                f"run a process per device instead (torchrun, mpiexec)")
    else:
        devices = pool[:args.devices]
    device = devices[0]
    x_train, y_train, x_test, y_test, source = load(args.data, limit=args.limit)

    model = md.to(Net(dropout=not args.no_dropout), device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    dp = md.data_parallel(model, optimizer, devices=devices)          # md: the one added line
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    losses, accuracy = [], 0.0
    for epoch in range(1, args.epochs + 1):
        losses += train(args, dp, device, x_train, y_train, epoch)
        _, accuracy = test(model, device, x_test, y_test)
        scheduler.step()
    dp.verify()                                                       # every replica bitwise equal
    if dist.rank() == 0:
        print(f"{source}; {dist.world_size()} process(es) x {[str(d) for d in devices]}; "
              f"losses {[round(v, 4) for v in losses]}; test accuracy {accuracy:.4f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"loss": losses, "accuracy": accuracy, "world_size": dist.world_size(),
                           "devices": [str(d) for d in devices], "source": source}, f)
    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
