"""The ``torch`` engine: torch.distributed, gloo for CPU tensors and NCCL for CUDA tensors (NCCL
by default only where every rank has a GPU of its own; NCCL refuses two ranks on one GPU).

Launched by ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``LOCAL_RANK``), or by anything that sets those variables. The transport is torch tensors: any
backend's tensor becomes one zero-copy through DLPack where it can.

- Rendezvous: a ``TCPStore``. Under torchrun (``TORCHELASTIC_USE_AGENT_STORE``) every rank joins the
  agent's store as a client (no rank binds the port, so c10d prints no "failed to bind"); elsewhere
  rank 0 hosts it. Every rank posts its arrival there before the process group forms, so a rank that
  never arrives is named.
- The consistency exchange goes through the same store, on a connection of its own: this rank's
  row pushed to every other rank's queue (no reply awaited: :meth:`TorchEngine.post` sends it ahead
  where a data-parallel step overlaps the round trip with its backward pass), the others' popped
  from its own with a deadline, one round trip per other rank and nothing left to delete (init's and
  shutdown's: a key per rank and a timed ``wait``). Never on the GPU, and never through gloo: gloo
  aborts the process when two ranks' calls differ in length, so the records must agree before any
  data moves.
- Under NCCL, ``TORCH_NCCL_BLOCKING_WAIT=1`` is set (unless set already) so that a timeout raises
  instead of tearing the process down.
- A failure during a collective (torch's ``DistError`` family, gloo's ``RuntimeError`` for a lost
  peer) is a lost or hung peer: the inputs were checked before.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

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
    host_key,
    local_rank_from,
    missing_ranks_error,
    peer_errors,
    run_with_deadline,
)
from multidev.errors import (
    CapabilityError,
    DistributedError,
    DistributedSetupError,
    DistributedTimeoutError,
    UnsupportedTensorError,
)

_HOST = Device("cpu", 0)
_generation = 0  # inits in this process: a later init under torchrun must not meet an earlier one's keys


def _a_gpu_per_rank(gpus: list[int]) -> bool:
    """Whether NCCL can serve the group: every rank has a GPU (``gpus``: each rank's
    :func:`_gpu_identity`, 0 for none) and no two ranks have the same one. The same answer on every
    rank, from the same exchanged rows."""
    return all(g != 0 for g in gpus) and len(set(gpus)) == len(gpus)


def _gpu_identity(torch: Any, index: int) -> int:
    """The physical GPU behind this process's CUDA device ``index``, as a nonzero 62-bit integer: its
    UUID where torch gives one (so ranks that each see one GPU through ``CUDA_VISIBLE_DEVICES`` are
    told apart), else the host, the visible set and the index."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    key = str(uuid) if uuid is not None else \
        f"{socket.gethostname()}/{os.environ.get('CUDA_VISIBLE_DEVICES', '')}/{index}"
    return (int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") >> 2) | 1


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    v = env.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise DistributedError(f"${name}={v!r:.40} is not an integer") from None


#: Whether warnings filters live in a context variable (Python 3.14 with ``-X context_aware_warnings``,
#: the default on free-threaded builds), not in ``warnings.filters``.
_CONTEXT_WARNINGS = bool(getattr(sys.flags, "context_aware_warnings", False))
#: What ``simplefilter("ignore", UserWarning)`` then ``simplefilter("ignore", FutureWarning)`` put first.
_IGNORED = [("ignore", None, FutureWarning, None, 0), ("ignore", None, UserWarning, None, 0)]


class _quiet:
    """torch.distributed warns on some calls about its own deprecated internals; keep logs clean.
    A ``catch_warnings`` with those two filters in front, entered with one list insertion (every
    primitive's start runs in it: ``simplefilter`` costs more than the collective's own Python)."""

    __slots__ = ("saved",)

    def __enter__(self) -> None:
        self.saved = warnings.catch_warnings()
        self.saved.__enter__()
        if _CONTEXT_WARNINGS:  # (Python 3.14's context-aware filters: the module's list is not the one in force)
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)
        else:
            warnings.filters[:0] = _IGNORED  # type: ignore[index]  # (a copy that catch_warnings restores)

    def __exit__(self, *exc: object) -> None:
        self.saved.__exit__(None, None, None)


#: torch.distributed.ReduceOp's names of the primitives' reductions.
_REDUCE_OPS = {"sum": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN"}

#: The tag of multidev's point-to-point messages (the user's tag travels in the message's header).
_P2P_TAG = 0x6D64


def _seconds(s: float) -> timedelta:
    """``s`` seconds (the group's timeouts are a year at most: MAX_TIMEOUT) as torch takes a timeout:
    at least a millisecond."""
    return timedelta(seconds=max(s, 1e-3))


#: The last wait's limit, whole centiseconds, and its timedelta: a blocking call's waits ask for the
#: group's timeout less the microseconds since the call began, one timedelta for them all.
_SPAN: tuple[int, timedelta] = (-1, timedelta(0))


def _span(timeout: float) -> timedelta:
    """:func:`_seconds` of ``timeout``: from a second on, rounded down to the centisecond (at most 1%
    short) and made once per centisecond; below, exact."""
    global _SPAN
    if timeout < 1.0:
        return _seconds(timeout)
    cs = int(timeout * 100)
    last = _SPAN  # (one read: another thread may replace the pair, never half of it)
    if last[0] != cs:
        last = _SPAN = (cs, timedelta(seconds=cs / 100))
    return last[1]


#: What torch.distributed raises for a lost or hung peer, and the guards :meth:`TorchEngine.lost`
#: made for a primitive's name and a timeout (stateless context managers, shared by every group).
_LOST = (RuntimeError, TimeoutError, ConnectionError)
_GUARDS: dict[tuple[str, float], Any] = {}


class _Work(Handle):
    """A torch.distributed work object and how to read its result; ``lost``: the engine's
    :meth:`TorchEngine.lost` for it (a reusable context manager, made once per primitive)."""

    def __init__(self, lost: Any, work: Any, result: Callable[[], Any]) -> None:
        self.lost, self.work, self._result = lost, work, result

    def test(self) -> bool:
        with self.lost:
            return self.work is None or bool(self.work.is_completed())

    def wait(self, timeout: float) -> bool:
        if self.work is None:
            return True
        with self.lost:
            self.work.wait(timeout=_span(timeout))
        return True

    def result(self) -> Any:
        return self._result()


class TorchEngine(Engine):
    name = "torch"
    conformance_worlds = (2, 3, 4)
    legacy = True  # multidev.distributed ran on torch.distributed alone before there were engines
    tensors = "torch"
    writes_inputs = True
    #: A subgroup's process group and its members' ranks in the whole group (None: the whole group);
    #: torch numbers a group's ranks in ascending order, so ``_perm[j]`` is the position (in the order
    #: the core gave) of the group's rank ``j`` (None where the two orders agree).
    _group: Any = None
    _members: tuple[int, ...] | None = None
    _perm: list[int] | None = None

    def _ours(self, parts: list[Any]) -> list[Any]:
        """A list in torch's order of the group's ranks, in the core's order."""
        if self._perm is None:
            return parts
        out: list[Any] = [None] * len(parts)
        for j, p in enumerate(self._perm):
            out[p] = parts[j]
        return out

    def _theirs(self, blocks: Any) -> Any:
        """Blocks in the core's order of positions, in torch's order of the group's ranks."""
        return blocks if self._perm is None else blocks[self._perm].contiguous()

    # -- launch ------------------------------------------------------------------------------
    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> Launch | None:
        elastic = bool(environ.get("TORCHELASTIC_RUN_ID"))
        if not elastic and not ("RANK" in environ and "WORLD_SIZE" in environ):
            return None  # (MASTER_ADDR and MASTER_PORT default to 127.0.0.1:29500)
        try:
            r, w = _env_int(environ, "RANK"), _env_int(environ, "WORLD_SIZE")
            lr, lw = _env_int(environ, "LOCAL_RANK"), _env_int(environ, "LOCAL_WORLD_SIZE")
        except DistributedError:
            r = w = lr = lw = None
        return Launch("torch", "torchrun" if elastic else "torch.distributed's variables",
                      f"RANK={environ.get('RANK')} and WORLD_SIZE={environ.get('WORLD_SIZE')} are set"
                      + (" (TORCHELASTIC_RUN_ID)" if elastic else ""), r, w, lr, lw)

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed (pip install torch, or multidev[torch])"
        return None

    @classmethod
    def launch_env(cls, rank: int, world_size: int, address: str) -> dict[str, str]:
        host, port = address.rsplit(":", 1)
        return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": host, "MASTER_PORT": port}

    @classmethod
    def check_launch(cls, environ: Mapping[str, str], settings: Settings) -> None:
        r = settings.rank if settings.rank is not None else env_int(environ, "RANK")
        ws = settings.world_size if settings.world_size is not None else env_int(environ, "WORLD_SIZE", low=1)
        check_rank(r, ws, "rank" if settings.rank is not None else "$RANK",
                   "world_size" if settings.world_size is not None else "$WORLD_SIZE")
        if settings.local_rank is None:
            env_int(environ, "LOCAL_RANK")
        env_int(environ, "LOCAL_WORLD_SIZE", low=1)
        if settings.address is None:
            env_int(environ, "MASTER_PORT", low=1, high=65535)
        else:
            port = settings.address.rsplit(":", 1)[1]
            if not port.isdigit() or not 1 <= int(port) <= 65535:
                raise DistributedSetupError(f"master_port={port}: a TCP port is 1..65535")

    def start(self, settings: Settings) -> Membership:
        global _generation
        import torch
        import torch.distributed as tdist

        self.torch, self.tdist = torch, tdist
        if not tdist.is_available():
            raise CapabilityError("the torch engine: this torch build has no torch.distributed; install one with it")
        env = os.environ
        r = settings.rank if settings.rank is not None else _env_int(env, "RANK")
        ws = settings.world_size if settings.world_size is not None else _env_int(env, "WORLD_SIZE")
        if r is None or ws is None:
            raise DistributedError("the torch engine: $RANK or $WORLD_SIZE is not set; start the processes with "
                                   "torchrun, or pass rank=... and world_size=...")
        if not 0 <= r < ws:
            raise DistributedError(f"rank {r} is out of range for world size {ws}")
        if settings.address is not None:
            addr, port_s = settings.address.rsplit(":", 1)
            port = int(port_s)
        else:
            addr = env.get("MASTER_ADDR") or "127.0.0.1"
            port = _env_int(env, "MASTER_PORT") or 29500
        self.rank, self.world = r, ws
        self.timeout = settings.timeout
        rdv = settings.rendezvous_timeout
        cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        self.pg = settings.transport or "gloo"  # the default is decided below, once every rank's GPU is known
        self.where = f"rank {r} of {ws}, store {addr}:{port}"
        agent = (env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
                 and addr == env.get("MASTER_ADDR") and str(port) == env.get("MASTER_PORT"))
        if r == 0 and not agent:
            check_port_free(addr, port, f"the torch engine (rank 0 hosts the store at {addr}:{port})")
        _generation += 1
        generation = _generation

        def connect() -> Any:
            td = _seconds(rdv)
            with self.lost(lambda: f"init ({self.where})", rdv):
                if agent:
                    client = tdist.TCPStore(addr, port, ws, is_master=False, timeout=td)
                    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
                    return tdist.PrefixStore(f"/worker/attempt_{attempt}/multidev_{generation}", client)
                return tdist.TCPStore(addr, port, ws, is_master=(r == 0), timeout=td, wait_for_workers=False)
        try:
            # c10d's client handshake has no deadline of its own: a port that accepts and never
            # answers held it forever; here it is given the rendezvous timeout (the thread is left)
            store = run_with_deadline(connect, rdv, f"the torch engine's store at {addr}:{port}")
        except DistributedTimeoutError as e:
            if "did not complete" not in str(e):
                raise
            raise DistributedTimeoutError(
                f"multidev.distributed.init ({self.where}): no torch store answered at {addr}:{port} within {rdv:g} s: "
                "rank 0 never started it, or another service holds that port. Check MASTER_ADDR/MASTER_PORT "
                "(master_addr=/master_port=) and that rank 0 runs") from None
        self.store = store
        self.xstore = tdist.PrefixStore("md/x", store)
        # The collectives' exchanges: a connection of their own (its timeout is set per call), with
        # queues (where the store has queues and clones); the key-per-rank path serves init, shutdown and
        # stores without them.
        self.queues = None
        self._stash: dict[tuple[int, int], list[int]] = {}
        self._posted: int | None = None  # the call whose row post() sent ahead
        if hasattr(store, "queue_push") and hasattr(store, "clone"):
            with contextlib.suppress(Exception):  # a store without queues or clones: the key path
                self.queues = tdist.PrefixStore(f"md/q{generation}", store.clone())
        rows = self.exchange(-3, [host_key()], rdv)  # every rank's arrival, before the group forms
        if any(row is None for row in rows):
            self.store = self.xstore = None
            raise missing_ranks_error(f"multidev.distributed.init ({self.where})", rows, rdv, "init")
        lr = settings.local_rank if settings.local_rank is not None else _env_int(env, "LOCAL_RANK")
        if lr is None:
            lr = local_rank_from(rows, r, 0)
        # The GPU each rank would take (its identity, 0 for none), so that every rank picks the same
        # default: NCCL only where no two ranks share a GPU (it refuses them: "invalid usage").
        mine = _gpu_identity(torch, lr % torch.cuda.device_count()) if cuda and tdist.is_nccl_available() else 0
        gpus = self.exchange(-4, [mine], rdv)
        if any(row is None for row in gpus):
            self.store = self.xstore = None
            raise missing_ranks_error(f"multidev.distributed.init ({self.where})", gpus, rdv, "init")
        pg = settings.transport or ("cpu:gloo,cuda:nccl" if _a_gpu_per_rank([g[0] for g in gpus if g]) else "gloo")
        self.pg = pg
        self.cuda_device = None
        if "nccl" in pg:
            if not cuda:
                raise CapabilityError("the torch engine: transport 'nccl' needs CUDA GPUs; use 'gloo' on CPU-only "
                                      "machines")
            self.cuda_device = torch.device("cuda", lr % torch.cuda.device_count())
            torch.cuda.set_device(self.cuda_device)
            # NCCL's watchdog otherwise tears the process down on a timeout; blocking wait raises.
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        kwargs: dict[str, Any] = {}
        if self.cuda_device is not None:
            kwargs["device_id"] = self.cuda_device
        with self.lost(lambda: f"init ({self.where})", rdv):
            tdist.init_process_group(pg, store=tdist.PrefixStore("pg", store), rank=r, world_size=ws,
                                     timeout=_seconds(settings.timeout), **kwargs)
        self.group_up = True
        return Membership(r, ws, lr, pg)

    def stop(self, healthy: bool) -> None:
        tdist = getattr(self, "tdist", None)
        was_up = tdist is not None and getattr(self, "group_up", False)
        with contextlib.suppress(Exception):  # a broken group may fail to tear down; it is gone either way
            if was_up and tdist is not None and tdist.is_initialized():
                tdist.destroy_process_group()
        if was_up and "gloo" in getattr(self, "pg", ""):
            # gloo's worker threads release a finished collective's tensors just after its wait()
            # returns, taking the GIL to do it. Where the group outlives destroy_process_group
            # (creating a torch.optim optimizer while it is up keeps a reference, torch 2.13), a
            # release that lands in the interpreter's exit aborts the process ("terminate called
            # without an active exception", 1 in 24 torchrun runs of the data-parallel docs
            # snippet): give it the time here, whether or not the teardown succeeded.
            time.sleep(0.05)
        self.group_up = False
        self.store = self.xstore = self.queues = None

    def lost(self, what: str | Callable[[], str], timeout: float | None = None) -> Any:
        """What torch.distributed raises for a lost or hung peer (its ``DistError`` family and
        gloo's ``RuntimeError`` are RuntimeErrors): DistributedTimeoutError. The guard of a
        primitive (a name, the engine's timeout) is made once and reused: it keeps no state."""
        limit = self.timeout if timeout is None else timeout
        if timeout is None and type(what) is str:
            key = (what, limit)
            guard = _GUARDS.get(key)
            if guard is None:
                guard = peer_errors(what, _LOST, limit)
                if len(_GUARDS) < 64:
                    _GUARDS[key] = guard
            return guard
        return peer_errors(what, _LOST, limit)

    # -- placement -----------------------------------------------------------------------------
    @property
    def nccl(self) -> bool:
        return "nccl" in self.pg

    @property
    def host_transport(self) -> bool:
        return "gloo" in self.pg or "mpi" in self.pg

    def transport_for(self, device: Device) -> tuple[str, Device]:
        gpu = Device("gpu", self.cuda_device.index) if self.cuda_device is not None else None
        if device.kind == "gpu" and gpu is not None:
            return "torch", gpu
        if device.kind == "cpu" and self.host_transport:
            return "torch", _HOST
        return "torch", gpu if gpu is not None else _HOST

    def admit(self, t: Any) -> bool:
        if t.layout is not self.torch.strided:  # (the core calls this in a rank's checks: a refusal every rank sees)
            raise UnsupportedTensorError(f"the torch engine's collectives take dense tensors, not {t.layout} ones; "
                                         "pass x.to_dense()")
        return True  # (prepare then detaches, or copies a view it cannot send as it is)

    def prepare(self, t: Any) -> tuple[Any, bool]:
        self.admit(t)
        # collectives are not autograd operations (the memory is shared): what autograd tracks, a
        # tensor that requires grad or a view (of one that may), goes as a detached alias
        d = t.detach() if t.requires_grad or t._is_view() else t
        if d.is_contiguous() and not (d.is_conj() or d.is_neg()):
            return d, True
        # (a lazily conjugated or negated view: the primitives read the memory as it is, so the values resolved)
        return d.resolve_conj().resolve_neg().contiguous(), False

    # -- the consistency channel -----------------------------------------------------------------
    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        st = self.xstore
        if st is None:
            raise DistributedError("the torch engine's store is gone (the group was stopped)")
        what = f"the consistency exchange (call #{seq}) through the store ({self.where})"
        if seq >= 0 and self.queues is not None:
            return self._exchange_queued(seq, row, timeout, what)
        keys = [f"{seq}/{p}" for p in range(self.world)]
        with self.lost(what, timeout):
            st.set(keys[self.rank], ",".join(str(int(v)) for v in row))
            try:
                st.wait(keys, _seconds(timeout))
            except RuntimeError:  # DistStoreError: a timeout; which ranks are missing is read below
                present = [bool(st.check([k])) for k in keys]
                return [[int(v) for v in st.get(k).decode().split(",")] if ok else None
                        for k, ok in zip(keys, present)]
            vals = st.multi_get(keys)
            if seq >= 2:  # every rank has read call seq-2's rows: it posted call seq-1's after them
                st.delete_key(f"{seq - 2}/{self.rank}")
        return [[int(v) for v in raw.decode().split(",")] for raw in vals]

    def post(self, seq: int, row: Sequence[int]) -> None:
        q = self.queues
        if seq < 0 or q is None:
            return
        text = f"{seq},{self.rank}," + ",".join(str(int(v)) for v in row)
        with self.lost(f"the consistency exchange (call #{seq}) through the store ({self.where})"):
            for p in range(self.world):
                if p != self.rank:
                    q.queue_push(f"q/{p}", text)  # no reply awaited
        self._posted = seq

    def _exchange_queued(self, seq: int, row: Sequence[int], timeout: float, what: str) -> list[list[int] | None]:
        """The exchange of a collective (``seq >= 0``) through one store queue per rank: this rank's
        row pushed to every other rank's queue (no reply awaited), then the others' rows popped from
        its own (one round trip each, nothing left to delete). Calls run in the same order on every
        rank, so a popped row is this call's, a later one's (a rank that finished this call posted
        its next: kept for it) or a failed earlier call's (dropped)."""
        q, stash = self.queues, self._stash
        assert q is not None
        out: list[list[int] | None] = [None] * self.world
        out[self.rank] = [int(v) for v in row]
        deadline = time.monotonic() + max(timeout, 1e-3)
        if self._posted != seq:
            self.post(seq, row)
        self._posted = None
        with self.lost(what, timeout):
            for p in range(self.world):
                if p != self.rank and (seq, p) in stash:
                    out[p] = stash.pop((seq, p))
            wanted = sum(r is None for r in out)
            while wanted:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                q.set_timeout(_seconds(left))  # this connection's own: a local setting
                try:
                    raw = q.queue_pop(f"q/{self.rank}")
                except RuntimeError as e:  # DistStoreError: no row within the deadline; the missing stay None
                    if type(e).__name__ == "DistNetworkError":  # the store itself is gone: a lost peer, classified
                        raise
                    break
                values = [int(v) for v in raw.decode().split(",")]
                s, p = values[0], values[1]
                if s == seq and out[p] is None:
                    out[p] = values[2:]
                    wanted -= 1
                elif s > seq:
                    stash[(s, p)] = values[2:]
        return out

    # -- primitives ------------------------------------------------------------------------------
    def _reduce_op(self, op: str) -> Any:
        return getattr(self.tdist.ReduceOp, _REDUCE_OPS[op])

    def _start(self, what: str, call: Callable[[], Any], result: Callable[[], Any], quiet: bool = True) -> Handle:
        """``call()`` (a torch.distributed primitive, ``async_op``) under :meth:`lost`, inside
        :class:`_quiet` unless ``quiet`` is False (a primitive torch does not warn about over gloo,
        which the tests check: the guard is a tenth of a small call's Python; under NCCL, whose C++
        warnings torch raises as Python ones, the callers keep it)."""
        lost = self.lost(what)
        if not quiet:
            with lost:
                return _Work(lost, call(), result)
        with lost, _quiet():
            w = call()
        return _Work(lost, w, result)

    def _rank(self, r: int) -> int:
        """Rank ``r`` of this (sub)group as torch.distributed names it (a rank of the whole group)."""
        return r if self._members is None else self._members[r]

    def allreduce(self, t: Any, op: str) -> Handle:
        return self._start("all_reduce", lambda: self.tdist.all_reduce(t, op=self._reduce_op(op), group=self._group,
                                                                       async_op=True), lambda: t, quiet=self.nccl)

    def broadcast(self, t: Any, src: int) -> Handle:
        return self._start("broadcast", lambda: self.tdist.broadcast(t, src=self._rank(src), group=self._group,
                                                                     async_op=True), lambda: t, quiet=self.nccl)

    def reduce(self, t: Any, dst: int, op: str) -> Handle:
        return self._start("reduce", lambda: self.tdist.reduce(t, dst=self._rank(dst), op=self._reduce_op(op),
                                                               group=self._group, async_op=True), lambda: t)

    def allgather(self, t: Any) -> Handle:
        out = self.torch.empty((self.world, *t.shape), dtype=t.dtype, device=t.device)
        flat_out, flat_in = out.view(-1), t.reshape(-1)
        return self._start("all_gather", lambda: self.tdist.all_gather_into_tensor(
            flat_out, flat_in, group=self._group, async_op=True), lambda: self._ours(list(out.unbind(0))))

    def gather(self, t: Any, dst: int) -> Handle:
        bufs = [self.torch.empty_like(t) for _ in range(self.world)] if self.rank == dst else None
        return self._start("gather", lambda: self.tdist.gather(t, gather_list=bufs, dst=self._rank(dst),
                                                               group=self._group, async_op=True),
                           lambda: None if bufs is None else self._ours(bufs))

    def reduce_scatter(self, blocks: Any, op: str) -> Handle:
        out = self.torch.empty(tuple(blocks.shape[1:]), dtype=blocks.dtype, device=blocks.device)
        flat_out, flat_in = out.view(-1), self._theirs(blocks).view(-1)
        return self._start("reduce_scatter", lambda: self.tdist.reduce_scatter_tensor(
            flat_out, flat_in, op=self._reduce_op(op), group=self._group, async_op=True), lambda: out)

    def scatter(self, blocks: Any | None, like: Any, src: int) -> Handle:
        chunks = list(self._theirs(blocks).unbind(0)) if blocks is not None else None
        return self._start("scatter", lambda: self.tdist.scatter(like, scatter_list=chunks, src=self._rank(src),
                                                                 group=self._group, async_op=True), lambda: like)

    # -- subgroups and point-to-point --------------------------------------------------------------
    def split(self, groups: tuple[tuple[int, ...], ...]) -> Engine:
        assert self._members is None, "subgroups are split from the whole group"
        with self.lost("new_subgroups_by_enumeration"), _quiet():
            pg, _ = self.tdist.new_subgroups_by_enumeration([list(g) for g in groups],
                                                            timeout=_seconds(self.timeout))
        mine = next(g for g in groups if self.rank in g)
        v = copy.copy(self)
        v._group, v._members, v.rank, v.world = pg, mine, mine.index(self.rank), len(mine)
        perm = [mine.index(m) for m in sorted(mine)]
        v._perm = None if perm == list(range(len(mine))) else perm
        return v

    def all_to_all(self, blocks: Any) -> Handle:
        out = self.torch.empty_like(blocks)
        send = self._theirs(blocks)
        return self._start("all_to_all_single", lambda: self.tdist.all_to_all_single(
            out, send, group=self._group, async_op=True), lambda: self._ours(list(out.unbind(0))))

    def send(self, t: Any, dst: int) -> Handle:
        return self._start("isend", lambda: self.tdist.isend(t, dst=self._rank(dst), group=self._group, tag=_P2P_TAG),
                           lambda: None)

    def recv(self, like: Any, src: int) -> Handle:
        return self._start("irecv", lambda: self.tdist.irecv(like, src=self._rank(src), group=self._group,
                                                             tag=_P2P_TAG), lambda: like)


__all__ = ["TorchEngine"]
