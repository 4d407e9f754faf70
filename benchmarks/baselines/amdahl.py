"""What share of a data-parallel step multidev itself costs (issue 36's Amdahl line): ``md.train_batch``
of a small MLP over N virtual CPU devices, profiled (cProfile): the own time of multidev's core
(``multidev/``) and of its adapters (``multidev.adapters``) against the step's total; each device
count in a fresh process (JAX fixes its device count at start). cProfile charges every Python call
a little, so the shares are upper bounds; the unprofiled step time is given beside them.

    python -m multidev.benchmarks.baselines.amdahl [--backend jax] [--devices 2,4,8] [--steps 20]
        [--markdown OUT.md] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

__all__ = ["main", "one"]

#: Adapter methods whose own time is mostly the framework's compiled work (the gradient, the update, the
#: native allreduce): a jitted JAX function is a
#: C++ callable that cProfile does not list, so its run is charged to the Python function calling it.
_COMPUTE = ("value_and_grad", "sgd_update", "_mesh_allreduce")


def one(backend: str, n: int, steps: int, batch: int) -> dict[str, Any]:
    """The step on ``n`` devices of ``backend`` in this process: times and the profile's shares."""
    import cProfile
    import pstats
    import time

    import numpy as np

    from multidev.registry import configure_virtual_devices

    configure_virtual_devices(n)
    import importlib

    import multidev as md

    adapters = importlib.import_module("multidev.adapters")

    md.backend(backend)
    devices = md.devices(backend=backend, kind="cpu")[:n]
    rng = np.random.default_rng(0)
    shapes = [(256, 256), (256,), (256, 10), (10,)]
    params = [md.asarray(rng.normal(size=s).astype(np.float32) * 0.05, device=devices[0], backend=backend)
              for s in shapes]
    replicas = md.replicate(params, devices)
    X = md.asarray(rng.normal(size=(batch, 256)).astype(np.float32), device=devices[0], backend=backend)
    y = md.asarray(rng.normal(size=(batch, 10)).astype(np.float32), device=devices[0], backend=backend)
    if backend == "jax":
        import jax.numpy as jnp

        def loss(ps: list[Any], X: Any, y: Any) -> Any:
            h = jnp.maximum(X @ ps[0] + ps[1], 0)
            return (((h @ ps[2] + ps[3]) - y) ** 2).sum() / 2
    elif backend == "tensorflow":
        import tensorflow as tf

        def loss(ps: list[Any], X: Any, y: Any) -> Any:
            h = tf.nn.relu(X @ ps[0] + ps[1])
            return tf.reduce_sum(((h @ ps[2] + ps[3]) - y) ** 2) / 2
    else:
        raise SystemExit(f"amdahl: backend {backend!r} is not set up here (jax, tensorflow)")
    for _ in range(3):
        md.train_batch(X, y, replicas, devices, 0.01, loss=loss)
    t0 = time.perf_counter()
    for _ in range(steps):
        md.train_batch(X, y, replicas, devices, 0.01, loss=loss)
    step_s = (time.perf_counter() - t0) / steps
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        md.train_batch(X, y, replicas, devices, 0.01, loss=loss)
    pr.disable()
    st = pstats.Stats(pr)
    core = os.path.dirname(os.path.abspath(md.__file__)) + os.sep
    adp = os.path.dirname(os.path.abspath(str(adapters.__file__))) + os.sep
    own = {"core": 0.0, "adapters": 0.0, "compute": 0.0}
    total = 0.0
    mine: list[tuple[float, str]] = []
    for (fname, line, fn), (_cc, _nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        total += tt
        path = os.path.abspath(fname)
        where = "adapters" if path.startswith(adp) else "core" if path.startswith(core) else None
        if where == "adapters" and fn in _COMPUTE:
            where = "compute"  # (the jitted call's own run is charged to its Python caller)
        if where is not None:
            own[where] += tt
            mine.append((tt, f"{os.path.relpath(path, os.path.dirname(core.rstrip(os.sep)))}:{line}({fn})"))
    top = "; ".join(f"{name} {100 * t / total:.1f}%" for t, name in sorted(mine, reverse=True)[:3])
    return {"backend": backend, "devices": n, "batch": batch, "steps": steps, "step_s": step_s,
            "profiled_total_s": total, "core_share": own["core"] / total, "adapters_share": own["adapters"] / total,
            "compute_wrappers_share": own["compute"] / total, "top": top}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m multidev.benchmarks.baselines.amdahl",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="jax")
    ap.add_argument("--devices", default="2,4,8")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child: one device count
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.backend, a.one, a.steps, a.batch)))
        return 0
    rows = []
    for n in (int(s) for s in a.devices.split(",")):
        p = subprocess.run([sys.executable, "-m", "multidev.benchmarks.baselines.amdahl", "--backend", a.backend,
                            "--one", str(n), "--steps", str(a.steps), "--batch", str(a.batch)],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print(p.stderr[-2000:], file=sys.stderr)
            return 1
        r = json.loads(p.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(f"{a.backend} {n} devices: step {r['step_s'] * 1e3:.2f} ms; multidev's own time "
              f"{100 * r['core_share']:.1f}% (core) + {100 * r['adapters_share']:.1f}% (adapters); "
              f"compiled step via {_COMPUTE}: {100 * r['compute_wrappers_share']:.1f}%; top: {r['top']}", flush=True)
    cmd = "python -m multidev.benchmarks.baselines.amdahl " + " ".join(sys.argv[1:] if argv is None else argv)
    load = [round(v, 2) for v in os.getloadavg()]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": cmd, "loadavg_after": load, "rows": rows}, f, indent=1)
    if a.markdown:
        lines = [f"`{cmd}` (load average after: {load}): md.train_batch of a 256-256-10 MLP, global batch "
                 f"{a.batch}, over N virtual CPU devices; the share is multidev's own Python time in a cProfile of "
                 f"{a.steps} steps (an upper bound: the profiler charges Python calls more than C work); the adapter's "
                 f"{' and '.join(_COMPUTE)} are left out of it (they run the compiled step, which cProfile charges "
                 "to them).", "",
                 ("| backend | devices | step | multidev core | adapters | multidev in all "
                  "| most own time (compiled-step callers included) |"),
                 "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in rows:
            lines.append(f"| {r['backend']} | {r['devices']} | {r['step_s'] * 1e3:.2f} ms | "
                         f"{100 * r['core_share']:.1f}% | {100 * r['adapters_share']:.1f}% | "
                         f"{100 * (r['core_share'] + r['adapters_share']):.1f}% | {r['top']} |")
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
