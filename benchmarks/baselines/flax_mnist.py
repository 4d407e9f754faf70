"""Issue 32's measurement: google/flax's ``examples/mnist`` training loop (its CNN, its jitted
``apply_model`` and ``update_model``, a test-set evaluation after each epoch) on synthetic MNIST-sized
data, once with the ``TrainState`` placed by ``jax.device_put`` and once by ``md.to``, the two
alternated; wall and CPU time of each whole run (compilations included: a placement that makes
``jit`` see other argument types costs traces and compilations), the jitted functions' cache entries
and the number of XLA compilations each run made.

    python -m multidev.benchmarks.baselines.flax_mnist [--steps 300] [--epochs 3] [--batch 32]
        [--reps 5] [--as-created] [--markdown OUT.md]

Needs flax and optax. Each run builds its own jitted functions and a fresh ``TrainState`` (its
``step`` a Python int, its arrays uncommitted, as ``TrainState.create`` gives them), so every run
compiles from nothing; the data are NumPy arrays, as the example's ``tfds`` batches are.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["main", "run_once"]

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _model(nn: Any) -> Any:
    class CNN(nn.Module):  # the flax example's model
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.relu(nn.Conv(features=32, kernel_size=(3, 3))(x))
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = nn.relu(nn.Conv(features=64, kernel_size=(3, 3))(x))
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = x.reshape((x.shape[0], -1))
            x = nn.relu(nn.Dense(features=256)(x))
            return nn.Dense(features=10)(x)
    return CNN()


def _steps(jax: Any, optax: Any) -> tuple[Any, Any]:
    """Fresh jitted ``apply_model`` and ``update_model`` (new functions: nothing compiled yet)."""
    def apply_model(state: Any, images: Any, labels: Any) -> Any:
        def loss_fn(params: Any) -> Any:
            logits = state.apply_fn({"params": params}, images)
            one_hot = jax.nn.one_hot(labels, 10)
            return optax.softmax_cross_entropy(logits=logits, labels=one_hot).mean(), logits
        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        return grads, loss, (logits.argmax(-1) == labels).mean()

    def update_model(state: Any, grads: Any) -> Any:
        return state.apply_gradients(grads=grads)
    return jax.jit(apply_model), jax.jit(update_model)


def run_once(place: Callable[[Any], Any], data: dict[str, np.ndarray], steps: int, epochs: int,
             batch: int) -> dict[str, Any]:
    """One training run, its state placed by ``place``: wall seconds, compilations, last losses."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import linen as nn
    from flax.training import train_state

    compiles = [0]

    def listen(event: str, _secs: float, **_kw: Any) -> None:
        if event == _COMPILE_EVENT:
            compiles[0] += 1
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        cnn = _model(nn)
        params = cnn.init(jax.random.PRNGKey(0), jnp.ones((1, 28, 28, 1)))["params"]
        state = train_state.TrainState.create(apply_fn=cnn.apply, params=params, tx=optax.sgd(0.1, 0.9))
        state = place(state)
        apply_model, update_model = _steps(jax, optax)
        n = data["train_x"].shape[0]
        losses = []
        for _ in range(epochs):
            for s in range(steps):
                i = (s * batch) % (n - batch + 1)
                grads, loss, _acc = apply_model(state, data["train_x"][i:i + batch], data["train_y"][i:i + batch])
                state = update_model(state, grads)
            _g, test_loss, test_acc = apply_model(state, data["test_x"], data["test_y"])
            losses.append((float(loss), float(test_loss), float(test_acc)))
        jax.block_until_ready(state)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return {"wall": wall, "cpu": cpu, "compiles": compiles[0], "losses": losses,
            "cache": (apply_model._cache_size(), update_model._cache_size())}


def _placement_calls(places: dict[str, Callable[[Any], Any]], reps: int) -> dict[str, list[float]]:
    """Seconds of each placement of one uncommitted ``TrainState`` (its step an int), alternated."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import linen as nn
    from flax.training import train_state

    cnn = _model(nn)
    params = cnn.init(jax.random.PRNGKey(0), jnp.ones((1, 28, 28, 1)))["params"]
    state = train_state.TrainState.create(apply_fn=cnn.apply, params=params, tx=optax.sgd(0.1, 0.9))
    out: dict[str, list[float]] = {k: [] for k in places}
    for _ in range(20 * reps):
        for k, place in places.items():
            t0 = time.perf_counter()
            jax.block_until_ready(place(state))
            out[k].append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="training steps per epoch")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--reps", type=int, default=5, help="runs of each placement, alternated")
    p.add_argument("--markdown", help="write the summary here too")
    p.add_argument("--as-created", action="store_true",
                   help="a third row: the state as TrainState.create gives it, unplaced (what md.to of a "
                        "resident TrainState returned before issue 32)")
    a = p.parse_args(argv)
    import jax

    import multidev as md

    rng = np.random.default_rng(0)
    data = {"train_x": rng.random((2048, 28, 28, 1), dtype=np.float32),
            "train_y": rng.integers(0, 10, 2048).astype(np.int32),
            "test_x": rng.random((256, 28, 28, 1), dtype=np.float32),
            "test_y": rng.integers(0, 10, 256).astype(np.int32)}
    jdev = jax.devices("cpu")[0]
    places: dict[str, Callable[[Any], Any]] = {"jax.device_put": lambda s: jax.device_put(s, jdev),
                                               "md.to": lambda s: md.to(s, "cpu:0")}
    if a.as_created:
        places["as created"] = lambda s: s
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in places}
    run_once(places["jax.device_put"], data, 2, 1, a.batch)  # warm-up: imports, flax's first init
    load0 = os.getloadavg()
    for _ in range(a.reps):
        for name, place in places.items():
            runs[name].append(run_once(place, data, a.steps, a.epochs, a.batch))
    load1 = os.getloadavg()
    med = {k: statistics.median(r["wall"] for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r["cpu"] for r in v) for k, v in runs.items()}
    lines = [
        f"flax examples/mnist loop, synthetic data: `python -m multidev.benchmarks.baselines.flax_mnist "
        f"--steps {a.steps} --epochs {a.epochs} --batch {a.batch} --reps {a.reps}"
        f"{' --as-created' if a.as_created else ''}` "
        f"({datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, jax {jax.__version__}, "
        f"{os.cpu_count()} CPUs, load average {[round(x, 2) for x in load0]} -> {[round(x, 2) for x in load1]}). "
        "Median wall of whole runs (compilations included), alternated.", "",
        "| placement | median wall | runs (s) | median CPU time | XLA compilations per run "
        "| jit cache entries (apply, update) | last epoch (train loss, test loss, test acc) |",
        "| --- | ---: | --- | ---: | ---: | --- | --- |"]
    for k, v in runs.items():
        walls = ", ".join(f"{r['wall']:.2f}" for r in v)
        lines.append(f"| `{k}` | {med[k]:.3f} s | {walls} | {cpu[k]:.2f} s | "
                     f"{sorted({r['compiles'] for r in v})} | {v[0]['cache']} | "
                     f"{tuple(round(x, 4) for x in v[0]['losses'][-1])} |")
    placing = _placement_calls(places, a.reps)
    lines += ["", "The placement call alone (a fresh TrainState, median of "
              f"{len(placing['md.to'])} calls each, alternated): "
              + ", ".join(f"`{k}` {statistics.median(v) * 1e6:.0f} µs" for k, v in placing.items() if k != "as created")
              + "."]
    same = all(r["losses"] == runs["jax.device_put"][0]["losses"] for v in runs.values() for r in v)
    lines += ["", f"md.to / jax.device_put: wall **{med['md.to'] / med['jax.device_put']:.3f}x**, CPU time "
              f"**{cpu['md.to'] / cpu['jax.device_put']:.3f}x**; losses identical across every run: {same}. "
              "A jit cache entry is one trace of a step for one signature of its arguments (an executable "
              "already built for the same program is reused, so entries can outnumber XLA compilations)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
