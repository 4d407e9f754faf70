"""Tables, Markdown, plots and goal checks of ``multidev bench`` results (a ``multidev-bench/1`` JSON)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from . import SUITES, fmt_bytes

SCHEMA = "multidev-bench/1"
PRECISIONS = ("fp32", "tf32", "both", "default")
SUITE_NAMES = tuple(SUITES.values())
VARIANT_ORDER = ("md", "md_inplace", "md_to_host", "native", "native_pinned", "book", "bound", "numpy", "framework")
SHORT = {"md": "md", "md_inplace": "md in-place", "md_to_host": "md.to_host", "native": "native",
         "native_pinned": "native pinned", "book": "book", "bound": "hw bound", "numpy": "numpy",
         "framework": "dispatch"}


def vkey(name: str) -> tuple[int, str]:
    return (VARIANT_ORDER.index(name) if name in VARIANT_ORDER else len(VARIANT_ORDER), name)

def fmt_time(t: float | None) -> str:
    if t is None or (isinstance(t, float) and math.isnan(t)):
        return "-"
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= f:
            return f"{t / f:.3g} {unit}"
    return f"{t / 1e-9:.3g} ns"


def _backend_order(doc: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for r in doc["results"]:
        if r["backend"] not in seen:
            seen.append(r["backend"])
    return seen


def _cell_lines(rec: dict[str, Any]) -> list[tuple[str, str]]:
    """A result cell as (text, style) lines: one per variant, the ratio, a failed check."""
    if rec.get("skipped"):
        return [(f"skipped: {rec['skipped'][:40]}", "dim")]
    if rec.get("error") and not rec.get("variants"):
        return [(f"error: {rec['error'][:60]}", "red")]
    lines = []
    note = (rec.get("params") or {}).get("note")
    if note:
        lines.append((str(note), "dim"))
    for name in sorted(rec["variants"], key=vkey):
        v = rec["variants"][name]
        if v is None:
            continue
        if "median_s" not in v:
            lines.append((f"{SHORT.get(name, name)}: {v.get('error', 'no samples')[:50]}", "red"))
            continue
        iqr = 100 * v["iqr_s"] / v["median_s"] if v["median_s"] > 0 else 0.0
        extra = ""
        if "busbw_GBps" in v:
            extra = f" bus {v['busbw_GBps']:.3g} GB/s"
        elif "GBps" in v:
            extra = f" {v['GBps']:.3g} GB/s"
        first = v.get("first_call_s")
        if first and first > 3 * v["median_s"] and first - v["median_s"] > 1e-3:
            extra += f" (1st call {fmt_time(first)})"  # compilation / first-use cost, kept apart
        lines.append((f"{SHORT.get(name, name)} {fmt_time(v['median_s'])} ±{iqr:.0f}%{extra}", ""))
    if rec.get("ratio"):
        a, b = rec["ratio"]["of"]
        lines.append((f"×{rec['ratio']['value']:.2f} {SHORT.get(a, a)}/{SHORT.get(b, b)}", "bold"))
    if rec.get("check") and not rec["check"]["ok"]:
        lines.append((f"✗ check: {rec['check']['detail'][:60]}", "red"))
    return lines


def _cell(rec: dict[str, Any]) -> str:
    from rich.markup import escape

    return "\n".join(f"[{st}]{escape(t)}[/{st}]" if st else escape(t) for t, st in _cell_lines(rec))


def _md_cell(rec: dict[str, Any]) -> str:
    out = []
    for t, st in _cell_lines(rec):
        t = t.replace("|", "\\|")
        out.append(f"**{t}**" if st == "bold" else f"⚠ {t}" if st == "red" else f"_{t}_" if st == "dim" else t)
    return "<br>".join(out)


def _rows(doc: dict[str, Any], suite: str) -> tuple[list[str], dict[tuple[str, str | None], dict[str, Any]]]:
    recs = [r for r in doc["results"] if r["suite"] == suite]
    cols = [b for b in _backend_order(doc) if any(r["backend"] == b for r in recs)]
    rows: dict[tuple[str, str | None], dict[str, Any]] = {}
    for r in recs:
        rows.setdefault((r.get("key") or r["case"], r.get("precision")), {})[r["backend"]] = r
    return cols, rows


def _version(doc: dict[str, Any], backend: str) -> str:
    for r in doc["results"]:
        if r["backend"] == backend:
            return str(doc["runs"][r["run"]]["backends"].get(backend, {}).get("version", ""))
    return ""


def _suites(doc: dict[str, Any]) -> list[str]:
    present = {r["suite"] for r in doc["results"]}
    return [x for x in SUITE_NAMES if x in present] + sorted(present - set(SUITE_NAMES))


def _first(doc: dict[str, Any], backend: str, pred: Any) -> dict[str, Any] | None:
    for r in doc["results"]:
        if r["backend"] == backend and r.get("variants") and pred(r):
            return r
    return None


def _med(r: dict[str, Any] | None, v: str) -> float | None:
    x = ((r or {}).get("variants") or {}).get(v) or {}
    return x.get("median_s")


def headline(doc: dict[str, Any]) -> list[str]:
    """A compact Markdown table: the issue's goals and one figure per suite, a column per backend.
    D2L's V100 numbers (PyTorch, 2 GPUs) stand beside the autoparallel rows for reference."""
    cols = _backend_order(doc)
    prec = sorted({r["precision"] for r in doc["results"] if r.get("precision")})
    p0 = prec[0] if prec else None
    rows: list[tuple[str, Any, str]] = []

    def ratio(group: str) -> Any:
        def f(b: str) -> str:
            r = _first(doc, b, lambda r: r.get("group") == group and r.get("ratio"))
            if r is None:
                return ""
            return (f"{SHORT['md']} {fmt_time(_med(r, 'md'))} / {fmt_time(_med(r, 'native'))} = "
                    f"**×{r['ratio']['value']:.2f}**")
        return f

    def timed(group: str, variants: Sequence[str], pr: str | None = p0) -> Any:
        def f(b: str) -> str:
            r = _first(doc, b, lambda r: r.get("group") == group and r.get("precision") in (pr, None))
            if r is None:
                return ""
            parts = [f"{SHORT.get(v, v)} {fmt_time(_med(r, v))}" for v in variants if _med(r, v) is not None]
            note = (r.get("params") or {}).get("note")
            return (f"_{note}_: " if note else "") + ", ".join(parts)
        return f

    def bw(group: str) -> Any:
        def f(b: str) -> str:
            recs = [r for r in doc["results"] if r["backend"] == b and r.get("group") == group and r.get("variants")]
            if not recs:
                return ""
            r = max(recs, key=lambda r: r.get("bytes") or 0)
            g = {v: ((r["variants"].get(v) or {}).get("GBps")) for v in ("md", "native")}
            return (f"{fmt_bytes_short(r['bytes'])} {r['params'].get('note', '')}: md {g['md'] or 0:.3g} / "
                    f"native {g['native'] or 0:.3g} GB/s")
        return f

    def allreduce(b: str) -> str:
        recs = [r for r in doc["results"] if r["backend"] == b and r["benchmark"] == "allreduce" and r.get("variants")]
        if not recs:
            return ""
        n = max(r["params"]["n"] for r in recs)
        size = max(r["bytes"] for r in recs)
        best = {}
        for r in recs:
            if r["params"]["n"] == n and r["bytes"] == size:
                x = r["variants"].get("md") or {}
                if "busbw_GBps" in x:
                    best[r["params"]["algorithm"]] = x["busbw_GBps"]
        return f"n={n}, {fmt_bytes_short(size)}: " + ", ".join(f"{a} {v:.3g}" for a, v in best.items()) + " GB/s busbw"

    rows.append(("P1 no-op `to` (md / native)", ratio("to no-op"), "goal: torch ≤ 1.5, JAX ≤ 0.05"))
    rows.append(("P2 `synchronize(device)` idle", ratio("synchronize(device)"), "goal ≤ 1.2"))
    rows.append(("P2 `synchronize(device, backend=)`", ratio("synchronize(device, backend)"), "goal ≤ 1.2"))
    rows.append(("`device_of(x)`", ratio("device_of"), ""))
    rows.append(("creation `zeros(1000)`", ratio("creation"), ""))
    rows.append((f"async: 10 matmuls, time to result [{p0}]", timed("time to result", ("numpy", "native", "md")), ""))
    rows.append((f"async: 10 matmuls, dispatch only [{p0}]", timed("dispatch", ("framework",)), ""))
    for pr in prec:
        rows.append((f"autoparallel: run(x) on device 1 [{pr}]", timed("device 1", ("md", "native"), pr), "0.50 s"))
        rows.append((f"autoparallel: devices 1+2 concurrently [{pr}]", timed("both", ("md", "native"), pr), ""))
        rows.append((f"autoparallel: copy results to host [{pr}]", timed("copy to host", ("md", "native"), pr),
                     "2.49 s"))
        rows.append((f"autoparallel: run + overlapped copy [{pr}]",
                     timed("run + overlapped copy", ("md", "native"), pr), "1.92 s"))
    for g in ("H2D", "D2H", "D2D"):
        rows.append((f"bandwidth {g}, largest size", bw(g), ""))
    rows.append(("allreduce busbw per algorithm (md)", allreduce, ""))
    out = ["| | " + " | ".join(f"{b} {_version(doc, b)}" for b in cols) + " | D2L (V100) |",
           "|---" * (len(cols) + 2) + "|"]
    for label, fn, ref in rows:
        cells = [fn(b) for b in cols]
        if any(cells):
            out.append(f"| {label} | " + " | ".join(c.replace("|", "\\|") for c in cells) + f" | {ref} |")
    return out


def fmt_bytes_short(n: int | None) -> str:
    return fmt_bytes(int(n or 0))


def markdown(doc: dict[str, Any]) -> str:
    """The side-by-side tables as Markdown (for results/README.md)."""
    out = [f"Results of `multidev bench` ({doc['created']}): median ±IQR/median per call; "
           "**×r** = md ÷ native (below 1: multidev faster).", "", "### headline", ""]
    out += headline(doc) + [""]
    for run_ in doc["runs"]:
        m = run_["machine"]
        names = sorted({n for info in run_["backends"].values() for n in info.get("device_names", {}).values()})
        out.append(f"- {', '.join(b for b in run_['backends'])}: {m['cpu']} ({m['cpu_count']} cores, "
                   f"{m['memory_GiB']} GiB), {'; '.join(names)}; python {m['python']}, numpy {m['numpy']}; "
                   f"precision {run_['settings']['precision']}; load average {run_.get('loadavg_before')} -> "
                   f"{run_.get('loadavg_after')}; {run_['settings'].get('wall_s')} s")
    out.append("")
    for suite in _suites(doc):
        cols, rows = _rows(doc, suite)
        out += [f"### {suite}", "", "| case | " + " | ".join(f"{b} {_version(doc, b)}" for b in cols) + " |",
                "|---" * (len(cols) + 1) + "|"]
        for (label, prec), by in rows.items():
            name = label + (f" [{prec}]" if prec else "")
            out.append(f"| {name} | " + " | ".join(_md_cell(by[b]) if b in by else "" for b in cols) + " |")
        out.append("")
    g = goals(doc)
    if g:
        out += ["### goals", "", "```", *g, "```", ""]
    return "\n".join(out)


def render(doc: dict[str, Any], console: Any) -> None:
    """One table per suite: a row per case, a column per backend."""
    from rich.table import Table

    for suite in _suites(doc):
        cols, rows = _rows(doc, suite)
        t = Table(title=f"multidev bench: {suite}", show_lines=True,
                  caption="median ±IQR/median; ×ratio = md ÷ native (below 1: multidev faster)")
        t.add_column("case")
        for b in cols:
            t.add_column(f"{b} {_version(doc, b)}", overflow="fold")
        for (label, prec), by in rows.items():
            name = label + (f" [{prec}]" if prec else "")
            t.add_row(name, *[_cell(by[b]) if b in by else "" for b in cols])
        console.print(t)
    failed = [r for r in doc["results"] if r.get("check") and not r["check"]["ok"]]
    errors = [r for r in doc["results"] if r.get("error")]
    console.print(f"correctness checks: {sum(1 for r in doc['results'] if r.get('check'))} run, "
                  f"[{'red' if failed else 'green'}]{len(failed)} failed[/]; {len(errors)} errors")
    for r in failed + errors:
        console.print(f"  [red]{r['backend']} {r['case']}: {r.get('error') or r['check']['detail']}[/red]",
                      markup=True, highlight=False)
    for line in goals(doc):
        console.print(line, markup=False, highlight=False)


def evaluate_goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every goal of the loaded suites judged on every result it applies to: one row each with the
    measured value, the target and whether it was met."""
    from . import goals as registered

    rows = []
    for bm, g in registered():
        for r in doc["results"]:
            if r.get("benchmark") != bm.name or r.get("suite") != bm.suite or not g.applies(r):
                continue
            info = doc["runs"][r.get("run", 0)]["backends"].get(r["backend"], {})
            targets = info.get("goal_targets") or {}
            target = targets.get(g.name, g.target)
            if target is None:  # the backend's baseline says this goal does not apply to it
                continue
            v = g.value(r)
            if v is None:
                continue
            goal = dataclasses.replace(g, target=float(target))
            rows.append({"goal": g.name, "rule": goal.describe(), "backend": r["backend"], "case": r["case"],
                         "precision": r.get("precision"), "value": v, "target": goal.target, "met": goal.met(v),
                         "note": g.note})
    return rows


def goals(doc: dict[str, Any]) -> list[str]:
    """The goal rows as text lines (met or MISSED, with the measured value)."""
    rows = doc.get("goals")
    if rows is None:
        rows = evaluate_goals(doc)
    out = []
    for g in rows:
        prec = f" [{g['precision']}]" if g.get("precision") else ""
        out.append(f"{'met   ' if g['met'] else 'MISSED'} {g['goal']}: {g['backend']} {g['case']}{prec}: "
                   f"{g['value']:.3g} ({g['rule']})")
    return out


def _legend(a: Any, **kw: Any) -> None:
    if a.get_legend_handles_labels()[0]:
        a.legend(**kw)


def plot(doc: dict[str, Any], path: str) -> None:
    """A figure: overhead ratios, async and autoparallel times, bandwidth and allreduce busbw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = _backend_order(doc)
    res = doc["results"]
    colors = {b: f"C{i}" for i, b in enumerate(order)}
    fig, axes = plt.subplots(3, 3, figsize=(19, 15))
    ax = axes.ravel()

    def med(r: dict[str, Any], v: str) -> float | None:
        x = (r.get("variants") or {}).get(v)
        return x.get("median_s") if x else None

    def grouped(a: Any, recs: list[dict[str, Any]], value: Any, title: str, ylabel: str, log: bool) -> None:
        keys: list[str] = []
        for r in recs:
            k = (r.get("key") or r["case"]) + (f" [{r['precision']}]" if r.get("precision") else "")
            if k not in keys:
                keys.append(k)
        w = 0.8 / max(1, len(order))
        for i, b in enumerate(order):
            xs, ys = [], []
            for r in recs:
                if r["backend"] != b:
                    continue
                k = (r.get("key") or r["case"]) + (f" [{r['precision']}]" if r.get("precision") else "")
                y = value(r)
                if y is not None:
                    xs.append(keys.index(k) + i * w)
                    ys.append(y)
            if xs:
                a.bar(xs, ys, width=w, color=colors[b], label=b)
        a.set_xticks([i + 0.4 - w / 2 for i in range(len(keys))])
        a.set_xticklabels([k[:38] for k in keys], rotation=35, ha="right", fontsize=7)
        a.set_title(title)
        a.set_ylabel(ylabel)
        if log:
            a.set_yscale("log")
        _legend(a, fontsize=7)

    ov = [r for r in res if r["suite"] == "overhead" and r.get("ratio")]
    grouped(ax[0], ov, lambda r: r["ratio"]["value"], "overhead: md ÷ native (median)", "ratio (log)", True)
    if ov:
        ax[0].axhline(1.0, color="k", lw=0.8)
    asy = [r for r in res if r["suite"] == "async"]
    arows = []
    for r in asy:
        for v in ("numpy", "framework", "md", "native"):
            m = med(r, v)
            if m is not None:
                arows.append({**r, "key": f"{SHORT.get(v, v)}", "_m": m})
    grouped(ax[1], arows, lambda r: r["_m"], "async: 10 matmuls (numpy / dispatch / result)", "seconds (log)", True)
    ap = [r for r in res if r["suite"] == "autoparallel"]
    grouped(ax[2], ap, lambda r: med(r, "md"), "autoparallel (D2L): md variant", "seconds (log)", True)
    for i, grp in enumerate(("H2D", "D2H", "D2D")):
        a = ax[3 + i]
        for b in order:
            recs = sorted((r for r in res if r["suite"] == "bandwidth" and r.get("group") == grp
                           and r["backend"] == b and r.get("variants")), key=lambda r: r["bytes"] or 0)
            for v, style in (("md", "-o"), ("native", "--x")):
                pts = [(r["bytes"], r["variants"][v]["GBps"]) for r in recs
                       if (r["variants"].get(v) or {}).get("GBps")]
                if pts:
                    a.plot(*zip(*pts), style, color=colors[b], label=f"{b} {v}")
        a.set_xscale("log", base=2)
        a.set_title(f"bandwidth {grp} (md solid, native dashed)")
        a.set_xlabel("bytes")
        a.set_yscale("log")
        a.set_ylabel("GB/s (log)")
        _legend(a, fontsize=7)
    coll = [r for r in res if r["suite"] == "collectives" and r.get("variants")]
    for i, op in enumerate(("allreduce", "other")):
        a = ax[6 + i]
        series: dict[str, list[tuple[int, float]]] = {}
        for r in coll:
            is_ar = r["benchmark"] == "allreduce"
            if (op == "allreduce") != is_ar:
                continue
            nmax = max((x["params"].get("n", 0) for x in coll if x["backend"] == r["backend"]
                        and x["benchmark"] == r["benchmark"]), default=0)
            if r["params"].get("n") != nmax:
                continue
            for v in ("md", "native"):
                x = (r["variants"].get(v) or {})
                if "busbw_GBps" in x:
                    if v == "native" and is_ar and r["params"].get("algorithm") != "native":
                        continue
                    alg = r['params'].get('algorithm', r['benchmark'])
                    lab = f"{r['backend']} {alg}" + (" native" if v == "native" else "") + f" n={nmax}"
                    series.setdefault(lab, []).append((r["bytes"], x["busbw_GBps"]))
        for lab, pts in series.items():
            pts.sort()
            a.plot(*zip(*pts), "-o", ms=3, color=colors[lab.split()[0]], label=lab,
                   alpha=0.5 + 0.5 * ("native" in lab))
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_title("allreduce busbw per algorithm" if op == "allreduce"
                    else "broadcast / allgather / reduce_scatter busbw")
        a.set_xlabel("bytes per device")
        a.set_ylabel("busbw GB/s")
        _legend(a, fontsize=6, ncol=2)
    ax[8].axis("off")
    lines = [f"multidev bench, {doc['created']}"]
    for run_ in doc["runs"]:
        m = run_["machine"]
        lines.append(f"{m['cpu']} ({m['cpu_count']} cores), python {m['python']}, numpy {m['numpy']}")
        for b, info in run_["backends"].items():
            if "error" in info:
                continue
            names = sorted(set(info.get("device_names", {}).values()))
            lines.append(f"  {b} {info['version']}: {', '.join(info['devices'])}; {'; '.join(names)[:70]}")
        lines.append(f"  precision: {run_['settings']['precision']}; quick: {run_['settings']['quick']}")
    ax[8].text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


