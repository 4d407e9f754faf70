"""The three real-world MNIST programs made data-parallel with ``md.data_parallel``
(examples/mnist_torch.py, mnist_flax.py, mnist_keras.py) run as plain ``python`` scripts (a
1-process group) and learn the same on one device as on two devices of one process (JAX's virtual
CPU devices, TensorFlow's logical CPU devices) or two processes (torch on gloo): the same loss at
every step to float summation order, the same test accuracy. Each run is a subprocess (device counts
are fixed when a framework starts), a few small steps; dropout is off where runs are compared (its
masks are drawn per device). The diffs docs/data-parallel.md shows are checked against the programs.
"""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from multidev.conformance.test_distributed import engine_unavailable, worker_env

ROOT = Path(__file__).resolve().parents[1]
LOSS_RTOL = 1e-4
ACCURACY_TOLERANCE = 0.02  # a test image or two may flip with the summation order
QUICK = ["--epochs", "1", "--steps", "3", "--batch-size", "32", "--limit", "192"]


def _need(*mods: str) -> None:
    for mod in mods:
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed here")


def _run(tmp_path: Path, program: str, tag: str, *args: str, launch: list[str] | None = None) -> dict[str, Any]:
    out = tmp_path / f"{tag}.json"
    cmd = [sys.executable, *(launch or []), str(ROOT / "examples" / f"{program}.py"), *QUICK, *args, "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=worker_env(), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert len(doc["loss"]) == 3 and all(np.isfinite(doc["loss"])), doc
    return doc


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=LOSS_RTOL)
    assert abs(a["accuracy"] - b["accuracy"]) <= ACCURACY_TOLERANCE, (a["accuracy"], b["accuracy"])
    assert a["accuracy"] > 0.15  # above chance (0.1) after 3 steps: it learns


@pytest.mark.multiprocess
def test_torch_two_gloo_processes_learn_what_plain_python_learns(tmp_path: Path) -> None:
    _need("torch")
    why = engine_unavailable("torch")
    if why:
        pytest.skip(why)
    one = _run(tmp_path, "mnist_torch", "one", "--no-dropout")
    assert one["world_size"] == 1 and one["devices"] == ["cpu:0"]
    two = _run(tmp_path, "mnist_torch", "two", "--no-dropout",
               launch=["-m", "multidev.distributed.launch", "-n", "2", "--engine", "torch", "--grace", "10"])
    assert two["world_size"] == 2
    _same(one, two)


def test_flax_two_devices_learn_what_one_device_learns(tmp_path: Path) -> None:
    _need("jax", "flax", "optax")
    one = _run(tmp_path, "mnist_flax", "one")
    two = _run(tmp_path, "mnist_flax", "two", "--devices", "2")
    assert one["devices"] == ["cpu:0"] and two["devices"] == ["cpu:0", "cpu:1"] and two["world_size"] == 1
    assert one["step"] == two["step"] == 3  # the TrainState's own step counter
    _same(one, two)


def test_keras_two_logical_devices_learn_what_one_device_learns(tmp_path: Path) -> None:
    _need("tensorflow", "keras")
    one = _run(tmp_path, "mnist_keras", "one", "--no-dropout")
    two = _run(tmp_path, "mnist_keras", "two", "--no-dropout", "--devices", "2")
    assert one["devices"] == ["cpu:0"] and two["devices"] == ["cpu:0", "cpu:1"] and two["world_size"] == 1
    _same(one, two)


def _diffs() -> dict[str, str]:
    """docs/data-parallel.md's diff block under each program's heading, by program."""
    text = (ROOT / "docs" / "data-parallel.md").read_text()
    out = {}
    for m in re.finditer(r"^### `examples/(mnist_\w+)\.py`.*?^```diff\n(.*?)^```", text, re.S | re.M):
        out[m.group(1)] = m.group(2)
    return out


def _code_lines(source: str) -> set[str]:
    return {line.split("  #")[0].strip() for line in source.splitlines()}


@pytest.mark.parametrize("program", ["mnist_torch", "mnist_flax", "mnist_keras"])
def test_the_docs_diff_is_the_programs(program: str) -> None:
    """Every added line of the docs' diff is in the program, every removed line is not."""
    diff = _diffs().get(program)
    assert diff, f"docs/data-parallel.md has no ```diff block under ### `examples/{program}.py`"
    code = _code_lines((ROOT / "examples" / f"{program}.py").read_text())
    added = [ln[1:].split("  #")[0].strip() for ln in diff.splitlines() if ln.startswith("+")]
    removed = [ln[1:].split("  #")[0].strip() for ln in diff.splitlines() if ln.startswith("-")]
    assert added, diff
    for line in added:
        assert line in code, f"{program}: the docs add {line!r}, which the program does not have"
    for line in removed:
        if line:
            assert line not in code, f"{program}: the docs remove {line!r}, which the program still has"


def test_the_data_is_mnist_shaped_and_a_real_npz_is_read(tmp_path: Path) -> None:
    """Without --data: the digits, 28x28 in [0, 1], 10 classes; with it: Keras's mnist.npz layout, uint8 scaled."""
    from multidev.examples.mnist_data import global_batches, load

    xtr, ytr, xte, yte, source = load()
    assert xtr.shape[1:] == xte.shape[1:] == (28, 28) and xtr.dtype == np.float32 and ytr.dtype == np.int64
    assert xtr.min() >= 0.0 and xtr.max() <= 1.0 and set(np.unique(ytr)) == set(range(10)), source
    rng = np.random.default_rng(0)
    npz = tmp_path / "mnist.npz"
    np.savez(npz, x_train=rng.integers(0, 256, (50, 28, 28), dtype=np.uint8), y_train=rng.integers(0, 10, 50),
             x_test=np.full((7, 28, 28), 255, np.uint8), y_test=np.arange(7))
    xtr, ytr, xte, yte, source = load(str(npz), limit=40)
    assert xtr.shape == (40, 28, 28) and xte.shape == (7, 28, 28) and float(xte.max()) == 1.0
    assert list(yte) == list(range(7)) and str(npz) in source
    epoch = list(global_batches(40, 16, epoch=1))
    assert len(epoch) == 2 and len(set(np.concatenate(epoch))) == 32   # whole batches, no row twice
    assert [list(b) for b in epoch] == [list(b) for b in global_batches(40, 16, epoch=1)]  # the same on every rank
