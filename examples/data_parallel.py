"""Data-parallel training of a tiny linear model, D2L style ("Multi-GPU training", train_batch):
split each minibatch over the devices, compute the loss and its gradients on every device, allreduce
the gradients, and update every device's replica of the parameters. The same loop runs on any
backend; only the few lines that compute a gradient are the framework's own.

    python examples/data_parallel.py                     # numpy, 2 virtual devices
    python examples/data_parallel.py --backend jax --devices 4
    python examples/data_parallel.py --backend torch     # every GPU, or the CPU
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np


def gradient_fn(name: str, backend: Any) -> Callable[[Any, Any, Any, Any, Any], tuple[Any, Any, Any]]:
    """``grad(w, b, X, y, device) -> (loss, dw, db)`` of the summed squared error on one device,
    with the framework's own autodiff (NumPy: by hand). Results live on ``device``."""
    if name == "numpy":
        def grad(w, b, X, y, device):
            r = X @ w + b - y
            # keepdims: a NumPy reduction to a scalar would drop the virtual-device tag
            return (r * r).sum(keepdims=True) / 2, X.T @ r, r.sum(axis=0, keepdims=True)
    elif name == "torch":

        def grad(w, b, X, y, device):
            w, b = w.detach().requires_grad_(), b.detach().requires_grad_()
            loss = ((X @ w + b - y) ** 2).sum() / 2
            loss.backward()
            return loss.detach(), w.grad, b.grad
    elif name == "jax":
        import jax

        def _loss(w, b, X, y):
            r = X @ w + b - y
            return (r * r).sum() / 2

        vg = jax.value_and_grad(_loss, argnums=(0, 1))

        def grad(w, b, X, y, device):
            loss, (dw, db) = vg(w, b, X, y)  # runs where its (committed) inputs live
            return loss, dw, db
    elif name == "tensorflow":
        import tensorflow as tf

        def grad(w, b, X, y, device):
            with tf.device(backend.to_native_device(device)):  # TF places ops by scope, not by input
                with tf.GradientTape() as tape:
                    tape.watch([w, b])
                    loss = tf.reduce_sum((X @ w + b - y) ** 2) / 2
                dw, db = tape.gradient(loss, [w, b])
                return loss, tf.identity(dw), tf.identity(db)
    elif name == "mxnet":
        from mxnet import autograd, nd

        def grad(w, b, X, y, device):
            w, b = w.copy(), b.copy()
            w.attach_grad()
            b.attach_grad()
            with autograd.record():
                loss = ((nd.dot(X, w) + b - y) ** 2).sum() / 2
            loss.backward()
            return loss, w.grad, b.grad
    else:
        raise SystemExit(f"no gradient function for backend {name!r} in this example")
    return grad


def train_batch(md: Any, grad: Callable, X: Any, y: Any, params: list[list[Any]], devices: list, lr: float) -> float:
    """One D2L ``train_batch``: split, per-device gradients, allreduce, identical updates."""
    b = md.backend_of(X)
    X_shards, y_shards = md.split_batch(X, y, devices)
    results = [grad(w, bias, Xs, ys, d) for (w, bias), Xs, ys, d in zip(params, X_shards, y_shards, devices)]
    losses = [r[0] for r in results]
    inplace = b.capabilities.mutable  # mutable backends reduce into the gradient buffers themselves
    grads_w = md.allreduce([r[1] for r in results], op="sum", inplace=inplace)
    grads_b = md.allreduce([r[2] for r in results], op="sum", inplace=inplace)
    n = b.shape_of(X)[0]
    # every replica takes the same step (rebinding works for immutable and mutable backends alike)
    for i, (gw, gb) in enumerate(zip(grads_w, grads_b)):
        w, bias = params[i]
        params[i] = [w - gw * (lr / n), bias - gb * (lr / n)]
    total = md.reduce(losses, devices[0], op="sum")
    return float(np.asarray(md.to_numpy(total)).sum()) / n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="numpy", help="numpy (default), torch, jax, tensorflow or mxnet")
    p.add_argument("--devices", type=int, default=2, help="virtual CPU devices where the backend has them")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args(argv)
    for var in ("MULTIDEV_NUMPY_DEVICES", "MULTIDEV_JAX_CPU_DEVICES", "MULTIDEV_TF_CPU_DEVICES",
                "MULTIDEV_MXNET_CPU_DEVICES"):
        os.environ.setdefault(var, str(args.devices))  # before the framework initialises
    import multidev as md

    backend = md.backend(args.backend)
    gpus = md.devices(backend=args.backend, kind="gpu")
    devices = (gpus or md.devices(backend=args.backend, kind="cpu"))[: max(1, args.devices)]
    grad = gradient_fn(args.backend, backend)

    rng = np.random.default_rng(0)
    true_w = np.array([[2.0], [-3.4], [0.5], [1.0]], dtype=np.float32)
    true_b = np.float32(4.2)
    X_all = rng.normal(size=(args.batch * args.steps, 4)).astype(np.float32)
    y_all = (X_all @ true_w + true_b + 0.01 * rng.normal(size=(len(X_all), 1))).astype(np.float32)

    # one replica of the parameters per device (D2L's get_params + broadcast)
    w0 = md.asarray(np.zeros((4, 1), np.float32), device=devices[0], backend=args.backend)
    b0 = md.asarray(np.zeros((1, 1), np.float32), device=devices[0], backend=args.backend)
    params = [list(pair) for pair in zip(md.broadcast(w0, devices), md.broadcast(b0, devices))]

    losses = []
    for step in range(args.steps):
        sl = slice(step * args.batch, (step + 1) * args.batch)
        X = md.asarray(X_all[sl], device=devices[0], backend=args.backend)
        y = md.asarray(y_all[sl], device=devices[0], backend=args.backend)
        losses.append(train_batch(md, grad, X, y, params, devices, args.lr))
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.5f}")
    md.synchronize()
    w_learned = [np.asarray(md.to_numpy(w)) for w, _ in params]
    assert all(np.array_equal(w_learned[0], w) for w in w_learned), "replicas diverged"
    assert losses[-1] < losses[0] / 100, f"loss did not decrease: {losses[0]:.4f} -> {losses[-1]:.4f}"
    print(f"{args.backend} on {', '.join(map(str, devices))}: loss {losses[0]:.4f} -> {losses[-1]:.6f}; "
          f"w = [{', '.join(f'{v:.3f}' for v in w_learned[0].ravel())}] "
          f"(true [{', '.join(f'{v:.3f}' for v in true_w.ravel())}])")
    return 0


if __name__ == "__main__":
    sys.exit(main())
