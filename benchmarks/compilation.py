"""Suite ``compile`` (D2L 12.1 "Compilers and interpreters"): the book's three-layer MLP
(512 -> 256 -> 128 -> 2, ReLU) on a batch of one, 1000 calls a sample, imperative vs compiled, on
every backend side by side.

Variants of the row: ``eager`` (the framework's net called as it is), ``native:<route>`` for each of
the framework's own compilers (TorchScript, ``torch.compile``, ``jax.jit``, ``tf.function``, Gluon's
``hybridize``; from the baseline's ``mlp_d2l``/``compiled_d2l``), and ``md``: ``md.compile(net)``,
whose route (chosen by measurement on its first call) is recorded in the row's params with the
timings it measured. Every variant starts from the same weights; the check compares each output
with a float64 NumPy forward pass and its device.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import multidev as md

from . import Case, Context, Goal, Variant, all_ok, benchmark, close

SIZES = (512, 256, 128, 2)
CALLS = 1000  # calls per sample, as in the book


def weights(seed: int = 0) -> list[np.ndarray]:
    """The MLP's weights and biases (float32), scaled by 1/sqrt(fan-in)."""
    rng = np.random.default_rng(seed)
    out = []
    for a, b in itertools.pairwise(SIZES):
        out += [(rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32),
                (0.1 * rng.normal(size=b)).astype(np.float32)]
    return out


def reference(ws: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The forward pass in float64 on the host."""
    h = x.astype(np.float64)
    for i in range(0, len(ws), 2):
        h = h @ ws[i].astype(np.float64) + ws[i + 1]
        if i < len(ws) - 2:
            h = np.maximum(h, 0)
    return h


GOALS = (
    Goal("md.compile within 1.1x of the fastest native compiler", "D2L 12.1 MLP", 1.1, metric="time_ratio_best",
         num="md", den=("native:*",), note="the route md.compile measures best, against every native route"),
    Goal("md.compile never slower than eager", "D2L 12.1 MLP", 1.05, num="md", den=("eager",),
         note="5% allowance for timing noise (NumPy's route is the function itself)"),
)


@benchmark("compile", goals=GOALS)
def mlp_12_1(ctx: Context) -> Iterator[Case]:
    """D2L 12.1: MLP, batch 1, 1000 calls: eager vs the framework's compilers vs md.compile."""
    nat = ctx.native
    if nat is None or not hasattr(nat, "mlp_d2l"):
        return
    d = ctx.dev
    ws = weights()
    xh = np.random.default_rng(1).normal(size=(1, SIZES[0])).astype(np.float32)
    ref = reference(ws, xh)
    x = md.asarray(xh, device=d, backend=ctx.backend)
    make = nat.mlp_d2l(ws, d)
    eager = make()
    routes = nat.compiled_d2l(make, x, d, ctx.quick)
    compiled = md.compile(make(), backend=ctx.backend)
    t0 = time.perf_counter()
    md.synchronize(compiled(x))  # md.compile measures its candidates on this first call
    first = time.perf_counter() - t0
    calls = 10 if ctx.quick else CALLS
    variants: dict[str, Variant | None] = {
        "md": Variant(compiled, (x,), inner=calls, label=f"md.compile(net) -> {compiled.route}"),
        "eager": Variant(eager, (x,), inner=calls, label="net(x)"),
    }
    for label, f in routes.items():
        variants[f"native:{label}"] = Variant(f, (x,), inner=calls, label=label)

    def check() -> tuple[bool, str]:
        return all_ok(*[close(v.fn(x), ref, rtol=1e-4, device=ctx.ndev(d)) for v in variants.values() if v])

    yield Case(f"D2L 12.1 MLP {'-'.join(map(str, SIZES))}, batch 1 [{d}]", variants, devices=[d], check=check,
               params={"sizes": list(SIZES), "batch": 1, "calls_per_sample": calls, "device": str(d),
                       "route": compiled.route, "md_measured_s": dict(compiled.timings),
                       "md_route_errors": dict(compiled.errors), "md_first_call_s": first,
                       "native_routes": list(routes), "note": f"md.compile -> {compiled.route}"},
               ratio=("md", "eager"), group="D2L 12.1 MLP", key="D2L 12.1 MLP, batch 1")


def plot(doc: dict[str, Any], path: str) -> None:
    """Time per call of every variant of the 12.1 rows, one group of bars per backend (log scale):
    eager, each native compiler, and md.compile labelled with the route it took."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["results"] if r.get("suite") == "compile" and r.get("variants")]
    fig, ax = plt.subplots(figsize=(max(7.0, 2.2 * len(rows)), 5))
    ticks, labels = [], []
    x = 0.0
    for r in rows:
        names = ["eager"] + sorted(k for k in r["variants"] if k.startswith("native:")) + ["md"]
        names = [n for n in names if (r["variants"].get(n) or {}).get("median_s")]
        for i, n in enumerate(names):
            t = r["variants"][n]["median_s"] * 1e6
            colour = "C3" if n == "md" else "C7" if n == "eager" else "C0"
            ax.bar(x + i, t, color=colour)
            text = f"md: {r['params'].get('route')}" if n == "md" else n.removeprefix("native:")
            ax.text(x + i, t, f" {text}  {t:.3g} µs", rotation=90, ha="center", va="bottom", fontsize=7)
        ticks.append(x + (len(names) - 1) / 2)
        labels.append(f"{r['backend']} [{', '.join(r['devices'])}]")
        x += len(names) + 1.5
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * 30)
    ax.set_ylabel("µs per call (median, log)")
    ax.set_title("D2L 12.1: MLP, batch 1 — eager (grey), native compilers (blue), md.compile (red)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # python -m multidev.benchmarks.compilation RESULT.json OUT.png
    import json
    import sys

    with open(sys.argv[1]) as f:
        plot(json.load(f), sys.argv[2])
