"""Train a small classifier on scikit-learn's digits with ``multidev.train_batch`` (D2L 12.5/12.6),
on 1 and on N devices of every backend, and check that N devices learn what one device learns.

The model is D2L's MLP (64 -> hidden -> 10, ReLU, softmax cross-entropy), the data the 1797 8x8
digits that ship inside scikit-learn (nothing is downloaded). Every backend starts from the same
initial parameters and sees the same minibatches, so the curves are comparable across frameworks.
Only the model and loss below are framework code (NumPy's gradient is written by hand); the
training step, replication, split and allreduce are multidev's, the same call on every backend.

    python -m multidev.examples.digits                          # every installed backend, 2 devices
    python -m multidev.examples.digits --backend jax,numpy --devices 4 --plot digits.png
    python -m multidev.examples.digits --backend torch          # every GPU where there are GPUs
    torchrun --nproc_per_node=2 -m multidev.examples.digits --backend jax   # 2 processes (gloo/NCCL)
    mpiexec -n 2 python -m multidev.examples.digits --backend numpy         # 2 processes (MPI)
    python -m multidev.distributed.launch -n 2 --engine jax -m multidev.examples.digits --backend jax

Under a launcher every process takes its part of each global minibatch (the rows ``split_batch``
would give it) and ``train_batch`` sums the gradients across processes as well, so the run learns
what one device learns; rank 0 evaluates and reports.

Virtual CPU devices stand in for GPUs on a CPU-only machine (torch has one CPU device only, so
its N-device run needs GPUs). Prints accuracy and time per epoch, with a progress bar.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

BACKENDS = ("numpy", "torch", "jax", "tensorflow", "mxnet")
CLASSES = 10
#: |accuracy on N devices - accuracy on 1 device| allowed by the test (tests/test_examples.py): the
#: two runs are the same SGD up to the order of floating-point sums, which may flip a few of the 360
#: test digits after several epochs.
ACCURACY_TOLERANCE = 0.02


@dataclass
class Run:
    """One training run: per-epoch test accuracy, mean training loss and wall time."""

    backend: str
    devices: list[str]
    accuracy: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    epoch_s: list[float] = field(default_factory=list)


@dataclass
class Model:
    """The framework's half of the example: forward pass, loss (or hand-written gradient), labels."""

    forward: Callable[[list[Any], Any], Any]
    loss: Callable[[list[Any], Any, Any], Any] | None = None
    grad: Callable[[list[Any], Any, Any], tuple[Any, list[Any]]] | None = None
    labels: Callable[[np.ndarray], np.ndarray] = lambda y: y.astype(np.int64)
    as_param: Callable[[Any], Any] = lambda p: p  # what makes a tensor a parameter in this framework


def model_for(name: str) -> Model:
    """The MLP and its summed softmax cross-entropy, written in framework ``name``."""
    if name == "numpy":
        def forward(ps: list[Any], X: Any) -> Any:
            W1, b1, W2, b2 = ps
            return np.maximum(X @ W1 + b1, 0) @ W2 + b2

        def grad(ps: list[Any], X: Any, Y: Any) -> tuple[Any, list[Any]]:  # Y: one-hot labels
            W1, b1, W2, b2 = ps
            z = X @ W1 + b1
            h = np.maximum(z, 0)
            o = h @ W2 + b2
            o = o - o.max(axis=1, keepdims=True)
            logp = o - np.log(np.exp(o).sum(axis=1, keepdims=True))
            loss = -(Y * logp).sum(keepdims=True)  # keepdims: a full reduction would drop the device tag
            d_o = np.exp(logp) - Y  # d loss / d logits
            d_z = (d_o @ W2.T) * (z > 0)
            return loss, [X.T @ d_z, d_z.sum(axis=0), h.T @ d_o, d_o.sum(axis=0)]

        return Model(forward, grad=grad, labels=lambda y: np.eye(CLASSES, dtype=np.float32)[y])
    if name == "torch":
        import torch
        import torch.nn.functional as F

        def forward(ps: list[Any], X: Any) -> Any:
            W1, b1, W2, b2 = ps
            return torch.relu(X @ W1 + b1) @ W2 + b2

        return Model(forward, loss=lambda ps, X, y: F.cross_entropy(forward(ps, X), y, reduction="sum"),
                     as_param=lambda p: p.requires_grad_())
    if name == "jax":
        import jax
        import jax.numpy as jnp

        def forward(ps: list[Any], X: Any) -> Any:
            W1, b1, W2, b2 = ps
            return jax.nn.relu(X @ W1 + b1) @ W2 + b2

        def loss(ps: list[Any], X: Any, y: Any) -> Any:
            logp = jax.nn.log_softmax(forward(ps, X))
            return -jnp.take_along_axis(logp, y[:, None], axis=1).sum()

        return Model(forward, loss=loss, labels=lambda y: y.astype(np.int32))
    if name == "tensorflow":
        import tensorflow as tf

        def forward(ps: list[Any], X: Any) -> Any:
            W1, b1, W2, b2 = ps
            return tf.nn.relu(X @ W1 + b1) @ W2 + b2

        def loss(ps: list[Any], X: Any, y: Any) -> Any:
            return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=forward(ps, X)))

        return Model(forward, loss=loss, labels=lambda y: y.astype(np.int32), as_param=tf.Variable)
    if name == "mxnet":
        from mxnet import nd

        def forward(ps: list[Any], X: Any) -> Any:
            W1, b1, W2, b2 = ps
            return nd.dot(nd.relu(nd.dot(X, W1) + b1), W2) + b2

        def loss(ps: list[Any], X: Any, y: Any) -> Any:
            return -nd.pick(nd.log_softmax(forward(ps, X)), y).sum()

        def attach(p: Any) -> Any:
            p.attach_grad()
            return p

        return Model(forward, loss=loss, labels=lambda y: y.astype(np.float32), as_param=attach)
    raise SystemExit(f"no model for backend {name!r} in this example (known: {', '.join(BACKENDS)})")


#: A copy of the digits saved by ``--save-data`` (for a machine without scikit-learn); None: sklearn's.
DATA: str | None = None


def load(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits (or the ``--data`` copy), pixels scaled to [0, 1], split 80/20 by a
    seeded permutation."""
    if DATA is not None:
        with np.load(DATA) as f:
            data, target = f["data"], f["target"]
    else:
        from sklearn.datasets import load_digits

        d = load_digits()
        data, target = d.data, d.target
    X = (data / 16.0).astype(np.float32)
    y = target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(X))
    cut = int(0.8 * len(X))
    tr, te = order[:cut], order[cut:]
    return X[tr], y[tr], X[te], y[te]


def init_params(hidden: int, seed: int = 0) -> list[np.ndarray]:
    """He-initialized weights and zero biases, on the host (the same start for every backend)."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(64, hidden)) * np.sqrt(2 / 64)).astype(np.float32), np.zeros(hidden, np.float32),
            (rng.normal(size=(hidden, CLASSES)) * np.sqrt(1 / hidden)).astype(np.float32),
            np.zeros(CLASSES, np.float32)]


def pick_devices(md: Any, name: str, n: int) -> list[Any]:
    """The first ``n`` GPUs of the backend, else its first ``n`` CPU devices (fewer if it has fewer)."""
    gpus = md.devices(backend=name, kind="gpu")
    return (gpus or md.devices(backend=name, kind="cpu"))[:n]


def train(md: Any, name: str, n_devices: int, epochs: int, batch: int, lr: float, hidden: int, seed: int = 0,
          progress: Any = None, log: Callable[..., None] | None = None) -> Run:
    """Train on ``n_devices`` devices of backend ``name`` (in every process of a torchrun group);
    returns the run's per-epoch figures."""
    dist = md.distributed
    rank, world = (dist.rank(), dist.world_size()) if dist.is_initialized() else (0, 1)
    log = log or (lambda *a, **k: print(*a))
    model = model_for(name)
    devices = pick_devices(md, name, n_devices)
    Xtr, ytr, Xte, yte = load(seed)
    Ltr = model.labels(ytr)
    params = [model.as_param(md.asarray(p, device=devices[0], backend=name)) for p in init_params(hidden, seed)]
    replicas = md.replicate(params, devices)  # one list of parameters per device
    X_test = md.asarray(Xte, device=devices[0], backend=name)
    step_kw = {"grad": model.grad} if model.grad is not None else {"loss": model.loss}
    run = Run(name, [str(d) for d in devices] if world == 1 else
              [f"rank{r}:{d}" for r in range(world) for d in devices])  # (every rank has as many)
    rng = np.random.default_rng(seed + 1)
    steps = len(Xtr) // batch  # drop the ragged last batch: every step sees `batch` examples
    task = None if progress is None else progress.add_task(f"{name} x{len(devices)}", total=epochs * steps)
    for epoch in range(epochs):
        order = rng.permutation(len(Xtr))
        total = 0.0
        t0 = time.perf_counter()
        for s in range(steps):
            idx = np.array_split(order[s * batch:(s + 1) * batch], world)[rank]  # this process's rows
            X = md.asarray(Xtr[idx], device=devices[0], backend=name)
            y = md.asarray(Ltr[idx], device=devices[0], backend=name)
            total += md.train_batch(X, y, replicas, devices, lr, **step_kw)
            if task is not None:
                progress.advance(task)
        run.epoch_s.append(time.perf_counter() - t0)
        logits = np.asarray(md.to_numpy(model.forward(replicas[0], X_test)))
        run.accuracy.append(float((logits.argmax(axis=1) == yte).mean()))
        run.loss.append(total / (steps * batch))
        where = f"x{len(devices)}" if world == 1 else f"{world} processes x{len(devices)}"
        log(f"{name} {where} epoch {epoch + 1:2d}: loss {run.loss[-1]:.4f}, test accuracy "
            f"{run.accuracy[-1]:.3f}, {run.epoch_s[-1] * 1e3:.0f} ms", highlight=False)
    md.synchronize()
    first = [np.asarray(md.to_numpy(p)) for p in replicas[0]]
    for r in replicas[1:]:  # the same update everywhere: the replicas never drift apart
        assert all(np.array_equal(a, np.asarray(md.to_numpy(p))) for a, p in zip(first, r)), "replicas diverged"
    return run


def plot(runs: list[Run], path: str) -> None:
    """Test accuracy against epoch, one panel per backend: 1 device dashed, N devices solid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r.backend for r in runs))
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names) + 0.8, 3.6), sharey=True, squeeze=False)
    for i, (ax, name) in enumerate(zip(axes[0], names)):
        for r in (r for r in runs if r.backend == name):
            n = len(r.devices)
            ax.plot(range(1, len(r.accuracy) + 1), r.accuracy, color=f"C{i}", ls="-" if n > 1 else "--",
                    marker="o" if n > 1 else "x", ms=4 if n > 1 else 7, label=f"{n} device{'s' if n > 1 else ''}")
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel("test accuracy")
    fig.suptitle("digits MLP trained with multidev.train_batch: 1 device (dashed, x) vs N devices (solid, o)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", help=f"comma-separated, default: every installed one of {', '.join(BACKENDS)}")
    p.add_argument("--devices", type=int, default=2, help="N for the N-device run (virtual CPU devices, or GPUs)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=64, help="global minibatch, split over the devices")
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", metavar="FILE.png", help="plot test accuracy per epoch per backend")
    p.add_argument("--json", metavar="FILE", help="write every run's figures to FILE")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--plot-from", nargs="+", metavar="JSON", help="train nothing: plot the runs of these --json "
                   "files (e.g. one per environment) into --plot")
    p.add_argument("--data", metavar="FILE.npz", help="read the digits from a --save-data file instead of scikit-learn")
    p.add_argument("--save-data", metavar="FILE.npz", help="save scikit-learn's digits to FILE (for a machine "
                   "without scikit-learn) and exit")
    args = p.parse_args(argv)
    if args.save_data:
        from sklearn.datasets import load_digits

        d = load_digits()
        np.savez_compressed(args.save_data, data=d.data.astype(np.uint8), target=d.target.astype(np.uint8))
        print(f"saved {len(d.target)} digits to {args.save_data}")
        return 0
    if args.plot_from:
        saved: list[Run] = []
        for path in args.plot_from:
            with open(path) as f:
                saved += [Run(**r) for r in json.load(f)["runs"]]
        plot(saved, args.plot or "digits.png")
        print(f"plot: {args.plot or 'digits.png'} ({len(saved)} runs)")
        return 0
    global DATA
    DATA = args.data
    from multidev.registry import configure_virtual_devices

    configure_virtual_devices(max(2, args.devices))  # before any framework starts
    import multidev as md

    if md.distributed.is_initialized() or md.distributed.launched():  # torchrun, mpiexec, JAX's variables
        return main_distributed(md, args)
    names = [n.strip() for n in (args.backend or "").split(",") if n.strip()] or \
        [n for n in BACKENDS if n in md.backends()]
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console()
    progress = None if args.no_progress else Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console)
    log = console.print if progress is None else progress.console.print
    runs: list[Run] = []
    summary = []
    if progress is not None:
        progress.start()
    try:
        for name in names:
            md.backend(name)  # a one-line error for a backend that is not installed
            available = len(pick_devices(md, name, args.devices))
            one = train(md, name, 1, args.epochs, args.batch, args.lr, args.hidden, args.seed, progress, log)
            runs.append(one)
            many = None
            if available > 1:
                many = train(md, name, args.devices, args.epochs, args.batch, args.lr, args.hidden, args.seed,
                             progress, log)
                runs.append(many)
            else:
                log(f"{name}: one device only here ({one.devices[0]}), so no N-device run", highlight=False)
            summary.append((name, one, many))
    finally:
        if progress is not None:
            progress.stop()
    table = Table(title=f"digits, {args.epochs} epochs, batch {args.batch}: final test accuracy")
    for col in ("backend", "1 device", "N devices", "|difference|", "ms/epoch (1 / N)"):
        table.add_column(col)
    for name, one, many in summary:
        diff = "-" if many is None else f"{abs(many.accuracy[-1] - one.accuracy[-1]):.3f}"
        table.add_row(name, f"{one.accuracy[-1]:.3f}",
                      "-" if many is None else f"{many.accuracy[-1]:.3f} on {len(many.devices)}", diff,
                      f"{np.median(one.epoch_s) * 1e3:.0f}" + ("" if many is None else
                                                               f" / {np.median(many.epoch_s) * 1e3:.0f}"))
    console.print(table)
    if args.plot:
        plot(runs, args.plot)
        console.print(f"plot: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "tolerance": ACCURACY_TOLERANCE, "runs": [asdict(r) for r in runs]},
                      f, indent=1)
    return 0


def main_distributed(md: Any, args: argparse.Namespace) -> int:
    """Under a launcher: the N-device run of each backend in every process; rank 0 reports."""
    dist = md.distributed
    if not dist.is_initialized():
        dist.init(timeout=120)
    names = [n.strip() for n in (args.backend or "numpy").split(",") if n.strip()]
    quiet = dist.rank() != 0
    runs = [train(md, name, args.devices, args.epochs, args.batch, args.lr, args.hidden, args.seed,
                  log=(lambda *a, **k: None) if quiet else None) for name in names]
    if not quiet:
        for r in runs:
            print(f"{r.backend} on {dist.world_size()} processes x {len(r.devices) // dist.world_size()} device(s): "
                  f"final test accuracy {r.accuracy[-1]:.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"settings": vars(args), "world_size": dist.world_size(), "runs": [asdict(r) for r in runs]},
                          f, indent=1)
    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
