"""How the cost of a structure's calls grows with its leaves (issue 36's scaling curves): ``md.to``
of a list of N small tensors, resident and a real move, and ``md.to_host``, against the framework's
own way, for N from 1 to 10,000; each pair sampled alternately in one process, median of the
samples, CPU time recorded beside wall time (on a shared machine the process waits off the CPU).

    python -m multidev.benchmarks.baselines.structures [--leaves 1,10,100,1000,10000] [--reps 9]
        [--json OUT.json] [--markdown OUT.md] [--plot OUT.png]

Rows (where the framework is installed): torch ``to`` resident (``[t.to(dev) for t in xs]``),
torch ``to_host`` (``[t.numpy() for t in xs]``), JAX ``to`` resident and a real move between two
virtual CPU devices (``jax.device_put(xs, device)``), JAX ``to_host`` (``jax.device_get(xs)``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

__all__ = ["main", "measure"]


def _each_to(xs: list[Any], dev: Any) -> list[Any]:
    return [t.to(dev) for t in xs]


def _each_numpy(xs: list[Any]) -> list[Any]:
    return [t.numpy() for t in xs]


def _landed(jax: Any, fn: Callable[..., Any], xs: Any, dev: Any) -> Any:
    return jax.block_until_ready(fn(xs, dev))


def _pair(md_fn: Callable[[], Any], native_fn: Callable[[], Any], reps: int) -> dict[str, float]:
    """Median wall and CPU seconds of each, sampled alternately (the inner count keeps a sample
    near 2 ms)."""
    md_fn(), native_fn()
    t0 = time.perf_counter()
    native_fn()
    inner = max(1, int(2e-3 / max(time.perf_counter() - t0, 1e-7)))
    out: dict[str, list[float]] = {"md": [], "native": [], "md_cpu": [], "native_cpu": []}
    for _ in range(reps):
        for name, fn in (("md", md_fn), ("native", native_fn)):
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(inner):
                fn()
            w, c = time.perf_counter() - w0, time.process_time() - c0
            out[name].append(w / inner)
            out[name + "_cpu"].append(c / inner)
    return {k: statistics.median(v) for k, v in out.items()}


def measure(leaves: list[int], reps: int) -> list[dict[str, Any]]:
    """The rows (see the module docstring) for every leaf count."""
    import numpy as np

    import multidev as md

    rows: list[dict[str, Any]] = []

    def add(fw: str, call: str, n: int, md_fn: Callable[[], Any], native_fn: Callable[[], Any], native: str) -> None:
        r = _pair(md_fn, native_fn, reps)
        rows.append({"framework": fw, "call": call, "leaves": n, "native_call": native, **r,
                     "md_above_per_leaf_s": (r["md"] - r["native"]) / n})
        print(f"{fw:5s} {call:14s} {n:6d} leaves: md {r['md'] * 1e6:10.1f} µs, native {r['native'] * 1e6:10.1f} µs "
              f"({r['md'] / r['native']:.2f}x; {(r['md'] - r['native']) / n * 1e9:+.0f} ns a leaf)", flush=True)

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        cpu = torch.device("cpu")
        for n in leaves:
            xs = [torch.ones(16) for _ in range(n)]
            md.device_of(xs[0]), md.device_of(xs[0])
            add("torch", "to resident", n, partial(md.to, xs, "cpu:0"), partial(_each_to, xs, cpu),
                "[t.to('cpu') for t in xs]")
            add("torch", "to_host", n, partial(md.to_host, xs), partial(_each_numpy, xs), "[t.numpy() for t in xs]")
    try:
        md.backend("jax")  # the adapter sets JAX's virtual CPU devices up before JAX starts
        import jax
    except Exception:  # noqa: BLE001 - no JAX here: its rows are left out
        jax = None
    if jax is not None and len(jax.devices("cpu")) >= 2:
        d0, d1 = jax.devices("cpu")[:2]
        for n in leaves:
            xs = [jax.device_put(np.ones(16, np.float32), d0) for _ in range(n)]
            md.device_of(xs[0]), md.device_of(xs[0])
            add("jax", "to resident", n, partial(md.to, xs, "cpu:0"), partial(jax.device_put, xs, d0),
                "jax.device_put(xs, cpu:0)")
            add("jax", "to (move)", n, partial(_landed, jax, md.to, xs, "cpu:1"),
                partial(_landed, jax, jax.device_put, xs, d1), "jax.device_put(xs, cpu:1)")
            add("jax", "to_host", n, partial(md.to_host, xs), partial(jax.device_get, xs), "jax.device_get(xs)")
    return rows


def _markdown(doc: dict[str, Any]) -> str:
    out = [f"Structures against their leaves: `{doc['command']}` ({doc['created']}, load average "
           f"{doc['loadavg_before']} -> {doc['loadavg_after']}, {doc['cpu_count']} CPUs). Median per call, "
           "md and the native call sampled alternately; 'above a leaf' = (md - native) / leaves.", "",
           "| framework | call | native | leaves | md | native | md / native | above a leaf | md CPU share |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in doc["rows"]:
        share = r["md_cpu"] / r["md"] if r["md"] else float("nan")
        out.append(f"| {r['framework']} | {r['call']} | `{r['native_call']}` | {r['leaves']} | "
                   f"{r['md'] * 1e6:.1f} µs | {r['native'] * 1e6:.1f} µs | {r['md'] / r['native']:.2f} | "
                   f"{r['md_above_per_leaf_s'] * 1e9:+.0f} ns | {share:.2f} |")
    return "\n".join(out) + "\n"


def _plot(doc: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["framework"], r["call"]) for r in doc["rows"]})
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.6), squeeze=False)
    for ax, (fw, call) in zip(axes[0], keys):
        rs = sorted((r for r in doc["rows"] if (r["framework"], r["call"]) == (fw, call)), key=lambda r: r["leaves"])
        ns = [r["leaves"] for r in rs]
        ax.loglog(ns, [r["md"] for r in rs], "o-", label="md")
        ax.loglog(ns, [r["native"] for r in rs], "s--", label=rs[0]["native_call"][:34])
        ax.set_title(f"{fw}: {call}", fontsize=9)
        ax.set_xlabel("leaves")
        ax.set_ylabel("seconds per call")
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"md.to / md.to_host of N small tensors against the native call ({doc['created']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m multidev.benchmarks.baselines.structures",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--leaves", default="1,10,100,1000,10000")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--plot")
    a = ap.parse_args(argv)
    os.environ.setdefault("MULTIDEV_JAX_CPU_DEVICES", "2")
    from multidev.registry import configure_virtual_devices

    configure_virtual_devices(2)
    import datetime as dt
    import sys

    before = [round(v, 2) for v in os.getloadavg()]
    rows = measure([int(s) for s in a.leaves.split(",")], a.reps)
    args = sys.argv[1:] if argv is None else argv
    doc = {"command": "python -m multidev.benchmarks.baselines.structures " + " ".join(args),
           "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpu_count": os.cpu_count(),
           "loadavg_before": before, "loadavg_after": [round(v, 2) for v in os.getloadavg()], "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(_markdown(doc))
    if a.plot:
        _plot(doc, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
