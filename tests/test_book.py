"""The book's programs (examples/d2l/: D2L's "GPUs", 12.2, 12.3, 12.5, 12.6 ported to multidev) on
every installed backend, each backend in its own interpreter with 4 virtual CPU devices (the
programs run on 1, 2 and 4 of them), at the programs' ``--quick`` sizes.

A program checks its own claims and reports each check in its JSON; these tests require every
check to hold and re-check the central figures against the programs' stated tolerances: the
models learn, N devices learn what one device learns (loss curves and test accuracy), the book's
hand-written step agrees with ``md.train_batch``, work on several devices at once gives what one
device gives, placement is where the book says, and ``md.synchronize`` waits for work whose
results were dropped. No timing thresholds (times are reported by the programs, judged nowhere).
torch has one CPU device, so its N-device runs happen on GPUs only (scripts/gpu/book.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workers import installed

from multidev.examples.d2l import SECTIONS, auto_parallelism, multi_gpu_scratch
from multidev.examples.d2l.common import Report
from multidev.examples.d2l.common import main as program_main

COUNTS = (2, 4)
#: Backends whose devices queue work (the dropped-work checks can fail there); the others compute
#: before each call returns on a CPU.
ASYNC_ON_CPU = {"jax", "mxnet"}
_POOL = ThreadPoolExecutor(max_workers=2)  # two interpreters at a time: the CI machine has 2 cores
_RUNS: dict[str, Future] = {}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MULTIDEV_") or k == "MULTIDEV_SOURCE_COMMIT"}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", COLUMNS="200")
    return env  # no MULTIDEV_*_DEVICES: the programs ask for max(--devices) virtual devices themselves


def _run(name: str, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "multidev.examples.d2l", "--backend", name, "--devices",
           ",".join(map(str, COUNTS)), "--quick", "--quiet", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), cwd=out.parent)
    if not out.exists():
        raise AssertionError(f"{' '.join(cmd[1:])} wrote no JSON (exit {p.returncode}):\n"
                             f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    doc = json.loads(out.read_text())
    doc["exit"], doc["stdout"] = p.returncode, p.stdout[-4000:]
    return doc


_SELECTED: set[str] = set()


@pytest.fixture(scope="module", autouse=True)
def _selected_backends(request: pytest.FixtureRequest) -> None:
    """The backends whose tests this run selected (``-k mxnet`` runs MXNet's program alone)."""
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "module", None) is sys.modules[__name__] and "name" in params:
            _SELECTED.add(params["name"])


def _results(name: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not _RUNS:  # start every selected backend's run at once (two at a time), so they overlap the tests
        base = tmp_path_factory.mktemp("book")
        for n in installed():
            if n in _SELECTED or n == name:
                _RUNS[n] = _POOL.submit(_run, n, base / f"{n}.json")
    if name not in _RUNS:
        _RUNS[name] = _POOL.submit(_run, name, tmp_path_factory.mktemp("book") / f"{name}.json")
    return _RUNS[name].result()


def _section(name: str, section: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    doc = _results(name, tmp_path_factory)
    r = doc["results"][section][name]
    failed = {c: v["detail"] for c, v in r["checks"].items() if not v["ok"]}
    assert not failed, f"{section} on {name}: failed checks:\n" + "\n".join(f"- {c}: {d}" for c, d in failed.items())
    assert r["checks"].get("ran", {}).get("ok"), f"{section} on {name} did not run to its end"
    return r


def _multi(r: dict[str, Any]) -> bool:
    """Whether the backend had the 4 devices of the N-device runs here (torch has one CPU device)."""
    return len(r["devices_here"]) >= max(COUNTS)


CASES = [(n, s) for n in installed() for s in SECTIONS]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "section"), CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_program_checks_hold(name: str, section: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    r = _section(name, section, tmp_path_factory)
    assert len(r["checks"]) >= 3, r["checks"]
    doc = _results(name, tmp_path_factory)
    assert doc["exit"] == (0 if doc["ok"] else 1), doc["stdout"]


@pytest.mark.slow
@pytest.mark.parametrize("name", installed())
def test_use_gpu_places_what_the_book_says(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    r = _section(name, "use_gpu", tmp_path_factory)
    must = ["try_gpu(10) falls back to cpu:0", "X = ones(..., device=try_gpu()) is there",
            "copy(X, other) puts a new tensor there, X unchanged", "to(Z, its device) is Z itself (as_in_ctx: no copy)",
            "copy(Z) is always a new buffer, on Z's device",
            "to() of a dict of tensors: structure kept, resident leaves the same objects"]
    if name != "numpy":
        must += ["native call on native_device(dev)", "framework code in device_scope lands there",
                 "the model computes on its device"]
    missing = [c for c in must if c not in r["checks"]]
    assert not missing, f"use_gpu on {name} did not check {missing}"
    if _multi(r):
        assert "to(X, other) moves when X is elsewhere" in r["checks"]


@pytest.mark.slow
@pytest.mark.parametrize("name", installed())
def test_synchronize_waits_for_dropped_work(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    r = _section(name, "async_computation", tmp_path_factory)
    fig = r["figures"]
    assert fig["asynchronous"] == (name in ASYNC_ON_CPU), fig["asynchronous"]
    if name in ASYNC_ON_CPU:
        waited = [c for c in r["checks"] if "waited for work whose results were dropped" in c]
        assert len(waited) == 4, waited  # synchronize(dev), (), (dev, backend=), (backend=)
    assert fig["queue_then_synchronize_s"] >= fig["queue_s"]


@pytest.mark.slow
@pytest.mark.parametrize("name", installed())
def test_several_devices_at_once_give_what_one_gives(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    r = _section(name, "auto_parallelism", tmp_path_factory)
    if not _multi(r):
        assert r["devices_here"] == ["cpu:0"] and name == "torch", r["devices_here"]
        return
    for n in COUNTS:
        err = r["figures"][f"{n} devices: max relative difference from one device"]
        assert err <= auto_parallelism.SAME_KIND_RTOL, (n, err)
    assert "the per-result form gives the framework's tensors on cpu:0 holding the same values" in r["checks"]


def _curves(r: dict[str, Any], label: str) -> dict[str, dict[str, Any]]:
    return {c: per[label] for c, per in r["figures"]["runs"].items() if label in per}


def _same_learning(one: dict[str, Any], many: dict[str, Any], rtol: float) -> None:
    e = len(many["loss"])
    for a, b in zip(one["loss"][:e], many["loss"]):
        assert abs(a - b) <= rtol * abs(a), (one["loss"], many["loss"])
    assert abs(one["accuracy"][e - 1] - many["accuracy"][-1]) <= multi_gpu_scratch.ACCURACY_TOLERANCE, \
        (one["accuracy"], many["accuracy"])


@pytest.mark.slow
@pytest.mark.parametrize("name", installed())
def test_scratch_learns_and_n_devices_match_one(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    r = _section(name, "multi_gpu_scratch", tmp_path_factory)
    runs = r["figures"]["runs"]
    for step in ("book", "md.train_batch"):
        one = runs["1"][step]
        assert one["accuracy"][-1] >= multi_gpu_scratch.MIN_ACCURACY, one["accuracy"]
        assert one["loss"][-1] < multi_gpu_scratch.LOSS_DROP * one["loss"][0], one["loss"]
    _same_learning(runs["1"]["book"], runs["1"]["md.train_batch"], multi_gpu_scratch.BOOK_RTOL)
    if not _multi(r):
        assert name == "torch" and set(runs) == {"1"}, (name, set(runs))
        return
    assert set(runs) == {"1", *map(str, COUNTS)}, set(runs)
    for n in COUNTS:
        for step, run in runs[str(n)].items():
            _same_learning(runs["1"][step], run, multi_gpu_scratch.LOSS_RTOL)
    assert "book" in runs[str(COUNTS[0])], "the book's step never ran on several devices"


@pytest.mark.slow
@pytest.mark.parametrize("name", installed())
def test_concise_model_learns_and_n_devices_match_one(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    r = _section(name, "multi_gpu_concise", tmp_path_factory)
    labels = {label for per in r["figures"]["runs"].values() for label in per}
    assert labels, r["figures"]["runs"]
    for label in labels:
        curves = _curves(r, label)
        one = curves["1"]
        assert one["accuracy"][-1] >= multi_gpu_scratch.MIN_ACCURACY, (label, one["accuracy"])
        assert f"{label}: the model with the trained parameters predicts what the replicas did" in r["checks"]
        if not _multi(r):
            assert name == "torch", name
            continue
        assert set(curves) == {"1", *map(str, COUNTS)}, (label, set(curves))
        for n in COUNTS:
            _same_learning(one, curves[str(n)], multi_gpu_scratch.LOSS_RTOL)


# -- the command line, in this process (NumPy only) -------------------------------------------------
def test_a_failed_check_is_a_failed_program(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    def run(md: Any, name: str, counts: list[int], args: argparse.Namespace, rep: Report) -> None:
        rep.check("holds", True)
        rep.check("does not hold", 1 + 1 == 3, "arithmetic")

    out = tmp_path / "r.json"
    assert program_main("demo", "A demo.", run, ["--backend", "numpy", "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    checks = doc["results"]["demo"]["numpy"]["checks"]
    assert doc["ok"] is False and checks["does not hold"] == {"ok": False, "detail": "arithmetic"}
    assert checks["holds"]["ok"] and checks["ran"]["ok"]
    assert "FAIL does not hold" in capsys.readouterr().out


def test_an_exception_is_a_failed_check_and_the_next_backend_runs(tmp_path: Path) -> None:
    seen = []

    def run(md: Any, name: str, counts: list[int], args: argparse.Namespace, rep: Report) -> None:
        seen.append(name)
        raise RuntimeError("boom")

    out = tmp_path / "r.json"
    assert program_main("demo", "A demo.", run, ["--backend", "numpy,numpy", "--json", str(out), "--quiet"]) == 1
    r = json.loads(out.read_text())["results"]["demo"]["numpy"]
    assert not r["checks"]["ran"]["ok"] and "RuntimeError: boom" in r["checks"]["ran"]["detail"]
    assert seen == ["numpy", "numpy"]


def test_each_section_runs_alone_from_its_module(tmp_path: Path) -> None:
    out = tmp_path / "u.json"
    p = subprocess.run([sys.executable, "-m", "multidev.examples.d2l.use_gpu", "--backend", "numpy", "--devices", "2",
                        "--json", str(out)], capture_output=True, text=True, timeout=300, env=_env())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads(out.read_text())["results"]["use_gpu"]["numpy"]
    assert r["ok"] and r["devices_here"] == ["cpu:0", "cpu:1"], r["devices_here"]


def test_bad_device_counts_are_refused() -> None:
    p = subprocess.run([sys.executable, "-m", "multidev.examples.d2l", "--devices", "0"], capture_output=True,
                       text=True, timeout=120, env=_env())
    assert p.returncode != 0 and "at least 1" in p.stderr, p.stderr[-1000:]
