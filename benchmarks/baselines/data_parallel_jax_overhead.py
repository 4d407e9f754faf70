"""The per-step Python cost of ``md.data_parallel``'s JAX step on one device against a user's own
jitted ``train_step`` (``value_and_grad`` and an optax update in one ``jax.jit``), in the same run:
a tiny linear model, so the step is almost all dispatch and what ``dp.step`` adds shows. Chunks of
steps alternate between the two (each chunk waited for at its end); per step: the median and the
minimum over the chunks (the minimum is the figure a loaded machine disturbs least), the
difference and the ratio. Two inputs: ``host`` batches (NumPy arrays) and ``resident`` ones (already
on the device)::

    python -m multidev.benchmarks.baselines.data_parallel_jax_overhead [--chunk 200] [--chunks 30] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--chunk", type=int, default=200, help="steps per chunk")
    p.add_argument("--chunks", type=int, default=30, help="chunks per variant, alternating")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)

    import multidev as md

    md.backend("jax")
    import jax
    import jax.numpy as jnp
    import optax

    tx = optax.sgd(0.01)

    def loss_fn(params: Any, batch: Any) -> Any:
        x, y = batch
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    def train_step(params: Any, opt_state: Any, batch: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    native = jax.jit(train_step)
    dev = md.devices(backend="jax")[0]
    where = md.native_device(dev, backend="jax")
    init = {"w": jnp.zeros((4, 1)), "b": jnp.zeros((1,))}
    host = (np.ones((8, 4), np.float32), np.ones((8, 1), np.float32))
    rows = []
    for inputs in ("host", "resident"):
        batch: Any = host if inputs == "host" else jax.device_put(host, where)
        dp = md.data_parallel(dict(init), tx, devices=[dev])
        params = jax.device_put(init, where)
        state = tx.init(params)
        for _ in range(100):  # compiled and warm
            loss, params, state = native(params, state, batch)
            dp.step(batch, loss_fn)
        jax.block_until_ready((params, dp.model))
        times: dict[str, list[float]] = {"native": [], "md": []}
        for _ in range(args.chunks):
            t0 = time.perf_counter()
            for _ in range(args.chunk):
                loss, params, state = native(params, state, batch)
            jax.block_until_ready((loss, params))
            t1 = time.perf_counter()
            for _ in range(args.chunk):
                mine = dp.step(batch, loss_fn)
            jax.block_until_ready((mine, dp.model))
            t2 = time.perf_counter()
            times["native"].append((t1 - t0) / args.chunk * 1e6)
            times["md"].append((t2 - t1) / args.chunk * 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        row = {"inputs": inputs, "device": str(dev), "native_us_median": round(med["native"], 2),
               "md_us_median": round(med["md"], 2), "native_us_min": round(low["native"], 2),
               "md_us_min": round(low["md"], 2), "overhead_us_min": round(low["md"] - low["native"], 2),
               "ratio_min": round(low["md"] / low["native"], 3), "ratio_median": round(med["md"] / med["native"], 3)}
        rows.append(row)
        print(f"{inputs:9s} native {row['native_us_min']:6.1f} us (median {row['native_us_median']:6.1f})  "
              f"dp.step {row['md_us_min']:6.1f} us (median {row['md_us_median']:6.1f})  "
              f"+{row['overhead_us_min']:.1f} us, {row['ratio_min']:.3f}x (min)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "chunk": args.chunk, "chunks": args.chunks}, f, indent=1)


if __name__ == "__main__":
    main()
