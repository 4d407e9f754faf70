"""The consistency exchange through shared memory, where every rank of the group runs on one host.

Each collective's records (:mod:`.consistency`) travel, by default, through the engine's own
channel (torch's store, MPI's messages, JAX's coordination service): a round trip of tens of
microseconds, a share of a small collective's time. When every rank is on one machine, a
:class:`Mailbox` carries them instead: one mapped file, each rank writing its row into a slot of
its own and reading the others' from theirs (a few microseconds).

Each rank has two slots, used by call number parity. A rank writes call ``s``'s row only after its
exchange of call ``s - 1`` ended, which needed every rank's row of ``s - 1``, which each rank wrote
only after it had read every row of ``s - 2``: so the slot a row goes into is never still being
read. A slot holds the call number plus one (written last), a checksum of the call number and the
row, the row's length and the row. A call made again with the same record rewrites only the row's
first integer (its call count) and the checksum; a rank reads another's row as its own when the two
slots' checksums, lengths and first integers match (the common case: nothing decoded, nothing hashed,
three words of the other slot compared; the checksum covers the rest of the row). A row not there
yet is awaited by reading its call number back to back a while, then as
:func:`~multidev.engine.poll_until` waits, where every rank can have a core of its own (the union
of the ranks' affinity masks); where they share cores, the wait yields the core from the start (the
late rank may need it). A rank whose process is gone is counted missing at once (its pid is read at
the start), one that hangs once ``timeout`` passes, as the engine's channel would.

The mailbox starts at ``init`` (two small exchanges over the engine's channel: rank 0's file name,
then every rank's answer, so that all ranks use it or none does), is used for every call numbered
from 0 (init's and shutdown's own exchanges stay on the engine's channel), and the file is removed
as soon as every rank has mapped it. ``$MULTIDEV_SHARED_EXCHANGE=0`` keeps the engine's channel.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import mmap
import os
import secrets
import struct
import tempfile
from collections.abc import Sequence
from typing import Any

from ..errors import DistributedError
from .engine import missing_ranks_error, poll_until

__all__ = ["ENV", "Mailbox", "open_mailbox"]

#: ``0`` (or ``off``, ``false``, ``no``) keeps the engine's own channel for the consistency exchange.
ENV = "MULTIDEV_SHARED_EXCHANGE"
#: The longest row a slot holds (a collective's record is 47 integers).
WIDTH = 64
_HEAD = 3  # a slot: call number, checksum, row length, then the row
_SLOT = _HEAD + WIDTH
#: How many times :meth:`Mailbox.exchange` reads a missing row's call number back to back (about 0.1 ms)
#: before its general wait, where the group has no more ranks than its processes have cores.
_TIGHT_READS = 2000


def _cores(pids: Sequence[int]) -> int:
    """How many cores the processes ``pids`` may run on together (their affinity masks' union: ranks
    each bound to a core of its own count one each; ranks all pinned to one core, one). Fewer than the
    ranks means they share cores; as many does not prove they do not (masks {0}, {0}, {0, 1, 2}), nor
    does a container's CPU quota show here."""
    try:
        cpus: set[int] = set()
        for pid in pids:
            cpus |= os.sched_getaffinity(pid)
        return len(cpus)
    except (AttributeError, OSError):  # (no affinity here, or a process gone: the machine's count)
        return os.cpu_count() or 1
_NAME_SEQ, _AGREE_SEQ = -6, -7  # init's two exchanges over the engine's channel
_PREFIX = "multidev-exchange-"


def _where() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


@functools.lru_cache(maxsize=WIDTH + 1)
def _layout(n: int) -> struct.Struct:
    """``n`` native int64 words."""
    return struct.Struct(f"={n}q")


# odd 64-bit multipliers: one head field that differs alone changes the checksum (mod 2**64) for any difference
# below 2**63
_P_SEQ, _P_LEN, _P_FIRST = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_M64 = (1 << 64) - 1


def _digest(tail: bytes) -> int:
    """A 64-bit digest of a row's words after its first (BLAKE2b: no two integers alike, unlike
    Python's integer hash, where -1 and -2 hash alike; the same in every process)."""
    return int.from_bytes(hashlib.blake2b(tail, digest_size=8).digest(), "little")


def _checksum(seq: int, n: int, first: int, digest: int) -> int:
    """The slot's checksum, as a signed int64 word: of the call number, the row's length, its first
    integer and :func:`_digest` of the rest, so a reader on a weakly ordered CPU that sees a new
    call number beside an older row does not take it."""
    v = (seq * _P_SEQ + n * _P_LEN + first * _P_FIRST + digest) & _M64
    return v - (1 << 64) if v >> 63 else v


class Mailbox:
    """The records of one group's calls in shared memory (see the module doc): :meth:`post` and
    :meth:`exchange` as :meth:`multidev.distributed.engine.Engine.post` and ``exchange`` for calls
    numbered from 0. ``pids``: every rank's process id."""

    def __init__(self, mapped: mmap.mmap, rank: int, world: int, pids: Sequence[int]) -> None:
        self._map = mapped
        self.rank, self.world, self._pids = rank, world, list(pids)
        self._words: memoryview | None = memoryview(mapped).cast("q")  # int64 words, read and written in place
        self._posted: int | None = None
        # per slot (call number parity): the length of the row it holds, a copy of the row (its first
        # integer overwritten by each comparison), and the digest of the row after its first integer
        self._tails: list[tuple[int, list[int], int] | None] = [None, None]
        # (the back-to-back reads of a late row, and the wait's spin, only where every rank can have a core of its
        # own: where ranks share cores, the late one may be waiting for this one's)
        self._tight = _TIGHT_READS if world <= _cores(self._pids) else 0

    @staticmethod
    def size(world: int) -> int:
        return 8 * world * 2 * _SLOT

    def post(self, seq: int, row: Sequence[int]) -> None:
        if type(row) is not list:
            row = [int(v) for v in row]
        n = len(row)
        if n > WIDTH:
            raise DistributedError(f"the consistency exchange's row of {n} integers exceeds the shared slot ({WIDTH})")
        w = self._words
        assert w is not None
        parity = seq & 1
        at = (self.rank * 2 + parity) * _SLOT
        first, last = (int(row[0]) if n else 0), self._tails[parity]
        if last is not None and n and last[0] == n:  # call seq - 2's row but its first integer? (its copy's first set)
            prev = last[1]
            prev[0] = row[0]
            same = prev == row
        else:
            same = False
        if same:
            assert last is not None
            w[at] = -1  # being written
            w[at + 1] = _checksum(seq, n, first, last[2])
            w[at + _HEAD] = first
        else:
            self._tails[parity] = None  # (until written whole)
            rest = _layout(max(n - 1, 0)).pack(*row[1:])
            digest = _digest(rest)
            w[at] = -1
            _layout(3 if n else 2).pack_into(self._map, 8 * (at + 1), _checksum(seq, n, first, digest), n,
                                             *([first] if n else []))
            if rest:
                start = 8 * (at + _HEAD + 1)
                self._map[start:start + len(rest)] = rest
            self._tails[parity] = (n, list(row), digest)
        w[at] = seq + 1  # (0: never written, -1: being written)
        self._posted = seq

    def _read(self, p: int, seq: int) -> list[int] | None:
        """Rank ``p``'s row of call ``seq`` where it is written whole, else None."""
        w, mark = self._words, seq + 1
        assert w is not None
        at = (p * 2 + (seq & 1)) * _SLOT
        if w[at] != mark:
            return None
        check, n = w[at + 1], w[at + 2]
        if not 0 <= n <= WIDTH:
            return None
        start = 8 * (at + _HEAD)
        raw = self._map[start:start + 8 * n]  # (one read: the digest is of the words returned)
        got = list(_layout(n).unpack(raw))
        ok = w[at] == mark and _checksum(seq, n, got[0] if n else 0, _digest(raw[8:])) == check
        return got if ok else None

    def _same(self, p: int, seq: int, n: int) -> bool:
        """Whether rank ``p``'s slot holds call ``seq``'s row written whole and equal to this rank's
        (written by :meth:`post`): its checksum, length and first integer equal this rank's, word
        for word. The checksum covers the rest of the row through its 64-bit digest, so a row that
        differs there, or a torn read, passes only for a 64-bit collision; the rows' other words are
        not read (after a large collective has gone through the caches, each line read costs)."""
        w, mark = self._words, seq + 1
        assert w is not None
        parity = seq & 1
        at = (p * 2 + parity) * _SLOT
        if w[at] != mark:
            return False
        mine = 8 * ((self.rank * 2 + parity) * _SLOT + 1)
        theirs, end = 8 * (at + 1), 8 * (_HEAD - 1 + min(n, 1))
        m = self._map
        return m[theirs:theirs + end] == m[mine:mine + end] and w[at] == mark

    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        """Every rank's row of call ``seq`` (None: missing). This rank's entry, and every rank's whose
        row equals it, is ``row`` itself (a list; else a list of it): read them, do not change them."""
        if self._posted != seq:
            self.post(seq, row)
        self._posted = None
        mine = row if isinstance(row, list) else list(row)
        out: list[list[int] | None] = [mine] * self.world  # (a rank whose row equals this one's: this very list)
        n = len(mine)
        waiting = []
        for p in range(self.world):  # (one pass first: the rows that are there already, without the wait's set-up)
            if p != self.rank and not self._same(p, seq, n):
                out[p] = self._read(p, seq)
                if out[p] is None:
                    waiting.append(p)
        if not waiting:
            return out
        # (a row not there yet: each such rank's call-number word read back to back, a few thousand reads at most,
        # before the wait below, which reads whole slots and the clock between its reads: a row written a few
        # microseconds late is seen within a read, as the peers' mostly are after a collective)
        if self._tight:
            w, mark, parity = self._words, seq + 1, seq & 1
            assert w is not None
            for p in waiting:
                at = (p * 2 + parity) * _SLOT
                for _ in range(self._tight):
                    if w[at] == mark:
                        break
            for p in list(waiting):
                got = mine if self._same(p, seq, n) else self._read(p, seq)
                if got is not None:
                    out[p] = got
                    waiting.remove(p)
            if not waiting:
                return out
        dead: set[int] = set()
        checks = [0]

        def arrived() -> bool:
            for p in list(waiting):
                got = mine if self._same(p, seq, n) else self._read(p, seq)
                if got is not None:
                    out[p] = got
                    waiting.remove(p)
                    dead.discard(p)
            if waiting:
                checks[0] += 1
                if checks[0] % 256 == 0:  # a rank whose process is gone stays missing; the others are awaited
                    dead.update(p for p in waiting if not _alive(self._pids[p]))
            return len(dead) == len(waiting)

        # (then yielding: the peers may share this core; at once where the ranks outnumber the cores, for a late
        # rank may be waiting for this one's core)
        poll_until(arrived, timeout, spin=2e-4 if self._tight else 0.0)
        return out

    def close(self) -> None:
        """Unmap (views of the mapping may remain: then the mapping goes with them)."""
        if self._words is not None:
            self._words.release()
            self._words = None
        try:
            self._map.close()
        except BufferError:
            pass


def _enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def open_mailbox(engine: Any, rank: int, world: int, same_host: bool, timeout: float) -> Mailbox | None:
    """The group's mailbox where every rank runs on this host (``same_host``, from init's exchange)
    and every rank's ``$MULTIDEV_SHARED_EXCHANGE`` allows it; None otherwise. Collective: every rank
    of the group calls it with the same ``same_host`` (two exchanges over the engine's channel); the
    ranks decide on what they exchanged, so all use the mailbox or none does. A rank missing from
    either exchange raises DistributedTimeoutError naming it (init fails, as at its own exchange)."""
    if world < 2 or not same_host:
        return None
    path, fd, mapped, size = "", -1, None, Mailbox.size(world)
    enabled = int(_enabled())
    token, pids = 0, [0] * world
    try:
        if rank == 0 and enabled:
            try:
                token = secrets.randbits(62)
                path = os.path.join(_where(), f"{_PREFIX}{token:x}-{os.getpid()}")
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                os.posix_fallocate(fd, 0, size)  # the pages now: a full /dev/shm fails here, not later
            except OSError:
                token = 0
        rows = engine.exchange(_NAME_SEQ, [token, os.getpid(), enabled], timeout)
        _arrived(rows, rank, timeout, "init's shared-memory exchange (its file's name)")
        ok = 0
        first = rows[0]
        if first is not None and first[0] != 0 and all(r is not None and r[2] == 1 for r in rows):
            pids = [int(r[1]) for r in rows if r is not None]
            try:
                if rank != 0:
                    path = os.path.join(_where(), f"{_PREFIX}{first[0]:x}-{first[1]}")
                    fd = os.open(path, os.O_RDWR)
                mapped = mmap.mmap(fd, size)
                ok = int(all(_alive(pid) for pid in pids))  # every rank's process seen here: one pid namespace
            except (OSError, ValueError):
                ok = 0
        answers = engine.exchange(_AGREE_SEQ, [ok], timeout)
        _arrived(answers, rank, timeout, "init's shared-memory exchange (every rank's answer)")
        if mapped is not None and all(a is not None and a[0] == 1 for a in answers):
            box, mapped = Mailbox(mapped, rank, world, pids), None  # (kept open: the finally below)
            return box
        return None
    finally:
        if fd >= 0:
            os.close(fd)
        if rank == 0 and path:
            with contextlib.suppress(OSError):
                os.unlink(path)  # every rank has mapped it, given up, or failed: the mappings stay
        if mapped is not None:
            mapped.close()


def _arrived(rows: Sequence[Sequence[int] | None], rank: int, timeout: float, call: str) -> None:
    if any(r is None for r in rows):
        raise missing_ranks_error(f"multidev.distributed.init on rank {rank}", rows, timeout, call)
