"""Placement and enumeration: the calls users make most (D2L's try_gpu, copyto vs as_in_ctx, ...)."""
from __future__ import annotations

import contextlib
import contextvars
import numbers
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import numpy as np

from ._device import Device, DeviceLike
from .dtypes import ITEMSIZE, canonical_dtype, is_floating
from .errors import (
    CapabilityError,
    DeviceMismatchError,
    InvalidArgumentError,
    InvalidDeviceError,
    MultidevError,
    ScopeError,
    UnsupportedTensorError,
    translate_errors,
)
from .mesh import Layout
from .placement import as_device, cached_spelling, resolve, scope_backend, scope_device
from .placement import default_device as default_device
from .protocol import Backend, SupportsModels
from .registry import (
    available_backends,
    backend_of,
    cached_device_waits,
    cached_owner,
    cached_tensor_wait,
    device_wait,
    get_backend,
    get_default_backend,
    loaded_backends,
    registry_generation,
    require,
    tie_cache,
    tied_put,
    waiter_of,
)
from .sharding import (
    ShardedTensor,
    across_processes,
    is_sharded,
    map_shards,
    place,
    sharded_device,
    sharded_to_host,
    unshard,
)
from .transfer import start_to
from .trees import (
    is_structure,
    leaves,
    model_owner,
    owner_or_structure,
    plain_rebuild,
    plain_walk,
    resident_container,
    tree_map,
)
from .validate import (
    MAX_ELEMENTS,
    check_fill,
    check_memory,
    check_range,
    check_seed,
    check_shape,
    check_values,
    host_memory,
    range_length,
)

if TYPE_CHECKING:
    from .transfer import Transfer

_T = TypeVar("_T")

__all__ = [
    "arange", "asarray", "backend", "backends", "copy", "cpu", "default_device", "device", "device_of",
    "device_scope", "devices", "dtype_of", "empty", "full", "gpu", "native_device", "num_gpus", "ones", "rand",
    "synchronize",
    "to", "to_numpy", "try_all_gpus", "try_gpu", "zeros",
]


# -- devices -------------------------------------------------------------------------------------
def device(spec: DeviceLike) -> Device:
    """Parse any device spelling or native device object into the neutral :class:`Device`.

    ``device("cuda:1") == device("gpu:1") == device("/GPU:1") == device(<torch.device cuda:1>)``.
    Does not check that the device exists (``devices()`` does that).
    """
    return as_device(spec)


def cpu(index: int = 0) -> Device:
    """``Device("cpu", index)``."""
    return Device("cpu", index)


def gpu(index: int = 0) -> Device:
    """``Device("gpu", index)`` (CUDA or ROCm). Not checked for existence; see :func:`try_gpu`."""
    return Device("gpu", index)


def _backend(name: str | None) -> Backend:
    if name is None:
        name = scope_backend.get()
    return get_backend(name)


def backend(name: str | None = None) -> Backend:
    """The adapter object for ``name`` (the default backend when None), loading it on first use
    (imports its framework then, not before). BackendNotAvailableError, with how to install it,
    where the framework is missing or fails to import; unknown names say which exist."""
    return _backend(name)


def backends() -> list[str]:
    """Names of the backends whose framework is installed and imports (sorted). Imports each
    registered framework to find out (each adapter loaded once): use :func:`registered_backends` to list
    without importing anything."""
    return available_backends()


def devices(backend: str | None = None, kind: str | None = None) -> list[Device]:
    """Every device of the backend (the default one when None), CPUs first, then GPUs by index;
    ``kind`` ("cpu" or "gpu") keeps one kind. Enumerated once and cached (virtual CPU devices must
    be configured before the framework starts). BackendNotAvailableError where it is not installed."""
    devs = _backend(backend).devices()
    if kind is not None:
        if not isinstance(kind, str):
            raise InvalidDeviceError(f"kind must be a string such as 'cpu' or 'gpu', got {kind!r:.40}")
        k = kind if kind in ("cpu", "gpu", "mps") else Device.parse(kind).kind
        devs = [d for d in devs if d.kind == k]
    return devs


def num_gpus(backend: str | None = None) -> int:
    """How many GPUs the backend sees (0 on a CPU-only machine and on NumPy). Imports the
    backend's framework (not CUDA work: no context is created where the framework avoids it)."""
    return sum(1 for d in _backend(backend).devices() if d.is_gpu)


def _index(i: Any, what: str) -> int:
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
        raise InvalidArgumentError(f"{what} takes a GPU index (an int), got {i!r:.40} ({type(i).__name__})")
    return int(i)


def try_gpu(i: int = 0, backend: str | None = None) -> Device:
    """GPU ``i`` if the backend has it, else ``cpu:0`` (D2L's ``try_gpu``)."""
    i = _index(i, "try_gpu")
    gpus = [d for d in _backend(backend).devices() if d.is_gpu]
    return gpus[i] if 0 <= i < len(gpus) else Device("cpu", 0)


def try_all_gpus(backend: str | None = None) -> list[Device]:
    """Every GPU of the backend, or ``[cpu:0]`` when it has none: never an empty list."""
    gpus = [d for d in _backend(backend).devices() if d.is_gpu]
    return gpus or [Device("cpu", 0)]


def device_scope(device: DeviceLike, backend: str | None = None) -> contextlib.AbstractContextManager[Device]:
    """Within the block, multidev's creation calls default to ``device`` (and to ``backend`` when
    given). With ``backend``, the framework's own default device is set too where the framework has
    one (torch's device context, ``jax.default_device``, ``tf.device``, MXNet's context: the
    adapter's :class:`~multidev.protocol.SupportsDeviceScope`), so framework code in the block
    (``torch.ones(2)``, ``jnp.ones(2)``) lands on ``device``; the device must then be one the
    backend has (DeviceNotFoundError otherwise).

    multidev's part is context-local (threads and asyncio tasks each see their own scope); the
    framework's part nests and crosses threads as the framework's own scope does. Misuse raises
    :class:`~multidev.errors.ScopeError` naming the scope: a scope exited before the scopes
    entered inside it closes those first (this context is left as it was before the scope was
    entered, and their own later exits do nothing); one exited from another thread or context, or
    entered twice, changes nothing.
    """
    dev = as_device(device)
    b = get_backend(backend) if backend is not None else None
    target = resolve(b, dev) if b is not None else None  # DeviceNotFoundError at once otherwise
    return _DeviceScope(dev, backend, b, target)


#: The device scopes open in this context (thread or asyncio task), innermost last.
_open_scopes: contextvars.ContextVar[tuple[_DeviceScope, ...]] = contextvars.ContextVar("md_open_scopes",
                                                                                         default=())


class _DeviceScope:
    """One :func:`device_scope`: entered once, exited once, in its own context, innermost first."""

    __slots__ = ("b", "backend", "context", "dev", "framework", "name", "state", "target", "tokens")

    def __init__(self, dev: Device, backend: str | None, b: Backend | None, target: Device | None) -> None:
        self.dev, self.backend, self.b, self.target = dev, backend, b, target
        self.name = f"device_scope({str(dev)!r}" + (f", backend={backend!r})" if backend is not None else ")")
        self.state = "new"  # -> "open" -> "closed"
        self.framework: Any = None
        self.tokens: tuple[Any, ...] = ()
        self.context: Any = None

    def __enter__(self) -> Device:
        if self.state != "new":
            raise ScopeError(f"{self.name} was entered already; make a new device_scope for each with-block")
        b = self.b
        target = self.target
        scope = None if b is None or target is None else b.scope
        if b is not None and scope is not None and target is not None:
            cm = scope.device_scope(target)
            with translate_errors(lambda: f"{b.name} {self.name}"):
                cm.__enter__()
            self.framework = cm
        opened = _open_scopes.get()
        self.tokens = (scope_device.set(self.dev),
                       scope_backend.set(self.backend) if self.backend is not None else None,
                       _open_scopes.set((*opened, self)))
        self.context = threading.get_ident()
        self.state = "open"
        return self.dev

    def _close(self) -> BaseException | None:
        """Undo this scope in this context (multidev's part, then the framework's); its error, if any."""
        t1, t2, t3 = self.tokens
        _open_scopes.reset(t3)
        if t2 is not None:
            scope_backend.reset(t2)
        scope_device.reset(t1)
        self.state = "closed"
        cm, self.framework = self.framework, None
        if cm is not None:
            try:
                with translate_errors(lambda: f"{self.b.name if self.b else ''} {self.name} (its exit)"):
                    cm.__exit__(None, None, None)
            except BaseException as e:  # noqa: BLE001 - reported by the caller
                return e
        return None

    def __exit__(self, *exc: Any) -> None:
        if self.state == "closed":
            return None  # closed already by an outer scope exited before it (that exit raised)
        if self.state == "new":
            raise ScopeError(f"{self.name} is exited without having been entered")
        opened = _open_scopes.get()
        if self not in opened:
            raise ScopeError(f"{self.name} was entered in thread {self.context} and is exited in thread "
                             f"{threading.get_ident()} (or another asyncio task): exit it where it was entered; "
                             "nothing was changed")
        inner = opened[opened.index(self) + 1:]
        errors = [e for s in reversed(inner) if (e := s._close()) is not None]
        err = self._close()
        if inner:
            raise ScopeError(f"{self.name} was exited before the scopes entered inside it "
                             f"({', '.join(s.name for s in inner)}); they were closed first, so this thread is as "
                             "it was before this scope was entered (their own exits now do nothing)")
        if err is not None:
            raise err
        if errors:
            raise errors[0]
        return None


def native_device(device: DeviceLike, backend: str | None = None) -> Any:
    """The framework's own device object for ``device``, for native calls: ``torch.device("cuda",
    1)`` for torch, a ``jax.Device`` for JAX, a device name ``tf.device`` takes for TensorFlow, an
    ``mx.Context`` for MXNet, a ``cupy.cuda.Device`` for CuPy (the default backend when None).
    DeviceNotFoundError where the backend has no such device."""
    b = _backend(backend)
    return b.to_native_device(resolve(b, device))


# -- creation ------------------------------------------------------------------------------------
def _dtype(b: Backend, dtype: Any, default: str, device: Device) -> str:
    name = canonical_dtype(dtype) if dtype is not None else default
    if name not in b.capabilities.dtypes_on(device):
        if name not in b.capabilities.dtypes:
            b.to_native_dtype(name)  # the adapter's own CapabilityError says why and how to enable it
        raise CapabilityError(
            f"{b.name} cannot hold dtype {name!r} on {device}; supported there: "
            f"{', '.join(sorted(b.capabilities.dtypes_on(device)))}")
    return name



#: (adapter, id of its capabilities, dtype spelling, default, device) -> (those capabilities, the
#: canonical dtype name creation checked): the dtype check runs once per spelling, device and
#: capability set (JAX's change with x64), then costs one lookup. Bounded; spellings that cannot be
#: hashed are checked every call.
_DTYPES_CHECKED: dict[tuple[Any, ...], tuple[Any, str]] = {}
_DTYPES_CHECKED_MAX = 4096


def _checked_dtype(b: Backend, dtype: Any, default: str, device: Device) -> str:
    """:func:`_dtype`, remembered (see :data:`_DTYPES_CHECKED`)."""
    caps = b.capabilities
    key = (b, id(caps), dtype, default, device)
    try:
        hit = _DTYPES_CHECKED.get(key)
    except TypeError:  # an unhashable spelling: checked every time
        return _dtype(b, dtype, default, device)
    if hit is not None and (hit[0] is caps or hit[0] == caps):  # by value: a property may make a new one
        return hit[1]
    name = _dtype(b, dtype, default, device)
    if len(_DTYPES_CHECKED) < _DTYPES_CHECKED_MAX:
        _DTYPES_CHECKED[key] = (caps, name)
    return name


def _shape(shape: Any) -> tuple[int, ...]:
    """:func:`~multidev.validate.check_shape`, with the common cases (an int, a short tuple of plain
    non-negative ints) checked inline."""
    if shape.__class__ is int:
        if shape >= 0:
            return (shape,)
    elif shape.__class__ is tuple and len(shape) <= 4:
        n = 1
        for s in shape:
            if s.__class__ is not int or s < 0:
                break
            n *= s
        else:
            if n <= MAX_ELEMENTS:
                return shape
    return check_shape(shape)


def _fits_host(shp: tuple[int, ...], dtype: str, b: Backend, what: str) -> None:
    """:func:`~multidev.validate.check_memory` for a host tensor, asked only when the request could
    be too large."""
    n = 1
    for s in shp:
        n *= s
    have = host_memory()
    if have is not None and n * ITEMSIZE.get(dtype, 8) > have:
        check_memory(shp, dtype, True, f"{b.name} {what}")


def _native(b: Backend, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` (a method of adapter ``b``); a framework error comes as its MultidevError
    naming ``b`` and ``what``, the framework's message kept."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - translated by reraise
        translate_errors(lambda: f"{b.name} {what}").reraise(e)

def _int_default(b: Backend, device: Device) -> str:
    return "int64" if "int64" in b.capabilities.dtypes_on(device) else "int32"


def full(shape: int | Sequence[int], value: Any, dtype: Any = None, device: DeviceLike | None = None,
         backend: str | None = None) -> Any:
    """A new tensor of ``value`` on ``device`` (default float32, or bool/int64 for such a value,
    complex64 for a complex one). A value the dtype cannot hold exactly (1000 into int8, NaN into
    int32, 1+2j into float32) raises InvalidArgumentError."""
    return _filled("full", value, shape, dtype, device, backend)


def _filled(what: str, value: Any, shape: int | Sequence[int], dtype: Any, device: DeviceLike | None,
            backend: str | None, default: str | None = None) -> Any:
    """``full``'s one path (zeros and ones too): validated in the core, then ``b.full``. Without a
    ``default``, the dtype follows the value's Python type."""
    b = _backend(backend)
    shp = _shape(shape)
    dev = resolve(b, device)
    if isinstance(value, np.generic):
        value = value.item()
    if default is None:
        if isinstance(value, bool):
            default = "bool"
        elif isinstance(value, int):
            default = _int_default(b, dev)
        elif isinstance(value, complex):
            default = "complex64"
        else:
            default = "float32"
    name = _checked_dtype(b, dtype, default, dev)
    fill = check_fill(value, name)
    if dev.kind == "cpu":
        _fits_host(shp, name, b, what)
    return _native(b, what, b.full, shp, fill, name, dev)


def _constant(what: str, value: int, shape: int | Sequence[int], dtype: Any, device: DeviceLike | None,
              backend: str | None) -> Any:
    """zeros and ones (``value`` 0 or 1, float32 by default): :func:`_filled`'s checks, made once per
    (backend, device, dtype) spelling and kept as a plan (:data:`_PLANS`) with the adapter's
    ``filler`` for them; a call then checks its shape, that the backend's capabilities are those
    the plan was made with and that it still has the device (else it plans again), and the host
    memory."""
    if device is None:
        device = scope_device.get()
    if backend is None:
        backend = scope_backend.get()
    # (the default backend by name: set_default_backend or $MULTIDEV_BACKEND may change it)
    key: tuple[Any, ...] | None = (what, backend if backend is not None else get_default_backend(), device, dtype)
    try:
        plan = _PLANS.get(key)  # type: ignore[arg-type]
    except TypeError:  # an unhashable spelling: no plan
        plan = key = None
    if (plan is None or (plan[1] is not plan[0].capabilities and plan[1] != plan[0].capabilities)
            or plan[5] not in plan[0].devices()):
        # (capabilities by value: an adapter's property may return a new, equal object on every read;
        # the device: NumPy's virtual devices can be fewer now)
        plan = _plan_constant(what, value, key, dtype, device, backend)
    b, _caps, make, limit, name, dev = plan
    shp: tuple[int, ...]
    if shape.__class__ is int and 0 <= shape <= limit:  # the common cases, inline
        shp = (shape,)
    elif shape.__class__ is tuple and len(shape) == 1 and shape[0].__class__ is int and 0 <= shape[0] <= limit:
        shp = shape
    else:  # a short tuple of plain non-negative ints inline, else check_shape; then the limits
        shp = shape  # type: ignore[assignment]
        if shape.__class__ is not tuple or len(shape) > 4 or any(s.__class__ is not int or s < 0 for s in shape):
            shp = check_shape(shape)  # (InvalidArgumentError beyond MAX_ELEMENTS)
        n = 1
        for s in shp:
            n *= s
        if n > limit:
            if dev.kind == "cpu":
                check_memory(shp, name, True, f"{b.name} {what}")
            else:
                check_shape(shp)
    try:
        return make(shp)
    except Exception as e:  # noqa: BLE001 - translated by reraise
        translate_errors(lambda: f"{b.name} {what}").reraise(e)


def _plan_constant(what: str, value: int, key: tuple[Any, ...] | None, dtype: Any, device: DeviceLike,
                   backend: str | None) -> tuple[Any, ...]:
    """The plan of :func:`_constant`: the adapter, its capabilities, the filler, the most elements
    of a tensor the host memory holds (on an accelerator: MAX_ELEMENTS, which check_shape refuses
    beyond), the dtype's name and the device."""
    generation = registry_generation()
    b = _backend(backend)
    dev = resolve(b, device)
    name = _checked_dtype(b, dtype, "float32", dev)
    have = host_memory() if dev.kind == "cpu" else None  # a host tensor: at most this many elements
    fill = check_fill(value, name)
    with translate_errors(f"{b.name} {what}"):
        make = b.filler(fill, name, dev) if hasattr(b, "filler") else _full_of(b, fill, name, dev)
    plan = (b, b.capabilities, make, max(1, have // ITEMSIZE.get(name, 8)) if have is not None else MAX_ELEMENTS,
            name, dev)
    if key is not None:
        tied_put(_PLANS, key, plan, generation, _PLANS_MAX)
    return plan


def _full_of(b: Backend, value: Any, dtype: str, device: Device) -> Callable[[tuple[int, ...]], Any]:
    """``shape -> b.full(shape, value, dtype, device)``: the filler of an adapter without one."""
    return lambda shape: b.full(shape, value, dtype, device)


#: (call, backend name or adapter, device spelling, dtype spelling) -> (adapter, capabilities,
#: filler, most elements of a host tensor the memory holds, dtype name, device): what zeros and ones
#: checked once.
#: Cleared when the registry changes (tie_cache); bounded.
_PLANS: dict[tuple[Any, ...], tuple[Any, ...]] = tie_cache({})
_PLANS_MAX = 1024


#: (0 or 1, dtype name) -> the checked fill value of zeros/ones (plain ints only: 0 == 0.0 == False).
_FILLS: dict[tuple[int, str], Any] = {}


def zeros(shape: int | Sequence[int], dtype: Any = None, device: DeviceLike | None = None,
          backend: str | None = None) -> Any:
    """A new tensor of zeros (float32 by default) on ``device`` (the innermost ``device_scope``,
    else cpu:0) of ``backend`` (the scope's, else the default backend). Asynchronous where the
    framework is. Refused with a typed error, before anything is allocated: a negative or non-int
    shape (InvalidArgumentError), a dtype the device cannot hold (CapabilityError), a device the
    backend lacks (DeviceNotFoundError), a host tensor larger than the machine's memory
    (OutOfMemoryError)."""
    return _constant("zeros", 0, shape, dtype, device, backend)


def ones(shape: int | Sequence[int], dtype: Any = None, device: DeviceLike | None = None,
         backend: str | None = None) -> Any:
    """A new tensor of ones (float32 by default) on ``device``. Defaults and refusals as
    :func:`zeros`."""
    return _constant("ones", 1, shape, dtype, device, backend)


def empty(shape: int | Sequence[int], dtype: Any = None, device: DeviceLike | None = None,
          backend: str | None = None) -> Any:
    """A new tensor (float32 by default) on ``device`` whose values are whatever the memory held.
    Defaults and refusals as :func:`zeros`."""
    b = _backend(backend)
    shp = _shape(shape)
    dev = resolve(b, device)
    name = _checked_dtype(b, dtype, "float32", dev)
    if dev.kind == "cpu":
        _fits_host(shp, name, b, "empty")
    return _native(b, "empty", b.empty, shp, name, dev)


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None,
           device: DeviceLike | None = None, backend: str | None = None) -> Any:
    """``start, start+step, ...`` below ``stop`` on ``device`` (int64 for integer bounds, else
    float32); empty when the range is, on every backend, and of NumPy's length on every backend.
    Values beyond the dtype (integers that would wrap, floats that would overflow) raise
    InvalidArgumentError."""
    if stop is None:
        start, stop = 0, start
    b = _backend(backend)
    dev = resolve(b, device)
    ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (start, stop, step))
    name = _dtype(b, dtype, _int_default(b, dev) if ints else "float32", dev)
    if name == "bool":
        raise InvalidArgumentError("arange cannot make bool tensors; make an int range and compare it")
    start, stop, step = check_range(start, stop, step, name)
    n = range_length(start, stop, step)
    if not is_floating(name):
        start, stop, step = int(start), int(stop), int(step)  # integral (checked): exact Python ints
    with translate_errors(lambda: f"{b.name} arange"):
        if n == 0:  # an empty range, the same on every backend (TF would raise)
            return b.empty((0,), name, dev)
        if n == 1:  # [start]: no framework sees a step it may not hold (2**63 into int64)
            return b.full((1,), start, name, dev)
        y = b.arange(start, stop, step, name, dev)
        if b.shape_of(y) != (n,):
            # The framework counted the elements in a narrower type (TF in float32): NumPy's count
            # and values (computed in float64, or exactly for integers), uploaded.
            exact = all(isinstance(v, numbers.Integral) for v in (start, stop, step))
            wide = np.uint64 if name == "uint64" else np.int64
            host = (np.arange(start, stop, step, dtype=wide) if exact
                    else float(start) + float(step) * np.arange(n, dtype=np.float64))
            y = b.asarray(host, name, dev)
        return y


def _host_value(obj: Any) -> np.ndarray | None:
    """Refuse what no tensor can hold before a framework guesses (strings, objects, ragged lists,
    dicts, sets, iterators). Tensors of any backend pass; anything else must read as a NumPy array
    of numbers."""
    if isinstance(obj, (str, bytes)) or obj is None:
        raise InvalidArgumentError(f"asarray takes numbers, nested sequences of numbers or arrays, got "
                                   f"{obj!r:.60} ({type(obj).__name__})")
    if isinstance(obj, (np.ndarray, np.generic)):
        canonical_dtype(obj.dtype)  # strings, objects, datetimes: InvalidDtypeError
        return None
    if not isinstance(obj, (list, tuple, range, int, float, complex)):
        try:
            backend_of(obj)
            return None  # another backend's tensor: its adapter reads it
        except UnsupportedTensorError:
            pass
    try:
        a = np.asarray(obj)
    except (ValueError, TypeError, OverflowError) as e:  # ragged, or numbers beyond every dtype
        raise InvalidArgumentError(f"asarray: this {type(obj).__name__} is ragged, mixed or out of range ({e}); "
                                   "every nested sequence must have the same length") from None
    if a.dtype.kind not in "biufc":
        raise InvalidArgumentError(f"asarray: this {type(obj).__name__} reads as {a.dtype} values (strings, objects, "
                                   "ragged lists, dicts, sets or iterators), which no tensor can hold")
    return a


def asarray(obj: Any, dtype: Any = None, device: DeviceLike | None = None,
            backend: str | None = None) -> Any:
    """A new tensor holding ``obj`` (nested lists, scalars, NumPy arrays) on ``device``. Always
    copies: the result never shares the caller's buffer. Python numbers must fit an explicit
    ``dtype`` exactly (``asarray([1.5], dtype="int32")`` raises InvalidArgumentError); NumPy arrays
    and tensors are cast as ``astype`` casts.

    ``dtype=None``: a NumPy array or another framework's tensor keeps its dtype; Python data takes
    :data:`DEFAULT_DTYPES`, the same on every backend (bools bool, ints int64, floats float32,
    complex numbers complex64; int64 is int32 on a device that holds no int64, JAX without x64).
    """
    b = _backend(backend)
    dev = resolve(b, device)
    data = _host_value(obj)
    name = _dtype(b, dtype, "float32", dev) if dtype is not None else None
    if name is None:
        if isinstance(obj, np.ndarray):
            name = _dtype(b, obj.dtype, "float32", dev)
        elif data is not None:  # Python data: the documented defaults, not each framework's inference
            kind = _DEFAULT_KINDS[data.dtype.kind]
            name = _int_default(b, dev) if kind == "int" else _dtype(b, DEFAULT_DTYPES[kind], "float32", dev)
        else:  # another framework's tensor (or a NumPy scalar): its own dtype
            name = _dtype(b, backend_of(obj).dtype_of(obj), "float32", dev)
    if data is not None:
        check_values(data, name)  # Python numbers must fit the dtype (NumPy arrays are cast)
    return _native(b, "asarray", b.asarray, obj, name, dev)


#: The dtype of a tensor made from Python data without a ``dtype`` (``asarray``, ``full``), the
#: same on every backend; ``"int"`` becomes int32 on a device that holds no int64 (JAX without x64).
DEFAULT_DTYPES = {"bool": "bool", "int": "int64", "float": "float32", "complex": "complex64"}
_DEFAULT_KINDS = {"b": "bool", "i": "int", "u": "int", "f": "float", "c": "complex"}


def rand(shape: int | Sequence[int], dtype: Any = None, device: DeviceLike | None = None,
         backend: str | None = None, seed: int | None = None) -> Any:
    """Uniform samples in [0, 1) on ``device`` (float32 by default; floating and complex dtypes
    only: integers would hold only zeros); a seed makes them repeatable."""
    b = _backend(backend)
    shp = check_shape(shape)
    dev = resolve(b, device)
    name = _dtype(b, dtype, "float32", dev)
    if not is_floating(name):
        raise InvalidArgumentError(f"rand draws uniform floats in [0, 1), which a {name} tensor cannot hold "
                                   "(it would be all zeros or all True); use a floating dtype and cast")
    s = check_seed(seed)
    check_memory(shp, "float64", dev.kind == "cpu", f"{b.name} rand")  # some draw in float64, then cast
    return _native(b, "rand", b.rand, shp, name, dev, s)


# -- placement -----------------------------------------------------------------------------------
def device_of(x: Any) -> Device:
    """The device tensor ``x`` lives on; for a structure (lists, tuples, named tuples, dicts, a
    framework's trees and models), the one device of all its tensors, else DeviceMismatchError
    saying where they are. Never copies or waits."""
    b = cached_owner(type(x))  # a tensor of a class seen before: one lookup (owner_or_structure's first)
    if b is not None:
        return b.device_of(x)
    try:
        b = owner_or_structure(x)
    except UnsupportedTensorError:
        if x.__class__ is ShardedTensor:
            return sharded_device(x)
        raise
    if b is None:
        return _structure_device(x)
    return b.device_of(x)


def _structure_device(x: Any) -> Device:
    """device_of for a structure: its tensors' one device."""
    where: dict[Device, list[str]] = {}
    for path, t in leaves(x, "device_of"):
        try:
            dev = sharded_device(t) if t.__class__ is ShardedTensor else backend_of(t).device_of(t)
        except DeviceMismatchError as e:  # a sharded tensor on several devices: say where it is
            raise DeviceMismatchError(f"device_of: {''.join(f'[{p!r}]' for p in path) or '(itself)'}: {e}") from None
        where.setdefault(dev, []).append("".join(f"[{p!r}]" for p in path) or "(itself)")
    if not where:
        raise InvalidArgumentError(f"device_of: this {type(x).__name__} holds no tensor, so it has no device")
    if len(where) > 1:
        parts = "; ".join(f"{d}: {', '.join(ps[:4])}{' ...' if len(ps) > 4 else ''}" for d, ps in sorted(where.items()))
        raise DeviceMismatchError(f"device_of: the tensors of this {type(x).__name__} live on {len(where)} devices "
                                  f"({parts}); move them with multidev.to(x, device) first")
    return next(iter(where))


def dtype_of(x: Any) -> str:
    """The canonical dtype name of tensor ``x`` ("float32", "bfloat16", "int64", "bool", ...: the
    same name on every framework). No copy, no wait. UnsupportedTensorError where ``x`` is no
    tensor of a loaded backend. A :class:`ShardedTensor`: its pieces' dtype."""
    b = cached_owner(type(x))
    if b is None and x.__class__ is ShardedTensor:
        return x.dtype
    return (b if b is not None else backend_of(x)).dtype_of(x)


@overload
def to(x: Any, device: Layout, *, non_blocking: Literal[False] = False) -> Any: ...
@overload
def to(x: ShardedTensor, device: DeviceLike, *, non_blocking: Literal[False] = False) -> Any: ...
@overload
def to(x: _T, device: DeviceLike, *, non_blocking: Literal[False] = False) -> _T: ...
@overload
def to(x: _T, device: DeviceLike, *, non_blocking: Literal[True]) -> Transfer[_T]: ...
@overload
def to(x: _T, device: DeviceLike, *, non_blocking: bool) -> _T | Transfer[_T]: ...
def to(x: Any, device: DeviceLike, *, non_blocking: bool = False) -> Any:
    """``x`` on ``device``: ``x`` itself when it is already there (no-op, D2L's ``as_in_ctx``; an
    uncommitted JAX array is committed there without a copy, a new ``jax.Array`` over the same buffer,
    as ``jax.device_put`` does), else a copy on the target device. Asynchronous where the framework is,
    but always safe to read.

    A structure (lists, tuples, named tuples, dicts, a framework's trees and models) comes back with
    every tensor moved so, the structure kept. Leaves that are no tensor follow one rule
    (docs/transfers.md#structures): ``None`` is kept everywhere; inside a framework's tree the
    framework decides (a JAX tree's Python and NumPy scalars, such as a flax ``TrainState``'s
    ``step``, become arrays on ``device`` as ``jax.device_put`` makes them; its functions and strings
    are kept); anywhere else such a leaf raises UnsupportedTensorError naming its path, before
    anything moved.

    ``non_blocking=True`` returns a :class:`~multidev.transfer.Transfer` at once; its ``wait()``
    gives the tensor once the copy has landed. Host targets use pinned buffers where they exist,
    and the copy starts as soon as the work producing ``x`` is done, so it overlaps with work
    queued afterwards.

    ``device`` may be a :class:`~multidev.Layout`: ``x`` laid out on its mesh (JAX: a ``jax.Array``
    with a ``NamedSharding``; elsewhere a :class:`~multidev.ShardedTensor`; see
    :func:`multidev.sharding.place`). A sharded ``x`` sent to a device comes back whole there.
    """
    if non_blocking:
        if device.__class__ is Layout or x.__class__ is ShardedTensor:
            raise InvalidArgumentError("to: non_blocking=True is for moves to one device; placement by a layout "
                                       "is asynchronous where the framework is (JAX) and returns the tensor")
        return start_to(x, device)
    cls = x.__class__
    if cls is tuple or cls is list or cls is dict:  # (data, target) already there: no walk
        if device.__class__ is Layout:
            raise InvalidArgumentError("to(x, layout) takes one tensor: place each tensor of a structure by its "
                                       "own layout")
        dev = device if device.__class__ is Device else as_device(device)
        if resident_container(x, dev):  # (trees.resident_container)
            return x if cls is tuple else cls(x)  # (a list or dict: a new one, as tree_map gives)
        if cached_owner(cls) is None:  # (Python's own containers are no tensors: owner_or_structure's answer)
            moved = _plain_to(x, dev)
            return _structure_to(x, dev) if moved is _NOT_PLAIN else moved
    b = cached_owner(type(x))  # a tensor of a class seen before: one lookup (owner_or_structure's first)
    if b is None:
        try:  # (the layouts and sharded tensors of multidev.sharding are dispatched where they raise: no cost here)
            b = owner_or_structure(x)
        except UnsupportedTensorError:
            if cls is not ShardedTensor:
                raise
            return place(x, device) if device.__class__ is Layout else unshard(x, device)
        if b is None:
            if device.__class__ is Layout:
                raise InvalidArgumentError("to(x, layout) takes one tensor: place each tensor of a structure by "
                                           "its own layout")
            return _structure_to(x, device)
    try:
        dev = device if device.__class__ is Device else (
            (device.__class__ is str and cached_spelling(device)) or as_device(device))
    except InvalidDeviceError:
        if device.__class__ is not Layout:
            raise
        return place(x, device)
    try:
        here = b.device_of(x)
    except DeviceMismatchError:  # a framework's sharded tensor (JAX NamedSharding): gathered onto dev
        if not is_sharded(x):
            raise
        return unshard(x, dev)
    if here is dev:  # the no-op path (Devices are interned): no enumeration, no validation
        commit = getattr(b, "commit_resident", None)
        return x if commit is None else commit(x)
    target = resolve(b, dev)
    try:
        return b.move(x, target)
    except Exception as e:  # noqa: BLE001 - translated by reraise
        translate_errors(lambda: f"{b.name} to({target})").reraise(e)


def _structure_to(x: Any, device: DeviceLike) -> Any:
    """to() of a structure: every tensor moved (a resident one kept as the same object), models
    moved in place by their framework (the same model returned; a model alone without the walk)."""
    dev = as_device(device)
    owner = model_owner(x)
    if owner is not None:
        target = resolve(owner, dev)
        with translate_errors(lambda: f"{owner.name} to({dev}) of a model"):
            return require(owner, SupportsModels, "to").move_module(x, target)

    def move_module(b: Backend, m: Any) -> Any:
        with translate_errors(lambda: f"{b.name} to({dev}) of a model"):
            return require(b, SupportsModels, "to").move_module(m, resolve(b, dev))
    return tree_map(lambda t: to(t, dev), x, "to", module=move_module, check=lambda b: resolve(b, dev),
                    scalar=lambda b, v: require(b, SupportsModels, "to").put_scalar(v, resolve(b, dev)),
                    batch=lambda ts: _moved_all(ts, dev))


_NOT_PLAIN: Any = object()


def _plain_to(x: Any, dev: Device) -> Any:
    """to() of Python's own lists, tuples and dicts, nested, whose tensors (two or more) are all distinct, of one
    class seen before, of an adapter with ``move_all``, and none on ``dev`` yet (a model's
    parameters moved, mostly): what :func:`_structure_to` gives for it, in one pass and one
    ``move_all`` (``resolve`` first, as its walk's check); :data:`_NOT_PLAIN` for anything else,
    which :func:`_structure_to` takes."""
    walked = plain_walk(x)
    if walked is None:
        return _NOT_PLAIN
    shape, xs = walked
    if len(xs) < 2:  # (one tensor: to() itself, as the walk's batch gives it)
        return _NOT_PLAIN
    one = xs[0].__class__
    b: Any = cached_owner(one)
    if b is None or one is ShardedTensor or getattr(b, "move_all", None) is None:
        return _NOT_PLAIN
    for t in xs:  # (every leaf recognised first: a stranger is named by the walk before the device is resolved)
        if t.__class__ is not one:
            return _NOT_PLAIN
    resolve(b, dev)  # (the walk's check: before any tensor's device is read)
    device_of = b.device_of
    try:
        for t in xs:  # (Devices are interned; a resident tensor is kept as it is: the walk's)
            if device_of(t) is dev:
                return _NOT_PLAIN
    except MultidevError:  # no single device (a framework's sharded array): the walk gathers it
        return _NOT_PLAIN
    if len(set(map(id, xs))) != len(xs):  # (a tied tensor: one object, as the walk gives it)
        return _NOT_PLAIN
    ys = _all_moved(b, xs, dev)
    if len(ys) != len(xs):
        raise RuntimeError(f"to: {b.name}'s move_all gave {len(ys)} results for {len(xs)} tensors")
    return plain_rebuild(shape, ys)


def _moved_all(xs: list[Any], dev: Device) -> list[Any]:
    """``[to(x, dev) for x in xs]`` (a structure's distinct tensors, whose adapters the walk's
    ``check`` found ``dev`` on), the tensors of an adapter with ``move_all`` (see
    :class:`~multidev.adapter.BaseBackend`) that are not on ``dev`` moved in one call per adapter."""
    b: Any = None
    one = xs[0].__class__ if len(xs) > 1 else None
    if one is not None and all(x.__class__ is one for x in xs):  # (a structure's tensors: mostly one class, none
        b = cached_owner(one)  # on dev yet)
        if b is not None and getattr(b, "move_all", None) is not None:
            try:
                device_of = b.device_of
                moving = all(device_of(x) is not dev for x in xs)  # (Devices are interned)
            except MultidevError:  # no single device (a framework's sharded array): the loop below
                pass
            else:
                if moving:
                    return _all_moved(b, xs, dev)
    out: list[Any] = [None] * len(xs)
    groups: dict[int, tuple[Any, list[int], list[Any]]] = {}  # adapter, where, its tensors
    cls: Any = None
    for i, x in enumerate(xs):
        if type(x) is not cls:  # (a structure's tensors are mostly of one class)
            cls = type(x)
            b = cached_owner(cls)
            if b is not None and getattr(b, "move_all", None) is None:
                b = None
        if b is not None:
            try:
                here: Device | None = b.device_of(x)
            except MultidevError:  # no single device (a framework's sharded array): to() gathers it
                here = None
            if here is not None and here is not dev:
                group = groups.get(id(b))
                if group is None:  # (the adapters' calls in the order of their first tensor to move)
                    group = groups[id(b)] = (b, [], [])
                group[1].append(i)
                group[2].append(x)
                continue
        out[i] = to(x, dev)
    for b, at, ts in groups.values():
        if len(ts) == 1:
            out[at[0]] = to(ts[0], dev)
            continue
        for i, y in zip(at, _all_moved(b, ts, dev), strict=True):
            out[i] = y
    return out


def _all_moved(b: Any, ts: list[Any], dev: Device) -> list[Any]:
    """``b.move_all(ts, dev)``: tensors of adapter ``b`` (which has ``dev``: the walk's ``check``
    resolved it), none on ``dev``, moved in one call."""
    try:
        return b.move_all(ts, dev)
    except Exception as e:  # noqa: BLE001 - translated by reraise
        translate_errors(lambda: f"{b.name} to({dev})").reraise(e)


def copy(x: _T, device: DeviceLike | None = None) -> _T:
    """A new, independent buffer holding ``x`` on ``device`` (x's own device when None): D2L's
    ``copyto``. Always copies, even on the same device. A structure is copied tensor by tensor
    (a model into a new, independent model); its leaves that are no tensor follow :func:`to`'s rule
    (a JAX tree's scalars become arrays on ``device``, or uncommitted on JAX's default device where
    ``device`` is None, as ``jax.device_put(tree)`` makes them). A sharded tensor (a
    :class:`ShardedTensor`, JAX's, a DTensor): every piece copied on its own device, the layout kept
    (``device`` None), or the whole tensor in a new buffer on ``device`` (across processes a
    collective, as ``to_host``: every rank gets the whole)."""
    if x.__class__ is ShardedTensor:
        return _sharded_copy(x, device)  # type: ignore[arg-type]
    b = owner_or_structure(x)
    if b is None:
        return _structure_copy(x, device)
    try:
        here = b.device_of(x)
        dev = here if device is None else resolve(b, device)
    except DeviceMismatchError:  # a framework's own sharded tensor (JAX's, a DTensor)
        if not is_sharded(x):
            raise
        if device is None:  # every piece, the layout kept
            return map_shards(x, copy)
        if across_processes(x):  # gathered on every rank, a new tensor
            return unshard(x, device)
        dev = resolve(b, device)
    return _native(b, "copy", b.copy, x, dev)


def _sharded_copy(x: ShardedTensor, device: DeviceLike | None) -> Any:
    """copy of a ShardedTensor (see :func:`copy`)."""
    if device is None:
        return map_shards(x, copy)
    whole = unshard(x, device)
    # (a replicated layout's piece on device may be the whole tensor itself: a new buffer all the same)
    return copy(whole) if any(whole is p for p in x.shards) else whole


def _structure_copy(x: Any, device: DeviceLike | None) -> Any:
    def copy_module(b: Backend, m: Any) -> Any:
        dev = device_of(m) if device is None else resolve(b, device)
        with translate_errors(lambda: f"{b.name} copy of a model"):
            return require(b, SupportsModels, "copy").copy_module(m, dev)
    check = None if device is None else (lambda b: resolve(b, device))
    return tree_map(lambda t: copy(t, device), x, "copy", module=copy_module, check=check,
                    scalar=lambda b, v: require(b, SupportsModels, "copy").put_scalar(
                        v, None if device is None else resolve(b, device)))


def to_numpy(x: Any) -> np.ndarray:
    """A host NumPy array with x's values, after waiting for x's pending work. It may share memory
    with a CPU-resident ``x``; use ``np.array(md.to_numpy(x))`` for an independent copy. A sharded
    tensor comes back whole, as :func:`multidev.to_host` gives it (across processes, a DTensor or a
    global ``jax.Array``: gathered on every rank, a collective)."""
    if x.__class__ is ShardedTensor:  # the whole, as to_host gives it
        return sharded_to_host(x)
    b = backend_of(x)
    try:
        return b.to_numpy(x)
    except Exception as e:  # noqa: BLE001 - translated by reraise
        if across_processes(x):  # a DTensor, a global jax.Array: gathered on every rank, as to_host does
            return sharded_to_host(x)
        translate_errors(lambda: f"{b.name} to_numpy").reraise(e)


def synchronize(target: Any = None, *, backend: str | None = None) -> None:
    """Wait for queued work and raise any asynchronous error it produced.

    - ``synchronize()``: every device of every loaded backend (or of ``backend``).
    - ``synchronize(device)``: that device, on ``backend`` or on every loaded asynchronous backend
      that has it (the sum of their waits: JAX's queues a marker computation; ``backend=`` waits
      on one framework only, the cheap path where you know which one queued the work).
    - ``synchronize(tensor)``: until that tensor is computed (every piece of a ShardedTensor).

    A framework error raised by the wait (an asynchronous failure) comes as its MultidevError.
    """
    # The hot paths first, in as few steps as can be: a tensor whose class was seen before, and a
    # device spelling (str or Device: interned, hashed as cheaply as any object) seen before.
    # (A try costs nothing until something raises; the translation is translate_errors'.)
    cls = target.__class__
    w = cached_tensor_wait(cls)
    if w is not None and backend is None:
        try:
            w(target)
        except Exception as e:  # noqa: BLE001 - translated by reraise
            _SYNC_ERRORS.reraise(e)
        return
    if (cls is Device or cls is str) and (backend is None or backend.__class__ is str):
        per = cached_device_waits(backend)
        fn = None if per is None else per.get(target)
        if fn is not None:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - translated by reraise
                _SYNC_ERRORS.reraise(e)
            return
    try:
        _synchronize(target, backend)
    except Exception as e:  # noqa: BLE001 - translated by reraise
        _SYNC_ERRORS.reraise(e)


_SYNC_ERRORS = translate_errors("synchronize")


def _device_wait(dev: Device, backend: str | None) -> Callable[[], Any]:
    """The zero-argument wait ``synchronize(dev)`` makes: ``backend``'s (it must have ``dev``), or
    every loaded asynchronous backend's that has it: each adapter's ``device_wait_fn(dev)``."""
    if backend is not None:
        b = get_backend(backend)
        owners = [(b, resolve(b, dev))]
    else:
        owners = [(b, dev) for b in loaded_backends() if b.capabilities.async_execution and dev in b.devices()]
    waits: list[Callable[[], Any]] = []
    for b, d in owners:
        fn = b.device_wait_fn(d)
        if fn is not None:  # None: nothing can be queued on d
            waits.append(fn)
    if len(waits) == 1:
        return waits[0]
    if not waits:
        return _nothing

    def wait_all() -> None:
        for w in waits:
            w()
    return wait_all


def _nothing() -> None:
    """The wait of a device no loaded backend can have queued work on (synchronous backends)."""
    return None


def _synchronize(target: Any, backend: str | None) -> None:
    if target is None or target.__class__ is Device or isinstance(target, str):
        dev = None if target is None else (target if target.__class__ is Device else Device.parse(target))
        if dev is None:
            if backend is not None:
                get_backend(backend).synchronize(None)
                return
            for b in loaded_backends():
                if b.capabilities.async_execution:  # a synchronous backend's calls have finished
                    b.synchronize(None)
            return
        here = dev
        device_wait(backend, target, lambda: _device_wait(here, backend))()
        return
    try:
        wait = waiter_of(target)
    except UnsupportedTensorError as e:
        try:
            dev = as_device(target)  # a native device object
        except MultidevError:
            if target.__class__ is ShardedTensor:  # every piece
                for t in target.shards:
                    waiter_of(t)(t)
                return
            if is_structure(target):  # every tensor of a structure (a model's parameters too)
                for _, t in leaves(target, "synchronize"):
                    for p in (t.shards if t.__class__ is ShardedTensor else (t,)):  # (every piece)
                        waiter_of(p)(p)
                return
            raise e from None  # neither a tensor nor a device: say so as a tensor error
        return _synchronize(dev, backend)
    wait(target)
