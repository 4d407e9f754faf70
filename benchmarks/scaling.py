"""The collectives scaling study: from the ``collectives`` suite's results, the fitted cost model
``alpha + beta * bytes`` per algorithm, backend, device kind and device count, the report (tables,
a figure of time against size and against device count) and the model ``algorithm="auto"`` ships
with.

    python -m multidev.benchmarks.scaling fit RESULTS.json... [--write | --out model.json]
    python -m multidev.benchmarks.scaling report RESULTS.json... --markdown OUT.md [--plot OUT.png]

``fit --write`` rewrites ``multidev/data/collective_model.json`` (the model shipped, read by
:func:`multidev.collectives.cost_model`); ``fit --out`` writes a model file for
``$MULTIDEV_COLLECTIVE_MODEL`` (a refit for another machine, without touching the package).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .report import fmt_time
from .suite import MiB, fmt_bytes

__all__ = ["fit", "load", "main", "markdown", "plot"]

ALGS = ("naive", "ring", "tree", "native")


def load(paths: Sequence[str]) -> dict[str, Any]:
    """The results files merged (``multidev bench`` JSON, ``--report`` merges alike)."""
    from .report import validate
    from .runner import merge

    docs = []
    for p in paths:
        with open(p) as f:
            docs.append(json.load(f))
    doc = merge(docs)
    validate(doc)  # (the rows' bounds recomputed alike, the impossible ones marked)
    return doc


def _rows(doc: dict[str, Any], benchmark: str = "allreduce") -> list[dict[str, Any]]:
    return [r for r in doc["results"] if r.get("suite") == "collectives" and r.get("benchmark") == benchmark
            and r.get("variants") and r.get("bytes")]


def _kind(r: dict[str, Any]) -> str:
    kinds = {str(d).split(":")[0] for d in r.get("devices") or []}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _med(r: dict[str, Any], v: str) -> float | None:
    x = (r.get("variants") or {}).get(v) or {}
    return x.get("median_s")


def _fit_line(ns: np.ndarray, ts: np.ndarray) -> tuple[float, float, float]:
    """(alpha, beta, relative rms error) of ``t = alpha + beta * n`` fitted to minimize the relative
    error (every size counts alike), alpha and beta held >= 0."""
    w = 1.0 / ts
    a = np.stack([w, ns * w], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(ts), rcond=None)
    if alpha < 0:
        alpha, beta = 0.0, float(np.sum(ns * w * w * ts) / np.sum((ns * w) ** 2))
    if beta < 0:
        alpha, beta = float(np.sum(w * w * ts) / np.sum(w * w)), 0.0
    rel = (alpha + beta * ns) / ts - 1.0
    return float(alpha), float(beta), float(np.sqrt(np.mean(rel ** 2)))


#: The model's size bands: one alpha + beta * bytes line below and one above (caches, then memory).
SPLIT_BYTES = 1 << 20


def fit(doc: dict[str, Any]) -> dict[str, Any]:
    """The cost model of every (backend, device kind, device count, algorithm) the allreduce rows
    measured: ``{"models": {backend: {kind: {n: {alg: [[up_to_bytes, alpha_s, beta_s_per_byte, rel_rms,
    points], ...]}}}}}``, one line per size band (up to :data:`SPLIT_BYTES`, and above; the last
    band's ``up_to_bytes`` is None)."""
    pts: dict[tuple[str, str, int, str], list[tuple[int, float]]] = {}
    for r in _rows(doc):
        n = int(r["params"]["n"])
        for alg in ALGS:
            t = _med(r, f"alg:{alg}")
            if t:
                pts.setdefault((r["backend"], _kind(r), n, alg), []).append((int(r["bytes"]), float(t)))
    models: dict[str, Any] = {}
    for (b, kind, n, alg), p in sorted(pts.items()):
        p = sorted(p)
        bands = [[q for q in p if q[0] <= SPLIT_BYTES], [q for q in p if q[0] > SPLIT_BYTES]]
        if any(len(band) == 1 for band in bands):  # a band of one point: one line for all
            bands = [p]
        segs = []
        for i, band in enumerate(x for x in bands if x):
            if len(band) < 2:
                continue
            ns, ts = (np.array(x, dtype=np.float64) for x in zip(*band))
            alpha, beta, err = _fit_line(ns, ts)
            segs.append([SPLIT_BYTES if (i == 0 and len(bands) == 2 and bands[1]) else None, alpha, beta, err,
                         len(band)])
        if segs:
            segs[-1][0] = None
            models.setdefault(b, {}).setdefault(kind, {}).setdefault(str(n), {})[alg] = segs
    runs = doc.get("runs") or [{}]
    how = (f"t = alpha + beta * bytes per device, one line up to {fmt_bytes(SPLIT_BYTES)} and one above, least "
           "relative squares, alpha, beta >= 0")
    return {"version": 2, "fit": how,
            "created": doc.get("created"), "machine": (runs[0].get("machine") or {}).get("cpu"),
            "commands": [" ".join(r.get("command") or []) for r in runs], "models": models}


def _predict(model: dict[str, Any], b: str, kind: str, n: int, nbytes: int, native: bool) -> str | None:
    per = ((model.get("models") or {}).get(b) or {}).get(kind) or {}
    if not per:
        return None
    near = min(per, key=lambda c: abs(math.log(int(c) / n)))
    best = None
    for alg, v in per[near].items():
        if alg == "native" and not native:
            continue
        seg = next((g for g in v if g[0] is None or nbytes <= g[0]), v[-1])
        t = seg[1] + seg[2] * nbytes
        if best is None or t < best[0]:
            best = (t, alg)
    return None if best is None else best[1]


def write_model(model: dict[str, Any], source: str, path: pathlib.Path) -> None:
    """Write ``model`` (fitted from ``source``) as the shipped model's JSON at ``path``, with no
    machine paths (results are named relative to the working directory)."""
    import os

    text = json.dumps(dict(model, source=source), indent=1, sort_keys=True)
    path.write_text(text.replace(os.getcwd() + os.sep, "") + "\n")


# -- the report ----------------------------------------------------------------------------------
def _best(r: dict[str, Any]) -> tuple[str, float] | None:
    cands = [(a, _med(r, f"alg:{a}")) for a in ALGS]
    got = [(a, t) for a, t in cands if t]
    return min(got, key=lambda c: c[1]) if got else None


def _bus(r: dict[str, Any], t: float | None) -> str:
    if not t:
        return "-"
    return f"{fmt_time(t)} ({r['bytes'] / t / 1e9 * (r.get('busbw_factor') or 1):.3g})"


def _choice(model: dict[str, Any], r: dict[str, Any]) -> str | None:
    """The algorithm auto ran in row ``r``: recorded by the bench (``params["auto_choice"]``), else
    what ``model`` predicts (files written before the choice was recorded)."""
    p = r["params"]
    return p.get("auto_choice") or _predict(model, r["backend"], _kind(r), int(p["n"]), int(r["bytes"]),
                                            native="native" in (p.get("algorithms") or []))


def markdown(doc: dict[str, Any], model: dict[str, Any], command: str = "") -> str:
    """The study as Markdown: the headline per backend, every allreduce point (each algorithm in
    and out of place, auto's choice and its time, the framework's own, the memcpy bound), the
    other collectives against their bound, and the fitted model."""
    rows = _rows(doc)
    backends = sorted({r["backend"] for r in rows})
    out = ["# Collectives scaling study", ""]
    if command:
        out += [f"Made by `{command}`.", ""]
    for run in doc.get("runs") or []:
        m = run.get("machine") or {}
        mc = (run.get("bounds") or {}).get("memcpy") or {}
        table = mc.get("GBps") or {}
        memcpy = ", ".join(f"{fmt_bytes(int(k))} {v:.3g}" for k, v in sorted(table.items(), key=lambda kv: int(kv[0])))
        names = ", ".join(f"{b} {i.get('version', '')}" for b, i in (run.get("backends") or {}).items())
        wall = (run.get("settings") or {}).get("wall_s")
        out.append(f"- {names}: {m.get('cpu')} ({m.get('cpu_count')} cores, {m.get('memory_GiB')} GiB); load "
                   f"{run.get('loadavg_before')} -> {run.get('loadavg_after')}; {wall} s; memcpy GB/s: {memcpy}")
    out += ["", "Times are medians; in brackets busbw in GB/s (algbw x 2(n-1)/n). The bound: the least memory "
            "traffic of the collective where the devices share one memory (allreduce: read n inputs once and "
            "write n results once, n copies of the size, timed as one copy of n x size bytes), at the memcpy "
            "bandwidth measured in the same run. **auto** is what `choose_algorithm` picked in the run (the "
            "row's recorded choice; else what the fitted model below predicts); x = its algorithm's measured "
            "time / the best measured.", "", "## Headline", "",
            "| backend | best algorithm >= 1 MiB: busbw / bound busbw (worst point) | auto / best (worst point) | "
            "native / framework's own (worst) | in place / out of place (worst) |", "|---|---|---|---|---|"]
    for b in backends:
        rb = [r for r in rows if r["backend"] == b]
        bound_r: list[tuple[float, str, str]] = []
        auto_r: list[tuple[float, str, str]] = []
        nat_r: list[tuple[float, str, str]] = []
        inp_r: list[tuple[float, str, str]] = []
        for r in rb:
            best = _best(r)
            if best is None:
                continue
            bt = (r.get("bound") or {}).get("time_s")
            if bt and r["bytes"] >= MiB:
                bound_r.append((bt / best[1], r["case"], best[0]))
            choice = _choice(model, r)
            ct = _med(r, f"alg:{choice}") if choice else None
            if ct and choice:
                auto_r.append((ct / best[1], r["case"], choice))
            fw, nt = _med(r, "framework_own"), _med(r, "alg:native")
            if fw and nt:
                nat_r.append((nt / fw, r["case"], ""))
            for a in ALGS:
                ti, to = _med(r, f"inplace:{a}"), _med(r, f"alg:{a}")
                if ti and to:
                    inp_r.append((ti / to, r["case"], a))

        def worst(xs: list[tuple[float, str, str]], low: bool) -> str:
            if not xs:
                return "-"
            v, case, what = (min if low else max)(xs)
            return f"{v:.2f} ({case}{', ' + what if what else ''})"
        out.append(f"| {b} | {worst(bound_r, True)} | {worst(auto_r, False)} | {worst(nat_r, False)} | "
                   f"{worst(inp_r, False)} |")
    for b in backends:
        for n in sorted({int(r["params"]["n"]) for r in rows if r["backend"] == b}):
            rb = sorted((r for r in rows if r["backend"] == b and int(r["params"]["n"]) == n), key=lambda r: r["bytes"])
            algs = [a for a in ALGS if any(_med(r, f"alg:{a}") for r in rb)]
            inps = [a for a in algs if any(_med(r, f"inplace:{a}") for r in rb)]
            out += ["", f"## allreduce, {b}, {n} devices", "",
                    "| " + " | ".join(["size", *algs, *(f"{a} in place" for a in inps), "auto (choice: x best)",
                                       "auto measured", "framework's own", "bound", "best / bound"]) + " |",
                    "|---" * (len(algs) + len(inps) + 6) + "|"]
            for r in rb:
                best = _best(r)
                choice = _choice(model, r)
                ct = _med(r, f"alg:{choice}") if choice else None
                bt = (r.get("bound") or {}).get("time_s")
                cells = [_bus(r, _med(r, f"alg:{a}")) for a in algs] + [_bus(r, _med(r, f"inplace:{a}")) for a in inps]
                cells += [f"{choice}: x{ct / best[1]:.2f}" if ct and best else "-", _bus(r, _med(r, "auto")),
                          _bus(r, _med(r, "framework_own")), _bus(r, bt),
                          f"{bt / best[1]:.2f}" if bt and best else "-"]
                out.append(f"| {fmt_bytes(int(r['bytes']))} | " + " | ".join(cells) + " |")
    for bench in ("broadcast", "allgather", "reduce_scatter"):
        rs = _rows(doc, bench)
        if not rs:
            continue
        out += ["", f"## {bench}", "", "| backend | n | size | md | native | bound | md / bound |",
                "|---|---|---|---|---|---|---|"]
        for r in sorted(rs, key=lambda r: (r["backend"], r["params"]["n"], r["bytes"])):
            t, bt = _med(r, "md"), (r.get("bound") or {}).get("time_s")
            out.append(f"| {r['backend']} | {r['params']['n']} | {fmt_bytes(int(r['bytes']))} | {_bus(r, t)} | "
                       f"{_bus(r, _med(r, 'native'))} | {_bus(r, bt)} | {bt / t:.2f} |" if t and bt else
                       f"| {r['backend']} | {r['params']['n']} | {fmt_bytes(int(r['bytes']))} | {_bus(r, t)} | "
                       f"{_bus(r, _med(r, 'native'))} | - | - |")
    out += ["", "## The fitted model (what auto chooses from)", "",
            f"{model.get('fit', '')}; alpha is the fixed cost, 1/beta the bandwidth the algorithm moves a "
            "device's bytes at.", "",
            "| backend | kind | n | algorithm | sizes | alpha | 1/beta (GB/s) | rel. rms error | points |",
            "|---|---|---|---|---|---|---|---|---|"]
    for b, kinds in sorted((model.get("models") or {}).items()):
        for kind, per in sorted(kinds.items()):
            for n, algs_ in sorted(per.items(), key=lambda kv: int(kv[0])):
                for alg, segs in sorted(algs_.items()):
                    for upto, alpha, beta, err, npts in segs:
                        bw = f"{1 / beta / 1e9:.3g}" if beta > 0 else "-"
                        band = f"<= {fmt_bytes(upto)}" if upto else "all sizes" if len(segs) == 1 else "above"
                        out.append(f"| {b} | {kind} | {n} | {alg} | {band} | {fmt_time(alpha)} | {bw} | {err:.2f} | "
                                   f"{npts} |")
    return "\n".join(out) + "\n"


def plot(doc: dict[str, Any], model: dict[str, Any], path: str) -> None:
    """Per backend: allreduce time against size (the largest device count: each algorithm, the
    framework's own and the bound), and against device count (at a small and a large size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _rows(doc)
    backends = sorted({r["backend"] for r in rows})
    fig, axes = plt.subplots(max(1, len(backends)), 2, figsize=(13, 4.2 * max(1, len(backends))), squeeze=False)
    styles = {"alg:naive": "-o", "alg:ring": "-s", "alg:tree": "-^", "alg:native": "-D", "framework_own": "--x",
              "auto": ":+", "inplace:naive": ":o"}
    for row, b in zip(axes, backends):
        rb = [r for r in rows if r["backend"] == b]
        nmax = max(int(r["params"]["n"]) for r in rb)
        a = row[0]
        for v, st in styles.items():
            pts = sorted((r["bytes"], _med(r, v)) for r in rb if int(r["params"]["n"]) == nmax and _med(r, v))
            if pts:
                a.plot(*zip(*pts), st, ms=3, label=v)
        bpts = sorted((r["bytes"], (r.get("bound") or {}).get("time_s")) for r in rb
                      if int(r["params"]["n"]) == nmax and (r.get("bound") or {}).get("time_s"))
        if bpts:
            a.plot(*zip(*bpts), "k:", lw=1.5, label="memcpy bound")
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("bytes per device")
        a.set_ylabel("seconds")
        a.set_title(f"{b}: allreduce time vs size, {nmax} devices (md's algorithms vs the framework's own vs "
                    "the bound)", fontsize=8)
        a.legend(fontsize=6)
        a = row[1]
        sizes = sorted({int(r["bytes"]) for r in rb})
        for size in [s for s in (64 << 10, 16 * MiB) if s in sizes] or sizes[-1:]:
            for v in ("alg:naive", "alg:ring", "alg:tree", "alg:native", "framework_own"):
                pts = sorted((int(r["params"]["n"]), _med(r, v)) for r in rb if r["bytes"] == size and _med(r, v))
                if pts:
                    a.plot(*zip(*pts), "-o", ms=3, label=f"{v} {fmt_bytes(size)}")
            bp = sorted((int(r["params"]["n"]), (r.get("bound") or {}).get("time_s")) for r in rb
                        if r["bytes"] == size and (r.get("bound") or {}).get("time_s"))
            if bp:
                a.plot(*zip(*bp), "k:", label=f"bound {fmt_bytes(size)}")
        a.set_yscale("log")
        a.set_xlabel("devices")
        a.set_ylabel("seconds")
        a.set_title(f"{b}: allreduce time vs device count", fontsize=8)
        a.legend(fontsize=5, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m multidev.benchmarks.scaling", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit the cost model from collectives results")
    f.add_argument("results", nargs="+")
    f.add_argument("--write", action="store_true", help="rewrite the shipped model (multidev/data)")
    f.add_argument("--out", help="write the model as a JSON file (for $MULTIDEV_COLLECTIVE_MODEL)")
    f.add_argument("--source", help="what the model's source says (default: the results' paths)")
    r = sub.add_parser("report", help="the study's tables and figure")
    r.add_argument("results", nargs="+")
    r.add_argument("--markdown", required=True)
    r.add_argument("--plot")
    r.add_argument("--command", default="", help="the command that made the results (quoted in the report)")
    args = ap.parse_args(argv)
    doc = load(args.results)
    if args.cmd == "fit":
        model = fit(doc)
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps(model, indent=1, sort_keys=True))
            print(f"wrote {args.out}")
        if args.write:
            from importlib import resources

            from multidev import collectives

            target = pathlib.Path(str(resources.files("multidev").joinpath(collectives.MODEL_RESOURCE)))
            write_model(model, args.source or " ".join(args.results), target)
            print(f"wrote {target}")
        if not (args.out or args.write):
            json.dump(model, sys.stdout, indent=1, sort_keys=True)
        return 0
    from multidev.collectives import cost_model

    model = cost_model()
    pathlib.Path(args.markdown).write_text(markdown(doc, model, args.command))
    print(f"wrote {args.markdown}")
    if args.plot:
        plot(doc, model, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
