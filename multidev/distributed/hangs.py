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

from typing import Any

from ..errors import DistributedError, DistributedTimeoutError, MultidevError
from .engine import Handle

__all__ = ["PROBE_SEQ", "classify", "classify_lost", "wait_for"]


#: The exchange call number of the probe that names the absent ranks after a primitive timed out.
PROBE_SEQ = -5


def wait_for(h: Handle, timeout: float, what: str, rank: int, group: Any = None) -> None:
    """Wait for ``h`` up to ``timeout`` seconds; DistributedTimeoutError naming call ``what`` on
    ``rank`` when it does not finish (every rank had arrived at the call, so one died or stopped
    answering while the data moved, or the checks are off). With ``group``, the ranks that time out
    post their arrival on the consistency channel and read the others' for a short while (a tenth of
    the group's timeout, at most 2 s), so the error names the ranks that never came."""
    try:
        done = h.wait(timeout)
    except DistributedTimeoutError as e:  # the runtime's own timeout (gloo's, NCCL's blocking wait)
        absent = _absent(group) if group is not None else ""
        if absent:
            raise DistributedTimeoutError(f"{e}{absent}") from e
        raise
    if not done:
        absent = _absent(group) if group is not None else ""
        raise DistributedTimeoutError(
            f"{what} on rank {rank} did not finish within {timeout:g} s{absent}: a rank died or stopped answering "
            "during it (every rank had called it, or the checks are off). The group is unusable now: shutdown(), and "
            "restart the job")


def _absent(g: Any) -> str:
    """``"; ranks 1, 2 never arrived"`` from the probe exchange, or "" where it cannot tell."""
    try:
        rows = g.engine.exchange(PROBE_SEQ, [1], min(0.1 * g.timeout, 2.0))
    except Exception:  # noqa: BLE001 - the channel itself is gone (the rank hosting it died): cannot tell
        return ""
    missing = [r for r, row in enumerate(rows) if row is None]
    if not missing:
        return ""
    return f" ({'rank' if len(missing) == 1 else 'ranks'} {', '.join(map(str, missing))} never arrived at it)"


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


def classify_lost(e: BaseException, what: str, g: Any) -> DistributedError:
    """:func:`classify` for a failure inside a collective of group ``g``; when it reads as a lost
    peer (a runtime's "connection closed" rather than a time-out), the ranks that answer the probe
    exchange name the ones that never arrived, as a time-out's error does."""
    err = classify(e, what, g.timeout)
    if err is e:
        return err
    if isinstance(err, DistributedTimeoutError):
        absent = _absent(g)
        if absent:
            err = DistributedTimeoutError(f"{err}{absent}")
    err.__cause__ = e
    return err
