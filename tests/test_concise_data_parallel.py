"""The D2L 12.6 concise program ported to ``md.data_parallel`` (examples/concise_data_parallel.py)
learns the same on one device, two devices of one process (JAX's virtual CPU devices) and two
processes (torch on gloo): the same losses per epoch to float summation order, the same test
accuracy."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from multidev.conformance.test_distributed import engine_unavailable, worker_env

LOSS_RTOL = 1e-4
ACCURACY_TOLERANCE = 0.02  # a test example or two may flip with the summation order


def _run(tmp_path: Path, tag: str, *args: str, launch: list[str] | None = None) -> dict[str, Any]:
    out = tmp_path / f"{tag}.json"
    cmd = [sys.executable, *(launch or []), "-m", "multidev.examples.concise_data_parallel", *args, "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=worker_env(), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(out.read_text())


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=LOSS_RTOL)
    assert abs(a["accuracy"] - b["accuracy"]) <= ACCURACY_TOLERANCE, (a["accuracy"], b["accuracy"])
    assert a["loss"][-1] < a["loss"][0]  # it learns


def test_jax_two_devices_learn_what_one_device_learns(tmp_path: Path) -> None:
    for mod in ("jax", "optax"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed here")
    one = _run(tmp_path, "one", "--backend", "jax")
    two = _run(tmp_path, "two", "--backend", "jax", "--devices", "2")
    assert two["devices"] == ["cpu:0", "cpu:1"] and two["world_size"] == 1
    _same(one, two)


@pytest.mark.multiprocess
def test_torch_two_processes_learn_what_one_process_learns(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed here")
    why = engine_unavailable("torch")
    if why:
        pytest.skip(why)
    one = _run(tmp_path, "one", "--backend", "torch")
    two = _run(tmp_path, "two", "--backend", "torch",
               launch=["-m", "multidev.distributed.launch", "-n", "2", "--engine", "torch", "--grace", "10"])
    assert two["world_size"] == 2
    _same(one, two)
