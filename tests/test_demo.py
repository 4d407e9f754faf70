"""``multidev demo`` (the README's first command) shows several devices wherever the backend can have
them, and each line says what it shows. A subprocess per run: device counts are set before the
frameworks start."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

VIRTUAL = ["numpy"] + [n for n in ("jax", "tensorflow") if importlib.util.find_spec(n) is not None]
if importlib.util.find_spec("mxnet") is not None and int(np.__version__.split(".")[0]) < 2:
    VIRTUAL.append("mxnet")


def demo(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MULTIDEV_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore", COLUMNS="250")
    p = subprocess.run([sys.executable, "-m", "multidev.cli", "demo", *args], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


@pytest.mark.slow
def test_every_virtual_device_backend_allreduces_over_several_devices() -> None:
    out = demo("--backend", ",".join(VIRTUAL), "--devices", "3")
    for name in VIRTUAL:
        block = out.split(f"{name} ", 1)[1]
        assert "devices cpu:0, cpu:1, cpu:2" in block.splitlines()[0], (name, block[:300])
        assert "allreduce over 3 device(s) -> 6 = 1 + 2 + 3 on cpu:0, cpu:1, cpu:2" in block, (name, block[:600])
        line = next(x for x in block.splitlines() if "compile(" in x)
        assert "same values: True, on cpu:2" in line or (name == "mxnet" and "HybridBlock" in line), line


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_one_device_backend_says_so() -> None:
    out = demo("--backend", "torch")
    if "devices cpu:0," in out:
        pytest.skip("torch sees GPUs here")
    assert "allreduce over 1 device(s) -> 1 = 1 on cpu:0 (this backend has one CPU device here" in out
