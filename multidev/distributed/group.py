"""The group's lifecycle: which engine runs this process (from the launcher's environment or by
name), joining and leaving, and the queries (rank, world size, local rank, engine, transport).

``init(engine=None)`` picks the engine from the environment the launcher left: torchrun's
(``RANK``/``WORLD_SIZE``/``MASTER_ADDR``), Open MPI's (``OMPI_COMM_WORLD_*``), MPICH/Hydra/PMI's
(``PMI_RANK``/``PMI_SIZE``) or PMIx's (``PMIX_RANK``), Slurm's ``srun`` (``SLURM_PROCID``/
``SLURM_NTASKS``), JAX's coordinator settings (``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
``JAX_PROCESS_ID``); ``$MULTIDEV_ENGINE`` or ``init(engine=...)`` names it instead. Each engine
says what it recognises (:meth:`Engine.detect`); the core picks the one that did, and refuses with
DistributedError, saying what it found and how to choose, when none or several did.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import CapabilityError, DistributedError, DistributedSetupError
from .engine import (
    Engine,
    Launch,
    Settings,
    engine_class,
    engine_names,
    host_key,
    legacy_engine,
    local_rank_from,
    missing_ranks_error,
)
from .mailbox import Mailbox, open_mailbox
from .solo import SoloEngine

__all__ = ["CHECK_ENV", "DEFAULT_TIMEOUT", "ENGINE_ENV", "MAX_TIMEOUT", "GroupInfo", "checks_enabled", "current",
           "detect_launch", "engine_name", "group_info", "init", "is_initialized", "launched", "local_rank", "rank",
           "set_timeout", "shutdown", "transport_name", "world_size"]

#: Seconds a collective (and init's rendezvous) waits for the other ranks before raising.
DEFAULT_TIMEOUT = 300.0
#: The longest timeout, a year: a longer one, ``float("inf")`` among them, waits this long (no
#: runtime's clock takes an infinite wait, and some overflow on a huge one).
MAX_TIMEOUT = 365 * 86400.0
#: The environment variable that turns the cross-rank consistency checks off ("0", "false", "off",
#: "no") when init is not given ``check=``.
CHECK_ENV = "MULTIDEV_DISTRIBUTED_CHECK"
#: The environment variable naming the engine when ``init`` is not given one.
ENGINE_ENV = "MULTIDEV_ENGINE"
#: The process-group spellings ``init``'s first argument took before it named the engine.
_OLD_TRANSPORTS = ("gloo", "nccl", "ucc", "cpu:gloo,cuda:nccl")

log = logging.getLogger("multidev.distributed")


@dataclass(frozen=True)
class GroupInfo:
    """The group this process joined, and why this engine: what ``init`` returns and logs (at INFO,
    logger ``multidev.distributed``) as one line, ``str(info)``."""

    engine: str
    transport: str
    rank: int
    world_size: int
    local_rank: int
    reason: str

    def __str__(self) -> str:
        return (f"multidev.distributed: rank {self.rank} of {self.world_size} (local rank {self.local_rank}) on the "
                f"{self.engine} engine ({self.transport}), chosen because {self.reason}")


@dataclass
class Group:
    """The state of the group this process joined (one at a time)."""

    engine: Engine
    info: GroupInfo
    timeout: float
    check: bool
    seq: int = 0  # collectives called so far (the consistency records carry it)
    broken: str | None = None
    #: The engine's subgroups by partition (None: the engine has none), made once each.
    subs: dict[tuple[tuple[int, ...], ...], Engine | None] = field(default_factory=dict)
    #: Point-to-point messages so far, by (sender, receiver): each message's header carries its count.
    pairs: dict[tuple[int, int], int] = field(default_factory=dict)
    #: The last receive posted from each rank (p2p's handle: the next waits for its header first).
    receiving: dict[int, Any] = field(default_factory=dict)
    #: A call's record sent ahead of the call (consistency.ahead), not yet exchanged: the next checked
    #: call settles it first.
    ahead: Any = None
    #: Where the records of calls numbered from 0 travel: the engine, or a shared-memory
    #: :class:`~multidev.distributed.mailbox.Mailbox` where every rank runs on one host.
    channel: Any = None
    #: Where tensors travel, by (backend, device, dtype): the collectives' placement answers, each
    #: with the registry's generation and the transport's capabilities it was found with, bounded.
    placements: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def world_size(self) -> int:
        return self.info.world_size

    def split(self, groups: tuple[tuple[int, ...], ...]) -> Engine | None:
        """The engine of the subgroups ``groups`` (:meth:`Engine.split`), made at the first call with
        this partition (every rank makes the same calls: the caller has agreed it), or None where the
        engine has no subgroups. An engine error while splitting breaks the group."""
        if groups in self.subs:
            return self.subs[groups]
        if len(groups) == 1 and groups[0] == tuple(range(self.world_size)):
            sub: Engine | None = self.engine
        else:
            try:
                sub = self.engine.split(groups)
            except CapabilityError:
                sub = None
            except Exception as e:
                self.fail(f"splitting the group into {groups} failed on rank {self.rank}: {e}")
                raise
        self.subs[groups] = sub
        return sub

    def fail(self, why: str) -> None:
        """Mark the group unusable (a lost or timed-out peer): later calls raise until shutdown."""
        if self.broken is None:
            self.broken = why[:300]


_group: Group | None = None
_lock = threading.Lock()
_exit_hook = False
_said_solo = False


# -- which engine ----------------------------------------------------------------------------------
def detect_launch(environ: Mapping[str, str] | None = None) -> list[Launch]:
    """What every registered engine recognises in ``environ`` (default: this process's environment):
    the launchers that started this process, strongest first. Imports no framework."""
    env = os.environ if environ is None else environ
    found: list[Launch] = []
    for name in engine_names():
        try:
            cls = engine_class(name)
        except Exception:
            log.debug("engine %s could not be loaded", name, exc_info=True)
            continue
        launch = cls.detect(env)
        if launch is not None:
            found.append(launch)
    return sorted(found, key=lambda x: x.weak)


def launched(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a launcher started this process as one of several (torchrun, mpiexec, srun, JAX's
    variables): a script can call ``init()`` then, and run alone otherwise."""
    return any((x.world_size or 0) > 1 for x in detect_launch(environ))


def _choose(engine: str | None, environ: Mapping[str, str],
            solo: bool = False) -> tuple[type[Engine], Launch | None, str]:
    """The engine class, what its launcher said, and the reason, in words. ``solo``: with no engine
    named and no launcher's environment found, the 1-process group's engine instead of an error."""
    if engine is None and environ.get(ENGINE_ENV):
        engine = environ[ENGINE_ENV].strip()
        given = f"${ENGINE_ENV}={engine}"
    else:
        given = f"init(engine={engine!r})"
    launches = detect_launch(environ)
    if engine is not None:
        if not isinstance(engine, str):
            raise DistributedSetupError(f"engine must be a name ({', '.join(engine_names())}) or None, got "
                                        f"{engine!r:.40}")
        try:
            cls = engine_class(engine)
        except Exception as e:
            raise DistributedError(f"{given}: {e}") from e
        mine = next((x for x in launches if x.engine == engine), None)
        reason = f"{given} names it" + (f" ({mine.launcher}: {mine.evidence})" if mine else "")
        return cls, mine, reason
    strong = [x for x in launches if not x.weak]
    usable = [x for x in strong or launches if engine_class(x.engine).missing() is None]
    if len(strong) > 1:
        raise DistributedError(
            "multidev.distributed.init: several launchers' environments are set ("
            + "; ".join(f"{x.launcher} for the {x.engine} engine: {x.evidence}" for x in strong)
            + f"). Choose one: init(engine=...) or ${ENGINE_ENV}=NAME (engines: {', '.join(engine_names())})")
    if strong:
        x = strong[0]
        return engine_class(x.engine), x, f"{x.evidence} ({x.launcher})"
    if len(usable) == 1:
        x = usable[0]
        return engine_class(x.engine), x, f"{x.evidence} ({x.launcher}; the one installed engine it can start)"
    if len(usable) > 1:
        raise DistributedError(
            f"multidev.distributed.init: {usable[0].launcher} started this process ({usable[0].evidence}) and "
            f"several installed engines can run under it ({', '.join(x.engine for x in usable)}); choose one: "
            f"init(engine=...) or ${ENGINE_ENV}=NAME")
    if solo and not launches:
        return SoloEngine, None, "no launcher's environment found: one process, world size 1"
    hints = []
    for name in engine_names():
        with contextlib.suppress(Exception):
            why = engine_class(name).missing()
            hints.append(f"{name}" + (f" (not installed: {why})" if why else ""))
    raise DistributedError(
        "multidev.distributed.init: no launcher's environment found (torchrun: RANK/WORLD_SIZE; "
        "Open MPI: OMPI_COMM_WORLD_*; MPICH/PMI: PMI_RANK/PMI_SIZE; Slurm: SLURM_PROCID/SLURM_NTASKS; JAX: "
        "JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID). Start the processes with torchrun, mpiexec, "
        "srun or python -m multidev.distributed.launch, or name the engine and the ranks: init(engine=..., rank=..., "
        f"world_size=...). Engines: {', '.join(hints) or 'none registered'}")


# -- init and shutdown -------------------------------------------------------------------------------
def _positive(name: str, v: Any) -> float:
    """``v`` seconds, positive, at most :data:`MAX_TIMEOUT` (a longer one, infinity among them, waits that long)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise DistributedSetupError(f"{name} must be a positive number of seconds, got {v!r:.40}")
    return min(float(v), MAX_TIMEOUT)


def _int_or_none(name: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise DistributedSetupError(f"{name} must be an int, got {v!r:.40}")
    return int(v)


def _check_setting(check: bool | None) -> bool:
    if check is None:
        return os.environ.get(CHECK_ENV, "1").strip().lower() not in ("0", "false", "off", "no")
    if not isinstance(check, bool):
        raise DistributedSetupError(f"check must be True, False or None, got {check!r:.40}")
    return check


def init(engine: str | None = None, *, transport: str | None = None, rank: int | None = None,
         world_size: int | None = None, master_addr: str | None = None, master_port: int | None = None,
         local_rank: int | None = None, timeout: float = DEFAULT_TIMEOUT, rendezvous_timeout: float | None = None,
         check: bool | None = None, backend: str | None = None) -> GroupInfo:
    """Join the process group; returns (and logs at INFO) which engine runs it and why.

    - ``engine``: ``"torch"`` (torch.distributed), ``"mpi"`` (mpi4py), ``"jax"`` (JAX's
      multi-controller runtime) or a registered third-party engine; None picks the one whose
      launcher started this process (see the module doc), or ``$MULTIDEV_ENGINE``; with neither
      (plain ``python``), a 1-process group (engine ``"local"``, world size 1, a warning says so).
    - ``transport``: the engine's own wire: torch's process-group backend (``"gloo"``, ``"nccl"``,
      ``"cpu:gloo,cuda:nccl"``, default: NCCL for CUDA tensors where every rank has a GPU of its
      own, else gloo), JAX's CPU
      collectives (``"gloo"``, the default, or ``"mpi"``); MPI has none.
    - ``rank``, ``world_size``, ``local_rank``, ``master_addr``, ``master_port``: override the
      launcher's environment (torch: the store's address; JAX: the coordinator's). MPI takes its
      ranks from MPI itself.
    - ``timeout`` (seconds) bounds every collective: a rank that died, hung or never arrives makes
      the others raise :class:`DistributedTimeoutError` naming it and the call, instead of hanging.
      ``rendezvous_timeout`` (default: ``timeout``) bounds init's wait for every rank. Either may be
      ``float("inf")``: no timeout is longer than a year (:data:`MAX_TIMEOUT`).
    - ``check``: the cross-rank consistency checks (default on, or ``$MULTIDEV_DISTRIBUTED_CHECK``);
      every rank must pass the same, which init verifies.

    Deprecated (removed in 0.4): ``backend=`` (now ``transport=``), and a process-group name as the
    first argument (``init("gloo")``: now ``init("torch", transport="gloo")``).

    The group is left at interpreter exit if :func:`shutdown` was not called.
    """
    global _group
    cls_name = engine
    if backend is not None:
        warnings.warn("multidev.distributed.init(backend=...) is deprecated (removed in 0.4): it named "
                      "torch.distributed's process-group backend; use init(transport=...)", DeprecationWarning,
                      stacklevel=2)
        transport = transport or backend
        cls_name = engine or legacy_engine()
    if isinstance(engine, str) and engine in _OLD_TRANSPORTS:
        legacy = legacy_engine()
        warnings.warn(f"multidev.distributed.init({engine!r}): the first argument is now the engine; this call means "
                      f"init({legacy!r}, transport={engine!r}) (removed in 0.4)", DeprecationWarning, stacklevel=2)
        transport, cls_name = engine, legacy
    tmo = _positive("timeout", timeout)
    rdv = tmo if rendezvous_timeout is None else _positive("rendezvous_timeout", rendezvous_timeout)
    checked = _check_setting(check)
    explicit = {k: _int_or_none(k, v) for k, v in (("rank", rank), ("world_size", world_size),
                                                    ("local_rank", local_rank), ("master_port", master_port))}
    if transport is not None and (not isinstance(transport, str) or not transport):
        raise DistributedSetupError(f"transport must be a non-empty string or None, got {transport!r:.40}")
    if master_addr is not None and not isinstance(master_addr, str):
        raise DistributedSetupError(f"master_addr must be a string, got {master_addr!r:.40}")
    with _lock:
        if _group is not None:
            raise DistributedError("multidev.distributed is already initialised; call shutdown() first")
        solo = explicit["world_size"] in (None, 1) and explicit["rank"] in (None, 0)
        cls, launch, reason = _choose(cls_name, os.environ, solo)
        if cls is SoloEngine:
            _say_solo()
        why = cls.missing()
        if why:
            raise CapabilityError(f"the {cls.name} engine cannot run here: {why}")
        address = None
        if master_addr is not None or explicit["master_port"] is not None:
            address = f"{master_addr or '127.0.0.1'}:{explicit['master_port'] or 29500}"
        settings = Settings(rank=explicit["rank"], world_size=explicit["world_size"],
                            local_rank=explicit["local_rank"], address=address, transport=transport,
                            timeout=tmo, rendezvous_timeout=rdv, launch=launch)
        cls.check_launch(os.environ, settings)  # malformed or stale variables: at once, before any import
        eng = cls()
        member = eng.start(settings)
        r, w = member.rank, member.world_size
        if not 0 <= r < w:
            eng.stop(False)
            raise DistributedError(f"the {cls.name} engine gave rank {r} of world size {w}")
        try:
            rows = eng.exchange(-1, [int(checked), host_key()], rdv)
        except BaseException:
            eng.stop(False)
            raise
        if any(row is None for row in rows):
            eng.stop(False)
            raise missing_ranks_error(f"multidev.distributed.init on rank {r}", rows, rdv,
                                      "init's agreement on the settings")
        full = [row for row in rows if row is not None]
        if len({row[0] for row in full}) > 1:
            eng.stop(True)
            on = [i for i, row in enumerate(full) if row[0]]
            raise DistributedError(
                f"init: the ranks disagree on the consistency checks (on for ranks {on}, off for the others); "
                f"pass the same check= (or ${CHECK_ENV}) to every rank")
        lr = member.local_rank
        if lr is None:
            lr = local_rank_from(rows, r, 1)
        info = GroupInfo(cls.name, member.transport, r, w, lr, reason)
        try:
            box = open_mailbox(eng, r, w, len({row[1] for row in full}) == 1, rdv)
        except BaseException:
            eng.stop(False)
            raise
        _group = Group(eng, info, tmo, checked, channel=box if box is not None else eng)
        _register_exit_hook()
    log.info("%s", info)
    return info


def _say_solo() -> None:
    """The one line (a warning on logger ``multidev.distributed``, once a process) saying that init
    found no launcher and started a 1-process group."""
    global _said_solo
    if not _said_solo:
        _said_solo = True
        log.warning("multidev.distributed.init: no launcher's environment found; running as one process "
                    "(rank 0 of world size 1). Start with torchrun, mpiexec, srun or "
                    "python -m multidev.distributed.launch for several, or name the engine: init(engine=...)")


def _register_exit_hook() -> None:
    global _exit_hook
    if not _exit_hook:
        atexit.register(_shutdown_at_exit)  # runs before the frameworks' own exit handlers (registered earlier)
        _exit_hook = True


def _shutdown_at_exit() -> None:
    with contextlib.suppress(Exception):
        shutdown()


def shutdown() -> None:
    """Leave the group (also after a failure). Safe to call when not initialised."""
    global _group
    with _lock:
        g = _group
        if g is None:
            return
        _group = None
        with contextlib.suppress(Exception):  # a broken group may fail to tear down; it is gone either way
            g.engine.stop(g.broken is None)
        if isinstance(g.channel, Mailbox):
            g.channel.close()


# -- queries -----------------------------------------------------------------------------------------
def current() -> Group:
    """The group, or DistributedError (not initialised, or unusable after a failure)."""
    g = _group
    if g is None:
        raise DistributedError("multidev.distributed is not initialised: call multidev.distributed.init() "
                               "(in processes started by torchrun, mpiexec, srun or JAX's variables)")
    if g.broken:
        raise DistributedError(f"the process group failed earlier ({g.broken}); call shutdown() (and init() "
                               "again where the engine allows it)")
    return g


def is_initialized() -> bool:
    """True between :func:`init` and :func:`shutdown`."""
    return _group is not None


def checks_enabled() -> bool:
    """Whether this group checks every collective's consistency across ranks."""
    return current().check


def set_timeout(seconds: float) -> None:
    """The seconds this rank's collectives wait for the others from now on (init's ``timeout``
    otherwise): a short one after a long first step, say. Local: each rank sets its own."""
    current().timeout = _positive("timeout", seconds)


def rank() -> int:
    """This process's rank."""
    return current().rank


def world_size() -> int:
    """The number of processes."""
    return current().world_size


def local_rank() -> int:
    """This process's rank on its machine (its GPU index, by convention)."""
    return current().info.local_rank


def engine_name() -> str:
    """The engine running the group: ``"torch"``, ``"mpi"``, ``"jax"`` (or a third-party one)."""
    return current().info.engine


def transport_name() -> str:
    """The engine's wire, in words (``"gloo"``, ``"cpu:gloo,cuda:nccl"``, ``"Open MPI v5.0.11 ..."``)."""
    return current().info.transport


def group_info() -> GroupInfo:
    """Which engine runs the group and why, this rank's place in it (what :func:`init` returned)."""
    return current().info


def backend_name() -> str:
    """Deprecated (removed in 0.4): :func:`transport_name` (it named torch.distributed's
    process-group backend; :func:`engine_name` names the engine)."""
    warnings.warn("multidev.distributed.backend_name() is deprecated (removed in 0.4): use transport_name() for "
                  "the process-group backend, engine_name() for the engine", DeprecationWarning, stacklevel=2)
    return transport_name()

