"""JAX backend: ``jax.Array`` values committed to single JAX devices.

Mechanism. Devices are JAX's addressable devices of the ``cpu`` platform (``cpu:i``) and, where
present, of the ``gpu`` platform (CUDA or ROCm, ``gpu:i``), each numbered by its order (device id)
within its platform. Every tensor this adapter creates is *committed* to its device (JAX then refuses
arithmetic between committed arrays of two devices, as a GPU framework would). An array sharded or
replicated over several devices has no single device: ``device_of`` raises DeviceMismatchError.

Environment. ``$MULTIDEV_JAX_CPU_DEVICES=N`` gives JAX ``N`` virtual CPU devices: when the adapter is
created before ``import jax`` it appends ``--xla_force_host_platform_device_count=N`` to
``$XLA_FLAGS``; when jax is imported but its backends are not yet initialized it sets the config
option ``jax_num_cpu_devices`` (both work on jax 0.7 and 0.10); afterwards it cannot be changed.

JAX specifics. Arrays are immutable (``assign`` raises CapabilityError: rebind results instead).
64-bit dtypes exist only under ``jax_enable_x64``, so ``capabilities.dtypes`` is recomputed from the
flag. Execution is asynchronous; ``synchronize`` blocks on every live array (JAX has no per-device
barrier). ``native_allreduce`` is ``psum``/``pmax``/``pmin`` under ``jax.shard_map`` over exactly the
inputs' devices (``prod`` and complex max/min as an ordered fold over ``all_gather``; CPUs and GPUs
mixed: per platform, then combined). DLPack imports are zero-copy or CapabilityError; a host buffer
becomes a view on the requested virtual CPU device.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from multidev.adapter import (
    DTYPES,
    BaseBackend,
    Capabilities,
    CapabilityError,
    Device,
    DeviceMismatchError,
    DeviceNotFoundError,
    InvalidDeviceError,
    StagingPlan,
    SupportsCompile,
    SupportsDLPack,
    SupportsNativeCollectives,
    SupportsNonBlocking,
    TrainingDefaults,
    canonical_dtype,
    dlpack_info,
    numpy_dtype,
    parallel_put,
)

_ENV_CPU = "MULTIDEV_JAX_CPU_DEVICES"
_XLA_FLAG = "--xla_force_host_platform_device_count"
_X64_DTYPES = frozenset({"int64", "uint64", "float64", "complex128"})
_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
_COMPLEX_PART = {"complex64": "float32", "complex128": "float64"}
_ALLREDUCE_OPS = ("sum", "max", "min", "prod")
_CACHE_MAX = 256
# DLPack (code, bits) pairs of the 64-bit dtypes JAX holds only under x64 (dlpack.h DLDataTypeCode).
_DL_X64 = {(0, 64), (1, 64), (2, 64), (5, 128)}


def _x64_hint() -> str:
    return "enable 64-bit types with jax.config.update('jax_enable_x64', True)"


def _cpu_count_from_env() -> int | None:
    raw = os.environ.get(_ENV_CPU)
    if raw is None or not raw.strip():
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise InvalidDeviceError(f"${_ENV_CPU} must be a positive integer, got {raw!r}")
    return n


def _reducer(prim: Callable[[Any, str], Any]) -> Callable[[Any], Any]:
    """``prim`` (``lax.pmax``, ...) over the mesh axis ``"i"``."""
    return lambda a: prim(a, "i")


class _Producer:
    """A DLPack producer for jax.dlpack.from_dlpack that notes where the shared buffer lives.

    Wraps a bare ``"dltensor"`` capsule (jax.dlpack.from_dlpack refuses capsules: removed in jax
    0.10, deprecated in 0.7) or a producer object; the buffer address lets the caller detect JAX's
    silent copy of CPU buffers that are not 64-byte aligned.

    ``cpu_id``: DLPack names every host buffer ``(kDLCPU, 0)``; reporting the hardware id of a
    virtual CPU device instead makes JAX place its zero-copy view on that device (host memory is
    the same for all of them).
    """

    def __init__(self, src: Any, cpu_id: int | None = None, inspect: bool = True) -> None:
        self._src = src
        self._cpu_id = cpu_id
        self._inspect = inspect  # read the capsule's header (host buffers; jax < 0.8's strides)
        self._is_capsule = type(src).__name__ == "PyCapsule"
        self.code_bits: tuple[int, int] | None = None
        self.address: int | None = None
        self.row_major = True
        if self._is_capsule:
            self._note(src)
            self._device = dlpack_info(src).device

    def _note(self, capsule: Any) -> None:
        info = dlpack_info(capsule)
        self.code_bits, self.address, self.row_major = info.code_bits, info.address, info.row_major

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        if self._is_capsule:
            return self._src
        # Some producers (TensorFlow) take no stream argument: pass it only when there is one.
        cap = self._src.__dlpack__(stream=stream, **kwargs) if stream is not None or kwargs \
            else self._src.__dlpack__()
        if self._inspect:
            self._note(cap)
        return cap

    def __dlpack_device__(self) -> Any:
        kind, idx = self._device if self._is_capsule else self._src.__dlpack_device__()
        if int(kind) == 1 and self._cpu_id is not None:  # kDLCPU
            return (kind, self._cpu_id)
        return (kind, idx)


class JaxBackend(BaseBackend, SupportsNonBlocking, SupportsDLPack, SupportsNativeCollectives, TrainingDefaults,
                 SupportsCompile):
    """The JAX backend (see module docstring)."""

    name: ClassVar[str] = "jax"
    framework: ClassVar[str] = "jax"
    virtual_devices_env: ClassVar[str | None] = _ENV_CPU

    def __init__(self) -> None:
        n = _cpu_count_from_env()
        imported = "jax" in sys.modules
        if n is not None and not imported:
            flags = os.environ.get("XLA_FLAGS", "")
            if _XLA_FLAG not in flags:
                os.environ["XLA_FLAGS"] = f"{flags} {_XLA_FLAG}={n}".strip()
        import jax
        import jax.numpy as jnp

        self._jax = jax
        self._jnp = jnp
        if n is not None and imported and _XLA_FLAG not in os.environ.get("XLA_FLAGS", ""):
            try:
                if jax.config.jax_num_cpu_devices in (-1, None):  # never override the user's choice
                    jax.config.update("jax_num_cpu_devices", n)
            except (RuntimeError, AttributeError):
                pass  # backends already initialized (or an old jax): the CPU count is fixed now
        self._lock = threading.RLock()
        self._devs: list[Device] | None = None
        self._to_native: dict[Device, Any] = {}
        self._from_native: dict[Any, Device] = {}
        self._caps: dict[bool, Capabilities] = {}
        self._allreduce_cache: dict[tuple, tuple[Callable[[Any], Any], Any]] = {}
        self._reported: list[weakref.ref] = []  # failed arrays whose error synchronize already raised
        self._pinned_kinds: dict[Any, bool] = {}  # native device -> has a pinned_host memory kind
        self._dlpack_dtypes: set[Any] = set()  # dtypes DLPack was seen to carry
        self._grad_fns: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loss fn -> jitted grad
        #: Pageable uploads to an accelerator from this size up go in pieces from several threads
        #: (multidev.adapter.parallel_put): 16 MiB pieces measured fastest on an H200 (28.7 GB/s at 1
        #: GiB against device_put's 7.4; 13.9 against 4.9 at 64 MiB).
        self.staging = StagingPlan(chunk=16 << 20, threshold=32 << 20)

    def _enumerate(self) -> None:
        """Read JAX's devices once (this initializes JAX's backends)."""
        with self._lock:
            if self._devs is not None:
                return
            jax = self._jax
            devs: list[Device] = []
            for platform, kind in (("cpu", "cpu"), ("gpu", "gpu")):
                try:
                    natives = jax.local_devices(backend=platform)
                except RuntimeError:  # jax.devices("gpu") raises when no GPU platform is present
                    continue
                for i, nd in enumerate(sorted(natives, key=lambda d: d.id)):
                    dev = Device(kind, i)
                    devs.append(dev)
                    self._to_native[dev] = nd
                    self._from_native[nd] = dev
            self._devs = devs

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        """Recomputed when ``jax_enable_x64`` changes: without it 64-bit dtypes are not listed."""
        x64 = bool(self._jax.config.jax_enable_x64)
        caps = self._caps.get(x64)
        if caps is None:
            self._enumerate()
            dtypes = frozenset(DTYPES) if x64 else frozenset(DTYPES) - _X64_DTYPES
            gpus = [nd for d, nd in self._to_native.items() if d.kind == "gpu"]
            pinned = False
            for nd in gpus:
                try:
                    pinned = pinned or any(m.kind == "pinned_host" for m in nd.addressable_memories())
                except Exception:  # noqa: BLE001 - memory kinds are not implemented on every plugin
                    pass
            caps = Capabilities(mutable=False, async_execution=True, pinned_memory=pinned,
                                dlpack=True, dlpack_streams=bool(gpus), native_collectives=frozenset({"allreduce"}),
                                dtypes=dtypes, raises_on_mixed_devices=True)
            self._caps[x64] = caps
        return caps

    def tensor_types(self) -> tuple[type, ...]:
        return (self._jax.Array,)

    # -- devices ----------------------------------------------------------------------------
    def devices(self) -> list[Device]:
        if self._devs is None:
            self._enumerate()
        return list(self._devs or ())

    def to_native_device(self, device: Device) -> Any:
        if self._devs is None:
            self._enumerate()
        nd = self._to_native.get(device)
        if nd is None:
            raise DeviceNotFoundError(
                f"jax backend has no device {device}; available: {', '.join(map(str, self.devices()))}. "
                f"More virtual CPUs: set ${_ENV_CPU}=N before JAX initializes.")
        return nd

    def from_native_device(self, obj: Any) -> Device | None:
        if not isinstance(obj, self._jax.Device):
            return None
        if self._devs is None:
            self._enumerate()
        return self._from_native.get(obj)  # by platform and order within it, not global id

    # -- dtypes -----------------------------------------------------------------------------
    def to_native_dtype(self, dtype: str) -> Any:
        if dtype not in self.capabilities.dtypes:
            if dtype in _X64_DTYPES:
                raise CapabilityError(f"jax backend: dtype {dtype!r} needs 64-bit mode; {_x64_hint()}")
            raise CapabilityError(f"jax backend: unsupported dtype {dtype!r}")
        return self._jnp.dtype(numpy_dtype(dtype))

    def dtype_of(self, x: Any) -> str:
        return canonical_dtype(x.dtype)

    # -- creation ---------------------------------------------------------------------------
    def _finish(self, x: Any, native: Any, nd: Any) -> Any:
        """``x`` committed to ``native`` with dtype ``nd``, or a CapabilityError."""
        sh = x.sharding
        if not (x.committed and len(sh.device_set) == 1 and native in sh.device_set):
            x = self._jax.device_put(x, native)  # an uncommitted or misplaced result: commit it
        if x.dtype != nd:  # JAX canonicalizes 64-bit types away when x64 is off
            raise CapabilityError(f"jax backend produced {x.dtype}, not {nd}; {_x64_hint()}")
        return x

    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        nd, native = self.to_native_dtype(dtype), self.to_native_device(device)
        return self._finish(self._jnp.full(shape, value, dtype=nd, device=native), native, nd)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        nd, native = self.to_native_dtype(dtype), self.to_native_device(device)
        return self._finish(self._jnp.empty(shape, dtype=nd, device=native), native, nd)

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        nd, native = self.to_native_dtype(dtype), self.to_native_device(device)
        # jnp.arange's values differ from NumPy's (jax 0.10: int dtype with float bounds gives
        # zeros; low-precision floats round differently): compute on the host with NumPy.
        host = np.arange(start, stop, step, dtype=numpy_dtype(dtype))
        return self._finish(self._jax.device_put(host, native), native, nd)

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        native = self.to_native_device(device)
        nd = None if dtype is None else self.to_native_dtype(dtype)
        if device.kind != "cpu" and isinstance(obj, np.ndarray) and (nd is None or obj.dtype == nd):
            # device_put is JAX's fast upload (3x jnp.array's at 1 MiB on an H200). Not to a CPU
            # device: there it may share the caller's aligned buffer (may_alias=False or not), and
            # asarray always copies.
            if obj.nbytes >= self.staging.threshold and obj.ndim and obj.flags.c_contiguous:
                x = self._staged_put(obj, native)
            else:
                x = self._jax.device_put(obj, native)
            return self._finish(x, native, x.dtype if nd is None else nd)
        x = self._jnp.array(obj, dtype=nd, copy=True, device=native)
        if nd is None:
            nd = x.dtype
            if x.weak_type:  # jnp.array(3.0) is weakly typed; give it a definite dtype
                x = self._jnp.array(x, dtype=nd, copy=False, device=native)
        return self._finish(x, native, nd)

    def _staged_put(self, arr: np.ndarray, native: Any) -> Any:
        """A large pageable upload: ``device_put`` of ``staging.chunk``-byte pieces from several
        threads (JAX reads pageable memory 4x faster so), joined on the device. Synchronous for the
        source; the join compiles once per shape and dtype and holds the array twice for a moment
        (where the device has no room for that, one ``device_put`` instead)."""
        jax = self._jax
        try:
            parts = parallel_put(arr, lambda p: jax.device_put(p, native), self.staging)
            return self._join(tuple(parts), arr.shape)
        except (RuntimeError, MemoryError):  # the join needs the array twice: no room, so one put
            return jax.device_put(arr, native)

    @functools.cached_property
    def _join(self) -> Callable[[tuple, tuple[int, ...]], Any]:
        jnp = self._jnp
        return self._jax.jit(lambda parts, shape: jnp.concatenate(parts).reshape(shape), static_argnums=1)

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        jax = self._jax
        nd, native = self.to_native_dtype(dtype), self.to_native_device(device)
        if seed is None:
            seed = secrets.randbits(31)
        elif not 0 <= seed < 2**31:
            # PRNGKey truncates wide seeds silently (2**40 gives the key of 0 without x64): hash them.
            seed = int.from_bytes(hashlib.blake2b(str(seed).encode(), digest_size=4).digest(), "little")
            seed &= 0x7FFFFFFF
        key = jax.device_put(jax.random.PRNGKey(seed), native)  # committed key: sampling runs there
        if dtype in _FLOATS:
            x = jax.random.uniform(key, shape, dtype=nd)  # in the target precision: stays below 1
        else:
            real = _COMPLEX_PART.get(dtype, "float32")
            x = jax.random.uniform(key, shape, dtype=self.to_native_dtype(real)).astype(nd)
        return self._finish(x, native, nd)

    # -- placement --------------------------------------------------------------------------
    def _native_of(self, x: Any) -> Any:
        """The one JAX device holding ``x``; DeviceMismatchError for multi-device arrays."""
        try:
            ds = x.sharding.device_set
        except AttributeError:
            raise CapabilityError(
                f"jax backend: {type(x).__name__} has no concrete device (a tracer inside jax.jit/"
                "vmap/grad?); call multidev outside traced functions") from None
        if len(ds) != 1:
            if self._devs is None:
                self._enumerate()
            names = ", ".join(sorted(str(self._from_native.get(d, d)) for d in ds))
            raise DeviceMismatchError(
                f"jax backend: this array is sharded or replicated over {len(ds)} devices ({names}) "
                "and so has no single device. Take one piece with x.addressable_shards[i].data, or "
                "gather it onto one device with multidev.copy(x, device) / jax.device_put(x, device).")
        return next(iter(ds))

    def device_of(self, x: Any) -> Device:
        nd = self._native_of(x)
        if self._devs is None:
            self._enumerate()
        dev = self._from_native.get(nd)
        if dev is None:
            raise DeviceNotFoundError(f"jax backend: array lives on {nd}, which is not one of this "
                                      f"process's devices ({', '.join(map(str, self.devices()))})")
        return dev

    def move(self, x: Any, device: Device) -> Any:
        """Accelerator to host through pinned host memory (54 GB/s against 0.7 GB/s for a direct
        ``device_put`` to the CPU on an H200), waiting for the copy; a large CPU array to an
        accelerator staged (waits for ``x``, reads it before returning); else an asynchronous
        ``device_put``."""
        native = self.to_native_device(device)
        if device.kind == "cpu":
            z = self._pinned(x)
            if z is not None:
                return self._land(z, x, native)
            if getattr(x.sharding, "memory_kind", None) not in (None, "device"):  # a host-memory array
                return self._land(x, x, native)
        staged = self._staged_from_host(x, device, native)
        return staged if staged is not None else self._jax.device_put(x, native)

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], Any] | None]:
        """Dispatched, not awaited. To the host: the copy into pinned host memory is dispatched now
        (it runs once x is computed, overlapping with later work); the CPU array is made from it when
        the waiter runs, which returns it (handing the pinned buffer to the CPU device would wait for
        the copy, stalling the caller's dispatch)."""
        native = self.to_native_device(device)
        # Staged only when x is computed already: staging reads x now, which would wait for it.
        staged = self._staged_from_host(x, device, native) if x.is_ready() else None
        if staged is not None:
            return staged, staged.block_until_ready
        z = self._pinned(x) if device.kind == "cpu" else None
        if z is not None:
            def land() -> Any:
                y = self._land(z, x, native)
                y.block_until_ready()
                return y
            return z, land
        if device.kind == "cpu" and getattr(x.sharding, "memory_kind", None) not in (None, "device"):
            y = self._land(x, x, native)
        else:
            y = self._jax.device_put(x, native)

        def waiter() -> None:
            y.block_until_ready()

        return y, waiter

    def start_to_numpy(self, x: Any) -> Callable[[], np.ndarray]:
        """An accelerator array's copy into pinned host memory, dispatched now (it runs once x is
        computed); the callable waits and gives a read-only NumPy view of that fresh copy."""
        z = self._pinned(x)
        if z is None:
            return lambda: self.to_numpy(x)
        return lambda: np.asarray(z)

    def _land(self, z: Any, x: Any, native: Any) -> Any:
        """The pinned copy ``z`` of ``x`` as an ordinary array of the CPU device ``native`` (in its
        default memory kind: XLA refuses to combine a host-memory-space array with CPU arrays):
        NumPy's view of ``z`` (waits for the copy into it) put to that device, which takes an
        aligned buffer without copying. A device-to-device put of ``z`` with the default memory
        kind named ran at 1.2 GB/s on an H200 (a cross-client copy); ``x`` is put directly where
        NumPy cannot read ``z``."""
        try:
            host = np.asarray(z)
        except (ValueError, TypeError, RuntimeError):
            return self._jax.device_put(x, native)
        return self._jax.device_put(host, native)

    def _staged_from_host(self, x: Any, device: Device, native: Any) -> Any:
        """A large host array ``x`` (on a CPU device) put on accelerator ``device`` through the staged
        upload (read before this returns), or None where the plain ``device_put`` applies."""
        if device.kind == "cpu" or x.nbytes < self.staging.threshold or x.ndim == 0 \
                or self._jax.dtypes.issubdtype(x.dtype, self._jax.dtypes.extended):  # PRNG keys: no NumPy view
            return None
        ds = x.sharding.device_set
        if len(ds) != 1 or next(iter(ds)).platform != "cpu":
            return None
        return self._staged_put(np.asarray(x), native)  # a view of the CPU buffer (after x is computed)

    def _pinned(self, x: Any) -> Any:
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
        return self._jax.device_put(x, sh.with_memory_kind("pinned_host"))

    def _has_pinned(self, nd: Any) -> bool:
        hit = self._pinned_kinds.get(nd)
        if hit is None:
            try:
                hit = any(m.kind == "pinned_host" for m in nd.addressable_memories())
            except Exception:  # noqa: BLE001 - memory kinds are not implemented on every plugin
                hit = False
            self._pinned_kinds[nd] = hit
        return hit

    def copy(self, x: Any, device: Device) -> Any:
        # device_put to x's own device may return an alias of x's buffer; may_alias=False forces a copy.
        return self._jax.device_put(x, self.to_native_device(device), may_alias=False)

    def to_numpy(self, x: Any) -> np.ndarray:
        """Waits. Zero-copy and read-only for CPU arrays; for accelerator arrays a read-only view of a
        fresh copy in pinned host memory (PCIe speed), never np.asarray's cached host copy (which goes
        stale when the buffer is shared through DLPack and written by its producer)."""
        z = self._pinned(x)
        if z is not None:
            return np.asarray(z)
        ds = x.sharding.device_set
        if len(ds) == 1:
            nd = next(iter(ds))
            if nd.platform != "cpu":  # an accelerator without a pinned memory kind: a fresh device copy
                return np.asarray(self._jax.device_put(x, nd, may_alias=False))
        return np.asarray(x)

    def synchronize(self, device: Device | None) -> None:
        """JAX has no per-device barrier: wait for every live array (on ``device`` when given), plus
        ordered effects (``jax.effects_barrier``) when ``device`` is None."""
        jax = self._jax
        if self._devs is None:
            self._enumerate()
        platforms = sorted({nd.platform for nd in self._to_native.values()})
        target = None if device is None else self.to_native_device(device)
        if device is None:
            jax.effects_barrier()
        arrays: list[Any] = []
        for p in platforms:
            for a in jax.live_arrays(p):
                if target is None or target in a.sharding.device_set:
                    arrays.append(a)
        if not arrays:
            return
        try:
            jax.block_until_ready(arrays)
            return
        except Exception:  # noqa: BLE001 - any failure: find the failing array below
            pass
        # Some array failed: find it, and raise each asynchronous error once (not on every later call).
        self._reported = [r for r in self._reported if r() is not None]
        for a in arrays:
            try:
                a.block_until_ready()
            except Exception:
                if any(r() is a for r in self._reported):
                    continue
                self._reported.append(weakref.ref(a))
                raise

    def wait(self, x: Any) -> None:
        x.block_until_ready()  # raises the asynchronous error behind x, if any

    def tensor_wait_fn(self) -> Callable[[Any], Any]:
        """wait(x) with no adapter frame: the array class's own method (read once a tensor exists,
        so JAX's backends are not started early)."""
        fn: Callable[[Any], Any] = type(self._jnp.zeros(())).block_until_ready
        return fn

    # -- arithmetic for collectives ---------------------------------------------------------
    def combine(self, op: str, a: Any, b: Any) -> Any:
        jnp = self._jnp
        fn = {"sum": jnp.add, "max": jnp.maximum, "min": jnp.minimum, "prod": jnp.multiply}[op]
        self.same_device(op, (a, b))
        return fn(a, b)

    def divide(self, x: Any, n: int) -> Any:
        return (x / n).astype(x.dtype)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self._jnp.reshape(x, shape)  # JAX has no views: a new (immutable) array

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        xs = list(xs)
        self.same_device("concat", xs)
        return self._jnp.concatenate(xs, axis=axis)

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        cuts = np.cumsum([int(s) for s in sizes])[:-1].tolist()
        return list(self._jnp.split(x, cuts, axis=axis))

    def assign(self, dst: Any, src: Any) -> None:
        raise CapabilityError(
            "jax backend: JAX arrays are immutable and cannot be written in place. Rebind the result "
            "instead, e.g. xs = multidev.allreduce(xs) (inplace=False) and x = xs[i], or use x.at[...].set(...)")

    # -- interchange ------------------------------------------------------------------------
    def export_dlpack(self, x: Any) -> Any:
        if len(x.sharding.device_set) != 1:
            self._native_of(x)  # a multi-device array has no single buffer: DeviceMismatchError
        if x.dtype not in self._dlpack_dtypes:
            if not self._jax.dlpack.is_supported_dtype(x.dtype):
                raise CapabilityError(f"jax backend: DLPack cannot carry dtype {x.dtype}")
            self._dlpack_dtypes.add(x.dtype)
        return x  # jax.Array has __dlpack__ and __dlpack_device__

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        """Zero-copy or CapabilityError: JAX copies CPU buffers that are not 64-byte aligned and
        turns 64-bit tensors into 32-bit copies without x64; both are refused here. A host buffer
        becomes a view on the virtual CPU device ``device``."""
        jax = self._jax
        x64 = bool(jax.config.jax_enable_x64)
        if not x64 and type(obj).__name__ != "PyCapsule":
            try:
                src = canonical_dtype(obj.dtype)
            except Exception:  # noqa: BLE001 - no readable dtype: checked from the capsule below
                src = None
            if src in _X64_DTYPES:
                raise CapabilityError(f"jax backend: cannot import a {src} tensor without x64 (it "
                                      f"would become a 32-bit copy); {_x64_hint()}")
        native = self.to_native_device(device)
        if device.kind != "cpu" and not self._strides_read_as_row_major and hasattr(obj, "__dlpack__"):
            return self._import_accelerator(obj, device)
        cpu_id = getattr(native, "local_hardware_id", None) if device.kind == "cpu" else None
        prod = _Producer(obj, cpu_id, inspect=device.kind == "cpu" or self._strides_read_as_row_major)
        if not x64 and prod.code_bits in _DL_X64:
            raise CapabilityError(f"jax backend: cannot import a 64-bit DLPack tensor without x64 "
                                  f"(it would become a 32-bit copy); {_x64_hint()}")
        ctx: Any = contextlib.nullcontext()
        dev = getattr(obj, "device", None)
        if type(obj).__module__.startswith("torch") and getattr(dev, "type", None) == "cuda" \
                and getattr(dev, "index", None) != sys.modules["torch"].cuda.current_device():
            # torch exports a CUDA tensor only while its device is torch's current device.
            ctx = sys.modules["torch"].cuda.device(dev)
        try:
            with ctx:
                y = jax.dlpack.from_dlpack(prod)
        except (TypeError, ValueError, BufferError, RuntimeError) as e:
            raise CapabilityError(f"jax backend cannot import this DLPack tensor "
                                  f"({type(obj).__name__}): {e}") from e
        if not prod.row_major:
            # jax 0.7 reads a strided buffer as if it were row-major (wrong values); newer jax copies.
            raise CapabilityError("jax backend: JAX shares only row-major DLPack buffers; this one is "
                                  "strided (a transpose or slice). Make it contiguous first.")
        if prod.address is not None and y.size > 0 and y.unsafe_buffer_pointer() != prod.address:
            raise CapabilityError(
                "jax backend: JAX copied this DLPack buffer instead of sharing it (JAX needs 64-byte "
                "aligned CPU buffers); use multidev.asarray for an explicit copy")
        if self.device_of(y) != device:
            raise CapabilityError(f"jax backend: a DLPack buffer of {device} arrived on "
                                  f"{self.device_of(y)}; moving it would copy, so JAX cannot share it there")
        return y

    def _import_accelerator(self, obj: Any, device: Device) -> Any:
        """The accelerator path of import_dlpack: JAX passes its stream to the producer (ordered on
        the device, no host wait) and places the view on the producer's device; no header reads."""
        torch = sys.modules.get("torch")
        ctx: Any = contextlib.nullcontext()
        if torch is not None and isinstance(obj, torch.Tensor) and self._torch_gpus(torch) > 1:
            dev = obj.device  # torch exports a CUDA tensor only from its current device
            if dev.index != torch.cuda.current_device():
                ctx = torch.cuda.device(dev)
        try:
            with ctx:
                y = self._jax.dlpack.from_dlpack(obj)
        except (TypeError, ValueError, BufferError, RuntimeError) as e:
            raise CapabilityError(f"jax backend cannot import this DLPack tensor ({type(obj).__name__}): {e}") from e
        return y

    def _torch_gpus(self, torch: Any) -> int:
        """How many CUDA devices torch has (read once; with one, it is always torch's current)."""
        n = self.__dict__.get("_n_torch_gpus")
        if n is None:
            n = self.__dict__["_n_torch_gpus"] = int(torch.cuda.device_count())
        return n

    @functools.cached_property
    def _strides_read_as_row_major(self) -> bool:
        """jax < 0.8 reads a strided DLPack buffer as if it were row-major: headers must be checked."""
        try:
            return tuple(int(p) for p in self.version().split(".")[:2]) < (0, 8)
        except ValueError:
            return True

    # -- native fast paths ------------------------------------------------------------------
    def _allreduce_fn(self, natives: tuple, block: tuple[int, ...], dtype: Any, op: str) -> tuple:
        """A compiled shard_map over ``natives`` reducing one ``block``-shaped shard per device."""
        key = (natives, block, str(dtype), op)
        hit = self._allreduce_cache.get(key)
        if hit is not None:
            return hit
        jax, jnp = self._jax, self._jnp
        lax = jax.lax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        n = len(natives)
        name = canonical_dtype(dtype)
        is_bool, is_complex = name == "bool", name.startswith("complex")

        def fold(fn: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
            def body(a: Any) -> Any:  # same left-to-right order as the naive algorithm
                g = lax.all_gather(a, "i")
                acc = g[0]
                for k in range(1, n):
                    acc = fn(acc, g[k])
                return acc
            return body

        if op == "sum":
            body = (lambda a: lax.pmax(a, "i")) if is_bool else (lambda a: lax.psum(a, "i"))
        elif op in ("max", "min"):
            fn = jnp.maximum if op == "max" else jnp.minimum
            prim = lax.pmax if op == "max" else lax.pmin
            # XLA has no complex max/min all-reduce (UNIMPLEMENTED): fold over an all_gather.
            body = fold(fn) if is_complex else _reducer(prim)
        else:  # prod: there is no lax.pprod
            body = (lambda a: lax.pmin(a, "i")) if is_bool else fold(jnp.multiply)
        mesh = Mesh(np.array(natives, dtype=object), ("i",))
        sharding = NamedSharding(mesh, PartitionSpec("i"))
        smap = jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec("i"),
                             out_specs=PartitionSpec("i"))
        gshape = (block[0] * n,) + tuple(block[1:])
        compiled = jax.jit(smap).lower(jax.ShapeDtypeStruct(gshape, dtype, sharding=sharding)).compile()
        with self._lock:
            if len(self._allreduce_cache) >= _CACHE_MAX:
                self._allreduce_cache.clear()
            self._allreduce_cache[key] = (compiled, sharding)
        return compiled, sharding

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        """``psum``/``pmax``/``pmin`` under ``jax.shard_map`` over the inputs' devices, compiled once
        per (devices, shape, dtype, op). The per-device inputs are the shards of one global array
        (no copy); result ``i`` is the output shard on input ``i``'s device.

        Devices of several platforms (CPUs and GPUs) cannot share one mesh: each platform reduces
        natively, the partial results are combined on the first input's device and copied back out.
        """
        jax = self._jax
        xs = list(xs)
        if op not in _ALLREDUCE_OPS:
            raise CapabilityError(f"jax backend: native allreduce has no op {op!r}; use one of "
                                  f"{', '.join(_ALLREDUCE_OPS)}")
        natives = tuple(self._native_of(x) for x in xs)
        shape, dtype = tuple(xs[0].shape), xs[0].dtype
        if 0 in shape:  # nothing to reduce (and XLA lays out empty shards unpredictably)
            return [self._jnp.empty(shape, dtype=dtype, device=nd) for nd in natives]
        groups: dict[str, list[int]] = {}
        for i, nd in enumerate(natives):
            groups.setdefault(nd.platform, []).append(i)
        if len(groups) == 1:
            return self._mesh_allreduce(xs, natives, op)
        home = natives[0]
        acc = None
        for idx in groups.values():
            part = self._mesh_allreduce([xs[i] for i in idx], tuple(natives[i] for i in idx), op)[0]
            part = part if part.devices() == {home} else jax.device_put(part, home)
            acc = part if acc is None else self.combine(op, acc, part)
        return [acc if nd == home else jax.device_put(acc, nd) for nd in natives]

    def _mesh_allreduce(self, xs: list[Any], natives: tuple, op: str) -> list[Any]:
        """The shard_map allreduce over devices of one platform (see native_allreduce)."""
        shape, dtype = tuple(xs[0].shape), xs[0].dtype
        scalar = len(shape) == 0
        block = (1,) if scalar else shape
        pieces = [x.reshape(1) for x in xs] if scalar else xs
        compiled, sharding = self._allreduce_fn(natives, block, dtype, op)
        if natives[0].platform == "cpu":
            # XLA:CPU starts each device's part of a collective as soon as that device's input is
            # ready, and aborts the process when the others have not joined within its rendezvous
            # timeout (15 s on jaxlib 0.7, 60 s on 0.10): an input still being computed (uneven
            # work before the allreduce) must be waited for here, on the host.
            for x in pieces:
                x.block_until_ready()
        gshape = (block[0] * len(xs),) + tuple(block[1:])
        glob = self._jax.make_array_from_single_device_arrays(gshape, sharding, pieces)
        out = compiled(glob)
        by_dev = {s.device: s.data for s in out.addressable_shards}
        res = [by_dev[nd] for nd in natives]
        return [r.reshape(()) for r in res] if scalar else res

    # -- optional extensions: training and compilation --------------------------------------
    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        jax = self._jax
        vg = self._grad_fns.get(fn) if _weakrefable(fn) else None
        if vg is None:
            # The cached function holds fn weakly, so the cache entry goes when fn does.
            ref: Callable[[], Any] = weakref.ref(fn) if _weakrefable(fn) else (lambda: fn)
            vg = jax.value_and_grad(lambda ps, *a: self._jnp.sum(ref()(list(ps), *a)))
            try:
                jitted = jax.jit(vg)
                value, grads = jitted(list(params), *args)  # runs where its committed inputs live
            except jax.errors.ConcretizationTypeError:
                jitted = vg  # data-dependent Python control flow: differentiate op by op
                value, grads = vg(list(params), *args)
            if _weakrefable(fn):
                self._grad_fns[fn] = jitted
            return value, list(grads)
        value, grads = vg(list(params), *args)
        return value, list(grads)

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        return {"jax.jit": True, "eager": True}

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        if route == "eager":
            return fn
        jitted = self._jax.jit(fn)
        try:
            jitted.lower(*args)  # trace now: a function jit cannot trace fails here, typed
        except TypeError as e:  # jax.errors.ConcretizationTypeError and the other tracing errors
            raise CapabilityError(f"jax backend: jax.jit cannot trace this function: {type(e).__name__}: "
                                  f"{str(e).strip().splitlines()[0][:200]}") from e
        return jitted


def _weakrefable(fn: Any) -> bool:
    try:
        weakref.ref(fn)
    except TypeError:
        return False
    return True
