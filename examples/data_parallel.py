"""Data-parallel training of a tiny linear model, D2L style ("Multi-GPU training", train_batch), on
any backend: ``md.replicate`` puts a replica of the parameters on every device and
``md.train_batch`` splits each minibatch over the devices, computes every device's gradients with
the framework's own autodiff (by hand on NumPy), allreduces them and updates every replica. Only
the loss below is the framework's code. (``multidev.examples.digits`` trains a real classifier.)

    python -m multidev.examples.data_parallel                     # numpy, 2 virtual devices
    python -m multidev.examples.data_parallel --backend jax --devices 4
    python -m multidev.examples.data_parallel --backend torch     # every GPU, or the CPU
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np


def step_kwargs(name: str) -> dict[str, Any]:
    """``loss=`` (the shard's summed squared error in the framework) or, on NumPy, ``grad=``."""
    if name == "numpy":
        def grad(ps: list[Any], X: Any, y: Any) -> tuple[Any, list[Any]]:
            w, b = ps
            r = X @ w + b - y
            # keepdims: a NumPy reduction to a scalar would drop the virtual-device tag
            return (r * r).sum(keepdims=True) / 2, [X.T @ r, r.sum(axis=0)]
        return {"grad": grad}
    if name == "tensorflow":
        import tensorflow as tf

        return {"loss": lambda ps, X, y: tf.reduce_sum((X @ ps[0] + ps[1] - y) ** 2) / 2}
    if name == "mxnet":
        from mxnet import nd

        return {"loss": lambda ps, X, y: ((nd.dot(X, ps[0]) + ps[1] - y) ** 2).sum() / 2}
    return {"loss": lambda ps, X, y: ((X @ ps[0] + ps[1] - y) ** 2).sum() / 2}  # torch, JAX, array API


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="numpy", help="numpy (default), torch, jax, tensorflow or mxnet")
    p.add_argument("--devices", type=int, default=2, help="virtual CPU devices where the backend has them")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args(argv)
    from multidev.registry import configure_virtual_devices

    configure_virtual_devices(max(1, args.devices))  # before the framework initialises
    import multidev as md

    name = args.backend
    md.backend(name)
    gpus = md.devices(backend=name, kind="gpu")
    devices = (gpus or md.devices(backend=name, kind="cpu"))[: max(1, args.devices)]
    kw = step_kwargs(name)

    rng = np.random.default_rng(0)
    true_w = np.array([[2.0], [-3.4], [0.5], [1.0]], dtype=np.float32)
    X_all = rng.normal(size=(args.batch * args.steps, 4)).astype(np.float32)
    y_all = (X_all @ true_w + 4.2 + 0.01 * rng.normal(size=(len(X_all), 1))).astype(np.float32)

    params = [md.zeros((4, 1), device=devices[0], backend=name), md.zeros(1, device=devices[0], backend=name)]
    replicas = md.replicate(params, devices)  # D2L's get_params + broadcast: one list per device
    losses = []
    for step in range(args.steps):
        sl = slice(step * args.batch, (step + 1) * args.batch)
        X = md.asarray(X_all[sl], device=devices[0], backend=name)
        y = md.asarray(y_all[sl], device=devices[0], backend=name)
        losses.append(md.train_batch(X, y, replicas, devices, args.lr, **kw) / args.batch)
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.5f}")
    w = [np.asarray(md.to_numpy(r[0])) for r in replicas]
    assert all(np.array_equal(w[0], v) for v in w), "replicas diverged"
    assert losses[-1] < losses[0] / 100, f"loss did not decrease: {losses[0]:.4f} -> {losses[-1]:.4f}"
    fmt = lambda a: ", ".join(f"{v:.3f}" for v in a.ravel())
    print(f"{name} on {', '.join(map(str, devices))}: loss {losses[0]:.4f} -> {losses[-1]:.6f}; "
          f"w = [{fmt(w[0])}] (true [{fmt(true_w)}])")
    return 0


if __name__ == "__main__":
    sys.exit(main())
