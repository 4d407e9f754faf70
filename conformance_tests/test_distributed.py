"""Multi-process collectives (multidev.distributed) on localhost, on every installed engine.

Each test starts 2 to 4 worker processes (this module run as a script) for the backend under test,
through the engine's own launch: torchrun's variables for ``torch``, ``mpiexec`` for ``mpi``, JAX's
coordinator variables for ``jax`` (2 processes x 2 CPU devices). The workers pick the engine from
that environment (``dist.init()`` with no engine named), run the scenarios below on the backend's
tensors and report one JSON line each. Marked ``multiprocess``: ``multidev conformance
--multiprocess`` runs them.

The fault scenarios (a killed rank, a rank that never arrives, mismatched and refused calls followed
by a hung rank in one launch) run once per engine, with the first selected backend: they test the
engine, not the tensors.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from multidev.distributed.engine import engine_class

pytestmark = [pytest.mark.md_feature("distributed"), pytest.mark.multiprocess]

#: Seconds a group of workers may take (startup of the heaviest framework included).
GROUP_DEADLINE = 120.0
#: The timeout the workers use for rendezvous and collectives.
WORKER_TIMEOUT = 20.0
#: The kill test's timeout: a rank whose neighbour (not the dead rank) waits on it may need all of it.
KILL_TIMEOUT = 5.0
#: The short timeout of the hang and no-show tests.
SHORT_TIMEOUT = 3.0
#: Seconds past a timeout a waiting rank may take to raise (process start-up, a loaded machine):
#: this bounds a hang, it is not a performance goal (the bench times time-to-error).
SLACK = 15.0
#: Launcher variables of every engine: a worker must see only its own engine's.
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                "JAX_PROCESS_ID", "MULTIDEV_ENGINE", "MULTIDEV_LOCAL_RANK", "MULTIDEV_LOCAL_WORLD_SIZE",
                "MULTIDEV_DISTRIBUTED_CHECK")
_LAUNCH_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "MV2_", "PRTE_")


# == parent side ===================================================================================
@functools.cache
def engine_unavailable(engine: str) -> str | None:
    """Why ``engine`` cannot run here (None: it can), as a skip reason."""
    cls = engine_class(engine)
    why = cls.missing()
    if why:
        return f"the {engine} engine is not installed here: {why}"
    try:
        cls.launch_command(1, ["true"])
    except Exception as e:  # noqa: BLE001 - no launcher: the reason
        return f"the {engine} engine has no launcher here: {e}"
    return None


def need_engine(engine: str, backend: str | None = None) -> None:
    why = engine_unavailable(engine) or _not_selected(engine, backend)
    if why:
        pytest.skip(why)


#: Which engines run, and with which backends' tensors their collectives run: ``torch,jax=jax+mxnet``
#: runs the torch engine with every selected backend and the jax engine with JAX's and MXNet's
#: tensors only (its fault cases as always); unset: every installed engine with every backend.
ENGINES_ENV = "MULTIDEV_DISTRIBUTED_ENGINES"


def _engines() -> list[str]:
    from multidev.distributed import engine_names

    return engine_names()


def _selection() -> dict[str, set[str] | None] | None:
    raw = os.environ.get(ENGINES_ENV, "").strip()
    if not raw:
        return None
    out: dict[str, set[str] | None] = {}
    for item in filter(None, (v.strip() for v in raw.split(","))):
        name, _, backends = item.partition("=")
        out[name.strip()] = {b.strip() for b in backends.split("+") if b.strip()} if backends else None
    return out


def _not_selected(engine: str, backend: str | None = None) -> str | None:
    """Why ``$MULTIDEV_DISTRIBUTED_ENGINES`` leaves this engine (with this backend's tensors) out."""
    sel = _selection()
    if sel is None:
        return None
    if engine not in sel:
        return f"${ENGINES_ENV}={os.environ[ENGINES_ENV]} leaves the {engine} engine out"
    only = sel[engine]
    if backend is not None and only is not None and backend not in only:
        return (f"${ENGINES_ENV}={os.environ[ENGINES_ENV]} runs the {engine} engine's collectives with "
                f"{', '.join(sorted(only))} only")
    return None


def worker_env(**extra: str) -> dict[str, str]:
    """This process's environment without any launcher's variables, plus the workers' settings."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS and not k.startswith(_LAUNCH_PREFIXES)}
    env.update(PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               # several JAX processes share a GPU: none may take 75% of its memory at start
               XLA_PYTHON_CLIENT_PREALLOCATE=os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
               # the suite certifies the engine: its own consistency channel, not the core's shared-memory
               # mailbox that ranks on one host would use (multidev.distributed.mailbox)
               MULTIDEV_SHARED_EXCHANGE="0")
    env.update(extra)
    return env


def launch_group(engine: str, world: int, argv: list[str], *, env: dict[str, str], ranks: list[int] | None = None,
                 deadline: float = GROUP_DEADLINE, recovery: bool = False, what: str = "") -> list[dict[str, Any]]:
    """Run ``argv`` as ``world`` ranks of ``engine`` (only ``ranks`` where the engine starts ranks one
    by one); each rank's report: ``rank``, ``rc`` (None for a rank that died without a word), ``err``,
    and the JSON it printed as ``MDREPORT {...}``. A rank prints ``MDDONE RANK RC`` last (the MPI
    launcher merges the ranks' output and exit statuses). ``recovery``: the survivors of a killed rank
    keep running (``mpiexec --enable-recovery``)."""
    from multidev.distributed.launch import free_port

    cls = engine_class(engine)
    options = ["--enable-recovery"] if recovery else []
    cmd = cls.launch_command(world, argv, options)
    procs: list[tuple[int | None, subprocess.Popen]] = []
    if cmd is not None:
        procs.append((None, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    else:
        address = f"127.0.0.1:{free_port()}"
        for rk in (ranks if ranks is not None else range(world)):
            e = dict(env, **cls.launch_env(rk, world, address))
            procs.append((rk, subprocess.Popen(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    end = time.monotonic() + deadline
    outputs = []
    for r, p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            for _, q in procs:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
            pytest.fail(f"{what or argv[-3:]} on the {engine} engine did not finish within {deadline:g} s (a hang):\n"
                        f"{out[-2000:]}\n{err[-3000:]}")
        outputs.append((r, p.returncode, out, err))
    reports: dict[int, dict[str, Any]] = {}
    for r, rc, out, err in outputs:
        for line in out.splitlines():
            if line.startswith("MDREPORT "):
                rep = json.loads(line[len("MDREPORT "):])
                reports.setdefault(int(rep["rank"]), {}).update(rep)
            elif line.startswith("MDDONE "):
                _, who, code = line.split()
                reports.setdefault(int(who), {})["rc"] = int(code)
        if r is not None:
            reports.setdefault(r, {})["rc"] = rc
            reports[r]["err"] = err
    every = ranks if (ranks is not None and cmd is None) else list(range(world))
    out_all = "\n".join(o[3] for o in outputs)
    for r in every:
        reports.setdefault(r, {}).setdefault("rc", None)
        reports[r]["rank"] = r
        reports[r].setdefault("err", out_all)
    return [reports[r] for r in every]


def _launch(engine: str, backend: str, world: int, scenario: str, timeout: float, ranks: list[int] | None = None,
            recovery: bool = False) -> list[dict[str, Any]]:
    """Run ``scenario`` on ``world`` ranks of ``engine`` with ``backend``'s tensors. The workers load
    the backend as this run selected it (``module:attr`` included, with this process's ``sys.path``)."""
    from .plugin import imports_of, spec_of

    # JAX's CPU devices: 2 processes x 2 devices (whichever engine carries its arrays)
    extra = {"MULTIDEV_CONFORMANCE_IMPORT": ",".join(imports_of()), "MULTIDEV_JAX_CPU_DEVICES": "2"}
    argv = [sys.executable, "-m", "multidev.conformance.test_distributed", spec_of(backend), scenario, str(timeout),
            engine]
    return launch_group(engine, world, argv, env=worker_env(**extra), ranks=ranks, recovery=recovery,
                        what=f"{backend}/{scenario}")


def _assert_ok(reports: list[dict], expect_rc: dict[int, int | None] | None = None) -> None:
    for rep in reports:
        want = (expect_rc or {}).get(rep["rank"], 0)
        if want is None:
            continue
        if rep["rc"] != want or (want == 0 and not rep.get("ok")):
            pytest.fail(f"rank {rep['rank']} exited with {rep['rc']} (expected {want}):\n"
                        f"{rep.get('failures') or ''}\n{rep.get('err', '')[-4000:]}")


def _first_selected(name: str) -> bool:
    """Whether ``name`` is the first backend of this suite run. Tests of the engine alone, and the
    larger worlds, run once per suite run rather than once per backend (a process pool of framework
    imports is slow); which backend carries them does not matter."""
    from .plugin import selected_backends

    return (selected_backends() or [name])[0] == name


def _fault_world(engine: str) -> int:
    return max([w for w in engine_class(engine).conformance_worlds if w <= 3] or [2])


def _engine_param() -> Any:
    return pytest.mark.parametrize("engine", _engines())


@_engine_param()
@pytest.mark.parametrize("world", [2, 3, 4], ids=lambda w: f"{w}procs")
def test_collectives_across_processes(md_backend: Any, engine: str, world: int) -> None:
    """Every collective, op and the async variants, point-to-point messages (send/recv, the ring
    sendrecv, async sends, receives into ``out``), tensors laid out across the processes (placed,
    each rank's piece, gathered, built from pieces, changed layout: the framework's own sharded type
    where it has one for the engine), and, over 4 processes, the collectives along the axes of a
    2x2 process mesh (the engine's subgroups), on the backend's tensors, over 2-4 processes of every
    engine: values against NumPy, the input's backend, device and dtype kept."""
    need_engine(engine, md_backend.name)
    first = list(engine_class(engine).conformance_worlds)
    others = [w for w in first if w < 4] or first[:1]
    if world not in (first if _first_selected(md_backend.name) else others):
        pytest.skip(f"the {engine} engine runs {first} processes with the first selected backend and {others} with "
                    "the others (Engine.conformance_worlds: keeps the suite fast)")
    reports = _launch(engine, md_backend.name, world, "collectives", WORKER_TIMEOUT)
    _assert_ok(reports)
    assert all(rep.get("engine") == engine for rep in reports), [rep.get("engine") for rep in reports]
    paths = {rep["rank"]: rep.get("paths") for rep in reports}
    # zero-copy where the backend speaks DLPack, but for immutable tensors headed for NumPy (the MPI
    # engine's transport): NumPy would import their memory as a writable array, so the exchange layer
    # copies them (the engine writes into a copy anyway)
    if md_backend.dlpack is not None and (md_backend.capabilities.mutable or engine_class(engine).tensors != "numpy"):
        assert all(p and p["host"] in ("dlpack", "native") for p in paths.values()), \
            f"{md_backend.name} host tensors (it has a dlpack concern) must reach the {engine} engine uncopied: {paths}"


@_engine_param()
@pytest.mark.timing
def test_killed_rank_gives_the_others_a_timeout_error(md_backend: Any, engine: str) -> None:
    """The last rank dies (os._exit) after a first allreduce; the others get DistributedTimeoutError,
    naming it, from their next allreduce instead of hanging, and a clear error after. 3 processes
    where the engine runs 3 (a survivor that waits on the other survivor, not on the dead rank)."""
    need_engine(engine)
    if not _first_selected(md_backend.name):
        pytest.skip("engine-level (the tensor's backend plays no part): runs once, with the first selected backend")
    world = _fault_world(engine)
    reports = _launch(engine, md_backend.name, world, "kill", KILL_TIMEOUT, recovery=True)
    _assert_ok(reports, {world - 1: None})
    for rep in reports[:-1]:
        assert rep["elapsed"] < KILL_TIMEOUT + SLACK, rep
        assert f"rank {world - 1}" in rep["message"], rep["message"]


@_engine_param()
@pytest.mark.timing
def test_rank_that_never_arrives_fails_init_with_a_timeout(md_backend: Any, engine: str) -> None:
    """Rank 1 of 2 never calls init (it is not started, or under mpiexec it sleeps): rank 0's init
    raises DistributedTimeoutError after the timeout."""
    need_engine(engine)
    if not _first_selected(md_backend.name):
        pytest.skip("engine-level (the tensor's backend plays no part): runs once, with the first selected backend")
    reports = _launch(engine, md_backend.name, 2, "noshow", SHORT_TIMEOUT, ranks=[0])
    _assert_ok(reports, {1: None})
    assert reports[0]["elapsed"] < SHORT_TIMEOUT + SLACK, reports[0]


@functools.cache
def _fault_reports(engine: str, backend: str) -> list[dict[str, Any]]:
    """One launch for the calls the ranks disagree on, then a hung rank (it ends the group)."""
    return _launch(engine, backend, _fault_world(engine), "faults", WORKER_TIMEOUT)


@_engine_param()
@pytest.mark.timing
def test_mismatched_and_refused_calls_raise_on_every_rank(md_backend: Any, engine: str) -> None:
    """Shapes, ops and dtypes that differ between ranks, and a read-only tensor given to an in-place
    call on one rank: a typed error on every rank, at once (no timeout), the refused tensor unchanged,
    and the group still right afterwards."""
    need_engine(engine)
    if not _first_selected(md_backend.name):
        pytest.skip("engine-level (the tensor's backend plays no part): runs once, with the first selected backend")
    reports = _fault_reports(engine, md_backend.name)
    _assert_ok(reports)
    steps = [s["step"] for s in reports[0]["steps"]]
    assert len(steps) >= 9, steps
    for rep in reports:
        for s in rep["steps"]:
            if s["step"].startswith("after"):
                assert s["outcome"] == "ok" and s["right"], (rep["rank"], s)
            else:
                assert s["outcome"] != "ok", (rep["rank"], s)
                assert s["typed"], (rep["rank"], s)
                assert s["elapsed"] < WORKER_TIMEOUT, (rep["rank"], s)
                assert s.get("unchanged", True), (rep["rank"], s)
    for step in ("shape (2,3) vs (3,2)", "op sum vs max", "dtype float32 vs int32"):
        outs = [next(s for s in rep["steps"] if s["step"] == step) for rep in reports]
        assert all(o["outcome"] == "CollectiveMismatchError" for o in outs), (step, outs)
    ro = [next(s for s in rep["steps"] if s["step"] == "read-only inplace on rank 0") for rep in reports]
    assert ro[0]["outcome"] == "CapabilityError", ro
    assert all(o["outcome"] == "DistributedError" and "rank 0" in o["message"] for o in ro[1:]), ro


@_engine_param()
@pytest.mark.timing
def test_hung_rank_gives_the_others_a_timeout_error(md_backend: Any, engine: str) -> None:
    """After the mismatches (the same launch), the last rank stays alive but never calls the next
    collective: the others raise DistributedTimeoutError after the timeout (set_timeout, shorter than
    init's), naming that rank and the call."""
    need_engine(engine)
    if not _first_selected(md_backend.name):
        pytest.skip("engine-level (the tensor's backend plays no part): runs once, with the first selected backend")
    reports = _fault_reports(engine, md_backend.name)
    _assert_ok(reports)
    w = len(reports)
    for rep in reports[:-1]:
        assert SHORT_TIMEOUT - 0.5 <= rep["elapsed"] < SHORT_TIMEOUT + SLACK, rep
        assert f"rank {w - 1}" in rep["message"] and "allreduce" in rep["message"], rep["message"]


def test_calls_before_init_raise(md_backend: Any) -> None:
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


def _report(rank: int, **fields: Any) -> None:
    print("MDREPORT " + json.dumps({"rank": rank, **fields}, default=str), flush=True)


def _launcher_rank() -> int:
    """This worker's rank as its launcher says (before init)."""
    from multidev import distributed as dist

    found = dist.detect_launch()
    return int(found[0].rank or 0) if found else 0


def _worker(backend: str, scenario: str, timeout: float, engine: str) -> int:
    import importlib

    import multidev as md
    from multidev import distributed as dist

    r0 = _launcher_rank()
    t0 = time.monotonic()
    if scenario == "noshow":
        if r0 != 0:
            time.sleep(timeout + 2)  # under mpiexec every rank starts: this one never calls init
            return 0
        try:
            dist.init(timeout=timeout)  # the rendezvous timeout defaults to the same
        except dist.DistributedTimeoutError as e:
            _report(0, ok=True, elapsed=time.monotonic() - t0, message=str(e))
            return 0
        print("init did not raise DistributedTimeoutError", file=sys.stderr)
        return 1
    for mod in filter(None, os.environ.get("MULTIDEV_CONFORMANCE_IMPORT", "").split(",")):
        importlib.import_module(mod)  # adapters registered at run time, as in the parent
    # init first (JAX's runtime must start before JAX computes anything); a slow framework import
    # after it is covered by the collectives' timeout
    info = dist.init(timeout=timeout, rendezvous_timeout=max(timeout, WORKER_TIMEOUT))
    b = md.backend(backend)  # a registered name, module:attr or FAMILY:ARG (the spec the parent selected)
    from multidev.registry import prefer

    with prefer(b.name):  # a renamed or mutated copy of an adapter owns its tensors here
        return _scenario(b, b.name, scenario, timeout, info)


def _scenario(b: Any, backend: str, scenario: str, timeout: float, info: Any) -> int:
    import multidev as md
    from multidev import distributed as dist
    from multidev.errors import CapabilityError, CollectiveInputError

    r, w = dist.rank(), dist.world_size()
    assert info.engine == dist.engine_name()
    devs = b.devices()
    dev = devs[(r + 1) % len(devs)]  # results must come back to a device other than the first
    report: dict[str, Any] = {"engine": dist.engine_name()}

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
        except dist.DistributedTimeoutError as e:
            report["message"] = str(e)
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
        _report(r, ok=True, **report)
        return 0

    if scenario == "faults":
        return _faults(r, w, report)

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
            if not dist.carries(dtype, dev, backend=backend):  # the same answer on every rank
                try:
                    dist.allreduce(arr(a, dtype))
                except CapabilityError as e:
                    assert dist.engine_name() in str(e), e
                    continue
                raise AssertionError(f"the engine does not carry {dtype}, yet the allreduce did not raise")
            y = dist.allreduce(arr(a, dtype))
            expect = np.sum(np.stack([np.floor(np.abs(v)) if dtype == "uint8" else
                                      np.floor(v) if dtype.startswith("int") else v for v in vals]), axis=0)
            same(y, expect, dtype, rtol=1e-2 if dtype in ("float16", "bfloat16") else 1e-6)
        s = dist.allreduce(arr(np.float32(r + 1.0)))  # 0-d
        same(s, np.float64(w * (w + 1) / 2))
        empty = dist.allreduce(arr(np.zeros((0, 3), np.float32)))
        same(empty, np.zeros((0, 3)))
        bl = dist.allreduce(arr(np.array([r == 0, False, True]), "bool"), op="max")
        same(bl, np.array([1.0, 0.0, 1.0]), "bool")
        bm = dist.allreduce(arr(np.array([r == 0, False, True]), "bool"), op="min")
        same(bm, np.array([float(w == 1), 0.0, 1.0]), "bool")

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
        m = arr(mine.astype(np.float32))
        assert dist.allreduce(m, op="mean", inplace=True) is m
        same(m, np.mean(np.stack(vals), axis=0), rtol=1e-5)

    def broadcast_reduce() -> None:
        x = arr(mine.astype(np.float32))
        same(dist.broadcast(x, src=w - 1), vals[w - 1])
        np.testing.assert_array_equal(host(x), mine)
        y = dist.reduce(x, dst=0, op="max")
        if r == 0:
            same(y, np.max(np.stack(vals), axis=0))
        else:
            assert y is None
        ym = dist.reduce(x, dst=w - 1, op="mean")
        if r == w - 1:
            same(ym, np.mean(np.stack(vals), axis=0), rtol=1e-5)
        else:
            assert ym is None

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
        ym = dist.reduce_scatter(x, op="mean", axis=1)
        same(ym, np.array_split(np.mean(full, axis=0), w, axis=1)[r], rtol=1e-5)
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

    def point_to_point() -> None:
        nxt, prv = (r + 1) % w, (r - 1) % w
        x = arr(mine.astype(np.float32))
        if r % 2 == 0:  # even ranks send first: no two neighbours wait on each other
            assert dist.send(x, nxt, tag=3) is None
            y = dist.recv(prv, tag=3, backend=backend, device=dev)
        else:
            y = dist.recv(prv, tag=3, backend=backend, device=dev)
            dist.send(x, nxt, tag=3)
        same(y, vals[prv])
        np.testing.assert_array_equal(host(x), mine)
        ring = dist.sendrecv(x, shift=-1)  # from the next rank
        same(ring, vals[nxt])
        if b.capabilities.mutable:
            into = arr(np.zeros((4, 6), np.float32))
            # every rank's send in flight before its receive: where messages match by peer; else
            # (JAX: a message is a program both ranks run in one order) even ranks send first
            crossing = engine_class(dist.engine_name()).matches_by_peer
            h = dist.send(x, nxt, async_op=True) if crossing or r % 2 == 0 else None
            assert dist.recv(prv, out=into) is into
            h = h or dist.send(x, nxt, async_op=True)
            assert isinstance(h, dist.Work)
            assert h.wait() is None
            same(into, vals[prv])

    def subgroups() -> None:
        if w != 4:
            return  # a 2x2 process mesh: subgroups that are neither one rank nor the whole group
        pm = dist.process_mesh((2, 2), ("a", "b"))
        x = arr(mine.astype(np.float32))
        for axes in ("a", "b", ("b", "a")):  # ("b", "a"): one group, its ranks out of ascending order
            grp = pm.group_of(r, axes)
            k, m = grp.index(r), len(grp)
            same(dist.allreduce_along(x, pm, axes), np.sum(np.stack([vals[q] for q in grp]), axis=0))
            same(dist.allgather_along(x, pm, axes, axis=1), np.concatenate([vals[q] for q in grp], axis=1))
            same(dist.reduce_scatter_along(x, pm, axes, "max"),
                 np.array_split(np.max(np.stack([vals[q] for q in grp]), axis=0), m)[k])
            # piece k of every member's tensor (rows cut in m), joined along columns
            same(dist.all_to_all_along(x, pm, axes, split_axis=0, concat_axis=1),
                 np.concatenate([np.array_split(vals[q], m)[k] for q in grp], axis=1))

    def layouts() -> None:
        # a tensor laid out across the processes (rank 0's is the tensor), on a 2x2 mesh or a w x 1 one
        pm = dist.process_mesh((2, 2) if w == 4 else (w, 1), ("a", "b"))
        whole = np.arange(72, dtype=np.float64).reshape(12, 6) / 8  # (12 rows: even pieces for 2, 3 and 4)
        x = arr((whole + 100 * r).astype(np.float32))

        def pieces_hold(y: Any, lay: Any) -> None:
            assert md.layout_of(y) == lay, f"{md.layout_of(y)} != {lay}"
            (p,) = md.shards_of(y)
            zero = any(pm.coords(r)[pm.axis(a)] for a in lay.partial)
            box = tuple(slice(s, e) for s, e in lay.block(r, whole.shape))
            np.testing.assert_allclose(host(p), 0 * whole[box] if zero else whole[box], err_msg=f"{lay}")
            np.testing.assert_allclose(md.to_host(y), whole, err_msg=f"{lay}")

        for spec, partial in (((("a", "b"),), ()), (("b", "a"), ()), ((None, "a"), ()), ((), ()),
                              (("b",), ("a",))):
            lay = md.Layout(pm, spec, partial)
            y = md.to(x, lay)
            pieces_hold(y, lay)
        same(md.to(y, dev), whole)  # gathered whole on every rank, onto one device
        cut = md.Layout(pm, ("a",))
        box = tuple(slice(s, e) for s, e in cut.block(r, whole.shape))
        f = dist.from_local(arr(whole[box].astype(np.float32)), cut)  # the whole shape worked out
        pieces_hold(f, cut)
        pieces_hold(md.to(f, md.Layout(pm, (None, "a"))), md.Layout(pm, (None, "a")))  # a change of layout

    def transfer_paths() -> None:
        c.paths["host"] = dist.transport_path(arr(mine.astype(np.float32), device=devs[0]))
        assert dist.rank() == r and dist.world_size() == w

    for name, fn in (("ops", ops), ("dtypes", dtypes), ("inplace", inplace),
                     ("broadcast_reduce", broadcast_reduce), ("gathers", gathers), ("scatters", scatters),
                     ("async", asynchronous), ("point_to_point", point_to_point), ("subgroups", subgroups),
                     ("layouts", layouts), ("paths", transfer_paths)):
        c.run(name, fn)
    dist.shutdown()
    _report(r, ok=not c.failures, failures="\n".join(c.failures), paths=c.paths, **report)
    return 0 if not c.failures else 1


def _faults(r: int, w: int, report: dict[str, Any]) -> int:
    """Calls the ranks disagree on, and a refused input: every rank records each step's outcome."""
    import multidev as md
    from multidev import distributed as dist

    steps: list[dict[str, Any]] = []
    ones = np.ones((2, 3), np.float32)

    def step(name: str, fn: Callable[[], Any], expect: Any = None, keep: Any = None) -> None:
        t0 = time.monotonic()
        rec: dict[str, Any] = {"step": name}
        before = None if keep is None else np.array(keep, copy=True)
        try:
            y = fn()
        except md.MultidevError as e:
            rec.update(outcome=type(e).__name__, typed=True, message=str(e)[:400])
        except Exception as e:  # noqa: BLE001 - an untyped error is a finding, reported
            rec.update(outcome=type(e).__name__, typed=False, message=traceback.format_exc()[-1500:])
        else:
            rec["outcome"] = "ok"
            if expect is not None:
                got = np.asarray(md.to_numpy(y), dtype=np.float64)
                rec["right"] = bool(got.shape == np.shape(expect) and np.allclose(got, expect))
        if keep is not None and before is not None:
            rec["unchanged"] = bool(np.array_equal(np.asarray(keep), before))
        rec["elapsed"] = time.monotonic() - t0
        steps.append(rec)

    total = np.full((2, 3), float(w))
    step("shape (2,3) vs (3,2)", lambda: dist.allreduce(ones if r == 0 else ones.T.copy()))
    step("after shape", lambda: dist.allreduce(ones), total)
    step("op sum vs max", lambda: dist.allreduce(ones, op="sum" if r == 0 else "max"))
    step("after op", lambda: dist.allreduce(ones), total)
    step("dtype float32 vs int32", lambda: dist.allreduce(ones if r == 0 else ones.astype(np.int32)))
    step("after dtype", lambda: dist.allreduce(ones), total)
    frozen = np.full((2, 3), 5.0, np.float32)
    frozen.flags.writeable = False
    mine = frozen if r == 0 else np.ones((2, 3), np.float32)
    step("read-only inplace on rank 0", lambda: dist.allreduce(mine, inplace=True), keep=mine)
    step("after read-only", lambda: dist.allreduce(ones), total)
    step("mean of int on one rank", lambda: dist.allreduce(ones.astype(np.int32) if r == w - 1 else ones, op="mean"))
    step("after refusal", lambda: dist.allreduce(ones), total)
    step("barrier vs allreduce", lambda: dist.barrier() if r == 0 else dist.allreduce(ones))
    step("after kinds", lambda: dist.allreduce(ones), total)
    # then a rank that never joins: the last one stays alive, busy elsewhere
    dist.set_timeout(SHORT_TIMEOUT)
    if r == w - 1:
        time.sleep(SHORT_TIMEOUT + 3)
        dist.shutdown()
        _report(r, ok=True, steps=steps, **report)
        return 0
    t0 = time.monotonic()
    h = dist.allreduce(ones, async_op=True)
    try:
        h.wait()
    except dist.DistributedTimeoutError as e:
        report["message"] = str(e)
    else:
        raise AssertionError("allreduce with a hung peer did not raise DistributedTimeoutError")
    report["elapsed"] = time.monotonic() - t0
    dist.shutdown()
    _report(r, ok=True, steps=steps, **report)
    return 0


if __name__ == "__main__":
    rc = 1
    try:
        rc = _worker(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4])
    finally:
        print(f"MDDONE {_launcher_rank()} {rc}", flush=True)
    sys.exit(rc)
