"""``md.data_parallel``'s step over several devices of one JAX process against JAX's own data-parallel
``jit`` over the same devices, in the same run: a ``Mesh`` of the devices, ``NamedSharding`` with
the batch's rows sharded and the parameters and optimizer state replicated, one jitted
``value_and_grad`` + optax update (XLA inserts the gradients' all-reduce). A CNN and an MLP on
28x28 inputs, optax SGD with momentum, the same initial parameters and batches. Median step time of
each (their steps interleaved, each waited for), the ratio, and the largest parameter difference
after the same steps. On a CPU the devices are XLA host devices::

    python -m multidev.benchmarks.baselines.data_parallel_jax [--devices 4] [--steps 60] [--json out.json]

``--devices N`` sets ``MULTIDEV_JAX_CPU_DEVICES`` (N virtual CPU devices) before JAX starts, unless
it is set; on a GPU machine the first N GPUs are used. Two inputs: ``host`` batches (NumPy arrays
from a data loader, placed sharded by each step) and ``resident`` batches (already sharded over the
mesh: the step alone).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import numpy as np


def _init(rng: np.random.Generator, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    out = []
    for s in shapes:
        fan_in = int(np.prod(s[:-1])) if len(s) > 1 else 1
        out.append((rng.standard_normal(s) / np.sqrt(fan_in)).astype(np.float32) if len(s) > 1
                   else np.zeros(s, np.float32))
    return out


def _models(jax: Any) -> dict[str, tuple[Any, list[tuple[int, ...]]]]:
    jnp = jax.numpy

    def conv(x: Any, w: Any, b: Any) -> Any:
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.nn.relu(y + b)

    def pool(x: Any) -> Any:
        n, h, w, c = x.shape
        return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))

    def cnn(p: list[Any], x: Any) -> Any:
        h = pool(conv(x, p[0], p[1]))
        h = pool(conv(h, p[2], p[3])).reshape(x.shape[0], -1)
        return jax.nn.relu(h @ p[4] + p[5]) @ p[6] + p[7]

    def mlp(p: list[Any], x: Any) -> Any:
        h = jax.nn.relu(x.reshape(x.shape[0], -1) @ p[0] + p[1])
        h = jax.nn.relu(h @ p[2] + p[3])
        return h @ p[4] + p[5]

    del jnp
    return {"cnn": (cnn, [(5, 5, 1, 16), (16,), (5, 5, 16, 32), (32,), (7 * 7 * 32, 128), (128,), (128, 10), (10,)]),
            "mlp": (mlp, [(784, 512), (512,), (512, 512), (512,), (512, 10), (10,)])}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--steps", type=int, default=60, help="timed steps per variant (after 10 warm-up steps)")
    p.add_argument("--batch", type=int, default=128, help="rows per step (all devices together)")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    os.environ.setdefault("MULTIDEV_JAX_CPU_DEVICES", str(args.devices))

    import multidev as md

    md.backend("jax")
    import jax
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devs = md.devices(backend="jax")
    devs = ([d for d in devs if d.is_gpu] or devs)[:args.devices]
    if len(devs) < args.devices:
        raise SystemExit(f"--devices {args.devices}: JAX has {len(devs)} here")
    mesh = Mesh(np.array([md.native_device(d, backend="jax") for d in devs]), ("batch",))
    replicated, sharded = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("batch"))
    tx = optax.sgd(0.05, momentum=0.9)
    rows = []
    for name, (forward, shapes) in _models(jax).items():
        def loss_fn(params: list[Any], batch: tuple[Any, Any], forward: Any = forward) -> Any:
            return optax.softmax_cross_entropy_with_integer_labels(forward(params, batch[0]), batch[1]).mean()

        def native_step(params: Any, opt_state: Any, batch: Any, loss_fn: Any = loss_fn) -> Any:
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return loss, optax.apply_updates(params, updates), opt_state

        init = _init(np.random.default_rng(0), shapes)
        native = jax.jit(native_step, in_shardings=(replicated, replicated, sharded),
                         out_shardings=(replicated, replicated, replicated))
        for inputs in ("host", "resident"):
            n_params = jax.device_put([jax.numpy.asarray(w) for w in init], replicated)
            n_state = jax.device_put(tx.init(n_params), replicated)
            dp = md.data_parallel([jax.numpy.asarray(w) for w in init], tx, devices=devs)
            times: dict[str, list[float]] = {"md": [], "native": []}
            rng = np.random.default_rng(1)
            for i in range(10 + args.steps):
                host = (rng.standard_normal((args.batch, 28, 28, 1), np.float32),
                        rng.integers(0, 10, args.batch).astype(np.int32))
                batch = host if inputs == "host" else jax.block_until_ready(jax.device_put(host, sharded))
                t0 = time.perf_counter()
                loss = dp.step(batch, loss_fn)
                jax.block_until_ready((loss, dp.model))
                t1 = time.perf_counter()
                loss, n_params, n_state = native(n_params, n_state, jax.device_put(batch, sharded))
                jax.block_until_ready((loss, n_params))
                t2 = time.perf_counter()
                if i >= 10:
                    times["md"].append(t1 - t0)
                    times["native"].append(t2 - t1)
            diff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(dp.model, n_params))
            scale = max(float(np.abs(np.asarray(b)).max()) for b in n_params)
            med, base = statistics.median(times["md"]), statistics.median(times["native"])
            rows.append({"model": name, "inputs": inputs, "median_ms": med * 1e3, "native_median_ms": base * 1e3,
                         "ratio": med / base, "max_param_diff": diff, "max_param": scale})
            dp.close()
    print(f"{len(devs)} JAX devices ({', '.join(str(d) for d in devs)}), one process, {args.batch} rows per step, "
          f"{args.steps} timed steps, JAX {jax.__version__}")
    for r in rows:
        print(f"{r['model']:4s} {r['inputs']:8s} md {r['median_ms']:8.2f} ms  "
              f"native jit {r['native_median_ms']:8.2f} ms  "
              f"ratio {r['ratio']:.3f}  max |param diff| {r['max_param_diff']:.1e} (largest |param| "
              f"{r['max_param']:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"devices": len(devs), "batch": args.batch, "steps": args.steps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
