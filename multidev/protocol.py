"""What an adapter provides: the core :class:`Backend` protocol, the optional capability protocols,
and the :class:`Capabilities` record.

An adapter implements :class:`Backend`, the core every backend has (identity, devices, dtypes,
creation, placement, synchronize, host copies and the arithmetic the portable collectives are built
from), usually as a subclass of :class:`multidev.adapter.BaseBackend` (which supplies the shared
defaults). Each optional capability is a small protocol of its own, implemented whole by a
**concern object** the adapter has as an attribute (:data:`CONCERNS`: ``b.transfers``,
``b.dlpack``, ...), None where the framework lacks it:

- :class:`SupportsNonBlocking`: non-blocking moves and host copies on streams (``start_move``,
  ``start_to_numpy``); without it the core moves, then waits;
- :class:`SupportsDLPack`: zero-copy interchange (``export_dlpack``, ``import_dlpack``);
  without it ``convert`` copies through the host (:class:`multidev.adapter.ArrayApiDLPack` is the
  array-API route);
- :class:`SupportsNativeCollectives`: the framework's own allreduce (``native_allreduce``), for
  ``algorithm="native"``; without it the portable algorithms serve every collective;
- :class:`SupportsTraining`: autodiff and parameters (``parameter_like``, ``value_and_grad``,
  ``sgd_update``); without it ``train_batch`` takes a hand-written ``grad=``;
- :class:`SupportsCompile`: the framework's compilers (``compile_routes``, ``compile``);
- :class:`SupportsModels`: the framework's containers and models (JAX pytrees, torch modules,
  Gluon blocks, Keras models) for ``to``, ``copy``, ``device_of`` and the rest;
- :class:`SupportsDeviceScope`: the framework's own default-device scope, for
  ``multidev.device_scope``;
- :class:`SupportsMesh`: the framework's own device mesh (``jax.sharding.Mesh``, torch's
  ``DeviceMesh``, ``tf.dtensor``'s and Keras's meshes) and its hardware-aware device order;
- :class:`SupportsSharding`: the framework's own sharded tensor (a ``jax.Array`` with a
  ``NamedSharding``), for ``multidev.to(x, layout)``; without it multidev keeps managed shards;
- :class:`SupportsDataParallel`: the user's model and optimizer as a data-parallel replica
  (``data_parallel_replica``), for ``multidev.data_parallel``;
- :class:`SupportsShardedTraining`: the same over a device mesh, the batch cut along one mesh axis
  and the parameters along another (``sharded_replica``), for ``multidev.data_parallel(mesh=...)``.

The registry checks every adapter when it loads (:func:`multidev.adapter.check_adapter`): each core
method present, each concern declaring its protocol and implementing it whole (no method left at the
protocol's stub), and the capability flags well-formed. A concern an instance cannot have (a native
allreduce with one GPU) is None on that instance (:meth:`multidev.adapter.Concern.available_on`).
The conformance suite has a section per protocol. The core (placement, collectives, conformance
suite, benchmarks) is written once over these protocols.

Contract shared by every method:

- tensors are the framework's native objects; nothing is wrapped;
- ``device`` arguments are already-validated :class:`~multidev.Device` values that the backend has
  (the core checks with :meth:`Backend.devices` first);
- ``dtype`` arguments are canonical NumPy-style names (``"float32"``, ``"bfloat16"``, ``"int64"``,
  ``"bool"``, ...) that the backend lists in its capabilities;
- shapes, fill values and ranges were validated by the core (non-negative ints, values that fit);
- an adapter module must not import its framework at import time: the framework is imported when the
  adapter class is instantiated, so ``import multidev`` stays light.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from ._device import Device

__all__ = [
    "CAPABILITY_PROTOCOLS",
    "CONCERNS",
    "OPTIONAL_METHODS",
    "PROTOCOL_METHODS",
    "REDUCE_OPS",
    "Backend",
    "Capabilities",
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
    "protocol_methods",
]

#: Elementwise reductions every adapter's :meth:`Backend.combine` supports.
REDUCE_OPS = ("sum", "max", "min", "prod")


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do. The conformance suite skips by these flags and by the concern
    attributes (``b.dlpack``, ``b.collectives``, ...), never by backend name, and checks each against
    behaviour (a flag or concern that claims too much or too little fails)."""

    mutable: bool
    """Tensors can be written in place: :meth:`Backend.assign` and ``allreduce(inplace=True)`` work
    (NumPy, torch, MXNet). False where arrays are immutable values (JAX, TensorFlow tensors)."""
    async_execution: bool
    """Work is queued and runs later, so :meth:`Backend.synchronize` and :meth:`Backend.wait` really
    wait (CUDA streams, JAX's dispatch, MXNet's engine). False where every call has finished when it
    returns (NumPy, torch on the CPU)."""
    pinned_memory: bool
    """Page-locked host buffers exist for fast host<->accelerator copies (a CUDA build with a GPU);
    ``start_move`` to the host uses them."""
    dlpack: bool | None = None
    """Deprecated since 0.4 (derived from the attributes): whether the adapter has a ``dlpack``
    concern is ``b.dlpack is not None``. None, the default, means not given, and is what a 0.4
    adapter's capabilities hold; an adapter that still gives it gets one DeprecationWarning at load,
    a problem where it is True without the concern, and its concern hidden (None) where it is
    False. Read ``b.dlpack``, never this field."""
    dlpack_streams: bool = False
    """On accelerators, DLPack exchanges order themselves on the device: ``export_dlpack``'s object
    honours the consumer's ``stream`` argument and ``import_dlpack`` passes the consumer's stream
    (torch, JAX, CuPy on CUDA). Where both sides say so, ``convert`` skips its host-blocking wait for
    the producer."""
    native_collectives: frozenset[str] | None = None
    """Deprecated since 0.4 (derived from the attributes): whether the adapter has a native
    allreduce is ``b.collectives is not None``. None, the default, means not given (a 0.4 adapter's
    capabilities); an adapter that still gives it gets one DeprecationWarning at load, a problem
    where it names ``allreduce`` without the concern, and its concern hidden (None) where it does
    not name it. Read ``b.collectives``, never this field."""
    dtypes: frozenset[str] = field(default_factory=frozenset)
    """Canonical dtype names this backend can hold right now, on every device unless
    ``device_dtypes`` says otherwise (JAX drops the 64-bit ones without x64). Must not be empty."""
    raises_on_mixed_devices: bool = True
    """True where the framework's own arithmetic on tensors of two devices raises (torch, JAX,
    multidev's NumPy devices); False where it silently copies or computes on one of them
    (TensorFlow, MXNet). multidev's own operations raise DeviceMismatchError either way."""
    device_dtypes: Mapping[Device, frozenset[str]] = field(default_factory=dict)
    """Per-device dtype sets for devices that hold fewer dtypes than ``dtypes`` (a device without
    float64, such as Apple's MPS or some of array-api-strict's devices). Devices not listed hold all
    of ``dtypes``."""

    def dtypes_on(self, device: Device) -> frozenset[str]:
        """The dtypes ``device`` can hold."""
        return self.device_dtypes.get(device, self.dtypes)


@runtime_checkable
class Backend(Protocol):
    """The core adapter protocol, in the order every adapter file follows (see :data:`PROTOCOL_METHODS`
    for the list as ``help()`` cannot show it: pydoc sorts methods by name). The optional
    capabilities are protocols of their own (:data:`CAPABILITY_PROTOCOLS`)."""

    #: The backend's registry name, e.g. ``"torch"`` (what ``backend=`` arguments take).
    name: ClassVar[str]
    #: The top-level module of the framework, e.g. ``"torch"``. The registry instantiates an adapter
    #: to identify a tensor only once this module is in ``sys.modules`` (no tensor can exist before).
    framework: ClassVar[str]

    # -- concerns (:data:`CONCERNS`): each capability's object, or None where the framework lacks it
    transfers: SupportsNonBlocking | None
    dlpack: SupportsDLPack | None
    collectives: SupportsNativeCollectives | None
    training: SupportsTraining | None
    compiler: SupportsCompile | None
    models: SupportsModels | None
    scope: SupportsDeviceScope | None
    mesh: SupportsMesh | None
    sharding: SupportsSharding | None
    parallel: SupportsDataParallel | None
    sharded_training: SupportsShardedTraining | None

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        """This backend's capability record (see :class:`Capabilities`)."""
        ...

    def version(self) -> str:
        """The framework's version string."""
        ...

    def tensor_types(self) -> tuple[type, ...]:
        """Native tensor classes this adapter owns (used with ``isinstance``). No other registered
        adapter may claim the same class."""
        ...

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        """Every device this backend can place tensors on: ``cpu:0`` first, then the other CPUs, then
        each accelerator kind, each kind numbered 0..n-1."""
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
        """A new tensor filled with ``value`` (a Python scalar that fits ``dtype``)."""
        ...

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        """A new tensor with unspecified contents."""
        ...

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        """``start, start+step, ...`` below ``stop`` (NumPy's values; empty when the range is)."""
        ...

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        """A new tensor from nested sequences, scalars or a NumPy array: always a copy, never sharing
        the caller's buffer, and done with it on return (the caller may write it at once; the copy
        into the device may still run). ``dtype=None`` keeps a NumPy array's dtype, else the
        framework's own inference."""
        ...

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        """Uniform samples in [0, 1); the same seed gives the same values on the same backend."""
        ...

    # -- placement --------------------------------------------------------------------------
    def device_of(self, x: Any) -> Device:
        """The device ``x`` lives on. Never copies, never waits."""
        ...

    def move(self, x: Any, device: Device) -> Any:
        """``x`` on another device, a new buffer with x's dtype. Called only when ``x`` is not on
        ``device``. Asynchronous where the framework is; the result is safe to use in later
        framework operations and to read through :meth:`to_numpy`."""
        ...

    def copy(self, x: Any, device: Device) -> Any:
        """A new, independent buffer on ``device`` (which may be x's own), equal in value and dtype."""
        ...

    def to_numpy(self, x: Any) -> np.ndarray:
        """A host ``numpy.ndarray`` (exactly that type) with x's shape, dtype and values, after
        waiting for pending work on x. May share memory with a CPU-resident ``x``; never stale."""
        ...

    def synchronize(self, device: Device | None) -> None:
        """Block until all work queued on ``device`` (every device when ``None``) has finished,
        including work whose results were dropped, and raise any asynchronous error it produced."""
        ...

    def wait(self, x: Any) -> None:
        """Block until ``x`` itself is computed, and raise any asynchronous error behind it."""
        ...

    def device_wait_fn(self, device: Device) -> Callable[[], Any] | None:
        """A zero-argument function doing ``synchronize(device)`` with no adapter frame (the
        framework's own barrier bound to the device), or None where nothing can be queued on
        ``device``. ``multidev.synchronize(device)`` caches and calls it. It must wait exactly as
        :meth:`synchronize` does: an adapter (or subclass) that changes one changes both
        (BaseBackend: ``synchronize`` bound to ``device``)."""
        ...

    def tensor_wait_fn(self) -> Callable[[Any], Any]:
        """A function doing ``wait(x)`` for this adapter's tensors with no adapter frame (JAX's is the
        array class's own ``block_until_ready``); ``multidev.synchronize(x)`` caches and calls it. It
        must wait exactly as :meth:`wait` does (BaseBackend: the bound ``wait``)."""
        ...

    # -- arithmetic the collectives need (operands always share a device) ---------------------
    def shape_of(self, x: Any) -> tuple[int, ...]:
        """The shape as a tuple of Python ints."""
        ...

    def combine(self, op: str, a: Any, b: Any) -> Any:
        """Elementwise ``op`` (one of REDUCE_OPS) of two same-shape, same-device tensors, in their dtype.
        DeviceMismatchError when they are on two devices."""
        ...

    def divide(self, x: Any, n: int) -> Any:
        """``x / n`` keeping x's floating dtype (used by mean)."""
        ...

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        """``x`` with a new shape (a view where the framework can)."""
        ...

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        """Concatenation of same-device tensors along ``axis``; DeviceMismatchError otherwise."""
        ...

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        """``x`` cut along ``axis`` into consecutive pieces of the given sizes (they sum to the axis)."""
        ...

    def assign(self, dst: Any, src: Any) -> None:
        """Write ``src`` into ``dst`` in place (same device, shape and dtype). Raises CapabilityError
        on immutable backends and for read-only tensors; DeviceMismatchError across devices."""
        ...


@runtime_checkable
class SupportsNonBlocking(Protocol):
    """Non-blocking moves on the framework's streams (CUDA copy streams, JAX's dispatch): the copy
    starts at once and overlaps later work. Without it, ``to(x, d, non_blocking=True)`` moves and
    waits when ``wait()`` is called (:func:`multidev.adapter.start_to_numpy` is the shared default
    of ``start_to_numpy``)."""

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], Any] | None]:
        """Start moving ``x`` (not on ``device``) and return at once with the target tensor and a
        callable that blocks until it is safe to read (None when it already is). Where the target
        can only be made once the copy has landed, the callable returns it (the first element is then
        a placeholder the caller must not use). Host targets use
        pinned buffers where the backend has them; the copy starts once the work producing ``x``
        (queued before this call) is done, not after later work. The adapter keeps ``x`` alive
        until the copy has landed. The caller must not read the target, nor write ``x``, before
        calling the waiter."""
        ...

    def start_to_numpy(self, x: Any) -> Callable[[], np.ndarray]:
        """Start copying
        ``x`` into host memory (pinned where the backend has it) as soon as its producer is done, and
        return at once a callable that waits and gives the ``numpy.ndarray``. For ``to_host``."""
        ...


@runtime_checkable
class SupportsDLPack(Protocol):
    """Zero-copy interchange through DLPack, for :func:`multidev.convert` (an adapter without it is
    converted through the host); :class:`multidev.adapter.ArrayApiDLPack` implements it for
    frameworks with the array-API ``__dlpack__`` and ``from_dlpack``."""

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


@runtime_checkable
class SupportsNativeCollectives(Protocol):
    """The framework's own collective path (NCCL, ``psum``, kvstore), for ``algorithm="native"``.
    An adapter whose path exists only on some machines (NCCL needs two GPUs) says so in its
    concern's :meth:`~multidev.adapter.Concern.available_on`: the attribute is None elsewhere."""

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        """The framework's own allreduce over tensors on distinct devices (NCCL, psum, kvstore),
        out of place, result ``i`` on input ``i``'s device, in input order, with ``op`` one of
        ``sum``, ``max``, ``min``, ``prod`` (mean is the core's sum and divide). Raises
        CapabilityError where the backend has none, or none for this dtype/op/device set."""
        ...


@runtime_checkable
class SupportsTraining(Protocol):
    """Training parameters and the framework's autodiff, for :func:`multidev.replicate` and
    :func:`multidev.train_batch`. Without it, replicas are plain copies and ``train_batch`` takes a
    hand-written ``grad=`` (:class:`multidev.adapter.TrainingDefaults` supplies ``parameter_like``
    and ``sgd_update`` for frameworks whose tensors carry no autograd state)."""

    def parameter_like(self, src: Any, y: Any) -> Any:
        """``y`` (a new copy of ``src``, made by :meth:`copy` or :meth:`move`) made a training
        parameter the way ``src`` is: a leaf that requires grad where ``src`` requires grad (torch),
        with a gradient buffer where ``src`` has one (MXNet ``attach_grad``), a Variable where
        ``src`` is one (TF). ``y`` itself where tensors carry no autograd state (the default)."""
        ...

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        """``(loss, grads)``: ``loss = fn(list(params), *args)`` (a scalar, or a tensor whose sum is
        the loss) and its gradient with respect to each of ``params``, by the framework's own autodiff,
        computed on the device of ``params`` (they share one). ``loss`` is detached from any graph;
        ``grads[i]`` has the shape, dtype and device of ``params[i]`` (zeros where the loss does not
        depend on it). Leaves ``params`` and their gradient buffers (``.grad``) untouched.
        CapabilityError where the framework has no autodiff (the default)."""
        ...

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        """``params[i] - lr * grads[i]`` for every i, each on its parameter's device: written in place
        where the parameter is writable (returning the same objects, which stay parameters: leaves,
        Variables, arrays with a gradient buffer), new tensors elsewhere. The default: out of place,
        with the tensors' own ``-`` and ``*``."""
        ...


@runtime_checkable
class SupportsCompile(Protocol):
    """The framework's compilers, for :func:`multidev.compile`."""

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        """The ways this framework can compile ``fn`` (a function or the framework's own module
        object), in order of preference: route name -> whether ``route="auto"`` measures it. Names
        are the framework's own (``"jax.jit"``); ``"eager"`` runs ``fn`` as it is. CapabilityError,
        saying what would work, where ``fn`` is nothing this framework can compile (the default)."""
        ...

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        """``fn`` compiled by ``route`` (one of :meth:`compile_routes`), taking and returning what
        ``fn`` does; ``args`` are the first call's arguments (for tracing compilers). Results live on
        the device of the inputs, as ``fn``'s would. May return ``fn`` itself, reconfigured (Gluon's
        ``hybridize``). CapabilityError, saying why, where ``fn`` cannot be compiled this way."""
        ...


@runtime_checkable
class SupportsModels(Protocol):
    """The framework's own containers and models, for ``to``, ``copy``, ``device_of``,
    ``synchronize``, ``to_host`` and ``convert`` of whole structures (the core handles lists,
    tuples, named tuples and dicts itself). Two kinds:

    - ``"tree"``: a structure rebuilt from new leaves (JAX pytree nodes: flax structs, equinox
      modules, registered classes); the core maps the call over its children;
    - ``"module"``: a model whose tensors move in place (a torch ``nn.Module``, a Gluon ``Block``),
      or cannot move (a Keras model, a ``tf.Module``: then the adapter refuses, saying why).

    Optional, for a framework whose own transfer turns a tree's plain values into arrays (JAX's
    ``device_put``): ``tree_scalar(obj) -> bool``, whether ``obj`` (a leaf of one of its trees that is
    no tensor) is such a value, and ``put_scalar(obj, device)`` (device a Device, or None for the
    framework's default), the array the framework makes of it; ``to`` and ``copy`` of a tree then
    call it. Without them such leaves are kept as they are."""

    def model_kind(self, obj: Any) -> str | None:
        """``"tree"`` or ``"module"`` where ``obj`` is one of this framework's structures, else None.
        Never imports a framework, never copies."""
        ...

    def flatten_tree(self, obj: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
        """A ``"tree"``'s children, in order, and a function building the same structure from new
        children (as many, in the same order)."""
        ...

    def module_tensors(self, obj: Any) -> list[Any]:
        """Every tensor a ``"module"`` holds (parameters and buffers, each once), for ``device_of``,
        ``synchronize`` and ``to_host``."""
        ...

    def move_module(self, obj: Any, device: Device) -> Any:
        """The ``"module"`` on ``device``: moved in place as the framework's own ``to`` does (the
        same object returned; nothing copied where every tensor is there already), or
        CapabilityError where the framework cannot move it, saying what to do instead."""
        ...

    def copy_module(self, obj: Any, device: Device) -> Any:
        """A new, independent ``"module"`` equal to ``obj`` on ``device`` (``obj`` unchanged), or
        CapabilityError where the framework cannot make one."""
        ...


@runtime_checkable
class SupportsDataParallel(Protocol):
    """The framework's models and optimizers for :func:`multidev.data_parallel` and
    :func:`multidev.broadcast_state`: a :class:`~multidev.adapter.Replica` over the user's own
    model and the framework's own optimizer. The core does the buckets, the collectives across
    processes, the broadcast and the replica check.

    Optional: a method ``piece_refusal(model, optimizer)`` raising CapabilityError where the
    replica's :meth:`~multidev.adapter.Replica.piece_optimizer` would refuse ``optimizer`` (None
    otherwise); the core calls it before making a replica for multidev's own sharding of the
    optimizer's state over one process's devices, so a refusal leaves the model and optimizer as
    they were (a replica over several devices may move or copy them)."""

    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        """A :class:`~multidev.adapter.Replica` of ``model`` (this framework's model, or a tree of its
        tensors) and ``optimizer`` (the framework's own, or None) on ``devices`` (validated, at
        least one; several: the framework's one-process data parallelism over them). None where
        ``model`` is no structure of this framework; InvalidArgumentError for an optimizer that
        does not fit the model; CapabilityError for a mode the framework cannot run, saying why."""
        ...


@runtime_checkable
class SupportsShardedTraining(Protocol):
    """The framework's models and optimizers trained over a :class:`~multidev.Mesh` of one process's
    devices (FSDP/ZeRO-style), for ``multidev.data_parallel(model, optimizer, mesh=...)``: the batch
    cut along the data axes, each parameter and its optimizer state cut along the parameter axes,
    the framework's compiler inserting the collectives. The core validates the mesh and axes.

    Optional: a class attribute ``one_process_mesh = False`` where :meth:`sharded_replica` refuses
    every mesh of one process (torch: FSDP2 runs one process per device); the core then trains a
    mesh whose parameters are replicated (no parameter axis) with plain data parallelism over its
    devices, and one with a parameter axis with multidev's own sharding of the optimizer's state
    where the replica gives :meth:`~multidev.adapter.Replica.piece_optimizer`, as for a framework
    without this capability. A method ``sharded_process_replica(model, optimizer, process_mesh,
    data_axes, param_axes, grad_dtype)`` shards over the processes of a group, and a class attribute
    ``process_engine`` names the only engine it runs under (torch's FSDP2: ``"torch"``); under
    another, multidev's own sharding of the optimizer's state is used where the replica gives one."""

    def sharded_replica(self, model: Any, optimizer: Any, mesh: Any, data_axes: tuple[str, ...],
                        layout_for: Any) -> Any:
        """A :class:`~multidev.adapter.Replica` of ``model`` and ``optimizer`` laid out on ``mesh``
        (a :class:`~multidev.Mesh` of this backend's devices): a batch's rows cut along
        ``data_axes``; each parameter and each optimizer-state tensor of shape ``s`` laid out as
        ``layout_for(s)`` (a :class:`~multidev.Layout` on ``mesh``: the core's rule), never whole on
        one device on the way. None where ``model`` is no structure of this framework;
        InvalidArgumentError for an optimizer that does not fit; CapabilityError for a model or mode
        it cannot shard, saying why."""
        ...


@runtime_checkable
class SupportsDeviceScope(Protocol):
    """The framework's own default-device scope, entered by ``multidev.device_scope(dev,
    backend=...)`` so framework code inside the block lands on ``dev`` (torch's device context,
    ``jax.default_device``, ``tf.device``, MXNet's context). Nesting and threads behave as the
    framework's own scope does."""

    def device_scope(self, device: Device) -> Any:
        """A context manager making ``device`` the framework's default device inside its block."""
        ...

    def current_device(self) -> Device:
        """The framework's default device now: where its own creation calls put a tensor made with no
        device (inside :meth:`device_scope`, that scope's device). Never allocates on a device other
        than that one."""
        ...


@runtime_checkable
class SupportsMesh(Protocol):
    """The framework's own device mesh, for :func:`multidev.make_mesh` (its device order) and
    :func:`multidev.to_native_mesh` / :func:`multidev.from_native_mesh`. Meshes are
    :class:`multidev.Mesh` values (``multidev.adapter.Mesh``).

    Optional methods, for a framework with its own mesh of processes and sharded type across them
    (torch: ``DeviceMesh`` and DTensor; JAX: a ``jax.sharding.Mesh`` of one device per process and
    global arrays); the core asks for each with ``getattr`` and uses multidev's managed pieces
    without them. ``layout`` is a :class:`multidev.Layout` over a ``ProcessMesh``
    (``multidev.adapter.ProcessMesh``); ``engine`` the group's engine name, ``rank`` this rank.

    - ``to_native_process_mesh(shape, axis_names, engine)`` / ``from_native_process_mesh(obj)``:
      the framework's mesh of the group's processes, row-major, and back (``(shape, names)`` or None).
    - ``process_native(layout, shape, engine, rank) -> bool``: whether this rank would use the
      framework's own type (its runtime runs the group's ranks, rank for rank), decided without
      making anything; the core agrees it across ranks first. ``shape`` may be None.
    - ``process_sharding(layout, shape, engine, rank)``: the framework's placement object (it may
      make collective objects: called on every rank, after the agreement), or None for managed
      pieces (a layout its type does not express).
    - ``from_local(piece, sharding, shape)``: the sharded tensor of this rank's ``piece``, no
      communication. ``process_layout_of(x)``: the layout of the framework's own tensor sharded
      across processes, None otherwise (cheap: asked of every tensor of the framework in the
      layout calls). ``local_pieces(x)``: this rank's pieces, no copy.
    - Each optional, the core's own path without it: ``process_place(x, sharding, src)`` (the
      framework's scatter of rank ``src``'s whole tensor, a new buffer; None to decline),
      ``process_cut(whole, sharding)`` (each rank cutting its piece of a whole it holds),
      ``process_whole(x)`` (the whole on this rank's device, a new buffer, on every rank),
      ``process_relayout(x, sharding)`` (the framework's change of layout; None to decline)."""

    def mesh_device_order(self, shape: tuple[int, ...], devices: Sequence[Device]) -> list[Device]:
        """``devices`` (as many as the mesh has) in the row-major order the framework's own mesh
        factory would give a mesh of ``shape`` (``jax.make_mesh``: the hardware's topology, the last
        axis over the closest devices); the same devices, each once."""
        ...

    def native_mesh_kinds(self) -> tuple[str, ...]:
        """The kinds of native mesh :meth:`to_native_mesh` makes, the default first (``("jax",)``,
        ``("dtensor", "keras")``)."""
        ...

    def to_native_mesh(self, mesh: Any, kind: str) -> Any:
        """The framework's own mesh of ``kind`` (one of :meth:`native_mesh_kinds`) with ``mesh``'s
        shape, axis names and devices, in order. CapabilityError where the framework cannot make it
        here, saying why (torch's ``DeviceMesh`` needs a process group with one rank per device)."""
        ...

    def from_native_mesh(self, obj: Any) -> Any:
        """The :class:`multidev.Mesh` of one of the framework's own meshes (shape, names, devices in
        order), or None where ``obj`` is none of them. Never imports a framework."""
        ...


@runtime_checkable
class SupportsSharding(Protocol):
    """The framework's own sharded tensor type (a ``jax.Array`` with a ``NamedSharding``): what
    ``multidev.to(x, layout)`` gives where the framework can express the layout. Layouts are
    :class:`multidev.Layout` values; shards are listed in the layout's mesh order."""

    def sharding_for(self, layout: Any, shape: tuple[int, ...]) -> Any:
        """The framework's placement object for a tensor of ``shape`` laid out as ``layout`` (a
        ``NamedSharding``), or None where its sharded type cannot express the layout (partial sums):
        multidev then keeps managed shards. CapabilityError where it can express it but not for this
        shape (JAX needs pieces of equal size), saying why."""
        ...

    def layout_of(self, x: Any) -> Any:
        """The :class:`multidev.Layout` of a native sharded tensor, or None where ``x`` lives on one
        device the ordinary way. Never copies or waits."""
        ...

    def shards_of(self, x: Any) -> list[Any]:
        """The per-device pieces of a native sharded tensor (``layout_of(x)`` is not None), one native
        single-device tensor per device of the layout's mesh, in mesh order; no copy where the
        framework hands them out (JAX's ``addressable_shards``)."""
        ...

    def place_sharded(self, x: Any, sharding: Any) -> Any:
        """``x`` (a tensor on one device, or a native sharded one) placed by ``sharding`` (from
        :meth:`sharding_for`): a new native sharded tensor, asynchronous where the framework is."""
        ...

    def unshard(self, x: Any, device: Device) -> Any:
        """The whole of a native sharded tensor as one new tensor on ``device`` (``jax.device_put(x,
        device)``), asynchronous where the framework is: ``multidev.to(x, device)``."""
        ...

    def assemble(self, shards: Sequence[Any], sharding: Any, shape: tuple[int, ...]) -> Any:
        """The native sharded tensor of ``shape`` made of ``shards`` (one per device of the mesh, in
        mesh order, each on its device with its piece's shape and the same dtype), without copying
        where the framework allows (``jax.make_array_from_single_device_arrays``)."""
        ...


#: The optional capability protocols, in the order the adapter files and docs follow.
CAPABILITY_PROTOCOLS: tuple[type, ...] = (SupportsNonBlocking, SupportsDLPack, SupportsNativeCollectives,
                                          SupportsTraining, SupportsCompile, SupportsModels, SupportsDeviceScope,
                                          SupportsMesh, SupportsSharding, SupportsDataParallel,
                                          SupportsShardedTraining)


#: Each capability protocol's concern attribute on an adapter, in the same order: ``b.dlpack`` is the
#: adapter's :class:`SupportsDLPack` object, or None where the framework has none. The attribute is the
#: truth about a capability: the core calls a capability's methods through it
#: (``b.collectives.native_allreduce(...)``) and asks whether it is None, nothing else.
CONCERNS: dict[str, type] = {"transfers": SupportsNonBlocking, "dlpack": SupportsDLPack,
                             "collectives": SupportsNativeCollectives, "training": SupportsTraining,
                             "compiler": SupportsCompile, "models": SupportsModels, "scope": SupportsDeviceScope,
                             "mesh": SupportsMesh, "sharding": SupportsSharding, "parallel": SupportsDataParallel,
                             "sharded_training": SupportsShardedTraining}


def protocol_methods(protocol: type) -> tuple[str, ...]:
    """The methods (and properties) a protocol declares, in order."""
    names = []
    for n, v in protocol.__dict__.items():
        if n.startswith("_"):
            continue
        if callable(v) or isinstance(v, property):
            names.append(n)
    return tuple(names)


#: The core protocol's methods in order (``capabilities`` is a property): every adapter has them.
PROTOCOL_METHODS: tuple[str, ...] = protocol_methods(Backend)
#: Every method of the capability protocols (an adapter implements those of the protocols it declares).
OPTIONAL_METHODS = frozenset(m for p in CAPABILITY_PROTOCOLS for m in protocol_methods(p))


def _ordered_doc(protocol: type, title: str) -> str:
    lines = ["", title, ""]
    for i, n in enumerate(protocol_methods(protocol), 1):
        v = protocol.__dict__[n]
        fn: Any = v.fget if isinstance(v, property) else v
        sig = "" if isinstance(v, property) else str(inspect.signature(fn)).replace("'", "")
        first = (fn.__doc__ or "").strip().splitlines()[0]
        lines.append(f"{i:2d}. {n}{sig}: {first}")
    return "\n".join(lines)


Backend.__doc__ = (Backend.__doc__ or "") + "\n" + _ordered_doc(Backend, "The core protocol, in order:")
for _p in CAPABILITY_PROTOCOLS:
    _p.__doc__ = (_p.__doc__ or "") + "\n" + _ordered_doc(_p, "Its methods:")
