"""Non-blocking moves with handles, and batched copies to the host."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, Literal, TypeVar, overload

import numpy as np

from ._device import DeviceLike
from .adapter import start_move, start_to_numpy
from .errors import InvalidArgumentError, InvalidDeviceError, UnsupportedTensorError
from .placement import resolve
from .protocol import SupportsNonBlocking
from .registry import backend_of, supports
from .validate import translate_errors

__all__ = ["Transfer", "start_to", "to_host"]

T = TypeVar("T")



class Transfer(Generic[T]):
    """A copy in flight. :meth:`wait` blocks until the data is in place and returns it.

    The result is only reachable through ``wait()``, so it can never be read too early (PyTorch's
    own non-blocking device-to-host copy can hand back zeros when read before a sync, pytorch#86264).
    The handle keeps the source alive until the copy has landed; do not write the source before
    ``wait()`` returns. Safe to wait from several threads; the first wait does the blocking, later
    ones return at once.
    """

    __slots__ = ("_done", "_lock", "_value", "_waiter")

    def __init__(self, value: T, waiter: Callable[[], Any] | None) -> None:
        self._value = value
        self._waiter = waiter
        self._lock = threading.Lock()
        self._done = waiter is None

    def done(self) -> bool:
        """True once :meth:`wait` has completed (it does not poll the device)."""
        return self._done

    def wait(self) -> T:
        """Block until the copy has landed (raising any asynchronous error) and return the result."""
        if not self._done:
            with self._lock:
                if not self._done:
                    waiter = self._waiter
                    if waiter is not None:
                        with translate_errors("Transfer.wait"):
                            landed = waiter()
                        if landed is not None:  # the adapter's target exists once the copy lands
                            self._value = landed
                    self._waiter = None
                    self._done = True
        return self._value

    def __repr__(self) -> str:
        return f"<multidev.Transfer {'done' if self._done else 'in flight'}>"


def start_to(x: Any, device: DeviceLike) -> Transfer[Any]:
    """Start moving ``x`` to ``device`` and return its :class:`Transfer` at once; a done handle of
    ``x`` itself when it is already there."""
    b = backend_of(x)
    if device is None:
        raise InvalidDeviceError("to(x, device, non_blocking=True) needs a device, got None (as to(x, device) does)")
    dev = resolve(b, device)
    if b.device_of(x) == dev:
        return Transfer(x, None)
    with translate_errors(lambda: f"{b.name} to({dev}, non_blocking=True)"):
        y, waiter = b.start_move(x, dev) if supports(b, SupportsNonBlocking) else start_move(b, x, dev)  # type: ignore[attr-defined]
    return Transfer(y, waiter)


@overload
def to_host(xs: Iterable[Any], non_blocking: Literal[False] = False) -> list[np.ndarray]: ...


@overload
def to_host(xs: Iterable[Any], non_blocking: Literal[True]) -> Transfer[list[np.ndarray]]: ...


@overload
def to_host(xs: Iterable[Any], non_blocking: bool) -> list[np.ndarray] | Transfer[list[np.ndarray]]: ...


def to_host(xs: Iterable[Any], non_blocking: bool = False) -> list[np.ndarray] | Transfer[list[np.ndarray]]:
    """Copy many tensors to host NumPy arrays (D2L: run on the GPU and copy results to the CPU).

    ``xs`` is a list, or any iterable such as a generator of results: each copy is started as soon
    as the iterable yields its tensor (into pinned host buffers where the backend has them), so the
    copies of early results run while later ones are computed. Blocking: returns the arrays.
    ``non_blocking=True``: returns a :class:`Transfer` whose ``wait()`` gives the arrays. Arrays of
    CPU tensors may share their memory.
    """
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__"):
        raise InvalidArgumentError(f"to_host takes a list or an iterable of tensors, got {type(xs).__name__}")
    started: list[Callable[[], np.ndarray]] = []
    for x in xs:
        try:
            b = backend_of(x)
        except UnsupportedTensorError as e:
            raise UnsupportedTensorError(f"to_host: item {len(started)}: {e}") from None
        with translate_errors(lambda: f"to_host: item {len(started)}"):
            started.append(b.start_to_numpy(x) if supports(b, SupportsNonBlocking)  # type: ignore[attr-defined]
                           else start_to_numpy(b, x))

    def finish() -> list[np.ndarray]:
        out = []
        for i, land in enumerate(started):
            with translate_errors(lambda: f"to_host: item {i}"):  # noqa: B023 - built at once when raised
                out.append(land())
        return out

    if not non_blocking:
        return finish()
    result: list[np.ndarray] = []

    def land() -> None:
        result.extend(finish())

    return Transfer(result, land)
