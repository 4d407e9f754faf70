"""The consistency exchange through shared memory (multidev.distributed.mailbox): rows by call
number, a missing rank after the timeout, a dead rank at once, init's agreement over a fake
engine, and a group of processes on one host using it (checked calls, a mismatch named)."""
from __future__ import annotations

import mmap
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from multidev.distributed.mailbox import Mailbox, open_mailbox


def _boxes(world: int, pids: list[int] | None = None) -> list[Mailbox]:
    mapped = mmap.mmap(-1, Mailbox.size(world))  # anonymous: the threads below share it
    return [Mailbox(mapped, r, world, pids or [os.getpid()] * world) for r in range(world)]


def test_every_rank_reads_every_row_of_each_call_in_order() -> None:
    world, calls = 3, 300
    boxes = _boxes(world)
    got: dict[int, list[list[list[int] | None]]] = {r: [] for r in range(world)}

    def rank(r: int) -> None:
        for seq in range(calls):
            row = [seq, r, *range(r + 40)][:47]
            if seq % 3 == 0:  # sent ahead, then exchanged (Engine.post's contract)
                boxes[r].post(seq, row)
            got[r].append(boxes[r].exchange(seq, row, 10.0))
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for r in range(world):
        assert len(got[r]) == calls
        for seq, rows in enumerate(got[r]):
            assert rows == [[seq, p, *range(p + 40)][:47] for p in range(world)], (r, seq)


def test_rows_that_differ_from_this_ranks_in_one_integer_are_read_as_they_are() -> None:
    # a call repeated rewrites only the call count and checksum; a peer equal to this rank is read
    # byte for byte: a row differing in any one integer (its first, its last, its length) still
    # comes back as that rank wrote it, never as this rank's own
    boxes = _boxes(3)
    base = [0, *range(100, 146)]
    variants = [lambda s: [s, *base[1:]], lambda s: [s, *base[1:-1], 7], lambda s: [s + 1, *base[1:]],
                lambda s: [s, *base[1:-1]], lambda s: [s]]
    seq = 0
    for i in range(40):
        for v in variants:
            rows = [[seq, *base[1:]], v(seq) if i % 2 else [seq, *base[1:]], v(seq)]
            for r in (1, 2):
                boxes[r].post(seq, rows[r])
            got = boxes[0].exchange(seq, rows[0], 5.0)
            assert got == rows, (i, seq)
            assert got[0] is rows[0]
            seq += 1


def test_rows_changing_length_in_a_slot_are_read_whole() -> None:
    # a slot that held a row of length 0 then takes one of length 1 (the same empty rest): its
    # length is written too, so the row is read, never a rank counted missing
    for peer in ([2], [3]):
        boxes = _boxes(2)
        for seq, (mine, theirs) in enumerate([([], []), ([1], [1]), ([2], peer), ([], []), ([4, 5], [4, 5])]):
            boxes[1].post(seq, theirs if seq != 2 else peer)
            assert boxes[0].exchange(seq, mine, 2.0) == [mine, theirs if seq != 2 else peer], (seq, peer)


def test_a_half_written_slot_is_never_taken_for_this_ranks_row() -> None:
    # what a reader on a weakly ordered CPU may see: a peer's new call number and checksum beside
    # a word of the row that call seq - 2 left there (-1 where the new row has -2: Python's integer
    # hash cannot tell them apart; the checksum must)
    from multidev.distributed.mailbox import _HEAD, _SLOT

    boxes = _boxes(2)
    old, mine, theirs = [0, 5, -1, 7], [2, 5, -1, 7], [2, 5, -2, 7]
    boxes[1].post(0, old)
    boxes[0].exchange(0, old, 1.0)
    boxes[1].post(2, theirs)  # written whole: then put back the stale word
    w = boxes[1]._words
    assert w is not None
    w[(1 * 2 + 0) * _SLOT + _HEAD + 2] = -1
    boxes[0].post(2, mine)
    assert not boxes[0]._same(1, 2, len(mine))
    assert boxes[0]._read(1, 2) is None  # neither as this rank's row nor as the peer's: awaited


def test_rows_of_numpy_integers_are_taken_as_ints() -> None:
    import numpy as np

    boxes = _boxes(2)
    row = [np.int64(3), np.int64(-2), 5]
    boxes[1].post(3, row)
    assert boxes[0].exchange(3, np.array([3, -2, 5]), 2.0) == [[3, -2, 5], [3, -2, 5]]


def test_a_rank_that_never_writes_is_missing_after_the_timeout() -> None:
    boxes = _boxes(2)
    t = time.monotonic()
    rows = boxes[0].exchange(0, [7, 7], 0.3)
    assert rows == [[7, 7], None]
    assert 0.29 <= time.monotonic() - t < 5


def test_a_rank_whose_process_is_gone_is_missing_at_once() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    boxes = _boxes(2, [os.getpid(), dead.pid])
    t = time.monotonic()
    rows = boxes[0].exchange(0, [1], 30.0)
    assert rows == [[1], None]
    assert time.monotonic() - t < 10, "a dead rank must not cost the whole timeout"


def test_a_dead_rank_is_missing_and_a_late_live_one_still_awaited() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    boxes = _boxes(3, [os.getpid(), os.getpid(), dead.pid])
    late = threading.Timer(0.5, lambda: boxes[1].post(0, [11]))
    late.start()
    rows = boxes[0].exchange(0, [10], 30.0)
    late.join()
    assert rows == [[10], [11], None]


@pytest.mark.parametrize(("seq", "theirs"), [(4, [4, 1, 2]), (5, [5, 1, 2]), (4, [4, 9, 9]), (5, [5, 1, 2, 3])])
def test_a_row_written_during_the_back_to_back_reads_is_taken_without_the_wait(
        monkeypatch: pytest.MonkeyPatch, seq: int, theirs: list[int]) -> None:
    """A late row is seen by the reads of the late rank's own slot for this call (its parity), back to
    back, before the general wait (here: made to fail if reached), and read as it was written (equal to
    this rank's or not); where the ranks' processes have fewer cores between them than there are ranks,
    the mailbox skips those reads; without affinity masks it counts the machine's cores."""
    from multidev.distributed import mailbox as mb

    boxes = _boxes(2)
    boxes[0]._tight = mb._TIGHT_READS
    row = [seq, 1, 2]
    words = boxes[0]._words
    assert words is not None
    mark_at = (1 * 2 + (seq & 1)) * mb._SLOT  # rank 1's slot of this call

    class Late:  # the words as rank 0 reads them: rank 1 writes its row once rank 0 read its mark 5 times
        reads = 0

        def __getitem__(self, i: int) -> int:
            if i == mark_at:
                Late.reads += 1
                if Late.reads == 5:
                    boxes[1].post(seq, theirs)
            return words[i]

        def __setitem__(self, i: int, v: int) -> None:
            words[i] = v

    monkeypatch.setattr(boxes[0], "_words", Late())

    def no_wait(*a: object, **k: object) -> bool:
        raise AssertionError("the general wait was reached")
    monkeypatch.setattr(mb, "poll_until", no_wait)
    assert boxes[0].exchange(seq, row, 5.0) == [row, theirs]
    assert 5 <= Late.reads < 50
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # (no affinity masks: macOS)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert _boxes(2)[0]._tight == 0 and _boxes(1)[0]._tight == mb._TIGHT_READS
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert _boxes(2)[0]._tight == mb._TIGHT_READS
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)  # (every rank pinned to one core)
    assert _boxes(2)[0]._tight == 0 and _boxes(1)[0]._tight == mb._TIGHT_READS
    spins: list[float] = []

    def wait(done: object, timeout: float, *, spin: float = 1e-3, busy: float = 0.05) -> bool:
        spins.append(spin)
        return False
    monkeypatch.setattr(mb, "poll_until", wait)
    assert _boxes(2)[0].exchange(0, [1], 0.1) == [[1], None]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {pid % 7}, raising=False)  # (a core each)
    assert _boxes(2, [14, 15])[0]._tight == mb._TIGHT_READS and _boxes(2, [14, 21])[0]._tight == 0
    assert _boxes(2, [14, 15])[0].exchange(0, [1], 0.1) == [[1], None]
    assert spins == [0.0, 2e-4]  # (sharing cores: the wait yields at once; else it spins first)


def test_a_row_longer_than_a_slot_is_refused() -> None:
    from multidev.errors import DistributedError

    with pytest.raises(DistributedError, match="exceeds the shared slot"):
        _boxes(2)[0].post(0, list(range(65)))


class _FakeEngine:
    """Init's exchanges between threads (each rank its own instance over shared rows); ``drop``:
    (seq, rank) rows this rank does not see."""

    def __init__(self, rank: int, world: int, board: dict, drop: tuple[int, int] | None = None) -> None:
        self.rank, self.world, self.board, self.drop = rank, world, board, drop

    def exchange(self, seq: int, row: list[int], timeout: float) -> list[list[int] | None]:
        cond = self.board["cond"]
        with cond:
            self.board.setdefault(seq, {})[self.rank] = list(row)
            cond.notify_all()
            cond.wait_for(lambda: len(self.board[seq]) == self.world, timeout)
            return [None if (seq, p) == self.drop else self.board[seq].get(p) for p in range(self.world)]


def _open_all(world: int, same_host: bool, env: str | None = None,
              drop: tuple[int, int] | None = None) -> list[Mailbox | BaseException | None]:
    board: dict = {"cond": threading.Condition()}
    out: list[Mailbox | BaseException | None] = [None] * world
    old = os.environ.get("MULTIDEV_SHARED_EXCHANGE")
    if env is not None:
        os.environ["MULTIDEV_SHARED_EXCHANGE"] = env
    try:
        def rank(r: int) -> None:
            try:
                out[r] = open_mailbox(_FakeEngine(r, world, board, drop if r == 0 else None), r, world, same_host, 10.0)
            except BaseException as e:  # noqa: BLE001 - reported to the test
                out[r] = e
        threads = [threading.Thread(target=rank, args=(r,), name=f"rank{r}") for r in range(world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        if env is not None:
            if old is None:
                os.environ.pop("MULTIDEV_SHARED_EXCHANGE")
            else:
                os.environ["MULTIDEV_SHARED_EXCHANGE"] = old
    return out


def test_init_opens_one_mailbox_for_every_rank_and_leaves_no_file() -> None:
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    boxes = _open_all(3, True)
    assert all(isinstance(b, Mailbox) for b in boxes)
    rows: list = [None] * 3

    def rank(r: int) -> None:
        box = boxes[r]
        assert isinstance(box, Mailbox)
        rows[r] = box.exchange(0, [r], 10.0)
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert rows == [[[0], [1], [2]]] * 3
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert not {f for f in after - before if f.startswith("multidev-exchange-")}, "the file outlived init"
    for b in boxes:
        assert isinstance(b, Mailbox)
        b.close()


@pytest.mark.parametrize(("same_host", "env"), [(False, None), (True, "0")])
def test_ranks_on_several_hosts_or_turned_off_keep_the_engines_channel(same_host: bool, env: str | None) -> None:
    assert _open_all(2, same_host, env) == [None, None]


def test_one_rank_turning_it_off_keeps_every_rank_on_the_engines_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    from multidev.distributed import mailbox

    monkeypatch.setattr(mailbox, "_enabled", lambda: threading.current_thread().name != "rank1")
    assert _open_all(3, True) == [None, None, None]
    assert not _leftovers()


def test_a_rank_missing_from_inits_exchange_fails_init_and_leaves_no_file() -> None:
    from multidev.errors import DistributedTimeoutError

    out = _open_all(3, True, drop=(-7, 2))  # rank 0 does not see rank 2's answer
    assert isinstance(out[0], DistributedTimeoutError) and "rank 2 did not arrive" in str(out[0]), out[0]
    assert not _leftovers()
    for b in out[1:]:
        if isinstance(b, Mailbox):
            b.close()


def _leftovers() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("multidev-exchange-")
            and f.endswith(f"-{os.getpid()}")} if os.path.isdir("/dev/shm") else set()


WORKER = '''
import numpy as np
import multidev as md
from multidev import distributed as dist
from multidev.distributed.group import current

dist.init(timeout=30)
r = dist.rank()
channel = type(current().channel).__name__
for _ in range(50):  # checked calls, sent ahead by data parallelism's buckets too
    y = dist.allreduce(np.full(4, float(r + 1)))
assert y.tolist() == [3.0] * 4, y
try:
    dist.allreduce(np.ones(3 + r, np.float32))
    out = "ran"
except md.CollectiveMismatchError as e:
    out = "mismatch" if "shape" in str(e) else str(e)[:200]
dist.barrier()
print(f"MDBOX {r} {channel} {out}", flush=True)
dist.shutdown()
'''


@pytest.mark.multiprocess
@pytest.mark.parametrize("shared", ["1", "0"])
def test_a_group_on_one_host_exchanges_through_the_mailbox(tmp_path: Path, shared: str) -> None:
    """Two processes of the torch engine on this host: the records go through the mailbox (or,
    turned off, the engine's store) and a mismatch is named on both ranks either way."""
    pytest.importorskip("torch")
    from multidev.distributed.engine import engine_class

    if engine_class("torch").missing():
        pytest.skip("the torch engine is not available here")
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONWARNINGS="ignore", MULTIDEV_SHARED_EXCHANGE=shared)
    p = subprocess.run([sys.executable, "-m", "multidev.distributed.launch", "-n", "2", "--engine", "torch",
                        str(script)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    channel = "Mailbox" if shared == "1" else "TorchEngine"
    found = sorted(re.findall(r"MDBOX (\d) ([A-Za-z]+) ([a-z]+)", p.stdout))  # (lines may interleave)
    assert found == [(str(r), channel, "mismatch") for r in range(2)], p.stdout[-3000:]
