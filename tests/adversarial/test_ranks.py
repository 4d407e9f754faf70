"""Mismatched ranks under multidev.distributed (2-3 gloo processes on localhost, each with a
deadline): every mismatch raises a typed error on every rank, none aborts, the group stays usable;
the check can be turned off; a job that never calls shutdown() exits 0 on every rank under torchrun.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from multidev.conformance._helpers import need_gloo

pytestmark = pytest.mark.multiprocess

HERE = Path(__file__).resolve().parent
#: Seconds a group of ranks may take, framework imports included.
DEADLINE = 240.0
#: torch.distributed timeout of the workers: a rank left waiting raises within it.
TIMEOUT = 20.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(backend: str, scenario: str, world: int, **extra: str) -> list[dict[str, Any]]:
    port = _port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1",
                   **extra)
        env.pop("MULTIDEV_DISTRIBUTED_CHECK", None)
        procs.append(subprocess.Popen([sys.executable, str(HERE / "_ranks.py"), backend, scenario, str(TIMEOUT)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + DEADLINE
    reports = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            pytest.fail(f"rank {r} of {scenario} on {backend} hung past {DEADLINE:g} s")
        if p.returncode != 0:
            pytest.fail(f"rank {r} of {scenario} on {backend} exited with {p.returncode} (a crash is negative):\n"
                        f"{err[-4000:]}")
        lines = [ln for ln in out.splitlines() if ln.startswith("MDREPORT ")]
        assert lines, f"rank {r} printed no report:\n{err[-3000:]}"
        reports.append(json.loads(lines[-1][len("MDREPORT "):]))
    return reports


# which steps must fail on every rank, and which must work (after a failure, the group still works)
_GOOD = ("after shape", "after op", "after kinds", "after refusal", "reversed view", "final")


@pytest.mark.parametrize(("backend", "world"), [("numpy", 3), ("torch", 2)], ids=["numpy-3ranks", "torch-2ranks"])
def test_mismatches_raise_typed_errors_on_every_rank(backend: str, world: int) -> None:
    need_gloo()
    _check_mismatch_reports(_launch(backend, "mismatch", world))


@pytest.mark.gpu
@pytest.mark.parametrize("pg", ["nccl", "cpu:gloo,cuda:nccl"])
def test_mismatches_over_nccl(pg: str) -> None:
    """The same scenario with CUDA tensors, one GPU per rank, the exchange over NCCL (or gloo)."""
    need_gloo()
    import torch
    import torch.distributed as tdist

    if torch.cuda.device_count() < 2 or not tdist.is_nccl_available():
        pytest.skip("needs 2 CUDA GPUs and NCCL")
    _check_mismatch_reports(_launch("torch", "mismatch", 2, MD_ADV_DEVICE="gpu", MD_ADV_PG=pg))


def _check_mismatch_reports(reports: list[dict[str, Any]]) -> None:
    steps = [s["step"] for s in reports[0]["steps"]]
    assert len(steps) >= 20, steps
    for r, rep in enumerate(reports):
        assert [s["step"] for s in rep["steps"]] == steps, f"rank {r} ran other steps"
        for s in rep["steps"]:
            if s["step"] in _GOOD:
                assert s["outcome"] == "ok" and s.get("right") and s.get("type_ok") and s.get("device_ok"), (r, s)
            else:
                assert s["outcome"] != "ok", f"rank {r}: {s['step']} succeeded on mismatched ranks"
                assert s["typed"], f"rank {r}: {s['step']} raised an untyped {s['outcome']}: {s['message']}"
                assert s["elapsed"] < TIMEOUT, f"rank {r}: {s['step']} waited for a timeout instead of the check"
    # the ranks whose own input was fine name the other rank; mismatches are reported everywhere
    for step in ("shape (2,3) vs (3,2)", "dtype float32 vs float64", "op sum vs max", "allreduce vs broadcast",
                 "broadcast length 4 vs 6", "barrier vs allreduce"):
        outs = [next(s for s in rep["steps"] if s["step"] == step) for rep in reports]
        assert all(o["mismatch"] for o in outs), (step, outs)
        assert all("rank 0" in o["message"] and "rank 1" in o["message"] for o in outs), (step, outs)


def test_checks_can_be_turned_off() -> None:
    """With check=False no exchange runs: gloo itself lets (2, 3) vs (3, 2) through (same byte count),
    which is what the checks exist to catch; the group keeps working."""
    need_gloo()
    reports = _launch("numpy", "unchecked", 2)
    for rep in reports:
        first, after = rep["steps"][0], rep["steps"][1]
        assert first["outcome"] == "ok", first
        assert after["outcome"] == "ok" and after["right"], after


def test_job_without_shutdown_exits_cleanly_under_torchrun(tmp_path: Path) -> None:
    """A torchrun job whose script ends without shutdown(): every rank exits 0 (torch.distributed
    alone aborted a rank at exit in about a third of such runs), and no rank tries to bind torchrun's
    store port (the "[c10d] server socket ... has failed to bind" message)."""
    need_gloo()
    for attempt in range(3):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3", f"--master_port={_port()}",
               str(HERE / "_ranks.py"), "numpy", "no_shutdown", str(TIMEOUT)]
        env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE, env=env)
        text = p.stdout + p.stderr
        assert p.returncode == 0, f"run {attempt}: torchrun exited {p.returncode}:\n{text[-4000:]}"
        assert "terminate called" not in text and "SIGABRT" not in text, text[-4000:]
        assert "failed to bind" not in text, text[-4000:]
        assert text.count('"outcome": "ok"') == 3, text[-4000:]
