"""Training on a mesh of every GPU (issue 34): ``md.data_parallel(params, tx, mesh=m, data_axis="data")``
on JAX, the parameters and Adam's moments along ``model``, against the same steps on one GPU (the
largest relative difference of the losses and the parameters), and the step's median time against
a JAX user's own jitted step with the same shardings in the same run. Prints one line per figure;
exit status 1 when the losses differ by more than 1e-4 (relative) or a parameter is not sharded.
    python scripts/gpu/mesh_training.py"""
from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import multidev as md


def main() -> int:
    gpus = md.devices("jax", "gpu") or md.devices("jax", "cpu")  # (CPUs: a dry run, MULTIDEV_JAX_CPU_DEVICES=4)
    n = len(gpus)
    shape = (2, n // 2) if n >= 4 and n % 2 == 0 else (n, 1)
    mesh = md.make_mesh(shape, ("data", "model"), devices=gpus, backend="jax")
    print(f"gpus {n}, mesh {dict(zip(mesh.axis_names, mesh.shape))}")
    rng = np.random.default_rng(0)
    params = {"w1": jnp.asarray(rng.normal(size=(1024, 4096)) * 0.02, jnp.float32), "b1": jnp.zeros(4096),
              "w2": jnp.asarray(rng.normal(size=(4096, 1024)) * 0.02, jnp.float32), "b2": jnp.zeros(1024)}

    def loss_fn(p, batch):
        x, y = batch
        return jnp.mean((jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"] - y) ** 2)

    rows = 64 * shape[0]
    batches = [(jnp.asarray(rng.normal(size=(rows, 1024)), jnp.float32),
                jnp.asarray(rng.normal(size=(rows, 1024)), jnp.float32)) for _ in range(10)]
    sharded = md.data_parallel(params, optax.adam(1e-3), mesh=mesh, data_axis="data")
    single = md.data_parallel(md.to(params, gpus[0]), optax.adam(1e-3))
    a = [float(sharded.step(b, loss_fn)) for b in batches]
    s = [float(single.step(b, loss_fn)) for b in batches]
    loss_err = max(abs(x - y) / abs(y) for x, y in zip(a, s))
    param_err = max(float(np.max(np.abs(np.asarray(sharded.model[k]) - np.asarray(single.model[k])))
                          / (np.max(np.abs(np.asarray(single.model[k]))) or 1.0)) for k in params)
    layout = md.layout_of(sharded.model["w1"])
    print(f"losses rel diff {loss_err:.2e}, parameters rel diff {param_err:.2e}, w1 layout {layout.spec_text()}")

    tx = optax.adam(1e-3)
    p_sh = jax.tree_util.tree_map(lambda x: x.sharding, sharded.model)
    o_sh = jax.tree_util.tree_map(lambda x: x.sharding, sharded.replica.opt_state)
    p = jax.device_put(params, p_sh)
    o = jax.jit(tx.init, out_shardings=o_sh)(p)
    batch = md.to(batches[0][0], md.Layout(mesh, ("data", None))), md.to(batches[0][1], md.Layout(mesh, ("data", None)))

    @jax.jit
    def own(p, o, b):
        loss, g = jax.value_and_grad(loss_fn)(p, b)
        u, o = tx.update(g, o, p)
        return loss, optax.apply_updates(p, u), o

    state = [p, o]

    def run_own() -> None:
        loss, state[0], state[1] = own(state[0], state[1], batch)
        loss.block_until_ready()

    def run_md() -> None:
        sharded.step(batch, loss_fn).block_until_ready()

    times: dict[str, list[float]] = {"md": [], "own": []}
    for f in (run_md, run_own):
        for _ in range(10):
            f()
    for _ in range(9):
        for name, f in (("md", run_md), ("own", run_own)):
            t = time.perf_counter()
            for _ in range(20):
                f()
            times[name].append((time.perf_counter() - t) / 20 * 1e6)
    m, u = float(np.median(times["md"])), float(np.median(times["own"]))
    print(f"step median: md.data_parallel(mesh=) {m:.0f} us, own jitted step {u:.0f} us, ratio {m / u:.2f}")
    ok = loss_err <= 1e-4 and (shape[1] == 1 or layout != md.Layout(mesh, (None, None)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
