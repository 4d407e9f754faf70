"""Shared fixtures of the adversarial suite: run a case group in a child process (a crash there
fails that test, naming the case that was running), and the backends installed here."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
#: The backends every adversarial group runs on (those not installed here are skipped, saying so).
BACKENDS = ("numpy", "torch", "jax", "tensorflow", "mxnet")
#: Seconds one child (one group on one backend) may take before it counts as a hang.
CHILD_TIMEOUT = 600


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1",
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def installed() -> list[str]:
    """The backends that load here, asked of a child process (importing every framework once)."""
    code = "import json, multidev; print(json.dumps(multidev.backends()))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=child_env())
    if p.returncode != 0:
        pytest.fail(f"listing the installed backends failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return list(json.loads(p.stdout.strip().splitlines()[-1]))


@pytest.fixture
def need(installed: list[str]) -> Callable[[str], None]:
    def check(name: str) -> None:
        if name not in installed:
            pytest.skip(f"backend {name!r} is not installed in this environment (installed: {', '.join(installed)})")
    return check


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


@pytest.fixture
def run_group(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """``run_group(group, backend)``: runs ``_child.py`` and fails the test on a crash (naming the
    last case started), a hang, or any finding; returns the child's summary."""
    def run(group: str, backend: str, **env: str) -> dict[str, Any]:
        log = tmp_path / f"{group}-{backend}.log"
        cmd = [sys.executable, str(HERE / "_child.py"), group, backend]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
                               env=child_env(MD_ADV_LOG=str(log), **env))
        except subprocess.TimeoutExpired:
            last = log.read_text().splitlines()[-3:] if log.exists() else []
            pytest.fail(f"{group} on {backend} hung for {CHILD_TIMEOUT} s; last cases started:\n  " + "\n  ".join(last))
        last = log.read_text().splitlines()[-3:] if log.exists() else []
        if p.returncode < 0:
            pytest.fail(f"{group} on {backend} CRASHED ({_signal_name(p.returncode)}); last cases started:\n  "
                        + "\n  ".join(last) + f"\nstderr:\n{p.stderr[-3000:]}")
        findings = [ln for ln in p.stdout.splitlines() if ln.startswith("FINDING")]
        done = [ln for ln in p.stdout.splitlines() if ln.startswith("DONE ")]
        if findings or p.returncode != 0 or not done:
            pytest.fail(f"{group} on {backend}: {len(findings)} finding(s), exit status {p.returncode}:\n"
                        + "\n".join(findings)[:8000] + ("" if done else f"\nstderr:\n{p.stderr[-3000:]}"))
        summary: dict[str, Any] = json.loads(done[-1][5:])
        summary["stdout"] = p.stdout
        return summary
    return run
