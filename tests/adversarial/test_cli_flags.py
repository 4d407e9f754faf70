"""Bad flags of the multidev command: each ends in a non-zero exit and a one-line reason on stderr,
never a traceback, a pytest INTERNALERROR or a silent success; the bench JSON records only an
explicit list of environment variables."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import multidev as md


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, COLUMNS="200", TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore", **(env or {}))
    return subprocess.run([sys.executable, "-m", "multidev.cli", *args], capture_output=True, text=True,
                          env=full, timeout=600)


def _mxnet_missing() -> bool:
    try:
        md.backend("mxnet")
    except md.BackendNotAvailableError:
        return True
    return False


def _no_gpu() -> bool:
    return not any(d.is_gpu for d in md.devices(backend="numpy")) and md.num_gpus(backend="numpy") == 0 and not (
        __import__("importlib").util.find_spec("torch") is not None and md.num_gpus(backend="torch") > 0)


CASES = {
    "bench unknown backend": (["bench", "--backend", "nosuch", "--quick"], "nosuch"),
    "bench unimportable adapter": (["bench", "--backend", "no_such_module:Backend", "--quick"], "no_such_module"),
    "bench device banana": (["bench", "--device", "banana"], "banana"),
    "bench device missing": (["bench", "--backend", "numpy", "--device", "cpu:0,gpu:5", "--quick"], "gpu:5"),
    "bench unknown suite": (["bench", "--suite", "nosuch"], "nosuch"),
    "bench negative reps": (["bench", "--reps", "-1"], "--reps"),
    "bench missing report": (["bench", "--report", "/nonexistent/run.json"], "/nonexistent/run.json"),
    "demo unknown backend": (["demo", "--backend", "nosuch"], "nosuch"),
    "demo zero devices": (["demo", "--devices", "0"], "--devices"),
    "conformance device banana": (["conformance", "--device", "banana"], "banana"),
    "conformance device missing": (["conformance", "--backend", "numpy", "--device", "gpu:5"], "gpu:5"),
    "conformance unknown backend": (["conformance", "--backend", "nosuch"], "nosuch"),
    "conformance unknown import": (["conformance", "--import", "no_such_module"], "no_such_module"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_flag_is_one_line_and_non_zero(case: str) -> None:
    args, named = CASES[case]
    p = _run(args)
    assert p.returncode != 0, f"{args} exited 0 (a silent success):\n{p.stdout[-2000:]}"
    for stream in (p.stdout, p.stderr):
        assert "Traceback" not in stream and "INTERNALERROR" not in stream, stream[-3000:]
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("multidev ")]
    assert len(ours) == 1 and named in ours[0], p.stderr[-2000:]


def test_bench_mxnet_not_installed() -> None:
    if not _mxnet_missing():
        pytest.skip("MXNet is installed in this environment (the 'with MXNet' venv)")
    p = _run(["bench", "--backend", "mxnet", "--quick"])
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("multidev bench: --backend mxnet"), p.stderr


def test_gpu_flags_without_a_gpu() -> None:
    if not _no_gpu():
        pytest.skip("this machine has a GPU")
    for args in (["bench", "--backend", "numpy", "--device", "gpu:0", "--quick"],
                 ["bench", "--backend", "numpy", "--device", "cpu:0,gpu:0", "--quick"],
                 ["conformance", "--backend", "numpy", "--device", "gpu:0"]):
        p = _run(args)
        assert p.returncode != 0, f"{args} exited 0"
        assert "gpu:0" in p.stderr.strip().splitlines()[-1] and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert "InvalidArgument" not in p.stdout, p.stdout[-2000:]  # hypothesis's, from empty device lists


def test_bench_json_records_only_the_listed_variables(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    secret = {"TF_VAR_db_password": "hunter2", "AWS_SECRET_ACCESS_KEY": "x" * 20, "TF_LOG_PATH": "/tmp/tf.log",
              "OMP_NUM_THREADS": "1"}
    p = _run(["bench", "--backend", "numpy", "--suite", "overhead", "--quick", "--no-progress", "--json", str(out)],
             env=secret)
    assert p.returncode == 0, p.stderr[-3000:]
    text = out.read_text()
    assert "hunter2" not in text and "TF_VAR_db_password" not in text and "AWS_SECRET" not in text
    assert "TF_LOG_PATH" not in text
    recorded = _find(json.loads(text), "env")
    assert isinstance(recorded, dict) and recorded.get("OMP_NUM_THREADS") == "1", recorded  # listed: recorded


def _find(doc: object, key: str) -> object:
    """The first value under ``key`` anywhere in a JSON document."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        for v in doc.values():
            found = _find(v, key)
            if found is not None:
                return found
    elif isinstance(doc, list):
        for v in doc:
            found = _find(v, key)
            if found is not None:
                return found
    return None
