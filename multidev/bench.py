"""``multidev bench``: every row measured through multidev and through the framework's own call, in
the same run, side by side per backend.

Method (applies to every figure):

- warm-up: the first call is timed alone (``first_call_s``: compilation, allocator growth) and kept
  apart from the statistics; then ``warmup`` more calls;
- every device a case involves is synchronized before the clock starts and before it stops
  (except rows that measure dispatch on purpose, which say so);
- fast calls are batched (``inner`` calls per sample, ~1 ms a sample) and the per-call time is
  reported; variants of a row are sampled alternately, so drift hits them alike;
- at least ``--reps`` samples (20), or until the ``--budget`` per variant is spent (3 at least);
  median and IQR (q1, q3); raw samples kept in the JSON;
- one untimed correctness check per row against NumPy;
- versions, device names, precision flags and environment variables recorded in the JSON;
- f32 matmul precision set explicitly and labelled (``--precision fp32|tf32|both|default``).

Benchmark definitions live in :mod:`multidev.benchmarks` (one function each).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import math
import os
import platform
import sys
import time
import traceback
from typing import Any, Sequence

import numpy as np

from . import __version__

SCHEMA = "multidev-bench/1"
PRECISIONS = ("fp32", "tf32", "both", "default")
SUITE_NAMES = ("overhead", "async", "autoparallel", "bandwidth", "collectives")
ENV_PREFIXES = ("MULTIDEV_", "XLA_", "JAX_", "TF_", "CUDA_", "NVIDIA_", "OMP_", "MKL_", "OPENBLAS_",
                "TORCH_", "PYTORCH_", "MXNET_", "NCCL_", "KMP_", "CUBLAS_")
_VARIANT_ORDER = ("md", "md_inplace", "md_to_host", "native", "numpy", "framework")
_SHORT = {"md": "md", "md_inplace": "md in-place", "md_to_host": "md.to_host", "native": "native",
          "numpy": "numpy", "framework": "dispatch"}


# -- command line --------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``multidev bench`` options (cli.py calls this on its subparser)."""
    p.add_argument("--backend", help="comma-separated backends (default: every installed one)")
    p.add_argument("--device", help="only these devices, comma-separated, e.g. cpu:0,gpu:0")
    p.add_argument("--suite", help=f"comma-separated suites: {', '.join(SUITE_NAMES)} (default: all)")
    p.add_argument("--json", metavar="FILE", help="write every result, raw samples included, to FILE")
    p.add_argument("--plot", metavar="FILE.png", help="write a figure of the results (needs matplotlib)")
    p.add_argument("--markdown", metavar="FILE.md", help="write the side-by-side tables as Markdown")
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repetitions (CI)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="f32 matmul precision for matmul suites: fp32 (full, default), tf32, both "
                        "(each row twice, labelled) or default (leave each framework's own)")
    p.add_argument("--reps", type=int, help="minimum samples per variant (default 20; quick 5)")
    p.add_argument("--budget", type=float, help="seconds per variant before stopping short of --reps "
                                               "(default 2; quick 0.2)")
    p.add_argument("--max-time", type=float, metavar="S",
                   help="stop starting new rows after S seconds (the rest are marked skipped; the "
                        "JSON is still written): for fixed-length slots such as a lent GPU")
    p.add_argument("--cpu-devices", type=int, default=2,
                   help="virtual CPU devices for JAX/TF/MXNet/NumPy when not set in the environment "
                        "(MULTIDEV_*_CPU_DEVICES); default 2")
    p.add_argument("--report", nargs="+", metavar="JSON",
                   help="run nothing: merge these result files (e.g. one per backend or venv) into "
                        "one table, --json and --plot")
    p.add_argument("--bench-file", action="append", default=[], metavar="PY",
                   help="extra benchmark definitions to load (a Python file using multidev.benchmarks)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="multidev bench", description=__doc__.split("\n")[0])
    add_arguments(p)
    return p


class Settings:
    def __init__(self, args: argparse.Namespace) -> None:
        q = bool(args.quick)
        self.quick = q
        self.min_reps = args.reps if args.reps else (5 if q else 20)
        self.max_reps = max(self.min_reps, 20 if q else 200)
        self.budget = args.budget if args.budget else (0.2 if q else 2.0)
        self.min_time = 0.005 if q else 0.1  # keep sampling fast rows at least this long
        self.target_sample = 2e-4 if q else 1e-3  # batch fast calls up to this much per sample
        self.warmup = 1 if q else 2
        self.floor_reps = 2 if q else 3

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


# -- measurement ---------------------------------------------------------------------------------
def _stats(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples, dtype=np.float64)
    q1, med, q3 = (float(v) for v in np.percentile(a, [25, 50, 75]))
    return {"median_s": med, "q1_s": q1, "q3_s": q3, "iqr_s": q3 - q1, "mean_s": float(a.mean()),
            "min_s": float(a.min()), "max_s": float(a.max()), "n": int(a.size)}


class _Timed:
    """Sampling state of one variant of one case."""

    def __init__(self, name: str, v: Any, sync: Any, s: Settings) -> None:
        self.name, self.v, self.sync, self.s = name, v, sync, s
        self.samples: list[float] = []
        self.spent = 0.0
        self.inner = 1
        self.first = math.nan
        self.error: str | None = None
        self.stopped_by = ""

    def _once(self, inner: int) -> float:
        f, a, v = self.v.fn, self.v.args, self.v
        self.sync()
        t0 = time.perf_counter()
        r = None
        for _ in range(inner):
            r = f(*a)
        if v.finish is not None:
            v.finish(r)
        if v.sync:
            self.sync()
        t1 = time.perf_counter()
        if not v.sync:
            if v.finish is None and r is not None:
                _drain(r)
            self.sync()
        del r
        return t1 - t0

    def warm(self) -> None:
        try:
            self.first = self._once(1)
            one = self.first
            for _ in range(self.s.warmup):
                one = self._once(1)
            if self.v.inner:
                self.inner = int(self.v.inner)
            elif one < self.s.target_sample:
                self.inner = int(min(10000, max(1, math.ceil(self.s.target_sample / max(one, 1e-8)))))
        except Exception as e:  # noqa: BLE001 - one variant failing must not stop the run
            self.error = f"{type(e).__name__}: {e}"

    @property
    def active(self) -> bool:
        if self.error is not None or self.stopped_by:
            return False
        n, s = len(self.samples), self.s
        if n >= s.max_reps:
            self.stopped_by = "max_reps"
        elif n >= s.min_reps and self.spent >= s.min_time:
            self.stopped_by = "reps"
        elif self.spent >= s.budget and n >= s.floor_reps:
            self.stopped_by = "budget"
        return not self.stopped_by

    def sample(self) -> None:
        t0 = time.perf_counter()
        try:
            dt = self._once(self.inner)
        except Exception as e:  # noqa: BLE001
            self.error = f"{type(e).__name__}: {e}"
            return
        self.samples.append(dt / self.inner)
        self.spent += time.perf_counter() - t0

    def result(self, nbytes: int | None, busbw_factor: float | None) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.v.label, "inner": self.inner, "sync_before_stop": bool(self.v.sync)}
        if self.error is not None:
            out["error"] = self.error
        if self.samples:
            st = _stats(self.samples)
            out.update(st)
            out["first_call_s"] = self.first
            out["compile_s"] = max(0.0, self.first - st["median_s"]) if not math.isnan(self.first) else None
            out["stopped_by"] = self.stopped_by or "error"
            if nbytes:
                algbw = nbytes / st["median_s"] / 1e9
                out["GBps"] = algbw
                if busbw_factor is not None:
                    out["algbw_GBps"] = algbw
                    out["busbw_GBps"] = algbw * busbw_factor
            out["samples_s"] = self.samples
        return out


def _drain(r: Any) -> None:
    """Wait for a result before the next sample (rows that stop the clock before waiting)."""
    import multidev as md

    items = r if isinstance(r, (list, tuple)) else [r]
    for t in items:
        try:
            md.synchronize(t)
        except Exception:  # noqa: BLE001 - not a tensor
            pass


def measure_case(case: Any, b: Any, s: Settings) -> dict[str, Any]:
    """Warm up, check, then sample every variant of ``case`` alternately."""
    devs = list(case.devices)

    def sync() -> None:
        for d in devs:
            b.synchronize(d)

    rec: dict[str, Any] = {"check": None, "variants": {}}
    timed = [_Timed(k, v, sync, s) for k, v in sorted(case.variants.items(), key=lambda kv: _vkey(kv[0]))
             if v is not None]
    for t in timed:
        t.warm()
    if case.check is not None:
        try:
            c = case.check()
            ok, detail = (c, "") if isinstance(c, bool) else (bool(c[0]), str(c[1]))
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {e}"
        rec["check"] = {"ok": ok, "detail": detail}
    was = gc.isenabled()
    gc.collect(1)  # young generations only: the frameworks' own objects are frozen (see run)
    gc.disable()
    try:
        while True:
            act = [t for t in timed if t.active]
            if not act:
                break
            for t in act:
                t.sample()
    finally:
        if was:
            gc.enable()
    for t in timed:
        rec["variants"][t.name] = t.result(case.bytes, case.busbw_factor)
    for k, v in case.variants.items():
        if v is None:
            rec["variants"][k] = None
    r = case.ratio
    if r and all(rec["variants"].get(k) and "median_s" in rec["variants"][k] for k in r):
        rec["ratio"] = {"of": list(r), "value": rec["variants"][r[0]]["median_s"] / rec["variants"][r[1]]["median_s"]}
    else:
        rec["ratio"] = None
    return rec


def _vkey(name: str) -> tuple[int, str]:
    return (_VARIANT_ORDER.index(name) if name in _VARIANT_ORDER else len(_VARIANT_ORDER), name)


def timer_floor() -> float:
    """Per-call cost of the timing loop itself around a C no-op (a floor for the fast rows)."""
    f, a = int, ()
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(10000):
            f(*a)
        best = min(best, (time.perf_counter() - t0) / 10000)
    return best


# -- environment ---------------------------------------------------------------------------------
def _setup_env(cpu_devices: int) -> dict[str, str]:
    """Virtual CPU devices for the multi-device suites, unless the user set their own."""
    set_now = {}
    for k in ("MULTIDEV_NUMPY_DEVICES", "MULTIDEV_JAX_CPU_DEVICES", "MULTIDEV_TF_CPU_DEVICES",
              "MULTIDEV_MXNET_CPU_DEVICES"):
        if k not in os.environ and cpu_devices >= 1:
            os.environ[k] = str(cpu_devices)
            set_now[k] = str(cpu_devices)
    return set_now


def _loadavg() -> list[float] | None:
    """The 1/5/15-minute load averages: other work on the machine skews every figure."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _git() -> dict[str, Any] | None:
    """The commit the run's code came from, and its uncommitted files, where it is a git checkout."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "multidev", "backends",
                                "benchmarks"], capture_output=True, text=True, timeout=10).stdout.split("\n")
        return {"commit": head.stdout.strip(), "uncommitted": [d.strip() for d in dirty if d.strip()]}
    except (OSError, subprocess.SubprocessError):
        return None


def _env_flags() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def _machine() -> dict[str, Any]:
    from .benchmarks._native import cpu_name

    mem = None
    try:
        mem = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    return {"platform": platform.platform(), "machine": platform.machine(), "cpu": cpu_name(),
            "cpu_count": os.cpu_count(), "memory_GiB": mem, "python": sys.version.split()[0],
            "numpy": np.__version__, "multidev": __version__}


def _caps(b: Any) -> dict[str, Any]:
    c = b.capabilities
    return {"mutable": c.mutable, "async_execution": c.async_execution, "pinned_memory": c.pinned_memory,
            "dlpack": c.dlpack, "native_collectives": sorted(c.native_collectives),
            "multi_device_ops": c.multi_device_ops}


# -- running -------------------------------------------------------------------------------------
def _split(s: str | None) -> list[str]:
    return [v.strip() for v in (s or "").split(",") if v.strip()]


def run(args: argparse.Namespace, console: Any = None) -> dict[str, Any]:
    """Run the selected suites on the selected backends; return the report (the JSON document)."""
    env_set = _setup_env(args.cpu_devices)
    import multidev as md
    from multidev import benchmarks as mb
    from multidev.benchmarks._native import native_for
    from multidev.errors import BackendNotAvailableError

    s = Settings(args)
    benches = mb.load_all(args.bench_file)
    suites = _split(args.suite) or list(SUITE_NAMES)
    unknown = [x for x in suites if x not in {bm.suite for bm in benches}]
    if unknown:
        raise SystemExit(f"multidev bench: unknown suite(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted({bm.suite for bm in benches}))}")
    benches = [bm for bm in benches if bm.suite in suites]
    names = _split(args.backend) or md.backends()
    modes = ["fp32", "tf32"] if args.precision == "both" else [args.precision]
    wanted = [md.device(x) for x in _split(args.device)]

    backends_info: dict[str, Any] = {}
    saved_precision: dict[str, Any] = {}
    ready: list[tuple[str, Any, Any, list[Any]]] = []
    for n in names:
        try:
            b = md.backend(n)
        except BackendNotAvailableError as e:
            backends_info[n] = {"error": str(e)}
            continue
        devs = b.devices()
        if wanted:
            devs = [d for d in devs if d in wanted]
        if not devs:
            backends_info[n] = {"error": f"none of the devices {args.device} on {n}"}
            continue
        nat = native_for(b)
        if nat is not None:
            saved_precision[n] = nat.save_precision()
        info = {"version": b.version(), "framework": b.framework, "devices": [str(d) for d in devs],
                "all_devices": [str(d) for d in b.devices()], "capabilities": _caps(b),
                "native_baseline": nat is not None, "device_names": {}, "precision": {}}
        if nat is not None:
            for d in devs:
                try:
                    info["device_names"][str(d)] = nat.device_name(d)
                except Exception as e:  # noqa: BLE001 - a label only
                    info["device_names"][str(d)] = f"? ({type(e).__name__})"
        backends_info[n] = info
        ready.append((n, b, nat, devs))

    units = [(n, b, nat, devs, bm, mode) for (n, b, nat, devs) in ready for bm in benches
             for mode in (modes if bm.precision else modes[:1])]
    results: list[dict[str, Any]] = []
    gc.collect()
    gc.freeze()  # the frameworks' import-time objects: later collections need not walk them
    floor = timer_floor()
    load_before = _loadavg()
    progress = None
    if not args.no_progress:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn)
        from rich.console import Console

        progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[unit]}"), BarColumn(),
                            MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
                            console=Console(stderr=True), transient=False)
        progress.start()
        task = progress.add_task("", total=len(units), unit="")
    t_start = time.perf_counter()
    max_time = getattr(args, "max_time", None)

    def out_of_time() -> bool:
        return max_time is not None and time.perf_counter() - t_start > max_time

    try:
        for (n, b, nat, devs, bm, mode) in units:
            if out_of_time():
                results.append({"suite": bm.suite, "benchmark": bm.name, "backend": n,
                                "precision": mode if bm.precision else None, "case": f"{bm.name}: not run",
                                "key": f"{bm.name}: not run", "group": None, "devices": [], "params": {},
                                "bytes": None, "busbw_factor": None, "variants": {}, "check": None,
                                "ratio": None, "skipped": f"--max-time {max_time:g} s reached"})
                if progress is not None:
                    progress.advance(task)
                continue
            unit = f"{n} {bm.suite}/{bm.name}" + (f" [{mode}]" if bm.precision else "")
            if progress is not None:
                progress.update(task, unit=unit, description="")
            prec = {}
            if nat is not None:
                try:
                    prec = nat.set_precision(mode)
                except Exception as e:  # noqa: BLE001
                    prec = {"error": f"{type(e).__name__}: {e}"}
            backends_info[n]["precision"][mode] = prec
            ctx = mb.Context(n, b, nat, list(devs), s.quick, mode)
            base = {"suite": bm.suite, "benchmark": bm.name, "backend": n,
                    "precision": mode if bm.precision else None}
            try:
                for case in bm.fn(ctx):
                    if out_of_time():
                        results.append({**base, "case": case.name, "key": case.key or case.name,
                                        "group": case.group, "devices": [], "params": case.params,
                                        "bytes": case.bytes, "busbw_factor": case.busbw_factor, "variants": {},
                                        "check": None, "ratio": None,
                                        "skipped": f"--max-time {max_time:g} s reached"})
                        continue
                    if progress is not None:
                        progress.update(task, description=case.name)
                    rec = {**base, "case": case.name, "key": case.key or case.name, "group": case.group,
                           "devices": [str(d) for d in case.devices], "params": case.params,
                           "bytes": case.bytes, "busbw_factor": case.busbw_factor}
                    if case.params.get("skipped") or not any(v is not None for v in case.variants.values()):
                        rec.update(skipped=case.params.get("skipped", "no variant"), variants={}, check=None,
                                   ratio=None)
                    else:
                        try:
                            rec.update(measure_case(case, b, s))
                        except Exception as e:  # noqa: BLE001
                            rec.update(error=f"{type(e).__name__}: {e}", variants={}, check=None, ratio=None)
                    results.append(rec)
                    del case
            except Exception as e:  # noqa: BLE001 - a benchmark failing to set up is a row, not a crash
                results.append({**base, "case": f"{bm.name}: setup failed", "key": f"{bm.name}: setup failed",
                                "group": None, "devices": [], "params": {}, "bytes": None,
                                "busbw_factor": None, "variants": {}, "check": None, "ratio": None,
                                "error": f"{type(e).__name__}: {e}",
                                "traceback": traceback.format_exc(limit=4)})
            gc.collect()
            if nat is not None and bm.precision and mode != modes[0]:
                nat.set_precision(modes[0])
            if progress is not None:
                progress.advance(task)
    finally:
        if progress is not None:
            progress.stop()
        for (n, b, nat, devs) in ready:
            if nat is not None:
                nat.restore_precision(saved_precision.get(n))
        gc.unfreeze()
    load_after = _loadavg()
    run_info = {"command": ["multidev", "bench"] + list(getattr(args, "argv", []) or []),
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "machine": _machine(), "git": _git(), "env": _env_flags(), "env_set_by_bench": env_set,
                "settings": {**s.as_dict(), "precision": args.precision, "suites": suites,
                             "devices": _split(args.device), "max_time_s": max_time,
                             "wall_s": round(time.perf_counter() - t_start, 1)},
                "timer_floor_s": floor, "loadavg_before": load_before, "loadavg_after": load_after,
                "backends": backends_info}
    for r in results:
        r["run"] = 0
    return {"schema": SCHEMA, "created": run_info["created"], "runs": [run_info], "results": results}


def merge(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report from several (one per backend, venv or machine): runs listed, results re-indexed."""
    runs: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for doc in docs:
        if doc.get("schema") != SCHEMA:
            raise SystemExit(f"multidev bench: not a {SCHEMA} file (schema {doc.get('schema')!r})")
        off = len(runs)
        runs.extend(doc["runs"])
        for r in doc["results"]:
            results.append({**r, "run": r.get("run", 0) + off})
    created = max((r["created"] for r in runs), default="")
    return {"schema": SCHEMA, "created": created, "runs": runs, "results": results}


# -- report --------------------------------------------------------------------------------------
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
    for name in sorted(rec["variants"], key=_vkey):
        v = rec["variants"][name]
        if v is None:
            continue
        if "median_s" not in v:
            lines.append((f"{_SHORT.get(name, name)}: {v.get('error', 'no samples')[:50]}", "red"))
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
        lines.append((f"{_SHORT.get(name, name)} {fmt_time(v['median_s'])} ±{iqr:.0f}%{extra}", ""))
    if rec.get("ratio"):
        a, b = rec["ratio"]["of"]
        lines.append((f"×{rec['ratio']['value']:.2f} {_SHORT.get(a, a)}/{_SHORT.get(b, b)}", "bold"))
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
            return f"{_SHORT['md']} {fmt_time(_med(r, 'md'))} / {fmt_time(_med(r, 'native'))} = **×{r['ratio']['value']:.2f}**"
        return f

    def timed(group: str, variants: Sequence[str], pr: str | None = p0) -> Any:
        def f(b: str) -> str:
            r = _first(doc, b, lambda r: r.get("group") == group and r.get("precision") in (pr, None))
            if r is None:
                return ""
            parts = [f"{_SHORT.get(v, v)} {fmt_time(_med(r, v))}" for v in variants if _med(r, v) is not None]
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
        rows.append((f"autoparallel: copy results to host [{pr}]", timed("copy to host", ("md", "native"), pr), "2.49 s"))
        rows.append((f"autoparallel: run + overlapped copy [{pr}]", timed("run + overlapped copy", ("md", "native"), pr),
                     "1.92 s"))
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
    from .benchmarks import fmt_bytes

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


def goals(doc: dict[str, Any]) -> list[str]:
    """The issue's goals as measured ratios. P1: md's no-op ``to`` at most 1.5x torch's ``.to``, and
    at least 20x faster than ``jax.device_put`` (elsewhere: reported); P2: ``synchronize`` at most
    1.2x the native wait."""
    out = []
    for r in doc["results"]:
        if r["suite"] != "overhead" or not r.get("ratio"):
            continue
        v = r["ratio"]["value"]
        fw = doc["runs"][r["run"]]["backends"].get(r["backend"], {}).get("framework", r["backend"])
        verdict = ""
        if r.get("group") == "to no-op":
            goal = {"torch": 1.5, "jax": 1 / 20}.get(fw)
            if goal is not None:
                verdict = f"goal <= {goal:.3g}: {'met' if v <= goal else 'MISSED'}"
            out.append(f"P1 {r['backend']:10s} {r['case']}: md/native = {v:.3g}"
                       + (f" (md {1 / v:.0f}x faster)" if v < 1 else "") + (f"; {verdict}" if verdict else ""))
        elif r.get("group") in ("synchronize(device)", "synchronize(device, backend)"):
            verdict = f"goal <= 1.2: {'met' if v <= 1.2 else 'MISSED'}"
            out.append(f"P2 {r['backend']:10s} {r['case']}: md/native = {v:.3g}; {verdict}")
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
                arows.append({**r, "key": f"{_SHORT.get(v, v)}", "_m": m})
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
                    lab = f"{r['backend']} {r['params'].get('algorithm', r['benchmark'])}" + (" native" if v == "native" else "") + f" n={nmax}"
                    series.setdefault(lab, []).append((r["bytes"], x["busbw_GBps"]))
        for lab, pts in series.items():
            pts.sort()
            a.plot(*zip(*pts), "-o", ms=3, color=colors[lab.split()[0]], label=lab,
                   alpha=0.5 + 0.5 * ("native" in lab))
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_title("allreduce busbw per algorithm" if op == "allreduce" else "broadcast / allgather / reduce_scatter busbw")
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


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``multidev bench`` (cli.py passes its parsed namespace)."""
    from rich.console import Console

    console = Console()
    if getattr(args, "list", False):
        from multidev import benchmarks as mb

        for bm in mb.load_all(args.bench_file):
            console.print(f"{bm.suite:13s} {bm.name:20s} {'(per precision) ' if bm.precision else ''}{bm.doc}")
        return 0
    if args.report:
        docs = []
        for path in args.report:
            with open(path) as f:
                docs.append(json.load(f))
        doc = merge(docs)
    else:
        if not hasattr(args, "argv"):
            args.argv = sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "bench" else []
        doc = run(args, console)
    render(doc, console)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=_json_default)
        console.print(f"wrote {args.json}")
    if getattr(args, "markdown", None):
        with open(args.markdown, "w") as f:
            f.write(markdown(doc))
        console.print(f"wrote {args.markdown}")
    if args.plot:
        try:
            plot(doc, args.plot)
            console.print(f"wrote {args.plot}")
        except ImportError:
            console.print("[yellow]--plot needs matplotlib: pip install \"multidev[bench]\"[/yellow]")
            return 1
    bad = [r for r in doc["results"] if (r.get("check") and not r["check"]["ok"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(build_parser().parse_args()))
