"""Non-blocking moves for JAX (:class:`~multidev.adapter.SupportsNonBlocking`) and the machinery the
blocking moves share: copies into the ``pinned_host`` memory kind, and large pageable uploads as
``device_put`` of a list of pieces joined on the device (:func:`multidev.adapter.split_pieces`).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from multidev.adapter import Concern, Device, SupportsNonBlocking, split_pieces

from ._common import own_copy
from .core import JaxCore


class JaxTransfers(Concern, SupportsNonBlocking):
    """``start_move`` and ``start_to_numpy`` dispatched, not awaited; the pinned copies and staged
    uploads that the core's ``move``, ``asarray`` and ``to_numpy`` use too."""

    core: JaxCore

    def __init__(self, core: JaxCore) -> None:
        super().__init__(core)
        self._pinned_kinds: dict[Any, bool] = {}  # native device -> has a pinned_host memory kind

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], Any] | None]:
        """Dispatched, not awaited. To the host: the copy into pinned host memory is dispatched now
        (it runs once x is computed, overlapping with later work); the CPU array is made from it when
        the waiter runs, which returns it (handing the pinned buffer to the CPU device would wait for
        the copy, stalling the caller's dispatch)."""
        native = self.core.to_native_device(device)
        # Staged only when x is computed already: staging reads x now, which would wait for it.
        staged = self.staged_from_host(x, device, native) if x.is_ready() else None
        if staged is not None:
            return staged, staged.block_until_ready
        z = self.pinned(x) if device.kind == "cpu" else None
        if z is not None:
            def land() -> Any:
                y = self.land(z, x, native)
                y.block_until_ready()
                return y
            return z, land
        if device.kind == "cpu" and getattr(x.sharding, "memory_kind", None) not in (None, "device"):
            y = self.land(x, x, native)
        else:
            y = self.core.jax.device_put(x, native)

        def waiter() -> None:
            y.block_until_ready()

        return y, waiter

    def start_to_numpy(self, x: Any) -> Callable[[], np.ndarray]:
        """An accelerator array's copy into pinned host memory, dispatched now (it runs once x is
        computed); the callable waits and gives a read-only NumPy view of that fresh copy."""
        z = self.pinned(x)
        if z is None:
            return lambda: self.core.to_numpy(x)
        return lambda: np.asarray(z)

    def land(self, z: Any, x: Any, native: Any) -> Any:
        """The pinned copy ``z`` of ``x`` as an ordinary array of the CPU device ``native`` (in its
        default memory kind: XLA refuses to combine a host-memory-space array with CPU arrays):
        NumPy's view of ``z`` (waits for the copy into it) put to that device, which takes an
        aligned buffer without copying. A device-to-device put of ``z`` with the default memory
        kind named is a slow cross-client copy (docs/transfers.md); ``x`` is put directly where
        NumPy cannot read ``z``."""
        try:
            host = np.asarray(z)
        except (ValueError, TypeError, RuntimeError):
            return self.core.jax.device_put(x, native)
        return self.core.jax.device_put(host, native)

    def staged_from_host(self, x: Any, device: Device, native: Any) -> Any:
        """A large host array ``x`` (on a CPU device) put on accelerator ``device`` through the staged
        upload (read before this returns), or None where the plain ``device_put`` applies."""
        view = self.stages(x, device)
        return None if view is None else self.staged_put(view, native)

    def stages(self, x: Any, device: Device) -> np.ndarray | None:
        """The NumPy view of ``x`` the staged upload would read (a large host array on a CPU device,
        ``device`` an accelerator; after ``x`` is computed), or None where the plain ``device_put``
        applies. Puts nothing."""
        jax = self.core.jax
        threshold = self.core.staging.threshold
        # (16 bytes an element at most: JAX's nbytes, a Python property, read only near the threshold)
        if device.kind == "cpu" or math.prod(x.shape) * 16 < threshold or x.nbytes < threshold or x.ndim == 0 \
                or jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):  # PRNG keys: no NumPy view
            return None
        ds = x.sharding.device_set
        if len(ds) != 1 or next(iter(ds)).platform != "cpu":
            return None
        return np.asarray(x)  # a view of the CPU buffer (after x is computed)

    def pinned(self, x: Any) -> Any:
        """``x``'s copy in pinned host memory (``device_put`` to the ``pinned_host`` memory kind of its
        own device, asynchronous), or None where x is a host array or the platform has no pinned
        memory kind. Always a fresh copy: a buffer shared through DLPack never reads stale."""
        sh = x.sharding
        ds = sh.device_set
        if len(ds) != 1:
            return None
        nd = next(iter(ds))
        if nd.platform == "cpu" or not self._has_pinned(nd):
            return None
        if getattr(sh, "memory_kind", None) == "pinned_host":
            return x
        return self.core.jax.device_put(x, sh.with_memory_kind("pinned_host"))

    def _has_pinned(self, nd: Any) -> bool:
        hit = self._pinned_kinds.get(nd)
        if hit is None:
            try:
                hit = any(m.kind == "pinned_host" for m in nd.addressable_memories())
            except Exception:  # noqa: BLE001 - memory kinds are not implemented on every plugin
                hit = False
            self._pinned_kinds[nd] = hit
        return hit

    #: A caller's NumPy array smaller than this is copied before its put to an accelerator (:meth:`put_host`).
    copy_below = 1 << 20

    def put_host(self, arr: np.ndarray, native: Any, nd: Any = None) -> Any:
        """The caller's NumPy array put on JAX device ``native`` (cast to dtype ``nd``, as ``astype``
        casts); ``arr`` may be written again once this returns. JAX's ``device_put`` shares an aligned
        host buffer with a CPU device's array and copies into an accelerator after it returns
        (zero-copy semantics: it keeps a reference and reads the buffer when the transfer runs). So
        to a CPU device, a cast, or an array under :attr:`copy_below` bytes: a copy of ``arr`` of
        multidev's own (from 256 KiB aligned and pooled, :func:`~multidev.adapter.aligned_empty`),
        put (JAX shares an aligned one on a CPU device; to an accelerator the put stays
        asynchronous); else ``arr`` itself put (staged from ``staging.threshold``) and its transfer
        waited for."""
        jax = self.core.jax
        cast = nd is not None and arr.dtype != nd
        host = native.platform == "cpu"
        if host or cast or arr.nbytes < self.copy_below:
            own = own_copy(arr, nd if cast else None)
            if host or own.nbytes < self.core.staging.threshold or not own.ndim:
                return jax.device_put(own, native)
            return self.staged_put(own, native)  # (own is read by nothing else: no wait)
        if arr.nbytes >= self.core.staging.threshold and arr.ndim and arr.flags.c_contiguous:
            return self.staged_put(arr, native, wait=True)
        y = jax.device_put(arr, native)
        jax.block_until_ready(y)
        return y

    def staged_put(self, arr: np.ndarray, native: Any, wait: bool = False) -> Any:
        """A large pageable upload: one ``device_put`` of the list of its ``staging.chunk``-byte
        pieces (faster than the whole array, and than puts from several threads, alone and several
        in a row: docs/transfers.md), joined on the device. The pieces are views of ``arr``, which the
        transfer may read after this returns: ``wait`` waits for the pieces (``arr`` the caller's,
        who may write it again), else ``arr`` must not change (a JAX array's host buffer). The join
        compiles once per shape and dtype and holds the array twice for a moment (where the device
        has no room for that, one ``device_put`` instead)."""
        jax = self.core.jax
        parts = None
        try:
            parts = jax.device_put(split_pieces(arr, self.core.staging.chunk), native)
            y = self._join(tuple(parts), arr.shape)
        except (RuntimeError, MemoryError):  # the join needs the array twice: no room, so one put
            if parts is not None and wait:
                jax.block_until_ready(parts)  # (still reading arr, maybe)
            parts = None  # (its pieces freed first)
            y = jax.device_put(arr, native)
            parts = [y]
        if wait:
            jax.block_until_ready(parts)
        return y

    @functools.cached_property
    def _join(self) -> Callable[[tuple, tuple[int, ...]], Any]:
        jnp = self.core.jnp
        return self.core.jax.jit(lambda parts, shape: jnp.concatenate(parts).reshape(shape), static_argnums=1)
