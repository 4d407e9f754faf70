"""What an adapter provides: the :class:`Backend` protocol and its :class:`Capabilities` record.

An adapter is one file that implements every method below, in this order, for one framework. The
core (placement, collectives, conformance suite, benchmarks) is written once over this protocol.

Contract shared by every method:
- tensors are the framework's native objects; nothing is wrapped;
- ``device`` arguments are already-validated :class:`~multidev.Device` values that the backend has
  (the core checks with :meth:`Backend.devices` first);
- ``dtype`` arguments are canonical NumPy-style names (``"float32"``, ``"bfloat16"``, ``"int64"``,
  ``"bool"``, ...);
- an adapter module must not import its framework at import time: the framework is imported when the
  adapter class is instantiated, so ``import multidev`` stays light.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Protocol, Sequence, runtime_checkable

import numpy as np

from ._device import Device

__all__ = ["Backend", "Capabilities", "REDUCE_OPS", "same_device"]

#: Elementwise reductions every adapter's :meth:`Backend.combine` supports.
REDUCE_OPS = ("sum", "max", "min", "prod")


def same_device(backend: str, what: str, devices: Sequence[Device], note: str = "") -> Device | None:
    """The one device of ``devices`` (None when empty), or DeviceMismatchError naming them all.

    For adapters: call it before any operation that combines tensors, so a mismatch raises
    multidev's typed error, whatever the framework would do (raise, copy or compute silently).
    """
    uniq = sorted(set(devices))
    if len(uniq) > 1:
        from .errors import DeviceMismatchError

        raise DeviceMismatchError(
            f"{backend} backend: {what} got operands on {', '.join(map(str, uniq))}{note}. Move them "
            "to one device first with multidev.to(x, device).")
    return uniq[0] if uniq else None


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do. The conformance suite skips by these flags, never by backend name."""

    mutable: bool
    """Tensors can be written in place (``assign``, ``allreduce(inplace=True)``)."""
    async_execution: bool
    """Work is queued and runs later; ``synchronize`` does real waiting."""
    pinned_memory: bool
    """Page-locked host buffers exist for fast host<->GPU copies."""
    dlpack: bool
    """Tensors can be exchanged zero-copy through DLPack."""
    native_collectives: frozenset[str] = field(default_factory=frozenset)
    """Collectives with a framework fast path, e.g. ``{"allreduce"}`` (NCCL, psum, kvstore)."""
    dtypes: frozenset[str] = field(default_factory=frozenset)
    """Canonical dtype names this backend can hold right now (JAX drops 64-bit without x64)."""
    multi_device_ops: bool = True
    """Arithmetic across devices raises natively (False where the framework silently copies)."""


@runtime_checkable
class Backend(Protocol):
    """The adapter protocol. Method order here is the order every adapter file follows."""

    #: The backend's registry name (``"torch"``).
    name: ClassVar[str]
    #: The top-level module of the framework (``"torch"``). The registry only instantiates the
    #: adapter to identify a tensor when this module is already in ``sys.modules``.
    framework: ClassVar[str]

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        """This backend's capability record."""
        ...

    def version(self) -> str:
        """The framework's version string."""
        ...

    def tensor_types(self) -> tuple[type, ...]:
        """Native tensor classes this adapter owns (used with ``isinstance``)."""
        ...

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        """Every device this backend can place tensors on, CPUs first, each kind by index."""
        ...

    def to_native_device(self, device: Device) -> Any:
        """The framework's own device object for ``device`` (torch.device, jax Device, mx.Context...)."""
        ...

    def from_native_device(self, obj: Any) -> Device | None:
        """The :class:`Device` for a native device object, or ``None`` if ``obj`` is not one of ours."""
        ...

    # -- dtypes -----------------------------------------------------------------------------
    def to_native_dtype(self, dtype: str) -> Any:
        """The framework dtype for a canonical name; raises CapabilityError if unsupported."""
        ...

    def dtype_of(self, x: Any) -> str:
        """The canonical dtype name of ``x``."""
        ...

    # -- creation (every call places exactly on ``device`` with exactly ``dtype``) ------------
    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        """A new tensor filled with ``value``."""
        ...

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        """A new tensor with unspecified contents."""
        ...

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        """``start, start+step, ...`` below ``stop``."""
        ...

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        """A new tensor from nested sequences, scalars or a NumPy array (always a copy).

        ``dtype=None`` keeps a NumPy array's dtype, else the framework's own inference.
        """
        ...

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        """Uniform samples in [0, 1); the same seed gives the same values on the same backend."""
        ...

    # -- placement --------------------------------------------------------------------------
    def device_of(self, x: Any) -> Device:
        """The device ``x`` lives on. Never copies, never waits."""
        ...

    def move(self, x: Any, device: Device) -> Any:
        """``x`` on another device. Called only when ``x`` is not on ``device``. Asynchronous where
        the framework is; the result is safe to use in later framework operations."""
        ...

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        """Start moving ``x`` (not on ``device``) and return at once with the target tensor and a
        callable that blocks until it is safe to read (None when it already is). Host targets use
        pinned buffers where the backend has them. The caller must not read the tensor before
        calling the waiter."""
        ...

    def copy(self, x: Any, device: Device) -> Any:
        """A new, independent buffer on ``device`` (which may be x's own), equal in value."""
        ...

    def to_numpy(self, x: Any) -> np.ndarray:
        """A host NumPy array with x's values, after waiting for pending work on x. May share
        memory with a CPU-resident ``x``."""
        ...

    def synchronize(self, device: Device | None) -> None:
        """Block until queued work on ``device`` (every device when ``None``) has finished, and raise
        any asynchronous error it produced."""
        ...

    def wait(self, x: Any) -> None:
        """Block until ``x`` itself is computed, and raise any asynchronous error behind it."""
        ...

    # -- arithmetic the collectives need (operands always share a device) ---------------------
    def shape_of(self, x: Any) -> tuple[int, ...]:
        """The shape as a tuple of Python ints."""
        ...

    def combine(self, op: str, a: Any, b: Any) -> Any:
        """Elementwise ``op`` (one of REDUCE_OPS) of two same-shape, same-device tensors."""
        ...

    def divide(self, x: Any, n: int) -> Any:
        """``x / n`` keeping x's floating dtype (used by mean)."""
        ...

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        """``x`` with a new shape (a view where the framework can)."""
        ...

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        """Concatenation of same-device tensors along ``axis``."""
        ...

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        """``x`` cut along ``axis`` into consecutive pieces of the given sizes (they sum to the axis)."""
        ...

    def assign(self, dst: Any, src: Any) -> None:
        """Write ``src`` into ``dst`` in place (same device, shape and dtype). Raises CapabilityError
        on immutable backends."""
        ...

    # -- interchange -------------------------------------------------------------------------
    def export_dlpack(self, x: Any) -> Any:
        """Something a DLPack consumer takes for ``x`` without copying: an object with
        ``__dlpack__``/``__dlpack_device__`` where the framework has one, else a legacy capsule.
        Raises CapabilityError where x cannot be exported (dtype, strides)."""
        ...

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        """A native tensor on ``device`` (the producer's device) sharing memory with a DLPack
        producer (object or capsule). DLPack names every CPU ``cpu:0``, so placing a view on a
        virtual CPU device is the adapter's job. Raises CapabilityError where the framework cannot
        take it without a copy (the core then copies, unless the caller forbade it)."""
        ...

    # -- native fast paths (optional: advertised in capabilities.native_collectives) ------------
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        """The framework's own allreduce over tensors on distinct devices (NCCL, psum, kvstore);
        out of place. Raises CapabilityError where the backend has none."""
        ...
