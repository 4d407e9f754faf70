"""A template adapter: every core protocol method, in the protocol's order, for one real library.

Copy this file to write an adapter for your framework; ``docs/writing-an-adapter.md`` walks
through it. It adapts array-api-strict (``pip install array-api-strict``), whose devices
(``CPU_DEVICE``, ``device1``, ``device2``, ``no_float64``, ``no_x64``) all live in host memory, so
it shows virtual CPU devices and devices that lack a dtype. Replace each ``xp`` call with your
framework's. (multidev already serves array-api-strict, and any array-API library, as
``array_api:LIB``; this file exists to be read and copied.)

Test it as it stands::

    multidev conformance --backend multidev.examples.template_adapter:TemplateBackend

Register yours in your package's ``pyproject.toml``::

    [project.entry-points."multidev.backends"]
    mylib = "mylib_multidev:MylibBackend"
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any, ClassVar

import numpy as np

from multidev.adapter import (
    HOST_ALIGNMENT,
    ArrayApiDLPack,
    BaseBackend,
    Capabilities,
    CapabilityError,
    Device,
    canonical_dtype,
    concern,
    host_aligned,
    numpy_dtype,
)


class TemplateDLPack(ArrayApiDLPack):
    """Zero-copy interchange (the ``dlpack`` concern): export is ArrayApiDLPack's (the array itself:
    it has ``__dlpack__``); import labels the view with the device asked for (DLPack calls every host
    buffer cpu:0). A concern reaches the adapter as ``self.core``."""

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        try:
            return self.core._xp.from_dlpack(obj, device=self.core._native[device], copy=False)
        except (TypeError, ValueError, BufferError, RuntimeError) as e:
            raise CapabilityError(f"template backend cannot import this DLPack tensor: {e}") from e


class TemplateBackend(BaseBackend):
    """array-api-strict through every protocol method (see the module docstring)."""

    #: The name ``backend=`` arguments and ``--backend`` take.
    name: ClassVar[str] = "template"
    #: The framework's top-level module: the registry asks this adapter about a tensor only once
    #: the module is imported (no tensor of it can exist before).
    framework: ClassVar[str] = "array_api_strict"
    #: The capabilities it has, each a concern object made from the adapter (the others stay None).
    dlpack = concern(TemplateDLPack)

    def __init__(self) -> None:
        import array_api_strict as xp  # the framework is imported here, never at module import

        self._xp = xp
        info = xp.__array_namespace_info__()
        native = list(info.devices())  # the default device first: it becomes cpu:0
        native.sort(key=lambda d: d != info.default_device())
        self._native = {Device("cpu", i): d for i, d in enumerate(native)}
        self._device_of = {d: dev for dev, d in self._native.items()}
        per_device = {dev: frozenset(info.dtypes(device=d)) for dev, d in self._native.items()}
        every = frozenset().union(*per_device.values())
        self._dtypes = {n: t for d in native for n, t in info.dtypes(device=d).items()}
        self._names = {t: n for n, t in self._dtypes.items()}
        self._caps = Capabilities(
            mutable=True,  # arrays take x[...] = y
            async_execution=False,  # every call has finished when it returns
            pinned_memory=False,  # no accelerator
            dlpack=True,  # arrays have __dlpack__; xp.from_dlpack takes others'
            native_collectives=frozenset(),  # no framework allreduce
            dtypes=every,
            raises_on_mixed_devices=True,  # xp refuses arrays of two devices in one operation
            device_dtypes={dev: ds for dev, ds in per_device.items() if ds != every},  # no_float64, no_x64
        )

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    # version(): BaseBackend gives the framework module's __version__.

    def tensor_types(self) -> tuple[type, ...]:
        return (type(self._xp.asarray(0)),)

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        return list(self._native)

    def to_native_device(self, device: Device) -> Any:
        return self._native[device]

    def from_native_device(self, obj: Any) -> Device | None:
        return self._device_of.get(obj) if isinstance(obj, self._xp.Device) else None

    # -- dtypes -----------------------------------------------------------------------------
    def to_native_dtype(self, dtype: str) -> Any:
        if dtype not in self._dtypes:
            raise CapabilityError(f"template backend has no dtype {dtype!r}")
        return self._dtypes[dtype]

    def dtype_of(self, x: Any) -> str:
        return self._names.get(x.dtype) or canonical_dtype(x.dtype)

    # -- creation ---------------------------------------------------------------------------
    def _aligned(self, y: Any) -> Any:
        """``y``, re-homed into a 64-byte aligned host buffer when it is not in one: JAX and
        TensorFlow share host memory only at that alignment (XLA's rule)."""
        a = np.from_dlpack(y)  # a view: these arrays live in host memory
        if a.ctypes.data % HOST_ALIGNMENT == 0:
            return y
        return self._xp.asarray(host_aligned(a), device=y.device, copy=False)  # wraps it, no copy

    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        return self._aligned(self._xp.full(shape, value, dtype=self._dtypes[dtype], device=self._native[device]))

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        return self._aligned(self._xp.empty(shape, dtype=self._dtypes[dtype], device=self._native[device]))

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        return self._aligned(self._xp.arange(start, stop, step, dtype=self._dtypes[dtype],
                                             device=self._native[device]))

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        if isinstance(obj, np.ndarray):  # keep a NumPy array's dtype unless told otherwise
            obj = obj.astype(numpy_dtype(dtype or canonical_dtype(obj.dtype)), copy=True)
            dtype = dtype or canonical_dtype(obj.dtype)
        dt = None if dtype is None else self._dtypes[dtype]
        return self._aligned(self._xp.asarray(obj, dtype=dt, device=self._native[device], copy=True))

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        # The array API has no random numbers: sample with NumPy, then place the samples.
        return self.asarray(np.random.default_rng(seed).random(shape).astype(numpy_dtype(dtype)), dtype, device)

    # -- placement --------------------------------------------------------------------------
    def device_of(self, x: Any) -> Device:
        return self._device_of[x.device]

    def move(self, x: Any, device: Device) -> Any:
        return self._aligned(self._xp.asarray(x, device=self._native[device], copy=True))

    # start_move(), start_to_numpy(): not declared (SupportsNonBlocking); the core moves, then waits.

    def copy(self, x: Any, device: Device) -> Any:
        return self.move(x, device)

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.from_dlpack(x)  # a view of the host buffer

    def synchronize(self, device: Device | None) -> None:
        return None  # nothing is ever queued

    # wait(): BaseBackend's (synchronize the tensor's device).
    # device_wait_fn(): BaseBackend's (synchronize, bound to the device).
    # tensor_wait_fn(): BaseBackend's (wait, bound).

    # -- arithmetic for collectives ---------------------------------------------------------
    # shape_of(): BaseBackend's (tuple of x.shape).

    def combine(self, op: str, a: Any, b: Any) -> Any:
        self.same_device(op, (a, b))  # DeviceMismatchError naming both devices
        xp = self._xp
        if self.dtype_of(a) == "bool":  # max/min of bools are or/and (xp.maximum takes numbers)
            return (xp.logical_or if op in ("sum", "max") else xp.logical_and)(a, b)
        return {"sum": xp.add, "max": xp.maximum, "min": xp.minimum, "prod": xp.multiply}[op](a, b)

    def divide(self, x: Any, n: int) -> Any:
        return x / n  # used by mean, which the core allows on floating dtypes only

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self._xp.reshape(x, shape)

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        self.same_device("concat", xs)
        return self._xp.concat(list(xs), axis=axis)

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        bounds = np.cumsum([0, *sizes])
        lead = (slice(None),) * (axis % x.ndim)  # a negative axis counts from the end
        return [x[(*lead, slice(int(a), int(b)), ...)] for a, b in pairwise(bounds)]

    def assign(self, dst: Any, src: Any) -> None:
        self.same_device("assign", (dst, src))
        dst[...] = src

    # No collectives, training or compile concern (they stay None): the portable allreduce serves it,
    # replicas are plain copies, train_batch takes a hand-written grad= and updates with p - lr * g,
    # and md.compile refuses with CapabilityError. Add one as a Concern subclass declaring its
    # protocol (every method), set as ``collectives = concern(MyCollectives)``.
