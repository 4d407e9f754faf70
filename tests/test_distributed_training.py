"""``md.train_batch`` across processes on every engine: the digits example (examples/digits.py) as
2 processes under ``mpiexec`` and as 2 JAX processes (JAX's coordinator variables, 2 CPU devices
each) learns what one process learns (the loss curves agree to float summation order; torchrun's
runs are tests/test_examples.py's). Each run is a subprocess; no timing thresholds."""
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
from multidev.examples.digits import ACCURACY_TOLERANCE

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

EPOCHS = 4
LOSS_RTOL = 1e-3  # float summation order differs between 1 and N processes
MIN_ACCURACY = 0.85  # what this MLP reaches on the digits within EPOCHS


def _env() -> dict[str, str]:
    return worker_env(COLUMNS="200", MULTIDEV_JAX_CPU_DEVICES="2", MULTIDEV_NUMPY_DEVICES="2",
                      MULTIDEV_TF_CPU_DEVICES="2", MULTIDEV_MXNET_CPU_DEVICES="2")


def _digits(tmp_path: Path, name: str, devices: int, tag: str, engine: str | None = None) -> dict[str, Any]:
    out = tmp_path / f"{tag}.json"
    args = ["-m", "multidev.examples.digits", "--backend", name, "--epochs", str(EPOCHS), "--no-progress",
            "--devices", str(devices), "--json", str(out)]
    if engine is None:
        cmd = [sys.executable, *args]
    else:  # mpiexec -n 2 for the mpi engine, JAX's variables for jax
        cmd = [sys.executable, "-m", "multidev.distributed.launch", "-n", "2", "--engine", engine, "--grace", "10",
               *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(out.read_text())


def _same_learning(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["accuracy"][-1] >= MIN_ACCURACY and b["accuracy"][-1] >= MIN_ACCURACY, (a["accuracy"], b["accuracy"])
    assert abs(a["accuracy"][-1] - b["accuracy"][-1]) <= ACCURACY_TOLERANCE, (a["accuracy"], b["accuracy"])
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=LOSS_RTOL)
    assert a["loss"][-1] < a["loss"][0] / 2  # it learns


@pytest.mark.parametrize(("engine", "name", "devices"), [("mpi", "numpy", 2), ("jax", "jax", 2)],
                         ids=["mpiexec-numpy-2devices", "jax-processes-jax-2devices"])
def test_two_processes_learn_what_one_process_learns(tmp_path: Path, engine: str, name: str, devices: int) -> None:
    """Each process trains on its part of every minibatch (on ``devices`` devices of its own), and
    train_batch sums the gradients across the processes through the engine: the job learns what one
    process with ``devices * 2`` devices' worth of data learns (the same minibatches)."""
    why = engine_unavailable(engine)
    if why:
        pytest.skip(why)
    if name != "numpy" and importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed here")
    dist = _digits(tmp_path, name, devices, "dist", engine)
    single = _digits(tmp_path, name, 1, "single")
    assert dist["world_size"] == 2
    run = dist["runs"][0]
    assert run["devices"][0].startswith("rank0:") and run["devices"][-1].startswith("rank1:"), run["devices"]
    assert len(run["devices"]) == 2 * devices
    _same_learning(single["runs"][0], run)
