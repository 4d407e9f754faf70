"""Multi-process collectives (multidev.distributed over torch.distributed/gloo) on localhost.

Each test starts 2 to 4 worker processes (this module run as a script) for the backend under test;
the workers run the scenarios below on that backend's tensors and report through their exit status
and one JSON line. Marked ``multiprocess``: ``multidev conformance --multiprocess`` runs them.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ._helpers import need_gloo

pytestmark = [pytest.mark.md_feature("distributed"), pytest.mark.multiprocess]

#: Seconds a group of workers may take (startup of the heaviest framework included).
GROUP_DEADLINE = 90.0
#: torch.distributed timeout the workers use for rendezvous and collectives.
WORKER_TIMEOUT = 20.0
#: The kill test's timeout: a rank whose neighbour (not the dead rank) waits on it may need all of it.
KILL_TIMEOUT = 5.0
#: The short timeout of the hang and no-show tests.
SHORT_TIMEOUT = 3.0


# == parent side ===================================================================================
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(backend: str, world: int, scenario: str, timeout: float, ranks: list[int] | None = None) -> list[dict]:
    """Run ``scenario`` on ``world`` ranks (only ``ranks`` are started when given); return each
    started rank's report (``rc``, ``out``, ``err``, and the JSON it printed). The workers load the
    backend as this run selected it (``module:attr`` included, with this process's ``sys.path``)."""
    from .plugin import imports_of, spec_of

    spec = spec_of(backend)
    port = _free_port()
    procs = []
    for r in (ranks if ranks is not None else range(world)):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONWARNINGS="ignore",
                   TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                   MULTIDEV_CONFORMANCE_IMPORT=",".join(imports_of()),
                   # several JAX processes share a GPU: none may take 75% of its memory at start
                   XLA_PYTHON_CLIENT_PREALLOCATE=os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false"))
        cmd = [sys.executable, "-m", "multidev.conformance.test_distributed", spec, scenario, str(timeout)]
        procs.append((r, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True)))
    deadline = time.monotonic() + GROUP_DEADLINE
    reports = []
    for r, p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for _, q in procs:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
            pytest.fail(f"rank {r} of {backend}/{scenario} did not finish within {GROUP_DEADLINE:g} s "
                        f"(a hang):\n{err[-3000:]}")
        rep: dict[str, Any] = {"rank": r, "rc": p.returncode, "out": out, "err": err}
        for line in out.splitlines():
            if line.startswith("MDREPORT "):
                rep.update(json.loads(line[len("MDREPORT "):]))
        reports.append(rep)
    return reports


def _assert_ok(reports: list[dict], expect_rc: dict[int, int] | None = None) -> None:
    for rep in reports:
        want = (expect_rc or {}).get(rep["rank"], 0)
        if rep["rc"] != want or (want == 0 and not rep.get("ok")):
            pytest.fail(f"rank {rep['rank']} exited with {rep['rc']} (expected {want}):\n"
                        f"{rep.get('failures') or ''}\n{rep['err'][-4000:]}")


def _first_selected(name: str) -> bool:
    """Whether ``name`` is the first backend of this suite run. Tests of the transport alone, and
    the larger worlds, run once per suite run rather than once per backend (a process pool of
    framework imports is slow); which backend carries them does not matter."""
    from .plugin import selected_backends

    return (selected_backends() or [name])[0] == name


def _worlds(name: str) -> list[int]:
    return [2, 3, 4] if _first_selected(name) else [2, 3]


@pytest.mark.parametrize("world", [2, 3, 4], ids=lambda w: f"{w}procs")
def test_collectives_across_processes(md_backend: Any, world: int) -> None:
    """Every collective, op and the async variants, on the backend's tensors, over 2-4 processes."""
    need_gloo()
    if world not in _worlds(md_backend.name):
        pytest.skip(f"{world} processes run with the first selected backend only (keeps the suite fast)")
    reports = _launch(md_backend.name, world, "collectives", WORKER_TIMEOUT)
    _assert_ok(reports)
    paths = {rep["rank"]: rep.get("paths") for rep in reports}
    if md_backend.capabilities.dlpack:
        assert all(p and p["to_torch"] in ("dlpack", "native") for p in paths.values()), \
            f"{md_backend.name} tensors (capabilities.dlpack) must reach torch without a copy: {paths}"


def test_killed_rank_gives_the_others_a_timeout_error(md_backend: Any) -> None:
    """The last rank dies (os._exit) after a first allreduce; the others get DistributedTimeoutError
    from their next allreduce instead of hanging. 3 processes with the first selected backend (a
    survivor that waits on the other survivor, not on the dead rank, needs the timeout), 2 with the
    others."""
    need_gloo()
    world = 3 if _first_selected(md_backend.name) else 2
    reports = _launch(md_backend.name, world, "kill", KILL_TIMEOUT)
    _assert_ok(reports, {world - 1: 17})
    for rep in reports[:-1]:
        assert rep["elapsed"] < KILL_TIMEOUT + 10, rep


def test_hung_rank_gives_the_others_a_timeout_error(md_backend: Any) -> None:
    """Rank 1 of 2 stays alive but never calls the collective: rank 0 times out after the timeout."""
    need_gloo()
    if not _first_selected(md_backend.name):
        pytest.skip("transport-level (the tensor's backend plays no part): runs once, with the first selected backend")
    reports = _launch(md_backend.name, 2, "hang", SHORT_TIMEOUT)
    _assert_ok(reports)
    assert SHORT_TIMEOUT - 0.5 <= reports[0]["elapsed"] < SHORT_TIMEOUT + 15, reports[0]


def test_rank_that_never_arrives_fails_init_with_a_timeout(md_backend: Any) -> None:
    """Only rank 0 of 2 starts: init raises DistributedTimeoutError after the timeout."""
    need_gloo()
    if not _first_selected(md_backend.name):
        pytest.skip("transport-level (the tensor's backend plays no part): runs once, with the first selected backend")
    reports = _launch(md_backend.name, 2, "noshow", SHORT_TIMEOUT, ranks=[0])
    _assert_ok(reports)
    assert reports[0]["elapsed"] < SHORT_TIMEOUT + 15, reports[0]


def test_calls_before_init_raise(md_backend: Any) -> None:
    need_gloo()
    import multidev as md
    from multidev import distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    x = md.ones(3, backend=md_backend.name)
    with pytest.raises(dist.DistributedError, match="init"):
        dist.allreduce(x)
    with pytest.raises(dist.DistributedError, match="init"):
        dist.rank()


# == worker side ===================================================================================
class _Checks:
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.paths: dict[str, str] = {}

    def run(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - every failure is reported
            self.failures.append(f"[{name}] {traceback.format_exc()}")


def _worker(backend: str, scenario: str, timeout: float) -> int:
    import importlib

    import torch  # noqa: F401  # import everything before the rendezvous so ranks arrive together

    import multidev as md
    from multidev.registry import prefer

    for mod in filter(None, os.environ.get("MULTIDEV_CONFORMANCE_IMPORT", "").split(",")):
        importlib.import_module(mod)  # adapters registered at run time, as in the parent
    b = md.backend(backend)  # a registered name, module:attr or FAMILY:ARG (the spec the parent selected)
    backend = b.name
    with prefer(backend):  # a renamed or mutated copy of an adapter owns its tensors here
        return _scenario(b, backend, scenario, timeout)


def _scenario(b: Any, backend: str, scenario: str, timeout: float) -> int:
    import multidev as md
    from multidev import distributed as dist
    from multidev.errors import CapabilityError, CollectiveInputError

    r, w = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    devs = b.devices()
    dev = devs[(r + 1) % len(devs)]  # results must come back to a device other than the first
    report: dict[str, Any] = {}
    t0 = time.monotonic()
    if scenario == "noshow":
        try:
            dist.init(timeout=timeout)  # the rendezvous timeout defaults to the same
        except dist.DistributedTimeoutError:
            report.update(ok=True, elapsed=time.monotonic() - t0)
            print("MDREPORT " + json.dumps(report), flush=True)
            return 0
        print("init did not raise DistributedTimeoutError", file=sys.stderr)
        return 1
    dist.init(timeout=timeout, rendezvous_timeout=max(timeout, WORKER_TIMEOUT))  # slow imports arrive

    def arr(a: Any, dtype: str = "float32", device: Any = None) -> Any:
        return md.asarray(a, dtype=dtype, device=dev if device is None else device, backend=backend)

    def host(x: Any) -> np.ndarray:
        return np.asarray(b.to_numpy(x)).astype(np.float64)

    def same(y: Any, expect: Any, dtype: str = "float32", device: Any = None, rtol: float = 1e-6) -> None:
        assert isinstance(y, b.tensor_types()), f"{type(y)} is not a {backend} tensor"
        assert md.device_of(y) == (dev if device is None else device), f"{md.device_of(y)} != {dev}"
        assert md.dtype_of(y) == dtype, f"{md.dtype_of(y)} != {dtype}"
        np.testing.assert_allclose(host(y), expect, rtol=rtol, atol=rtol)

    if scenario == "kill":
        x = arr(np.full((4,), r + 1.0, np.float32))
        same(dist.allreduce(x), np.full((4,), w * (w + 1) / 2))
        if r == w - 1:
            os._exit(17)  # dies without a word to the others
        t0 = time.monotonic()
        try:
            dist.allreduce(x)
        except dist.DistributedTimeoutError:
            pass
        else:
            raise AssertionError("allreduce with a dead peer did not raise DistributedTimeoutError")
        report["elapsed"] = time.monotonic() - t0
        try:
            dist.allreduce(x)  # the group is broken now: a clear error, no hang
        except dist.DistributedError as e:
            assert "shutdown" in str(e)
        else:
            raise AssertionError("a broken group accepted another allreduce")
        dist.shutdown()
        report["ok"] = True
        print("MDREPORT " + json.dumps(report), flush=True)
        return 0

    if scenario == "hang":
        if r == 1:
            time.sleep(timeout + 3)  # alive, but never joins the collective
            dist.shutdown()
            print("MDREPORT " + json.dumps({"ok": True}), flush=True)
            return 0
        x = arr(np.ones((3,), np.float32))
        t0 = time.monotonic()
        h = dist.allreduce(x, async_op=True)
        try:
            h.wait()
        except dist.DistributedTimeoutError:
            pass
        else:
            raise AssertionError("allreduce with a hung peer did not raise DistributedTimeoutError")
        report.update(ok=True, elapsed=time.monotonic() - t0)
        dist.shutdown()
        print("MDREPORT " + json.dumps(report), flush=True)
        return 0

    # scenario == "collectives"
    c = _Checks()
    vals = [np.arange(24, dtype=np.float64).reshape(4, 6) / 8 - k for k in range(w)]  # exact in fp16/bf16
    mine = vals[r]
    refs: dict[str, Any] = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}

    def ops() -> None:
        for op, ref in refs.items():
            x = arr(mine.astype(np.float32))
            y = dist.allreduce(x, op=op)
            same(y, ref(np.stack(vals), axis=0), rtol=1e-5)
            np.testing.assert_array_equal(host(x), mine)  # out of place
            if op != "mean":
                xi = arr((np.arange(6) % 3 + r).astype(np.int32), "int32")
                same(dist.allreduce(xi, op=op), ref(np.stack([np.arange(6) % 3 + k for k in range(w)]), axis=0),
                     "int32", rtol=0)
        try:
            dist.allreduce(arr(np.ones(2, np.int32), "int32"), op="mean")
        except CollectiveInputError:
            pass
        else:
            raise AssertionError("mean of int32 must raise CollectiveInputError")

    def dtypes() -> None:
        every = [devs[(k + 1) % len(devs)] for k in range(w)]  # each rank's device: all ranks agree on the list
        for dtype in [d for d in ("float16", "bfloat16", "float64", "int64", "uint8")
                      if all(d in b.capabilities.dtypes_on(v) for v in every)]:
            a = np.abs(mine) if dtype == "uint8" else mine
            a = np.floor(a) if dtype.startswith(("int", "uint")) else a
            y = dist.allreduce(arr(a, dtype))
            expect = np.sum(np.stack([np.floor(np.abs(v)) if dtype == "uint8" else
                                      np.floor(v) if dtype.startswith("int") else v for v in vals]), axis=0)
            same(y, expect, dtype, rtol=1e-2 if dtype in ("float16", "bfloat16") else 1e-6)
        s = dist.allreduce(arr(np.float32(r + 1.0)))  # 0-d
        same(s, np.float64(w * (w + 1) / 2))
        e = dist.allreduce(arr(np.zeros((0, 3), np.float32)))  # empty
        same(e, np.zeros((0, 3)))
        bl = dist.allreduce(arr(np.array([r == 0, False, True]), "bool"), op="max")
        same(bl, np.array([1.0, 0.0, 1.0]), "bool")

    def inplace() -> None:
        x = arr(mine.astype(np.float32))
        if not b.capabilities.mutable:
            try:
                dist.allreduce(x, inplace=True)
            except CapabilityError:
                np.testing.assert_array_equal(host(x), mine)
                return
            raise AssertionError("inplace=True on an immutable backend must raise CapabilityError")
        y = dist.allreduce(x, op="sum", inplace=True)
        assert y is x
        same(x, np.sum(np.stack(vals), axis=0))
        z = arr(mine.astype(np.float32))
        assert dist.broadcast(z, src=w - 1, inplace=True) is z
        same(z, vals[w - 1])

    def broadcast_reduce() -> None:
        x = arr(mine.astype(np.float32))
        same(dist.broadcast(x, src=w - 1), vals[w - 1])
        np.testing.assert_array_equal(host(x), mine)
        y = dist.reduce(x, dst=0, op="max")
        if r == 0:
            same(y, np.max(np.stack(vals), axis=0))
        else:
            assert y is None

    def gathers() -> None:
        pieces = [np.full((k + 1, 3), k, np.float64) for k in range(w)]  # uneven lengths
        x = arr(pieces[r].astype(np.float32))
        same(dist.allgather(x), np.concatenate(pieces))
        xt = arr(pieces[r].T.astype(np.float32))
        same(dist.allgather(xt, axis=1), np.concatenate([p.T for p in pieces], axis=1))
        g = dist.gather(x, dst=w - 1)
        if r == w - 1:
            same(g, np.concatenate(pieces))
        else:
            assert g is None

    def scatters() -> None:
        full = np.stack([vals[k][:, :5] for k in range(w)])  # (w, 4, 5)
        x = arr(full[r].astype(np.float32))  # (4, 5): 5 columns over w ranks -> uneven
        y = dist.reduce_scatter(x, op="sum", axis=1)
        same(y, np.array_split(np.sum(full, axis=0), w, axis=1)[r])
        y0 = dist.reduce_scatter(x, op="max", axis=0)
        same(y0, np.array_split(np.max(full, axis=0), w, axis=0)[r])
        src = np.arange(7 * 2, dtype=np.float32).reshape(7, 2)
        if r == 0:
            p = dist.scatter(arr(src), src=0)
        else:
            p = dist.scatter(None, src=0, backend=backend, device=dev)
        same(p, np.array_split(src, w)[r])

    def asynchronous() -> None:
        x = arr(mine.astype(np.float32))
        h1 = dist.allreduce(x, op="sum", async_op=True)
        h2 = dist.allgather(x, async_op=True)
        assert isinstance(h1, dist.Work) and isinstance(h2, dist.Work)
        same(h2.wait(), np.concatenate(vals))
        same(h1.wait(), np.sum(np.stack(vals), axis=0))
        assert h1.is_completed() and h1.wait() is h1.wait()
        same(dist.broadcast(x, src=0, async_op=True).wait(), vals[0])
        same(dist.reduce_scatter(x, async_op=True).wait(), np.array_split(np.sum(np.stack(vals), axis=0), w)[r])
        dist.barrier()

    def transfer_paths() -> None:
        c.paths["to_torch"] = dist.transport_path(arr(mine.astype(np.float32)))
        assert dist.rank() == r and dist.world_size() == w

    for name, fn in (("ops", ops), ("dtypes", dtypes), ("inplace", inplace),
                     ("broadcast_reduce", broadcast_reduce), ("gathers", gathers), ("scatters", scatters),
                     ("async", asynchronous), ("paths", transfer_paths)):
        c.run(name, fn)
    dist.shutdown()
    report.update(ok=not c.failures, failures="\n".join(c.failures), paths=c.paths)
    print("MDREPORT " + json.dumps(report), flush=True)
    return 0 if not c.failures else 1


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1], sys.argv[2], float(sys.argv[3])))
