"""Mismatched ranks under multidev.distributed (2-3 processes on localhost of every engine, each with a
deadline): every mismatch raises a typed error on every rank, none aborts, the group stays usable;
the check can be turned off; a job that never calls shutdown() exits 0 on every rank under its
launcher (torchrun, mpiexec, JAX's variables).
"""
from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from multidev.conformance.test_distributed import engine_unavailable, launch_group, worker_env

pytestmark = [pytest.mark.multiprocess, pytest.mark.timing]

HERE = Path(__file__).resolve().parent
#: Seconds a group of ranks may take, framework imports included.
DEADLINE = 240.0
#: The workers' timeout: a rank left waiting raises within it.
TIMEOUT = 20.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _need(engine: str) -> None:
    why = engine_unavailable(engine)
    if why:
        pytest.skip(why)


def _launch(backend: str, scenario: str, world: int, engine: str = "torch", **extra: str) -> list[dict[str, Any]]:
    env = worker_env(**extra)
    if engine == "jax":
        env["MULTIDEV_JAX_CPU_DEVICES"] = "2"
    argv = [sys.executable, str(HERE / "_ranks.py"), backend, scenario, str(TIMEOUT)]
    reports = launch_group(engine, world, argv, env=env, deadline=DEADLINE, what=f"{scenario} on {backend}")
    for rep in reports:
        if rep["rc"] != 0:
            pytest.fail(f"rank {rep['rank']} of {scenario} on {backend} ({engine} engine) exited with {rep['rc']} "
                        f"(a crash is negative):\n{rep.get('err', '')[-4000:]}")
        assert "steps" in rep, f"rank {rep['rank']} printed no report:\n{rep.get('err', '')[-3000:]}"
    return reports


# which steps must fail on every rank, and which must work (after a failure, the group still works)
_GOOD = ("after shape", "after op", "after kinds", "after refusal", "reversed view", "final")


@pytest.mark.parametrize(("backend", "world", "engine"),
                         [("numpy", 3, "torch"), ("torch", 2, "torch"), ("numpy", 3, "mpi"), ("numpy", 2, "jax")],
                         ids=["numpy-3ranks-torch", "torch-2ranks-torch", "numpy-3ranks-mpi", "numpy-2ranks-jax"])
def test_mismatches_raise_typed_errors_on_every_rank(backend: str, world: int, engine: str) -> None:
    _need(engine)
    if backend != "numpy" and importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed here")
    _check_mismatch_reports(_launch(backend, "mismatch", world, engine))


@pytest.mark.gpu
@pytest.mark.parametrize("pg", ["nccl", "cpu:gloo,cuda:nccl"])
def test_mismatches_over_nccl(pg: str) -> None:
    """The same scenario with CUDA tensors, one GPU per rank, NCCL (or gloo) carrying them."""
    _need("torch")
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
    for step in ("shape (2,3) vs (3,2)", "dtype float32 vs other", "op sum vs max", "allreduce vs broadcast",
                 "broadcast length 4 vs 6", "barrier vs allreduce"):
        outs = [next(s for s in rep["steps"] if s["step"] == step) for rep in reports]
        assert all(o["mismatch"] for o in outs), (step, outs)
        assert all("rank 0" in o["message"] and "rank 1" in o["message"] for o in outs), (step, outs)


def test_checks_can_be_turned_off() -> None:
    """With check=False no exchange runs: gloo itself lets (2, 3) vs (3, 2) through (same byte count),
    which is what the checks exist to catch; the group keeps working."""
    _need("torch")
    reports = _launch("numpy", "unchecked", 2)
    for rep in reports:
        first, after = rep["steps"][0], rep["steps"][1]
        assert first["outcome"] == "ok", first
        assert after["outcome"] == "ok" and after["right"], after


def test_job_without_shutdown_exits_cleanly_under_torchrun(tmp_path: Path) -> None:
    """A torchrun job whose script ends without shutdown(): every rank exits 0 (torch.distributed
    alone aborted a rank at exit in about a third of such runs), and no rank tries to bind torchrun's
    store port (the "[c10d] server socket ... has failed to bind" message)."""
    _need("torch")
    for attempt in range(3):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3", f"--master_port={_port()}",
               str(HERE / "_ranks.py"), "numpy", "no_shutdown", str(TIMEOUT)]
        env = worker_env()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE, env=env)
        text = p.stdout + p.stderr
        assert p.returncode == 0, f"run {attempt}: torchrun exited {p.returncode}:\n{text[-4000:]}"
        assert "terminate called" not in text and "SIGABRT" not in text, text[-4000:]
        assert "failed to bind" not in text, text[-4000:]
        assert text.count('"outcome": "ok"') == 3, text[-4000:]


@pytest.mark.parametrize("engine", ["mpi", "jax"])
def test_job_without_shutdown_exits_cleanly_under_its_launcher(engine: str) -> None:
    """The same under mpiexec (the engine finalizes MPI at exit: a rank that exits without
    MPI_Finalize fails the whole job) and as JAX processes: every rank exits 0, the launcher too."""
    _need(engine)
    from multidev.distributed.launch import start

    argv = [sys.executable, str(HERE / "_ranks.py"), "numpy", "no_shutdown", str(TIMEOUT)]
    env = worker_env(MULTIDEV_JAX_CPU_DEVICES="2")
    procs = start(engine, 3, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    texts = []
    for p in procs:
        out, err = p.communicate(timeout=DEADLINE)
        texts.append(out + err)
        assert p.returncode == 0, f"{engine}: exit status {p.returncode}:\n{(out + err)[-4000:]}"
    text = "\n".join(texts)
    assert text.count('"outcome": "ok"') == 3, text[-4000:]
    assert "Aborted" not in text and "terminate called" not in text, text[-4000:]
