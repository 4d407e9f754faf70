"""A small model sharded over a 2x2 mesh of CPU devices, the same code on JAX, NumPy and TensorFlow.

A two-layer perceptron ``y = relu(x @ w1) @ w2`` is laid out Megatron-style over a mesh with axes
``data`` and ``model``: the batch ``x`` is cut along ``data``, ``w1``'s columns and ``w2``'s rows
along ``model`` (each device holds a quarter of ``x`` and half of each weight), so every device
computes its part with the framework's own operators and no communication, and the output comes out
as partial sums along ``model``; one change of layout adds them up (an allreduce along ``model``).
The result equals the unsharded model computed with NumPy. On JAX the weights are ``jax.Array``\\ s
with a ``NamedSharding``; on NumPy or TensorFlow, multidev's managed shards (torch too, on a machine
with four GPUs; MXNet's ``NDArray`` has no ``@`` operator, so this model's code does not run on it).

    python -m multidev.examples.mesh_model                  # JAX and NumPy
    python -m multidev.examples.mesh_model --backend tensorflow

Virtual CPU devices are set here (4 per backend) before any framework starts.
"""
from __future__ import annotations

import argparse
import os
from typing import Any

for _var in ("MULTIDEV_JAX_CPU_DEVICES", "MULTIDEV_TF_CPU_DEVICES", "MULTIDEV_NUMPY_DEVICES",
             "MULTIDEV_MXNET_CPU_DEVICES"):
    os.environ[_var] = "4"  # (before the frameworks start: their device counts are fixed then)

import numpy as np  # noqa: E402

import multidev as md  # noqa: E402

BATCH, IN, HIDDEN, OUT = 8, 6, 12, 3


def local_forward(x: Any, w1: Any, w2: Any) -> Any:
    """One device's part of the forward pass, with the tensors' own operators (any framework)."""
    h = x @ w1
    h = (h + abs(h)) / 2  # relu
    return h @ w2


def sharded_forward(params: dict[str, Any], x: Any, mesh: md.Mesh, backend: str) -> Any:
    """The model's output, laid out with the batch cut along ``data`` (the pieces computed where they
    live, the partial sums along ``model`` added up by one change of layout)."""
    xs, w1s, w2s = md.shards_of(x), md.shards_of(params["w1"]), md.shards_of(params["w2"])
    outs = []
    for dev, xl, w1l, w2l in zip(mesh.devices, xs, w1s, w2s):
        with md.device_scope(dev, backend=backend):  # the framework computes on this device
            outs.append(local_forward(xl, w1l, w2l))
    partial = md.from_shards(outs, md.Layout(mesh, ("data", None), partial="model"))
    return md.to(partial, md.Layout(mesh, ("data", None)))


def run(backend: str, seed: int = 0) -> dict[str, Any]:
    """Shard the model on ``backend``, run it, and compare with NumPy's unsharded result."""
    rng = np.random.default_rng(seed)
    host = {"w1": rng.standard_normal((IN, HIDDEN)).astype(np.float32),
            "w2": rng.standard_normal((HIDDEN, OUT)).astype(np.float32)}
    x_host = rng.standard_normal((BATCH, IN)).astype(np.float32)

    mesh = md.make_mesh((2, 2), ("data", "model"), backend=backend)
    layouts = {"w1": md.Layout(mesh, (None, "model")), "w2": md.Layout(mesh, ("model", None))}
    params = {k: md.to(md.asarray(v, backend=backend), layouts[k]) for k, v in host.items()}
    x = md.to(md.asarray(x_host, backend=backend), md.Layout(mesh, ("data", None)))

    y = sharded_forward(params, x, mesh, backend)

    want = np.maximum(x_host @ host["w1"], 0) @ host["w2"]
    got = md.to_host(y)
    return {"backend": backend, "mesh": str(mesh), "type": type(params["w1"]).__module__.split(".")[0] + "." +
            type(params["w1"]).__name__, "w1 pieces": [tuple(md.backend_of(p).shape_of(p)) for p in
                                                        md.shards_of(params["w1"])],
            "output layout": md.layout_of(y).spec_text(),  # type: ignore[union-attr]
            "max error": float(np.max(np.abs(got - want)))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", nargs="+", default=["jax", "numpy"])
    args = p.parse_args(argv)
    for name in args.backend:
        r = run(name)
        print(f"{r['backend']}: {r['type']}, w1 pieces {r['w1 pieces']}, output {r['output layout']}, "
              f"max error {r['max error']:.2e}")
        if not r["max error"] < 1e-4:
            print(f"{name}: the sharded model differs from NumPy's")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
