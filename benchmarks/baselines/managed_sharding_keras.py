"""The cost of multidev's own sharding of a Keras optimizer's state over one process's devices
(``md.data_parallel(model, opt, mesh=(1, N) mesh, param_axis="model")``, ZeRO's stage 1) against the
same data-parallel step with the state whole on the first device (``param_axis=()``: the framework's
replica over the same N devices, the same forward and backward) and against Keras's own step on
one device (``GradientTape`` + ``apply_gradients``, eager, and with the update as one
``tf.function``). An MLP on 784 inputs, Adam, the same initial
weights and batches; median step time of each (their steps interleaved, each waited for), the
ratios, and the largest weight difference after the same steps::

    python -m multidev.benchmarks.baselines.managed_sharding_keras [--devices 2] [--steps 40] [--json out.json]

``--devices N`` sets ``MULTIDEV_TF_CPU_DEVICES`` (N logical CPU devices) before TensorFlow starts,
unless it is set. Keras has no sharded training of its own on TensorFlow, so the sharded step has no
native baseline: the replicated step is the one to read it against (what sharding adds: each
device's piece of the gradient moved to it, N optimizer steps over pieces instead of one over the
whole, the pieces moved back and concatenated). The pieces' update runs as one ``tf.function`` while
the replicated step's runs eagerly (as the user's ``apply_gradients`` does), so read the sharded step
against Keras's traced one-device step too.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    os.environ.setdefault("MULTIDEV_TF_CPU_DEVICES", str(a.devices))
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import numpy as np

    import multidev as md

    md.devices(backend="tensorflow")  # the logical devices, before Keras starts TensorFlow
    import keras
    import tensorflow as tf

    def make() -> Any:
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((784,)), keras.layers.Dense(a.width, activation="relu"),
                                 keras.layers.Dense(a.width, activation="relu"), keras.layers.Dense(10)])

    def loss_fn(m: Any, b: Any) -> Any:
        return tf.reduce_mean(tf.square(m(b[0]) - b[1]))

    mesh = md.make_mesh((1, a.devices), ("data", "model"), backend="tensorflow")
    one, one_opt = make(), keras.optimizers.Adam(1e-3)
    whole_net, sharded_net = make(), make()
    whole = md.data_parallel(whole_net, keras.optimizers.Adam(1e-3), mesh=mesh, param_axis=())
    sharded = md.data_parallel(sharded_net, keras.optimizers.Adam(1e-3), mesh=mesh, param_axis="model")
    rng = np.random.default_rng(0)
    batches = [(tf.constant(rng.normal(size=(a.batch, 784)).astype(np.float32)),
                tf.constant(rng.normal(size=(a.batch, 10)).astype(np.float32))) for _ in range(4)]

    def keras_step(b: Any) -> Any:
        with tf.GradientTape() as t:
            loss = loss_fn(one, b)
        one_opt.apply_gradients(zip(t.gradient(loss, one.trainable_variables), one.trainable_variables))
        return loss

    traced, traced_opt = make(), keras.optimizers.Adam(1e-3)
    update = tf.function(lambda gs: traced_opt.apply_gradients(zip(gs, traced.trainable_variables)))

    def keras_traced_step(b: Any) -> Any:  # the update as one tf.function, as the sharded pieces' is
        with tf.GradientTape() as t:
            loss = loss_fn(traced, b)
        update(t.gradient(loss, traced.trainable_variables))
        return loss

    steps = {"keras, one device": keras_step, "keras, one device, update traced": keras_traced_step,
             f"md, {a.devices} devices, state whole": lambda b: whole.step(b, loss_fn),
             f"md, {a.devices} devices, state sharded": lambda b: sharded.step(b, loss_fn)}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for i in range(a.steps + 3):
        for name, step in steps.items():
            b = batches[i % len(batches)]
            t0 = time.perf_counter()
            loss = step(b)
            float(loss)  # waited for
            if i >= 3:
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    names = list(steps)
    diff = max(float(np.abs(x - y).max()) for x, y in zip(whole_net.get_weights(), sharded_net.get_weights()))
    rows = [{"variant": k, "median_ms": med[k], "vs_state_whole": med[k] / med[names[2]],
             "vs_keras": med[k] / med[names[0]]} for k in names]
    print(f"Keras MLP 784-{a.width}-{a.width}-10, Adam, batch {a.batch}, {a.devices} logical CPU devices, "
          f"{a.steps} steps (medians)")
    print("| variant | median ms | / state whole | / Keras one device |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['variant']} | {r['median_ms']:.2f} | {r['vs_state_whole']:.3f} | {r['vs_keras']:.3f} |")
    print(f"largest weight difference, sharded against whole: {diff:.2e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"devices": a.devices, "steps": a.steps, "batch": a.batch, "width": a.width, "rows": rows,
                       "max_weight_diff": diff}, f, indent=1)


if __name__ == "__main__":
    main()
