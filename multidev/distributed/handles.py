"""Handles of collectives in flight (``async_op=True``)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import DistributedError, MultidevError, translate_errors
from .engine import Handle
from .group import Group
from .hangs import classify, classify_lost, wait_for

__all__ = ["Kept", "Work", "run"]


class Kept(Exception):
    """Raised inside a handle's result or finish to hand ``error`` to the caller without marking the
    group unusable: an outcome every rank concerned knows alike (a point-to-point message whose
    header the receiver refuses: the message was taken whole, so nothing is left in flight)."""

    def __init__(self, error: MultidevError) -> None:
        super().__init__(str(error))
        self.error = error


class Work:
    """A collective in flight. :meth:`wait` blocks until it has finished and returns the result (a
    tensor of the input's backend, or None on ranks that receive nothing); errors, timeouts
    included, surface there as :class:`DistributedError` / :class:`DistributedTimeoutError`. The
    timeout counts from the call."""

    def __init__(self, handle: Handle | None, finish: Callable[[Any], Any], what: str, g: Group, *,
                 probe: bool = True) -> None:
        self._handle = handle
        self._finish = finish
        self._what = what
        self._group = g
        self._probe = probe  # on a timeout, ask the whole group who never came (collectives only)
        self._deadline = time.monotonic() + g.timeout
        self._lock = threading.Lock()
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None

    @classmethod
    def failed(cls, error: BaseException, what: str, g: Group) -> Work:
        """A handle whose ``wait()`` raises ``error`` (a collective that could not start)."""
        w = cls(None, lambda r: None, what, g)
        w._error, w._done = error, True
        return w

    def is_completed(self) -> bool:
        """True when the collective has finished (wait() then returns at once)."""
        if self._done or self._handle is None:
            return True
        try:
            return bool(self._handle.test())
        except Exception:  # noqa: BLE001 - the error is wait()'s to raise
            return True

    def wait(self) -> Any:
        """Block until done and return the result (raises the collective's error)."""
        with self._lock:
            if not self._done:
                self._result, self._error = _complete(self._handle, self._finish, self._what, self._group,
                                                      self._probe, self._deadline)
                self._done = True
                self._handle = None
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        return f"<multidev.distributed.Work {self._what} {'done' if self._done else 'in flight'}>"


def _complete(h: Handle | None, finish: Callable[[Any], Any], what: str, g: Group, probe: bool,
              deadline: float | None) -> tuple[Any, BaseException | None]:
    """``(result, None)`` of primitive ``h`` waited for until ``deadline`` (``time.monotonic``; None:
    the group's timeout from now) and finished, or ``(None, error)``: a DistributedError, or the
    engine's own failure classified, marks the group unusable; converting the result back (this
    rank's own) and a :class:`Kept` error do not."""
    try:
        if h is not None:
            left = g.timeout if deadline is None else deadline - time.monotonic()
            wait_for(h, left if left > 0.0 else 0.0, what, g.rank, g if probe else None)
            try:
                raw = h.result()
            except Exception as e:  # noqa: BLE001 - translated as translate_errors' exit would (a hot path)
                translate_errors(what).reraise(e)
        else:
            raw = None
        return finish(raw), None
    except Kept as e:
        return None, e.error
    except DistributedError as e:
        g.fail(str(e))
        return None, e
    except MultidevError as e:  # converting the result back failed: this rank's own
        return None, e
    except Exception as e:  # noqa: BLE001 - the engine's own, classified; the group is unusable
        err = classify_lost(e, f"{what} on rank {g.rank}", g)
        g.fail(str(err))
        return None, err


def run(g: Group, what: str, start: Callable[[], tuple[Handle, Callable[[Any], Any]]], async_op: bool, *,
        probe: bool = True) -> Any:
    """Start a primitive (``start()`` returns its handle and how to finish the result) and wait for
    it, or hand back its :class:`Work` with ``async_op``. A failure to start it breaks the group
    (the ranks had agreed to run it). ``probe``: on a timeout, ask the whole group who never came
    (False for a subgroup's primitive: the other subgroups' ranks have moved on)."""
    try:
        h, finish = start()
    except Exception as e:
        err = e if isinstance(e, MultidevError) else classify(e, f"{what} on rank {g.rank}", g.timeout)
        g.fail(f"{what} could not start on rank {g.rank}: {err}")
        if err is e:
            raise
        raise err from e
    if async_op:
        return Work(h, finish, what, g, probe=probe)
    # (what Work(...).wait() does, without the handle: the caller waits here, so nothing else can)
    result, error = _complete(h, finish, what, g, probe, None)
    if error is not None:
        raise error
    return result
