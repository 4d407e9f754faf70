"""Every engine's ``distributed`` bench suite at 2 and 4 processes on this machine, with the hang
detection's time-to-error, into one report (JSON and a markdown table)::

    python -m multidev.benchmarks.distributed_run --out benchmarks/results/distributed-cpu-2026-12-01

For each installed engine and each process count it launches (``python -m multidev.distributed.launch``:
``mpiexec`` for mpi, JAX's variables for jax, torchrun's for torch) ``multidev.benchmarks.runner
--suite distributed`` with the engine's own tensors (torch: torch, mpi: numpy, jax: jax), then
``--faults`` launches of :mod:`multidev.benchmarks.distributed_faults` (a rank that never joins; the
time the others take to raise, against the timeout). The rows are merged into one document, the
suite's goals judged on it (``multidev bench --report OUT.json --check`` judges them again), and
the table written beside it: busbw of multidev (checks off, and the same call checked, sampled
alternately with it) and of the engine's own call, their ratio, the check's cost per call, and the
time-to-error.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The backend whose tensors each engine's rows use: the engine's own transport.
_TENSORS_OF = "tensors"


def _launch(engine: str, n: int, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "multidev.distributed.launch", "-n", str(n), "--engine", engine, "--grace", "20",
           *args]
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3", MULTIDEV_JAX_CPU_DEVICES="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _fault_rows(engine: str, n: int, runs: int, timeout: float, run_index: int) -> list[dict[str, Any]]:
    """``runs`` launches of the fault script: one ``dist hang`` record of the waiting ranks' times."""
    samples, named, typed, transport = [], [], [], ""
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            _launch(engine, n, ["-m", "multidev.benchmarks.distributed_faults", "--timeout", str(timeout),
                                "--out", tmp], timeout=120 + 10 * timeout)
            for f in sorted(Path(tmp).glob("rank*.json")):
                rec = json.loads(f.read_text())
                samples.append(rec["time_to_error_s"])
                named.append(rec["names_missing_rank"])
                typed.append(rec["typed"])
                transport = rec["transport"]
    if not samples:
        return []
    import numpy as np

    a = np.asarray(samples)
    med = float(np.median(a))
    return [{"suite": "distributed", "benchmark": "dist_allreduce", "backend": engine, "precision": None,
             "case": f"dist hang {engine} {n} processes", "key": f"dist hang {n} processes", "group": "dist hang",
             "devices": ["cpu:0"], "run": run_index,
             "params": {"engine": engine, "transport": transport, "processes": n, "timeout_s": timeout,
                        "launches": runs, "every_error_typed": all(typed), "every_error_names_the_rank": all(named)},
             "bytes": None, "busbw_factor": None, "check": {"ok": all(typed) and all(named), "detail": ""},
             "variants": {"time_to_error": {"median_s": med, "min_s": float(a.min()), "max_s": float(a.max()),
                                            "n": int(a.size), "samples_s": samples,
                                            "label": "a waiting rank's allreduce until DistributedTimeoutError"},
                          "timeout": {"median_s": timeout, "label": "the group's timeout"}},
             "ratio": {"of": ["time_to_error", "timeout"], "value": med / timeout}}]


def _table(doc: dict[str, Any]) -> str:
    rows = ["| engine | processes | size | md busbw GB/s (checks off) | engine's own call GB/s | ratio | md out of "
            "place | md, checks on | check's cost per call | md over the floor (MPI: Iallreduce + Test loop; "
            "torch: async_op + wait(timeout); JAX: the global array made per call) |",
            "|" + " --- |" * 10]
    by: dict[tuple, dict[str, Any]] = {}
    for r in doc["results"]:
        if r.get("group") == "dist allreduce" and r.get("variants"):
            p = r["params"]
            by[(p["engine"], p["processes"], p["size"])] = r["variants"]
    from .suite import fmt_bytes

    for (engine, n, size), off in sorted(by.items()):
        def bw(x: dict[str, Any] | None) -> float | None:
            return None if not x else x.get("busbw_GBps")

        md_off, nat, md_on = bw(off.get("md")), bw(off.get("native")), bw(off.get("md_checked"))
        oop = bw(off.get("md_out_of_place"))
        cost = None
        if (off.get("md_checked") or {}).get("median_s") and (off.get("md") or {}).get("median_s"):
            cost = (off["md_checked"]["median_s"] - off["md"]["median_s"]) * 1e6
        fmt = lambda x: "-" if x is None else f"{x:.3g}"
        ratio = "-" if md_off is None or not nat else f"{md_off / nat:.2f}x"
        floor = off.get("floor") or {}
        over = "-" if not floor.get("median_s") or not (off.get("md") or {}).get("median_s") else (
            f"{(off['md']['median_s'] - floor['median_s']) * 1e6:+.0f} µs ({floor['median_s'] * 1e6:.0f} µs floor)")
        rows.append(f"| {engine} | {n} | {fmt_bytes(size)} | {fmt(md_off)} | {fmt(nat)} | {ratio} | {fmt(oop)} | "
                    f"{fmt(md_on)} | "
                    + ("-" if cost is None else f"{cost:+.0f} µs") + f" | {over} |")
    rows += ["", "| engine | processes | timeout | time-to-error (median, min-max of the waiting ranks) | ratio | "
             "typed, naming the rank |", "| --- | --- | --- | --- | --- | --- |"]
    for r in doc["results"]:
        if r.get("group") == "dist hang":
            t = r["variants"]["time_to_error"]
            p = r["params"]
            rows.append(f"| {p['engine']} | {p['processes']} | {p['timeout_s']:g} s | {t['median_s']:.2f} s "
                        f"({t['min_s']:.2f}-{t['max_s']:.2f}, {t['n']} samples) | {r['ratio']['value']:.2f}x | "
                        f"{'yes' if r['check']['ok'] else 'NO'} |")
    rows += ["", "| goal | engine | case | value | target | |", "| --- | --- | --- | --- | --- | --- |"]
    for g in doc.get("goals", []):
        verdict = ("UNSTABLE: " + "; ".join(g["unstable"]) + " (not judged)" if g.get("unstable")
                   else "met" if g["met"] else "**MISSED**")
        rows.append(f"| {g['goal']} | {g['backend']} | {g['case']} | {g['value']:.3g} | {g['rule']} | {verdict} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m multidev.benchmarks.distributed_run",
                                description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", required=True, help="output path without suffix (writes OUT.json and OUT.md)")
    p.add_argument("--engines", help="comma-separated (default: every installed engine)")
    p.add_argument("--processes", default="2,4", help="process counts (default 2,4)")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few samples (a smoke run)")
    p.add_argument("--reps", type=int, default=10, help="samples per variant (default 10)")
    p.add_argument("--faults", type=int, default=3, help="launches of the fault script per engine and size")
    p.add_argument("--fault-timeout", type=float, default=2.0, help="the fault runs' timeout (default 2 s)")
    a = p.parse_args(argv)
    from multidev.distributed.engine import engine_class, engine_names

    from .report import evaluate_goals
    from .runner import merge
    from .suite import load_all

    engines = [e for e in (a.engines.split(",") if a.engines else engine_names()) if e]
    engines = [e for e in engines if engine_class(e).missing() is None]
    docs, faults = [], []
    for engine in engines:
        tensors = getattr(engine_class(engine), _TENSORS_OF)
        for n in (int(v) for v in a.processes.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "part.json"
                args = ["-m", "multidev.benchmarks.runner", "--suite", "distributed", "--backend", tensors,
                        "--reps", str(a.reps), "--json", str(out), "--no-progress"] + (["--quick"] if a.quick else [])
                t0 = time.perf_counter()
                proc = _launch(engine, n, args, timeout=3600)
                print(f"{engine} x{n}: exit {proc.returncode} in {time.perf_counter() - t0:.0f} s", flush=True)
                if proc.returncode != 0 or not out.exists():
                    print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
                    continue
                docs.append(json.loads(out.read_text()))
            faults += [(engine, n)]
    doc = merge(docs) if docs else {"schema": None, "runs": [], "results": []}
    for engine, n in faults:
        doc["results"] += _fault_rows(engine, n, 1 if a.quick else a.faults, a.fault_timeout,
                                      next((i for i, r in enumerate(doc["runs"])), 0))
    load_all()
    given = argv if argv is not None else sys.argv[1:]
    doc["command"] = "python -m multidev.benchmarks.distributed_run " + " ".join(given)
    doc["goals"] = evaluate_goals(doc)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{a.out}.json").write_text(json.dumps(doc, indent=1, default=str))
    table = _table(doc)
    Path(f"{a.out}.md").write_text(f"# multidev.distributed, every engine on this machine\n\n`{doc['command']}`\n\n"
                                   + table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
