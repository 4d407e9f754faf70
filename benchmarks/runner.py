"""The runner of ``multidev bench``, one for every suite: every row measured through multidev and
through the framework's own call, in the same run, side by side per backend.

Method (applies to every figure):

- warm-up: the first call is timed alone (``first_call_s``: compilation, allocator growth) and kept
  apart from the statistics; then ``warmup`` more calls;
- every device a case involves is synchronized before the clock starts and before it stops
  (except rows that measure dispatch on purpose, which say so);
- fast calls are batched (``inner`` calls per sample, ~1 ms a sample, as many in every variant of a
  row) and the per-call time is reported; variants of a row are sampled alternately, so drift hits
  them alike;
- at least ``--reps`` samples (20), or until the ``--budget`` per variant is spent (3 at least);
  median and IQR (q1, q3); raw samples kept in the JSON;
- one untimed correctness check per row against NumPy;
- versions, device names, precision flags and environment variables recorded in the JSON;
- f32 matmul precision set explicitly and labelled (``--precision fp32|tf32|both|default``).

Benchmark definitions live in :mod:`multidev.benchmarks` (one function each, with its goals); the
native baselines beside the adapters; tables, plots and goal checks in :mod:`.report`. Under a
launcher of several processes (torchrun, mpiexec, srun, JAX's variables: ``distributed.launched()``)
the ``distributed`` suite runs across the processes and rank 0 reports.
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
from collections.abc import Sequence
from typing import Any

import numpy as np

from multidev import __version__

from . import report
from .report import PRECISIONS, SCHEMA, SUITE_NAMES, vkey

MiB_ = 1 << 20

#: Environment variables recorded in a run's JSON, beside every MULTIDEV_* variable and the ones
#: each loaded baseline names (``Native.env_vars``): those that change what is measured. Nothing else
#: is recorded (other tools' variables may hold secrets).
ENV_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS", "NVIDIA_TF32_OVERRIDE",
            "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
            "KMP_AFFINITY", "NCCL_DEBUG", "NCCL_NVLS_ENABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
            "NCCL_ALGO", "NCCL_PROTO", "CUBLAS_WORKSPACE_CONFIG", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE",
            "RANK", "LOCAL_RANK")


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
    p.add_argument("--sample-time", type=float, metavar="MS",
                   help="batch a variant's calls up to MS milliseconds a sample (default 1; quick 0.2; at most "
                        "10,000 calls; not for variants timing themselves or sampled one call at a time, nor "
                        "under a launcher): longer samples average out a noisy machine's jitter")
    p.add_argument("--max-time", type=float, metavar="S",
                   help="stop starting new rows after S seconds (the rest are marked skipped; the "
                        "JSON is still written): for fixed-length slots such as a lent GPU")
    p.add_argument("--max-bytes", metavar="SIZE",
                   help="cap the size sweeps (bandwidth, collectives) at SIZE, e.g. 64MiB; the collectives "
                        "sweep goes from 4 KiB up to it in steps of 4 (without it: the suite's own sizes)")
    p.add_argument("--cpu-devices", type=int, default=2,
                   help="virtual CPU devices for JAX/TF/MXNet/NumPy when not set in the environment "
                        "(MULTIDEV_*_CPU_DEVICES); default 2")
    p.add_argument("--report", nargs="+", metavar="JSON",
                   help="run nothing: merge these result files (e.g. one per backend or venv) into "
                        "one table, --json and --plot")
    p.add_argument("--bench-file", action="append", default=[], metavar="PY",
                   help="extra benchmark definitions to load (a Python file using multidev.benchmarks)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and their goals, and exit")
    p.add_argument("--check", action="store_true",
                   help="exit with status 3 when a goal row is missed (goals are data of the suites)")
    p.add_argument("--stability", choices=("strict", "warn"),
                   help="a row whose figures the bench cannot stand behind (its alternating samples' "
                        "md/native ratio or a variant spreading, a CPU row off the CPU, the machine "
                        "overloaded) is marked UNSTABLE: strict (default; warn under --quick) leaves its "
                        "goals unjudged and --check fails on them, warn judges them with the mark")
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
        # batch fast calls up to this much per sample
        self.target_sample = args.sample_time / 1e3 if getattr(args, "sample_time", None) else (2e-4 if q else 1e-3)
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

    def __init__(self, name: str, v: Any, sync: Any, s: Settings, before: Any = None) -> None:
        self.name, self.v, self.sync, self.s, self.before = name, v, sync, s, before
        self.samples: list[float] = []
        self.cpu: list[float] = []  # the process's CPU time of each sample, per call (all threads)
        self.last_cpu = math.nan
        self.spent = 0.0
        self.inner = 1
        self.first = math.nan
        self.one = math.nan  # one call's time, the last warm-up's
        self.error: str | None = None
        self.stopped_by = ""

    def _once(self, inner: int) -> float:
        f, a, v = self.v.fn, self.v.args, self.v
        if v.self_timed:
            return float(f(*a))
        self.sync()
        if self.before is not None:
            self.before()
        c0 = time.process_time()
        t0 = time.perf_counter()
        r = None
        for _ in range(inner):
            r = f(*a)
        if v.finish is not None:
            v.finish(r)
        if v.sync:
            self.sync()
        t1 = time.perf_counter()
        self.last_cpu = time.process_time() - c0
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
            self.one = one
            if self.v.inner or self.v.self_timed:
                self.inner = int(self.v.inner or 1)
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
        self.cpu.append(self.last_cpu / self.inner)
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
            if len(self.cpu) == len(self.samples) and not any(math.isnan(c) for c in self.cpu):
                # CPU time over wall time: below 1 on a one-thread row, the process waited off the
                # CPU (other processes ran); report.stability reads it
                out["cpu_s"] = self.cpu
                out["cpu_share"] = sum(self.cpu) / max(sum(self.samples), 1e-12)
        return out


def _same_inner(timed: list[_Timed], s: Settings) -> None:
    """Every variant of a case timed over as many calls a sample: the most any of them wants, as far as
    a sample stays within 20 target samples. A sample's fixed part (the synchronization around it, the
    wait for an asynchronous call's last copy) is then spread over as many calls in each variant, and
    their ratio compares the calls (JAX's LeNet move on the VM: md.to timed one call a sample against
    ``device_put`` five read 1.88x). Variants with an ``inner`` of their own, self-timed ones, those
    with a ``finish`` (run once a sample: a time-to-result row, which more calls a sample would turn
    into throughput) and those that stop the clock before waiting (dispatch rows, whose one call's time
    says nothing of the work they queue) keep theirs."""
    auto = [t for t in timed if t.error is None and not t.v.inner and not t.v.self_timed and t.v.finish is None
            and t.v.sync]
    if len(auto) < 2:
        return
    most = max(t.inner for t in auto)
    for t in auto:
        if t.inner < most and t.one > 0:
            t.inner = max(t.inner, min(most, math.ceil(20 * s.target_sample / t.one)))


def _drain(r: Any) -> None:
    """Wait for a result before the next sample (rows that stop the clock before waiting)."""
    import multidev as md

    items = r if isinstance(r, (list, tuple)) else [r]
    for t in items:
        try:
            md.synchronize(t)
        except Exception:  # noqa: BLE001 - not a tensor
            pass


def parse_size(text: str) -> int:
    """``"64MiB"``, ``"4 KiB"``, ``"1GiB"`` or a number of bytes as bytes."""
    t = str(text).strip().replace(" ", "")
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1)):
        if t.endswith(unit) and t[:-len(unit)].isdigit():
            return int(t[:-len(unit)]) * f
    if t.isdigit():
        return int(t)
    raise UsageError(f"--max-bytes: {text!r} is no size (such as 64MiB, 4KiB or 1048576)")


def _bound(case: Any, bounds: dict[str, Any], rec_variants: dict[str, Any]) -> dict[str, Any] | None:
    """The row's bound from the memcpy bandwidth measured in this run (``case.bound_copies``)."""
    from .bounds import memcpy_at

    if case.bound_copies is None:
        return None
    n = case.bound_bytes or case.bytes
    timed = (rec_variants.get("memcpy") or {}).get("median_s")
    # the better of the row's own memcpy (one thread, sampled beside the variants, under their load)
    # and the run's table (one thread and every core, at the start)
    row_bw = n / timed / 1e9 if timed and n else 0.0
    table_bw = (memcpy_at(bounds.get("memcpy"), n) if n else None) or 0.0
    bw = max(row_bw, table_bw)
    how = "the row's memcpy variant" if row_bw >= table_bw else "the run's memcpy table (every core)"
    if not bw:
        return None
    t = case.bound_copies * n / (bw * 1e9)
    out = {"time_s": t, "copies": case.bound_copies, "copy_bytes": n, "memcpy_GBps": bw,
           "what": f"{case.bound_copies:g} copies of {n} bytes at the memcpy bandwidth of {how}"}
    if case.bytes:
        out["GBps"] = case.bytes / t / 1e9
        if case.busbw_factor is not None:
            out["busbw_GBps"] = out["GBps"] * case.busbw_factor
    return out


def measure_case(case: Any, b: Any, s: Settings, bounds: dict[str, Any] | None = None) -> dict[str, Any]:
    """Warm up, check, then sample every variant of ``case`` alternately."""
    devs = list(case.devices)

    def sync() -> None:
        for d in devs:
            b.synchronize(d)

    rec: dict[str, Any] = {"check": None, "variants": {}}
    timed = [_Timed(k, v, sync, s, case.before) for k, v in sorted(case.variants.items(), key=lambda kv: vkey(kv[0]))
             if v is not None]
    for t in timed:
        t.warm()
    _same_inner(timed, s)
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
    bound = _bound(case, bounds or {}, rec["variants"])
    if bound is not None:
        rec["bound"] = bound
    r = case.ratio
    if r and all(rec["variants"].get(k) and "median_s" in rec["variants"][k] for k in r):
        rec["ratio"] = {"of": list(r), "value": rec["variants"][r[0]]["median_s"] / rec["variants"][r[1]]["median_s"]}
    else:
        rec["ratio"] = None
    return rec


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
class UsageError(Exception):
    """A bad ``multidev bench`` flag: reported as one line, exit status 2."""


def _setup_env(cpu_devices: int) -> dict[str, bool]:
    """Virtual CPU devices for the multi-device suites, through each adapter's own hook (values the
    user set are kept)."""
    from multidev.registry import configure_virtual_devices

    if cpu_devices < 1:
        raise UsageError(f"--cpu-devices must be at least 1, got {cpu_devices}")
    return configure_virtual_devices(cpu_devices)


def _cpu_mhz() -> float | None:
    """The mean current frequency of the CPUs in MHz (Linux: cpufreq, else /proc/cpuinfo), or None
    where unreadable (a VM often reports a constant)."""
    vals: list[float] = []
    try:
        base = "/sys/devices/system/cpu"
        for d in sorted(os.listdir(base)):
            f = os.path.join(base, d, "cpufreq", "scaling_cur_freq")
            if d.startswith("cpu") and os.path.exists(f):
                with open(f) as fh:
                    vals.append(int(fh.read().strip()) / 1000.0)
        if not vals:
            with open("/proc/cpuinfo") as fh:
                vals = [float(line.split(":")[1]) for line in fh if line.lower().startswith("cpu mhz")]
    except (OSError, ValueError, IndexError):
        return None
    return round(sum(vals) / len(vals), 1) if vals else None


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


def _env_flags(extra: Sequence[str] = ()) -> dict[str, str]:
    names = set(ENV_VARS) | set(extra)
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("MULTIDEV_") or k in names}


def _machine() -> dict[str, Any]:
    from .baseline import cpu_name

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
            # (the JSON keys of earlier result files; from the concern attributes since API 0.4)
            "dlpack": b.dlpack is not None, "native_collectives": ["allreduce"] if b.collectives is not None else [],
            "raises_on_mixed_devices": c.raises_on_mixed_devices}


# -- running -------------------------------------------------------------------------------------
def _split(s: str | None) -> list[str]:
    return [v.strip() for v in (s or "").split(",") if v.strip()]


def run(args: argparse.Namespace, console: Any = None) -> dict[str, Any]:
    """Run the selected suites on the selected backends; return the report (the JSON document)."""
    env_set = _setup_env(args.cpu_devices)
    import multidev as md
    from multidev.errors import BackendNotAvailableError, MultidevError

    from . import suite as mb
    from .baseline import native_for

    s = Settings(args)
    from multidev import distributed as mdist

    for flag in ("reps", "budget", "max_time", "sample_time"):
        v = getattr(args, flag, None)
        if v is not None and not 0 < v < math.inf:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive, got {v}")
    if mdist.is_initialized() or mdist.launched():  # torchrun, mpiexec, srun, JAX's variables
        if getattr(args, "sample_time", None) is not None:
            raise UsageError("--sample-time: under a launcher every sample is one call (every rank must make the "
                             "same calls), so it cannot apply")
        if not mdist.is_initialized():
            mdist.init(timeout=300)
        # Every rank must run the same collectives: a fixed number of samples, no time budget, one call
        # a sample (no per-rank calibration of the calls per sample: a rank batching more would hang).
        s.max_reps, s.budget, s.min_time, s.target_sample = s.min_reps, math.inf, 0.0, 0.0
        args.no_progress = args.no_progress or mdist.rank() != 0
    try:
        benches = mb.load_all(args.bench_file)
    except (ImportError, OSError) as e:
        raise UsageError(f"--bench-file: {e}") from e
    suites = _split(args.suite) or list(SUITE_NAMES)
    unknown = [x for x in suites if x not in {bm.suite for bm in benches}]
    if unknown:
        raise UsageError(f"unknown suite(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted({bm.suite for bm in benches}))}")
    benches = [bm for bm in benches if bm.suite in suites]
    modes = ["fp32", "tf32"] if args.precision == "both" else [args.precision]
    try:
        wanted = [md.device(x) for x in _split(args.device)]  # before any framework starts
    except MultidevError as e:
        raise UsageError(f"--device: {str(e).splitlines()[0]}") from None
    names = _split(args.backend) or md.backends()

    backends_info: dict[str, Any] = {}
    saved_precision: dict[str, Any] = {}
    ready: list[tuple[str, Any, Any, list[Any]]] = []
    loaded = []
    for n in names:
        try:
            loaded.append(md.backend(n))
        except BackendNotAvailableError as e:
            raise UsageError(f"--backend {n}: {str(e).splitlines()[0]}") from None
    for b in loaded:
        n = b.name
        devs = b.devices()
        missing = [str(d) for d in wanted if d not in devs]
        if missing:
            raise UsageError(f"--device: {n} has no {', '.join(missing)} here (it has "
                             f"{', '.join(map(str, devs))})")
        if wanted:
            devs = [d for d in devs if d in wanted]
        nat = native_for(b)
        if nat is not None:
            saved_precision[n] = nat.save_precision()
        info: dict[str, Any] = {"version": b.version(), "framework": b.framework, "devices": [str(d) for d in devs],
                "all_devices": [str(d) for d in b.devices()], "capabilities": _caps(b),
                "native_baseline": nat is not None, "device_names": {}, "precision": {},
                "goal_targets": dict(getattr(nat, "goal_targets", {}) or {})}
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
    max_bytes = parse_size(args.max_bytes) if getattr(args, "max_bytes", None) else None
    from .bounds import memcpy_bandwidth, memcpy_sizes

    # the host's memcpy bandwidth: the bound of every row that moves host memory, in this run
    bounds = {"memcpy": memcpy_bandwidth(memcpy_sizes(MiB_ if s.quick else max(max_bytes or 0, 256 * MiB_)),
                                         reps=3 if s.quick else 5)}
    gc.collect()
    gc.freeze()  # the frameworks' import-time objects: later collections need not walk them
    floor = timer_floor()
    load_before = _loadavg()
    mhz_before = _cpu_mhz()
    progress = None
    if not args.no_progress:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

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
            ctx = mb.Context(n, b, nat, list(devs), s.quick, mode, bounds=bounds, max_bytes=max_bytes)
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
                            rec.update(measure_case(case, b, s, bounds))
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
        for (n, _b, nat, _devs) in ready:
            if nat is not None:
                nat.restore_precision(saved_precision.get(n))
        gc.unfreeze()
    load_after = _loadavg()
    mhz_after = _cpu_mhz()
    run_info = {"command": ["multidev", "bench"] + list(getattr(args, "argv", []) or []),
                "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "machine": _machine(), "git": _git(),
                "env": _env_flags([v for (_, b, nat, _) in ready for v in
                                   ((getattr(nat, "env_vars", ()) or ()) + ((b.virtual_devices_env,)
                                    if getattr(b, "virtual_devices_env", None) else ()))]),
                "virtual_devices_configured": env_set,
                "settings": {**s.as_dict(), "precision": args.precision, "suites": suites,
                             "stability": getattr(args, "stability", None) or ("warn" if s.quick else "strict"),
                             "devices": _split(args.device), "max_time_s": max_time,
                             "wall_s": round(time.perf_counter() - t_start, 1)},
                "timer_floor_s": floor, "bounds": bounds, "loadavg_before": load_before, "loadavg_after": load_after,
                "cpu_MHz_before": mhz_before, "cpu_MHz_after": mhz_after,
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
            raise UsageError(f"--report: not a {SCHEMA} file (schema {doc.get('schema')!r})")
        off = len(runs)
        runs.extend(doc["runs"])
        for r in doc["results"]:
            results.append({**r, "run": r.get("run", 0) + off})
    created = max((r["created"] for r in runs), default="")
    return {"schema": SCHEMA, "created": created, "runs": runs, "results": results}


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def command(sub: Any) -> None:
    """Register ``multidev bench`` on the CLI's subparsers (the ``multidev.commands`` entry point)."""
    p = sub.add_parser("bench", help="compare frameworks side by side through multidev and natively")
    add_arguments(p)
    p.set_defaults(fn=main)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``multidev bench``: a one-line error and exit status 2 on a bad flag."""
    try:
        return _main(args)
    except UsageError as e:
        print(f"multidev bench: {e}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    if getattr(args, "list", False):
        from . import suite as mb

        for bm in mb.load_all(args.bench_file):
            console.print(f"{bm.suite:13s} {bm.name:20s} {'(per precision) ' if bm.precision else ''}{bm.doc}",
                          markup=False, highlight=False)
            for g in bm.goals:
                console.print(f"{'':13s}   goal: {g.name}: {g.describe()}" + (" (GPU rows)" if g.gpu_only else ""),
                              markup=False, highlight=False)
        return 0
    if args.report:
        docs = []
        for path in args.report:
            try:
                with open(path) as f:
                    docs.append(json.load(f))
            except (OSError, ValueError) as e:
                raise UsageError(f"--report {path}: {e}") from None
        doc = merge(docs)
        from . import suite as mb

        mb.load_all(args.bench_file)
        report.validate(doc)
        doc["goals"] = report.evaluate_goals(doc)
    else:
        if not hasattr(args, "argv"):
            args.argv = sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "bench" else []
        doc = run(args, console)
        report.validate(doc)
        doc["goals"] = report.evaluate_goals(doc)
    from multidev import distributed as mdist

    if mdist.is_initialized() and mdist.rank() != 0:
        mdist.shutdown()
        return 0  # rank 0 reports for every process
    report.render(doc, console)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=_json_default)
        console.print(f"wrote {args.json}")
    if getattr(args, "markdown", None):
        with open(args.markdown, "w") as f:
            f.write(report.markdown(doc))
        console.print(f"wrote {args.markdown}")
    if args.plot:
        try:
            report.plot(doc, args.plot)
            console.print(f"wrote {args.plot}")
        except ImportError:
            console.print("[yellow]--plot needs matplotlib: pip install \"multidev[bench]\"[/yellow]")
            return 1
    bad = [r for r in doc["results"] if (r.get("check") and not r["check"]["ok"])]
    if bad:
        return 1
    missed = [g for g in doc["goals"] if not g["met"] and "measured_met" not in g]
    unstable = [g for g in doc["goals"] if "measured_met" in g]
    invalid = report.invalid_rows(doc)
    if getattr(args, "check", False) and (missed or invalid or unstable):
        parts = []
        if unstable:
            parts.append(f"{len(unstable)} goal row(s) UNSTABLE, not judged (the run's figures spread; "
                         "re-run on a quieter machine or with --stability warn): "
                         + "; ".join(f"{g['goal']} ({g['backend']} {g['case']}: {g['unstable'][0]})"
                                     for g in unstable[:3]))
        if invalid:
            parts.append(f"{len(invalid)} row(s) physically impossible (above the bound measured in the same "
                         "run): " + "; ".join(invalid[:5]))
        if missed:
            parts.append(f"{len(missed)} goal row(s) missed: "
                         + "; ".join(f"{g['goal']} ({g['backend']} {g['case']}: {g['value']:.3g})" for g in missed[:5]))
        print("multidev bench --check: " + ". ".join(parts), file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":  # python -m multidev.benchmarks.runner ... (what torchrun launches)
    sys.exit(main(build_parser().parse_args()))
