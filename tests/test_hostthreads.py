"""multidev.hostthreads: host loops cut over the one thread pool (run_parts)."""
from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

import numpy as np
import pytest

from multidev import hostthreads
from multidev.adapter import run_parts

MIB = 1 << 20


@pytest.fixture
def four_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostthreads, "_count", 4)
    monkeypatch.setattr(hostthreads, "_pool", None)


@pytest.mark.usefixtures("four_threads")
def test_every_item_runs_once_in_contiguous_parts_on_several_threads() -> None:
    seen: list[tuple[int, list[int]]] = []
    lock = threading.Lock()

    def fn(part: Any) -> None:
        time.sleep(0.05)  # long enough that the parts overlap
        with lock:
            seen.append((threading.get_ident(), list(part)))

    run_parts(fn, list(range(10)), 64 * MIB)
    assert sorted(i for _, p in seen for i in p) == list(range(10))
    assert all(p == list(range(p[0], p[0] + len(p))) for _, p in seen), "parts are contiguous"
    assert len(seen) == 4 and len({t for t, _ in seen}) == 4, "one part per thread, four threads"


@pytest.mark.usefixtures("four_threads")
def test_small_work_stays_on_the_calling_thread() -> None:
    where: list[int] = []
    run_parts(lambda part: where.append(threading.get_ident()), list(range(10)), MIB + 1)
    assert where == [threading.get_ident()], "under two parts' worth of bytes: one call, here"


@pytest.mark.usefixtures("four_threads")
def test_a_failing_part_raises_after_the_others_finished() -> None:
    done: list[int] = []

    def fn(part: Any) -> None:
        if 3 in part:
            raise ValueError("part three fails")
        time.sleep(0.1)
        done.extend(part)

    with pytest.raises(ValueError, match="part three fails"):
        run_parts(fn, list(range(8)), 64 * MIB)
    assert sorted(done) == [0, 1, 4, 5, 6, 7], "every other part ran to its end before the error came"


_SETTING: contextvars.ContextVar[str] = contextvars.ContextVar("setting", default="default")


@pytest.mark.usefixtures("four_threads")
def test_parts_run_in_the_callers_context_and_nested_calls_run_inline() -> None:
    def fn(part: Any) -> None:
        assert _SETTING.get() == "the caller's", "a part runs in a copy of the caller's context"
        inner: list[int] = []
        run_parts(lambda p: inner.append(threading.get_ident()), [1, 2, 3], 64 * MIB)
        assert inner == [threading.get_ident()], "a call from a part runs on that part's thread"

    token = _SETTING.set("the caller's")
    try:
        run_parts(fn, list(range(4)), 64 * MIB)
    finally:
        _SETTING.reset(token)


@pytest.mark.usefixtures("four_threads")
def test_numpys_allreduce_on_several_threads_keeps_the_callers_errstate() -> None:
    """The NumPy adapter's one-pass allreduce cut over threads: the sums right, and an overflow under
    the caller's ``errstate(over="raise")`` raises as it would on one thread (NumPy 1 keeps errstate
    per thread, not per context)."""
    import multidev as md

    devs = [md.Device("cpu", i) for i in range(2)]
    a = np.full(4 * MIB, 3.0, np.float32)  # 16 MiB each: parts on several threads
    xs = [md.asarray(a, device=d, backend="numpy") for d in devs]
    for out in md.allreduce(xs), md.allreduce(xs, inplace=True):
        assert all(np.array_equal(np.asarray(o), np.full(4 * MIB, 6.0, np.float32)) for o in out)
    h = np.zeros(8 * MIB, np.float16)
    h[-1] = 60000  # the overflow in the last block: a part of a pool thread, not the caller's
    big = [md.asarray(h, device=d, backend="numpy") for d in devs]
    with np.errstate(over="raise"), pytest.raises(md.MultidevError, match="overflow"):
        md.allreduce(big)
    seen: list[str] = []
    with np.errstate(over="call", call=lambda kind, flag: seen.append(kind)):  # the caller's callback, too
        md.allreduce(big)
    assert seen and all("overflow" in k for k in seen), seen


def test_an_interrupt_while_waiting_leaves_no_part_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """KeyboardInterrupt in the caller's wait for the other parts: the parts not started are
    cancelled and the running ones finish before run_parts raises (they write the caller's memory)."""
    import time
    from concurrent.futures import Future

    monkeypatch.setattr(hostthreads, "threads", lambda: 4)
    ended: list[int] = []
    wait = Future.exception
    interrupted: list[bool] = []

    def exception(self: Future, timeout: float | None = None) -> BaseException | None:
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return wait(self, timeout)
    monkeypatch.setattr(Future, "exception", exception)

    running = threading.Event()

    def fn(part: list[int]) -> None:
        if part[0] == 0:  # the caller's part: on until another part is running (a slow machine's pool
            assert running.wait(30), "no pool thread started a part"  # may not have started any yet)
            return
        running.set()
        time.sleep(0.3)
        ended.append(part[0])
    with pytest.raises(KeyboardInterrupt):
        run_parts(fn, list(range(4)), 64 * MIB)
    done = list(ended)
    assert done, "run_parts raised before the running part had finished"
    time.sleep(0.5)
    assert ended == done, "a part still ran after run_parts raised"


def test_the_thread_count_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, want in (("1", 1), ("3", 3), ("999", hostthreads.MAX_THREADS), ("0", 1), ("many", 1)):
        monkeypatch.setattr(hostthreads, "_count", None)
        monkeypatch.setenv("MULTIDEV_HOST_THREADS", raw)
        assert hostthreads.threads() == want, raw
    monkeypatch.setattr(hostthreads, "_count", None)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="fork is POSIX only")
@pytest.mark.usefixtures("four_threads")
def test_a_forked_child_gets_a_pool_of_its_own() -> None:
    """After fork the parent's pool threads are gone in the child: run_parts there starts a new pool
    instead of waiting forever on threads that do not exist."""
    import os

    run_parts(lambda part: None, list(range(8)), 64 * MIB)  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # the child: exit 0 once the parts ran
        try:
            done: list[int] = []
            run_parts(lambda part: done.extend(part), list(range(8)), 64 * MIB)
            os._exit(0 if sorted(done) == list(range(8)) else 1)
        except BaseException:  # noqa: BLE001
            os._exit(2)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's run_parts hung")
