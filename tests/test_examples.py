"""The digits example (examples/digits.py) trains on every installed backend, and N devices learn
what one device learns: single process on 2 virtual devices, 2 processes under torchrun, and two
"nodes" (two torchrun launches with --nnodes=2 over localhost, gloo). Each run is a subprocess, so
virtual device counts are set before the framework starts; no timing thresholds."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from multidev.examples.digits import ACCURACY_TOLERANCE

FRAMEWORKS = ("torch", "jax", "tensorflow", "mxnet")
EPOCHS = 6
#: The loss curves of the runs compared agree to this relative tolerance (float summation order).
LOSS_RTOL = 1e-3
MIN_ACCURACY = 0.9  # what this MLP reaches on the digits within EPOCHS (about 0.95)


def installed() -> list[str]:
    out = ["numpy"]
    for name in FRAMEWORKS:
        if importlib.util.find_spec(name) is None:
            continue
        if name == "mxnet" and int(np.__version__.split(".")[0]) >= 2:
            continue  # MXNet 1.9.1 needs numpy<2 (the "with MXNet" environment)
        out.append(name)
    return out


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1",
               COLUMNS="200", **extra)
    for var in ("MULTIDEV_JAX_CPU_DEVICES", "MULTIDEV_TF_CPU_DEVICES", "MULTIDEV_NUMPY_DEVICES",
                "MULTIDEV_MXNET_CPU_DEVICES"):
        env[var] = "2"
    return env


def _digits(tmp_path: Path, name: str, *extra: str, launcher: list[str] | None = None, tag: str = "run",
            timeout: float = 240) -> dict[str, Any]:
    out = tmp_path / f"{tag}.json"
    cmd = (launcher or [sys.executable]) + ["-m", "multidev.examples.digits", "--backend", name, "--epochs",
                                            str(EPOCHS), "--no-progress", "--json", str(out), *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(out.read_text())


def _same_learning(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["accuracy"][-1] >= MIN_ACCURACY and b["accuracy"][-1] >= MIN_ACCURACY, (a["accuracy"], b["accuracy"])
    assert abs(a["accuracy"][-1] - b["accuracy"][-1]) <= ACCURACY_TOLERANCE, (a["accuracy"], b["accuracy"])
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=LOSS_RTOL)
    assert a["loss"][-1] < a["loss"][0] / 3  # it learns


@pytest.mark.slow
@pytest.mark.parametrize("name", installed())
def test_n_devices_learn_what_one_device_learns(tmp_path: Path, name: str) -> None:
    doc = _digits(tmp_path, name, "--devices", "2")
    runs = doc["runs"]
    one = runs[0]
    assert len(one["devices"]) == 1 and len(one["accuracy"]) == EPOCHS
    if len(runs) == 1:
        if name == "torch":
            pytest.skip("torch has one CPU device: its N-device run needs GPUs (scripts/gpu/compile.sh runs it)")
        pytest.fail(f"{name} made no 2-device run: {doc}")
    many = runs[1]
    assert len(many["devices"]) == 2, many["devices"]
    _same_learning(one, many)


def _free_port() -> int:
    from multidev.distributed.launch import free_port

    return free_port()


def _torchrun() -> list[str]:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("multidev.distributed runs on torch.distributed: torch is not installed")
    return [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in ("numpy", "torch", "jax") if n in installed()])
def test_torchrun_two_processes_learn_what_one_device_learns(tmp_path: Path, name: str) -> None:
    """``torchrun --nproc_per_node=2``: every process trains on its part of each minibatch (on 2
    virtual devices each where the backend has them); the group learns the single-device run."""
    launcher = _torchrun() + ["--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
    dist = _digits(tmp_path, name, "--devices", "2", launcher=launcher, tag="dist")
    single = _digits(tmp_path, name, "--devices", "1", tag="single")
    assert dist["world_size"] == 2
    run = dist["runs"][0]
    assert run["devices"][0].startswith("rank0:") and run["devices"][-1].startswith("rank1:"), run["devices"]
    _same_learning(single["runs"][0], run)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_nodes_on_localhost_learn_what_one_device_learns(tmp_path: Path) -> None:
    """Two machines simulated on one: two torchrun launches, ``--nnodes=2 --node_rank=0/1`` with one
    process each, meeting at a localhost master over gloo (torchrun's static rendezvous)."""
    port = _free_port()
    procs = []
    for node in (0, 1):
        cmd = _torchrun() + ["--nnodes=2", f"--node_rank={node}", "--nproc_per_node=1", "--master_addr=127.0.0.1",
                             f"--master_port={port}", "-m", "multidev.examples.digits", "--backend", "numpy",
                             "--epochs", str(EPOCHS), "--devices", "2", "--json", str(tmp_path / f"node{node}.json")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                                      cwd=tmp_path))
    for node, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"node {node} did not finish in 240 s (a hang)")
        assert p.returncode == 0, f"node {node}:\n{out[-2000:]}\n{err[-4000:]}"
    assert not (tmp_path / "node1.json").exists()  # only the global rank 0 reports
    doc = json.loads((tmp_path / "node0.json").read_text())
    assert doc["world_size"] == 2
    single = _digits(tmp_path, "numpy", "--devices", "1", tag="single")
    _same_learning(single["runs"][0], doc["runs"][0])
