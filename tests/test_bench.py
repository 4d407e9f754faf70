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
    (["--backend", "numpy", "--sample-time", "0"], "--sample-time"),
    (["--backend", "numpy", "--sample-time", "nan"], "--sample-time"),
    (["--report", "/no/such/file.json"], "--report"),
])
def test_bad_flags_give_one_line_and_a_nonzero_exit(argv: list[str], needle: str) -> None:
    p = cli(*argv, "--no-progress")
    assert p.returncode == 2, (p.returncode, p.stdout[-1000:], p.stderr[-1000:])
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr, p.stderr


def test_sample_time_under_a_launcher_is_refused_before_the_group_starts() -> None:
    """Under a launcher every sample is one call (every rank makes the same calls): ``--sample-time``
    cannot apply, and says so before the group is started (no peer is waited for)."""
    env = {**__import__("os").environ, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}
    p = subprocess.run([sys.executable, "-m", "multidev.cli", "bench", "--backend", "numpy", "--suite", "distributed",
                        "--sample-time", "5", "--no-progress"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and "--sample-time: under a launcher" in p.stderr, (p.returncode, p.stderr[-800:])


def test_h2d_breakdown_times_every_layer_against_the_native_upload(tmp_path: Path) -> None:
    """The small-upload breakdown (benchmarks/h2d_breakdown.py, run on a GPU by scripts/gpu/final.sh) on
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
    """call_profile.py and jax_upload_tuning.py (run on the H200 by scripts/gpu/final.sh / scripts/gpu/probe.sh)
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


def _doc_with(rows: list[dict[str, Any]], peak: float = 10.0) -> dict[str, Any]:
    """A one-run report holding ``rows``, whose run measured a host memcpy peak of ``peak`` GB/s."""
    run = {"command": ["multidev", "bench"], "created": "2026-12-02T00:00:00+00:00",
           "machine": {"cpu": "test", "cpu_count": 2, "memory_GiB": 1, "python": "3", "numpy": "2", "multidev": "0"},
           "git": None, "env": {}, "settings": {"precision": "fp32", "quick": True}, "timer_floor_s": 1e-8,
           "bounds": {"memcpy": {"peak_GBps": peak, "GBps": {"1048576": peak}}},
           "backends": {"numpy": {"version": "2", "framework": "numpy", "devices": ["cpu:0"], "capabilities": {},
                                  "device_names": {}, "precision": {}}}}
    return {"schema": bench.SCHEMA, "created": run["created"], "runs": [run], "results": rows}


def _row(case: str, gbps: dict[str, float], **params: Any) -> dict[str, Any]:
    n = 1 << 20
    variants = {k: {"label": k, "median_s": n / g / 1e9, "q1_s": n / g / 1e9, "q3_s": n / g / 1e9, "iqr_s": 0.0,
                    "n": 3, "inner": 1, "first_call_s": n / g / 1e9, "samples_s": [n / g / 1e9] * 3, "GBps": g}
                for k, g in gbps.items()}
    return {"suite": "bandwidth", "benchmark": "d2h", "case": case, "key": case, "group": "D2H", "backend": "numpy",
            "precision": None, "devices": ["cpu:0"], "params": params, "bytes": n, "busbw_factor": None,
            "variants": variants, "check": {"ok": True, "detail": ""}, "ratio": None, "run": 0}


def test_an_impossible_row_is_refused_in_the_table_the_json_and_by_check(tmp_path: Path) -> None:
    """A row above the bound its run measured (a baseline that read a cached value: 1000 GB/s beside a
    10 GB/s memcpy) is marked invalid in the JSON, the Markdown and the plot, and --check fails on
    it; a row that declares it may be a view is marked zero-copy instead, and does not fail."""
    doc = _doc_with([_row("D2H fake 1 MiB", {"md": 5.0, "native": 1000.0}),
                     _row("D2H view 1 MiB", {"md": 5000.0, "native": 4000.0}, zero_copy_possible=True)])
    src, out, md_out = tmp_path / "fake.json", tmp_path / "out.json", tmp_path / "out.md"
    src.write_text(json.dumps(doc))
    argv = ["--report", str(src), "--json", str(out), "--markdown", str(md_out), "--no-progress"]
    if importlib.util.find_spec("matplotlib") is not None:
        argv += ["--plot", str(tmp_path / "out.png")]
    p = cli(*argv)
    assert p.returncode == 0, p.stderr[-2000:]  # without --check: reported, not failed
    got = json.loads(out.read_text())
    bad, view = got["results"]
    assert bad["invalid"] == ["native"] and "did not do the work" in bad["variants"]["native"]["invalid"]
    assert "invalid" not in bad["variants"]["md"] and "invalid" not in view
    assert view["variants"]["md"]["zero_copy"] and view["variants"]["native"]["zero_copy"]
    text = md_out.read_text()
    assert "INVALID native" in text and "a view: no copy" in text
    assert "INVALID numpy D2H fake 1 MiB: native" in p.stdout
    p = cli(*argv, "--check")
    assert p.returncode == 3 and "physically impossible" in p.stderr and "D2H fake 1 MiB" in p.stderr, p.stderr
    doc["results"] = doc["results"][1:]  # the view alone: nothing to refuse
    src.write_text(json.dumps(doc))
    assert cli(*argv, "--check").returncode == 0


def test_thin_call_goals_take_a_ratio_or_an_absolute_slack() -> None:
    from multidev.benchmarks import Goal

    g = Goal("thin", "g", 1.3, slack_s=0.3e-6)
    rec = {"group": "g", "variants": {"md": {"median_s": 0.35e-6}, "native": {"median_s": 0.1e-6}}}
    assert g.judge(rec) == (pytest.approx(3.5), True)  # 3.5x, but 0.25 µs above: met
    rec["variants"]["md"]["median_s"] = 0.5e-6
    assert g.judge(rec) == (pytest.approx(5.0), False)
    rec["variants"] = {"md": {"median_s": 12e-6}, "native": {"median_s": 10e-6}}
    assert g.judge(rec) == (pytest.approx(1.2), True)


def test_the_headline_is_built_from_the_goal_data() -> None:
    """report.headline has one row per goal judged (the names and rules of the suites' Goal data, no
    hand-written list), per backend how many rows met it and the worst; a miss is bold."""
    from multidev.benchmarks import report

    def judged(goal: str, backend: str, case: str, value: float, met: bool) -> dict:
        return {"goal": goal, "rule": "md / native <= 1.3", "backend": backend, "case": case,
                "precision": None, "value": value, "target": 1.3, "met": met, "note": ""}

    doc = {"runs": [{"backends": {"numpy": {"version": "2"}, "jax": {"version": "0.10"}}}],
           "results": [{"backend": "numpy", "run": 0}, {"backend": "jax", "run": 0}],
           "goals": [judged("thin device_of", "numpy", "a", 1.1, True), judged("thin device_of", "numpy", "b", 1.2, True),
                     judged("thin device_of", "jax", "a", 2.5, False), judged("no-op to", "jax", "c", 0.9, True)]}
    lines = report.headline(doc)
    assert [ln.split(" | ")[0] for ln in lines[2:]] == ["| thin device_of", "| no-op to"]
    row = lines[2]
    assert "2/2 met; worst 1.2 (b)" in row and "**0/1 met; worst 2.5 (a)**" in row and row.endswith("md / native <= 1.3 |")
    doc["goals"] = [judged("slack", "numpy", "big", 5.0, True), judged("slack", "numpy", "tiny", 1.4, False),
                    {**judged("slack", "jax", "a", 0.9, True), "rule": "md / native <= 0.05"}]
    row = report.headline(doc)[2]
    assert "**1/2 met; worst 1.4 (tiny); md / native <= 1.3**" in row, "the worst shown is a miss"
    assert "1/1 met; worst 0.9 (a); md / native <= 0.05" in row and row.endswith("per backend (in its cell) |")
    assert report.headline({"runs": [], "results": [], "goals": []}) == \
        ["_No goal of the suites applies to these rows._"]


def test_stability_marks_rows_it_cannot_stand_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row 4 of issue 36: spread between alternating samples, a CPU row off the CPU, an overloaded
    machine: the row is marked and, under strict stability, its goals are not judged."""
    from multidev.benchmarks import report

    def var(samples: list[float], cpu_share: float = 1.0) -> dict:
        return {"median_s": sorted(samples)[len(samples) // 2], "samples_s": samples, "cpu_share": cpu_share}

    run = {"machine": {"cpu_count": 2}, "loadavg_before": [0.5, 0, 0], "loadavg_after": [0.7, 0, 0],
           "settings": {"stability": "strict"}}
    steady = {"md": var([1.0, 1.01, 0.99, 1.0, 1.02, 1.0]), "native": var([0.5, 0.5, 0.51, 0.49, 0.5, 0.5])}
    rec = {"devices": ["cpu:0"], "variants": steady, "ratio": {"of": ["md", "native"], "value": 2.0}}
    assert report.stability(rec, run) == []
    # the ratio of alternating samples swings although each variant's median looks fine
    swing = {"md": var([1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0]), "native": var([1.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0])}
    assert any("alternating" in w for w in report.stability({**rec, "variants": swing}, run))
    off = {**steady, "md": var([1.0, 1.01, 0.99, 1.0, 1.02, 1.0], cpu_share=0.5)}
    assert any("on the CPU 50%" in w for w in report.stability({**rec, "variants": off}, run))
    assert report.stability({**rec, "devices": ["gpu:0"], "variants": off}, run) == [], "a GPU row may wait off the CPU"
    # a goal is judged on the variants it reads: another variant's noise leaves it judged
    noisy = {**steady, "md_checked": var([1.0, 3.0, 1.0, 3.0, 1.0, 3.0], cpu_share=0.5)}
    assert len(report.stability({**rec, "variants": noisy}, run)) == 2
    assert report.stability({**rec, "variants": noisy}, run, only={"md", "native"}) == []
    loaded = {**run, "loadavg_after": [5.0, 0, 0]}
    assert any("load average 5.0" in w for w in report.stability(rec, loaded))
    assert any("load average" in w for w in report.run_warnings(loaded))
    assert any("MHz" in w for w in report.run_warnings({**run, "cpu_MHz_before": 3000, "cpu_MHz_after": 2000}))
    # strict: the goal row is not judged (met False, the measured verdict kept); warn: judged, marked
    doc = {"runs": [run], "results": [{**rec, "variants": off, "suite": "s", "benchmark": "b", "backend": "numpy",
                                       "case": "c", "group": "g"}]}
    report.mark_stability(doc)
    assert doc["results"][0]["unstable"]
    # evaluate_goals: a goal reading md and native is not judged on a row where md is off the CPU; on a
    # row where only md_checked is, the goal on md is judged and the goal on md_checked is not
    import multidev.benchmarks as benchmarks
    from multidev.benchmarks.suite import Goal

    plain, checked = Goal("g1", "g", 3.0), Goal("g2", "g", 10.0, num="md_checked")
    bench = type("B", (), {"name": "b", "suite": "s", "goals": (plain, checked)})
    noisy_doc = {"runs": [{**run, "backends": {}}], "results": [{**rec, "variants": noisy, "suite": "s",
                                                                 "benchmark": "b", "backend": "numpy",
                                                                 "case": "c", "group": "g"}]}
    report.mark_stability(noisy_doc)
    monkeypatch.setattr(benchmarks, "goals", lambda: [(bench, plain), (bench, checked)])
    rows = report.evaluate_goals(noisy_doc)
    by = {r["goal"]: r for r in rows}
    assert by["g1"]["met"] and "unstable" not in by["g1"], by["g1"]
    assert not by["g2"]["met"] and by["g2"]["unstable"] and by["g2"]["measured_met"], by["g2"]
    assert report.strict(doc) and not report.strict({"runs": [{"settings": {"stability": "warn"}}]})


def test_the_plot_has_a_panel_for_every_suite_run(tmp_path: Path) -> None:
    """Issue 31: the figure drew the overhead suite alone. Every suite that has rows gets a panel
    whose title names it (or its dedicated panel's subject), and the figure is written."""
    pytest.importorskip("matplotlib")
    from multidev.benchmarks import report
    from multidev.benchmarks.suite import OPT_IN, SUITES

    def row(suite: str, case: str, ratio: bool) -> dict:
        v = {"md": {"median_s": 2e-6}, "native": {"median_s": 1e-6}}
        r = {"suite": suite, "benchmark": "b", "backend": "numpy", "case": case, "group": "g", "precision": None,
             "variants": v, "run": 0, "devices": ["cpu:0"], "params": {}}
        if ratio:
            r["ratio"] = {"of": ["md", "native"], "value": 2.0}
        return r

    suites = [*SUITES.values(), *OPT_IN.values()]
    rows = [row(s, f"{s} case", ratio=i % 2 == 0) for i, s in enumerate(suites) if s != "bandwidth"]
    doc = {"created": "now", "results": rows, "goals": [],
           "runs": [{"machine": {"cpu": "c", "cpu_count": 2, "python": "3.11", "numpy": "2"},
                     "backends": {"numpy": {"version": "2", "devices": ["cpu:0"]}},
                     "settings": {"precision": None, "quick": True}}]}
    titles = [t for t, _ in report._panels(doc)]
    for s in suites:
        if s != "bandwidth":
            assert any(t.startswith(s) for t in titles), (s, titles)
    out = tmp_path / "fig.png"
    report.plot(doc, str(out))
    assert out.stat().st_size > 1000


def test_the_variants_of_a_case_take_as_many_calls_a_sample() -> None:
    """A sample's fixed part (the synchronization, the wait for an asynchronous call's last copy) is
    spread over as many calls in every variant: a variant timed one call a sample against another timed
    five read JAX's LeNet move 1.88x where the calls alone differ by about 1.2x. Within 20 target
    samples a sample; a variant's own ``inner`` is kept."""
    import time

    from multidev.benchmarks import Case, Variant

    def wait(s: float) -> None:
        end = time.perf_counter() + s
        while time.perf_counter() < end:
            pass

    s = runner.Settings(runner.build_parser().parse_args(["--quick"]))
    fast, slow = Variant(wait, (s.target_sample / 8,)), Variant(wait, (s.target_sample / 2,))
    own = Variant(wait, (s.target_sample / 8,), inner=3)
    rec = runner.measure_case(Case("c", {"md": slow, "native": fast, "own": own}), md_numpy(), s)
    inner = {k: v["inner"] for k, v in rec["variants"].items()}
    assert inner["md"] == inner["native"] > 1 and inner["own"] == 3, inner
    too_slow = Variant(wait, (s.target_sample * 10,))
    rec = runner.measure_case(Case("c", {"md": too_slow, "native": fast}), md_numpy(), s)
    inner = {k: v["inner"] for k, v in rec["variants"].items()}
    assert inner["md"] <= 2 and inner["native"] >= inner["md"], inner  # (20 target samples: two calls of 10)
    longer = runner.Settings(runner.build_parser().parse_args(["--quick", "--sample-time", "5"]))
    assert longer.target_sample == 0.005  # (--sample-time: milliseconds)
    rec = runner.measure_case(Case("c", {"md": Variant(wait, (0.0005,))}), md_numpy(), longer)
    assert rec["variants"]["md"]["inner"] >= 2, rec["variants"]["md"]["inner"]  # (at the default: one call)


def md_numpy() -> Any:
    import multidev as md

    return md.backend("numpy")
