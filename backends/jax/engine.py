"""The ``jax`` engine: JAX's own multi-controller runtime (``jax.distributed``), no torch needed.

Launched as JAX users launch processes: ``JAX_COORDINATOR_ADDRESS`` (``host:port`` of process 0),
``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` in each process (``python -m multidev.distributed.launch``
sets them on one machine), or by a scheduler JAX recognises itself (Slurm's ``srun``). CPU
collectives go over gloo (``transport="mpi"`` picks JAX's MPI collectives), GPU collectives over
NCCL.

- The transport is JAX arrays on one device per process (the process's first local device of the
  default platform). A collective is a jitted computation over a *global* array made from each
  process's local shard (``jax.make_array_from_single_device_arrays`` over a one-axis mesh of those
  devices): a sum over the process axis with a replicated result is the allreduce, a replicated
  identity the allgather, an indexed row the broadcast, a sum or a row sharded back over the
  processes the reduce-scatter and the scatter. Results come back as this process's shard.
- Hangs: JAX's runtime waits forever for a process that never joins a collective (jax-ml/jax#38503)
  and aborts every process when one dies. So the consistency exchange goes through the
  coordination service's key-value store with a deadline (it names the processes whose rows did
  not arrive), primitives are polled (``Array.is_ready``) against the group's timeout,
  ``jax_enable_recoverability`` is turned on (a dead peer does not abort the others), and
  ``jax.distributed.initialize`` runs with a deadline of its own (its own timeout aborts the process).
- ``init`` must come before JAX computes anything (JAX's rule): DistributedError otherwise.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import importlib
import importlib.util
import math
import os
import queue
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np

import multidev as md
from multidev import Device
from multidev.distributed.engine import (
    Engine,
    Handle,
    Launch,
    Membership,
    Settings,
    check_port_free,
    check_rank,
    env_int,
    peer_errors,
    poll_until,
    run_with_deadline,
    translate_errors,
)
from multidev.errors import CapabilityError, DistributedError, DistributedSetupError, InvalidArgumentError

_generation = [0]
#: A thread Python did not start (XLA's, running a host callback): ``threading`` names it so.
_Foreign = getattr(threading, "_DummyThread", ())


def _in_host_callback() -> bool:
    """Whether this call runs inside a JAX host callback (``pure_callback``, ``io_callback``: JAX's
    callback module on the stack), where XLA's CPU client runs every computation inside its dispatch,
    whichever thread it is on (the one that dispatched the outer computation, often the main one)."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_CALLBACK_FILE):
            return True
        frame = frame.f_back
    return False


_CALLBACK_FILE = os.path.join("jax", "_src", "callback.py")
#: The least flops (XLA's cost analysis) of a collective the caller dispatches itself: eight times
#: the cost under which XLA's CPU client runs a computation inside its dispatch.
_INLINE_FLOPS = 8000.0


def _refuse_deleted(t: Any) -> None:
    """InvalidArgumentError for a deleted or donated JAX array (handed on as it is, a donated buffer
    can crash XLA)."""
    if getattr(t, "is_deleted", lambda: False)():
        raise InvalidArgumentError("the array was deleted or donated (jax.Array.delete, or donate_argnums "
                                   "of a jitted call): it holds no data to send")


def _array_constructor() -> Callable[..., Any] | None:
    """JAX's array class, whose constructor ``jax.make_array_from_single_device_arrays`` calls after
    its checks (``ArrayImpl(aval, sharding, arrays, committed=, _skip_checks=)`` from JAX 0.4 to
    0.11), or None where this JAX has none by that name."""
    try:
        from jax._src.array import ArrayImpl
    except ImportError:
        return None
    return ArrayImpl if callable(ArrayImpl) else None


def _poll_spin(local: int) -> float:
    """Seconds the engine's wait for a computation polls it back to back before yielding the CPU
    between polls: 1 ms where this process may run on two cores or more for each of the ``local``
    processes on this machine (the caller's poll and XLA's thread running the collective a core
    each), else none: there a spinning poll keeps XLA's threads from the collective it waits for
    (measured: docs/distributed.md)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (no affinity masks here: the machine's count)
        cores = os.cpu_count() or 1
    return 1e-3 if cores >= 2 * max(1, local) else 0.0


def _env_int(env: Mapping[str, str], *names: str) -> int | None:
    for n in names:
        v = env.get(n)
        if v not in (None, ""):
            try:
                return int(str(v))
            except ValueError:
                return None
    return None


def _split_address(address: str, what: str) -> tuple[str, int]:
    """``host:port`` as its parts; DistributedSetupError naming ``what`` when it is malformed."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise DistributedSetupError(f"{what}={address!r:.60} is not HOST:PORT with a port 1..65535 "
                                    "(JAX_COORDINATOR_ADDRESS=10.0.0.1:1234, say)")
    return host.strip("[]"), int(port)


#: Calls whose exchanged rows share a directory of the coordination service's store, deleted at once
#: (by rank 0, two blocks later): one deletion per block instead of one per rank and call.
_BLOCK = 32

class _Dispatcher:
    """One daemon thread that dispatches the engine's jitted collectives (but those the caller may
    dispatch itself, :meth:`JaxEngine._run`), in the order they were called (every rank must issue
    them in one order). XLA's CPU client may run a collective inside the dispatch itself, where gloo
    waits up to its own 30 s for a missing rank: from this thread the caller's deadline still holds
    (:class:`_Ready` polls the future). A daemon thread, not an executor's: one stuck in gloo must
    not hold up the interpreter's exit."""

    #: Seconds a stop waits for a dispatch still inside a collective (gloo gives up on a missing peer
    #: after 30 s): a thread killed inside XLA at interpreter exit aborts the process.
    DRAIN = 40.0

    def __init__(self) -> None:
        self.q: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="multidev jax engine dispatch", daemon=True)
        self.thread.start()

    def submit(self, fn: Callable[[], Any]) -> Future:
        fut: Future = Future()
        self.q.put((fn, fut))
        return fut

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            fn, fut = item
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - the caller's to raise
                fut.set_exception(e)

    def close(self, drop_pending: bool = False) -> None:
        """Stop the thread; when it is still inside a collective (a peer that never came), wait for
        the runtime to give up on it (at most :attr:`DRAIN` s): the interpreter's exit would kill
        it inside XLA's C++ code, which aborts the process ("FATAL: exception not rethrown").
        ``drop_pending`` (a group that lost a rank): the dispatches not started yet never start, their
        futures failed, so the wait covers the one running at most."""
        if drop_pending:
            while True:
                try:
                    item = self.q.get_nowait()
                except queue.Empty:
                    break
                if item is not None and item[1].set_running_or_notify_cancel():
                    item[1].set_exception(DistributedError("the jax engine stopped before this collective was "
                                                           "dispatched (the group had lost a rank)"))
        self.q.put(None)
        if threading.current_thread() is not self.thread:
            # (joined always: a flag saying whether a dispatch runs is set only after the thread took
            # it off the queue, too late for a check here; an idle thread takes the None and ends at once)
            self.thread.join(self.DRAIN)


class _Done:
    """A dispatch the caller made itself, complete: what :class:`_Ready` and
    :meth:`JaxEngine._settled` read of a future (``done``, ``result``, ``exception``), without a
    :class:`~concurrent.futures.Future`'s lock and condition (a hot path: every such call)."""

    __slots__ = ("error", "value")

    def __init__(self, value: Any, error: BaseException | None) -> None:
        self.value, self.error = value, error

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return self.value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self.error


class _Ready(Handle):
    """A JAX computation being dispatched (``fut``) and computed; ``pick`` gives the primitive's
    result from its output."""

    def __init__(self, engine: JaxEngine, fut: Future | _Done, pick: Callable[[Any], Any], what: str) -> None:
        self.engine, self.fut, self.pick, self.what = engine, fut, pick, what

    def test(self) -> bool:
        if not self.fut.done():
            return False
        try:
            return bool(self.fut.result().is_ready())
        except Exception:  # (classified by lost(): its context costs a call a poll on the way in)
            with self.engine.lost(self.what):
                raise

    def wait(self, timeout: float) -> bool:
        # the dispatch runs on the dispatcher's thread, which needs the GIL: its future is waited for
        # without holding it (a spin here kept it from that thread up to poll_until's 1 ms spin a
        # call); then the computation, which XLA's own threads finish, is polled
        start = time.monotonic()
        try:
            self.fut.exception(min(timeout, threading.TIMEOUT_MAX))  # (an infinite timeout overflows the lock's)
        except FutureTimeout:
            return False
        if not poll_until(self.test, max(0.0, timeout - (time.monotonic() - start)), spin=self.engine.spin):
            return False
        self.engine._completed()
        return True

    def result(self) -> Any:
        try:
            out = self.fut.result()
            out.block_until_ready()  # raises the computation's error, if any
            res = self.pick(out)
        except Exception:  # (classified by lost(), as test())
            with self.engine.lost(self.what):
                raise
        if self.engine._pending:  # (wait() dropped this one and those before it: mostly nothing is left)
            self.engine._completed()
        return res


class JaxEngine(Engine):
    name = "jax"
    conformance_worlds = (2,)
    tensors = "jax"
    writes_inputs = False  # JAX arrays are immutable: every primitive makes new ones
    matches_by_peer = False  # a message is a program both processes run, in the order they call it
    #: Seconds a wait for a computation polls back to back first (:func:`_poll_spin`, set at start).
    spin = 1e-3

    # -- launch ------------------------------------------------------------------------------
    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> Launch | None:
        e = environ
        if e.get("JAX_COORDINATOR_ADDRESS"):
            return Launch("jax", "JAX's coordinator variables",
                          f"JAX_COORDINATOR_ADDRESS={e['JAX_COORDINATOR_ADDRESS']} is set",
                          _env_int(e, "JAX_PROCESS_ID"), _env_int(e, "JAX_NUM_PROCESSES"),
                          _env_int(e, "MULTIDEV_LOCAL_RANK", "LOCAL_RANK"),
                          _env_int(e, "MULTIDEV_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"))
        if "SLURM_STEP_ID" in e and "SLURM_PROCID" in e:
            return Launch("jax", "Slurm's srun", f"SLURM_PROCID={e['SLURM_PROCID']} and SLURM_STEP_ID are set",
                          _env_int(e, "SLURM_PROCID"), _env_int(e, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
                          _env_int(e, "SLURM_LOCALID"), None, weak=True)
        return None

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("jax") is None:
            return "jax is not installed (pip install jax, or multidev[jax])"
        return None

    @classmethod
    def launch_env(cls, rank: int, world_size: int, address: str) -> dict[str, str]:
        return {"JAX_COORDINATOR_ADDRESS": address, "JAX_NUM_PROCESSES": str(world_size), "JAX_PROCESS_ID": str(rank),
                "MULTIDEV_LOCAL_RANK": str(rank), "MULTIDEV_LOCAL_WORLD_SIZE": str(world_size)}

    @classmethod
    def check_launch(cls, environ: Mapping[str, str], settings: Settings) -> None:
        world = settings.world_size if settings.world_size is not None else env_int(environ, "JAX_NUM_PROCESSES",
                                                                                       low=1)
        rank = settings.rank if settings.rank is not None else env_int(environ, "JAX_PROCESS_ID")
        check_rank(rank, world, "rank" if settings.rank is not None else "$JAX_PROCESS_ID",
                   "world_size" if settings.world_size is not None else "$JAX_NUM_PROCESSES")
        address = settings.address or environ.get("JAX_COORDINATOR_ADDRESS")
        if address:
            _split_address(address, "the coordinator address" if settings.address else "$JAX_COORDINATOR_ADDRESS")

    def start(self, settings: Settings) -> Membership:
        if "jax" not in sys.modules:  # the adapter's own import of JAX sets the virtual CPU count first
            # (an instance of the adapter class: the registry's checks of its own would start JAX's backends)
            importlib.import_module("multidev.adapters.jax").JaxBackend()
        import jax
        from jax._src import distributed as jd
        from jax._src import xla_bridge

        self.jax, self.timeout = jax, settings.timeout
        if _generation[0] > 0:
            raise CapabilityError("the jax engine cannot form a new group in a process whose group has ended (JAX's "
                                  "multi-controller runtime starts once per process); after a lost rank, restart the "
                                  "job with the ranks that remain (python -m multidev.distributed.launch -n N, or the "
                                  "launcher's restart policy)")
        if xla_bridge.backends_are_initialized():
            raise DistributedError("the jax engine must start before JAX computes anything (JAX's rule for "
                                   "jax.distributed): call multidev.distributed.init() first in the script")
        env = os.environ
        launch = settings.launch
        if settings.transport is not None:
            jax.config.update("jax_cpu_collectives_implementation", settings.transport)
        with contextlib.suppress(AttributeError, KeyError):  # older JAX: a dead peer aborts the others
            jax.config.update("jax_enable_recoverability", True)
        coordinator = settings.address or env.get("JAX_COORDINATOR_ADDRESS") or None
        if coordinator is None and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
            coordinator = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        world = settings.world_size if settings.world_size is not None else (
            _env_int(env, "JAX_NUM_PROCESSES") or (launch.world_size if launch else None))
        rank = settings.rank if settings.rank is not None else (
            _env_int(env, "JAX_PROCESS_ID") if "JAX_PROCESS_ID" in env else (launch.rank if launch else None))
        local = settings.local_rank if settings.local_rank is not None else (launch.local_rank if launch else None)
        local_world = launch.local_world_size if launch else None
        device_ids = None
        if (local is not None and (local_world or 0) > 1 and not env.get("JAX_LOCAL_DEVICE_IDS")
                and not env.get("CUDA_VISIBLE_DEVICES")):
            device_ids = [local]  # several processes on this machine: one GPU each (CPUs ignore it)
        rdv = settings.rendezvous_timeout
        if rank == 0 and coordinator:
            # process 0 serves the coordinator: JAX's runtime aborts the process (SIGSEGV) when the port
            # is taken ("Failed to add port to server"), so it is checked before JAX sees it
            host, port = _split_address(coordinator, "the coordinator address")
            check_port_free(host, port, f"the jax engine (process 0 serves the coordinator at {coordinator})")

        def initialize() -> None:
            orig = jd._jax.get_distributed_runtime_client

            def client(*a: Any, **k: Any) -> Any:
                # JAX's default reaction to a failed connect is to abort the process; any callback
                # turns it into an exception of initialize (which the deadline below beats anyway)
                k.setdefault("missed_heartbeat_callback", lambda *args: None)
                return orig(*a, **k)
            jd._jax.get_distributed_runtime_client = client
            try:
                jax.distributed.initialize(coordinator, world, rank, local_device_ids=device_ids,
                                           initialization_timeout=math.ceil(rdv) + 5)
            finally:
                jd._jax.get_distributed_runtime_client = orig
        try:
            with translate_errors("jax.distributed.initialize"):
                run_with_deadline(initialize, rdv, f"jax.distributed.initialize (coordinator {coordinator})")
        except md.InvalidArgumentError as e:  # JAX's ValueError: what it could not find
            raise DistributedError(f"the jax engine: {e}. Set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and "
                                   "JAX_PROCESS_ID (or pass master_addr=, master_port=, world_size=, rank=)") from e
        self.client = jd.global_state.client
        self.rank, self.world = jax.process_index(), jax.process_count()
        _generation[0] += 1
        self.prefix = f"multidev/{_generation[0]}"
        # transport="gloo"/"mpi": CPU collectives even beside GPUs (GPU arrays staged through the host)
        self.platform = "cpu" if settings.transport is not None else jax.default_backend()
        devs = []
        every = jax.devices(self.platform)
        for p in range(self.world):
            mine = sorted((d for d in every if d.process_index == p), key=lambda d: d.id)
            if not mine:
                raise DistributedError(f"the jax engine: process {p} has no {self.platform} device")
            devs.append(mine[0])
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        self.devs = devs
        self.mesh = Mesh(np.array(devs, dtype=object), ("p",))
        self.native = devs[self.rank]
        self.device = md.backend("jax").from_native_device(self.native) or Device("cpu", 0)
        self.sharded = NamedSharding(self.mesh, PartitionSpec("p"))
        self.whole = NamedSharding(self.mesh, PartitionSpec())
        # where a shard already is when device_put would copy nothing (it still costs ~20 us a call)
        self._home = jax.device_put(np.zeros(1, np.float32), self.native).sharding
        self._fns: dict[tuple, Callable[[Any], Any]] = {}
        self._pairs: dict[tuple[int, int], JaxEngine] = {}
        self._lock = threading.Lock()
        self._dispatch = _Dispatcher()
        # (the caller's own dispatches, _run: functions dispatched once, those the caller may dispatch,
        # and the dispatches not seen complete, the last one until the next call; shared with the
        # subgroups' views)
        self._seen: set[Any] = set()
        self._costly_fns: set[Any] = set()
        self._pending: collections.deque[Future | _Done] = collections.deque()
        # (_global: the abstract value of each shape and dtype's global array, and JAX's array constructor)
        self._avals: dict[tuple[Any, ...], Any] = {}
        self._make: Callable[..., Any] | None = _array_constructor()
        self._order = threading.Lock()
        # (read once the CPU client has started, as it did: a synchronous client runs every computation
        # inside its dispatch)
        self._async_cpu = jax.config.values.get("jax_cpu_enable_async_dispatch") is True
        self.spin = _poll_spin(local_world or self.world)
        impl = jax.config.jax_cpu_collectives_implementation if self.platform == "cpu" else "NCCL"
        return Membership(self.rank, self.world, local,
                          f"JAX {jax.__version__} multi-controller, {self.platform} collectives over {impl}")

    def stop(self, healthy: bool) -> None:
        jax = getattr(self, "jax", None)
        if jax is None:
            return
        if healthy and getattr(self, "client", None) is not None:
            with contextlib.suppress(Exception):  # every rank leaves together: process 0 serves the others
                self.exchange(-2, [0], min(self.timeout, 10.0))
            if self.rank == 0:
                time.sleep(0.2)  # the others disconnect from process 0's service before it stops
        dispatch = getattr(self, "_dispatch", None)
        if dispatch is not None:
            # before the runtime goes: a dispatch still inside a collective ends first (after a lost rank,
            # the ones queued behind it never start)
            dispatch.close(drop_pending=not healthy)
        pending, order = getattr(self, "_pending", None), getattr(self, "_order", None)
        if pending is not None and order is not None:
            with order:
                pending.clear()  # (no result or error kept past the group)
        with contextlib.suppress(Exception):
            jax.distributed.shutdown()
        self.client = None

    def prepare(self, t: Any) -> tuple[Any, bool]:
        """``t`` as it is (JAX arrays are immutable); InvalidArgumentError for a deleted or donated
        array, in the call's checks, so every rank hears of it before anything is sent."""
        _refuse_deleted(t)
        return t, True

    def admit(self, t: Any) -> bool:
        """:meth:`prepare`'s refusal without its work (it makes nothing): True for a live array."""
        _refuse_deleted(t)
        return True

    def lost(self, what: str, timeout: float | None = None) -> Any:
        return peer_errors(f"the jax engine: {what}", (RuntimeError, TimeoutError, ConnectionError),
                           self.timeout if timeout is None else timeout)

    # -- placement -----------------------------------------------------------------------------
    def transport_for(self, device: Device) -> tuple[str, Device]:
        return "jax", self.device

    # -- the consistency channel -----------------------------------------------------------------
    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        c = self.client
        if c is None:
            raise DistributedError("the jax engine's coordination client is gone (the group was stopped)")
        key = lambda p: f"{self.prefix}/{seq // _BLOCK}/{seq}/{p}"  # a block of calls: one directory
        deadline = time.monotonic() + timeout
        out: list[list[int] | None] = [None] * self.world
        with self.lost(f"the consistency exchange (call #{seq}) through the coordination service", timeout):
            c.key_value_set(key(self.rank), ",".join(str(int(v)) for v in row))
            out[self.rank] = [int(v) for v in row]  # this rank's own: no round trip for it
            for p in range(self.world):
                if p == self.rank:
                    continue
                left = deadline - time.monotonic()
                raw = None
                if left > 0:
                    try:
                        raw = c.blocking_key_value_get(key(p), max(1, int(left * 1000)))
                    except RuntimeError as e:  # DEADLINE_EXCEEDED: that rank's row is missing
                        if "DEADLINE" not in str(e).upper():
                            raise
                if raw is None:
                    try:
                        raw = c.key_value_try_get(key(p))
                    except RuntimeError:  # NOT_FOUND
                        raw = None
                if raw is not None:
                    out[p] = [int(v) for v in str(raw).split(",")]
            if seq >= 2 * _BLOCK and seq % _BLOCK == 0 and self.rank == 0 and all(r is not None for r in out):
                with contextlib.suppress(RuntimeError):  # every rank has read the rows of calls before seq-1
                    c.key_value_delete(f"{self.prefix}/{seq // _BLOCK - 2}")  # (a directory: all its keys)
        return out

    # -- primitives ------------------------------------------------------------------------------
    def _global(self, t: Any) -> tuple[Any, tuple[int, ...]]:
        """The global array of every process's ``t`` and the local shape: ``t`` itself is the shard
        (along its first axis, so nothing is copied; a 0-d or empty ``t`` gets a leading axis of
        one first), and the jitted functions view the result as ``(world_size, *local)``. The first
        of a shape and dtype is ``jax.make_array_from_single_device_arrays``'; later ones are JAX's
        array constructor given that one's abstract value, without the checks that function makes
        again on every call (its device and shape, which this engine has just made sure of): 3-4
        against 13-19 µs a call. Where the constructor refuses an array the function takes, this
        JAX's constructor differs: the function from then on."""
        jax = self.jax
        _refuse_deleted(t)  # (before the reshape below, which a deleted array fails as a runtime error)
        shape = tuple(t.shape)
        if not shape or shape[0] == 0:
            t = t.reshape((1, *shape))
        local = tuple(t.shape)
        sh = getattr(t, "sharding", None)
        if sh is None or sh.device_set != self._home.device_set or sh.memory_kind != self._home.memory_kind:
            t = jax.device_put(t, self._home)  # (the device's own memory: an array in pinned host memory too)
        key = (local, t.dtype)
        aval = self._avals.get(key)
        if aval is not None and self._make is not None:
            try:
                return self._make(aval, self.sharded, [t], committed=True, _skip_checks=True), local
            except Exception:  # noqa: BLE001 - the public function decides below: t's error, or the constructor's
                g = jax.make_array_from_single_device_arrays((self.world * local[0], *local[1:]), self.sharded, [t])
                self._make = None  # (the public function took t, the constructor did not: a JAX whose differs)
                return g, local
        g = jax.make_array_from_single_device_arrays((self.world * local[0], *local[1:]), self.sharded, [t])
        if self._make is not None and len(self._avals) < 256:
            self._avals[key] = g.aval
        return g, local

    def _stacked(self, fn: Callable[[Any], Any], local: tuple[int, ...]) -> Callable[[Any], Any]:
        """``fn`` of the global array viewed as ``(world_size, *local)`` (inside the jitted function:
        splitting the sharded axis moves no data)."""
        n = self.world

        def f(a: Any) -> Any:
            return fn(a.reshape((n, *local)))
        return f

    def _fn(self, key: tuple, make: Callable[[], Callable[[Any], Any]], out: Any) -> Callable[[Any], Any]:
        with self._lock:
            f = self._fns.get(key)
            if f is None:
                f = self.jax.jit(make(), out_shardings=out)
                self._fns[key] = f
        return f

    def _reduction(self, op: str) -> Callable[[Any], Any]:
        jnp = self.jax.numpy
        if op == "sum":
            return lambda a: jnp.sum(a, axis=0, dtype=a.dtype)
        if op == "prod":
            return lambda a: jnp.prod(a, axis=0, dtype=a.dtype)
        return (lambda a: jnp.max(a, axis=0)) if op == "max" else (lambda a: jnp.min(a, axis=0))

    def _run(self, what: str, key: tuple, t: Any, fn: Callable[[Any], Any], out: Any,
             pick: Callable[[Any, tuple[int, ...]], Any]) -> Handle:
        """``fn`` of the global array of ``t`` dispatched, its result's piece taken by ``pick``. The
        dispatch is made on the dispatch thread, where the caller's deadline holds whatever XLA does
        inside it; the caller makes it itself only where XLA's dispatch of it only enqueues it (see
        :meth:`_costly`), the caller is not one of XLA's threads (a host callback's, where XLA runs
        every computation inside the dispatch), and nothing of this engine's is queued or in flight
        before it."""
        try:
            g, local = self._global(t)
            # (one function, and one cost verdict, per dtype: XLA counts some dtypes' flops differently)
            fkey = (*key, local, t.dtype)
            f = self._fns.get(fkey) or self._fn(fkey, lambda: self._stacked(fn, local), out)
        except Exception:  # (classified by lost(): its context costs a call on the way in)
            with self.lost(what):
                raise
        fut: Future | _Done
        with self._order:  # (the check, the dispatch and its record as one step among the caller's threads)
            if (not self._pending or self._settled()) and f in self._costly_fns \
                    and not isinstance(threading.current_thread(), _Foreign) and not _in_host_callback():
                try:
                    fut = _Done(f(g), None)
                except Exception as e:  # noqa: BLE001 - the caller's to raise, as the thread's
                    fut = _Done(None, e)
            else:
                fut = self._dispatch.submit(lambda: self._first(f, g))
            self._pending.append(fut)
        return _Ready(self, fut, lambda a: pick(a, local), what)

    def _first(self, f: Callable[[Any], Any], g: Any) -> Any:
        """``f(g)`` on the dispatch thread; after a function's first dispatch there, whether its
        later ones may be the caller's (:meth:`_costly`)."""
        res = f(g)
        if f not in self._seen:
            self._seen.add(f)
            if self._costly(f, g):
                self._costly_fns.add(f)
        return res

    def _costly(self, f: Any, g: Any) -> bool:
        """Whether XLA's dispatch of ``f`` only enqueues it. XLA's CPU client runs a computation
        inside the dispatch where the client is synchronous (``jax_cpu_enable_async_dispatch`` off
        when it started) or the computation costs under 1,000 flops (its own cost analysis); a
        collective there waits for a missing peer (up to gloo's 30 s) and would hold a caller past
        its deadline. So only a computation of :data:`_INLINE_FLOPS` or more by that analysis (which
        JAX gives for the compiled function, read from its cache), on an asynchronous CPU client, is
        the caller's to dispatch; on another platform, none (its runtime may set up a communicator
        inside a dispatch)."""
        if self.platform != "cpu" or not self._async_cpu:
            return False
        try:
            cost = f.lower(g).compile().cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            return float(cost.get("flops", 0.0)) >= _INLINE_FLOPS
        except Exception:  # noqa: BLE001 - no analysis: the thread dispatches it
            return False

    def _settled(self) -> bool:
        """Whether every computation this engine dispatched, or queued for its thread, has completed
        (or failed), the completed ones dropped (the caller holds :attr:`_order`): a dispatch made
        then comes after them, as every rank's does, and takes none of XLA's in-flight slots (32)
        from a collective waiting for a peer."""
        pending = self._pending
        while pending:
            fut = pending[0]
            if not fut.done():
                return False
            if fut.exception() is None:
                try:
                    if not fut.result().is_ready():
                        return False
                except Exception:  # noqa: BLE001 - a failed computation has completed
                    pass
            pending.popleft()
        return True

    def _completed(self) -> None:
        """A handle's computation has completed: the completed ones at the front of the record
        dropped now (a result is not kept alive by the engine once waited for in order)."""
        with self._order:
            self._settled()

    @staticmethod
    def _mine(a: Any) -> Any:
        return a.addressable_data(0)

    def _shaped(self, shape: tuple[int, ...]) -> Callable[[Any, tuple[int, ...]], Any]:
        """This process's shard of a result, reshaped back to ``shape`` (a 0-d or empty input's; a
        reshape to its own shape still costs ~6 us a call)."""
        def pick(a: Any, local: tuple[int, ...]) -> Any:
            piece = self._mine(a)
            return piece if piece.shape == shape else piece.reshape(shape)
        return pick

    def allreduce(self, t: Any, op: str) -> Handle:
        return self._run("allreduce (a jitted reduction over the process axis)", ("allreduce", op), t,
                         self._reduction(op), self.whole, self._shaped(tuple(t.shape)))

    def broadcast(self, t: Any, src: int) -> Handle:
        return self._run("broadcast", ("broadcast", src), t, lambda a: a[src], self.whole,
                         self._shaped(tuple(t.shape)))

    def reduce(self, t: Any, dst: int, op: str) -> Handle:
        return self.allreduce(t, op)

    def allgather(self, t: Any) -> Handle:
        n, shape = self.world, tuple(t.shape)

        def pick(a: Any, local: tuple[int, ...]) -> list[Any]:
            whole = self._mine(a).reshape((n, *shape))
            return [whole[i] for i in range(n)]
        return self._run("allgather", ("allgather",), t, lambda a: a, self.whole, pick)

    def gather(self, t: Any, dst: int) -> Handle:
        h = self.allgather(t)
        if self.rank == dst:
            return h
        assert isinstance(h, _Ready)
        return _Ready(self, h.fut, lambda a: None, "gather")

    def reduce_scatter(self, blocks: Any, op: str) -> Handle:
        piece = tuple(blocks.shape[1:])
        return self._run("reduce_scatter", ("reduce_scatter", op), blocks, self._reduction(op), self.sharded,
                         lambda a, local: self._mine(a).reshape(piece))

    def scatter(self, blocks: Any | None, like: Any, src: int) -> Handle:
        jnp = self.jax.numpy
        piece = tuple(like.shape)
        if blocks is None:
            with self.lost("scatter"):
                blocks = self.jax.device_put(jnp.zeros((self.world, *piece), dtype=like.dtype), self.native)
        return self._run("scatter", ("scatter", src), blocks, lambda a: a[src], self.sharded,
                         lambda a, local: self._mine(a).reshape(piece))

    def all_to_all(self, blocks: Any) -> Handle:
        n, piece = self.world, tuple(blocks.shape[1:])

        def pick(a: Any, local: tuple[int, ...]) -> list[Any]:
            mine = self._mine(a).reshape((n, *piece))
            return [mine[i] for i in range(n)]
        # the global array viewed as (source, destination, *piece), transposed and split by destination
        return self._run("all_to_all (a jitted transpose over the process axis)", ("all_to_all",), blocks,
                         lambda a: a.swapaxes(0, 1), self.sharded, pick)

    # -- subgroups and point-to-point: computations over some processes' devices only --------------
    def _view(self, members: tuple[int, ...]) -> JaxEngine:
        """This engine over the processes ``members`` (in that order): its computations span their
        devices only, and only they run them (JAX's multi-controller rule)."""
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        v = copy.copy(self)
        v.rank, v.world = members.index(self.rank), len(members)
        v.mesh = Mesh(np.array([self.devs[r] for r in members], dtype=object), ("p",))
        v.sharded = NamedSharding(v.mesh, PartitionSpec("p"))
        v.whole = NamedSharding(v.mesh, PartitionSpec())
        v._fns, v._pairs, v._avals = {}, {}, {}
        return v

    def split(self, groups: tuple[tuple[int, ...], ...]) -> Engine:
        return self._view(next(g for g in groups if self.rank in g))

    def _pair(self, peer: int) -> JaxEngine:
        lo, hi = sorted((self.rank, peer))
        with self._lock:
            v = self._pairs.get((lo, hi))
        if v is None:
            v = self._view((lo, hi))
            with self._lock:
                self._pairs[(lo, hi)] = v
        return v

    def _swap(self, t: Any, what: str) -> Handle:
        """Both processes' ``t`` exchanged (a collective permute between two devices): the sender
        passes its message, the receiver a tensor like it; each gets the other's."""
        return self._run(f"{what} (a jitted exchange between two processes)", ("swap",), t, lambda a: a[::-1],
                         self.sharded, self._shaped(tuple(t.shape)))

    def send(self, t: Any, dst: int) -> Handle:
        h = self._pair(dst)._swap(t, "send")
        assert isinstance(h, _Ready)
        return _Ready(self, h.fut, lambda a: None, "send")

    def recv(self, like: Any, src: int) -> Handle:
        return self._pair(src)._swap(like, "recv")


__all__ = ["JaxEngine"]
