"""Hang detection: a collective that some rank never joins, or a rank that died, becomes a
:class:`~multidev.errors.DistributedTimeoutError` on the ranks that wait, within the group's
timeout, naming the ranks that did not arrive and the call they were expected at.

Two places can wait on another rank:

- the consistency exchange (:meth:`Engine.exchange`), which every checked call, every gather and
  every barrier makes before anything is sent: the engine returns which rows did not arrive, so
  the error names those ranks exactly (a rank that died between two calls, a rank that skipped
  the call or hangs elsewhere);
- the primitive itself (:meth:`Handle.wait`), bounded by the same timeout: a rank that dies while
  the data moves (the exchange had seen it arrive), or any rank with the checks off.
"""
from __future__ import annotations

from ..errors import DistributedError, DistributedTimeoutError, MultidevError
from .engine import Handle

__all__ = ["classify", "wait_for"]


def wait_for(h: Handle, timeout: float, what: str) -> None:
    """Wait for ``h`` up to ``timeout`` seconds; DistributedTimeoutError when it does not finish
    (every rank had arrived at the call, so one died or stopped answering while the data moved)."""
    if not h.wait(timeout):
        raise DistributedTimeoutError(
            f"{what} did not finish within {timeout:g} s: a rank died or stopped answering during it (every rank "
            "had called it, or the checks are off). The group is unusable now: shutdown(), and restart the job")


def classify(e: BaseException, what: str, timeout: float) -> DistributedError:
    """A failure of the transport during ``what`` as a DistributedError, by its type: multidev's own
    errors as they are (argument errors become DistributedError), what a runtime raises for a lost
    peer (``RuntimeError`` and its subclasses, ``TimeoutError``, ``ConnectionError``: the inputs
    were checked before it ran) DistributedTimeoutError, anything else DistributedError."""
    msg = str(e).strip()[:500]
    if isinstance(e, DistributedError):
        return e
    if isinstance(e, (MultidevError, ValueError, TypeError, KeyError, AttributeError)):
        return DistributedError(f"{what} failed: {type(e).__name__}: {msg}")
    if isinstance(e, (TimeoutError, RuntimeError, ConnectionError)):
        return DistributedTimeoutError(
            f"{what}: another rank died, hung or never arrived (timeout {timeout:g} s): {type(e).__name__}: {msg}")
    return DistributedError(f"{what} failed in the engine: {type(e).__name__}: {msg}")
