"""A model trained sharded over a 2x2 mesh of processes ("data" x "model"), the same multidev code
on PyTorch and JAX: ``md.data_parallel(model, optimizer, mesh=dist.process_mesh((2, 2), ("data",
"model")), data_axis="data", param_axis="model")`` cuts every batch along ``data`` and each
parameter and its optimizer state along ``model`` (torch: FSDP2 under the torch engine; JAX: one
jitted program over global arrays under the jax engine). Only :func:`build` (the model, the
optimizer, the loss) is the framework's code::

    python -m multidev.examples.mesh_training --backend jax      # starts its 4 processes itself,
    python -m multidev.examples.mesh_training --backend torch    # then checks them against one process
    python -m multidev.distributed.launch -n 4 --engine jax -m multidev.examples.mesh_training --backend jax

Started without a launcher, it launches the 4 processes (``multidev.distributed.launch``), trains
the same model in this one process on the whole batches meanwhile (``md.data_parallel(model,
optimizer)``, no mesh), and checks that the losses decrease and that the 4 processes' match one
process's; under a launcher, it trains and rank 0 prints (and writes ``--json``) the losses.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

SIZES, LR, BATCH = (8, 32, 32, 4), 1e-2, 32
ENGINES = {"torch": "torch", "jax": "jax"}


def weights() -> list[tuple[np.ndarray, np.ndarray]]:
    """The MLP's initial weights, ``(in, out)`` matrices and biases: the same for every framework."""
    rng = np.random.default_rng(0)
    return [((rng.normal(size=(i, o)) / np.sqrt(i)).astype(np.float32), np.zeros(o, np.float32))
            for i, o in itertools.pairwise(SIZES)]


def batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``steps`` global batches of a regression onto a fixed random teacher network."""
    rng = np.random.default_rng(1)
    teacher = rng.normal(size=(SIZES[0], SIZES[-1])).astype(np.float32)
    out = []
    for _ in range(steps):
        x = rng.normal(size=(BATCH, SIZES[0])).astype(np.float32)
        out.append((x, np.tanh(x @ teacher).astype(np.float32)))
    return out


def build(backend: str) -> tuple[Any, Any, Any]:
    """The framework's own model, optimizer and loss function: all that differs per framework."""
    if backend == "torch":
        import torch

        layers: list[Any] = []
        for w, b in weights():
            lin = torch.nn.Linear(*w.shape)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w.T.copy()))  # nn.Linear keeps (out, in)
                lin.bias.copy_(torch.from_numpy(b))
            layers += [lin, torch.nn.Tanh()]
        net = torch.nn.Sequential(*layers[:-1])
        return net, torch.optim.Adam(net.parameters(), lr=LR), \
            lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]), batch[1])
    import jax.numpy as jnp
    import optax

    params = [{"w": jnp.asarray(w), "b": jnp.asarray(b)} for w, b in weights()]

    def loss(ps: list[Any], batch: Any) -> Any:
        x = batch[0]
        for i, p in enumerate(ps):
            x = x @ p["w"] + p["b"]
            x = jnp.tanh(x) if i < len(ps) - 1 else x
        return jnp.mean((x - batch[1]) ** 2)
    return params, optax.adam(LR), loss


def train(backend: str, steps: int, mesh: Any = None) -> list[float]:
    """The same multidev code for every framework: ``steps`` steps on :func:`batches`, sharded over
    ``mesh`` (a process mesh) or on one device; the losses, each the global batch's mean."""
    import multidev as md
    from multidev import distributed as dist

    model, optimizer, loss_fn = build(backend)
    if mesh is None:
        dp = md.data_parallel(model, optimizer)
    else:
        dp = md.data_parallel(model, optimizer, mesh=mesh, data_axis="data", param_axis="model")
    losses = []
    for x, y in batches(steps):
        batch = (md.asarray(x, backend=backend), md.asarray(y, backend=backend))
        losses.append(float(dp.step(dp.shard(batch), loss_fn)))
    if mesh is not None:  # torch gives each rank its rows' loss, JAX the batch's: the mean over ranks is the batch's
        losses = [float(v) for v in np.asarray(dist.allreduce(np.array(losses, np.float32), "mean"))]
    return losses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--backend", choices=sorted(ENGINES), default="jax")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--json", help="rank 0 writes the losses here")
    args = p.parse_args(argv)
    from multidev import distributed as dist

    if dist.detect_launch():  # one of the 4 processes
        dist.init()
        losses = train(args.backend, args.steps, dist.process_mesh((2, 2), ("data", "model")))
        if dist.rank() == 0:
            print(f"{args.backend} over a 2x2 process mesh: loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(losses, f)
        dist.shutdown()
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "losses.json")
        env = dict(os.environ, MULTIDEV_JAX_CPU_DEVICES=os.environ.get("MULTIDEV_JAX_CPU_DEVICES", "1"))
        job = subprocess.Popen([sys.executable, "-m", "multidev.distributed.launch", "-n", "4", "--engine",
                                ENGINES[args.backend], "-m", "multidev.examples.mesh_training", "--backend",
                                args.backend, "--steps", str(args.steps), "--json", out], env=env)
        one = train(args.backend, args.steps)  # meanwhile: one process, the whole batches
        if job.wait() != 0:
            print(f"the 4 processes failed (status {job.returncode})", file=sys.stderr)
            return 1
        with open(out) as f:
            sharded = json.load(f)
    print(f"{args.backend}, one process:     loss {one[0]:.4f} -> {one[-1]:.4f}")
    print(f"{args.backend}, 2x2 process mesh: loss {sharded[0]:.4f} -> {sharded[-1]:.4f}")
    if not one[-1] < one[0] / 2:
        print(f"the loss did not decrease: {one[0]:.4f} -> {one[-1]:.4f}", file=sys.stderr)
        return 1
    worst = max(abs(a - b) / abs(b) for a, b in zip(sharded, one))
    if worst > 1e-4:
        print(f"the sharded losses differ from one process's by up to {worst:.2e} (relative)", file=sys.stderr)
        return 1
    print(f"the same losses (largest relative difference {worst:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
