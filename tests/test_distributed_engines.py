"""multidev.distributed's core without a second process: which engine a launcher's environment
picks (and the refusals when it is missing or ambiguous), the engine registry, the deprecated
spellings, the consistency records, the deadline helpers, and every collective through a one-rank
engine registered at run time (what the core does itself: mean, uneven pieces, in place, refusals)."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import distributed as dist
from multidev.distributed import engine as eng
from multidev.distributed.consistency import MAX_DIMS, Call


# -- which engine -----------------------------------------------------------------------------------
def _chosen(env: dict[str, str]) -> list[str]:
    return [x.engine for x in dist.detect_launch(env)]


def test_each_launcher_is_recognised_by_its_engine() -> None:
    assert _chosen({"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) == ["torch"]
    assert _chosen({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2"}) == ["torch"]
    assert _chosen({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "2"}) == ["mpi"]
    assert _chosen({"PMI_SIZE": "3", "PMI_RANK": "1"}) == ["mpi"]
    assert _chosen({"PMIX_RANK": "1"}) == ["mpi"]
    assert _chosen({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}) == ["jax"]
    assert _chosen({}) == []
    assert _chosen({"RANK": "0"}) == []  # a stray RANK is no launcher
    # srun: a scheduler, recognised weakly by the engines that can start under it
    slurm = {"SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}
    found = dist.detect_launch(slurm)
    assert sorted(x.engine for x in found) == ["jax", "mpi"] and all(x.weak for x in found)
    # mpiexec inside a Slurm allocation: the launcher wins over the scheduler
    strong = dist.detect_launch({**slurm, "OMPI_COMM_WORLD_SIZE": "2"})
    assert strong[0].engine == "mpi" and not strong[0].weak


def test_free_port_picks_below_the_ephemeral_range_and_falls_back_to_the_systems_pick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """free_port gives a port that can be bound, below the range the system hands to outgoing
    connections where that range is known and leaves room, skipping one that is taken; else the
    system's pick."""
    import socket

    from multidev.distributed import launch

    monkeypatch.setattr(launch, "_ephemeral_low", lambda: 32768)
    for _ in range(20):
        port = launch.free_port()
        assert launch._LOWEST <= port < 32768
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # (free: nothing holds it)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(launch, "_ephemeral_low", lambda: taken + 1)
        monkeypatch.setattr(launch, "_LOWEST", taken - 999)
        picks = iter([taken, taken - 1])
        monkeypatch.setattr(launch.random.Random, "randrange", lambda self, a, b: next(picks))
        assert launch.free_port() == taken - 1  # (the taken one skipped)
    monkeypatch.undo()
    for low in (None, launch._LOWEST + 10):  # (no range known, or no room below it)
        monkeypatch.setattr(launch, "_ephemeral_low", lambda low=low: low)
        monkeypatch.setattr(launch.random.Random, "randrange", lambda self, a, b: pytest.fail("picked at random"))
        assert launch.free_port() > 0
    monkeypatch.undo()
    low = launch._ephemeral_low()  # (this machine's, where it says)
    assert low is None or 0 < low < 65536


def test_a_launch_carries_the_rank_world_and_evidence() -> None:
    (x,) = dist.detect_launch({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "2",
                               "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"})
    assert (x.rank, x.world_size, x.local_rank, x.local_world_size) == (2, 3, 0, 1)
    assert "OMPI_COMM_WORLD_SIZE=3" in x.evidence and "mpiexec" in x.launcher
    assert dist.launched({"OMPI_COMM_WORLD_SIZE": "3"})
    assert not dist.launched({"OMPI_COMM_WORLD_SIZE": "1"}) and not dist.launched({})


def test_no_launcher_and_two_launchers_are_refused_saying_how_to_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    from multidev.distributed import group

    with pytest.raises(dist.DistributedError, match=r"no launcher.*torchrun.*OMPI_COMM_WORLD.*JAX_COORDINATOR_ADDRESS.*mpiexec"):
        group._choose(None, {})
    both = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "OMPI_COMM_WORLD_SIZE": "2"}
    with pytest.raises(dist.DistributedError, match=r"several launchers.*engine=") as e:
        group._choose(None, both)
    assert "MULTIDEV_ENGINE" in str(e.value) and "the torch engine" in str(e.value) and "the mpi engine" in str(e.value)
    cls, _, reason = group._choose("mpi", both)  # named: no ambiguity
    assert cls.name == "mpi" and "init(engine='mpi')" in reason
    cls, _, reason = group._choose(None, {**both, "MULTIDEV_ENGINE": "torch"})
    assert cls.name == "torch" and "MULTIDEV_ENGINE=torch" in reason
    with pytest.raises(dist.DistributedError, match="unknown engine 'nope'"):
        group._choose("nope", {})
    cls, launch, reason = group._choose(None, {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"})
    assert cls.name == "mpi" and launch is not None and "OMPI_COMM_WORLD_SIZE=2" in reason


def test_srun_alone_picks_the_one_installed_engine_or_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    from multidev.distributed import group

    slurm = {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}
    jax_cls, mpi_cls = eng.engine_class("jax"), eng.engine_class("mpi")
    monkeypatch.setattr(jax_cls, "missing", classmethod(lambda cls: "not here"))
    monkeypatch.setattr(mpi_cls, "missing", classmethod(lambda cls: None))
    cls, _, reason = group._choose(None, slurm)
    assert cls.name == "mpi" and "srun" in reason and "one installed engine" in reason
    monkeypatch.setattr(jax_cls, "missing", classmethod(lambda cls: None))
    with pytest.raises(dist.DistributedError, match=r"srun.*several installed engines.*jax, mpi|mpi, jax"):
        group._choose(None, slurm)


def test_init_refuses_bad_settings_before_starting_anything() -> None:
    for kw, msg in (({"timeout": 0}, "timeout"), ({"timeout": "1"}, "timeout"), ({"check": 1}, "check"),
                    ({"rank": 1.5}, "rank"), ({"transport": ""}, "transport"), ({"rendezvous_timeout": -1}, "rendezvous")):
        with pytest.raises(dist.DistributedError, match=msg):
            dist.init("torch", **kw)
    assert not dist.is_initialized()


def test_the_old_spellings_warn_naming_the_replacement() -> None:
    with pytest.warns(DeprecationWarning, match=r"init\(transport=...\)"), pytest.raises(dist.DistributedError):
        dist.init(backend="gloo", timeout=0)
    with pytest.warns(DeprecationWarning, match=r"init\('torch', transport='gloo'\)"), \
            pytest.raises(dist.DistributedError):
        dist.init("gloo", timeout=0)
    with pytest.warns(DeprecationWarning, match="transport_name"), pytest.raises(dist.DistributedError, match="init"):
        dist.backend_name()


def test_import_multidev_imports_no_framework_and_no_mpi() -> None:
    code = ("import sys, multidev, multidev.distributed, multidev.distributed.engine, multidev.distributed.launch; "
            "multidev.distributed.detect_launch({'OMPI_COMM_WORLD_SIZE': '2'}); "
            "print(sorted(m for m in ('torch', 'jax', 'tensorflow', 'mxnet', 'mpi4py', 'cupy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- the registry -----------------------------------------------------------------------------------
def test_the_built_in_engines_are_registered_by_entry_point() -> None:
    assert {"torch", "mpi", "jax"} <= set(dist.engine_names())
    for name in ("torch", "mpi", "jax"):
        cls = eng.engine_class(name)
        assert issubclass(cls, eng.Engine) and cls.name == name and cls.tensors
        # each in its framework's folder; MPI, a runtime of no framework adapter, in backends/engines/
        home = "engines.mpi" if name == "mpi" else f"{name}.engine"
        assert cls.__module__ == f"multidev.adapters.{home}"


def test_register_engine_refuses_bad_names_and_duplicates() -> None:
    with pytest.raises(dist.DistributedError, match="names"):
        dist.register_engine("a:b", _OneRank)
    with pytest.raises(dist.DistributedError, match="registered already"):
        dist.register_engine("torch", _OneRank)
    with pytest.raises(md.BackendNotAvailableError, match="unknown engine"):
        eng.engine_class("no-such-engine")


# -- records and deadlines ----------------------------------------------------------------------------
def test_a_call_record_survives_its_encoding() -> None:
    c = Call("scatter", op="mean", root=3, axis=-2, dtype="bfloat16", shape=(4, 0, 7), tkind="gpu",
             backend="array_api:array_api_strict", seq=12, refused="CapabilityError")
    row = c.encode()
    assert len(row) == len(Call("barrier").encode()) and all(isinstance(v, int) for v in row)
    back = Call.decode(row)
    assert back == Call("scatter", op="mean", root=3, axis=-2, dtype="bfloat16", shape=(4, 0, 7), tkind="gpu",
                        backend="array_api:array_api_strict"[:32], seq=12, refused="CapabilityError")
    assert Call.decode(Call("barrier").encode()) == Call("barrier")
    assert MAX_DIMS == 32


def test_poll_until_returns_at_the_deadline_and_when_done() -> None:
    t0 = time.monotonic()
    assert eng.poll_until(lambda: False, 0.2) is False
    assert 0.19 <= time.monotonic() - t0 < 0.5
    n = [0]

    def third() -> bool:
        n[0] += 1
        return n[0] >= 3
    assert eng.poll_until(third, 5.0) is True and n[0] == 3


def test_an_mpi_requests_wait_tests_back_to_back_keeps_its_deadline_and_classifies_errors() -> None:
    """The MPI engine's wait tests the request back to back first (MPI moves data only inside its tests),
    the clock read once a block of tests, then polls: done at the test that says so, False at the
    deadline (kept within a block's tests; the stretch skipped for a deadline under 5 ms), and an MPI
    error from a test classified as the engine's ``errors`` says (no mpi4py needed: a stand-in engine)."""
    import contextlib

    mpi = importlib.import_module(eng.engine_class("mpi").__module__)

    class MpiError(Exception):
        pass

    class Engine:
        class MPI:
            Exception = MpiError

        @contextlib.contextmanager
        def errors(self, what: str) -> Any:
            try:
                yield
            except MpiError as e:
                raise dist.DistributedTimeoutError(f"{what}: lost") from e

    now = [0.0]  # a clock that moves by `cost` seconds a test, and only then

    class Req:
        def __init__(self, done_at: int | None, fail_at: int | None = None, cost: float = 1e-7) -> None:
            self.n, self.done_at, self.fail_at, self.cost = 0, done_at, fail_at, cost

        def Test(self) -> bool:
            self.n += 1
            now[0] += self.cost
            if self.n == self.fail_at:
                raise MpiError("a peer is gone")
            return self.done_at is not None and self.n >= self.done_at

    reads = [0]

    def clock() -> float:
        reads[0] += 1
        return now[0]

    def wait(r: Req, timeout: float, what: str = "MPI_Iallreduce") -> tuple[bool, mpi._Request]:
        h = mpi._Request(Engine(), r, lambda: "result", what)
        reads[0] = 0
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(time, "perf_counter", clock)
            mp.setattr(os, "sched_yield", lambda: None)
            return h.wait(timeout), h

    for done_at in (1, 10, mpi._TIGHT, mpi._TIGHT + 50):
        r = Req(done_at)
        done, h = wait(r, 5.0)
        assert done is True and r.n == done_at and h.result() == "result"
        if done_at <= mpi._TIGHT:  # (the clock read once a block of tests back to back)
            assert reads[0] <= 2 + done_at // mpi._BLOCK, reads
        assert h.wait(5.0) is True and r.n == done_at  # (done: no test more)
    for timeout, cost in ((0.003, 1e-5), (0.012, 1e-5), (0.02, 1e-6)):
        # (the stretch skipped, cut short by its span, whole by its count; the deadline kept within a block)
        r = Req(None, cost=cost)
        start = now[0]
        done, _ = wait(r, timeout)
        spent = now[0] - start
        assert done is False and timeout <= spent <= timeout + (mpi._BLOCK + 2) * cost, (timeout, cost, spent)
    for fail_at in (3, mpi._TIGHT - 3, mpi._TIGHT + 3):
        with pytest.raises(dist.DistributedTimeoutError, match="MPI_Ibcast: lost"):
            wait(Req(None, fail_at), 5.0, "MPI_Ibcast")


def test_run_with_deadline_gives_the_result_the_error_or_a_timeout() -> None:
    assert eng.run_with_deadline(lambda: 7, 1.0, "x") == 7
    with pytest.raises(ZeroDivisionError):
        eng.run_with_deadline(lambda: 1 / 0, 1.0, "x")
    done = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(dist.DistributedTimeoutError, match="slow thing did not complete within 0.2 s"):
        eng.run_with_deadline(lambda: done.wait(5), 0.2, "slow thing")
    assert time.monotonic() - t0 < 1.0
    done.set()


def test_the_jax_dispatchers_stop_waits_for_a_dispatch_it_has_not_started_yet() -> None:
    """The JAX engine's dispatch thread at stop: a dispatch queued just before (not yet taken off the
    queue, so it did not look busy) still runs to its end before stop returns; the interpreter's
    exit would otherwise kill the thread inside XLA, which aborts the process."""
    from multidev.adapters.jax.engine import _Dispatcher

    for _ in range(20):
        d = _Dispatcher()
        done: list[int] = []
        fut = d.submit(lambda done=done: time.sleep(0.02) or done.append(1))
        d.close()
        assert done == [1] and fut.done() and not d.thread.is_alive()
    d = _Dispatcher()  # an idle one stops at once
    t0 = time.monotonic()
    d.close()
    assert not d.thread.is_alive() and time.monotonic() - t0 < 1.0
    # after a lost rank: the dispatch inside a "collective" is waited for (at most DRAIN s), the ones
    # queued behind it never start and their futures fail
    d = _Dispatcher()
    d.DRAIN = 0.3
    stuck, ran = threading.Event(), []
    first = d.submit(lambda: stuck.wait(10))
    while d.q.qsize():  # (until the first is taken off the queue)
        time.sleep(0.01)
    later = d.submit(lambda: ran.append(1))
    d.close(drop_pending=True)
    with pytest.raises(dist.DistributedError, match="stopped before this collective was dispatched"):
        later.result(0)
    stuck.set()
    d.thread.join(5)
    assert first.result(0) is True and ran == [] and not d.thread.is_alive()


def _one_process_jax_engine(jax: Any) -> Any:
    """A JaxEngine of one process over JAX's first CPU device, without jax.distributed, its dispatch
    thread counting what it is handed."""
    import collections

    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from multidev.adapters.jax.engine import JaxEngine, _array_constructor, _Dispatcher

    class Counting(_Dispatcher):
        handed = 0

        def submit(self, fn: Any) -> Any:
            self.handed += 1
            return super().submit(fn)

    dev = jax.devices("cpu")[0]
    mesh = Mesh(np.array([dev], dtype=object), ("p",))
    e = object.__new__(JaxEngine)
    e.jax, e.world, e.rank, e.native, e.platform, e.timeout = jax, 1, 0, dev, "cpu", 5.0
    e.sharded, e.whole = NamedSharding(mesh, PartitionSpec("p")), NamedSharding(mesh, PartitionSpec())
    e._home, e._fns, e._lock = jax.device_put(np.zeros(1, np.float32), dev).sharding, {}, threading.Lock()
    e._seen, e._costly_fns, e._pending = set(), set(), collections.deque()
    e._order, e._async_cpu = threading.Lock(), True
    e._avals, e._make = {}, _array_constructor()
    e._dispatch = Counting()
    return e


def test_the_jax_engine_dispatches_a_costly_collective_itself_once_it_ran_and_nothing_is_pending() -> None:
    """A collective's first dispatch is the thread's; after it, a function the cost rule admits is
    dispatched by the caller, but only while every earlier dispatch of the engine has completed
    (one queued or in flight sends it to the thread, behind them); one the rule refuses, never."""
    jax = pytest.importorskip("jax")
    from concurrent.futures import Future

    e = _one_process_jax_engine(jax)
    e._costly = lambda f, g: True  # (the rule itself: the next test)
    try:
        x = jax.numpy.arange(4.0)

        def call() -> Any:
            h = e.allreduce(x, "sum")
            assert h.wait(5.0)
            assert np.array_equal(np.asarray(h.result()), np.arange(4.0))

        call()
        assert e._dispatch.handed == 1 and len(e._costly_fns) == 1
        call()
        call()
        assert e._dispatch.handed == 1  # (the caller's)
        late: Future = Future()  # (an earlier dispatch not complete)
        e._pending.appendleft(late)
        call()
        assert e._dispatch.handed == 2
        late.set_result(jax.numpy.zeros(1))  # (complete now: dropped, and the caller dispatches again)
        call()
        assert e._dispatch.handed == 2 and not e._pending  # (a result waited for is not kept)
        computing: Future = Future()  # (dispatched, its computation not finished)
        computing.set_result(type("A", (), {"is_ready": lambda self: False})())
        e._pending.appendleft(computing)
        call()
        assert e._dispatch.handed == 3
        e._pending.clear()
        import _thread

        done = threading.Event()
        _thread.start_new_thread(lambda: (call(), done.set()), ())  # (a thread Python did not start: XLA's
        assert done.wait(10) and e._dispatch.handed == 4  # callback threads, where XLA runs every computation)
        call()
        assert e._dispatch.handed == 4

        def inside(v: Any) -> Any:  # (a host callback, where XLA runs every computation inside its dispatch,
            call()  # on whichever thread: here the caller's own)
            return np.asarray(v)
        spec = jax.ShapeDtypeStruct((4,), np.float32)
        jax.block_until_ready(jax.jit(lambda v: jax.pure_callback(inside, spec, v))(x))
        assert e._dispatch.handed == 5
        call()
        assert e._dispatch.handed == 5
        raising: Future = Future()  # (a computation whose readiness raises: it has failed, so completed)
        raising.set_result(type("A", (), {"is_ready": lambda self: 1 / 0})())
        e._pending.appendleft(raising)
        call()
        assert e._dispatch.handed == 5
        failed: Future = Future()
        failed.set_exception(RuntimeError("a lost peer"))  # (a failed computation has completed)
        e._pending.appendleft(failed)
        call()
        assert e._dispatch.handed == 5
        e._costly = lambda f, g: False
        y = jax.numpy.arange(5.0)  # (another shape: another function, which the rule refuses)
        for _ in range(3):
            assert np.array_equal(np.asarray(e.allreduce(y, "sum").result()), np.arange(5.0))
        assert e._dispatch.handed == 8 and not e._pending  # (a result read is not kept either)
    finally:
        e._dispatch.close()


def test_the_jax_engine_makes_a_shape_and_dtypes_later_global_arrays_with_jaxs_constructor() -> None:
    """The first global array of a local shape and dtype is jax.make_array_from_single_device_arrays';
    later ones JAX's array constructor given its abstract value (kept per shape and dtype: an array of
    another dtype or shape gets its own), each the array the public function makes; a constructor
    that refuses the call is dropped for the public function, the result the same."""
    jax = pytest.importorskip("jax")
    e = _one_process_jax_engine(jax)
    e._dispatch.close()
    made: list[Any] = []
    public = jax.make_array_from_single_device_arrays

    def counted(*a: Any, **k: Any) -> Any:
        made.append(a[0])
        return public(*a, **k)
    arrays = [jax.numpy.arange(n, dtype=dt).reshape(shape) for dt in (jax.numpy.float32, jax.numpy.int32)
              for n, shape in ((6, (6,)), (6, (2, 3)), (1, ()))]
    old = jax.make_array_from_single_device_arrays
    jax.make_array_from_single_device_arrays = counted
    try:
        for rnd in range(3):
            for x in arrays:
                g, local = e._global(x)
                want = public(g.shape, e.sharded, [x.reshape(local)])
                assert g.shape == want.shape and g.dtype == want.dtype and g.sharding == want.sharding
                assert g.aval == want.aval and g.committed
                np.testing.assert_array_equal(np.asarray(g), np.asarray(want))
            assert len(made) == len(arrays), rnd  # (the public function once a shape and dtype)
        assert e._make is not None and len(e._avals) == len(arrays)

        def refuses(*a: Any, **k: Any) -> Any:
            raise TypeError("this JAX's constructor takes other arguments")
        e._make = refuses
        g, _ = e._global(arrays[0])
        assert e._make is None and len(made) == len(arrays) + 1
        np.testing.assert_array_equal(np.asarray(g), np.arange(6))
        g, _ = e._global(arrays[1])
        assert len(made) == len(arrays) + 2  # (the public function from then on)
        e._make = refuses  # (the public function refuses this array too: its error, the constructor kept)

        def also_refuses(*a: Any, **k: Any) -> Any:
            raise ValueError("the public function's own refusal")
        jax.make_array_from_single_device_arrays = also_refuses
        with pytest.raises(ValueError, match="own refusal"):
            e._global(arrays[0])
        assert e._make is refuses
    finally:
        jax.make_array_from_single_device_arrays = old


def test_the_jax_engine_refuses_a_deleted_array_in_its_checks_and_takes_one_in_host_memory() -> None:
    """A deleted (or donated) array, 0-d and empty ones included, is InvalidArgumentError from the
    engine's ``prepare`` (the call's checks, before any record travels) and from ``_global``, not a
    runtime error read as a lost peer; an array in the device's pinned or unpinned host memory is
    moved to its own memory, its values kept."""
    jax = pytest.importorskip("jax")
    e = _one_process_jax_engine(jax)
    e._dispatch.close()
    for shape in ((), (0,), (3,)):
        x = jax.numpy.zeros(shape)
        x.delete()
        for step in (e.prepare, e._global):
            with pytest.raises(md.InvalidArgumentError, match="deleted or donated"):
                step(x)
    x = jax.numpy.arange(4.0)
    assert e.prepare(x) == (x, True)
    kinds = []
    for kind in ("pinned_host", "unpinned_host"):
        try:
            y = jax.device_put(np.arange(4.0, dtype=np.float32),
                               jax.sharding.SingleDeviceSharding(e.native, memory_kind=kind))
        except Exception:  # noqa: BLE001 - a JAX without that memory kind here: the other is tried
            continue
        kinds.append(kind)
        for _ in range(2):  # (the public function, then the constructor)
            g, _ = e._global(y)
            assert g.addressable_data(0).sharding.memory_kind == e._home.memory_kind
            np.testing.assert_array_equal(np.asarray(g), np.arange(4.0))
            np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: a * 2)(g)), 2 * np.arange(4.0))
    if not kinds:
        pytest.skip("no pinned or unpinned host memory on JAX's CPU device here")


def test_the_jax_engines_cost_rule_reads_xlas_cost_analysis() -> None:
    """The caller dispatches a function of 8,000 flops or more by XLA's own cost analysis (XLA's CPU
    client runs one of under 1,000 inside its dispatch), on the CPU only."""
    jax = pytest.importorskip("jax")
    e = _one_process_jax_engine(jax)
    e._dispatch.close()

    def costly(n: int) -> bool:
        x = jax.device_put(np.ones(2 * n, np.float32), e.native)
        return e._costly(jax.jit(lambda a: a.reshape((2, n)).sum(0)), x)  # (n adds)

    assert costly(8192) and costly(1 << 20)
    assert not costly(4096) and not costly(1)
    assert not e._costly(lambda a: a, None)  # (no analysis: the thread's)
    e._async_cpu = False  # (a synchronous CPU client runs every computation inside its dispatch)
    assert not costly(1 << 20)
    e._async_cpu, e.platform = True, "gpu"
    assert not costly(1 << 20)


def test_the_jax_engines_own_dispatches_stay_in_order_from_several_threads() -> None:
    """Collectives issued from several threads at once (p2p's completion checks may ask from
    another): each dispatch and its record are one step, so none is forgotten or made while one
    before it is pending, and nothing raises."""
    import collections
    import sys

    jax = pytest.importorskip("jax")
    e = _one_process_jax_engine(jax)
    e._costly = lambda f, g: True

    class Guarded(collections.deque):  # (the record is read and written only under the engine's lock)
        def append(self, item: Any) -> None:
            assert e._order.locked(), "appended without the lock"
            super().append(item)

        def popleft(self) -> Any:
            assert e._order.locked(), "dropped without the lock"
            return super().popleft()

    e._pending = Guarded()
    x = jax.numpy.arange(4.0)
    errors: list[BaseException] = []
    old = sys.getswitchinterval()

    def work() -> None:
        try:
            for _ in range(200):
                h = e.allreduce(x, "sum")
                assert h.wait(5.0)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)
    try:
        e.allreduce(x, "sum").wait(5.0)
        sys.setswitchinterval(1e-6)
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(old)
        e._dispatch.close()
    assert errors == [] and not e._pending


def test_the_jax_engines_wait_spins_only_where_each_process_has_two_cores(monkeypatch: Any) -> None:
    """The wait for a computation polls back to back (1 ms) only where this process may run on two
    cores for each process on the machine (its poll, XLA's thread running the collective); else it
    yields at once. The wait passes the engine's figure to the poll."""
    import contextlib
    import os
    from concurrent.futures import Future

    import multidev.adapters.jax.engine as je

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    assert je._poll_spin(2) == 1e-3 and je._poll_spin(1) == 1e-3
    assert je._poll_spin(3) == 0.0
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)  # (bound to one core)
    assert je._poll_spin(1) == 0.0
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # (no masks: the machine's count)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert je._poll_spin(8) == 1e-3 and je._poll_spin(9) == 0.0
    spins: list[float] = []
    monkeypatch.setattr(je, "poll_until", lambda done, timeout, spin=1e-3: spins.append(spin) or done())
    engine = type("E", (), {"lost": lambda self, what: contextlib.nullcontext(), "spin": 0.0,
                            "_completed": lambda self: None})()
    fut: Future = Future()
    fut.set_result(type("A", (), {"is_ready": lambda self: True})())
    assert je._Ready(engine, fut, lambda a: a, "x").wait(1.0) is True and spins == [0.0]


def test_a_jax_collectives_wait_takes_any_timeout() -> None:
    """The JAX engine's wait blocks on its dispatch's future first: an infinite timeout (which
    init accepts) must not overflow the lock's, and a dispatch not done in time is a False."""
    import contextlib
    from concurrent.futures import Future

    from multidev.adapters.jax.engine import _Ready

    engine = type("E", (), {"lost": lambda self, what: contextlib.nullcontext(), "spin": 1e-3,
                            "_completed": lambda self: None})()
    later: Future = Future()  # (dispatched while the wait blocks on it)
    threading.Timer(0.05, lambda: later.set_result(type("A", (), {"is_ready": lambda self: True})())).start()
    assert _Ready(engine, later, lambda a: a, "x").wait(float("inf")) is True
    t0 = time.monotonic()
    assert _Ready(engine, Future(), lambda a: a, "x").wait(0.1) is False
    assert time.monotonic() - t0 < 1.0


def test_the_jax_engine_refuses_a_deleted_or_donated_array_by_name() -> None:
    """A shard already on its device goes into the global array as it is: a deleted (or donated)
    one would reach XLA without data, so it is refused with a typed error first."""
    jax = pytest.importorskip("jax")
    from types import SimpleNamespace

    from multidev.adapters.jax.engine import JaxEngine
    from multidev.errors import InvalidArgumentError

    x = jax.numpy.ones(3)
    x.delete()
    engine = SimpleNamespace(jax=jax, world=1, native=jax.devices()[0], _home=jax.numpy.ones(1).sharding)
    with pytest.raises(InvalidArgumentError, match="deleted or donated"):
        JaxEngine._global(engine, x)  # type: ignore[arg-type]


def test_peer_errors_turn_lost_peers_into_timeouts_and_pass_the_rest() -> None:
    with pytest.raises(dist.DistributedTimeoutError, match="another rank died") as e, \
            eng.peer_errors("all_reduce", (RuntimeError,), 3.0):
        raise RuntimeError("Connection closed by peer")
    assert isinstance(e.value.__cause__, RuntimeError)
    with pytest.raises(md.InvalidArgumentError, match="all_reduce"), eng.peer_errors("all_reduce", (RuntimeError,)):
        raise ValueError("bad")
    with pytest.raises(md.CollectiveInputError), eng.peer_errors("all_reduce", (Exception,)):
        raise md.CollectiveInputError("mine")


def test_missing_ranks_are_named_with_the_call() -> None:
    err = eng.missing_ranks_error("distributed.allreduce on rank 0", [[1], None, [1], None], 3.0,
                                  "distributed.allreduce (call #4)")
    assert isinstance(err, dist.DistributedTimeoutError)
    text = str(err)
    assert "ranks 1, 3 did not arrive at distributed.allreduce (call #4) within 3 s" in text
    assert "ranks 0, 2 did" in text


# -- every collective through a one-rank engine ----------------------------------------------------------
class _Done(eng.Handle):
    def __init__(self, value: Any) -> None:
        self.value = value

    def test(self) -> bool:
        return True

    def result(self) -> Any:
        return self.value


class _OneRank(eng.Engine):
    """A world of one process moving NumPy arrays: the primitives are the identity (what the core
    does around them is what these tests see)."""

    name = "one-rank"
    tensors = "numpy"
    rows: list[list[int]] = []  # noqa: RUF012 - every exchanged row, for the tests

    def start(self, settings: eng.Settings) -> eng.Membership:
        return eng.Membership(0, 1, None, "in-process")

    def stop(self, healthy: bool) -> None:
        pass

    def transport_for(self, device: md.Device) -> tuple[str, md.Device]:
        return "numpy", md.Device("cpu", 0)

    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        self.rows.append(list(row))
        return [list(row)]

    def allreduce(self, t: Any, op: str) -> eng.Handle:
        return _Done(t)

    def broadcast(self, t: Any, src: int) -> eng.Handle:
        return _Done(t)

    def reduce(self, t: Any, dst: int, op: str) -> eng.Handle:
        return _Done(t)

    def allgather(self, t: Any) -> eng.Handle:
        return _Done([t])

    def gather(self, t: Any, dst: int) -> eng.Handle:
        return _Done([t])

    def reduce_scatter(self, blocks: Any, op: str) -> eng.Handle:
        return _Done(blocks[0])

    def scatter(self, blocks: Any, like: Any, src: int) -> eng.Handle:
        return _Done(blocks[0])


@pytest.fixture
def one_rank() -> Any:
    if "one-rank" not in dist.engine_names():
        dist.register_engine("one-rank", _OneRank)
    _OneRank.rows.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        info = dist.init("one-rank", timeout=5)
    try:
        yield info
    finally:
        dist.shutdown()


def test_init_reports_the_engine_and_why(one_rank: Any) -> None:
    assert (one_rank.engine, one_rank.rank, one_rank.world_size, one_rank.local_rank) == ("one-rank", 0, 1, 0)
    assert "init(engine='one-rank') names it" in str(one_rank)
    assert dist.engine_name() == "one-rank" and dist.transport_name() == "in-process"
    assert dist.group_info() == one_rank and dist.checks_enabled()
    with pytest.raises(dist.DistributedError, match="already initialised"):
        dist.init("one-rank")


def test_collectives_keep_backend_device_and_dtype(one_rank: Any) -> None:
    devs = md.devices(backend="numpy")
    x = md.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), device=devs[-1])
    for fn in (lambda: dist.allreduce(x), lambda: dist.allreduce(x, op="mean"), lambda: dist.broadcast(x),
               lambda: dist.reduce(x), lambda: dist.allgather(x), lambda: dist.gather(x),
               lambda: dist.reduce_scatter(x), lambda: dist.reduce_scatter(x, axis=1), lambda: dist.scatter(x)):
        y = fn()
        assert md.device_of(y) == devs[-1] and md.dtype_of(y) == "float32"
        np.testing.assert_array_equal(md.to_numpy(y), md.to_numpy(x))
        assert y is not x  # out of place
    assert dist.allreduce(x, inplace=True) is x
    h = dist.allreduce(x, async_op=True)
    assert isinstance(h, dist.Work) and h.is_completed()
    np.testing.assert_array_equal(md.to_numpy(h.wait()), md.to_numpy(x))
    dist.barrier()


def test_an_inplace_allreduce_of_the_engines_own_tensor_takes_the_short_path_alike(
        one_rank: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``allreduce(x, inplace=True)``, unchecked and synchronous, of the engine's own tensor goes around
    the general path's layers (no transport tensor made) with its results, its record exchanged where
    the call is checked; anything else (a copy to make, a refusal, a structure) takes the general path,
    which raises, and sends the refusal, as ever."""
    from multidev.distributed import collectives

    made = [0]
    general = collectives.to_transport

    def counted(*a: Any, **k: Any) -> Any:
        made[0] += 1
        return general(*a, **k)
    monkeypatch.setattr(collectives, "to_transport", counted)
    dist.set_checks(False)
    x = np.arange(6, dtype=np.float32)
    assert dist.allreduce(x, inplace=True) is x  # (the class seen)
    made[0] = 0
    assert dist.allreduce(x, inplace=True) is x and dist.allreduce(x, op="mean", inplace=True) is x
    np.testing.assert_array_equal(x, np.arange(6))
    assert made[0] == 0
    monkeypatch.setattr(_OneRank, "prepare", lambda self, t: (t, True) if t.flags.c_contiguous else (
        np.ascontiguousarray(t), False))  # (as MPI's: a copy of what is not contiguous)
    view = np.arange(12, dtype=np.float32)[::2]  # (not contiguous: the engine's copy, reduced, written back)
    monkeypatch.setattr(_OneRank, "allreduce", lambda self, t, op: _Done(t.__iadd__(1)))  # (written in place)
    assert dist.allreduce(view, inplace=True) is view and made[0] == 0
    np.testing.assert_array_equal(view, np.arange(0, 12, 2) + 1)
    assert dist.allreduce(x, inplace=True) is x and made[0] == 0
    np.testing.assert_array_equal(x, np.arange(6) + 1)
    x -= 1
    monkeypatch.undo()
    monkeypatch.setattr(collectives, "to_transport", counted)
    ints, frozen = np.arange(3, dtype=np.int32), np.ones(3, np.float32)
    frozen.flags.writeable = False
    taken, is_tree = [0], collectives._is_tree

    def counted_general(x: Any) -> bool:  # (the general path's first step)
        taken[0] += 1
        return is_tree(x)
    monkeypatch.setattr(collectives, "_is_tree", counted_general)
    with pytest.raises(md.CollectiveInputError, match="mean"):
        dist.allreduce(ints, op="mean", inplace=True)
    with pytest.raises(md.CollectiveInputError, match="unknown op"):
        dist.allreduce(x, op="bogus", inplace=True)
    with pytest.raises(md.CapabilityError, match="inplace"):
        dist.allreduce(frozen, inplace=True)
    assert taken[0] == 3  # (each refused by the general path)
    tree = [x]
    assert dist.allreduce(tree, inplace=True) is tree and taken[0] == 4  # (a structure: the general path)
    made[0] = 0

    def refuses(self: Any, t: Any) -> Any:  # (an engine refusing float64 in prepare, as torch's refuses sparse)
        if t.dtype == np.float64:
            raise md.UnsupportedTensorError("no float64 here")
        return t, True
    monkeypatch.setattr(_OneRank, "prepare", refuses)
    with pytest.raises(md.UnsupportedTensorError, match="no float64"):
        dist.allreduce(np.ones(3), inplace=True)
    assert taken[0] == 5 and made[0] == 1  # (the general path's prepare refused it)
    monkeypatch.setattr(_OneRank, "allreduce", lambda self, t, op: _Done(t * 2))  # (a result in new memory)
    made[0] = 0
    assert dist.allreduce(x, inplace=True) is x and made[0] == 0
    np.testing.assert_array_equal(x, 2 * np.arange(6))
    dist.set_checks(True)
    _OneRank.rows.clear()
    assert dist.allreduce(x, inplace=True) is x and made[0] == 0
    np.testing.assert_array_equal(x, 4 * np.arange(6))
    assert [Call.decode(r).kind for r in _OneRank.rows] == ["allreduce"]  # (checked: its record exchanged)
    assert Call.decode(_OneRank.rows[0]).shape == (6,) and Call.decode(_OneRank.rows[0]).dtype == "float32"
    with pytest.raises(md.CapabilityError, match="inplace"):
        dist.allreduce(frozen, inplace=True)
    assert Call.decode(_OneRank.rows[-1]).refused  # (a refusal: the general path's record says so)
    with pytest.raises(md.UnsupportedTensorError, match="no float64"):
        dist.allreduce(np.ones(3), inplace=True)
    assert Call.decode(_OneRank.rows[-1]).refused == "UnsupportedTensorError"  # (sent to the others)


@pytest.mark.parametrize("checks", [False, True])
def test_the_short_inplace_allreduce_gives_what_the_general_path_gives(
        one_rank: Any, monkeypatch: pytest.MonkeyPatch, checks: bool) -> None:
    """Every op, contiguous or a view the engine copies, checked or not, in a world that reads as two
    ranks (the primitive sums x with itself): the short path's result, and x after it, are the general
    path's (the short path turned off)."""
    from multidev.distributed import collectives
    from multidev.distributed.group import Group

    monkeypatch.setattr(Group, "world_size", property(lambda self: 2))
    ops = {"sum": lambda t: t + t, "prod": lambda t: t * t, "max": lambda t: t, "min": lambda t: t}
    monkeypatch.setattr(_OneRank, "allreduce", lambda self, t, op: _Done(np.copyto(t, ops[op](t)) or t))
    monkeypatch.setattr(_OneRank, "prepare", lambda self, t: (t, True) if t.flags.c_contiguous else (
        np.ascontiguousarray(t), False))
    dist.set_checks(checks)
    short = collectives._quick
    for op in ("sum", "mean", "prod", "max", "min"):
        for strided in (False, True):
            got = []
            for quick in (True, False):
                monkeypatch.setattr(collectives, "_quick", short if quick else (
                    lambda *a: collectives._GENERAL))
                base = np.arange(1, 13, dtype=np.float32)
                x = base[::2] if strided else base[:6].copy()
                out = dist.allreduce(x, op=op, inplace=True)
                got.append((out is x, x.copy(), base.copy()))
            assert got[0][0] and got[1][0], (op, strided)
            np.testing.assert_array_equal(got[0][1], got[1][1], err_msg=f"{op} strided={strided}")
            np.testing.assert_array_equal(got[0][2], got[1][2], err_msg=f"{op} strided={strided}")
    np.testing.assert_array_equal(got[1][1], np.arange(1, 13, 2))  # (min: x itself)


def _both_ways(cls: Any, monkeypatch: pytest.MonkeyPatch, taken: list[int], checks: bool,
               each: Callable[..., None]) -> list[Any]:
    """Every op, on a contiguous x and a strided view, out of place, through the short path and then
    the general one (the short path turned off); ``each(op, strided, quick, x, base, out, rows, seq)``
    checks one call (``taken``: the general path's first steps counted since it began; ``rows``,
    ``seq``: ``cls``'s exchanged rows and the group's call number before it). Both ways' results and
    x's memory after them must agree; the last op's two results are returned."""
    from multidev.distributed import collectives
    from multidev.distributed.group import current

    short = collectives._quick
    got: list[Any] = []
    for op in ("sum", "mean", "prod", "max", "min"):
        for strided in (False, True):
            got = []
            for quick in (True, False):
                monkeypatch.setattr(collectives, "_quick", short if quick else (lambda *a: collectives._GENERAL))
                base = np.arange(1, 13, dtype=np.float32)
                x = base[::2] if strided else base[:6].copy()
                cls.seen.clear()
                taken[0], rows, seq = 0, len(cls.rows), current().seq
                out = dist.allreduce(x, op=op)
                assert current().seq == seq + checks  # (one call number a checked call, as every rank's)
                assert type(out) is np.ndarray and not np.shares_memory(out, base)
                each(op, strided, quick, x, base, out, rows, seq)
                np.testing.assert_array_equal(x, np.arange(1, 13)[::2] if strided else np.arange(1, 7),
                                              err_msg=f"{op} strided={strided} quick={quick}: x written")
                np.testing.assert_array_equal(base, np.arange(1, 13), err_msg=f"{op}: x written")
                got.append(out.copy())
            np.testing.assert_array_equal(got[0], got[1], err_msg=f"{op} strided={strided}")
    return got


@pytest.mark.parametrize("checks", [False, True])
@pytest.mark.parametrize("declines", [False, True])
def test_the_short_out_of_place_allreduce_gives_what_the_general_path_gives(
        monkeypatch: pytest.MonkeyPatch, checks: bool, declines: bool) -> None:
    """An engine that reduces into new memory (or declines, and reduces a copy in place), every op,
    contiguous or a view the engine copies, checked or not, in a world that reads as two ranks: the
    short path's result and x after it are the general path's (the short path turned off); the short
    path is taken (the general path's first step is never reached), its record exchanged where
    checked, and x is never written."""
    from multidev.distributed import collectives
    from multidev.distributed.group import Group

    if "new-memory" not in dist.engine_names():
        dist.register_engine("new-memory", _NewMemory)
    ops = {"sum": lambda t: t + t, "prod": lambda t: t * t, "max": lambda t: t, "min": lambda t: t}
    monkeypatch.setattr(_NewMemory, "allreduce", lambda self, t, op: (
        self.seen.append(("allreduce", t)), _Done(np.copyto(t, ops[op](t)) or t))[1])
    monkeypatch.setattr(_NewMemory, "allreduce_new", lambda self, t, op: (
        self.seen.append(("allreduce_new", t)), None if self.declines else _Done(np.array(ops[op](t), copy=True)))[1])
    monkeypatch.setattr(_NewMemory, "prepare", lambda self, t: (t, True) if t.flags.c_contiguous else (
        np.ascontiguousarray(t), False))
    taken, is_tree = [0], collectives._is_tree

    def counted_general(x: Any) -> bool:
        taken[0] += 1
        return is_tree(x)
    monkeypatch.setattr(collectives, "_is_tree", counted_general)
    _NewMemory.declines, _NewMemory.seen = declines, []
    _NewMemory.rows.clear()
    dist.init("new-memory", timeout=5)
    try:
        monkeypatch.setattr(Group, "world_size", property(lambda self: 2))
        dist.set_checks(checks)
        dist.allreduce(np.ones(2, np.float32))  # (NumPy's array class seen: the short path knows it now)

        def each(op: str, strided: bool, quick: bool, x: Any, base: Any, out: Any, rows: int, seq: int) -> None:
            if quick:
                assert taken[0] == 0, (op, strided)
                assert len(_NewMemory.rows) == rows + checks
                if checks:
                    assert Call.decode(_NewMemory.rows[-1]) == Call(
                        "allreduce", op=op, dtype="float32", shape=(6,), tkind="cpu", seq=seq)
                kinds = [k for k, _ in _NewMemory.seen]
                expect = ["allreduce"] if strided else (
                    ["allreduce_new", "allreduce"] if declines else ["allreduce_new"])
                assert kinds == expect, (op, strided, kinds)
                assert not np.shares_memory(_NewMemory.seen[-1][1], base) or kinds[-1] == "allreduce_new"
            assert not np.shares_memory(out, x)
        got = _both_ways(_NewMemory, monkeypatch, taken, checks, each)
        np.testing.assert_array_equal(got[0], np.arange(1, 13, 2))  # (min: x's values)
    finally:
        monkeypatch.undo()
        dist.shutdown()


class _Reads(_OneRank):
    """A one-process engine whose primitives never write their inputs (``writes_inputs`` False, as
    JAX's): each makes a new array; it records what each primitive was handed."""

    name = "reads-only"
    writes_inputs = False
    seen: list[tuple[str, Any]] = []  # noqa: RUF012 - (primitive, its tensor), for the tests

    def allreduce(self, t: Any, op: str) -> eng.Handle:
        self.seen.append(("allreduce", t))
        return _Done(np.array(t, copy=True))


@pytest.mark.parametrize("checks", [False, True])
def test_the_short_out_of_place_allreduce_hands_an_engine_that_never_writes_its_input_the_input(
        monkeypatch: pytest.MonkeyPatch, checks: bool) -> None:
    """An engine that never writes its inputs, without ``allreduce_new``: a synchronous out-of-place
    call takes the short path (the general path's first step never reached), hands the primitive x
    itself (contiguous; a strided x the engine's own copy), as the general path (the short path
    turned off) does, exchanges its record where checked, gives the general path's result and
    leaves x as it was."""
    from multidev.distributed import collectives
    from multidev.distributed.group import Group

    if "reads-only" not in dist.engine_names():
        dist.register_engine("reads-only", _Reads)
    ops = {"sum": lambda t: t + t, "prod": lambda t: t * t, "max": lambda t: t, "min": lambda t: t}
    monkeypatch.setattr(_Reads, "allreduce", lambda self, t, op: (
        self.seen.append(("allreduce", t)), _Done(np.array(ops[op](t), copy=True)))[1])
    monkeypatch.setattr(_Reads, "prepare", lambda self, t: (t, True) if t.flags.c_contiguous else (
        np.ascontiguousarray(t), False))
    taken, is_tree = [0], collectives._is_tree

    def counted_general(x: Any) -> bool:
        taken[0] += 1
        return is_tree(x)
    monkeypatch.setattr(collectives, "_is_tree", counted_general)
    _Reads.seen = []
    _Reads.rows.clear()
    dist.init("reads-only", timeout=5)
    try:
        monkeypatch.setattr(Group, "world_size", property(lambda self: 2))
        dist.set_checks(checks)
        dist.allreduce(np.ones(2, np.float32))  # (NumPy's array class seen: the short path knows it now)

        def each(op: str, strided: bool, quick: bool, x: Any, base: Any, out: Any, rows: int, seq: int) -> None:
            assert (taken[0] == 0) == quick, (op, strided, quick)
            assert len(_Reads.rows) == rows + checks
            if checks:
                assert Call.decode(_Reads.rows[-1]) == Call(
                    "allreduce", op=op, dtype="float32", shape=(6,), tkind="cpu", seq=seq)
            assert [k for k, _ in _Reads.seen] == ["allreduce"]
            assert (_Reads.seen[0][1] is x) == (not strided), (op, strided, quick)  # (either path: no private copy)
        got = _both_ways(_Reads, monkeypatch, taken, checks, each)
        np.testing.assert_array_equal(got[0], np.arange(1, 13, 2))  # (min: x's values)
    finally:
        monkeypatch.undo()
        dist.shutdown()


class _ReadsNew(_Reads):
    """:class:`_Reads` with an ``allreduce_new`` of its own."""

    name = "reads-only-new"

    def allreduce_new(self, t: Any, op: str) -> eng.Handle | None:
        self.seen.append(("allreduce_new", t))
        return _Done(np.array(t, copy=True))


def test_the_short_path_keeps_the_allreduce_new_of_an_engine_that_never_writes_its_inputs() -> None:
    """An engine that never writes its inputs and has an ``allreduce_new`` of its own: a synchronous
    out-of-place call hands x to ``allreduce_new``, as the general path does."""
    if "reads-only-new" not in dist.engine_names():
        dist.register_engine("reads-only-new", _ReadsNew)
    _ReadsNew.seen = []
    dist.init("reads-only-new", timeout=5)
    try:
        x = np.arange(6, dtype=np.float32)
        for _ in range(2):  # (the first call meets NumPy's array class: the general path; then the short one)
            _ReadsNew.seen.clear()
            np.testing.assert_array_equal(dist.allreduce(x), x)
            assert [k for k, _ in _ReadsNew.seen] == ["allreduce_new"] and _ReadsNew.seen[0][1] is x
    finally:
        dist.shutdown()


@pytest.mark.parametrize("inplace", [False, True])
def test_the_short_allreduce_keeps_no_copy_in_an_error_and_refuses_too_many_dimensions(
        monkeypatch: pytest.MonkeyPatch, inplace: bool) -> None:
    """A checked short call whose exchange fails keeps no copy of x in the error's frames (the engine's
    copy of a strided x, here); a tensor of more than MAX_DIMS dimensions is the general path's to refuse,
    typed, and nothing is reduced."""
    from multidev.distributed import collectives
    from multidev.distributed.consistency import MAX_DIMS

    if "new-memory" not in dist.engine_names():
        dist.register_engine("new-memory", _NewMemory)
    monkeypatch.setattr(_NewMemory, "prepare", lambda self, t: (t, True) if t.flags.c_contiguous else (
        np.ascontiguousarray(t), False))
    _NewMemory.declines, _NewMemory.seen = False, []
    dist.init("new-memory", timeout=5)
    try:
        dist.allreduce(np.ones(2, np.float32))  # (NumPy's array class seen: the short path knows it now)
        _NewMemory.seen.clear()
        x = np.arange(12, dtype=np.float32)[::2]

        def lost(*a: Any) -> None:
            raise dist.DistributedError("the exchange failed")
        monkeypatch.setattr(collectives, "agree_made", lost)
        with pytest.raises(dist.DistributedError, match="the exchange failed") as info:
            dist.allreduce(x, inplace=inplace)
        frames = []
        tb = info.value.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        assert any(f.f_code.co_name == "_quick" for f in frames)
        for f in frames:
            for name, v in f.f_locals.items():
                assert not (isinstance(v, np.ndarray) and v is not x and v.shape == x.shape
                            and v.flags.c_contiguous and np.array_equal(v, x)), (f.f_code.co_name, name)
        assert _NewMemory.seen == []
        monkeypatch.undo()
        deep = np.ones((1,) * (MAX_DIMS + 1), np.float32)
        with pytest.raises(md.CollectiveInputError, match=f"at most {MAX_DIMS} dimensions"):
            dist.allreduce(deep, inplace=inplace)
        assert _NewMemory.seen == []
    finally:
        dist.shutdown()


def test_refused_inputs_change_nothing_and_are_typed(one_rank: Any) -> None:
    ints = np.arange(3, dtype=np.int32)
    with pytest.raises(md.CollectiveInputError, match="mean"):
        dist.allreduce(ints, op="mean")
    frozen = np.ones(3, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(md.CapabilityError, match="inplace"):
        dist.allreduce(frozen, inplace=True)
    np.testing.assert_array_equal(frozen, 1)
    with pytest.raises(md.CollectiveInputError, match="src"):
        dist.broadcast(np.ones(2), src=3)
    with pytest.raises(md.CollectiveInputError, match="axis"):
        dist.allgather(np.float32(1.0))
    with pytest.raises(md.UnsupportedTensorError):
        dist.allreduce("not a tensor")
    assert dist.allreduce(np.ones(2, np.float32))[0] == 1  # the group is fine after refusals


def test_an_infinite_timeout_waits_a_year() -> None:
    """init and set_timeout take ``float("inf")`` (or any longer wait) as a year: no runtime's clock
    takes an infinite wait (torch's timedelta, a thread's join overflow on one), and a year is
    forever to a job."""
    from multidev.distributed.group import current

    MAX_TIMEOUT = dist.MAX_TIMEOUT
    if "one-rank" not in dist.engine_names():
        dist.register_engine("one-rank", _OneRank)
    dist.init("one-rank", timeout=float("inf"), rendezvous_timeout=1e300)
    try:
        assert current().timeout == MAX_TIMEOUT == 365 * 86400.0
        dist.set_timeout(5.0)
        assert current().timeout == 5.0
        dist.set_timeout(float("inf"))
        assert current().timeout == MAX_TIMEOUT
        assert dist.allreduce(np.ones(2, np.float32))[0] == 1
        with pytest.raises(md.DistributedSetupError, match="positive"):
            dist.set_timeout(float("nan"))
    finally:
        dist.shutdown()


def test_the_checks_can_be_turned_off_and_on_collectively(one_rank: Any) -> None:
    n = len(_OneRank.rows)
    dist.allreduce(np.ones(2, np.float32))
    assert len(_OneRank.rows) == n + 1  # one exchange per checked call
    dist.set_checks(False)
    assert not dist.checks_enabled()
    dist.allreduce(np.ones(2, np.float32))
    assert len(_OneRank.rows) == n + 2  # the setting's exchange, none for the call
    dist.allgather(np.ones(2, np.float32))
    assert len(_OneRank.rows) == n + 3  # the gathers exchange their lengths anyway
    dist.set_checks(True)
    assert dist.checks_enabled()
    with pytest.raises(dist.DistributedError, match="True or False"):
        dist.set_checks(1)  # type: ignore[arg-type]


def test_transport_paths_say_how_a_tensor_travels(one_rank: Any) -> None:
    assert dist.transport_path(md.ones(3, backend="numpy")) == "native"
    assert dist.transport_path(md.ones(3, backend="numpy", device=md.devices(backend="numpy")[-1])) == "dlpack"
    assert dist.carries("float64")  # what the transport (NumPy) holds: bfloat16 only with ml_dtypes
    assert dist.carries("bfloat16") == ("bfloat16" in md.backend("numpy").capabilities.dtypes)


class _NewMemory(_OneRank):
    """A one-process engine that reduces into new memory (:meth:`Engine.allreduce_new`), or declines
    when ``declines``; it records what each primitive was handed."""

    name = "new-memory"
    declines = False
    seen: list[tuple[str, Any]] = []  # noqa: RUF012 - (primitive, its tensor), for the tests

    def allreduce(self, t: Any, op: str) -> eng.Handle:
        self.seen.append(("allreduce", t))
        return _Done(t)

    def allreduce_new(self, t: Any, op: str) -> eng.Handle | None:
        self.seen.append(("allreduce_new", t))
        return None if self.declines else _Done(np.array(t, copy=True))


@pytest.mark.parametrize("declines", [False, True])
def test_out_of_place_allreduce_hands_the_engine_its_input_only_to_read(declines: bool) -> None:
    """A synchronous out-of-place call gives an engine with ``allreduce_new`` the input's own memory
    (no private copy first); one that declines, an async call and an in-place call get what the
    other engines get: a private copy to write into, or (in place) the input itself."""
    if "new-memory" not in dist.engine_names():
        dist.register_engine("new-memory", _NewMemory)
    _NewMemory.declines, _NewMemory.seen = declines, []
    dist.init("new-memory", timeout=5)
    try:
        x = md.asarray(np.arange(6, dtype=np.float32), device=md.devices(backend="numpy")[-1])
        before = np.array(x, copy=True)
        for op in ("sum", "mean"):
            _NewMemory.seen.clear()
            y = dist.allreduce(x, op=op)
            np.testing.assert_array_equal(np.asarray(y), before)  # one rank: its own values (mean: / 1)
            assert md.device_of(y) == md.device_of(x) and not np.shares_memory(np.asarray(y), np.asarray(x))
            kinds = [k for k, _ in _NewMemory.seen]
            assert kinds == (["allreduce_new", "allreduce"] if declines else ["allreduce_new"]), kinds
            assert np.shares_memory(_NewMemory.seen[0][1], np.asarray(x))  # read where it lies
            if declines:  # the primitive that may write got a private copy
                assert not np.shares_memory(_NewMemory.seen[1][1], np.asarray(x))
        _NewMemory.seen.clear()
        dist.allreduce(x, async_op=True).wait()
        assert [k for k, _ in _NewMemory.seen] == ["allreduce"]
        assert not np.shares_memory(_NewMemory.seen[0][1], np.asarray(x))  # x may change before wait()
        _NewMemory.seen.clear()
        assert dist.allreduce(x, inplace=True) is x
        assert [k for k, _ in _NewMemory.seen] == ["allreduce"] and np.shares_memory(_NewMemory.seen[0][1],
                                                                                      np.asarray(x))
        np.testing.assert_array_equal(np.asarray(x), before)
    finally:
        dist.shutdown()


class _JaxTransport(_OneRank):
    """A one-process engine whose transport is JAX (what it can hold follows ``jax_enable_x64``)."""

    name = "jax-transport"
    tensors = "jax"

    def transport_for(self, device: md.Device) -> tuple[str, md.Device]:
        return "jax", md.Device("cpu", 0)


def test_a_kept_placement_is_found_again_when_the_transport_changes_what_it_holds() -> None:
    """The group keeps where each kind of tensor travels; once JAX's 64-bit mode is switched off, a
    float64 call is refused again (CapabilityError, the group still usable), as before it was kept."""
    jax = pytest.importorskip("jax", reason="the transport here is JAX's, whose dtypes follow jax_enable_x64")
    if "jax-transport" not in dist.engine_names():
        dist.register_engine("jax-transport", _JaxTransport)
    was = bool(jax.config.jax_enable_x64)
    try:
        jax.config.update("jax_enable_x64", True)
        dist.init("jax-transport", timeout=5)
        x = np.ones(3)
        assert md.dtype_of(dist.allreduce(x)) == "float64"
        jax.config.update("jax_enable_x64", False)
        assert not dist.carries("float64")
        with pytest.raises(md.CapabilityError, match="float64"):
            dist.allreduce(x)
        np.testing.assert_array_equal(np.asarray(dist.allreduce(np.ones(2, np.float32))), 1)  # still usable
    finally:
        if dist.is_initialized():
            dist.shutdown()
        jax.config.update("jax_enable_x64", was)


_SLOW_RANK = """
import sys, time
import numpy as np
import multidev.distributed as dist
dist.init("mpi", timeout=5)
dist.allreduce(np.ones(4))
if dist.rank() == 1:
    time.sleep(12)  # still working when rank 0 exits: its MPI_Finalize waits for this rank
print(f"MDLEFT {dist.rank()} {time.time():.3f}", flush=True)
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_mpi_exit_waits_for_a_working_rank_and_not_for_a_lost_one() -> None:
    """At exit the mpi engine's MPI_Finalize waits, as MPI's own does, for a rank still working
    (12 s here, beyond the group's 5 s timeout): both exit 0. After a lost rank it is bounded (the
    conformance suite's killed-rank check: the survivors end within its deadline)."""
    from multidev.conformance.test_distributed import engine_unavailable, worker_env

    why = engine_unavailable("mpi")
    if why:
        pytest.skip(why)
    cmd = eng.engine_class("mpi").launch_command(2, [sys.executable, "-c", _SLOW_RANK])
    assert cmd is not None
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    left = sorted(ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("MDLEFT"))
    assert left == ["0", "1"], p.stdout
    assert took >= 12, f"the job ended after {took:.1f} s, before its slow rank's work was done"


_JAX_LATE_PEER = """
import os, sys, time
from multidev import distributed as dist
dist.init("jax", timeout=60)
import jax.numpy as jnp
dist.set_checks(False)
n = int(sys.argv[1])
x = jnp.ones(n, jnp.float32)
for _ in range(3):  # (the function has run: a later dispatch of it may still run it, see below)
    dist.allreduce(x).block_until_ready()
dist.set_timeout(2)
from multidev.distributed.group import current
if dist.rank() == 1:
    time.sleep(12)  # alive, never calling: rank 0's collective has no peer until this rank leaves
    os._exit(0)
print(f"MDCOSTLY {len(current().engine._costly_fns)}", flush=True)  # (functions the caller dispatches itself)
print(f"MDFAST {current().engine._make is not None and bool(current().engine._avals)}", flush=True)  # (the constructor)
t = time.monotonic()
try:
    hs = [dist.allreduce(x, async_op=True) for _ in range(int(sys.argv[2]))]
    print(f"MDSUBMITTED {time.monotonic() - t:.2f}", flush=True)
    hs[0].wait()
    print("MDRESULT none", flush=True)
except dist.DistributedError as e:
    print(f"MDRESULT {type(e).__name__} {time.monotonic() - t:.2f} {'rank 1' in str(e)}", flush=True)
os._exit(0)
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("n, calls", [(1, 1), (1024, 40), (65536, 40)],
                         ids=["a-cheap-call", "40-calls-in-flight", "40-costly-calls-in-flight"])
def test_a_jax_collective_whose_peer_never_comes_times_out_on_the_callers_deadline(n: int, calls: int,
                                                                                   tmp_path: Any) -> None:
    """XLA's CPU client runs a cheap computation (under 1,000 flops: a 1-element allreduce) inside its
    dispatch on every call, and makes the 33rd computation in flight wait inside the dispatch for
    the first: either would hold a caller that dispatched itself until the peer's connection closed
    (12 s here), then raise gloo's error as a refused input. The engine's dispatch thread keeps the
    caller on its own deadline (2 s): DistributedTimeoutError naming the rank, the async calls handed
    back at once. A costly allreduce (65,536 flops) that has run once is dispatched by the caller
    (the first of the 40 here), the ones after it, with it in flight, by the thread."""
    from multidev.conformance.test_distributed import engine_unavailable, worker_env

    why = engine_unavailable("jax")
    if why:
        pytest.skip(why)
    script = tmp_path / "late_peer.py"
    script.write_text(_JAX_LATE_PEER)
    cmd = [sys.executable, "-m", "multidev.distributed.launch", "-n", "2", "--grace", "30", "--engine", "jax",
           str(script), str(n), str(calls)]
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=120)
    out = p.stdout.split()
    assert "MDRESULT" in out, p.stdout[-2000:] + p.stderr[-2000:]
    submitted = float(out[out.index("MDSUBMITTED") + 1]) if "MDSUBMITTED" in out else float("inf")
    kind, took, named = out[out.index("MDRESULT") + 1:out.index("MDRESULT") + 4]
    assert kind == "DistributedTimeoutError" and named == "True", p.stdout[-2000:]
    assert submitted < 1.0 and float(took) < 8.0, p.stdout[-2000:]
    assert out[out.index("MDCOSTLY") + 1] == ("1" if n >= 8000 else "0"), p.stdout[-2000:]
    assert out[out.index("MDFAST") + 1] == "True", p.stdout[-2000:]  # (later global arrays: JAX's constructor)


_JAX_DELETED = """
import time
import jax.numpy as jnp
import numpy as np
from multidev import distributed as dist
dist.init("jax", timeout=30)
import jax
for shape in ((), (0,), (3,)):
    x = jnp.ones(shape, jnp.float32)
    if dist.rank() == 0:
        x.delete()
    t = time.monotonic()
    try:
        dist.allreduce(x)
        print("MDRESULT none", flush=True)
    except dist.DistributedError as e:
        print(f"MDRESULT {type(e).__name__} {time.monotonic() - t:.2f} {'rank 0' in str(e)}", flush=True)
    except Exception as e:
        print(f"MDRESULT {type(e).__name__} {time.monotonic() - t:.2f} own", flush=True)
y = dist.allreduce(jnp.ones(3, jnp.float32))  # (the group still usable)
print(f"MDAFTER {np.asarray(y).tolist()}", flush=True)
x = jnp.ones(3, jnp.float32)  # (a point-to-point message: the refusal travels in its header)
t = time.monotonic()
try:
    if dist.rank() == 0:
        x.delete()
        dist.send(x, 1)
        print("MDRESULT none", flush=True)
    else:
        dist.recv(0, backend="jax")
        print("MDRESULT none", flush=True)
except dist.DistributedError as e:
    print(f"MDRESULT {type(e).__name__} {time.monotonic() - t:.2f} {'rank 0' in str(e)}", flush=True)
except Exception as e:
    print(f"MDRESULT {type(e).__name__} {time.monotonic() - t:.2f} own", flush=True)
if dist.rank() == 0:
    dist.send(jnp.full(2, 5.0, jnp.float32), 1)
else:
    print(f"MDAFTER {np.asarray(dist.recv(0, backend='jax')).tolist()}", flush=True)
dist.shutdown()
"""


@pytest.mark.multiprocess
def test_a_deleted_jax_array_is_refused_on_every_rank_before_anything_is_sent(tmp_path: Any) -> None:
    """A deleted (or donated) JAX array on one rank, 0-d, empty or not, in a collective or sent to
    the other: that rank raises InvalidArgumentError and the other a DistributedError naming its
    refusal, at once (the engine's checks refuse it before the records or the message's header
    travel), and the group stays usable."""
    from multidev.conformance.test_distributed import engine_unavailable, worker_env

    why = engine_unavailable("jax")
    if why:
        pytest.skip(why)
    script = tmp_path / "deleted.py"
    script.write_text(_JAX_DELETED)
    cmd = [sys.executable, "-m", "multidev.distributed.launch", "-n", "2", "--engine", "jax", str(script)]
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("MDRESULT")]
    assert len(lines) == 8, p.stdout[-2000:]
    kinds = sorted(ln[1] for ln in lines)
    assert kinds == ["DistributedError"] * 4 + ["InvalidArgumentError"] * 4, p.stdout[-2000:]
    assert all(float(ln[2]) < 10 for ln in lines), p.stdout[-2000:]  # (not the group's 30 s timeout)
    assert all(ln[3] == "True" for ln in lines if ln[1] == "DistributedError"), p.stdout[-2000:]
    assert p.stdout.count("MDAFTER [2.0, 2.0, 2.0]") == 2 and "MDAFTER [5.0, 5.0]" in p.stdout, p.stdout[-2000:]


_MPI_BUFFERS = """
import numpy as np
import multidev.distributed as dist
dist.init("mpi", timeout=30)
r, w = dist.rank(), dist.world_size()
want = np.arange(6) * w + w * (w - 1) / 2
for dt in (">f4", "<f8", ">i8", "float16", "bool"):  # big-endian ones: MPI reduces in the machine's order
    a = (np.arange(6) + r).astype(dt)
    x, keep = a.copy(), a.copy()
    y = dist.allreduce(x, op="max" if dt == "bool" else "sum")
    exp = (np.arange(6) + w - 1 > 0) if dt == "bool" else want
    assert np.array_equal(np.asarray(y, dtype=float), exp), (dt, y)
    assert np.array_equal(x, keep) and not np.shares_memory(x, y), dt  # out of place: x unchanged, not aliased
    ro = a.copy(); ro.flags.writeable = False
    assert np.array_equal(np.asarray(dist.allreduce(ro, op="max" if dt == "bool" else "sum"), dtype=float), exp), dt
    assert dist.allreduce(x, op="max" if dt == "bool" else "sum", inplace=True) is x, dt
    assert np.array_equal(np.asarray(x, dtype=float), exp), (dt, x)
try:
    from ml_dtypes import bfloat16
except ImportError:
    bfloat16 = None
for dt in ("float16",) + ((bfloat16,) if bfloat16 is not None else ()):  # reduced through a float32 copy
    for n in (1000, 4000, 100000):  # (that copy must outlive the nonblocking call: it was freed under it)
        for _ in range(5):
            got = dist.reduce_scatter((np.arange(n) % 7 + r).astype(dt))
            exp = ((np.arange(n) % 7) * w + w * (w - 1) / 2).reshape(w, -1)[r]
            assert np.array_equal(np.asarray(got, dtype=float), exp), (dt, n, got[:8])
print(f"MDOK {r}", flush=True)
dist.shutdown()
"""


@pytest.mark.multiprocess
def test_mpi_allreduce_reduces_every_byte_order_read_only_and_in_place() -> None:
    """The mpi engine's allreduce in and out of place over inputs MPI cannot take as they are
    (big-endian arrays: copied into the machine's byte order; read-only ones) and over dtypes it
    reduces through a view or a copy (bool, float16): values right, inputs unchanged out of place.
    (Big-endian arrays were summed as native ones, into garbage, before.) And reduce_scatter of
    bfloat16 and float16, which go through a float32 copy (it was freed while MPI still read it)."""
    from multidev.conformance.test_distributed import engine_unavailable, worker_env

    why = engine_unavailable("mpi")
    if why:
        pytest.skip(why)
    cmd = eng.engine_class("mpi").launch_command(2, [sys.executable, "-c", _MPI_BUFFERS])
    assert cmd is not None
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert sorted(ln for ln in p.stdout.splitlines() if ln.startswith("MDOK")) == ["MDOK 0", "MDOK 1"], p.stdout


def test_the_torch_engine_chooses_nccl_only_where_no_two_ranks_share_a_gpu() -> None:
    """NCCL refuses two ranks on one GPU ("invalid usage": seen on a one-GPU H200 with 3 ranks), so
    the torch engine's default transport is NCCL only where every rank has a GPU of its own, told
    apart by identity (ranks that each see one GPU through CUDA_VISIBLE_DEVICES have different ones)."""
    from types import SimpleNamespace

    from multidev.adapters.torch.engine import _a_gpu_per_rank, _gpu_identity

    assert _a_gpu_per_rank([11, 12])              # two ranks, two GPUs
    assert not _a_gpu_per_rank([11, 11, 11])      # three ranks on one GPU
    assert not _a_gpu_per_rank([11, 0])           # a rank without a GPU
    assert not _a_gpu_per_rank([11, 12, 12])      # two of three share one

    def fake_torch(uuids: list[str]) -> Any:
        return SimpleNamespace(cuda=SimpleNamespace(get_device_properties=lambda i: SimpleNamespace(uuid=uuids[i])))

    a, b = _gpu_identity(fake_torch(["GPU-a"]), 0), _gpu_identity(fake_torch(["GPU-b"]), 0)
    assert a != b and a != 0 and b != 0          # device 0 of each rank, two physical GPUs
    assert _gpu_identity(fake_torch(["GPU-x", "GPU-a"]), 1) == a  # the same GPU seen at another index


def test_the_mesh_calls_checks_ask_the_engine_to_admit_its_own_kind_of_tensor(one_rank: Any,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A process-mesh or layout call's checks (``checked_input``) ask the engine's ``admit`` about a
    tensor of the engine's own kind, so what its ``prepare`` would refuse (a deleted JAX array) is this
    rank's refusal inside the agreed exchange, also where the transport tensor is made after it; a
    tensor of another backend is converted later and not asked about."""
    from multidev.distributed.mesh import checked_input

    asked: list[Any] = []

    def admit(self: Any, t: Any) -> bool:
        asked.append(t)
        if t.dtype == np.float64:
            raise md.InvalidArgumentError("this engine takes no float64 here")
        return True
    monkeypatch.setattr(_OneRank, "admit", admit)
    x = np.ones(3, np.float32)
    assert checked_input(x, "test")[1] == (3,) and asked == [x]
    with pytest.raises(md.InvalidArgumentError, match="no float64"):
        checked_input(np.ones(3), "test")
    torch = pytest.importorskip("torch")
    asked.clear()
    checked_input(torch.ones(3), "test")
    assert asked == []
