"""The mesh example (examples/mesh_model.py): the same sharded model on every installed backend
with virtual CPU devices equals NumPy's unsharded one; torch (one CPU device) is refused with the
typed error that says why. Each backend runs in a fresh interpreter (device counts are fixed once a
framework starts)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

#: MXNet's NDArray has no ``@`` operator, which the model's code uses (its managed shards are checked
#: by the conformance suite's mesh checks instead).
NAMES = ["numpy"] + [n for n in ("jax", "tensorflow") if importlib.util.find_spec(n) is not None]


def _run(name: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "multidev.examples.mesh_model", "--backend", name],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("name", NAMES)
def test_the_sharded_model_equals_the_unsharded_one(name: str) -> None:
    p = _run(name)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    line = p.stdout.strip().splitlines()[-1]
    assert line.startswith(f"{name}: ") and "w1 pieces [(6, 6), (6, 6), (6, 6), (6, 6)]" in line, line
    assert float(line.rsplit("max error ", 1)[1]) < 1e-4
    want = "jaxlib.ArrayImpl" if name == "jax" else "multidev.ShardedTensor"
    assert want in line, line


def test_torch_without_four_devices_says_why() -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    import torch

    if torch.cuda.device_count() >= 4:
        pytest.skip("this machine has 4 GPUs: torch runs the example (the GPU run checks it)")
    p = _run("torch")
    assert p.returncode != 0 and "DeviceNotFoundError: mesh of shape (2, 2) needs 4 devices" in p.stderr
