"""Non-blocking moves with handles, batched copies to the host, and zero-copy exchange between
frameworks through DLPack."""
from __future__ import annotations

import threading
from typing import Any, Callable, Generic, Sequence, TypeVar

import numpy as np

from ._device import Device, DeviceLike
from .errors import CapabilityError, DeviceNotFoundError, MultidevError
from .registry import backend_of, get_backend

__all__ = ["Transfer", "to_host", "convert"]

T = TypeVar("T")


class Transfer(Generic[T]):
    """A copy in flight. :meth:`wait` blocks until the data is in place and returns it.

    The result is only reachable through ``wait()``, so it can never be read too early (PyTorch's
    own non-blocking device-to-host copy can hand back zeros when read before a sync, pytorch#86264).
    Safe to wait from several threads; the first wait does the blocking, later ones return at once.
    """

    __slots__ = ("_value", "_waiter", "_lock", "_done")

    def __init__(self, value: T, waiter: Callable[[], None] | None) -> None:
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
                    assert self._waiter is not None
                    self._waiter()
                    self._waiter = None
                    self._done = True
        return self._value

    def __repr__(self) -> str:
        return f"<multidev.Transfer {'done' if self._done else 'in flight'}>"


def start_to(x: Any, device: DeviceLike) -> Transfer[Any]:
    """Start moving ``x`` to ``device``; no-op handle when it is already there."""
    from .api import _resolve

    b = backend_of(x)
    dev = _resolve(b, device)
    if b.device_of(x) == dev:
        return Transfer(x, None)
    y, waiter = b.start_move(x, dev)
    return Transfer(y, waiter)


def to_host(xs: Sequence[Any], non_blocking: bool = False) -> list[np.ndarray] | Transfer[list[np.ndarray]]:
    """Copy many tensors to host NumPy arrays (D2L: run on the GPU and copy results to the CPU).

    Blocking: returns the list of arrays. ``non_blocking=True``: every copy is started at once
    (into pinned host buffers where the backend has them) and a :class:`Transfer` is returned whose
    ``wait()`` gives the arrays, so computation queued after this call overlaps with the copies.
    """
    host = Device("cpu", 0)
    started = []
    for x in xs:
        b = backend_of(x)
        if b.device_of(x) == host:
            started.append((b, x, None))
        else:
            y, waiter = b.start_move(x, host)
            started.append((b, y, waiter))

    def finish() -> list[np.ndarray]:
        out = []
        for b, y, waiter in started:
            if waiter is not None:
                waiter()
            out.append(b.to_numpy(y))
        return out

    if not non_blocking:
        return finish()
    result: list[np.ndarray] = []

    def waiter() -> None:
        result.extend(finish())

    return Transfer(result, waiter)


class _DLPackCapsule:
    """Presents a legacy DLPack capsule through the ``__dlpack__`` protocol (for NumPy and JAX)."""

    def __init__(self, capsule: Any, device: Device) -> None:
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        if kwargs.get("copy") is True:
            raise BufferError("this producer can only share memory (copy=True refused)")
        cap, self._capsule = self._capsule, None
        if cap is None:
            raise BufferError("a DLPack capsule can be consumed once")
        return cap

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device.to_dlpack()


def _exportable(src: Any, x: Any) -> Any:
    obj = src.export_dlpack(x)
    if hasattr(obj, "__dlpack__"):
        return obj
    return _DLPackCapsule(obj, src.device_of(x))


def convert(x: Any, backend: str, copy: bool | None = None) -> Any:
    """``x`` as a tensor of another framework, on the same device, same shape, dtype and values.

    - ``copy=None``: zero-copy through DLPack where both sides allow it, else an explicit copy
      (a strided source the consumer cannot take, a virtual CPU device the consumer cannot label).
      A dtype the consumer cannot hold raises CapabilityError; a device it does not have raises
      DeviceNotFoundError.
    - ``copy=False``: zero-copy or CapabilityError, never a copy.
    - ``copy=True``: always a new buffer.
    Asynchronous producers are waited for first, which is the stream synchronization DLPack leaves
    to the caller when a bare capsule is exchanged.
    """
    src = backend_of(x)
    dst = get_backend(backend)
    dev = src.device_of(x)
    if dst.name == src.name:
        return src.copy(x, dev) if copy else x
    if dev not in dst.devices():
        raise DeviceNotFoundError(
            f"convert: {dst.name} has no device {dev} (where the {src.name} tensor lives); available: "
            f"{', '.join(map(str, dst.devices()))}. Move it first with multidev.to(x, 'cpu')."
        )
    dtype = src.dtype_of(x)
    if dtype not in dst.capabilities.dtypes:
        raise CapabilityError(f"convert: {dst.name} cannot hold {dtype} here; cast the {src.name} tensor first")
    why = ""
    if src.capabilities.dlpack and dst.capabilities.dlpack:
        try:
            if src.capabilities.async_execution:
                src.wait(x)
            y = dst.import_dlpack(_exportable(src, x), dev)
            if dst.device_of(y) == dev and dst.dtype_of(y) == dtype:
                if not copy:
                    return y
                out = dst.copy(y, dev)
                # The copy reads memory the producer's framework may write next, unseen by the
                # consumer's scheduler: let it land before handing it out.
                dst.wait(out)
                return out
            why = f"DLPack gave {dst.dtype_of(y)} on {dst.device_of(y)}"
        except (MultidevError, BufferError, RuntimeError, TypeError, ValueError) as e:
            why = f"{type(e).__name__}: {e}"
    else:
        why = f"{src.name if not src.capabilities.dlpack else dst.name} has no DLPack support"
    if copy is False:
        raise CapabilityError(f"convert {src.name} -> {dst.name} on {dev} cannot share memory ({why}); "
                              "pass copy=None to allow a copy")
    return dst.asarray(src.to_numpy(x), dtype, dev)
