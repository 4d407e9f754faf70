"""Tables, Markdown, plots and goal checks of ``multidev bench`` results (a ``multidev-bench/1`` JSON)."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from typing import Any

from . import SUITES, fmt_bytes

SCHEMA = "multidev-bench/1"
PRECISIONS = ("fp32", "tf32", "both", "default")
SUITE_NAMES = tuple(SUITES.values())
VARIANT_ORDER = ("md", "md_inplace", "md_to_host", "native", "native_pinned", "book", "bound", "numpy", "framework",
                 "framework_own", "memcpy")
SHORT = {"md": "md", "md_inplace": "md in-place", "md_to_host": "md.to_host", "native": "native",
         "native_pinned": "native pinned", "book": "book", "bound": "hw bound", "numpy": "numpy",
         "framework": "dispatch", "framework_own": "framework's own", "memcpy": "memcpy"}


#: How far above the bound measured in the same run a row may read before it is refused: 10%
#: (timer noise; a copy that beats the machine's own memcpy did not copy).
BOUND_SLACK = 1.10


def _rate(v: dict[str, Any]) -> float | None:
    """A variant's bandwidth: busbw for collectives, else the payload rate."""
    return v.get("busbw_GBps", v.get("GBps"))


def _memcpy_peak(run: dict[str, Any]) -> float | None:
    """The host memcpy peak (GB/s) the run measured, or None."""
    peak = ((run.get("bounds") or {}).get("memcpy") or {}).get("peak_GBps")
    return float(peak) if peak else None


def row_bound(rec: dict[str, Any], run: dict[str, Any]) -> tuple[float, str] | None:
    """The physical bound (GB/s, busbw for collectives) of a row, measured in the same run, and what
    it is: the row's preallocated pinned copy (host <-> GPU rows), else for rows on host memory alone
    (CPU devices) the run's memcpy peak; None where the run measured none."""
    pinned = ((rec.get("variants") or {}).get("native_pinned") or {}).get("GBps")
    if pinned:
        return float(pinned), "the preallocated pinned copy measured beside it (native_pinned)"
    devs = [str(d) for d in rec.get("devices") or []]
    peak = ((run.get("bounds") or {}).get("memcpy") or {}).get("peak_GBps")
    if devs and peak and all(d.startswith("cpu") for d in devs):
        return float(peak), "the host's memcpy peak measured in this run"
    return None


def validate(doc: dict[str, Any]) -> list[str]:
    """Refuse physically impossible rows: a variant whose bandwidth is above the row's bound
    (:func:`row_bound`) by more than :data:`BOUND_SLACK` did not do the work it names (a cached host
    value, a view, an alias). It is marked ``invalid`` (the reason) in the JSON, the table and the
    plot, and ``multidev bench --check`` fails on it. A row that says its calls may legitimately make
    no copy (``params["zero_copy_possible"]``: a CPU tensor read as a NumPy view) gets ``zero_copy``
    instead: no bandwidth, and no failure. Returns the invalid rows as text (also
    :func:`invalid_rows`). Marks every row's stability too (:func:`mark_stability`)."""
    mark_stability(doc)
    for rec in doc.get("results", []):
        rec.pop("invalid", None)
        variants = rec.get("variants") or {}
        if not rec.get("bytes") or not variants:
            continue
        runs = doc.get("runs") or [{}]
        _rebound(rec, runs[min(rec.get("run", 0), len(runs) - 1)])
        found = row_bound(rec, runs[min(rec.get("run", 0), len(runs) - 1)])
        if found is None:
            continue
        bound, what = found
        own = _rate(variants.get("memcpy") or {})  # a row's own memcpy (collectives): the bound too
        if own and own > bound and "memcpy peak" in what:
            bound, what = own, "the host memcpy measured beside it"
        for name, v in variants.items():
            if not v or name in ("native_pinned", "memcpy"):
                continue
            v.pop("invalid", None)
            v.pop("zero_copy", None)
            rate = _rate(v)
            if rate is None or rate <= BOUND_SLACK * bound:
                continue
            why = f"{rate:.3g} GB/s is {rate / bound:.3g}x {what} ({bound:.3g} GB/s)"
            if (rec.get("params") or {}).get("zero_copy_possible"):
                v["zero_copy"] = f"{why}: a view, not a copy (allowed on this device; no bandwidth)"
            else:
                v["invalid"] = f"{why}: it did not do the work it names (a cached value, a view, an alias)"
                rec.setdefault("invalid", []).append(name)
    return invalid_rows(doc)


#: When the bench refuses to stand behind a row (:func:`stability`): the md/native ratio of the
#: alternating samples varies by more than this (IQR over median of the per-pair ratios) ...
PAIR_SPREAD_MAX = 0.10
#: ... or a variant's own samples do (IQR over median) ...
SPREAD_MAX = 0.25
#: ... or, on a row of CPU devices alone, a variant ran on the CPU less than this share of its wall
#: time (CPU time of every thread over wall time: the process waited while others ran) ...
CPU_SHARE_MIN = 0.8
#: ... or the run's 1-minute load average was above this many times the machine's CPUs.
LOAD_MAX = 2.0
#: The run's CPU frequency changing by more than this share between start and end is a warning.
MHZ_DRIFT_MAX = 0.10


def _rel_iqr(xs: list[float]) -> float | None:
    if len(xs) < 5:
        return None
    ys = sorted(xs)
    q1, med, q3 = ys[len(ys) // 4], ys[len(ys) // 2], ys[(3 * len(ys)) // 4]
    return (q3 - q1) / med if med > 0 else None


def run_warnings(run: dict[str, Any]) -> list[str]:
    """What about the run as a whole makes its figures less trustworthy: the load average against the
    CPUs, the CPU frequency changing (both recorded where readable)."""
    out = []
    cpus = ((run.get("machine") or {}).get("cpu_count")) or 0
    loads = [x[0] for x in (run.get("loadavg_before"), run.get("loadavg_after")) if x]
    if cpus and loads and max(loads) > cpus:
        out.append(f"load average {max(loads):.1f} on {cpus} CPUs (other work ran beside the bench)")
    a, b = run.get("cpu_MHz_before"), run.get("cpu_MHz_after")
    if a and b and abs(a - b) / max(a, b) > MHZ_DRIFT_MAX:
        out.append(f"CPU frequency moved from {a:g} to {b:g} MHz during the run")
    return out


def stability(rec: dict[str, Any], run: dict[str, Any], only: Collection[str] | None = None) -> list[str]:
    """Why the bench cannot stand behind row ``rec``'s figures (empty: it can): the md/native ratio
    of its alternating samples spreads (:data:`PAIR_SPREAD_MAX`), a variant's samples spread
    (:data:`SPREAD_MAX`), a variant of a CPU-only row was off the CPU (:data:`CPU_SHARE_MIN`), or the
    machine was loaded beyond :data:`LOAD_MAX` times its CPUs. ``only``: the variants a goal reads
    (the others' spread does not make its figure one the bench cannot stand behind)."""
    v = rec.get("variants") or {}
    if only is not None:
        v = {k: x for k, x in v.items() if k in only}
    out = []
    r = rec.get("ratio") or {}
    of = r.get("of") or []
    if len(of) == 2 and v.get(of[0]) and v.get(of[1]):
        sa, sb = v[of[0]].get("samples_s") or [], v[of[1]].get("samples_s") or []
        pairs = [a / b for a, b in zip(sa, sb) if b > 0]
        spread = _rel_iqr(pairs)
        if spread is not None and spread > PAIR_SPREAD_MAX:
            out.append(f"{of[0]}/{of[1]} varies ±{50 * spread:.0f}% between alternating samples")
    cpu_only = bool(rec.get("devices")) and all(str(d).startswith("cpu") for d in rec.get("devices") or [])
    for name in sorted(v, key=vkey):
        x = v[name]
        if not x or "median_s" not in x:
            continue
        spread = _rel_iqr(x.get("samples_s") or [])
        if spread is not None and spread > SPREAD_MAX:
            out.append(f"{name} spreads ±{50 * spread:.0f}%")
        share = x.get("cpu_share")
        if cpu_only and share is not None and share < CPU_SHARE_MIN:
            out.append(f"{name} was on the CPU {100 * share:.0f}% of its time")
    cpus = ((run.get("machine") or {}).get("cpu_count")) or 0
    loads = [x[0] for x in (run.get("loadavg_before"), run.get("loadavg_after")) if x]
    if cpus and loads and max(loads) > LOAD_MAX * cpus:
        out.append(f"load average {max(loads):.1f} on {cpus} CPUs")
    return out


def mark_stability(doc: dict[str, Any]) -> list[str]:
    """Set ``rec["unstable"]`` (the reasons of :func:`stability`) on every measured row of ``doc``;
    return them as ``"backend case: reasons"`` lines."""
    runs = doc.get("runs") or [{}]
    lines = []
    for rec in doc.get("results", []):
        rec.pop("unstable", None)
        if not rec.get("variants"):
            continue
        why = stability(rec, runs[min(rec.get("run", 0), len(runs) - 1)])
        if why:
            rec["unstable"] = why
            lines.append(f"{rec['backend']} {rec['case']}: {'; '.join(why)}")
    return lines


def strict(doc: dict[str, Any]) -> bool:
    """Whether unstable rows go unjudged (``--stability strict``, the default except under --quick)."""
    return all(((r.get("settings") or {}).get("stability") or "strict") == "strict" for r in doc.get("runs") or [{}])


def _rebound(rec: dict[str, Any], run: dict[str, Any]) -> None:
    """A row's bound (``rec["bound"]``: ``copies`` memcpy's of ``copy_bytes``) at the better of the
    row's own memcpy variant and the run's memcpy table (one thread and every core), as the runner
    makes it: recomputed, so files written before either existed read alike."""
    from .bounds import memcpy_at

    b = rec.get("bound")
    if not b or not b.get("copies") or not b.get("copy_bytes"):
        return
    n = int(b["copy_bytes"])
    timed = ((rec.get("variants") or {}).get("memcpy") or {}).get("median_s")
    row_bw = n / timed / 1e9 if timed else 0.0
    table_bw = memcpy_at((run.get("bounds") or {}).get("memcpy"), n) or 0.0
    bw = max(row_bw, table_bw)
    if not bw:
        return
    t = b["copies"] * n / (bw * 1e9)
    how = "the row's memcpy variant" if row_bw >= table_bw else "the run's memcpy table (every core)"
    b.update(time_s=t, memcpy_GBps=bw, what=f"{b['copies']:g} copies of {n} bytes at the memcpy bandwidth of {how}")
    if rec.get("bytes"):
        b["GBps"] = rec["bytes"] / t / 1e9
        if rec.get("busbw_factor") is not None:
            b["busbw_GBps"] = b["GBps"] * rec["busbw_factor"]


def invalid_rows(doc: dict[str, Any]) -> list[str]:
    """The rows :func:`validate` refused, as ``"backend case: variant"`` lines."""
    return [f"{r['backend']} {r['case']}: {n}" for r in doc.get("results", []) for n in r.get("invalid") or []]


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
        if v.get("zero_copy"):
            extra = " (a view: no copy, no GB/s)"
        elif "busbw_GBps" in v:
            extra = f" bus {v['busbw_GBps']:.3g} GB/s"
        elif "GBps" in v:
            extra = f" {v['GBps']:.3g} GB/s"
        first = v.get("first_call_s")
        if first and first > 3 * v["median_s"] and first - v["median_s"] > 1e-3:
            extra += f" (1st call {fmt_time(first)})"  # compilation / first-use cost, kept apart
        lines.append((f"{SHORT.get(name, name)} {fmt_time(v['median_s'])} ±{iqr:.0f}%{extra}", ""))
        if v.get("invalid"):
            lines.append((f"INVALID {SHORT.get(name, name)}: {v['invalid'][:90]}", "red"))
    b = rec.get("bound")
    if b and b.get("time_s"):
        bus = f", bus {b['busbw_GBps']:.3g} GB/s" if b.get("busbw_GBps") else ""
        lines.append((f"memcpy bound {fmt_time(b['time_s'])}{bus} ({b['copies']:g} copies)", "dim"))
    if rec.get("ratio") and not set(rec["ratio"]["of"]) & set(rec.get("invalid") or []):
        a, b = rec["ratio"]["of"]
        if rec.get("unstable"):
            lines.append((f"(×{rec['ratio']['value']:.2f} {SHORT.get(a, a)}/{SHORT.get(b, b)}: UNSTABLE, "
                          f"{rec['unstable'][0][:70]})", "yellow"))
        else:
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


def _med(r: dict[str, Any] | None, v: str) -> float | None:
    x = ((r or {}).get("variants") or {}).get(v) or {}
    return x.get("median_s")


def headline(doc: dict[str, Any]) -> list[str]:
    """A compact Markdown table built from the suites' :class:`Goal` data: one row per goal judged in
    ``doc`` (its ``goals``, else judged now by :func:`evaluate_goals`), a column per backend saying
    how many of its rows met the goal and the worst of them (among the misses where there are
    any); the rule in the last column, or in each cell where backends' targets differ."""
    judged = doc.get("goals") or evaluate_goals(doc)
    if not judged:
        return ["_No goal of the suites applies to these rows._"]
    cols = [b for b in _backend_order(doc) if any(g["backend"] == b for g in judged)]
    by: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for g in judged:
        by.setdefault(g["goal"], {}).setdefault(g["backend"], []).append(g)

    def cell(rows: list[dict[str, Any]], with_rule: bool) -> str:
        if not rows:
            return ""
        missed = [g for g in rows if not g["met"]]
        high_is_worse = "<=" in rows[0]["rule"]  # (a time or a ratio with a ceiling; else a floor)
        worst = (max if high_is_worse else min)(missed or rows, key=lambda g: g["value"])
        case = worst["case"] + (f" [{worst['precision']}]" if worst.get("precision") else "")
        text = f"{len(rows) - len(missed)}/{len(rows)} met; worst {worst['value']:.3g} ({case})"
        text += f"; {rows[0]['rule']}" if with_rule else ""
        return f"**{text}**" if missed else text

    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    out = ["| goal | " + " | ".join(f"{b} {_version(doc, b)}" for b in cols) + " | rule |",
           "|---" * (len(cols) + 2) + "|"]
    for name, per in by.items():
        rules = {g["rule"] for rows in per.values() for g in rows}
        cells = [cell(per.get(b, []), len(rules) > 1) for b in cols]
        rule = next(iter(rules)) if len(rules) == 1 else "per backend (in its cell)"
        out.append(f"| {name} | " + " | ".join(esc(c) for c in cells) + f" | {esc(rule)} |")
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
                   f"{run_.get('loadavg_after')}; CPU MHz {run_.get('cpu_MHz_before')} -> "
                   f"{run_.get('cpu_MHz_after')}; stability {run_['settings'].get('stability', 'strict')}; "
                   f"{run_['settings'].get('wall_s')} s")
        out += [f"  - warning: {w}" for w in run_warnings(run_)]
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
    for run in doc.get("runs") or []:
        for w in run_warnings(run):
            console.print(f"[yellow]warning: {w}[/yellow]", markup=True, highlight=False)
    for line in goals(doc):
        console.print(line, markup=False, highlight=False)


def evaluate_goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every goal of the loaded suites judged on every result it applies to: one row each with the
    measured value, the target and whether it was met."""
    from . import goals as registered

    rows = []
    strict_runs = strict(doc)
    for bm, g in registered():
        for r in doc["results"]:
            if r.get("benchmark") != bm.name or r.get("suite") != bm.suite or not g.applies(r):
                continue
            info = doc["runs"][r.get("run", 0)]["backends"].get(r["backend"], {})
            targets = info.get("goal_targets") or {}
            target = targets.get(g.name, g.target)
            if target is None:  # the backend's baseline says this goal does not apply to it
                continue
            goal = dataclasses.replace(g, target=float(target))
            judged = goal.judge(r)
            if judged is None:
                continue
            v, met = judged
            bad = sorted(set(goal.variants_of(r)) & set(r.get("invalid") or []))
            row = {"goal": g.name, "rule": goal.describe(), "backend": r["backend"], "case": r["case"],
                   "precision": r.get("precision"), "value": v, "target": goal.target, "met": met and not bad,
                   "note": g.note}
            if goal.slack_s is not None:
                row["above_s"] = goal.above_s(r)
            if bad:
                row["invalid"] = f"reads {', '.join(bad)}, which the run refused (above its bound)"
            why: list[str] = []
            if r.get("unstable"):  # the reasons about what this goal reads (a file without samples: the row's)
                reads = set(goal.variants_of(r))
                sampled = any((r["variants"].get(k) or {}).get("samples_s") for k in reads)
                why = (stability(r, doc["runs"][min(r.get("run", 0), len(doc["runs"]) - 1)], reads) if sampled
                       else list(r["unstable"]))
            if why:
                row["unstable"] = why
                if strict_runs:
                    row["measured_met"], row["met"] = row["met"], False
            rows.append(row)
    return rows


def goals(doc: dict[str, Any]) -> list[str]:
    """The goal rows as text lines (met or MISSED, with the measured value)."""
    rows = doc.get("goals")
    if rows is None:
        rows = evaluate_goals(doc)
    out = []
    for g in rows:
        prec = f" [{g['precision']}]" if g.get("precision") else ""
        above = f", {g['above_s'] * 1e6:.2f} µs above" if g.get("above_s") is not None else ""
        bad = f" INVALID: {g['invalid']}" if g.get("invalid") else ""
        verdict = "met   " if g["met"] else "MISSED"
        if g.get("unstable"):
            why = "; ".join(g["unstable"])
            if "measured_met" in g:  # strict: not judged
                verdict = "UNSTABLE"
                bad += f" (not judged: {why}; it read as {'met' if g['measured_met'] else 'missed'})"
            else:
                bad += f" [unstable: {why}]"
        out.append(f"{verdict} {g['goal']}: {g['backend']} {g['case']}{prec}: "
                   f"{g['value']:.3g}{above} ({g['rule']}){bad}")
    for line in invalid_rows(doc):
        out.append(f"INVALID {line} (above the bound measured in the same run)")
    return out


def _legend(a: Any, **kw: Any) -> None:
    if a.get_legend_handles_labels()[0]:
        a.legend(**kw)


def _panels(doc: dict[str, Any]) -> list[tuple[str, Any]]:
    """The figure's panels that have data, as (title, draw(axes, colors)) in report order; each
    title says what a reader compares."""
    res = doc["results"]
    order = _backend_order(doc)
    out: list[tuple[str, Any]] = []

    def grouped(a: Any, colors: dict[str, str], recs: list[dict[str, Any]], value: Any, ylabel: str,
                log: bool) -> None:
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
        a.set_ylabel(ylabel)
        if log:
            a.set_yscale("log")
        _legend(a, fontsize=7)

    ov = [r for r in res if r["suite"] == "overhead" and r.get("ratio")]
    if ov:
        def draw_ov(a: Any, colors: dict[str, str]) -> None:
            grouped(a, colors, ov, lambda r: r["ratio"]["value"], "md ÷ native (log)", True)
            a.axhline(1.0, color="k", lw=0.8)
            a.axhline(1.3, color="r", lw=0.8, ls=":", label="goal 1.3")
        out.append(("overhead, thin calls: md ÷ the framework's own call (1 = native cost; goal ≤ 1.3 or "
                     "≤ 0.3 µs above)", draw_ov))
    asy = [r for r in res if r["suite"] == "async" and r.get("variants")]
    if asy:
        arows = [{**r, "key": SHORT.get(v, v), "_m": _med(r, v)} for r in asy
                 for v in ("numpy", "framework", "md", "native") if _med(r, v) is not None]

        def draw_async(a: Any, colors: dict[str, str]) -> None:
            grouped(a, colors, arows, lambda r: r["_m"], "seconds (log)", True)
        out.append(("async (D2L): md vs native time to result; dispatch alone and NumPy for scale", draw_async))
    ap = [r for r in res if r["suite"] == "autoparallel" and r.get("variants")]
    if ap:
        aprows = [{**r, "key": f"{r.get('key') or r['case']} [{SHORT.get(v, v)}]", "_m": _med(r, v)} for r in ap
                  for v in ("md", "native", "bound") if _med(r, v) is not None]

        def draw_ap(a: Any, colors: dict[str, str]) -> None:
            grouped(a, colors, aprows, lambda r: r["_m"], "seconds (log)", True)
        out.append(("autoparallel (D2L): md vs native vs the hand-written bound", draw_ap))
    for grp in ("H2D", "D2H", "D2D"):
        recs = [r for r in res if r["suite"] == "bandwidth" and r.get("group") == grp and r.get("variants")]
        if not recs:
            continue

        def draw_bw(a: Any, colors: dict[str, str], recs: list[dict[str, Any]] = recs) -> None:
            for b in order:
                rb = sorted((r for r in recs if r["backend"] == b), key=lambda r: r["bytes"] or 0)
                for v, style in (("md", "-o"), ("native", "--x"), ("native_pinned", ":")):
                    good = [(r["bytes"], r["variants"][v]["GBps"]) for r in rb
                            if (r["variants"].get(v) or {}).get("GBps") and not r["variants"][v].get("invalid")
                            and not r["variants"][v].get("zero_copy")]
                    bad = [(r["bytes"], r["variants"][v]["GBps"]) for r in rb
                           if (r["variants"].get(v) or {}).get("invalid")]
                    if good:
                        a.plot(*zip(*good), style, color=colors[b], label=f"{b} {SHORT.get(v, v)}", ms=4)
                    if bad:
                        a.plot(*zip(*bad), "X", color="red", ms=9, label=f"{b} {SHORT.get(v, v)}: INVALID")
            peaks = [float(p) for r in recs if all(str(d).startswith("cpu") for d in r.get("devices") or [])
                     if (p := _memcpy_peak(doc["runs"][r.get("run", 0)]))]
            if peaks:
                a.axhline(max(peaks), color="gray", ls=":", lw=1, label="host memcpy peak (this run)")
            a.set_xscale("log", base=2)
            a.set_yscale("log")
            a.set_xlabel("bytes")
            a.set_ylabel("GB/s (log)")
            _legend(a, fontsize=6)
        bound = "the pinned copy" if grp != "D2D" else "the bound"
        out.append((f"bandwidth {grp}: md (solid) vs native (dashed) vs {bound} (dotted; CPU rows: the host memcpy "
                    "peak); red X: above the bound, refused", draw_bw))
    conv = [r for r in res if r.get("group") == "convert" and r.get("ratio")]
    if conv:
        def draw_conv(a: Any, colors: dict[str, str]) -> None:
            series: dict[str, list[tuple[int, float]]] = {}
            for r in conv:
                n = r.get("bytes") or (r.get("params") or {}).get("size")  # (convert rows: params["size"])
                if n:
                    series.setdefault(f"{r['backend']}->{r['params'].get('dst')}", []).append(
                        (n, r["ratio"]["value"]))
            for lab, pts in series.items():
                a.plot(*zip(*sorted(pts)), "-o", ms=3, color=colors[lab.split("->")[0]], label=lab)
            a.axhline(1.0, color="k", lw=0.8)
            a.axhline(1.3, color="r", lw=0.8, ls=":")
            a.set_xscale("log", base=2)
            a.set_xlabel("bytes")
            a.set_ylabel("md ÷ native")
            _legend(a, fontsize=6)
        out.append(("convert: md ÷ the consumer's own from_dlpack (goal ≤ 1.3)", draw_conv))
    coll = [r for r in res if r["suite"] == "collectives" and r.get("variants")]
    for kind in ("allreduce", "other"):
        recs = [r for r in coll if (r["benchmark"] == "allreduce") == (kind == "allreduce")]
        if not recs:
            continue

        def draw_coll(a: Any, colors: dict[str, str], recs: list[dict[str, Any]] = recs) -> None:
            series: dict[str, list[tuple[int, float]]] = {}
            style: dict[str, str] = {}
            for r in recs:
                n = r["params"].get("n")
                nmax = max((x["params"].get("n", 0) for x in recs if x["backend"] == r["backend"]), default=0)
                if n != nmax:
                    continue
                for v, x in (r.get("variants") or {}).items():
                    if not x or "busbw_GBps" not in x or x.get("invalid"):
                        continue
                    lab = f"{r['backend']} {r['benchmark'] if r['benchmark'] != 'allreduce' else ''} {v} n={n}"
                    series.setdefault(lab, []).append((r["bytes"], x["busbw_GBps"]))
                    style[lab] = "--" if v in ("framework_own", "native", "alg:native") else "-"
                bnd = (r.get("bound") or {}).get("busbw_GBps")
                if bnd:
                    lab = f"{r['backend']} {r['benchmark']} memcpy bound n={n}"
                    series.setdefault(lab, []).append((r["bytes"], bnd))
                    style[lab] = ":"
            for lab, pts in series.items():
                a.plot(*zip(*sorted(set(pts))), style[lab], marker="o", ms=2, color=colors[lab.split()[0]],
                       label=" ".join(lab.split()), alpha=0.9 if style[lab] != "-" else 0.6)
            a.set_xscale("log", base=2)
            a.set_yscale("log")
            a.set_xlabel("bytes per device")
            a.set_ylabel("busbw GB/s")
            _legend(a, fontsize=5, ncol=2)
        out.append((("collectives, allreduce busbw: md's algorithms (solid) vs native and the framework's own "
                     "(dashed) vs the memcpy bound (dotted)") if kind == "allreduce" else
                    "collectives, broadcast / allgather / reduce_scatter busbw vs the memcpy bound (dotted)",
                    draw_coll))
    st = [r for r in res if r["suite"] == "startup" and r.get("variants")]
    if st:
        srows = [{**r, "key": f"{r.get('key') or r['case']} [{SHORT.get(v, v)}]", "_m": _med(r, v)} for r in st
                 for v in ("md", "native") if _med(r, v) is not None]

        def draw_st(a: Any, colors: dict[str, str]) -> None:
            grouped(a, colors, srows, lambda r: r["_m"], "seconds", False)
        out.append(("startup: md (import multidev, first call naming a backend) vs native (numpy, the framework's "
                    "import)", draw_st))
    drawn = {"overhead", "async", "autoparallel", "bandwidth", "collectives", "startup"}
    for suite in dict.fromkeys(r["suite"] for r in res):  # every other suite run: one panel each
        if suite in drawn:
            continue
        rest = [r for r in res if r["suite"] == suite and r.get("group") != "convert" and r.get("variants")]
        ratios = [r for r in rest if (r.get("ratio") or {}).get("value") is not None]
        if ratios:
            goals = sorted({g["target"] for g in doc.get("goals", [])
                            if g.get("target") and any(g.get("case") == r["case"] for r in ratios)})

            def draw_ratio(a: Any, colors: dict[str, str], recs: list[dict[str, Any]] = ratios,
                           goals: list[float] = goals) -> None:
                grouped(a, colors, recs, lambda x: x["ratio"]["value"], "ratio (log)", True)
                a.axhline(1.0, color="k", lw=0.8)
                for t in goals:
                    a.axhline(t, color="r", lw=0.8, ls=":", label=f"goal {t:g}")
                _legend(a, fontsize=7)
            of = " ÷ ".join(ratios[0]["ratio"].get("of") or ["md", "native"])
            out.append((f"{suite}: {of} per case (1 = the same cost; dotted: the goals of these rows)", draw_ratio))
        elif rest:
            mrows = [{**r, "key": f"{r.get('key') or r['case']} [{SHORT.get(v, v)}]", "_m": _med(r, v)} for r in rest
                     for v in r["variants"] if _med(r, v) is not None]

            def draw_med(a: Any, colors: dict[str, str], recs: list[dict[str, Any]] = mrows) -> None:
                grouped(a, colors, recs, lambda x: x["_m"], "seconds (log)", True)
            out.append((f"{suite}: median time per variant", draw_med))
    return out


def plot(doc: dict[str, Any], path: str) -> None:
    """A figure of the panels that have data (:func:`_panels`; each title says what to compare),
    and the run's machine, versions and settings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = _backend_order(doc)
    colors = {b: f"C{i}" for i, b in enumerate(order)}
    panels = _panels(doc)
    n = len(panels) + 1
    cols = 3 if n > 4 else 2 if n > 1 else 1
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 5.0 * rows), squeeze=False)
    ax = axes.ravel()
    for a, (title, draw) in zip(ax, panels):
        draw(a, colors)
        if not a.lines and not a.patches:  # every point refused or a view: say so, not an empty log axis
            a.set_xscale("linear")
            a.set_yscale("linear")
            a.text(0.5, 0.5, "no valid point", ha="center", va="center", transform=a.transAxes)
        a.set_title(title, fontsize=8, wrap=True)
    for a in ax[len(panels) + 1:]:
        a.axis("off")
    info = ax[len(panels)]
    info.axis("off")
    lines = [f"multidev bench, {doc['created']}"]
    for run_ in doc["runs"]:
        m = run_["machine"]
        lines.append(f"{m['cpu']} ({m['cpu_count']} cores), python {m['python']}, numpy {m['numpy']}")
        for b, info_ in run_["backends"].items():
            if "error" in info_:
                continue
            names = sorted(set(info_.get("device_names", {}).values()))
            lines.append(f"  {b} {info_['version']}: {', '.join(info_['devices'])[:40]}; {'; '.join(names)[:50]}")
        mc = (run_.get("bounds") or {}).get("memcpy") or {}
        if mc.get("peak_GBps"):
            lines.append(f"  memcpy peak {mc['peak_GBps']:.3g} GB/s (the host bound of this run)")
        lines.append(f"  precision: {run_['settings']['precision']}; quick: {run_['settings']['quick']}; "
                     f"load {run_.get('loadavg_before')}")
    bad = invalid_rows(doc)
    if bad:
        lines.append(f"{len(bad)} row(s) refused (above the bound measured in the same run):")
        lines += [f"  {b[:80]}" for b in bad[:8]]
    info.text(0, 1, "\n".join(lines[:40]), va="top", family="monospace", fontsize=6.5)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
