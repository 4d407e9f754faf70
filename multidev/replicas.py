"""What data-parallel training needs from a framework: a :class:`Replica`, one model and its
optimizer as :func:`multidev.data_parallel` drives them, made by an adapter's
:class:`~multidev.protocol.SupportsDataParallel`. The core (:mod:`multidev.data_parallel`) does
the rest once for every framework: gradient buckets and their collectives across processes, the
broadcast from rank 0, accumulation without communication, the replica check.
"""
from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from . import buckets
from ._device import Device

__all__ = ["Ready", "Replica", "param_spec"]

#: ``ready(i, g)``: parameter ``i``'s gradient ``g`` is final for this step (accumulated micro-batches
#: included); the core puts it in its bucket and starts the bucket's collective once it is full.
Ready = Callable[[int, Any], None]


def param_spec(sizes: Mapping[str, int], shape: Sequence[int], param_axes: Sequence[str]) -> tuple[Any, ...]:
    """The core's layout rule for a parameter or optimizer-state tensor of ``shape`` on a mesh (of
    devices or of processes) whose axis sizes are ``sizes``: one entry per dimension, None (whole)
    except the first dimension that the parameter axes' total size divides evenly, cut along them
    (an axis name, or a tuple of names, the first major: JAX's ``PartitionSpec`` entries). All None
    where no dimension divides, or ``param_axes`` is empty (replicated).
    :func:`multidev.sharded_training.param_layout` is this rule as a :class:`~multidev.Layout`."""
    axes = tuple(param_axes)
    n = 1
    for a in axes:
        n *= int(sizes[a])
    spec: list[Any] = [None] * len(shape)
    if n > 1:
        for d, size in enumerate(shape):
            if size >= n and size % n == 0:
                spec[d] = axes[0] if len(axes) == 1 else axes
                break
    return tuple(spec)


class Replica(ABC):
    """One model and its optimizer on this process's device(s), as data-parallel training drives
    them. Where it spans several devices of the process (an adapter's one-process mode), it keeps
    them equal itself and every method speaks for all of them: gradients come back summed over
    its devices, loads and optimizer steps reach every device.

    Gradients accumulate: :meth:`backward` adds to them, :meth:`apply` steps the optimizer and
    clears them. Nothing here communicates across processes: the core does."""

    backend: Any
    """The adapter of the replica's tensors."""
    model: Any
    """The model now: the object given where it trains in place, else the current tree."""
    optimizer: Any
    """The optimizer given (None where the model carries its own, e.g. a flax ``TrainState``)."""
    devices: list[Device]
    """The devices it spans (one in the one-process-per-device mode)."""
    processes_refusal: str | None = None
    """Why this replica cannot also average across processes (None: it can); the core raises
    CapabilityError with it under a process group of more than one rank."""

    one_program: bool = False
    """Every rank runs one program over global arrays (JAX's multi-controller ``jit``): the ranks'
    batches must agree in structure, shapes and dtypes, so the core exchanges their signature before
    each step (``checks="step"``), and a mismatch raises on every rank instead of hanging."""

    @abstractmethod
    def parameters(self) -> list[tuple[str, Any]]:
        """The trained parameters as ``(name, tensor)``, in one order every rank shares (the
        framework's own order and names: a torch module's ``named_parameters``, a pytree's paths).
        The tensors of the first device."""

    @abstractmethod
    def buffers(self) -> list[tuple[str, Any]]:
        """State kept equal to rank 0's but not trained (BatchNorm's running statistics), as
        ``(name, tensor)``; ``[]`` where there is none."""

    @abstractmethod
    def load(self, params: Sequence[Any] | None, buffers: Sequence[Any] | None) -> None:
        """Make these the parameters' (and buffers') values on every device of the replica: tensors
        of the same shapes and dtypes as :meth:`parameters` (:meth:`buffers`) gives, in its order;
        None leaves that part as it is. In place where the framework's tensors are mutable, else
        the replica rebinds its own structure."""

    @abstractmethod
    def optimizer_state(self) -> Any:
        """The optimizer's state as a picklable object (host copies of its tensors), or None where
        there is no optimizer. :meth:`load_optimizer_state` takes it back on any rank."""

    @abstractmethod
    def load_optimizer_state(self, state: Any) -> None:
        """Make ``state`` (what :meth:`optimizer_state` returned, maybe on another rank) the
        optimizer's state, on this replica's devices."""

    @abstractmethod
    def backward(self, batch: Any, loss_fn: Callable[..., Any], ready: Ready | None) -> Any:
        """Forward and backward on ``batch`` (split over the replica's devices where it spans
        several, each part's gradient weighted by its share of the rows): the gradients are added
        to those accumulated since the last :meth:`apply`. With ``ready``, call ``ready(i, g)``
        once for each parameter ``i`` that has a gradient, ``g`` the accumulated total (during the
        backward pass where the framework has hooks, else after it). Returns the loss, a scalar of
        the framework (the rows' weighted mean where the replica spans several devices)."""

    @abstractmethod
    def apply(self, grads: Sequence[Any | None] | None) -> None:
        """Step the optimizer and clear the accumulated gradients. ``grads``: the gradients to step
        with (one per parameter, None for one that has none), on the first device; None steps with
        the accumulated ones as they are (already averaged, or nothing to average)."""

    def local_step(self, batch: Any, loss_fn: Callable[..., Any]) -> Any:
        """:meth:`backward` then :meth:`apply` with the accumulated gradients, where nothing is
        averaged across processes (no group, or a group of one): one call, so that a replica may
        fuse the two (the default calls them in turn). Returns the loss as :meth:`backward` does."""
        loss = self.backward(batch, loss_fn, None)
        self.apply(None)
        return loss

    def attach(self, sync: Any) -> bool:
        """Drive ``sync`` from the framework's own backward pass: call ``sync.ready(i, g)`` from a
        gradient hook as each gradient is final, and at the end of the pass write
        ``sync.finish()``'s averaged gradients into the gradient buffers; call
        ``sync.before_forward()`` before each training forward. Only while ``sync.active``.
        Returns whether it did (the default: False, the core calls :meth:`backward` with
        ``ready`` instead)."""
        return False

    def detach(self) -> None:  # noqa: B027 - an optional hook: most replicas install nothing
        """Remove what :meth:`attach` installed (the default: nothing)."""

    def drop_gradients(self) -> None:  # noqa: B027 - optional: a replica that keeps none needs nothing
        """Clear the gradients accumulated since the last :meth:`apply` (a step refused by the other
        ranks after its backward pass: nothing was exchanged, the parameters and optimizer state stay
        as they were). The default: nothing (a replica that accumulates gradients overrides it)."""

    def piece_optimizer(self, pieces: list[Any]) -> Any:
        """For multidev's own sharded training (:mod:`multidev.managed_sharding`): this replica's
        optimizer rebuilt, with its configuration and no state, over ``pieces`` (one entry per parameter
        in :meth:`parameters` order: this rank's or device's piece of it, the whole parameter where it
        is not cut, None where this holder steps none of it; all on one device, which holds the
        optimizer's state over them): an object whose ``step(grads, values)`` sets the pieces to
        ``values`` (the model's now; one per piece that is not None, in order), takes one gradient per
        piece, steps the optimizer with the given optimizer's current learning rate and weight decay,
        advances the given optimizer's step count with its own, and returns the updated pieces (new
        tensors). None (the default): the framework has no such mode. CapabilityError for an optimizer
        that has stepped already (its state would be lost) or whose update is not element by element
        (a norm over a whole tensor differs on a piece), raised before anything moves."""
        return None

    def zeros_like(self, x: Any) -> Any:
        """A zero tensor like ``x`` (a parameter's gradient that never came)."""
        b = self.backend
        return b.full(b.shape_of(x), 0, b.dtype_of(x), b.device_of(x))

    def flatten(self, tensors: Sequence[Any], dtype: str | None) -> Any:
        """One 1-D tensor holding ``tensors`` one after another (one dtype), cast to ``dtype`` when
        given. A new tensor; the inputs are unchanged."""
        b = self.backend
        flat = buckets.flatten(b, tensors)
        if dtype is not None and dtype != b.dtype_of(flat):
            flat = b.asarray(b.to_numpy(flat).astype(np.float32), dtype, b.device_of(flat))
        return flat

    def unflatten(self, flat: Any, like: Sequence[Any], scale: float | None) -> list[Any]:
        """``flat`` cut back into tensors shaped and typed as ``like`` (views where the framework
        has them), each multiplied by ``scale`` when given."""
        b = self.backend
        dtype = b.dtype_of(like[0])
        if b.dtype_of(flat) != dtype or scale is not None:
            host = b.to_numpy(flat).astype(np.float64 if scale is not None else None)
            flat = b.asarray((host * scale if scale is not None else host), dtype, b.device_of(flat))
        return buckets.unflatten(b, flat, [b.shape_of(t) for t in like])

    def fingerprints(self) -> list[list[int]]:
        """One row per device of the replica: a 31-bit checksum of each parameter's and buffer's
        bytes, in :meth:`parameters` then :meth:`buffers` order (equal rows: bitwise-equal
        replicas). The default reads each tensor of the first device to the host."""
        b = self.backend
        return [[zlib.crc32(np.ascontiguousarray(b.to_numpy(t)).tobytes()) & 0x7FFFFFFF
                 for _, t in [*self.parameters(), *self.buffers()]]]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model called on ``args`` (the wrapped object is callable as the model is); TypeError
        where the model is no callable object (a pytree of parameters)."""
        raise TypeError(f"{type(self).__name__}: the model is not callable")
