"""D2L 12.5 "Training on Multiple GPUs" from scratch, with multidev: LeNet written with the
framework's own operations on a list of parameters, ``md.replicate`` for a copy of them on every
device, and the book's data-parallel ``train_batch`` two ways: written out as the book writes it
(``md.split_batch``, each device's gradients by the framework's autodiff, ``md.allreduce`` of every
gradient, the same SGD step on every replica), and as the one call ``md.train_batch``. NumPy has
no convolution and no autodiff: it trains a two-layer MLP with a hand-written gradient (``grad=``).

The data are scikit-learn's 8x8 digits (a synthetic stand-in where scikit-learn is not installed),
so LeNet is sized for 8x8 images (see ``common.LENET_SHAPES``). Every backend starts from the same
weights and sees the same minibatches.

Checked, on 1 device and on each N of ``--devices``: the model learns (test accuracy at least
``MIN_ACCURACY``, the last epoch's loss under ``LOSS_DROP`` times the first's); the book's step and
``md.train_batch`` agree (``BOOK_RTOL``); N devices learn what one device learns (test accuracy
within ``ACCURACY_TOLERANCE``, the per-epoch loss within ``LOSS_RTOL``, or ``MIXED_LOSS_RTOL`` where
a GPU trains beside the CPU); and every device's replica ends equal to the first's (bit for bit
on same-kind devices, within ``MIXED_LOSS_RTOL`` on mixed ones).

Why those tolerances: N devices run the same SGD as one device; only the order in which the
shards' gradients are summed differs, so the runs differ by float32 rounding, which a few epochs of
SGD can grow to a few ulps of the loss and may flip a handful of the 360 test digits (0.02 is 7 of
them). A GPU beside a CPU also rounds each product differently (other kernels, fused
multiply-adds), hence the looser loss tolerance there.

    python -m multidev.examples.d2l.multi_gpu_scratch --backend torch,jax --devices 2,4
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .common import (
    CLASSES,
    Report,
    accuracy,
    batches,
    digits,
    lenet_weights,
    mixed,
    mlp_weights,
    numpy_mlp_forward,
    numpy_mlp_grad,
    pick_devices,
)
from .common import main as common_main

MIN_ACCURACY = 0.8
LOSS_DROP = 0.5
BOOK_RTOL = 1e-4
ACCURACY_TOLERANCE = 0.02
LOSS_RTOL = 1e-3
MIXED_LOSS_RTOL = 1e-2
BATCH = 32
LR = {"numpy": 0.1}  # the MLP; LeNet elsewhere
LENET_LR = 0.3
EPOCHS = 5
QUICK_N_EPOCHS = 2


@dataclass
class Model:
    """The framework's half of the program."""

    params: Callable[[Any], list[Any]]           # device -> the initial parameters there, as parameters
    forward: Callable[[list[Any], Any], Any]     # (params, X) -> logits
    book_step: Callable[..., float] | None       # (X, y, replicas, devices, lr) -> summed loss
    step_kw: dict[str, Any] = field(default_factory=dict)   # loss= or grad= for md.train_batch
    images: Callable[[np.ndarray], np.ndarray] = lambda X: X  # host images in the framework's layout
    labels: Callable[[np.ndarray], np.ndarray] = lambda y: y


def model_for(md: Any, name: str) -> Model:
    """LeNet (an MLP on NumPy), its loss and the book's train_batch, in framework ``name``."""
    if name == "torch":
        import torch
        import torch.nn.functional as F

        def forward(ps: list[Any], X: Any) -> Any:
            W1, b1, W2, b2, W3, b3, W4, b4 = ps
            h = F.avg_pool2d(torch.relu(F.conv2d(X, W1, b1, padding=1)), 2)
            h = F.avg_pool2d(torch.relu(F.conv2d(h, W2, b2, padding=1)), 2)
            return torch.relu(h.flatten(1) @ W3 + b3) @ W4 + b4

        def loss(ps: list[Any], X: Any, y: Any) -> Any:
            return F.cross_entropy(forward(ps, X), y, reduction="sum")

        def book_step(X: Any, y: Any, replicas: list[list[Any]], devices: list[Any], lr: float) -> float:
            X_shards, y_shards = md.split_batch(X, y, devices)
            ls = [loss(ps, Xs, ys) for Xs, ys, ps in zip(X_shards, y_shards, replicas)]
            for loss_d in ls:
                loss_d.backward()                                # each device's gradients, in p.grad
            with torch.no_grad():
                for i in range(len(replicas[0])):                # sum every gradient over the devices
                    md.allreduce([ps[i].grad for ps in replicas], inplace=True)
                for ps in replicas:                              # the same SGD step everywhere
                    for p in ps:
                        p -= lr * p.grad / X.shape[0]
                        p.grad.zero_()
            return sum(float(v.item()) for v in ls)

        def params(d: Any) -> list[Any]:
            return [md.asarray(w, device=d, backend=name).requires_grad_() for w in lenet_weights()]

        return Model(params, forward, book_step, {"loss": loss})
    if name == "jax":
        import jax
        import jax.numpy as jnp

        def conv(x: Any, w: Any, b: Any) -> Any:
            y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
            return y + b[None, :, None, None]

        def pool(x: Any) -> Any:
            n, c, h, w = x.shape
            return x.reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))

        def forward_j(ps: list[Any], X: Any) -> Any:
            W1, b1, W2, b2, W3, b3, W4, b4 = ps
            h = pool(jax.nn.relu(conv(X, W1, b1)))
            h = pool(jax.nn.relu(conv(h, W2, b2)))
            return jax.nn.relu(h.reshape(h.shape[0], -1) @ W3 + b3) @ W4 + b4

        def loss_j(ps: list[Any], X: Any, y: Any) -> Any:
            logp = jax.nn.log_softmax(forward_j(ps, X))
            return -jnp.take_along_axis(logp, y[:, None], axis=1).sum()

        value_and_grad = jax.jit(jax.value_and_grad(loss_j))

        def book_step_j(X: Any, y: Any, replicas: list[list[Any]], devices: list[Any], lr: float) -> float:
            X_shards, y_shards = md.split_batch(X, y, devices)
            out = [value_and_grad(ps, Xs, ys) for Xs, ys, ps in zip(X_shards, y_shards, replicas)]
            summed = [md.allreduce([g[i] for _, g in out]) for i in range(len(replicas[0]))]   # rebound
            for d, ps in enumerate(replicas):
                replicas[d] = [p - lr * s[d] / X.shape[0] for p, s in zip(ps, summed)]
            return sum(float(v) for v, _ in out)

        def params_j(d: Any) -> list[Any]:
            return [md.asarray(w, device=d, backend=name) for w in lenet_weights()]

        return Model(params_j, forward_j, book_step_j, {"loss": loss_j}, labels=lambda y: y.astype(np.int32))
    if name == "tensorflow":
        import tensorflow as tf

        def forward_t(ps: list[Any], X: Any) -> Any:
            W1, b1, W2, b2, W3, b3, W4, b4 = ps                  # X: NHWC; kernels HWIO
            h = tf.nn.avg_pool2d(tf.nn.relu(tf.nn.conv2d(X, W1, 1, "SAME") + b1), 2, 2, "VALID")
            h = tf.nn.avg_pool2d(tf.nn.relu(tf.nn.conv2d(h, W2, 1, "SAME") + b2), 2, 2, "VALID")
            h = tf.reshape(tf.transpose(h, [0, 3, 1, 2]), [-1, 64])  # flattened as NCHW, as the others
            return tf.nn.relu(h @ W3 + b3) @ W4 + b4

        def loss_t(ps: list[Any], X: Any, y: Any) -> Any:
            return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=forward_t(ps, X)))

        def book_step_t(X: Any, y: Any, replicas: list[list[Any]], devices: list[Any], lr: float) -> float:
            X_shards, y_shards = md.split_batch(X, y, devices)
            ls, grads = [], []
            for Xs, ys, ps, d in zip(X_shards, y_shards, replicas, devices):
                with tf.device(md.native_device(d, "tensorflow")):   # eager TF: ops run on its default device
                    with tf.GradientTape() as tape:
                        value = loss_t(ps, Xs, ys)
                    ls.append(value)
                    grads.append(tape.gradient(value, ps))
            summed = [md.allreduce([g[i] for g in grads]) for i in range(len(replicas[0]))]
            for d, (ps, dev) in enumerate(zip(replicas, devices)):
                with tf.device(md.native_device(dev, "tensorflow")):
                    for p, s in zip(ps, summed):
                        p.assign_sub(lr * s[d] / X.shape[0])
            return sum(float(v) for v in ls)

        def params_t(d: Any) -> list[Any]:
            out = []
            with tf.device(md.native_device(d, "tensorflow")):
                for w in lenet_weights():
                    out.append(tf.Variable(w.transpose(2, 3, 1, 0) if w.ndim == 4 else w))  # OIHW -> HWIO
            return out

        return Model(params_t, forward_t, book_step_t, {"loss": loss_t}, images=lambda X: X.transpose(0, 2, 3, 1),
                     labels=lambda y: y.astype(np.int32))
    if name == "mxnet":
        from mxnet import autograd, nd

        def forward_m(ps: list[Any], X: Any) -> Any:
            W1, b1, W2, b2, W3, b3, W4, b4 = ps
            h = nd.relu(nd.Convolution(X, W1, b1, kernel=(3, 3), pad=(1, 1), num_filter=6))
            h = nd.Pooling(h, kernel=(2, 2), stride=(2, 2), pool_type="avg")
            h = nd.relu(nd.Convolution(h, W2, b2, kernel=(3, 3), pad=(1, 1), num_filter=16))
            h = nd.Pooling(h, kernel=(2, 2), stride=(2, 2), pool_type="avg")
            return nd.dot(nd.relu(nd.dot(nd.flatten(h), W3) + b3), W4) + b4

        def loss_m(ps: list[Any], X: Any, y: Any) -> Any:
            return -nd.pick(nd.log_softmax(forward_m(ps, X)), y).sum()

        def book_step_m(X: Any, y: Any, replicas: list[list[Any]], devices: list[Any], lr: float) -> float:
            X_shards, y_shards = md.split_batch(X, y, devices)
            with autograd.record():
                ls = [loss_m(ps, Xs, ys) for Xs, ys, ps in zip(X_shards, y_shards, replicas)]
            for loss_d in ls:
                loss_d.backward()
            for i in range(len(replicas[0])):
                md.allreduce([ps[i].grad for ps in replicas], inplace=True)
            for ps in replicas:
                for p in ps:
                    p[:] = p - lr * p.grad / X.shape[0]
            return sum(float(v.asscalar()) for v in ls)

        def params_m(d: Any) -> list[Any]:
            out = []
            for w in lenet_weights():
                p = md.asarray(w, device=d, backend=name)
                p.attach_grad()
                out.append(p)
            return out

        return Model(params_m, forward_m, book_step_m, {"loss": loss_m}, labels=lambda y: y.astype(np.float32))
    if name == "numpy":
        def book_step_n(X: Any, y: Any, replicas: list[list[Any]], devices: list[Any], lr: float) -> float:
            X_shards, y_shards = md.split_batch(X, y, devices)
            out = [numpy_mlp_grad(ps, Xs, ys) for Xs, ys, ps in zip(X_shards, y_shards, replicas)]
            summed = [md.allreduce([g[i] for _, g in out]) for i in range(len(replicas[0]))]
            for d, ps in enumerate(replicas):
                for p, s in zip(ps, summed):
                    p -= lr * s[d] / X.shape[0]
            return sum(float(np.sum(v)) for v, _ in out)

        def params_n(d: Any) -> list[Any]:
            return [md.asarray(w, device=d, backend=name) for w in mlp_weights()]

        return Model(params_n, numpy_mlp_forward, book_step_n, {"grad": numpy_mlp_grad},
                     images=lambda X: X.reshape(len(X), -1),
                     labels=lambda y: np.eye(CLASSES, dtype=np.float32)[y])
    raise SystemExit(f"multi_gpu_scratch has no model for backend {name!r} (numpy, torch, jax, tensorflow, mxnet)")


def train(md: Any, name: str, model: Model, devices: list[Any], step: str, data: tuple, epochs: int,
          lr: float) -> dict[str, Any]:
    """One run: per-epoch mean training loss, test accuracy, seconds; the replicas at the end."""
    Xtr, ytr, Xte, yte = data
    images, labels = model.images(Xtr), model.labels(ytr)
    replicas = md.replicate(model.params(devices[0]), devices)
    X_test = md.asarray(model.images(Xte), device=devices[0], backend=name)
    run: dict[str, Any] = {"devices": [str(d) for d in devices], "step": step, "loss": [], "accuracy": [],
                           "epoch_s": []}
    for epoch in range(epochs):
        total, seen = 0.0, 0
        t0 = time.perf_counter()
        for idx in batches(len(Xtr), BATCH, epoch):
            X = md.asarray(images[idx], device=devices[0], backend=name)
            y = md.asarray(labels[idx], device=devices[0], backend=name)
            if step == "book":
                assert model.book_step is not None
                total += model.book_step(X, y, replicas, devices, lr)
            else:
                total += md.train_batch(X, y, replicas, devices, lr, **model.step_kw)
            seen += len(idx)
        run["epoch_s"].append(time.perf_counter() - t0)
        run["loss"].append(total / seen)
        run["accuracy"].append(accuracy(md.to_numpy(model.forward(replicas[0], X_test)), yte))
    run["replicas"] = [[np.array(md.to_numpy(p)) for p in r] for r in replicas]
    run["_live"] = replicas  # the trained replicas themselves (not reported)
    return run


def compare(rep: Report, label: str, a: dict[str, Any], b: dict[str, Any], rtol: float, acc_tol: float) -> None:
    """Check that run ``b`` learned what run ``a`` learned in as many epochs (``b`` may be shorter)."""
    e = len(b["loss"])
    la, lb = np.array(a["loss"][:e]), np.array(b["loss"])
    rel = float(np.max(np.abs(la - lb) / np.abs(la)))
    dacc = abs(a["accuracy"][e - 1] - b["accuracy"][-1])
    rep.figure(f"{label}: loss max relative difference", rel)
    rep.figure(f"{label}: accuracy difference", dacc)
    rep.check(f"{label}: loss curves within rtol {rtol:g}", rel <= rtol, f"max relative difference {rel:.2g}")
    rep.check(f"{label}: final test accuracy within {acc_tol:g}", dacc <= acc_tol,
              f"{a['accuracy'][e - 1]:.3f} against {b['accuracy'][-1]:.3f} after {e} epoch(s)")


def check_learning(rep: Report, label: str, run: dict[str, Any], full: bool = True) -> None:
    """A full run reaches MIN_ACCURACY with its loss under LOSS_DROP x the first epoch's; a shortened
    one (``--quick``'s N-device runs, compared with the first epochs of the 1-device run) lowers its
    loss every epoch."""
    loss, acc = run["loss"], run["accuracy"]
    if full:
        rep.check(f"{label}: learns (test accuracy >= {MIN_ACCURACY}, loss < {LOSS_DROP} x the first epoch's)",
                  acc[-1] >= MIN_ACCURACY and loss[-1] < LOSS_DROP * loss[0],
                  f"accuracy {acc[-1]:.3f}, loss {loss[0]:.3f} -> {loss[-1]:.4f}")
    else:
        rep.check(f"{label}: learns (the loss falls every epoch)", all(b < a for a, b in itertools.pairwise(loss)),
                  "loss " + " -> ".join(f"{v:.4f}" for v in loss))


def check_in_sync(rep: Report, label: str, run: dict[str, Any], devices: list[Any]) -> None:
    first = run["replicas"][0]
    if mixed(devices):
        worst = max(float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-12))
                    for r in run["replicas"][1:] for a, b in zip(first, r))
        rep.check(f"{label}: every replica ends where the first does (rtol {MIXED_LOSS_RTOL:g}: mixed devices)",
                  worst <= MIXED_LOSS_RTOL, f"max relative difference {worst:.2g}")
    else:
        same = all(np.array_equal(a, b) for r in run["replicas"][1:] for a, b in zip(first, r))
        rep.check(f"{label}: every replica ends equal to the first, bit for bit", same)


def run(md: Any, name: str, counts: list[int], args: argparse.Namespace, rep: Report) -> None:
    model = model_for(md, name)
    Xtr, ytr, Xte, yte, source = digits()
    data = (Xtr, ytr, Xte, yte)
    epochs = args.epochs or (4 if args.quick else EPOCHS)
    lr = LR.get(name, LENET_LR)
    rep.figure("settings", {"data": source, "train": len(Xtr), "test": len(Xte), "epochs": epochs, "batch": BATCH,
                            "lr": lr, "model": "MLP 64-64-10" if name == "numpy" else "LeNet (8x8)"})
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    for count in [1, *counts]:
        devices = pick_devices(md, name, count)
        if len(devices) < count:
            rep.note(f"{name} has {len(devices)} device(s) here, so no {count}-device run"
                     + (" (torch has one CPU device: its multi-device runs need GPUs)" if name == "torch" else ""))
            continue
        runs[count] = {}
        # --quick (CI): each N-device run is shortened to QUICK_N_EPOCHS and compared with the first
        # epochs of the 1-device run, and the book's step runs at the smallest N only.
        short = args.quick and count > 1
        steps = ("book", "md.train_batch") if count == 1 or not short or count == counts[0] else ("md.train_batch",)
        for step in steps:
            r = train(md, name, model, devices, step, data, min(epochs, QUICK_N_EPOCHS) if short else epochs, lr)
            runs[count][step] = r
            rep.note(f"{count} device(s) [{', '.join(r['devices'])}], {step}: loss "
                     + " ".join(f"{v:.4f}" for v in r["loss"]) + f", accuracy {r['accuracy'][-1]:.3f}, "
                     f"{np.median(r['epoch_s']) * 1e3:.0f} ms/epoch")
            check_learning(rep, f"{count} device(s), {step}", r, full=not short)
            if count > 1:
                check_in_sync(rep, f"{count} devices, {step}", r, devices)
        if len(steps) == 2:
            compare(rep, f"{count} device(s): the book's step against md.train_batch", runs[count]["book"],
                    runs[count]["md.train_batch"], BOOK_RTOL, ACCURACY_TOLERANCE)
        if count > 1:
            rtol = MIXED_LOSS_RTOL if mixed(devices) else LOSS_RTOL
            for step in steps:
                compare(rep, f"{count} devices against 1, {step}", runs[1][step], runs[count][step], rtol,
                        ACCURACY_TOLERANCE)
    report_runs(rep, runs)


def report_runs(rep: Report, runs: dict[int, dict[str, dict[str, Any]]]) -> None:
    rep.figure("runs", {str(c): {s: {k: v for k, v in r.items() if k != "replicas" and not k.startswith("_")}
                                 for s, r in per.items()} for c, per in runs.items()})


def main(argv: list[str] | None = None) -> int:
    return common_main("multi_gpu_scratch", __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
