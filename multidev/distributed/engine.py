"""The engine interface: what :mod:`multidev.distributed` needs from a multi-process runtime.

This module is the public API for engine authors (with :mod:`multidev`, :mod:`multidev.adapter`
and :mod:`multidev.errors`). An *engine* is the runtime that moves tensors between processes:
``torch.distributed``, MPI through mpi4py, JAX's multi-controller runtime. multidev writes every
collective once over the methods below (argument checks, the consistency protocol, hang detection,
uneven pieces, ``mean``, in-place results, conversion to and from the engine's tensors); an engine
only provides

- a launch: :meth:`Engine.detect` (did this engine's launcher start the process?),
  :meth:`Engine.start` (join the group), :meth:`Engine.stop`;
- a placement rule: :meth:`Engine.transport_for` (which backend's tensors, on which device, a
  tensor of a given device travels as);
- the consistency channel: :meth:`Engine.exchange`, a small all-to-all of integer rows that never
  blocks past its deadline and tells which ranks did not arrive;
- seven primitives on transport tensors, each *asynchronous*: it starts the operation and returns a
  :class:`Handle` at once. The core has already checked that every rank calls the same primitive
  with tensors of one dtype and shape (the gathers: equal-sized, padded by the core), so engines
  need no argument checks of their own;
- optionally, subgroups (:meth:`Engine.split`: the collectives along process-mesh axes then move
  data within each subgroup only; without it they run over whole-group allgathers), an all-to-all
  (:meth:`Engine.all_to_all`; without it ``all_to_all_along`` gathers every block) and
  point-to-point messages (:meth:`Engine.send` / :meth:`Engine.recv`: ``distributed.send`` and
  ``recv`` need them and raise CapabilityError naming the engine without them).

An engine is registered under the ``multidev.engines`` entry-point group (``name = "pkg.mod:Class"``)
or with :func:`register_engine`; it imports its framework in :meth:`Engine.start`, never at module
import (``import multidev`` imports no framework). Framework exceptions are turned into multidev's
typed errors with :func:`translate_errors` (re-exported here); a peer that died or never answered
is a :class:`~multidev.errors.DistributedTimeoutError` (see :func:`peer_errors`).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, ClassVar, Literal

from .._device import Device
from ..errors import (
    BackendNotAvailableError,
    CapabilityError,
    DistributedError,
    DistributedSetupError,
    DistributedTimeoutError,
    MultidevError,
    translate_errors,
)
from ..validate import check_writable

__all__ = [
    "ENGINE_GROUP",
    "Done",
    "Engine",
    "Handle",
    "Launch",
    "Membership",
    "Settings",
    "check_port_free",
    "check_rank",
    "check_writable",
    "engine_class",
    "engine_names",
    "env_int",
    "host_key",
    "legacy_engine",
    "local_rank_from",
    "missing_ranks_error",
    "peer_errors",
    "poll_until",
    "register_engine",
    "run_with_deadline",
    "translate_errors",
]

#: The entry-point group engines register under (the built-in ones too).
ENGINE_GROUP = "multidev.engines"

#: The reductions the primitives take (``mean`` is the core's: a ``sum`` and one division).
OPS = ("sum", "max", "min", "prod")


# -- what the core hands an engine ----------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """What :meth:`Engine.detect` found in the environment: the launcher that started this process,
    the rank and world it gave (None where it does not say), and the evidence, as one line for
    ``init``'s message (``"OMPI_COMM_WORLD_SIZE=3 is set"``)."""

    engine: str
    launcher: str
    evidence: str
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    #: Processes of this job on this machine, where the launcher says (None: unknown).
    local_world_size: int | None = None
    #: A scheduler's variables rather than a launcher's (Slurm's srun starts MPI programs, JAX
    #: processes and plain scripts alike): any strong detection wins over it.
    weak: bool = False


@dataclass(frozen=True)
class Settings:
    """What :func:`multidev.distributed.init` asks of :meth:`Engine.start`. Values the caller did
    not give are None (the engine reads its launcher's environment for them)."""

    rank: int | None
    world_size: int | None
    local_rank: int | None
    #: ``host:port`` of the rendezvous (torch's store, JAX's coordinator), where one is needed.
    address: str | None
    #: The engine's own wire choice (torch: ``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``; JAX:
    #: its CPU collectives, ``"gloo"`` or ``"mpi"``); None: the engine's default.
    transport: str | None
    #: Seconds every collective may wait for the other ranks.
    timeout: float
    #: Seconds :meth:`Engine.start` may wait for every rank to arrive.
    rendezvous_timeout: float
    launch: Launch | None = None


@dataclass(frozen=True)
class Membership:
    """What :meth:`Engine.start` returns: this process's place in the group. ``local_rank`` may be
    None when the engine cannot tell; the core then counts the lower ranks on this machine."""

    rank: int
    world_size: int
    local_rank: int | None
    #: The wire, in words (``"gloo"``, ``"Open MPI v5.0.11, not CUDA-aware: GPU tensors staged
    #: through host memory"``), for ``dist.transport_name()`` and the init message.
    transport: str


# -- handles ---------------------------------------------------------------------------------------
class Handle(ABC):
    """A primitive in flight. The core calls :meth:`wait` with the time left of the collective's
    timeout, then :meth:`result` once; :meth:`test` for ``Work.is_completed()``."""

    @abstractmethod
    def test(self) -> bool:
        """Non-blocking: True once the primitive has finished. Raises its error if it failed."""

    def wait(self, timeout: float) -> bool:
        """Block until the primitive has finished (True) or ``timeout`` seconds have passed
        (False); never longer. Raises its error if it failed (a lost peer as
        :class:`~multidev.errors.DistributedTimeoutError`). The default polls :meth:`test`."""
        return poll_until(self.test, timeout)

    @abstractmethod
    def result(self) -> Any:
        """After :meth:`wait` returned True: the primitive's result (see each primitive)."""


class Done(Handle):
    """A handle whose work is already done (``value`` is its result)."""

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def test(self) -> bool:
        return True

    def wait(self, timeout: float) -> bool:
        return True

    def result(self) -> Any:
        return self.value


def poll_until(done: Callable[[], bool], timeout: float, *, spin: float = 1e-3, busy: float = 0.05) -> bool:
    """Call ``done()`` until it returns True (then True) or ``timeout`` seconds pass (then False):
    back to back for ``spin`` seconds (a runtime without a progress thread, like MPI's, moves data
    only inside these calls), then yielding the CPU between calls up to ``busy`` seconds (other
    processes on the same cores progress too), then sleeping up to 1 ms between calls, so that a
    long wait neither burns a core nor adds more than a millisecond."""
    if done():
        return True
    start = time.perf_counter()
    deadline = start + max(0.0, timeout)
    nap = 0.0
    yield_cpu = getattr(os, "sched_yield", lambda: time.sleep(0))
    while True:
        if done():
            return True
        now = time.perf_counter()
        if now >= deadline:
            return False
        waited = now - start
        if waited < spin:
            continue
        if waited < busy:
            yield_cpu()
        else:
            nap = min(1e-3, max(5e-5, nap * 1.5))
            time.sleep(min(nap, max(0.0, deadline - now)))


def run_with_deadline(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """``fn()`` in a helper thread, waited for at most ``timeout`` seconds: its result, or its
    exception re-raised here, or :class:`~multidev.errors.DistributedTimeoutError` when it has not
    returned by then (the thread is left to finish on its own). For runtime calls that cannot time
    out by themselves (``MPI_Init``; JAX's rendezvous, which aborts the process at its own timeout)."""
    outcome: list[Any] = []  # (True, result) or (False, exception), from the helper thread

    def body() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            outcome.append((False, e))

    th = threading.Thread(target=body, name=f"multidev {what}", daemon=True)
    th.start()
    th.join(max(0.0, timeout))
    if not outcome:
        raise DistributedTimeoutError(f"{what} did not complete within {timeout:g} s: a rank never arrived "
                                      "(or the rendezvous address is wrong)")
    ok, value = outcome[0]
    if ok:
        return value
    raise value


class _PeerErrors(contextlib.ContextDecorator):
    """:func:`peer_errors`' context manager: a class, not a generator, for it wraps every primitive's
    start and wait (a hot path): entering it costs one call, leaving it without an error another."""

    def __init__(self, what: str | Callable[[], str], lost: tuple[type[BaseException], ...],
                 timeout: float | None) -> None:
        self.what, self.lost, self.timeout = what, lost, timeout

    def __enter__(self) -> None:
        return None

    def __exit__(self, tp: Any, e: BaseException | None, tb: Any) -> Literal[False]:
        if e is None:
            return False
        what = self.what
        if isinstance(e, self.lost) and not isinstance(e, MultidevError):
            name = what() if callable(what) else what
            limit = f" (timeout {self.timeout:g} s)" if self.timeout is not None else ""
            msg = (str(e).strip().splitlines() or [""])[0][:400]
            raise DistributedTimeoutError(f"{name}: another rank died, hung or never arrived{limit}: "
                                          f"{type(e).__name__}: {msg}") from e
        if isinstance(e, MultidevError) or not isinstance(e, Exception):
            return False
        translate_errors(what).reraise(e)


def peer_errors(what: str | Callable[[], str], lost: tuple[type[BaseException], ...],
                timeout: float | None = None) -> _PeerErrors:
    """Inside a primitive: exceptions of the types in ``lost`` (what the runtime raises for a peer
    that died or stopped answering, given that the core checked every argument before) become
    :class:`~multidev.errors.DistributedTimeoutError`; every other framework exception goes
    through :func:`translate_errors`, and multidev's own errors pass as they are. A context
    manager (or a decorator)."""
    return _PeerErrors(what, lost, timeout)


def env_int(environ: Mapping[str, str], name: str, *, low: int | None = 0, high: int | None = None) -> int | None:
    """Integer variable ``name`` of ``environ`` (None where unset or empty), checked against
    ``low``/``high`` (inclusive); DistributedSetupError naming it otherwise."""
    v = environ.get(name)
    if v is None or v.strip() == "":
        return None
    try:
        n = int(v.strip())
    except ValueError:
        raise DistributedSetupError(f"${name}={v!r:.40} is not an integer; fix or unset it (a launcher sets it: "
                                    "torchrun, mpiexec, srun, multidev.distributed.launch)") from None
    if (low is not None and n < low) or (high is not None and n > high):
        span = f"{low if low is not None else '-inf'}..{high if high is not None else 'inf'}"
        raise DistributedSetupError(f"${name}={n} is out of range ({span}); fix or unset it")
    return n


def check_rank(rank: int | None, world: int | None, rank_name: str, world_name: str) -> None:
    """DistributedSetupError when a world size below 1 or a rank outside it was given."""
    if world is not None and world < 1:
        raise DistributedSetupError(f"{world_name}={world}: a world has at least one process")
    if rank is not None and world is not None and not 0 <= rank < world:
        raise DistributedSetupError(f"{rank_name}={rank} is not a rank of a world of {world} ({world_name}); "
                                    f"ranks are 0..{world - 1}")


def check_port_free(host: str, port: int, what: str) -> None:
    """DistributedSetupError when TCP ``port`` cannot be bound (another process listens on it):
    checked before a runtime that would serve there is started (JAX's coordinator aborts the process
    on a taken port; torch's store fails later with a less clear message). A port freed a moment
    later passes; one taken a moment later is the runtime's to report."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free
            if family == socket.AF_INET6:
                with contextlib.suppress(OSError, AttributeError):
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((addr, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise DistributedSetupError(
                    f"{what}: port {port} (of {host}:{port}) is taken by another process, so this rank cannot serve "
                    "the rendezvous there; pick a free port (MASTER_PORT / JAX_COORDINATOR_ADDRESS / master_port=), "
                    "or stop what holds it (a previous job still running?)") from None
        finally:
            s.close()


def host_key() -> int:
    """This machine, as a 62-bit integer (the same in every process of one host): put it in an
    exchanged row to count the processes of a host (local ranks)."""
    digest = hashlib.sha256(socket.gethostname().encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


def local_rank_from(rows: Sequence[Sequence[int] | None], rank: int, column: int) -> int:
    """This rank's local rank: how many lower ranks' rows hold this rank's :func:`host_key` in ``column``."""
    mine = rows[rank]
    assert mine is not None
    return sum(1 for row in rows[:rank] if row is not None and row[column] == mine[column])


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def missing_ranks_error(what: str, rows: Sequence[object | None], timeout: float, call: str) -> DistributedTimeoutError:
    """The error for an exchange in which the ranks whose rows are None did not arrive: it names
    them, the ranks that did, and the call they were expected at."""
    missing = [r for r, row in enumerate(rows) if row is None]
    arrived = [r for r, row in enumerate(rows) if row is not None]
    return DistributedTimeoutError(
        f"{what}: {_ranks(missing)} did not arrive at {call} within {timeout:g} s (dead, hung, or busy "
        f"elsewhere; {_ranks(arrived) if arrived else 'no rank'} did). The group is unusable now: shutdown(), "
        "and restart the job")


# -- the engine ------------------------------------------------------------------------------------
class Engine(ABC):
    """Base class of engines. Subclasses set :attr:`name` and implement the abstract methods; the
    contract of each is in its docstring. One instance serves one group, from :meth:`start` to
    :meth:`stop`; the core calls it from one thread at a time."""

    #: The engine's name, as ``init(engine=...)`` takes it.
    name: ClassVar[str] = ""
    #: The backend whose tensors carry host data in this engine's groups (``transport_for`` of a CPU
    #: device names it), for introspection.
    tensors: ClassVar[str] = ""
    #: The engine the API before engines meant (``init(backend="gloo")``, ``init("nccl")``: a
    #: torch.distributed process-group backend): those deprecated spellings start this engine.
    legacy: ClassVar[bool] = False
    #: The process counts the conformance suite runs this engine's collectives with (the larger ones
    #: with the first selected backend only); its fault cases use the largest of them up to 3.
    conformance_worlds: ClassVar[tuple[int, ...]] = (2,)
    #: Whether the primitives may write into the tensors they are given. The core then hands them
    #: a private copy unless the call is in place (False: immutable transports, like JAX arrays).
    writes_inputs: ClassVar[bool] = True
    #: Whether a primitive started with ``async_op`` moves data while the caller computes (a progress
    #: thread: gloo, NCCL). False where data moves only inside the runtime's own calls (MPI without a
    #: progress thread): data-parallel training then sends no small first bucket ahead, as nothing
    #: would overlap it.
    overlaps: ClassVar[bool] = True
    #: Whether point-to-point messages match by direction: a send to rank B waits only for B's
    #: receive from this rank, whatever else either rank has posted (MPI, torch.distributed). False
    #: where each message is a program both ranks run in one order (JAX): the ring ``sendrecv`` then
    #: runs as a collective, and two ranks that send to each other must order their calls alike.
    matches_by_peer: ClassVar[bool] = True

    # -- launch --------------------------------------------------------------------------------
    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> Launch | None:
        """Whether this engine's launcher started the process, from environment variables only
        (no import of the framework): a :class:`Launch` naming the evidence, else None."""
        return None

    @classmethod
    def missing(cls) -> str | None:
        """Why this engine cannot run here (its framework is not installed: the install hint), or
        None. Must not import the framework (``importlib.util.find_spec`` is enough)."""
        return None

    @classmethod
    def launch_env(cls, rank: int, world_size: int, address: str) -> dict[str, str]:
        """The environment that makes a process started by ``python -m multidev.distributed.launch``
        rank ``rank`` of ``world_size`` with its rendezvous at ``address`` (``host:port``)."""
        raise NotImplementedError(f"the {cls.name} engine is started by its own launcher")

    @classmethod
    def launch_command(cls, n: int, argv: Sequence[str], options: Sequence[str] = ()) -> list[str] | None:
        """For an engine whose processes only its own launcher can start (MPI's ``mpiexec``): the
        command that starts ``n`` processes of ``argv`` on this machine (``options``: the launcher's
        own), or None when :meth:`launch_env` is the way."""
        return None

    @classmethod
    def check_launch(cls, environ: Mapping[str, str], settings: Settings) -> None:
        """Refuse, at once and before the framework is imported, launcher variables or settings that
        are malformed (``RANK=zero``), out of range or inconsistent, or left by a launcher that did
        not start this process: :class:`~multidev.errors.DistributedSetupError` naming the variable
        and the fix. Values ``settings`` gives override the environment's. Default: nothing."""
        return None

    @abstractmethod
    def start(self, settings: Settings) -> Membership:
        """Join the group (synchronous). Must return or raise within
        ``settings.rendezvous_timeout``: :class:`~multidev.errors.DistributedTimeoutError` when a
        rank does not arrive (naming it where the runtime can tell), DistributedError for settings
        the engine refuses."""

    @abstractmethod
    def stop(self, healthy: bool) -> None:
        """Leave the group (synchronous, at most a few seconds; never raises). ``healthy`` is False
        after a rank was lost or timed out: tear down without waiting for the other ranks."""

    # -- placement -----------------------------------------------------------------------------
    @abstractmethod
    def transport_for(self, device: Device) -> tuple[str, Device]:
        """``(backend name, device)``: how a tensor on ``device`` travels in this group. The core
        converts it to that backend's tensor on that device (zero-copy where it can) and converts
        the result back to the input's backend and device. Decide by ``device.kind`` only: every
        rank of one call must get the same kind."""

    def prepare(self, t: Any) -> tuple[Any, bool]:
        """``t`` as the primitives can take it (contiguous, detached from autograd, its producer
        finished), and whether the result still shares ``t``'s memory. Default: ``(t, True)``."""
        return t, True

    def admit(self, t: Any) -> bool:
        """Refuse transport tensor ``t`` where :meth:`prepare` would (a typed MultidevError), making
        nothing; True where :meth:`prepare` of ``t`` then fails only as an allocation can, so the
        core may prepare it while the call's records travel; False (the default) where only
        :meth:`prepare` itself can tell (the core prepares it before its record is sent)."""
        return False

    def dtypes(self) -> frozenset[str] | None:
        """The dtypes this group can carry (the core refuses others on every rank with
        CapabilityError naming the engine), or None for every dtype the transport holds. Fixed for
        the group's life: the core keeps its answers per kind of tensor."""
        return None

    # -- the consistency channel -----------------------------------------------------------------
    @abstractmethod
    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        """Every rank's ``row`` for call ``seq``, in rank order (this rank's own included); ``None``
        for each rank whose row did not arrive within ``timeout`` seconds. Synchronous, and it must
        never block longer than ``timeout`` (a nonblocking send/receive with a deadline, a store
        with a timed wait). Rows are integers, of the same length on every rank. ``seq`` counts
        calls from 0; negative values are init's and shutdown's."""

    def post(self, seq: int, row: Sequence[int]) -> None:
        """Optional: send this rank's ``row`` of call ``seq`` ahead, without waiting for anything;
        :meth:`exchange` of the same ``seq`` and ``row`` follows (a data-parallel step sends its
        gradients' record ahead of the backward pass, so the round trip overlaps it) and must not
        send it again. Default: nothing (:meth:`exchange` sends it)."""
        return None

    # -- primitives (asynchronous: each returns a Handle at once) ---------------------------------
    @abstractmethod
    def allreduce(self, t: Any, op: str) -> Handle:
        """Every rank's ``t`` reduced elementwise by ``op`` (:data:`OPS`). Result: the reduction, on
        ``t``'s device (``t`` itself, written in place, or a new tensor)."""

    def allreduce_new(self, t: Any, op: str) -> Handle | None:
        """Optional: :meth:`allreduce` into new memory, reading ``t`` and leaving it unchanged, so an
        out-of-place call needs no private copy of its input first (MPI's out-of-place
        ``Iallreduce``). Result: the new tensor. None where the engine does not for this ``t`` (the
        core then copies ``t`` and calls :meth:`allreduce`). The core calls it only for synchronous
        calls whose transport tensor is the input's own memory (the caller cannot change it while it
        is read; after a wait that timed out, as with ``inplace=True``, the runtime may still read it
        until the lost rank's call ends). Out-of-place calls go here, not to :meth:`allreduce`, in
        a subclass that overrides only that. Default: None."""
        return None

    @abstractmethod
    def broadcast(self, t: Any, src: int) -> Handle:
        """Rank ``src``'s ``t`` on every rank. Result: it (``t`` itself, written, or a new tensor)."""

    @abstractmethod
    def reduce(self, t: Any, dst: int, op: str) -> Handle:
        """The reduction on rank ``dst`` (result there, as :meth:`allreduce`); elsewhere the result
        is ignored."""

    @abstractmethod
    def allgather(self, t: Any) -> Handle:
        """Every rank's ``t`` (one shape everywhere). Result: a list of ``world_size`` tensors like
        ``t``, in rank order."""

    @abstractmethod
    def gather(self, t: Any, dst: int) -> Handle:
        """Every rank's ``t`` on rank ``dst``. Result there: the list, as :meth:`allgather`; None
        elsewhere."""

    @abstractmethod
    def reduce_scatter(self, blocks: Any, op: str) -> Handle:
        """``blocks``: a contiguous tensor of shape ``(world_size, *piece)``. Result: block ``rank``
        reduced over every rank, of shape ``piece``."""

    @abstractmethod
    def scatter(self, blocks: Any | None, like: Any, src: int) -> Handle:
        """Rank ``src`` passes ``blocks`` of shape ``(world_size, *piece)``, the others None;
        ``like`` is a tensor of shape ``piece`` with the dtype and device of the result, which the
        engine may write into. Result: block ``rank`` of ``src``'s blocks."""


    # -- optional: subgroups and point-to-point (CapabilityError where the engine has none) ---------
    def split(self, groups: tuple[tuple[int, ...], ...]) -> Engine:
        """An engine whose primitives act within this rank's subgroup of ``groups`` (a partition of
        the group's ranks, each subgroup in the order given): its ranks renumbered by position
        (``src``/``dst`` and result order are positions), its ``world_size`` the subgroup's size.
        Synchronous; every rank calls it with the same partition at the same point among the
        primitives (the core has agreed the call), once per partition (the core keeps the result for
        the group's life and calls only its primitives). Default: CapabilityError (the core then
        runs the collectives along mesh axes over whole-group allgathers)."""
        raise CapabilityError(f"the {self.name} engine has no subgroups")

    def all_to_all(self, blocks: Any) -> Handle:
        """``blocks``: a contiguous tensor of shape ``(world_size, *piece)``; block ``j`` goes to rank
        ``j``. Result: a list of ``world_size`` tensors of shape ``piece``, the ``j``-th rank ``j``'s
        block for this rank. Default: CapabilityError (the core then gathers every block)."""
        raise CapabilityError(f"the {self.name} engine has no all-to-all")

    def send(self, t: Any, dst: int) -> Handle:
        """Point-to-point: ``t`` to rank ``dst``, which calls :meth:`recv` with this rank as ``src``
        and a tensor of ``t``'s shape and dtype. Messages from one rank to another arrive in the
        order they were sent. Result: None. Default: CapabilityError."""
        raise CapabilityError(f"the {self.name} engine has no point-to-point messages")

    def recv(self, like: Any, src: int) -> Handle:
        """The next tensor rank ``src`` sends to this rank; ``like`` (a transport tensor of its shape
        and dtype) may be written into. Result: the tensor. Default: CapabilityError."""
        raise CapabilityError(f"the {self.name} engine has no point-to-point messages")


# -- the registry ------------------------------------------------------------------------------------
_lock = threading.Lock()
_factories: dict[str, Any] = {}
_read = False


def _read_entry_points() -> None:
    global _read
    with _lock:
        if _read:
            return
        for ep in metadata.entry_points(group=ENGINE_GROUP):
            _factories.setdefault(ep.name, ep)
        _read = True


def register_engine(name: str, factory: type[Engine] | Callable[[], Engine], *, replace: bool = False) -> None:
    """Make ``init(engine=name)`` use ``factory`` (an :class:`Engine` subclass)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise DistributedError(f"engine names are non-empty strings without ':', got {name!r:.40}")
    _read_entry_points()
    with _lock:
        if name in _factories and not replace:
            raise DistributedError(f"an engine named {name!r} is registered already (pass replace=True)")
        _factories[name] = factory


def engine_names() -> list[str]:
    """The registered engines' names (entry points and :func:`register_engine`), sorted."""
    _read_entry_points()
    with _lock:
        return sorted(_factories)


def legacy_engine() -> str:
    """The name of the engine whose class sets :attr:`Engine.legacy` (the one the deprecated
    spellings of ``init`` start)."""
    for name in engine_names():
        with contextlib.suppress(Exception):
            if engine_class(name).legacy:
                return name
    raise BackendNotAvailableError("no registered engine serves the deprecated init(backend=...) spelling")


def engine_class(name: str) -> type[Engine]:
    """The engine class registered as ``name`` (its entry point loaded: this imports its module, not
    its framework). BackendNotAvailableError for unknown names."""
    _read_entry_points()
    with _lock:
        f = _factories.get(name)
    if f is None:
        raise BackendNotAvailableError(f"unknown engine {name!r}; registered: {', '.join(engine_names()) or 'none'}")
    if isinstance(f, metadata.EntryPoint):
        with translate_errors(f"loading engine {name!r} ({f.value})"):
            cls = f.load()
        with _lock:
            _factories[name] = cls
        f = cls
    if not (isinstance(f, type) and issubclass(f, Engine)):
        raise BackendNotAvailableError(f"engine {name!r} is {f!r:.60}, not a multidev.distributed.engine.Engine "
                                       "subclass")
    return f
