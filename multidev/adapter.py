"""The public API for adapter authors: everything an adapter (built-in or third-party) imports.

An adapter is a core class, usually a :class:`BaseBackend` subclass, implementing
:class:`~multidev.protocol.Backend` in the protocol's order (:data:`PROTOCOL_METHODS`), and one small
*concern* object per capability its framework has, a :class:`Concern` made from the adapter
(``self.core``) and declaring its protocol, set on the class as ``dlpack = concern(MyDLPack)``
(:data:`CONCERNS` names the attributes; BaseBackend sets them all to None). It imports its framework
in ``__init__``, never at module import. Register it through the ``multidev.backends`` entry-point
group (or :func:`multidev.register_backend`) and test it with
``multidev conformance --backend mypkg.module:MyBackend``. ``docs/writing-an-adapter.md`` walks
through a complete adapter.

What :class:`BaseBackend` supplies for the core protocol (override any of them):

- ``version()``: the framework module's ``__version__``;
- ``full``, ``empty``, ``arange``, ``rand``: NumPy's on the host, placed by the adapter's ``asarray``;
- ``move`` and ``copy``: through the host (``asarray(to_numpy(x), dtype_of(x), device)``): correct
  everywhere, synchronous; an accelerator's adapter overrides them with the framework's own copies;
- ``wait(x)``: ``synchronize(device_of(x))``;
- ``device_wait_fn(device)`` and ``tensor_wait_fn()``: ``synchronize`` and ``wait`` bound (the hooks
  ``multidev.synchronize`` caches; override them together with ``synchronize`` and ``wait``);
- ``shape_of(x)``: ``tuple(int(s) for s in x.shape)``;
- ``same_device(what, xs)``: the one device of ``xs``, or DeviceMismatchError naming them all;
- ``configure_devices(n)`` (class method): ask for ``n`` virtual CPU devices before the framework
  starts, through the environment variable named by ``virtual_devices_env``.

The capabilities (:data:`CAPABILITY_PROTOCOLS`: :class:`SupportsNonBlocking`, :class:`SupportsDLPack`,
:class:`SupportsNativeCollectives`, :class:`SupportsTraining`, :class:`SupportsCompile`,
:class:`SupportsModels`, :class:`SupportsDeviceScope`, :class:`SupportsMesh`,
:class:`SupportsSharding`, :class:`SupportsDataParallel` and :class:`SupportsShardedTraining`, whose
:class:`Replica` base class supplies the data-parallel defaults) have shared concern classes to use
or subclass where they fit: :class:`ArrayApiDLPack` (the array-API ``__dlpack__`` route),
:class:`NonBlockingMoves` (``start_to_numpy`` over ``start_move``) and :class:`TrainingDefaults`
(parameters without autograd state, SGD with the tensors' own operators). :func:`check_adapter`
checks the concerns when the adapter loads. An adapter written against API 0.3 (a capability's
methods on the adapter class, its protocol inherited) is wrapped into concern objects at load, with
one DeprecationWarning.

Stability: this module's ``__all__`` is the adapter API (:data:`API_VERSION`). A name removed or
renamed keeps working for one minor release with a DeprecationWarning naming its replacement
(``docs/writing-an-adapter.md`` states the policy; ``tests/test_adapter_api.py`` holds the list).

Host memory: XLA (JAX, TensorFlow) shares a host buffer through DLPack only when its address is a
multiple of :data:`HOST_ALIGNMENT` (64 bytes), and the exchange layer refuses to hand such a
partner an unaligned buffer zero-copy (an explicit copy, or CapabilityError under ``copy=False``).
An adapter whose host tensors should reach them zero-copy allocates aligned buffers
(:func:`aligned_empty`, :func:`host_aligned`); host loops over large arrays may run on several
cores through :func:`run_parts` (the one pool, :mod:`multidev.hostthreads`).
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

import numpy as np

from . import hostpool
from ._device import KINDS, Device, same_device
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
from .hostthreads import run_parts
from .hostthreads import threads as host_threads
from .mesh import Layout, Mesh, ProcessMesh
from .protocol import (
    CAPABILITY_PROTOCOLS,
    CONCERNS,
    OPTIONAL_METHODS,
    PROTOCOL_METHODS,
    REDUCE_OPS,
    Backend,
    Capabilities,
    SupportsCompile,
    SupportsDataParallel,
    SupportsDeviceScope,
    SupportsDLPack,
    SupportsMesh,
    SupportsModels,
    SupportsNativeCollectives,
    SupportsNonBlocking,
    SupportsShardedTraining,
    SupportsSharding,
    SupportsTraining,
    protocol_methods,
)
from .replicas import Ready, Replica, param_spec
from .staging import StagingPlan, parallel_put, split_pieces, staged_upload

__all__ = [
    "API_VERSION",
    "CAPABILITY_PROTOCOLS",
    "COMPLEX_DTYPES",
    "CONCERNS",
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
    "ArrayApiDLPack",
    "Backend",
    "BackendError",
    "BackendNotAvailableError",
    "BaseBackend",
    "Capabilities",
    "CapabilityError",
    "CollectiveInputError",
    "Concern",
    "DLPackCapsule",
    "DLPackInfo",
    "Device",
    "DeviceMismatchError",
    "DeviceNotFoundError",
    "InvalidArgumentError",
    "InvalidDeviceError",
    "InvalidDtypeError",
    "Layout",
    "Mesh",
    "MultidevError",
    "NonBlockingMoves",
    "ProcessMesh",
    "Ready",
    "Replica",
    "StagingPlan",
    "SupportsCompile",
    "SupportsDLPack",
    "SupportsDataParallel",
    "SupportsDeviceScope",
    "SupportsMesh",
    "SupportsModels",
    "SupportsNativeCollectives",
    "SupportsNonBlocking",
    "SupportsShardedTraining",
    "SupportsSharding",
    "SupportsTraining",
    "TrainingDefaults",
    "UnsupportedTensorError",
    "aligned_empty",
    "canonical_dtype",
    "check_adapter",
    "concern",
    "dlpack_info",
    "host_aligned",
    "host_threads",
    "is_complex",
    "is_floating",
    "is_integer",
    "numpy_dtype",
    "parallel_put",
    "param_spec",
    "protocol_methods",
    "run_parts",
    "same_device",
    "split_pieces",
    "staged_upload",
    "start_move",
    "start_to_numpy",
]

#: The adapter API's version (major, minor): what ``__all__`` exports, with the contracts of the
#: protocols, is stable within a minor release and deprecated one minor release before removal.
API_VERSION = (0, 4)


_HOST = Device("cpu", 0)
_VIRTUAL_WARNED: set[tuple[Any, ...]] = set()  # (backend, variable, asked, got) already warned about


#: Bytes a host buffer's address must be a multiple of for XLA (JAX, TensorFlow) to share it.
HOST_ALIGNMENT = hostpool.HOST_ALIGNMENT


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """A new, uninitialised C-contiguous NumPy array whose buffer is :data:`HOST_ALIGNMENT`-aligned;
    from 256 KiB to 128 MiB a buffer multidev made before and nothing refers to any more, where one
    is free (:mod:`multidev.hostpool`: no page faults to fill it again)."""
    dt = np.dtype(dtype)
    shape = tuple(map(int, shape))
    if min(shape, default=0) < 0:
        raise InvalidArgumentError(f"aligned_empty: shape {shape!r:.80} has a negative size; sizes are >= 0")
    nbytes = math.prod(shape) * dt.itemsize  # (exact: numpy's int64 product would wrap)
    if nbytes >= hostpool.MIN_BYTES:
        pooled = hostpool.empty(shape, dt, nbytes)
        if pooled is not None:
            return pooled
    raw = np.empty(nbytes + HOST_ALIGNMENT, dtype=np.uint8)
    # (the address through ctypes: a fraction of the time of raw.ctypes.data)
    off = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % HOST_ALIGNMENT  # type: ignore[arg-type]
    out = raw[off:off + nbytes].view(dt)
    return out if len(shape) == 1 else out.reshape(shape)


def host_aligned(a: np.ndarray) -> np.ndarray:
    """``a`` itself when it is C-contiguous and :data:`HOST_ALIGNMENT`-aligned, else an aligned copy."""
    if a.flags.c_contiguous and a.ctypes.data % HOST_ALIGNMENT == 0:
        return a
    out = aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out


def start_to_numpy(b: Any, x: Any) -> Callable[[], np.ndarray]:
    """The protocol's default ``start_to_numpy`` for any adapter ``b``: ``start_move`` to cpu:0 (none
    for a host tensor), and a callable that waits and gives ``b.to_numpy`` of the landed tensor."""
    if b.device_of(x) == _HOST:
        return lambda: b.to_numpy(x)
    moves = getattr(b, "transfers", None)
    y, waiter = moves.start_move(x, _HOST) if moves is not None else start_move(b, x, _HOST)

    def land() -> np.ndarray:
        landed = waiter() if waiter is not None else None
        out: np.ndarray = b.to_numpy(y if landed is None else landed)
        return out
    return land


def start_move(b: Any, x: Any, device: Device) -> tuple[Any, Callable[[], Any] | None]:
    """The core's way to start a move for an adapter without a ``transfers`` concern: ``b.move``,
    then a waiter that waits for the target on an asynchronous backend (None on a synchronous one)."""
    y = b.move(x, device)
    if not b.capabilities.async_execution:
        return y, None
    return y, lambda: b.wait(y)


class _CoreOf:
    """``Concern.core``: the adapter a concern was made from, kept in the instance's own dict (a
    plain attribute read on every call of a concern); without one (a 0.3 adapter inheriting a shared
    concern), the concern itself. A non-data descriptor, so the instance attribute wins."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self if obj is None else obj


class Concern:
    """The base of an adapter's concern objects (one capability protocol each): made from the
    adapter, which it keeps as ``core`` and calls for everything outside its concern
    (``self.core.device_of(x)``). An adapter is its own core (``BaseBackend.core`` is the adapter), so a
    shared implementation written over ``self.core`` (:class:`ArrayApiDLPack`) also serves an adapter
    written the 0.3 way, which inherits it."""

    def __init__(self, core: Any = None) -> None:
        # (optional: an adapter written the 0.3 way inherits a shared concern and may reach this
        # __init__ through super() without one: it is then its own core)
        if core is not None:
            self.__dict__["core"] = core

    #: The adapter this concern serves (an adapter written the 0.3 way: itself).
    core: Any = _CoreOf()

    @classmethod
    def available_on(cls, core: Any) -> bool:
        """Whether adapter instance ``core`` has this concern: where it is False, the concern
        attribute is None on that instance (the framework can do it, this machine cannot: NCCL with
        fewer than two GPUs, a library without DLPack). Asked once, on the attribute's first read,
        before the concern is made; it reads the adapter's public state only, set up in its
        ``__init__`` before anything reads the attribute. The default: True."""
        return True


C = TypeVar("C", covariant=True)


class concern(Generic[C]):
    """A concern attribute of an adapter class: ``dlpack = concern(TorchDLPack)`` gives each adapter
    instance its own ``TorchDLPack(adapter)``, made on first access and kept, or None on an instance
    where ``TorchDLPack.available_on(adapter)`` is False (:meth:`Concern.available_on`). BaseBackend
    sets every concern attribute (:data:`CONCERNS`) to None: the framework lacks it."""

    def __init__(self, cls: Callable[[Any], C]) -> None:
        self.cls = cls
        self.attr = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> concern[C]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> C: ...
    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        available = getattr(self.cls, "available_on", None)
        made = self.cls(obj) if available is None or available(obj) else None
        # one answer per adapter, whichever thread wins (None is kept too: asked once)
        return obj.__dict__.setdefault(self.attr, made)


class BaseBackend:
    """Shared defaults for adapters (see the module docstring). Subclasses set ``name`` and
    ``framework``, implement the rest of the core protocol, and set the concern attributes of the
    capabilities they have (``dlpack = concern(MyDLPack)``); the others stay None."""

    #: The concerns (:data:`CONCERNS`): None here, each set by an adapter that has it.
    transfers: Any = None
    dlpack: Any = None
    collectives: Any = None
    training: Any = None
    compiler: Any = None
    models: Any = None
    scope: Any = None
    mesh: Any = None
    sharding: Any = None
    parallel: Any = None
    sharded_training: Any = None

    def __init__(self) -> None:
        """Nothing to set up here; an adapter's own ``__init__`` imports its framework."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """An adapter class that sets a concern (``dlpack = concern(...)``) also answers that concern's
        methods itself, forwarding to the concern (deprecated since 0.4, gone in 0.5): the adapter API
        0.3 way of reaching them (``b.import_dlpack(...)``, ``isinstance(b, SupportsDLPack)``, and a
        subclass's override calling ``super().import_dlpack(...)``) keeps working."""
        super().__init_subclass__(**kwargs)
        for attr, protocol in CONCERNS.items():
            if isinstance(cls.__dict__.get(attr), concern):
                for m in protocol_methods(protocol):
                    if m not in cls.__dict__:
                        setattr(cls, m, _forwarder(attr, m))

    @property
    def core(self) -> Any:
        """The adapter itself: what its concerns call ``self.core`` (see :class:`Concern`)."""
        return self

    name: ClassVar[str]
    framework: ClassVar[str]
    #: The environment variable giving this backend's number of virtual CPU devices, read when the
    #: adapter starts its framework (None: the backend has no virtual devices).
    virtual_devices_env: ClassVar[str | None] = None
    #: None (the default): ``to(x, device_of(x))`` is ``x`` itself. An adapter whose framework tells
    #: placement it chose apart from placement asked for (JAX's uncommitted arrays, which ``jit``
    #: compiles for separately) defines ``commit_resident(x)``: ``x`` fixed to its own device without a
    #: copy (``x`` itself where it is fixed already); ``to`` of a resident tensor returns that.
    commit_resident: Any = None
    #: None (the default): a structure's tensors move one by one through ``move``. An adapter whose
    #: framework moves many arrays in one call for less than a call each (JAX's ``device_put`` of a
    #: list) defines ``move_all(xs, device)``: the list of ``move(x, device)`` for each of ``xs``
    #: (distinct tensors, each on one device that is not ``device``), in order, with ``move``'s
    #: contract; ``to`` of a structure calls it once for that adapter's tensors.
    move_all: Any = None

    @classmethod
    def install_hint(cls) -> str | None:
        """How to install this backend's framework on this machine, as one sentence with the
        commands in backticks, or None for the registry's default (``pip install "multidev[NAME]"``
        where multidev has that extra). Called on the class, without the framework: it must not
        import it."""
        return None

    if TYPE_CHECKING:  # provided by every subclass; declared here for the type checker only
        @property
        def capabilities(self) -> Capabilities: ...
        def device_of(self, x: Any) -> Device: ...
        def dtype_of(self, x: Any) -> str: ...
        def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any: ...
        def to_numpy(self, x: Any) -> np.ndarray: ...
        def synchronize(self, device: Device | None) -> None: ...

    @classmethod
    def configure_devices(cls, count: int, strict: bool = False) -> bool:
        """Ask for ``count`` CPU devices before the framework starts (the conformance suite and the
        benchmarks call this). Keeps a value the user set already. Returns whether the request is
        in place (False where this backend has no virtual devices or its framework already started);
        with ``strict=True`` a request that can no longer be honoured raises CapabilityError instead,
        saying why and what to do."""
        env = cls.virtual_devices_env
        if env is None:
            if strict:
                raise CapabilityError(f"{cls.name} backend has no virtual CPU devices")
            return False
        os.environ.setdefault(env, str(int(count)))
        ok = cls.framework not in sys.modules or os.environ[env] == str(int(count))
        if not ok and strict:
            raise CapabilityError(f"{cls.name} backend: {count} virtual CPU devices cannot be given any more: "
                                  f"{cls.framework} is imported already and ${env} is {os.environ[env]!r}; set "
                                  f"{env}={count} before the program's first {cls.framework} import")
        return ok

    def check_virtual_devices(self, got: int) -> None:
        """Warn once (RuntimeWarning) where ``virtual_devices_env`` asks for more or fewer CPU devices
        than the framework has (``got``), because the framework started before it could be configured:
        the warning names the variable, the count obtained and the fix. Adapters call it once they
        know their devices."""
        env = self.virtual_devices_env
        raw = os.environ.get(env) if env else None
        try:
            asked = int(raw) if raw else None
        except ValueError:
            return
        key = (self.name, env, asked, got)
        if asked is None or asked == got or key in _VIRTUAL_WARNED:
            return
        _VIRTUAL_WARNED.add(key)
        warnings.warn(f"multidev: ${env}={asked} asks the {self.name} backend for {asked} CPU devices, but "
                      f"{self.framework} has {got}: it started before multidev could configure it. Set the variable "
                      f"before the program first uses {self.framework} (or call md.devices(backend={self.name!r}) "
                      f"before any other {self.framework} code)", RuntimeWarning, stacklevel=3)

    # -- identity ---------------------------------------------------------------------------
    def version(self) -> str:
        mod = sys.modules.get(self.framework)
        return str(getattr(mod, "__version__", "unknown"))

    # -- creation: through asarray of NumPy values made on the host ---------------------------
    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        """``asarray`` of ``numpy.full``: made on the host, then placed (a copy)."""
        return self.asarray(np.full(shape, value, dtype=numpy_dtype(dtype)), dtype, device)

    def filler(self, value: Any, dtype: str, device: Device) -> Callable[[tuple[int, ...]], Any]:
        """A callable ``shape -> full(shape, value, dtype, device)``, made once per (value, dtype,
        device) and kept by ``md.zeros``/``md.ones`` (``value``, ``dtype`` and ``device`` already
        checked). Default: a closure over :meth:`full`. An adapter may return its framework's own
        call with the arguments bound (``functools.partial(torch.zeros, dtype=..., device=...)``),
        which saves a Python frame on each call; it must give what ``full`` gives."""
        full = self.full
        return lambda shape: full(shape, value, dtype, device)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        """``full`` with zeros (the contents of ``empty`` are unspecified)."""
        return self.full(shape, 0, dtype, device)

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        """``asarray`` of ``numpy.arange``: made on the host, then placed."""
        return self.asarray(np.arange(start, stop, step, dtype=numpy_dtype(dtype)), dtype, device)

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        """NumPy's generator (``default_rng(seed)``) on the host, cast and placed: the same seed gives
        the same values."""
        return self.asarray(np.random.default_rng(seed).random(shape).astype(numpy_dtype(dtype)), dtype, device)

    # -- placement --------------------------------------------------------------------------
    def move(self, x: Any, device: Device) -> Any:
        """Through the host: ``asarray(to_numpy(x), dtype_of(x), device)`` (synchronous; a framework
        with a direct device-to-device copy overrides it)."""
        return self.asarray(self.to_numpy(x), self.dtype_of(x), device)

    def copy(self, x: Any, device: Device) -> Any:
        """Through the host, as ``move`` (``asarray`` always copies), on x's own device too."""
        return self.asarray(self.to_numpy(x), self.dtype_of(x), device)

    def wait(self, x: Any) -> None:
        self.synchronize(self.device_of(x))

    def device_wait_fn(self, device: Device) -> Callable[[], Any] | None:
        return functools.partial(self.synchronize, device)

    def _redefines(self, method: str, cls: type) -> bool:
        """Whether ``method`` is defined again below adapter class ``cls`` (by a subclass, or on the
        instance): ``cls``'s one-frame wait hooks then give way to the defaults over the redefined
        ``wait``/``synchronize``, so a hook never bypasses a subclass's own wait."""
        return method in self.__dict__ or getattr(type(self), method) is not getattr(cls, method)

    def tensor_wait_fn(self) -> Callable[[Any], Any]:
        return self.wait

    def writable(self, x: Any) -> bool | None:
        """Whether ``x`` can be written in place, where the framework says so cheaply (a flag), or
        None where only a write can tell: the core then probes by rewriting ``x`` with a copy of
        itself. Must never answer True for a tensor that an ``assign`` into would refuse (the
        in-place collectives write their first input before their last: a wrong True half-applies
        them). The default: None."""
        return None

    # -- arithmetic for collectives ---------------------------------------------------------
    def shape_of(self, x: Any) -> tuple[int, ...]:
        return tuple(map(int, x.shape))

    # -- helpers ----------------------------------------------------------------------------
    def same_device(self, what: str, xs: Sequence[Any], note: str = "") -> Device:
        """The one device of tensors ``xs``, for operation ``what`` (named in the error); otherwise
        DeviceMismatchError naming every device, with ``note`` appended to its message (what the
        framework itself would have done), or CollectiveInputError when ``xs`` is empty."""
        dev = same_device(self.name, what, [self.device_of(x) for x in xs], note)
        if dev is None:
            raise CollectiveInputError(f"{self.name} backend: {what} needs at least one tensor")
        return dev


class ArrayApiDLPack(Concern, SupportsDLPack):
    """:class:`SupportsDLPack` through the array API: ``x`` itself out (it has ``__dlpack__``),
    ``framework_module.from_dlpack`` in, the result checked to land on the producer's device. An
    adapter written against 0.3 that inherits it but says ``dlpack=False`` (deprecated) is refused
    with CapabilityError, as it was then."""

    def export_dlpack(self, x: Any) -> Any:
        core = self.core
        _refused_by_flag(core)
        if not hasattr(x, "__dlpack__"):
            raise CapabilityError(f"{core.name} backend: {type(x).__name__} has no __dlpack__")
        return x

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        core = self.core
        _refused_by_flag(core)
        mod = sys.modules.get(core.framework)
        fn = getattr(mod, "from_dlpack", None)
        if fn is None:
            raise CapabilityError(f"{core.name} backend: {core.framework}.from_dlpack does not exist")
        try:
            y = fn(obj)
        except (TypeError, ValueError, BufferError, RuntimeError) as e:
            raise CapabilityError(f"{core.name} backend cannot import this DLPack tensor: {e}") from e
        got = core.device_of(y)
        if got != device:
            raise CapabilityError(f"{core.name} backend: a DLPack buffer of {device} arrived on {got}")
        return y


def _refused_by_flag(core: Any) -> None:
    """CapabilityError where an adapter's deprecated ``capabilities.dlpack`` says False (0.3)."""
    if core.capabilities.dlpack is False:
        raise CapabilityError(f"{core.name} backend has no DLPack support (capabilities.dlpack)")


class NonBlockingMoves(Concern, SupportsNonBlocking):
    """The part of :class:`SupportsNonBlocking` written over ``start_move``: ``start_to_numpy`` starts
    a move to ``cpu:0`` and gives a callable that waits and returns ``to_numpy`` of the landed tensor
    (:func:`start_to_numpy`). The concern supplies ``start_move``."""

    def start_to_numpy(self, x: Any) -> Callable[[], np.ndarray]:
        core = self.core
        if core.device_of(x) == _HOST:
            return lambda: core.to_numpy(x)
        y, waiter = self.start_move(x, _HOST)

        def land() -> np.ndarray:
            landed = waiter() if waiter is not None else None
            out: np.ndarray = core.to_numpy(y if landed is None else landed)
            return out
        return land


def default_parameter_like(src: Any, y: Any) -> Any:
    """``parameter_like`` for tensors without autograd state: ``y`` itself."""
    return y


def default_sgd_update(params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
    """``sgd_update`` out of place with the tensors' own ``-`` and ``*``: ``p - lr * g``, in p's dtype
    (``lr`` is a Python float, which frameworks do not promote a floating tensor with; NumPy 1.x
    does for ml_dtypes' bfloat16, giving float32: such a result is cast back to p's dtype)."""
    out = []
    for p, g in zip(params, grads):
        y = p - float(lr) * g
        dt = getattr(p, "dtype", None)
        if dt is not None and getattr(y, "dtype", dt) != dt and callable(getattr(y, "astype", None)):
            y = y.astype(dt)
        out.append(y)
    return out


class TrainingDefaults(Concern, SupportsTraining):
    """The parts of :class:`SupportsTraining` that frameworks whose tensors carry no autograd state
    share: ``parameter_like`` returns the copy unchanged, ``sgd_update`` computes ``p - lr * g`` out
    of place. The concern supplies ``value_and_grad``."""

    def parameter_like(self, src: Any, y: Any) -> Any:
        return default_parameter_like(src, y)

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        return default_sgd_update(params, grads, lr)


def declares(obj: Any, protocol: type) -> bool:
    """Whether ``obj`` (a concern object, or an adapter written the 0.3 way) declares ``protocol``
    (inherits it)."""
    return protocol in type(obj).__mro__


def concern_of(b: Any, attr: str) -> Any:
    """Adapter ``b``'s concern object ``attr`` (a key of :data:`CONCERNS`), or None where it has none."""
    return getattr(b, attr, None)


def _stubbed(obj: Any, protocol: type) -> list[str]:
    """The methods of ``protocol`` that ``obj`` leaves at the protocol's own stub, or lacks."""
    out = []
    for m in protocol_methods(protocol):
        fn = getattr(type(obj), m, None)
        if m in getattr(obj, "__dict__", {}):
            continue
        if fn is None or fn is protocol.__dict__[m]:
            out.append(m)
    return out


#: Optional methods a concern object may have beside its protocol's (SupportsModels' scalar leaves).
_EXTRA_METHODS = {"models": ("tree_scalar", "put_scalar"), "dlpack": ("dlpack_c_exchange", "plain_host_exports")}


class _FlatConcern:
    """The concern object of an adapter written the 0.3 way (a capability's methods on the adapter
    class itself): each of the protocol's methods is the adapter's own, looked up at each call."""

    def __init__(self, core: Any, attr: str, protocol: type) -> None:
        self.core = core
        self._names = frozenset(protocol_methods(protocol)) | frozenset(_EXTRA_METHODS.get(attr, ()))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self._names:
            raise AttributeError(name)
        return getattr(self.core, name)


def _forwarder(attr: str, name: str) -> Callable[..., Any]:
    """An adapter class's method ``name`` answered by its concern ``attr`` (the concern itself where
    it is wrapped by an override: the override may call this through ``super()``)."""
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        c = getattr(self, attr)
        c = c.__dict__.get("_inner", c) if c is not None else None
        if c is None:
            raise AttributeError(f"{type(self).__name__} has no {attr} concern, so no {name}()")
        return getattr(c, name)(*args, **kwargs)
    forward.__name__ = forward.__qualname__ = name
    forward._md_forwarder = True  # type: ignore[attr-defined]
    return forward


def _forward(where: str, name: str) -> Callable[..., Any]:
    """A method calling ``self.<where>.<name>``."""
    return lambda self, *a, **k: getattr(getattr(self, where), name)(*a, **k)


def _overriding(core: Any, inner: Any, attr: str, protocol: type, names: Sequence[str]) -> Any:
    """Concern ``inner`` of ``core`` with ``names`` (methods of its protocol) taken from the adapter
    class instead: a subclass of a 0.4 adapter that overrides a capability method the 0.3 way. It
    declares ``protocol``; every other attribute is ``inner``'s."""
    ns: dict[str, Any] = {"__getattr__": lambda self, n: getattr(self._inner, n)}
    for m in (*protocol_methods(protocol), *_EXTRA_METHODS.get(attr, ())):
        if m in names:
            ns[m] = _forward("core", m)
        elif callable(getattr(inner, m, None)):
            ns[m] = _forward("_inner", m)
    ns["_md_overridden"] = True
    cls = type(f"{type(inner).__name__}Overridden", (protocol,), ns)
    obj: Any = object.__new__(cls)
    obj.__dict__.update(core=core, _inner=inner)
    return obj


def _class_overrides(obj: Any, attr: str, protocol: type) -> list[str]:
    """The methods of ``protocol`` that the adapter's own classes define (none do in a 0.4 adapter:
    they are its concern's)."""
    names = (*protocol_methods(protocol), *_EXTRA_METHODS.get(attr, ()))
    return [m for m in names if any(m in c.__dict__ and not getattr(c.__dict__[m], "_md_forwarder", False)
                                    for c in type(obj).__mro__ if c is not object)]


#: The deprecated capability flags that restate a concern attribute (0.3), by attribute.
_FLAGS = {"dlpack": "dlpack", "collectives": "native_collectives"}
_FLAGS_WARNED: weakref.WeakSet[type] = weakref.WeakSet()  # adapter classes warned about their flags


def _caps_or_none(obj: Any) -> Capabilities | None:
    try:
        caps = obj.capabilities
    except Exception:  # noqa: BLE001 - check_adapter reports it
        return None
    return caps if isinstance(caps, Capabilities) else None


def _flag_says(caps: Capabilities | None, attr: str) -> bool | None:
    """What ``caps``' deprecated flag for concern ``attr`` says (``dlpack``; ``native_collectives``
    naming ``allreduce``), or None where it is not given (or ``attr`` has no flag)."""
    if caps is None or attr not in _FLAGS:
        return None
    v = getattr(caps, _FLAGS[attr])
    if v is None:
        return None
    return "allreduce" in v if attr == "collectives" else bool(v)


def flat_concerns(obj: Any) -> list[str]:
    """The concern attributes an adapter written the 0.3 way provides through methods on its own class
    (it declares the protocol by inheriting it, and its concern attribute is None). As in 0.3, its
    flags decide DLPack (``dlpack=False``: none) and the native allreduce (only where
    ``native_collectives`` names it)."""
    caps = _caps_or_none(obj)
    out = []
    for attr, protocol in CONCERNS.items():
        if concern_of(obj, attr) is not None or not declares(obj, protocol):
            continue
        said = _flag_says(caps, attr)
        if (attr == "dlpack" and said is False) or (attr == "collectives" and not said):
            continue
        out.append(attr)
    return out


def _given_flags(obj: Any) -> list[str]:
    """The deprecated flags adapter ``obj``'s capabilities still give."""
    caps = _caps_or_none(obj)
    return [f for f in _FLAGS.values() if caps is not None and getattr(caps, f) is not None]


def _hide_by_flags(obj: Any) -> None:
    """A 0.4 adapter that still gives a flag saying no (``dlpack=False``, a ``native_collectives``
    without ``allreduce``) has that concern None on this instance, as the flag meant until 0.4."""
    caps = _caps_or_none(obj)
    for attr in _FLAGS:
        if _flag_says(caps, attr) is False and concern_of(obj, attr) is not None:
            setattr(obj, attr, None)


def attach_concerns(obj: Any, spec: str) -> list[str]:
    """Give an adapter written against API 0.3 its concern attributes: each capability it declares on
    the adapter class is wrapped into a concern object, the rest set to None (an adapter that is no
    BaseBackend), with one DeprecationWarning naming the adapter. Returns the attributes wrapped."""
    flat = flat_concerns(obj)
    flags = _given_flags(obj)
    _hide_by_flags(obj)
    for attr, protocol in CONCERNS.items():
        if attr in flat:
            setattr(obj, attr, _FlatConcern(obj, attr, protocol))
        elif not hasattr(obj, attr):
            setattr(obj, attr, None)
    overridden = []
    for attr, protocol in CONCERNS.items():
        c = concern_of(obj, attr)
        if c is None or isinstance(c, _FlatConcern) or getattr(type(c), "_md_overridden", False):
            continue  # (no concern, a 0.3 adapter's, or wrapped already: an adapter validated twice)
        names = _class_overrides(obj, attr, protocol)
        if names:  # a 0.3-style override on a subclass of a 0.4 adapter: honoured, deprecated
            setattr(obj, attr, _overriding(obj, c, attr, protocol, names))
            overridden += names
    if overridden:
        warnings.warn(f"adapter {spec!r} overrides capability methods on the adapter class ({', '.join(overridden)}), "
                      "the adapter API 0.3 way: deprecated since 0.4 and ignored in 0.5; override them on a "
                      "subclass of the concern instead (see docs/writing-an-adapter.md)", DeprecationWarning,
                      stacklevel=4)
    said = (f"; its capabilities' {' and '.join(flags)} (deprecated since 0.4) then go: the concern attributes "
            "say it" if flags else "")
    if flat:
        wanted = ", ".join(f"{a} = concern(...)" for a in flat)
        warnings.warn(f"adapter {spec!r} is written against the adapter API 0.3: capability methods on the adapter "
                      f"class ({', '.join(CONCERNS[a].__name__ for a in flat)}) are deprecated since 0.4 and will be "
                      f"ignored in 0.5; give it concern objects instead ({wanted}, "
                      f"see docs/writing-an-adapter.md){said}", DeprecationWarning, stacklevel=4)
    elif flags and type(obj) not in _FLAGS_WARNED:
        _FLAGS_WARNED.add(type(obj))
        warnings.warn(f"adapter {spec!r} gives capabilities.{' and capabilities.'.join(flags)}: deprecated since 0.4 "
                      "and ignored in 0.5; the concern attributes say it (b.dlpack, b.collectives: None where the "
                      "adapter lacks them; a concern's available_on(core) makes one None per instance): drop "
                      "the flags (see docs/writing-an-adapter.md)", DeprecationWarning, stacklevel=4)
    return flat


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
        if fn is None:
            problems.append(f"method {m}() is missing")
        elif not callable(fn):
            problems.append(f"{m} must be a method, got {type(fn).__name__}")
    has: dict[str, bool] = {}
    for attr, protocol in CONCERNS.items():
        try:
            c = concern_of(obj, attr)
        except Exception as e:  # noqa: BLE001 - reported, not raised
            problems.append(f"its {attr} concern could not be made: {type(e).__name__}: {e}")
            continue
        if isinstance(c, _FlatConcern) or (c is None and declares(obj, protocol)):
            c = obj  # written the 0.3 way: the methods are the adapter's own
        has[attr] = c is not None
        if c is None:
            continue
        if c is not obj and not declares(c, protocol):
            problems.append(f"its {attr} concern ({type(c).__name__}) does not declare {protocol.__name__}: "
                            f"inherit it (or a shared implementation of it)")
        left = _stubbed(c, protocol)
        if left:
            where = "it declares" if c is obj else f"its {attr} concern ({type(c).__name__}) declares"
            problems.append(f"{where} {protocol.__name__} but leaves {', '.join(m + '()' for m in left)} "
                            "unimplemented")
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
        for k in ("mutable", "async_execution", "pinned_memory", "dlpack_streams", "raises_on_mixed_devices"):
            if not isinstance(getattr(caps, k), bool):
                problems.append(f"capabilities.{k} must be a bool")
        # the deprecated flags (0.3): optional, and a problem only where they contradict the concerns
        if caps.dlpack is not None and not isinstance(caps.dlpack, bool):
            problems.append("capabilities.dlpack must be a bool (or left out: deprecated since 0.4)")
        nc = caps.native_collectives
        if nc is not None and not isinstance(nc, (frozenset, set)):
            problems.append("capabilities.native_collectives must be a frozenset (or left out: deprecated since 0.4)")
            nc = None
        extra = sorted(set(nc or ()) - {"allreduce"})
        if extra:
            problems.append(f"capabilities.native_collectives names unknown collectives {extra}")
        if caps.dlpack is True and not has.get("dlpack"):
            problems.append("capabilities.dlpack is True but it has no dlpack concern (dlpack = "
                            "concern(multidev.adapter.ArrayApiDLPack) for the array-API route, or a SupportsDLPack "
                            "of its own; the flag is deprecated since 0.4: leave it out)")
        if nc and not has.get("collectives"):
            problems.append("capabilities.native_collectives is not empty but it has no collectives concern "
                            "(a SupportsNativeCollectives: native_allreduce; the flag is deprecated since 0.4: "
                            "leave it out)")
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
    """Raise AdapterError listing every protocol problem of ``obj`` (registered as ``spec``), after
    wrapping what an adapter written against API 0.3 has on its class into concern objects
    (:func:`attach_concerns`)."""
    problems = check_adapter(obj)
    if not problems:
        attach_concerns(obj, spec)
    if problems:
        raise AdapterError(f"adapter {spec!r} does not follow the multidev protocol:\n  - "
                           + "\n  - ".join(problems)
                           + "\nSee multidev.protocol.Backend (help(multidev.protocol.Backend) lists the "
                           "methods in order) and docs/writing-an-adapter.md.")
