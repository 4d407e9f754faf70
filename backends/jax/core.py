"""The core protocol for JAX: identity, devices, dtypes, creation, placement, synchronize and its
hooks, host copies, and the arithmetic the portable collectives are built from.

Blocking moves and host copies of accelerator arrays go through the transfer machinery (pinned
host copies, staged uploads) of :mod:`.transfers`.
"""
from __future__ import annotations

import hashlib
import math
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
    canonical_dtype,
    numpy_dtype,
)

from ._common import X64_DTYPES, x64_hint

_ENV_CPU = "MULTIDEV_JAX_CPU_DEVICES"
_XLA_FLAG = "--xla_force_host_platform_device_count"
_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
_COMPLEX_PART = {"complex64": "float32", "complex128": "float64"}


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


class JaxCore(BaseBackend):
    """The core protocol of the JAX backend; the state every concern uses is made here."""

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

        self.jax = jax
        self.jnp = jnp
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
        self._reported: list[weakref.ref] = []  # failed arrays whose error synchronize already raised
        self._sharding_devs: dict[Any, Device] = {}  # single-device sharding -> its Device (device_of)
        #: JAX's one-device sharding class, whose ``_device`` device_of reads first (see there)
        self._single = getattr(getattr(jax, "sharding", None), "SingleDeviceSharding", None)
        self._dtype_names: dict[Any, str] = {}  # NumPy dtype -> canonical name (dtype_of)
        #: Pageable uploads to an accelerator from this size up go in pieces, one device_put of their
        #: list (multidev.adapter.split_pieces), of the size measured fastest (docs/transfers.md).
        self.staging = StagingPlan(chunk=16 << 20, threshold=32 << 20)

    def _enumerate(self) -> None:
        """Read JAX's devices once (this initializes JAX's backends)."""
        with self._lock:
            if self._devs is not None:
                return
            jax = self.jax
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
        self.check_virtual_devices(sum(1 for d in devs if d.kind == "cpu"))

    # -- identity ---------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        """Recomputed when ``jax_enable_x64`` changes: without it 64-bit dtypes are not listed."""
        x64 = bool(self.jax.config.jax_enable_x64)
        caps = self._caps.get(x64)
        if caps is None:
            self._enumerate()
            dtypes = frozenset(DTYPES) if x64 else frozenset(DTYPES) - X64_DTYPES
            gpus = [nd for d, nd in self._to_native.items() if d.kind == "gpu"]
            pinned = False
            for nd in gpus:
                try:
                    pinned = pinned or any(m.kind == "pinned_host" for m in nd.addressable_memories())
                except Exception:  # noqa: BLE001 - memory kinds are not implemented on every plugin
                    pass
            caps = Capabilities(mutable=False, async_execution=True, pinned_memory=pinned,
                                dlpack_streams=bool(gpus),
                                dtypes=dtypes, raises_on_mixed_devices=True)
            self._caps[x64] = caps
        return caps

    def tensor_types(self) -> tuple[type, ...]:
        return (self.jax.Array,)

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
        if not isinstance(obj, self.jax.Device):
            return None
        if self._devs is None:
            self._enumerate()
        return self._from_native.get(obj)  # by platform and order within it, not global id

    # -- dtypes -----------------------------------------------------------------------------
    def to_native_dtype(self, dtype: str) -> Any:
        if dtype not in self.capabilities.dtypes:
            if dtype in X64_DTYPES:
                raise CapabilityError(f"jax backend: dtype {dtype!r} needs 64-bit mode; {x64_hint(dtype)}")
            raise CapabilityError(f"jax backend: unsupported dtype {dtype!r}")
        return self.jnp.dtype(numpy_dtype(dtype))

    def dtype_of(self, x: Any) -> str:
        dt = x.dtype
        name = self._dtype_names.get(dt)
        if name is None:
            name = self._dtype_names[dt] = canonical_dtype(dt)
        return name

    # -- creation ---------------------------------------------------------------------------
    def _finish(self, x: Any, native: Any, nd: Any) -> Any:
        """``x`` committed to ``native`` with dtype ``nd``, or a CapabilityError."""
        sh = x.sharding
        if not (x.committed and len(sh.device_set) == 1 and native in sh.device_set):
            x = self.jax.device_put(x, native)  # an uncommitted or misplaced result: commit it
        if x.dtype != nd:  # JAX canonicalizes 64-bit types away when x64 is off
            raise CapabilityError(f"jax backend produced {x.dtype}, not {nd}; {x64_hint()}")
        return x

    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        nd, native = self.to_native_dtype(dtype), self.to_native_device(device)
        return self._finish(self.jnp.full(shape, value, dtype=nd, device=native), native, nd)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        nd, native = self.to_native_dtype(dtype), self.to_native_device(device)
        return self._finish(self.jnp.empty(shape, dtype=nd, device=native), native, nd)

    def arange(self, start: Any, stop: Any, step: Any, dtype: str, device: Device) -> Any:
        nd, native = self.to_native_dtype(dtype), self.to_native_device(device)
        # jnp.arange's values differ from NumPy's (jax 0.10: int dtype with float bounds gives
        # zeros; low-precision floats round differently): compute on the host with NumPy.
        host = np.arange(start, stop, step, dtype=numpy_dtype(dtype))
        return self._finish(self.jax.device_put(host, native), native, nd)

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        native = self.to_native_device(device)
        nd = None if dtype is None else self.to_native_dtype(dtype)
        if isinstance(obj, np.ndarray) and (obj.dtype == nd or obj.dtype.kind in "biufc"):
            # device_put, JAX's fast upload (several times jnp.array's), of a buffer the caller may
            # write again once this returns (transfers.put_host).
            x = self.transfers.put_host(obj, native, nd)
            return self._finish(x, native, x.dtype if nd is None else nd)
        x = self.jnp.array(obj, dtype=nd, copy=True, device=native)
        if (not isinstance(obj, (list, tuple, int, float, complex, np.generic, self.jax.Array))
                and not (isinstance(obj, np.ndarray) and nd is not None and obj.dtype != nd)):
            # jnp.array copies a host buffer it shares with obj (another framework's CPU tensor
            # through __array__, a NumPy array of a dtype such as bfloat16 kept) after it returns, as
            # device_put reads one: wait for that. (Python data and NumPy arrays cast to nd are put
            # from a fresh host array.)
            x.block_until_ready()
        if nd is None:
            nd = x.dtype
            if x.weak_type:  # jnp.array(3.0) is weakly typed; give it a definite dtype
                x = self.jnp.array(x, dtype=nd, copy=False, device=native)
        return self._finish(x, native, nd)

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        jax = self.jax
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
        sh = getattr(x, "sharding", None)
        # A one-device sharding's device read directly: looking the sharding up runs its Python
        # __hash__ and __eq__, which cost more than this whole read. (Its memory kind is no part of the
        # device; should JAX rename the attribute, the public read below answers.)
        if sh.__class__ is self._single:
            dev = self._from_native.get(getattr(sh, "_device", None))
            if dev is not None:
                return dev
        try:
            dev = self._sharding_devs.get(sh)
        except TypeError:  # an unhashable sharding: read it the long way
            dev = sh = None
        if dev is not None:  # a sharding seen before (equal shardings: one device, one memory kind)
            return dev
        nd = self._native_of(x)
        if self._devs is None:
            self._enumerate()
        dev = self._from_native.get(nd)
        if dev is None:
            raise DeviceNotFoundError(f"jax backend: array lives on {nd}, which is not one of this "
                                      f"process's devices ({', '.join(map(str, self.devices()))})")
        if sh is not None and len(self._sharding_devs) < 1024:
            self._sharding_devs[sh] = dev
        return dev

    def commit_resident(self, x: Any) -> Any:
        """``x`` committed to its own device: ``x`` itself where it is committed already, else a new
        ``jax.Array`` over the same buffer (``device_put`` to the device it is on copies nothing;
        about 20 us). ``jit`` keys its cache on committedness, so a step called with an uncommitted
        array and then with its own (committed) outputs compiles twice; ``jax.device_put`` commits
        too."""
        if x.committed:
            return x
        return self.jax.device_put(x, self._native_of(x))

    def move(self, x: Any, device: Device) -> Any:
        """Accelerator to host through pinned host memory (many times faster than a direct
        ``device_put`` to the CPU; docs/transfers.md), waiting for the copy; a large CPU array to an
        accelerator staged (waits for ``x``, reads it before returning); else an asynchronous
        ``device_put``."""
        native = self.to_native_device(device)
        y = self._routed_move(x, device, native)
        return y if y is not None else self.jax.device_put(x, native)

    def move_all(self, xs: list[Any], device: Device) -> list[Any]:
        """:meth:`move` of each of ``xs``: the plain ``device_put``s in one call (JAX moves a list in
        one dispatch, for a fraction of a call's cost each), the pinned and staged routes one by one; a
        ``move`` redefined below this class (a subclass's, a patch) one by one, never bypassed."""
        if self._redefines("move", JaxCore):
            return [self.move(x, device) for x in xs]
        native = self.to_native_device(device)
        to_host = device.kind == "cpu"
        threshold = self.staging.threshold
        if not to_host:  # (a model's parameters to an accelerator, mostly: one device_put of the list, as it is;
            prod = math.prod  # quick's test below for an accelerator, without a call a tensor)
            for x in xs:
                if prod(x.shape) * 16 >= threshold:
                    break
            else:
                return list(self.jax.device_put(xs, native))
        single, hosts = self._single, self._from_native

        def quick(x: Any) -> bool:
            # What takes no route is told without the route's calls: to a host device, a one-device
            # array on a host device in its default memory (no pinned copy, nothing to land); to an
            # accelerator, an array too small to stage (16 bytes an element at most).
            if to_host:
                sh = x.sharding
                return sh.__class__ is single and sh.memory_kind in (None, "device") and (
                    (d := hosts.get(getattr(sh, "_device", None))) is not None and d.kind == "cpu")
            return math.prod(x.shape) * 16 < threshold

        if all(map(quick, xs)):  # (a model's parameters, mostly: one device_put of the list, as it is)
            return list(self.jax.device_put(xs, native))
        if not to_host:
            # The plain puts first, which JAX starts without waiting (a JAX array's put returns before its
            # copy), then the staged uploads (their sources JAX arrays' host buffers, which nothing
            # writes): the plain copies need not queue behind the staged ones.
            stage = self.transfers.stages
            views = [None if quick(x) else stage(x, device) for x in xs]
            moved: list[Any] = [None] * len(xs)
            plain_at = [i for i, v in enumerate(views) if v is None]
            if plain_at:
                for i, y in zip(plain_at, self.jax.device_put([xs[i] for i in plain_at], native), strict=True):
                    moved[i] = y
            for i, v in enumerate(views):
                if v is not None:
                    moved[i] = self.transfers.staged_put(v, native)
            return moved
        out: list[Any] = [None] * len(xs)
        at: list[int] = []
        plain: list[Any] = []
        for i, x in enumerate(xs):
            if quick(x) or (y := self._routed_move(x, device, native)) is None:
                at.append(i)
                plain.append(x)
            else:
                out[i] = y
        if plain:
            for i, y in zip(at, self.jax.device_put(plain, native), strict=True):
                out[i] = y
        return out

    def _routed_move(self, x: Any, device: Device, native: Any) -> Any:
        """:meth:`move` where it is not a plain ``device_put`` (accelerator to host through pinned
        memory, a host-memory array landed, a large host array staged), else None."""
        if device.kind == "cpu":
            z = self.transfers.pinned(x)
            if z is not None:
                return self.transfers.land(z, x, native)
            if getattr(x.sharding, "memory_kind", None) not in (None, "device"):  # a host-memory array
                return self.transfers.land(x, x, native)
            return None
        return self.transfers.staged_from_host(x, device, native)

    def copy(self, x: Any, device: Device) -> Any:
        # device_put to x's own device may return an alias of x's buffer; may_alias=False forces a copy.
        return self.jax.device_put(x, self.to_native_device(device), may_alias=False)

    def to_numpy(self, x: Any) -> np.ndarray:
        """Waits. Zero-copy and read-only for CPU arrays; for accelerator arrays a read-only view of a
        fresh copy in pinned host memory (PCIe speed), never np.asarray's cached host copy (which goes
        stale when the buffer is shared through DLPack and written by its producer)."""
        z = self.transfers.pinned(x)
        if z is not None:
            return np.asarray(z)
        ds = x.sharding.device_set
        if len(ds) == 1:
            nd = next(iter(ds))
            if nd.platform != "cpu":  # an accelerator without a pinned memory kind: a fresh device copy
                return np.asarray(self.jax.device_put(x, nd, may_alias=False))
        return np.asarray(x)

    def synchronize(self, device: Device | None) -> None:
        """JAX has no per-device barrier. Work whose results were dropped is waited for through
        markers: a tiny computation queued behind the work on ``device`` (on every device when
        None), since JAX runs a device's computations in order; on CPUs, programs spanning several
        devices run in one more queue, and a marker over two CPU devices waits behind it once such
        a program is loaded. Then every live array (on ``device`` when given), which raises the
        asynchronous errors they carry; ordered effects (``jax.effects_barrier``) too when
        ``device`` is None."""
        jax = self.jax
        if self._devs is None:
            self._enumerate()
        target = None if device is None else self.to_native_device(device)
        if device is None:
            jax.effects_barrier()
        jax.block_until_ready(self._markers(target))
        arrays: list[Any] = []
        if target is None:
            for p in sorted({nd.platform for nd in self._to_native.values()}):
                arrays.extend(jax.live_arrays(p))
        elif sum(nd.platform == target.platform for nd in self._to_native.values()) == 1:
            arrays = jax.live_arrays(target.platform)  # the platform's one device: no filter needed
        else:
            arrays = [a for a in jax.live_arrays(target.platform) if target in a.sharding.device_set]
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

    def _markers(self, target: Any) -> list[Any]:
        """Marker computations queued now behind the work queued so far on native device ``target``
        (every device when None), for ``synchronize`` to wait for: a scalar ``a + 1`` on each device,
        and on CPUs, where programs spanning several devices run in a queue of their own (ordered
        across device sets), one over two CPU devices once such a program is loaded."""
        inputs = self.__dict__.get("_marker_inputs")
        if inputs is None:
            with self._lock:
                inputs = self.__dict__.get("_marker_inputs")
                if inputs is None:
                    inputs = self.__dict__["_marker_inputs"] = self._make_marker_inputs()
        fn, per_device, multi = inputs
        if target is None:
            out = [fn(a) for a in per_device.values()]
        else:
            out = [fn(per_device[target])]
        if multi is not None and (target is None or target.platform == "cpu") and self._multi_device_programs(multi):
            out.append(fn(multi))
        return out

    def _make_marker_inputs(self) -> tuple[Callable[[Any], Any], dict[Any, Any], Any]:
        """The markers' jitted function, a committed int32 scalar per native device, and an array
        split over the first two CPU devices (None with one CPU device)."""
        jax = self.jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        per_device = {nd: jax.device_put(np.zeros((), np.int32), nd) for nd in self._to_native.values()}
        cpus = [nd for d, nd in self._to_native.items() if d.kind == "cpu"][:2]
        multi = None
        if len(cpus) == 2:
            sharding = NamedSharding(Mesh(np.array(cpus), ("d",)), PartitionSpec("d"))
            multi = jax.make_array_from_single_device_arrays(
                (2,), sharding, [jax.device_put(np.zeros((1,), np.int32), nd) for nd in cpus])
        return jax.jit(lambda a: a + 1), per_device, multi

    def _multi_device_programs(self, multi: Any) -> bool:
        """Whether a program spanning several CPU devices is loaded (work it queued stays loaded
        until done), so the multi-device marker is needed: once one is seen, always. The CPU
        client's executables are listed again only when their number changed."""
        seen = self.__dict__.get("_multi_seen")
        if seen is True:
            return True
        try:
            live = next(iter(multi.sharding.device_set)).client.live_executables()
        except Exception:  # noqa: BLE001 - a JAX without the listing: assume such programs exist
            self.__dict__["_multi_seen"] = True
            return True
        if seen == len(live):
            return False
        if any(len(e.local_devices()) > 1 for e in live):
            self.__dict__["_multi_seen"] = True
            return True
        self.__dict__["_multi_seen"] = len(live)
        return False

    def wait(self, x: Any) -> None:
        x.block_until_ready()  # raises the asynchronous error behind x, if any

    def tensor_wait_fn(self) -> Callable[[Any], Any]:
        """wait(x) with no adapter frame: the array class's own method (read once a tensor exists,
        so JAX's backends are not started early)."""
        if self._redefines("wait", JaxCore):
            return super().tensor_wait_fn()
        fn: Callable[[Any], Any] = type(self.jnp.zeros(())).block_until_ready
        return fn

    # -- arithmetic for collectives ---------------------------------------------------------
    def combine(self, op: str, a: Any, b: Any) -> Any:
        jnp = self.jnp
        fn = {"sum": jnp.add, "max": jnp.maximum, "min": jnp.minimum, "prod": jnp.multiply}[op]
        self.same_device(op, (a, b))
        return fn(a, b)

    def divide(self, x: Any, n: int) -> Any:
        return (x / n).astype(x.dtype)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self.jnp.reshape(x, shape)  # JAX has no views: a new (immutable) array

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        xs = list(xs)
        self.same_device("concat", xs)
        return self.jnp.concatenate(xs, axis=axis)

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        cuts = np.cumsum([int(s) for s in sizes])[:-1].tolist()
        return list(self.jnp.split(x, cuts, axis=axis))

    def assign(self, dst: Any, src: Any) -> None:
        raise CapabilityError(
            f"{self.name} backend: JAX arrays are immutable and cannot be written in place. Rebind the result "
            "instead, e.g. xs = multidev.allreduce(xs) (inplace=False) and x = xs[i], or use x.at[...].set(...)")
