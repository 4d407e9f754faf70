"""The engines' own fault path: a peer killed between two collectives with the consistency checks
off (``init(check=False)``), so that no exchange through the engine's side channel finds the dead
rank first: the survivor's next collective goes straight into the transport, and the failure comes
from the transport itself (gloo's ``RuntimeError``,
MPI's error or its deadline, JAX's runtime): the survivors must get
:class:`~multidev.errors.DistributedTimeoutError`, within the group's timeout, never the
framework's raw exception nor another typed error, and the group is unusable afterwards (a clear
:class:`~multidev.errors.DistributedError` naming the earlier failure, no hang).

Run once per engine (with ``--multiprocess``), with the first selected backend's tensors: it tests
the engine, not the tensors. The workers are this module run as a script, launched as
``test_distributed``'s are.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

import numpy as np
import pytest

from multidev.distributed import engine_names
from multidev.distributed.engine import engine_class

from .test_distributed import KILL_TIMEOUT, SLACK, WORKER_TIMEOUT, launch_group, need_engine, worker_env

pytestmark = [pytest.mark.md_feature("distributed"), pytest.mark.multiprocess]

#: Elements of the tensor of the collective the survivor is in when the transport finds its peer
#: gone (gloo sends it in pieces).
IN_FLIGHT = 1 << 20


def _world(engine: str) -> int:
    """3 ranks where the engine runs 3 (a survivor whose neighbour is the other survivor), else 2."""
    return 3 if 3 in engine_class(engine).conformance_worlds else 2


def _first_selected(name: str) -> bool:
    """Whether ``name`` is the first backend of this suite run (the engine's checks run once)."""
    from .plugin import selected_backends

    return (selected_backends() or [name])[0] == name


@pytest.mark.timing
@pytest.mark.parametrize("engine", engine_names())
def test_peer_killed_with_checks_off_gives_a_timeout_error(md_backend: Any, engine: str) -> None:
    """With the checks off, the last rank dies (``os._exit``) after a first allreduce; the others'
    next allreduce (of a large tensor) raises DistributedTimeoutError (the engine's translation of
    its transport's failure: gloo's RuntimeError, MPI's error or deadline) within the timeout,
    and the collective after it a DistributedError saying the group failed earlier. 3 processes
    where the engine runs 3 (Open MPI's launcher ends a 2-process job whose other rank died)."""
    need_engine(engine)
    if not _first_selected(md_backend.name):
        pytest.skip("engine-level (the tensor's backend plays no part): runs once, with the first selected backend")
    from .plugin import imports_of, spec_of

    cls = engine_class(engine)
    extra = {"MULTIDEV_CONFORMANCE_IMPORT": ",".join(imports_of()), "MULTIDEV_JAX_CPU_DEVICES": "2"}
    argv = [sys.executable, "-m", "multidev.conformance.test_fault_paths", spec_of(md_backend.name),
            str(KILL_TIMEOUT), engine]
    world = _world(engine)
    reports = launch_group(engine, world, argv, env=worker_env(**extra), recovery=True,
                           what=f"{md_backend.name}/a killed peer with the checks off ({cls.__name__})")
    for rep in reports[:-1]:
        r = rep["rank"]
        if rep.get("rc") != 0 or not rep.get("ok"):
            pytest.fail(f"rank {r} exited with {rep.get('rc')}:\n{rep.get('failure', '')}\n"
                        f"{rep.get('err', '')[-4000:]}")
        assert rep["first"] == "ok", f"rank {r}: the first allreduce (every rank alive, checks off) failed: {rep}"
        assert rep["outcome"] == "DistributedTimeoutError", (
            f"a peer killed (checks off) gave rank {r} {rep['outcome']}, not DistributedTimeoutError: {rep['message']}")
        assert rep["elapsed"] < KILL_TIMEOUT + SLACK, rep
        assert rep["after"] == "DistributedError" and "failed earlier" in rep["after_message"], (
            f"rank {r}, the collective after the failure: {rep['after']}: {rep['after_message']} (the group must be "
            "unusable, with an error saying why)")


def _worker(backend: str, timeout: float) -> dict[str, Any]:
    """A survivor's report (the last rank dies after the first allreduce)."""
    import importlib

    import multidev as md
    from multidev import distributed as dist
    from multidev.registry import prefer

    for mod in filter(None, os.environ.get("MULTIDEV_CONFORMANCE_IMPORT", "").split(",")):
        importlib.import_module(mod)  # adapters (and an engine mutant) registered at run time, as in the parent
    dist.init(timeout=timeout, rendezvous_timeout=max(timeout, WORKER_TIMEOUT), check=False)
    b = md.backend(backend)
    r, w = dist.rank(), dist.world_size()
    out: dict[str, Any] = {"rank": r}
    with prefer(b.name):
        dev = b.devices()[0]
        small = md.asarray(np.full((4,), r + 1.0, np.float32), device=dev, backend=b.name)
        got = np.asarray(md.to_numpy(dist.allreduce(small)), dtype=np.float64)
        out["first"] = "ok" if np.allclose(got, w * (w + 1) / 2) else f"wrong values {got.tolist()}"
        big = md.asarray(np.full((IN_FLIGHT,), r + 1.0, np.float32), device=dev, backend=b.name)
        if r == w - 1:
            os._exit(17)  # dies without a word to the others
        t0 = time.monotonic()
        try:
            dist.allreduce(big)
            out.update(outcome="ok", message="the allreduce with a dead peer returned")
        except Exception as e:  # noqa: BLE001 - which exception escapes is the finding
            out.update(outcome=type(e).__name__, typed=isinstance(e, md.MultidevError),
                       message=f"{type(e).__module__}.{type(e).__name__}: {str(e)[:600]}")
        out["elapsed"] = time.monotonic() - t0
        try:
            dist.allreduce(small)
            out.update(after="ok", after_message="a broken group accepted another allreduce")
        except Exception as e:  # noqa: BLE001
            out.update(after=type(e).__name__, after_message=str(e)[:600])
    dist.shutdown()
    return out


if __name__ == "__main__":
    rc, rank, report = 1, 0, {}
    try:
        from multidev.distributed import detect_launch

        found = detect_launch()
        rank = int(found[0].rank or 0) if found else 0
        report = _worker(sys.argv[1], float(sys.argv[2]))
        rc = 0
    except BaseException:  # reported to the parent, then raised
        report = {"rank": rank, "failure": traceback.format_exc()[-3000:]}
        raise
    finally:
        print("MDREPORT " + json.dumps({**report, "rank": rank, "ok": rc == 0}, default=str), flush=True)
        print(f"MDDONE {rank} {rc}", flush=True)
    sys.exit(rc)
