"""DLPack interchange for JAX (:class:`~multidev.adapter.SupportsDLPack`): zero-copy or
CapabilityError, a host buffer relabelled with the virtual CPU device asked for."""
from __future__ import annotations

import functools
from typing import Any

from multidev.adapter import CapabilityError, Concern, Device, SupportsDLPack, canonical_dtype, dlpack_info

from ._common import X64_DTYPES, x64_hint
from .core import JaxCore

# DLPack (code, bits) pairs of the 64-bit dtypes JAX holds only under x64 (dlpack.h DLDataTypeCode).
_DL_X64 = {(0, 64), (1, 64), (2, 64), (5, 128)}


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


class JaxDLPack(Concern, SupportsDLPack):
    """``jax.Array`` out as it is; in through ``jax.dlpack.from_dlpack``, refused where JAX would copy."""

    core: JaxCore
    #: every host export is compact row-major and never flagged read-only (XLA's buffers have no
    #: views), so convert need not read each one's header (checked by the conformance suite)
    plain_host_exports = True

    def __init__(self, core: JaxCore) -> None:
        super().__init__(core)
        self._dlpack_dtypes: set[Any] = set()  # dtypes DLPack was seen to carry

    def export_dlpack(self, x: Any) -> Any:
        if len(x.sharding.device_set) != 1:
            self.core._native_of(x)  # a multi-device array has no single buffer: DeviceMismatchError
        if x.dtype not in self._dlpack_dtypes:
            if not self.core.jax.dlpack.is_supported_dtype(x.dtype):
                raise CapabilityError(f"jax backend: DLPack cannot carry dtype {x.dtype}")
            self._dlpack_dtypes.add(x.dtype)
        return x  # jax.Array has __dlpack__ and __dlpack_device__

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        """Zero-copy or CapabilityError: JAX copies CPU buffers that are not 64-byte aligned and
        turns 64-bit tensors into 32-bit copies without x64; both are refused here. A host buffer
        becomes a view on the virtual CPU device ``device``."""
        jax = self.core.jax
        x64 = bool(jax.config.jax_enable_x64)
        src = None
        if type(obj).__name__ != "PyCapsule":
            try:
                src = canonical_dtype(obj.dtype)
            except Exception:  # noqa: BLE001 - no readable dtype: checked from the capsule below
                src = None
            if not x64 and src in X64_DTYPES:
                raise CapabilityError(f"jax backend: cannot import a {src} tensor without x64 (it "
                                      f"would become a 32-bit copy); {x64_hint(src)}")
        native = self.core.to_native_device(device)
        if device.kind != "cpu" and not self._strides_read_as_row_major and hasattr(obj, "__dlpack__"):
            return self._import_accelerator(obj, device)
        cpu_id = getattr(native, "local_hardware_id", None) if device.kind == "cpu" else None
        if device.kind == "cpu" and src is not None and not self._strides_read_as_row_major:
            return self._import_host(obj, device, cpu_id, src)
        prod = _Producer(obj, cpu_id, inspect=device.kind == "cpu" or self._strides_read_as_row_major)
        if not x64 and prod.code_bits in _DL_X64:
            raise CapabilityError(f"jax backend: cannot import a 64-bit DLPack tensor without x64 "
                                  f"(it would become a 32-bit copy); {x64_hint()}")
        try:
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
        if self.core.device_of(y) != device:
            raise CapabilityError(f"jax backend: a DLPack buffer of {device} arrived on "
                                  f"{self.core.device_of(y)}; moving it would copy, so JAX cannot share it there")
        return y

    def _import_host(self, obj: Any, device: Device, cpu_id: int | None, src: str) -> Any:
        """The host path of import_dlpack for a producer object of known dtype on JAX >= 0.8: JAX
        itself refuses what it would copy (``copy=False``: an unaligned buffer raises, a strided one
        is refused), so the capsule's header is not read a second time; the dtype and the device of
        the result are checked (JAX without x64 narrows 64-bit types, refused above)."""
        fast = self._host_call
        if fast is not None and int(obj.__dlpack_device__()[0]) == 1:  # kDLCPU (not pinned: kDLCUDAHost)
            y = None
            try:
                capsule, dev = obj.__dlpack__(), self.core.to_native_device(device)
            except Exception:  # noqa: BLE001 - the producer's own refusal: classified by the public call below
                capsule = None
            if capsule is not None:
                try:
                    y = fast(capsule, dev)
                except TypeError:  # not the call this jaxlib was seen to take: the public one from now on
                    self.__dict__["_host_call"] = None
                except Exception:  # noqa: BLE001 - what JAX refuses (a copy, a stride), classified below
                    pass
            if y is not None:
                if self.core.dtype_of(y) != src:
                    raise CapabilityError(f"jax backend: a {src} DLPack buffer arrived as {y.dtype} (a copy); "
                                          f"{x64_hint(src)}")
                return y  # on the device asked for: it was passed
        try:
            y = self.core.jax.dlpack.from_dlpack(_Producer(obj, cpu_id, inspect=False), copy=False)
        except ValueError as e:
            if "copy" in str(e):
                raise CapabilityError(
                    "jax backend: JAX would copy this DLPack buffer instead of sharing it (JAX needs 64-byte "
                    "aligned CPU buffers); use multidev.asarray for an explicit copy") from e
            raise CapabilityError(f"jax backend cannot import this DLPack tensor ({type(obj).__name__}): {e}") from e
        except (TypeError, BufferError, RuntimeError) as e:
            raise CapabilityError(f"jax backend cannot import this DLPack tensor ({type(obj).__name__}): {e}") from e
        if self.core.dtype_of(y) != src:
            raise CapabilityError(f"jax backend: a {src} DLPack buffer arrived as {y.dtype} (a copy); "
                                  f"{x64_hint(src)}")
        if self.core.device_of(y) != device:
            raise CapabilityError(f"jax backend: a DLPack buffer of {device} arrived on "
                                  f"{self.core.device_of(y)}; moving it would copy, so JAX cannot share it there")
        return y

    @functools.cached_property
    def _host_call(self) -> Any:
        """``(capsule, jax device) -> jax.Array``: jaxlib's C import of a host DLPack buffer, zero-copy
        or raising, which ``jax.dlpack.from_dlpack`` calls after ~40 us of Python on a CPU (a stream
        probe that fails there, a no-op ``asarray``); None where this jaxlib's is not the one known
        (extension version 467 on: ``(capsule, device, stream, copy, device type)``); the public call
        then, as after a TypeError from it."""
        try:
            from jax._src.lib import _jax, jaxlib_extension_version

            call = _jax.dlpack_managed_tensor_to_buffer
        except (ImportError, AttributeError):
            return None
        if not isinstance(jaxlib_extension_version, int) or jaxlib_extension_version < 467:
            return None
        return lambda capsule, dev: call(capsule, dev, None, False, 1)  # no stream, no copy, kDLCPU

    def _import_accelerator(self, obj: Any, device: Device) -> Any:
        """The accelerator path of import_dlpack: JAX passes its stream to the producer (ordered on
        the device, no host wait) and places the view on the producer's device; no header reads."""
        try:
            y = self.core.jax.dlpack.from_dlpack(obj)
        except (TypeError, ValueError, BufferError, RuntimeError) as e:
            raise CapabilityError(f"jax backend cannot import this DLPack tensor ({type(obj).__name__}): {e}") from e
        return y

    @functools.cached_property
    def _strides_read_as_row_major(self) -> bool:
        """jax < 0.8 reads a strided DLPack buffer as if it were row-major: headers must be checked."""
        try:
            return tuple(int(p) for p in self.core.version().split(".")[:2]) < (0, 8)
        except ValueError:
            return True
