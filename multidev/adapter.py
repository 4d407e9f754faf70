"""The public API for adapter authors: everything an adapter (built-in or third-party) imports.

An adapter is one class, usually a :class:`BaseBackend` subclass, implementing
:class:`~multidev.protocol.Backend` in the protocol's order (:data:`PROTOCOL_METHODS`). It imports
its framework in ``__init__``, never at module import. Register it through the ``multidev.backends``
entry-point group (or :func:`multidev.register_backend`) and test it with
``multidev conformance --backend mypkg.module:MyBackend``. ``docs/writing-an-adapter.md`` walks
through a complete adapter.

What :class:`BaseBackend` supplies (override any of them):

- ``version()``: the framework module's ``__version__``;
- ``start_move``: :meth:`move`, then a waiter that waits for the target (or none on synchronous
  backends);
- ``wait(x)``: ``synchronize(device_of(x))``;
- ``shape_of(x)``: ``tuple(int(s) for s in x.shape)``;
- ``export_dlpack`` / ``import_dlpack``: the array-API ``__dlpack__`` route (``x`` itself out;
  ``framework_module.from_dlpack`` in), refused with CapabilityError where
  ``capabilities.dlpack`` is False;
- ``native_allreduce``: CapabilityError (no fast path);
- the optional extensions for training and compilation (in :data:`OPTIONAL_METHODS`):
  ``parameter_like`` returns the copy unchanged (tensors without autograd state), ``sgd_update``
  computes ``p - lr * g`` out of place with the tensors' own operators, and ``value_and_grad``,
  ``compile_routes`` and ``compile`` raise CapabilityError (no autodiff, no compiler);
- ``same_device(what, xs)``: the one device of ``xs``, or DeviceMismatchError naming them all;
- ``configure_devices(n)`` (class method): ask for ``n`` virtual CPU devices before the framework
  starts, through the environment variable named by ``virtual_devices_env``.

Host memory: XLA (JAX, TensorFlow) shares a host buffer through DLPack only when its address is a
multiple of :data:`HOST_ALIGNMENT` (64 bytes), and the exchange layer refuses to hand such a
partner an unaligned buffer zero-copy (an explicit copy, or CapabilityError under ``copy=False``).
An adapter whose host tensors should reach them zero-copy allocates aligned buffers
(:func:`aligned_empty`, :func:`host_aligned`).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ._device import KINDS, Device
from .dlpack import DLPackCapsule, DLPackInfo, dlpack_info
from .dtypes import (
    COMPLEX_DTYPES,
    DTYPES,
    FLOAT_DTYPES,
    INT_DTYPES,
    ITEMSIZE,
    canonical_dtype,
    is_complex,
    is_floating,
    is_integer,
    numpy_dtype,
)
from .errors import (
    AdapterError,
    BackendError,
    BackendNotAvailableError,
    CapabilityError,
    CollectiveInputError,
    DeviceMismatchError,
    DeviceNotFoundError,
    InvalidArgumentError,
    InvalidDeviceError,
    InvalidDtypeError,
    MultidevError,
    UnsupportedTensorError,
)
from .protocol import OPTIONAL_METHODS, PROTOCOL_METHODS, REDUCE_OPS, Backend, Capabilities
from .staging import StagingPlan, parallel_put, staged_upload

__all__ = [
    "COMPLEX_DTYPES",
    "DTYPES",
    "FLOAT_DTYPES",
    "HOST_ALIGNMENT",
    "INT_DTYPES",
    "ITEMSIZE",
    "KINDS",
    "OPTIONAL_METHODS",
    "PROTOCOL_METHODS",
    "REDUCE_OPS",
    "AdapterError",
    "Backend",
    "BackendError",
    "BackendNotAvailableError",
    "BaseBackend",
    "Capabilities",
    "CapabilityError",
    "CollectiveInputError",
    "DLPackCapsule",
    "DLPackInfo",
    "Device",
    "DeviceMismatchError",
    "DeviceNotFoundError",
    "InvalidArgumentError",
    "InvalidDeviceError",
    "InvalidDtypeError",
    "MultidevError",
    "StagingPlan",
    "UnsupportedTensorError",
    "aligned_empty",
    "canonical_dtype",
    "check_adapter",
    "dlpack_info",
    "host_aligned",
    "is_complex",
    "is_floating",
    "is_integer",
    "numpy_dtype",
    "parallel_put",
    "same_device",
    "staged_upload",
    "start_to_numpy",
]


_HOST = Device("cpu", 0)


#: Bytes a host buffer's address must be a multiple of for XLA (JAX, TensorFlow) to share it.
HOST_ALIGNMENT = 64


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """A new, uninitialised C-contiguous NumPy array whose buffer is :data:`HOST_ALIGNMENT`-aligned."""
    dt = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(nbytes + HOST_ALIGNMENT, dtype=np.uint8)
    off = (-raw.ctypes.data) % HOST_ALIGNMENT
    return raw[off:off + nbytes].view(dt).reshape(shape)


def host_aligned(a: np.ndarray) -> np.ndarray:
    """``a`` itself when it is C-contiguous and :data:`HOST_ALIGNMENT`-aligned, else an aligned copy."""
    if a.flags.c_contiguous and a.ctypes.data % HOST_ALIGNMENT == 0:
        return a
    out = aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out


def same_device(backend: str, what: str, devices: Sequence[Device], note: str = "") -> Device | None:
    """The one device of ``devices`` (None when empty), or DeviceMismatchError naming them all.

    ``backend`` names the adapter in the message, ``what`` the operation (``"concat"``), ``note``
    is appended to the message (e.g. what the framework itself would have done)."""
    uniq = sorted(set(devices))
    if len(uniq) > 1:
        raise DeviceMismatchError(
            f"{backend} backend: {what} got operands on {', '.join(map(str, uniq))}{note}. Move them "
            "to one device first with multidev.to(x, device).")
    return uniq[0] if uniq else None


def start_to_numpy(b: Any, x: Any) -> Callable[[], np.ndarray]:
    """The protocol's default ``start_to_numpy`` for any adapter ``b``: ``start_move`` to cpu:0 (none
    for a host tensor), and a callable that waits and gives ``b.to_numpy`` of the landed tensor."""
    if b.device_of(x) == _HOST:
        return lambda: b.to_numpy(x)
    y, waiter = b.start_move(x, _HOST)

    def land() -> np.ndarray:
        landed = waiter() if waiter is not None else None
        out: np.ndarray = b.to_numpy(y if landed is None else landed)
        return out
    return land


class BaseBackend:
    """Shared defaults for adapters (see the module docstring). Subclasses set ``name`` and
    ``framework`` and implement the rest of the protocol."""

    name: ClassVar[str]
    framework: ClassVar[str]
    #: The environment variable giving this backend's number of virtual CPU devices, read when the
    #: adapter starts its framework (None: the backend has no virtual devices).
    virtual_devices_env: ClassVar[str | None] = None

    if TYPE_CHECKING:  # provided by every subclass; declared here for the type checker only
        @property
        def capabilities(self) -> Capabilities: ...
        def device_of(self, x: Any) -> Device: ...
        def move(self, x: Any, device: Device) -> Any: ...
        def to_numpy(self, x: Any) -> np.ndarray: ...
        def synchronize(self, device: Device | None) -> None: ...

    @classmethod
    def configure_devices(cls, count: int) -> bool:
        """Ask for ``count`` CPU devices before the framework starts (the conformance suite and the
        benchmarks call this). Keeps a value the user set already. Returns whether the request is
        in place (False where this backend has no virtual devices or its framework already started)."""
        env = cls.virtual_devices_env
        if env is None:
            return False
        os.environ.setdefault(env, str(int(count)))
        return cls.framework not in sys.modules or os.environ[env] == str(int(count))

    # -- identity ---------------------------------------------------------------------------
    def version(self) -> str:
        mod = sys.modules.get(self.framework)
        return str(getattr(mod, "__version__", "unknown"))

    # -- placement --------------------------------------------------------------------------
    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        y = self.move(x, device)
        if not self.capabilities.async_execution:
            return y, None
        return y, lambda: self.wait(y)

    def start_to_numpy(self, x: Any) -> Callable[[], np.ndarray]:
        return start_to_numpy(self, x)

    def wait(self, x: Any) -> None:
        self.synchronize(self.device_of(x))

    # -- arithmetic for collectives ---------------------------------------------------------
    def shape_of(self, x: Any) -> tuple[int, ...]:
        return tuple(int(s) for s in x.shape)

    # -- interchange ------------------------------------------------------------------------
    def export_dlpack(self, x: Any) -> Any:
        if not self.capabilities.dlpack:
            raise CapabilityError(f"{self.name} backend has no DLPack support (capabilities.dlpack)")
        if not hasattr(x, "__dlpack__"):
            raise CapabilityError(f"{self.name} backend: {type(x).__name__} has no __dlpack__")
        return x

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        if not self.capabilities.dlpack:
            raise CapabilityError(f"{self.name} backend has no DLPack support (capabilities.dlpack)")
        mod = sys.modules.get(self.framework)
        fn = getattr(mod, "from_dlpack", None)
        if fn is None:
            raise CapabilityError(f"{self.name} backend: {self.framework}.from_dlpack does not exist")
        try:
            y = fn(obj)
        except (TypeError, ValueError, BufferError, RuntimeError) as e:
            raise CapabilityError(f"{self.name} backend cannot import this DLPack tensor: {e}") from e
        got = self.device_of(y)
        if got != device:
            raise CapabilityError(f"{self.name} backend: a DLPack buffer of {device} arrived on {got}")
        return y

    # -- native fast paths ------------------------------------------------------------------
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        raise CapabilityError(f"{self.name} backend has no native allreduce; use algorithm='naive', "
                              "'ring', 'tree' or 'auto'")

    # -- optional extensions: training and compilation ------------------------------------
    def parameter_like(self, src: Any, y: Any) -> Any:
        return y

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        raise CapabilityError(f"{self.name} backend has no automatic differentiation: pass a hand-written "
                              "gradient (multidev.train_batch(..., grad=fn))")

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        return [p - lr * g for p, g in zip(params, grads)]

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        raise CapabilityError(f"{self.name} backend has no compiler; call the function as it is")

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        raise CapabilityError(f"{self.name} backend has no compiler; call the function as it is")

    # -- helpers ----------------------------------------------------------------------------
    def same_device(self, what: str, xs: Sequence[Any], note: str = "") -> Device:
        """The one device of tensors ``xs``, for operation ``what`` (named in the error); otherwise
        DeviceMismatchError naming every device, with ``note`` appended to its message (what the
        framework itself would have done), or CollectiveInputError when ``xs`` is empty."""
        dev = same_device(self.name, what, [self.device_of(x) for x in xs], note)
        if dev is None:
            raise CollectiveInputError(f"{self.name} backend: {what} needs at least one tensor")
        return dev


def check_adapter(obj: Any) -> list[str]:
    """The protocol problems of an adapter instance, one line each (empty when it looks right).
    Checked when the registry first creates an adapter; the conformance suite checks behaviour."""
    problems = []
    cls = type(obj)
    for attr in ("name", "framework"):
        v = getattr(cls, attr, None)
        if not isinstance(v, str) or not v:
            problems.append(f"class attribute {attr!r} must be a non-empty string, got {v!r}")
    for m in PROTOCOL_METHODS:
        if m == "capabilities":
            continue
        fn = getattr(obj, m, None)
        if fn is None and m in OPTIONAL_METHODS:
            continue
        if fn is None:
            problems.append(f"method {m}() is missing")
        elif not callable(fn):
            problems.append(f"{m} must be a method, got {type(fn).__name__}")
    try:
        caps = obj.capabilities
    except Exception as e:  # noqa: BLE001 - reported, not raised
        problems.append(f"capabilities raised {type(e).__name__}: {e}")
        caps = None
    if caps is not None and not isinstance(caps, Capabilities):
        problems.append(f"capabilities must be a multidev.adapter.Capabilities, got {type(caps).__name__}")
    elif caps is not None:
        if not caps.dtypes:
            problems.append("capabilities.dtypes is empty: list the canonical dtypes the backend holds")
        unknown = sorted(set(caps.dtypes) - set(DTYPES))
        if unknown:
            problems.append(f"capabilities.dtypes has unknown names {unknown}; canonical: {', '.join(DTYPES)}")
        for dev, ds in caps.device_dtypes.items():
            if not isinstance(dev, Device):
                problems.append(f"capabilities.device_dtypes key {dev!r} is not a Device")
            elif not set(ds) <= set(caps.dtypes):
                problems.append(f"capabilities.device_dtypes[{dev}] lists dtypes outside capabilities.dtypes")
        for k in ("mutable", "async_execution", "pinned_memory", "dlpack", "dlpack_streams", "raises_on_mixed_devices"):
            if not isinstance(getattr(caps, k), bool):
                problems.append(f"capabilities.{k} must be a bool")
        extra = sorted(set(caps.native_collectives) - {"allreduce"})
        if extra:
            problems.append(f"capabilities.native_collectives names unknown collectives {extra}")
    tt = getattr(obj, "tensor_types", None)
    if callable(tt):
        try:
            types = tt()
            if not isinstance(types, tuple) or not types or not all(isinstance(t, type) for t in types):
                problems.append("tensor_types() must return a non-empty tuple of classes")
        except Exception as e:  # noqa: BLE001
            problems.append(f"tensor_types() raised {type(e).__name__}: {e}")
    return problems


def validate_adapter(obj: Any, spec: str) -> None:
    """Raise AdapterError listing every protocol problem of ``obj`` (registered as ``spec``)."""
    problems = check_adapter(obj)
    if problems:
        raise AdapterError(f"adapter {spec!r} does not follow the multidev protocol:\n  - "
                           + "\n  - ".join(problems)
                           + "\nSee multidev.protocol.Backend (help(multidev.protocol.Backend) lists the "
                           "methods in order) and docs/writing-an-adapter.md.")

