"""`multidev bench` end to end: a tiny run of every suite on NumPy and every installed framework,
through the CLI in a subprocess (frameworks stay out of this test process). Checks the JSON schema
and the correctness flags; no timing thresholds."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from multidev.benchmarks import report as bench
from multidev.benchmarks import runner

FRAMEWORKS = {"torch": "torch", "jax": "jax", "tensorflow": "tensorflow", "mxnet": "mxnet"}
FAST = ["--quick", "--reps", "3", "--budget", "0.05", "--no-progress"]


def installed() -> list[str]:
    """numpy plus every framework whose package and adapter module are both importable."""
    out = ["numpy"]
    for name, mod in FRAMEWORKS.items():
        if importlib.util.find_spec(mod) is None:
            continue
        try:
            if importlib.util.find_spec(f"multidev.adapters.{name}") is None:
                continue
        except ImportError:
            continue
        out.append(name)
    return out


def cli(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env_cmd = [sys.executable, "-m", "multidev.cli", "bench", *argv]
    return subprocess.run(env_cmd, capture_output=True, text=True, timeout=timeout,
                          env={**__import__("os").environ, "COLUMNS": "200", "TF_CPP_MIN_LOG_LEVEL": "2"})


def check_schema(doc: dict[str, Any]) -> None:
    assert doc["schema"] == bench.SCHEMA
    assert isinstance(doc["created"], str) and doc["runs"] and isinstance(doc["results"], list)
    for run in doc["runs"]:
        for k in ("command", "created", "machine", "env", "settings", "timer_floor_s", "backends"):
            assert k in run, k
        for k in ("cpu", "cpu_count", "python", "numpy", "multidev"):
            assert k in run["machine"], k
        assert run["settings"]["precision"] in bench.PRECISIONS
        for name, info in run["backends"].items():
            if "error" in info:
                continue
            for k in ("version", "framework", "devices", "capabilities", "device_names", "precision"):
                assert k in info, (name, k)
    for r in doc["results"]:
        for k in ("suite", "benchmark", "case", "key", "backend", "precision", "devices", "params",
                  "variants", "check", "ratio", "run"):
            assert k in r, (r.get("case"), k)
        assert 0 <= r["run"] < len(doc["runs"])
        if r.get("skipped") or r.get("error"):
            continue
        assert isinstance(r["check"], dict) and isinstance(r["check"]["ok"], bool), r["case"]
        timed = [v for v in r["variants"].values() if v is not None]
        assert timed, r["case"]
        for v in timed:
            assert "error" not in v, (r["backend"], r["case"], v.get("error"))
            for k in ("median_s", "q1_s", "q3_s", "iqr_s", "n", "inner", "first_call_s", "samples_s", "label"):
                assert k in v, (r["case"], k)
            assert len(v["samples_s"]) == v["n"] >= 1
            assert all(isinstance(x, float) and x >= 0 for x in v["samples_s"])
            assert v["q1_s"] <= v["median_s"] <= v["q3_s"]
            if r.get("bytes"):
                assert v["GBps"] > 0
            if r.get("busbw_factor") is not None:
                assert "busbw_GBps" in v and "algbw_GBps" in v
        if r["ratio"] is not None:
            a, b = r["ratio"]["of"]
            assert r["ratio"]["value"] == pytest.approx(r["variants"][a]["median_s"] / r["variants"][b]["median_s"])


@pytest.fixture(scope="module")
def run_all(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path, list[str]]:
    out = tmp_path_factory.mktemp("bench")
    names = installed()
    argv = ["--backend", ",".join(names), "--json", str(out / "r.json"), "--markdown", str(out / "r.md"), *FAST]
    if importlib.util.find_spec("matplotlib") is not None:
        argv += ["--plot", str(out / "r.png")]
    return cli(*argv), out, names


def test_every_suite_runs_and_checks_pass(run_all: Any) -> None:
    proc, out, names = run_all
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((out / "r.json").read_text())
    check_schema(doc)
    failed = [(r["backend"], r["case"], r["check"]["detail"]) for r in doc["results"]
              if r.get("check") and not r["check"]["ok"]]
    assert not failed
    errors = [(r["backend"], r["case"], r["error"]) for r in doc["results"] if r.get("error")]
    assert not errors
    for name in names:
        assert "error" not in doc["runs"][0]["backends"][name], doc["runs"][0]["backends"][name]
        suites = {r["suite"] for r in doc["results"] if r["backend"] == name}
        assert suites == set(bench.SUITE_NAMES), (name, suites)
        # P1's row exists with a native baseline for every backend
        p1 = [r for r in doc["results"] if r["backend"] == name and r.get("group") == "to no-op"]
        assert p1 and all(r["ratio"] is not None for r in p1), name
    assert "multidev bench: overhead" in proc.stdout
    assert "correctness checks" in proc.stdout
    md = (out / "r.md").read_text()
    assert "### overhead" in md and "| case |" in md
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "r.png").stat().st_size > 10_000


def test_report_merges_runs(run_all: Any, tmp_path: Path) -> None:
    proc, out, _ = run_all
    assert proc.returncode == 0
    merged = tmp_path / "m.json"
    p = cli("--report", str(out / "r.json"), str(out / "r.json"), "--json", str(merged), "--no-progress")
    assert p.returncode == 0, p.stderr[-3000:]
    one = json.loads((out / "r.json").read_text())
    doc = json.loads(merged.read_text())
    check_schema(doc)
    assert len(doc["runs"]) == 2 and len(doc["results"]) == 2 * len(one["results"])
    assert {r["run"] for r in doc["results"]} == {0, 1}


def test_adding_a_benchmark_is_one_function(tmp_path: Path) -> None:
    f = tmp_path / "mine.py"
    f.write_text(textwrap.dedent('''
        import numpy as np
        import multidev as md
        from multidev.benchmarks import Case, Variant, benchmark, close

        @benchmark("custom")
        def ones_then_numpy(ctx):
            """md.ones then md.to_numpy."""
            x = md.ones((8,), device=ctx.dev, backend=ctx.backend)
            yield Case("to_numpy(8 ones)", {"md": Variant(md.to_numpy, (x,)),
                                             "native": ctx.native_call("d2h", x)},
                       devices=[ctx.dev], check=lambda: close(x, np.ones(8)))
    '''))
    out = tmp_path / "c.json"
    p = cli("--backend", "numpy", "--suite", "custom", "--bench-file", str(f), "--json", str(out), *FAST)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(out.read_text())
    check_schema(doc)
    (r,) = doc["results"]
    assert r["suite"] == "custom" and r["check"]["ok"] and r["ratio"] is not None


def test_list_and_unknown_suite() -> None:
    p = cli("--list")
    assert p.returncode == 0
    for s in bench.SUITE_NAMES:
        assert s in p.stdout
    p = cli("--backend", "numpy", "--suite", "nope", *FAST)
    assert p.returncode != 0 and "unknown suite" in (p.stdout + p.stderr)


def test_stats_and_merge_are_plain_functions() -> None:
    st = runner._stats([1.0, 2.0, 3.0, 4.0, 100.0])
    assert st["median_s"] == 3.0 and st["q1_s"] == 2.0 and st["q3_s"] == 4.0 and st["n"] == 5
    with pytest.raises(runner.UsageError):
        runner.merge([{"schema": "something else"}])


GOAL_FILE = '''
import numpy as np
import multidev as md
from multidev.benchmarks import Case, Goal, Variant, benchmark, close

@benchmark("custom", goals=[Goal("always met", "copy", 1e9), Goal("never met", "copy", 1e-9)])
def copies(ctx):
    """md.copy against np.array."""
    x = md.ones((8,), device=ctx.dev, backend=ctx.backend)
    yield Case("copy(8 ones)", {"md": Variant(md.copy, (x,)), "native": ctx.native_call("copy", x, ctx.dev)},
               devices=[ctx.dev], check=lambda: close(md.copy(x), np.ones(8)), group="copy")
'''


def test_goals_are_data_and_check_fails_on_a_missed_goal(tmp_path: Path) -> None:
    f = tmp_path / "goals.py"
    f.write_text(GOAL_FILE)
    out = tmp_path / "g.json"
    args = ("--backend", "numpy", "--suite", "custom", "--bench-file", str(f), "--json", str(out), *FAST)
    p = cli(*args)
    assert p.returncode == 0, p.stderr[-3000:]  # without --check, a missed goal is reported only
    doc = json.loads(out.read_text())
    verdicts = {g["goal"]: g["met"] for g in doc["goals"]}
    assert verdicts == {"always met": True, "never met": False}
    assert "MISSED never met" in p.stdout and "met    always met" in p.stdout
    p = cli(*args, "--check")
    assert p.returncode == 3 and "never met" in p.stderr, (p.returncode, p.stderr[-2000:])


@pytest.mark.parametrize("argv,needle", [
    (["--backend", "nosuch"], "--backend nosuch"),
    (["--backend", "numpy", "--device", "banana"], "--device"),
    (["--backend", "numpy", "--device", "gpu:0"], "numpy has no gpu:0"),
    (["--backend", "numpy", "--device", "cpu:0,gpu:0"], "numpy has no gpu:0"),
    (["--backend", "numpy", "--suite", "nope"], "unknown suite"),
    (["--backend", "numpy", "--reps", "0"], "--reps"),
    (["--report", "/no/such/file.json"], "--report"),
])
def test_bad_flags_give_one_line_and_a_nonzero_exit(argv: list[str], needle: str) -> None:
    p = cli(*argv, "--no-progress")
    assert p.returncode == 2, (p.returncode, p.stdout[-1000:], p.stderr[-1000:])
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_h2d_breakdown_times_every_layer_against_the_native_upload(tmp_path: Path) -> None:
    """The small-upload breakdown (benchmarks/h2d_breakdown.py, run on a GPU by gpu_final.sh) on
    NumPy's cpu:1: md, the adapter alone, md.to and the baseline's upload, each a row."""
    out = tmp_path / "b.json"
    p = subprocess.run([sys.executable, "-m", "multidev.benchmarks.h2d_breakdown", "--backend", "numpy",
                        "--device", "cpu:1", "--sizes", "1", "--rounds", "4", "--out", str(out)],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "MULTIDEV_NUMPY_DEVICES": "2"})
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["rows"]
    names = [r["variant"] for r in rows]
    assert names[:3] == ["md.asarray(a, device=d)", "adapter asarray(a, 'float32', d)", "md.to(x_cpu, d)"]
    assert any(n.startswith("native ") for n in names), names
    assert all(r["median_us"] > 0 and r["rounds"] == 4 for r in rows)
    no_gpu = subprocess.run([sys.executable, "-m", "multidev.benchmarks.h2d_breakdown", "--backend", "numpy"],
                            capture_output=True, text=True, timeout=120)
    assert no_gpu.returncode == 2 and "has no GPU here" in no_gpu.stdout


def test_the_gpu_probes_run_as_dry_runs_on_a_cpu(tmp_path: Path) -> None:
    """call_profile.py and jax_upload_tuning.py (run on the H200 by gpu_final.sh / gpu_probe.sh)
    work where there is no GPU: on cpu:0, each row md against native, every variant exact."""
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    out = tmp_path / "p.json"
    p = subprocess.run([sys.executable, "-m", "multidev.benchmarks.baselines.call_profile", "--cpu", "--rounds", "2",
                        "--rows", "convert,sync", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["row"] for r in rows} == {"convert torch->jax 1 MiB [cpu:0]", "convert torch->jax 64 MiB [cpu:0]",
                                        "jax synchronize(x) [cpu:0]"}, rows
    assert all(r["md_s"] > 0 and r["native_s"] > 0 and "function calls" in r["profile"] for r in rows)
    out = tmp_path / "u.json"
    p = subprocess.run([sys.executable, "-m", "multidev.benchmarks.baselines.jax_upload_tuning", "--platform", "cpu",
                        "--mib", "1", "--reps", "1", "--threads", "2", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r.get("exact") for r in rows), rows
