"""Zero-copy exchange between frameworks through DLPack: :func:`convert`.

Safety rules applied in the core, before any consumer framework sees a buffer (a consumer that
would abort on a layout never receives it; it gets an explicit copy instead, or CapabilityError
under ``copy=False``):

- negative or zero strides (reversed and broadcast views) are never shared;
- read-only memory is shared only with immutable consumers (never a writable alias of it);
- each adapter's ``import_dlpack`` refuses what its own framework cannot take (TensorFlow: CPU
  buffers not 64-byte aligned; JAX: strided buffers; MXNet: bool), checked with
  :func:`dlpack_info` before the framework is called.
"""
from __future__ import annotations

import contextlib
from typing import Any

from ._device import DeviceLike
from .dlpack import DLPackCapsule, DLPackInfo, dlpack_info
from .errors import CapabilityError, DeviceMismatchError, DeviceNotFoundError, MultidevError, UnsupportedTensorError
from .placement import as_device
from .protocol import Backend, SupportsDLPack
from .registry import backend_of, get_backend, require
from .trees import is_structure, tree_map
from .validate import translate_errors

__all__ = ["DLPackCapsule", "DLPackInfo", "convert", "dlpack_info", "exportable", "peek"]


def exportable(src: Backend, x: Any) -> Any:
    """What ``src.export_dlpack(x)`` gives, as an object with ``__dlpack__``/``__dlpack_device__``
    (CapabilityError where ``src`` has no :class:`~multidev.protocol.SupportsDLPack`)."""
    obj = require(src, SupportsDLPack, "DLPack export").export_dlpack(x)
    if hasattr(obj, "__dlpack__"):
        return obj
    return DLPackCapsule(obj, src.device_of(x))


def peek(obj: Any) -> DLPackInfo | None:
    """The layout of producer object ``obj`` without consuming it: a capsule made for inspection
    and dropped (its deleter runs), asking for a versioned one first so a read-only flag shows, and
    no stream synchronization. None where the producer cannot say (a one-shot capsule wrapper)."""
    if isinstance(obj, DLPackCapsule):
        cap = obj.capsule
        return None if cap is None else dlpack_info(cap)
    for kwargs in ({"max_version": (1, 0), "stream": -1}, {"max_version": (1, 0)}, {"stream": -1}, {}):
        try:
            if obj.__dlpack_device__()[0] == 1:  # kDLCPU: no stream argument exists for host buffers
                kwargs = {k: v for k, v in kwargs.items() if k != "stream"}
            cap = obj.__dlpack__(**kwargs)
        except (TypeError, BufferError, NotImplementedError, AttributeError):
            continue
        except Exception:  # noqa: BLE001 - some producers raise their own error types for kwargs
            continue
        try:
            return dlpack_info(cap)
        except CapabilityError:
            return None
    return None


def _share_refusal(info: DLPackInfo | None, dst: Backend) -> str | None:
    """Why the core refuses to hand this buffer to ``dst`` zero-copy (None: it may)."""
    if info is None:
        return None
    if info.has_negative_or_zero_strides:
        return f"its strides {info.strides} are negative or zero (a reversed or broadcast view)"
    if info.read_only and dst.capabilities.mutable:
        return "it is read-only, and a writable alias of it would let writes through"
    return None


def convert(x: Any, backend: str, copy: bool | None = None, *, device: DeviceLike | None = None) -> Any:
    """``x`` as a tensor of another framework, on the same device, same shape, dtype and values.

    - ``copy=None``: zero-copy through DLPack where both sides allow it, else an explicit copy
      (a strided, reversed or read-only source the consumer cannot take safely, a virtual CPU
      device the consumer cannot label). A dtype the consumer cannot hold raises CapabilityError;
      a device it does not have raises DeviceNotFoundError.
    - ``copy=False``: zero-copy or CapabilityError, never a copy.
    - ``copy=True``: always a new buffer, landed before it is returned.

    A structure (lists, tuples, named tuples, dicts, a framework's trees) is converted tensor by
    tensor, its structure kept; a model is refused (a model belongs to its framework).

    ``device``: where the result lives, x's own device by default. A host tensor may be labelled
    with any CPU device of the consumer (virtual CPU devices share host memory, so this copies
    nothing); other devices raise DeviceMismatchError (use :func:`multidev.to` to move).

    Asynchronous producers are waited for first (a bare capsule carries no stream), except on
    accelerators where both sides order the exchange on the device (``capabilities.dlpack_streams``:
    no host wait), so the result is safe to use at once. Converting to x's own backend returns ``x``
    itself (a copy with ``copy=True``) when it is on ``device``. A framework error on the way comes
    as its MultidevError, the framework's message kept.
    """
    with translate_errors(lambda: f"convert to {backend}"):
        try:
            backend_of(x)
        except UnsupportedTensorError:  # a structure: every tensor converted, the structure kept
            if not is_structure(x):
                raise
            return tree_map(lambda t: _convert(t, backend, copy, device), x, f"convert to {backend}")
        return _convert(x, backend, copy, device)


def _convert(x: Any, backend: str, copy: bool | None, device: DeviceLike | None) -> Any:
    if copy is not None and not isinstance(copy, bool):
        raise CapabilityError(f"convert: copy must be None, True or False, got {copy!r:.40}")
    src = backend_of(x)
    dst = get_backend(backend)
    here = src.device_of(x)
    dev = here if device is None else as_device(device)
    if dev != here and not (dev.kind == here.kind == "cpu"):
        raise DeviceMismatchError(f"convert keeps the device: the {src.name} tensor is on {here}, not {dev}; "
                                  "move it first with multidev.to(x, device)")
    if dst.name == src.name:
        if dev != here and dev not in src.devices():
            raise DeviceNotFoundError(f"convert: {src.name} has no device {dev}; available: "
                                      f"{', '.join(map(str, src.devices()))}")
        if copy:
            return src.copy(x, dev)
        if dev == here:
            return x
        if src.capabilities.dlpack:  # relabel host memory with another virtual CPU device
            with contextlib.suppress(MultidevError, BufferError, RuntimeError, TypeError, ValueError):
                return require(src, SupportsDLPack, "convert").import_dlpack(exportable(src, x), dev)
        if copy is False:
            raise CapabilityError(f"convert: {src.name} cannot label this buffer with {dev} without a copy")
        return src.move(x, dev)
    if dev not in dst.devices():
        raise DeviceNotFoundError(
            f"convert: {dst.name} has no device {dev} (where the {src.name} tensor would live); available: "
            f"{', '.join(map(str, dst.devices()))}. Move it first with multidev.to(x, 'cpu')."
        )
    dtype = src.dtype_of(x)
    sc, dc = src.capabilities, dst.capabilities
    if dtype not in dc.dtypes_on(dev):
        raise CapabilityError(f"convert: {dst.name} cannot hold {dtype} on {dev}; cast the {src.name} tensor "
                              "first")
    why = ""
    if sc.dlpack and dc.dlpack:
        try:
            handshake = here.kind != "cpu" and sc.dlpack_streams and dc.dlpack_streams
            if sc.async_execution and not handshake:
                src.wait(x)  # a bare capsule carries no stream: the producer's work must be done
            obj = exportable(src, x)
            if not here.is_gpu:  # host buffers: layouts that abort or alias unsafely stay unshared
                refusal = _share_refusal(peek(obj), dst)
                if refusal is not None:
                    raise CapabilityError(f"{src.name} buffer not shared: {refusal}")
            y = require(dst, SupportsDLPack, "convert").import_dlpack(obj, dev)
            if (handshake or dst.device_of(y) == dev) and dst.dtype_of(y) == dtype:
                if not copy:
                    return y
                out = dst.copy(y, dev)
                # The copy reads memory the producer's framework may write next, unseen by the
                # consumer's scheduler: let it land before handing it out.
                dst.wait(out)
                return out
            why = f"DLPack gave {dst.dtype_of(y)} on {dst.device_of(y)}"
        except (MultidevError, BufferError, RuntimeError, TypeError, ValueError) as e:
            why = f"{type(e).__name__}: {e}"
    else:
        why = f"{src.name if not sc.dlpack else dst.name} has no DLPack support"
    if copy is False:
        raise CapabilityError(f"convert {src.name} -> {dst.name} on {dev} cannot share memory ({why}); "
                              "pass copy=None to allow a copy")
    return dst.asarray(src.to_numpy(x), dtype, dev)
