"""Placement and enumeration: the calls users make most (D2L's try_gpu, copyto vs as_in_ctx, ...)."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator, Sequence

import numpy as np

from ._device import Device, DeviceLike
from ._dtypes import canonical_dtype
from .errors import CapabilityError, DeviceNotFoundError, MultidevError, UnsupportedTensorError
from .protocol import Backend
from .registry import available_backends, backend_of, get_backend, loaded_backends

__all__ = [
    "device", "cpu", "gpu", "devices", "num_gpus", "try_gpu", "try_all_gpus", "backends", "backend",
    "device_scope", "default_device",
    "zeros", "ones", "full", "empty", "arange", "asarray", "rand",
    "device_of", "to", "copy", "to_numpy", "synchronize", "dtype_of",
]

_scope_device: contextvars.ContextVar[Device | None] = contextvars.ContextVar("md_device", default=None)
_scope_backend: contextvars.ContextVar[str | None] = contextvars.ContextVar("md_backend", default=None)


# -- devices -------------------------------------------------------------------------------------
def device(spec: DeviceLike) -> Device:
    """Parse any device spelling or native device object into the neutral :class:`Device`.

    ``device("cuda:1") == device("gpu:1") == device("/GPU:1") == device(torch.device("cuda", 1))``.
    Pure: does not check that the device exists (``devices()`` does that).
    """
    return Device.parse(spec)


def cpu(index: int = 0) -> Device:
    """``Device("cpu", index)``."""
    return Device("cpu", index)


def gpu(index: int = 0) -> Device:
    """``Device("gpu", index)`` (CUDA or ROCm). Not checked for existence; see :func:`try_gpu`."""
    return Device("gpu", index)


def _backend(name: str | None) -> Backend:
    if name is None:
        name = _scope_backend.get()
    return get_backend(name)


def backend(name: str | None = None) -> Backend:
    """The adapter object for ``name`` (the default backend when None), loading it on first use."""
    return _backend(name)


def backends() -> list[str]:
    """Names of the backends whose framework is installed and imports, e.g. ``['jax', 'numpy']``."""
    return available_backends()


def devices(backend: str | None = None, kind: str | None = None) -> list[Device]:
    """Every device of the backend (the default one when None), CPUs first; ``kind`` filters."""
    devs = _backend(backend).devices()
    if kind is not None:
        k = Device.parse(kind).kind if kind not in ("cpu", "gpu", "mps") else kind
        devs = [d for d in devs if d.kind == k]
    return devs


def num_gpus(backend: str | None = None) -> int:
    """How many GPUs the backend sees (0 on a CPU-only machine and on NumPy)."""
    return sum(1 for d in _backend(backend).devices() if d.is_gpu)


def try_gpu(i: int = 0, backend: str | None = None) -> Device:
    """GPU ``i`` if the backend has it, else ``cpu:0`` (D2L's ``try_gpu``)."""
    gpus = [d for d in _backend(backend).devices() if d.is_gpu]
    return gpus[i] if 0 <= i < len(gpus) else Device("cpu", 0)


def try_all_gpus(backend: str | None = None) -> list[Device]:
    """Every GPU of the backend, or ``[cpu:0]`` when it has none: never an empty list."""
    gpus = [d for d in _backend(backend).devices() if d.is_gpu]
    return gpus or [Device("cpu", 0)]


def _resolve(b: Backend, spec: DeviceLike | None) -> Device:
    """Parse ``spec`` (scope default, then cpu:0, when None) and check that ``b`` has it."""
    if spec is None:
        spec = _scope_device.get() or Device("cpu", 0)
    dev = Device.parse(spec)
    avail = b.devices()
    if dev not in avail:
        hint = ("use multidev.try_gpu() to fall back to the CPU" if dev.is_gpu
                else "configure more virtual devices for this backend (see the README)")
        raise DeviceNotFoundError(
            f"{b.name} has no device {dev}; available: {', '.join(map(str, avail))}. Hint: {hint}."
        )
    return dev


@contextlib.contextmanager
def device_scope(device: DeviceLike, backend: str | None = None) -> Iterator[Device]:
    """Within the block, creation calls default to ``device`` (and to ``backend`` when given).

    Context-local: threads and asyncio tasks each see their own scope.
    """
    if backend is not None:
        get_backend(backend)
    dev = Device.parse(device)
    t1 = _scope_device.set(dev)
    t2 = _scope_backend.set(backend) if backend is not None else None
    try:
        yield dev
    finally:
        _scope_device.reset(t1)
        if t2 is not None:
            _scope_backend.reset(t2)


def default_device() -> Device:
    """The device creation calls use when given none: the innermost device_scope, else cpu:0."""
    return _scope_device.get() or Device("cpu", 0)


# -- creation ------------------------------------------------------------------------------------
def _shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def _dtype(b: Backend, dtype: Any, default: str) -> str:
    name = canonical_dtype(dtype) if dtype is not None else default
    if name not in b.capabilities.dtypes:
        b.to_native_dtype(name)  # the adapter's own CapabilityError says why and how to enable it
        raise CapabilityError(
            f"{b.name} cannot hold dtype {name!r} here; supported: {', '.join(sorted(b.capabilities.dtypes))}")
    return name


def full(shape: int | Sequence[int], value: Any, dtype: Any = None, device: DeviceLike | None = None,
         backend: str | None = None) -> Any:
    """A new tensor of ``value`` on ``device`` (default float32, or bool/int64 for such a value)."""
    b = _backend(backend)
    default = ("bool" if isinstance(value, bool) else "int64" if isinstance(value, (int, np.integer))
               else "float32")
    if default == "int64" and "int64" not in b.capabilities.dtypes:
        default = "int32"
    return b.full(_shape(shape), value, _dtype(b, dtype, default), _resolve(b, device))


def zeros(shape: int | Sequence[int], dtype: Any = None, device: DeviceLike | None = None,
          backend: str | None = None) -> Any:
    """A new tensor of zeros (float32 by default) on ``device``."""
    b = _backend(backend)
    return b.full(_shape(shape), 0, _dtype(b, dtype, "float32"), _resolve(b, device))


def ones(shape: int | Sequence[int], dtype: Any = None, device: DeviceLike | None = None,
         backend: str | None = None) -> Any:
    """A new tensor of ones (float32 by default) on ``device``."""
    b = _backend(backend)
    return b.full(_shape(shape), 1, _dtype(b, dtype, "float32"), _resolve(b, device))


def empty(shape: int | Sequence[int], dtype: Any = None, device: DeviceLike | None = None,
          backend: str | None = None) -> Any:
    """A new uninitialised tensor (float32 by default) on ``device``."""
    b = _backend(backend)
    return b.empty(_shape(shape), _dtype(b, dtype, "float32"), _resolve(b, device))


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None,
           device: DeviceLike | None = None, backend: str | None = None) -> Any:
    """``start, start+step, ...`` below ``stop`` on ``device`` (int64 for integer bounds, else float32)."""
    if stop is None:
        start, stop = 0, start
    b = _backend(backend)
    ints = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
    default = ("int64" if "int64" in b.capabilities.dtypes else "int32") if ints else "float32"
    return b.arange(start, stop, step, _dtype(b, dtype, default), _resolve(b, device))


def asarray(obj: Any, dtype: Any = None, device: DeviceLike | None = None,
            backend: str | None = None) -> Any:
    """A new tensor holding ``obj`` (nested lists, scalars, NumPy arrays) on ``device``. Always copies.

    ``dtype=None`` keeps a NumPy array's dtype and otherwise uses the framework's own inference.
    """
    b = _backend(backend)
    name = _dtype(b, dtype, "float32") if dtype is not None else None
    if name is None and isinstance(obj, np.ndarray):
        name = _dtype(b, obj.dtype, "float32")
    return b.asarray(obj, name, _resolve(b, device))


def rand(shape: int | Sequence[int], dtype: Any = None, device: DeviceLike | None = None,
         backend: str | None = None, seed: int | None = None) -> Any:
    """Uniform samples in [0, 1) on ``device`` (float32 by default); a seed makes them repeatable."""
    b = _backend(backend)
    return b.rand(_shape(shape), _dtype(b, dtype, "float32"), _resolve(b, device), seed)


# -- placement -----------------------------------------------------------------------------------
def device_of(x: Any) -> Device:
    """The device tensor ``x`` lives on. Never copies or waits."""
    return backend_of(x).device_of(x)


def dtype_of(x: Any) -> str:
    """The canonical dtype name of tensor ``x``."""
    return backend_of(x).dtype_of(x)


def to(x: Any, device: DeviceLike, *, non_blocking: bool = False) -> Any:
    """``x`` on ``device``: ``x`` itself when it is already there (no-op, D2L's ``as_in_ctx``),
    else a copy on the target device. Asynchronous where the framework is, but always safe to read.

    ``non_blocking=True`` returns a :class:`~multidev.transfer.Transfer` at once; its ``wait()``
    gives the tensor once the copy has landed (host targets use pinned buffers where they exist).
    """
    if non_blocking:
        from .transfer import start_to

        return start_to(x, device)
    b = backend_of(x)
    dev = device if device.__class__ is Device else Device.parse(device)
    if b.device_of(x) == dev:  # the no-op path: no enumeration, no validation
        return x
    return b.move(x, _resolve(b, dev))


def copy(x: Any, device: DeviceLike | None = None) -> Any:
    """A new, independent buffer holding ``x`` on ``device`` (x's own device when None): D2L's
    ``copyto``. Always copies, even on the same device."""
    b = backend_of(x)
    dev = b.device_of(x) if device is None else _resolve(b, device)
    return b.copy(x, dev)


def to_numpy(x: Any) -> np.ndarray:
    """A host NumPy array with x's values, after waiting for x's pending work. It may share memory
    with a CPU-resident ``x``; use ``np.array(md.to_numpy(x))`` for an independent copy."""
    return backend_of(x).to_numpy(x)


def synchronize(target: Any = None, *, backend: str | None = None) -> None:
    """Wait for queued work and raise any asynchronous error it produced.

    - ``synchronize()``: every device of every loaded backend (or of ``backend``).
    - ``synchronize(device)``: that device, on ``backend`` or on every loaded backend.
    - ``synchronize(tensor)``: until that tensor is computed.
    """
    if target is None or isinstance(target, (Device, str)):
        dev = None if target is None else Device.parse(target)
        if backend is not None and dev is not None:
            b = get_backend(backend)
            if dev in b.devices():
                return b.synchronize(dev)
        targets = [get_backend(backend)] if backend is not None else loaded_backends()
        for b in targets:
            if dev is None:
                b.synchronize(None)
            elif dev in b.devices():
                b.synchronize(dev)
            elif backend is not None:
                _resolve(b, dev)  # raises DeviceNotFoundError with the available devices
        return
    try:
        b = backend_of(target)
    except UnsupportedTensorError as e:
        try:
            dev = Device.parse(target)  # a native device object
        except MultidevError:
            raise e from None  # neither a tensor nor a device: say so as a tensor error
        return synchronize(dev, backend=backend)
    b.wait(target)
