"""Non-blocking moves with handles, and batched copies to the host."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar, overload

import numpy as np

from ._device import DeviceLike
from .adapter import start_move, start_to_numpy
from .errors import (
    DeviceMismatchError,
    InvalidArgumentError,
    InvalidDeviceError,
    UnsupportedTensorError,
    translate_errors,
)
from .placement import as_device, resolve
from .protocol import SupportsModels
from .registry import backend_of, cached_owner, require
from .sharding import ShardedTensor, is_sharded, sharded_to_host, unshard
from .trees import is_structure, owner_or_structure, tree_map

__all__ = ["Transfer", "start_to", "to_host"]

T = TypeVar("T")



def _models(b: Any) -> Any:
    return require(b, SupportsModels, "to")


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
    ``x`` itself when it is already there. A structure starts every tensor's move (models move in
    place, blocking, as their framework's ``to`` does; sharded tensors are gathered, blocking) and its
    ``wait()`` gives the structure."""
    if device is None:
        raise InvalidDeviceError("to(x, device, non_blocking=True) needs a device, got None (as to(x, device) does)")
    if x.__class__ is ShardedTensor:  # (a structure's leaf) gathered onto device, blocking, as a model moves
        return Transfer(unshard(x, device), None)
    b = owner_or_structure(x)
    if b is None:
        return _start_structure(x, device)
    dev = resolve(b, device)
    try:
        here = b.device_of(x)
    except DeviceMismatchError:  # a framework's own sharded tensor (JAX's): gathered, blocking
        if not is_sharded(x):
            raise
        return Transfer(unshard(x, dev), None)
    if here == dev:
        commit = getattr(b, "commit_resident", None)
        return Transfer(x if commit is None else commit(x), None)
    with translate_errors(lambda: f"{b.name} to({dev}, non_blocking=True)"):
        moves = b.transfers
        y, waiter = moves.start_move(x, dev) if moves is not None else start_move(b, x, dev)
    return Transfer(y, waiter)


def _is_tensor(x: Any) -> bool:
    """Whether a registered backend owns ``x`` as its tensor (one lookup for a class seen before)."""
    if cached_owner(type(x)) is not None:
        return True
    try:
        backend_of(x)
        return True
    except UnsupportedTensorError:
        return False


def _start_structure(x: Any, device: DeviceLike) -> Transfer[Any]:
    dev = as_device(device)

    def move_module(b: Any, m: Any) -> Any:
        with translate_errors(lambda: f"{b.name} to({dev}) of a model"):
            return _Done(b.models.move_module(m, resolve(b, dev)))
    pending = tree_map(lambda t: start_to(t, dev), x, "to", module=move_module, check=lambda b: resolve(b, dev),
                       scalar=lambda b, v: Transfer(_models(b).put_scalar(v, resolve(b, dev)), None))
    handles = _is_handle

    def land() -> Any:
        return tree_map(lambda h: h.wait(), pending, "to", is_leaf=handles)
    return Transfer(x, land)


class _Done:
    """A model already moved (in place): its handle is done."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def wait(self) -> Any:
        return self.value


def _is_handle(v: Any) -> bool:
    return isinstance(v, (Transfer, _Done, _Landing))


class _Landing:
    """A host copy in flight: ``wait()`` gives its NumPy array (a framework's error on the way as its
    MultidevError, naming ``where``)."""

    __slots__ = ("land", "where")

    def __init__(self, land: Callable[[], np.ndarray], where: str = "a tensor") -> None:
        self.land = land
        self.where = where

    def wait(self) -> np.ndarray:
        try:
            return self.land()
        except Exception as e:  # noqa: BLE001 - translated by reraise (a try costs nothing until something raises)
            translate_errors(lambda: f"to_host: {self.where}").reraise(e)


def _start_host_copy(x: Any, where: str) -> _Landing:
    if x.__class__ is ShardedTensor:  # the whole tensor, gathered on the host
        host = sharded_to_host(x)
        return _Landing(lambda: host)
    b = backend_of(x)
    across = getattr(b.mesh, "process_layout_of", None) if b.mesh is not None else None
    if across is not None and across(x) is not None:  # a DTensor, a global jax.Array: gathered (collective)
        host = sharded_to_host(x)
        return _Landing(lambda: host)
    try:
        moves = b.transfers
        return _Landing(moves.start_to_numpy(x) if moves is not None else start_to_numpy(b, x), where)
    except Exception as e:  # noqa: BLE001 - translated by reraise (a try costs nothing until something raises)
        translate_errors(lambda: f"to_host: {where}").reraise(e)


def _hosted_all(xs: list[Any]) -> list[np.ndarray]:
    """Blocking to_host of a structure's distinct tensors: every copy started, then each landed."""
    started = [_start_host_copy(t, "a tensor") for t in xs]
    return [h.wait() for h in started]


@overload
def to_host(xs: Any, non_blocking: Literal[False] = False) -> Any: ...


@overload
def to_host(xs: Any, non_blocking: Literal[True]) -> Transfer[Any]: ...


@overload
def to_host(xs: Any, non_blocking: bool) -> Any: ...


def to_host(xs: Any, non_blocking: bool = False) -> Any:
    """Copy tensors to host NumPy arrays (D2L: run on the GPU and copy results to the CPU).

    ``xs`` is one tensor (given back as one array, as ``jax.device_get`` does); or a structure of
    tensors (a list, tuple, named tuple or dict, nested as deep as you like, or a framework's tree),
    given back with NumPy arrays in place of its tensors; or any other iterable, such as a generator
    of results, given back as a list: each copy is started as soon as the iterable yields its
    tensor (into pinned host buffers where the backend has them), so the copies of early results run
    while later ones are computed. Blocking: returns the arrays. ``non_blocking=True``: returns a
    :class:`Transfer` whose ``wait()`` gives them. Arrays of CPU tensors may share their memory. A
    model is refused: pass its tensors (its state as a dict). A sharded tensor (a
    :class:`~multidev.ShardedTensor`, or JAX's) comes back as one array of the whole tensor.
    """
    if xs.__class__ is ShardedTensor:
        host = sharded_to_host(xs)
        return Transfer(host, None) if non_blocking else host
    if not non_blocking and cached_owner(xs.__class__) is not None:  # one tensor of a class seen before: no walk
        return _start_host_copy(xs, "a tensor").wait()
    if isinstance(xs, (str, bytes)) or not (hasattr(xs, "__iter__") or is_structure(xs) or _is_tensor(xs)):
        raise InvalidArgumentError(f"to_host takes a tensor, a structure or an iterable of tensors, got "
                                   f"{type(xs).__name__}")
    if isinstance(xs, (list, tuple, dict)) or _is_tensor(xs) or is_structure(xs):  # a tensor is a leaf
        if not non_blocking:  # one walk: every copy started, then each landed
            return tree_map(lambda t: _start_host_copy(t, "a tensor").wait(), xs, "to_host", batch=_hosted_all)
        pending: Any = tree_map(lambda t: _start_host_copy(t, "a tensor"), xs, "to_host")
    else:
        pending = []
        for i, x in enumerate(xs):  # started as the iterable yields
            try:
                pending.append(tree_map(lambda t: _start_host_copy(t, f"item {i}"), x,  # noqa: B023 - used at once
                                        f"to_host: item {i}"))
            except UnsupportedTensorError as e:
                raise UnsupportedTensorError(f"to_host: item {i}: {e}") from None

    def finish() -> Any:
        return tree_map(lambda h: h.wait(), pending, "to_host", is_leaf=_is_handle)

    if not non_blocking:
        return finish()
    return Transfer(None, finish)
