"""The multidev command: devices with NumPy alone, and the conformance runner (which must fail a
broken adapter)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from multidev import cli


def _run(args: list[str], env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "multidev.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, cwd=cwd, timeout=300)


def test_devices_with_numpy_alone() -> None:
    p = _run(["devices", "--backend", "numpy"], env={"MULTIDEV_NUMPY_DEVICES": "3"})
    assert p.returncode == 0, p.stderr
    assert "numpy" in p.stdout and "cpu:0 cpu:1 cpu:2" in p.stdout


def test_devices_lists_every_registered_backend() -> None:
    p = _run(["devices"])
    assert p.returncode == 0, p.stderr
    for name in ("numpy", "torch", "jax", "tensorflow", "mxnet"):
        assert name in p.stdout


def test_devices_says_in_one_clean_line_how_to_install_a_missing_framework() -> None:
    """Each backend whose framework is missing gets one line: the exact install command, nothing
    garbled ("not installed: it with `pip install ...`" was the old text)."""
    import importlib.util

    missing = [n for n in ("torch", "jax", "tensorflow") if importlib.util.find_spec(n) is None]
    if not missing:
        pytest.skip("torch, JAX and TensorFlow are all installed here: no backend is missing")
    p = _run(["devices"], env={"COLUMNS": "200"})
    assert p.returncode == 0, p.stderr
    for n in missing:
        line = next(ln for ln in p.stdout.splitlines() if ln.strip("│┃ ").startswith(n))
        assert f'not installed: pip install "multidev[{n}]"' in line, line
        assert "it with" not in line and "`" not in line, line


def test_unknown_backend_fails_devices() -> None:
    p = _run(["devices", "--backend", "nope"])
    assert p.returncode == 1 and "not available" in p.stdout


def test_demo_numpy() -> None:
    p = _run(["demo", "--backend", "numpy"])
    assert p.returncode == 0, p.stderr
    assert "to(x, cpu:0) is x: True" in p.stdout and "copy(x) is x: False" in p.stdout


def test_conformance_passes_numpy_and_writes_matrix(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    p = _run(["conformance", "--backend", "numpy", "--json", str(out), "--", "-x"])
    assert p.returncode == 0, p.stdout[-3000:]
    doc = json.loads(out.read_text())
    cells = doc["matrix"]["numpy"]
    assert {"devices", "placement", "creation", "collectives"} <= set(cells)
    assert sum(c["passed"] for c in cells.values()) > 50
    assert all(c["failed"] == 0 for c in cells.values())
    assert doc["backends"]["numpy"]["devices"][:2] == ["cpu:0", "cpu:1"]


def test_conformance_fails_a_broken_adapter(tmp_path: Path) -> None:
    (tmp_path / "broken_adapter.py").write_text(textwrap.dedent("""
        from multidev.adapters.numpy import NumpyBackend

        class BrokenBackend(NumpyBackend):
            name = "broken"

            def copy(self, x, device):  # the bug: 'copy' hands back the same buffer
                return x
    """))
    env = {"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = tmp_path / "m.json"
    p = _run(["conformance", "--backend", "broken_adapter:BrokenBackend", "--json", str(out)], env=env)
    assert p.returncode != 0
    doc = json.loads(out.read_text())
    assert doc["matrix"]["broken"]["placement"]["failed"] >= 1


def test_conformance_unknown_backend_is_a_usage_error() -> None:
    p = _run(["conformance", "--backend", "no-such-backend"])
    assert p.returncode != 0 and "no backend named" in (p.stdout + p.stderr)


def test_parser_has_the_subcommands() -> None:
    text = cli.build_parser().format_help()
    for sub in ("devices", "demo", "conformance"):
        assert sub in text
