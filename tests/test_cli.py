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
    p = _run(["devices", "--refresh"], env={"COLUMNS": "300"})
    assert p.returncode == 0, p.stderr
    for n in missing:
        line = next(ln for ln in p.stdout.splitlines() if ln.strip("│┃ ").startswith(n))
        assert "not installed: pip install " in line and f'"multidev[{n}]"' in line, line
        assert "it with" not in line and "`" not in line, line


def test_the_torch_hint_takes_the_cpu_build_where_there_is_no_nvidia_driver() -> None:
    """PyPI's Linux torch wheels are multi-GB CUDA builds: without a GPU the hint names the CPU index."""
    code = ("import sys, multidev.registry as r; h = r._install_hint('torch'); "
            "print(h); assert 'torch' not in sys.modules")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    if sys.platform.startswith("linux") and not os.path.exists("/proc/driver/nvidia"):
        assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in p.stdout, p.stdout
        assert 'pip install "multidev[torch]"' in p.stdout
    else:
        assert "pip install" in p.stdout


def test_devices_reads_back_its_cache_and_a_changed_environment_probes_again(tmp_path: Path) -> None:
    env = {"MULTIDEV_CACHE_DIR": str(tmp_path), "MULTIDEV_NUMPY_DEVICES": "3"}
    first = _run(["devices", "--backend", "numpy"], env=env)
    assert first.returncode == 0 and "cpu:0 cpu:1 cpu:2" in first.stdout, first.stderr
    assert "read from the cache" not in first.stderr and (tmp_path / "devices.json").exists()
    second = _run(["devices", "--backend", "numpy"], env=env)
    assert second.returncode == 0 and "read from the cache" in second.stderr
    assert second.stdout == first.stdout
    changed = _run(["devices", "--backend", "numpy"], env={**env, "MULTIDEV_NUMPY_DEVICES": "4"})
    assert "read from the cache" not in changed.stderr and "cpu:3" in changed.stdout
    fresh = _run(["devices", "--backend", "numpy", "--refresh"], env=env)
    assert "read from the cache" not in fresh.stderr and "cpu:0 cpu:1 cpu:2" in fresh.stdout


def test_devices_prints_no_framework_start_up_log(tmp_path: Path) -> None:
    """Each backend is probed in its own process with TensorFlow's info log off: nothing of the
    frameworks' start-up reaches the terminal (it used to come twice)."""
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed: its start-up log is the one to leave out")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    p = subprocess.run([sys.executable, "-m", "multidev.cli", "devices", "--backend", "tensorflow", "--refresh"],
                       capture_output=True, text=True, timeout=300, env={**env, "MULTIDEV_CACHE_DIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert "oneDNN" not in p.stdout + p.stderr and "absl::InitializeLog" not in p.stdout + p.stderr


def test_unknown_backend_fails_devices() -> None:
    p = _run(["devices", "--backend", "nope"])
    assert p.returncode == 1 and "not available" in p.stdout


def test_demo_numpy() -> None:
    p = _run(["demo", "--backend", "numpy"])
    assert p.returncode == 0, p.stderr
    assert "to(x, cpu:0) is x: True" in p.stdout and "copy(x) is x: False" in p.stdout


def test_conformance_passes_numpy_and_writes_matrix(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    # What the CLI adds: it runs the suite and writes the matrix, a cell per feature. A check from
    # each of four features is enough here (NumPy's whole suite is CI's fast-suite job).
    pick = ("test_devices_listed or test_native_round_trip or test_creation_defaults or test_copy_is_a_new_buffer "
            "or test_allreduce_bad_inputs")
    p = _run(["conformance", "--backend", "numpy", "--json", str(out), "--", "-x", "-k", pick])
    assert p.returncode == 0, p.stdout[-3000:]
    doc = json.loads(out.read_text())
    cells = doc["matrix"]["numpy"]
    assert {"devices", "placement", "creation", "collectives"} <= set(cells)
    assert sum(c["passed"] for c in cells.values()) >= 5
    assert all(c["failed"] == 0 for c in cells.values())
    assert doc["backends"]["numpy"]["devices"][:2] == ["cpu:0", "cpu:1"]


def test_conformance_skips_a_partner_that_is_installed_but_does_not_load(tmp_path: Path) -> None:
    """The default partners are found on the path, not imported: one whose framework is found but
    whose adapter cannot load skips the checks that need it, saying why (interop, and the check that
    mixes backends in one collective); the run passes."""
    (tmp_path / "brokenpartner.py").write_text(textwrap.dedent("""
        import multidev as md
        from multidev.errors import BackendNotAvailableError

        class Broken:
            name = "aaa_broken"
            framework = "this"  # a module on the path (the standard library's), never imported here

            def __init__(self):
                raise BackendNotAvailableError("aaa_broken: its framework does not load here")

        md.register_backend("aaa_broken", Broken)
    """))
    out = tmp_path / "m.json"
    p = _run(["conformance", "--backend", "numpy", "--import", "brokenpartner", "--json", str(out), "--",
              "-k", "mixed_backends or (round_trip and aaa_broken)", "-rs"],
             env={"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "partner aaa_broken is installed but does not load here" in p.stdout, p.stdout[-3000:]
    cells = json.loads(out.read_text())["matrix"]["numpy"]
    assert all(c["failed"] == 0 for c in cells.values()), cells
    assert sum(c["skipped"] for c in cells.values()) >= 2, cells


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
    p = _run(["conformance", "--backend", "broken_adapter:BrokenBackend", "--json", str(out), "--", "-k",
              "placement"], env=env)  # where the broken copy shows
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
