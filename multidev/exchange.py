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
import ctypes
import struct
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from ._device import DeviceLike
from .dlpack import DLPackCapsule, DLPackInfo, dlpack_info
from .errors import (
    CapabilityError,
    DeviceMismatchError,
    DeviceNotFoundError,
    InvalidArgumentError,
    MultidevError,
    UnsupportedTensorError,
    translate_errors,
)
from .placement import as_device
from .protocol import Backend, SupportsDLPack
from .registry import backend_of, cached_owner, get_backend, require, tie_cache
from .sharding import ShardedTensor, is_sharded, map_shards
from .trees import is_structure, tree_map

if TYPE_CHECKING:  # the result types of convert(); never imported at run time
    import cupy
    import jax
    import mxnet
    import numpy as np
    import tensorflow as tf
    import torch

_K = TypeVar("_K")

__all__ = ["CExchangeAPI", "DLPackCapsule", "DLPackInfo", "c_exchange_api", "convert", "dlpack_info", "exportable",
           "peek"]


def exportable(src: Backend, x: Any) -> Any:
    """What ``src.dlpack.export_dlpack(x)`` gives, as an object with ``__dlpack__``/``__dlpack_device__``
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


class _Exported:
    """Producer ``obj`` with one capsule it already exported (and the core inspected): handed to the
    first consumer that can take that kind of capsule (a legacy one any consumer, a versioned one a
    consumer asking with ``max_version`` 1 or above; no copy, no other device), so the buffer is
    exported once per ``convert``; any other request goes to ``obj``."""

    __slots__ = ("_cap", "_obj", "_versioned")

    def __init__(self, obj: Any, cap: Any, versioned: bool) -> None:
        self._obj, self._cap, self._versioned = obj, cap, versioned

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        cap = self._cap
        if cap is not None and not args and kwargs.get("copy") is not True and kwargs.get("dl_device") is None:
            mv = kwargs.get("max_version")
            # a legacy capsule suits every consumer (one asking for a versioned one takes it too, as
            # the protocol allows); a versioned one only a consumer that asked with max_version >= 1
            if not self._versioned or (mv is not None and tuple(mv) >= (1, 0)):
                self._cap = None
                return cap
        return self._obj.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._obj.__dlpack_device__()

    def __getattr__(self, name: str) -> Any:  # dtype, shape, device: as the producer's
        return getattr(self._obj, name)


# -- DLPack's C exchange API (DLPack 1.3: a type's ``__dlpack_c_exchange_api__``) ---------------
_API_NAME = b"dlpack_exchange_api"
_VERSIONED, _USED, _LEGACY = b"dltensor_versioned", b"used_dltensor_versioned", b"dltensor"
_NOT_HOST = "not a host buffer"
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_capsule_rename = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", ctypes.pythonapi))
_decref = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("Py_DecRef", ctypes.pythonapi))
# int (*)(void* py_object, DLManagedTensorVersioned** out) and the other entries of the table
_FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))
_TO_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
_DLTENSOR_FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)
_HEAD = struct.Struct("<QQQQQiiiBBHQQQ")  # DLManagedTensorVersioned: version, ctx, deleter, flags, DLTensor
_TENSOR = struct.Struct("<QiiiBBHQQQ")  # DLTensor alone (64-bit)
_KDLCPU, _READ_ONLY = 1, 1
_string_at = ctypes.string_at


class CExchangeAPI:
    """A framework's DLPack C exchange table (``DLPackExchangeAPI``, dlpack.h 1.3), read from the
    ``__dlpack_c_exchange_api__`` capsule of its tensor type: the calls ``convert`` makes through it
    instead of ``__dlpack__`` and ``from_dlpack`` in Python (see :func:`c_exchange_api`)."""

    __slots__ = ("dltensor_from_py", "from_py", "to_py", "version")

    def __init__(self, version: tuple[int, int], from_py: int, to_py: int, dltensor_from_py: int) -> None:
        self.version = version
        #: ``managed_tensor_from_py_object_no_sync``: a tensor of this type -> an owned DLManagedTensorVersioned*
        self.from_py = _FROM_PY(from_py) if from_py else None
        #: ``managed_tensor_to_py_object_no_sync``: an owned DLManagedTensorVersioned* -> a tensor (stolen)
        self.to_py = _TO_PY(to_py) if to_py else None
        #: ``dltensor_from_py_object_no_sync``: a tensor -> a borrowed DLTensor (may be absent)
        self.dltensor_from_py = _DLTENSOR_FROM_PY(dltensor_from_py) if dltensor_from_py else None


_C_APIS: dict[type, CExchangeAPI | None] = {}


def c_exchange_api(cls: type) -> CExchangeAPI | None:
    """The DLPack C exchange API of tensor type ``cls`` (its ``__dlpack_c_exchange_api__`` capsule,
    major version 1), or None where it has none; read once per type."""
    try:
        return _C_APIS[cls]
    except KeyError:
        pass
    api = None
    cap = getattr(cls, "__dlpack_c_exchange_api__", None)
    if type(cap).__name__ == "PyCapsule":
        try:
            p = _capsule_pointer(cap, _API_NAME)
            major, minor, _prev = struct.unpack("<IIQ", ctypes.string_at(p, 16))
            if major == 1 and p:
                _alloc, from_py, to_py, dlt, _stream = struct.unpack("<5Q", ctypes.string_at(p + 16, 40))
                api = CExchangeAPI((major, minor), from_py, to_py, dlt)
        except (ValueError, TypeError, OSError):  # a capsule of another name, a NULL table
            api = None
    if len(_C_APIS) < 256:
        _C_APIS[cls] = api
    return api


def _consumer_api(dst: Backend) -> CExchangeAPI | None:
    """The C exchange API of ``dst``'s tensor type, where its adapter says its ``import_dlpack``
    is exactly the framework's own ``from_dlpack``, which takes bare capsules too
    (its DLPack concern's ``dlpack_c_exchange``), so the C call may stand in for it."""
    if not getattr(dst.dlpack, "dlpack_c_exchange", False):
        return None
    for t in dst.tensor_types():
        api = c_exchange_api(t)
        if api is not None and api.to_py is not None:
            return api
    return None


def _layout_refusal(raw: bytes, off: int, flags: int, mutable: bool) -> str | None:
    """:func:`_share_refusal` for a DLTensor read at ``raw[off:]`` (one read of the header), for a
    consumer that is ``mutable`` (its capabilities)."""
    _data, dev_type, _id, ndim, _c, _b, _l, shape_p, strides_p, _o = _TENSOR.unpack_from(raw, off)
    if dev_type != _KDLCPU:
        return _NOT_HOST
    if flags & _READ_ONLY and mutable:
        return "it is read-only, and a writable alias of it would let writes through"
    if ndim > 0 and strides_p:
        st_ = _STRIDES.get(ndim) or struct.Struct(f"<{ndim}q")
        strides = st_.unpack(_string_at(strides_p, 8 * ndim))
        if min(strides) <= 0:
            shape = st_.unpack(_string_at(shape_p, 8 * ndim))
            if any(st <= 0 for n, st in zip(shape, strides) if n > 1):
                return f"its strides {strides} are negative or zero (a reversed or broadcast view)"
    return None


def _steal(p: int | None) -> Any:
    """The object behind a new reference ``p`` (PyObject*) a C call handed back; the reference is ours."""
    if not p:
        raise BufferError("the consumer's DLPack C import gave no object")
    obj = ctypes.cast(p, ctypes.py_object).value  # (a second reference)
    _decref(p)
    return obj


_NO_API: Any = object()  # (_host_share: the consumer's C exchange API not looked up yet)
_STRIDES = {n: struct.Struct(f"<{n}q") for n in range(1, 9)}
#: (producer type, versioned asked) -> the name of the capsule it gave (see _host_share)
_CAPSULE_NAMES: dict[tuple[type, bool], bytes] = {}


def _host_share(obj: Any, dst: Backend, src: str, to: Any = _NO_API) -> tuple[Any, Any]:
    """Host buffer ``obj`` (a producer) checked by the core's rules (:func:`_share_refusal`; else
    CapabilityError) before consumer ``dst`` sees it, exported once: ``(y, None)`` where DLPack's C
    exchange API gave ``dst``'s tensor ``y`` already, else ``(None, producer)`` for ``dst``'s
    ``import_dlpack``, the producer handing out the capsule the core read (:class:`_Exported`).

    Where the consumer's adapter says its import is the framework's own ``from_dlpack``
    (``dlpack_c_exchange``) and both types have DLPack's C exchange API (DLPack 1.3), the producer's
    managed tensor goes to the consumer's C import with no capsule and no ``__dlpack__``; with the
    consumer's adapter saying so alone, the capsule goes to it bare. A mutable consumer's capsule is
    a versioned one (its read-only flag shows), an immutable consumer's a legacy one (what JAX and
    TensorFlow ask for)."""
    if to is _NO_API:
        to = _consumer_api(dst)
    if to is not None:
        src_api = c_exchange_api(type(obj))
        if src_api is not None and src_api.from_py is not None:
            out = ctypes.c_void_p()
            src_api.from_py(obj, ctypes.byref(out))  # a Python error the producer set is raised here
            if out.value:
                y = _c_import(to, out.value, None, dst, src)
                if y is not None:
                    return y, None
    mutable = dst.capabilities.mutable
    versioned = mutable or to is not None
    try:
        cap = obj.__dlpack__(max_version=(1, 0)) if versioned else obj.__dlpack__()
    except (TypeError, BufferError, NotImplementedError, AttributeError, ValueError):
        refusal = _share_refusal(peek(obj), dst)  # a producer without that kind of capsule: the general probe
        if refusal is not None:
            raise CapabilityError(f"{src} buffer not shared: {refusal}") from None
        return None, obj
    # the header in one read; the capsule's name guessed as the one this producer type gave last
    # time (a wrong guess costs a ValueError; the name's own foreign call costs every time)
    kind = (type(obj), versioned)
    name = _CAPSULE_NAMES.get(kind)
    ptr: Any = None
    if name is not None:
        try:
            ptr = _capsule_pointer(cap, name)
        except ValueError:
            name = None
    if name is None:
        name = _capsule_name(cap)
        if name in (_VERSIONED, _LEGACY):
            ptr = _capsule_pointer(cap, name)
            if len(_CAPSULE_NAMES) < 256:
                _CAPSULE_NAMES[kind] = name
    if name == _VERSIONED:
        raw = _string_at(ptr, _HEAD.size)
        refusal = _layout_refusal(raw, 32, _HEAD.unpack_from(raw)[3], mutable)
    elif name == _LEGACY:
        refusal = _layout_refusal(_string_at(ptr, _TENSOR.size), 0, 0, mutable)
    else:  # not a capsule the core can read: the consumer judges it
        refusal = None
    if refusal is not None and refusal != _NOT_HOST:
        raise CapabilityError(f"{src} buffer not shared: {refusal}")
    if to is not None and refusal is None:
        # The consumer's own from_dlpack takes the capsule as it is. (Its C import through ctypes
        # would cost more than that: each foreign call costs about what torch's whole import does.)
        return None, cap
    return None, _Exported(obj, cap, name == _VERSIONED)


def _c_import(to: CExchangeAPI, ptr: int, cap: Any, dst: Backend, src: str) -> Any:
    """The managed tensor at ``ptr`` (the producer's own, or ``cap``'s) as ``dst``'s tensor through
    its C import, after the core's rules; a managed tensor the rules refuse is freed (its deleter).
    None for a buffer that is not plain host memory (the ordinary route takes it: stream rules)."""
    raw = ctypes.string_at(ptr, _HEAD.size)
    refusal = _layout_refusal(raw, 32, _HEAD.unpack_from(raw)[3], dst.capabilities.mutable)
    if refusal is not None:
        if cap is None:  # the producer's managed tensor is ours: free it through its deleter
            deleter = _HEAD.unpack_from(raw)[2]
            if deleter:
                ctypes.CFUNCTYPE(None, ctypes.c_void_p)(deleter)(ptr)
        if refusal == _NOT_HOST:
            return None
        raise CapabilityError(f"{src} buffer not shared: {refusal}")
    if cap is not None:
        _capsule_rename(cap, _USED)  # the consumer owns the managed tensor now, not the capsule
    res = ctypes.c_void_p()
    assert to.to_py is not None  # (_consumer_api picks only tables with one)
    to.to_py(ptr, ctypes.byref(res))  # a Python error the consumer set is raised here
    return _steal(res.value)


# The result's type follows ``backend`` for a tensor and the container for a structure (its leaves
# become the other framework's tensors: typed Any).
@overload
def convert(x: ShardedTensor, backend: str, copy: bool | None = None, *,
            device: DeviceLike | None = None) -> Any: ...
@overload
def convert(x: list[Any], backend: str, copy: bool | None = None, *,
            device: DeviceLike | None = None) -> list[Any]: ...
@overload
def convert(x: tuple[Any, ...], backend: str, copy: bool | None = None, *,
            device: DeviceLike | None = None) -> tuple[Any, ...]: ...
@overload
def convert(x: dict[_K, Any], backend: str, copy: bool | None = None, *,
            device: DeviceLike | None = None) -> dict[_K, Any]: ...
@overload
def convert(x: Any, backend: Literal["numpy"], copy: bool | None = None, *,
            device: DeviceLike | None = None) -> np.ndarray: ...
@overload
def convert(x: Any, backend: Literal["torch"], copy: bool | None = None, *,
            device: DeviceLike | None = None) -> torch.Tensor: ...
@overload
def convert(x: Any, backend: Literal["jax"], copy: bool | None = None, *,
            device: DeviceLike | None = None) -> jax.Array: ...
@overload
def convert(x: Any, backend: Literal["tensorflow"], copy: bool | None = None, *,
            device: DeviceLike | None = None) -> tf.Tensor: ...
@overload
def convert(x: Any, backend: Literal["cupy"], copy: bool | None = None, *,
            device: DeviceLike | None = None) -> cupy.ndarray: ...
@overload
def convert(x: Any, backend: Literal["mxnet"], copy: bool | None = None, *,
            device: DeviceLike | None = None) -> mxnet.nd.NDArray: ...
@overload
def convert(x: Any, backend: str, copy: bool | None = None, *, device: DeviceLike | None = None) -> Any: ...
def convert(x: Any, backend: str, copy: bool | None = None, *, device: DeviceLike | None = None) -> Any:
    """``x`` as a tensor of another framework, on the same device, same shape, dtype and values.

    - ``copy=None``: zero-copy through DLPack where both sides allow it, else an explicit copy
      (a strided, reversed or read-only source the consumer cannot take safely, a virtual CPU
      device the consumer cannot label). A dtype the consumer cannot hold raises CapabilityError;
      a device it does not have raises DeviceNotFoundError.
    - ``copy=False``: zero-copy or CapabilityError, never a copy.
    - ``copy=True``: always a new buffer, landed before it is returned.

    A structure (lists, tuples, named tuples, dicts, a framework's trees) is converted tensor by
    tensor, its structure kept; a model is refused (a model belongs to its framework). A sharded
    tensor is converted piece by piece on its devices, its layout kept (the consumer's own sharded
    tensor where it has one, else a :class:`~multidev.ShardedTensor`): no gather.

    ``device``: where the result lives, x's own device by default. A host tensor may be labelled
    with any CPU device of the consumer (virtual CPU devices share host memory, so this copies
    nothing); other devices raise DeviceMismatchError (use :func:`multidev.to` to move).

    Asynchronous producers are waited for first (a bare capsule carries no stream), except on
    accelerators where both sides order the exchange on the device (``capabilities.dlpack_streams``:
    no host wait), so the result is safe to use at once. Converting to x's own backend returns ``x``
    itself (a copy with ``copy=True``) when it is on ``device``. A framework error on the way comes
    as its MultidevError, the framework's message kept.
    """
    try:
        return _convert(x, backend, copy, device)
    except UnsupportedTensorError:  # a structure: every tensor converted, the structure kept
        if x.__class__ is ShardedTensor:
            return _convert_sharded(x, backend, copy, device)
        if not is_structure(x):
            raise
        try:
            return tree_map(lambda t: _convert_leaf(t, backend, copy, device), x, f"convert to {backend}")
        except Exception as e:  # noqa: BLE001 - translated by reraise
            translate_errors(lambda: f"convert to {backend}").reraise(e)
    except DeviceMismatchError:  # a framework's own sharded tensor: converted piece by piece
        if not is_sharded(x):
            raise
        return _convert_sharded(x, backend, copy, device)
    except Exception as e:  # noqa: BLE001 - translated by reraise (a try costs nothing until something raises)
        translate_errors(lambda: f"convert to {backend}").reraise(e)


def _convert_leaf(x: Any, backend: str, copy: bool | None, device: DeviceLike | None) -> Any:
    """convert of one leaf of a structure: a tensor, or a sharded tensor piece by piece."""
    if x.__class__ is ShardedTensor:
        return _convert_sharded(x, backend, copy, device)
    try:
        return _convert(x, backend, copy, device)
    except DeviceMismatchError:  # a framework's own sharded tensor
        if not is_sharded(x):
            raise
        return _convert_sharded(x, backend, copy, device)


def _convert_sharded(x: Any, backend: str, copy: bool | None, device: DeviceLike | None) -> Any:
    """convert of a sharded tensor: each piece converted on its device, the layout kept (the
    consumer's own sharded tensor where it expresses the layout, else a ShardedTensor); no gather."""
    if device is not None:
        raise InvalidArgumentError("convert: a sharded tensor keeps its mesh; device= is for tensors on one device")
    try:
        own = x.backend if x.__class__ is ShardedTensor else backend_of(x).name
        if not copy and own == get_backend(backend).name:
            return x  # its own backend: x itself, as for a tensor
        return map_shards(x, lambda t: _convert(t, backend, copy, None))
    except Exception as e:  # noqa: BLE001 - translated by reraise
        translate_errors(lambda: f"convert to {backend}").reraise(e)


#: (source adapter, consumer, device, target device, dtype, ids of both capability sets) -> what
#: convert checked for them once (:class:`_Route`).
_ROUTES: dict[tuple[Any, ...], _Route] = tie_cache({})


class _Route:
    """What a convert from ``src`` on ``here`` to ``dst`` on ``dev`` checked once, depending on no
    tensor: the capability sets it was checked against, why there is no DLPack route (empty: there
    is one), the stream handshake, whether to wait first, and the calls the DLPack route makes (the
    producer's export, the consumer's import, the consumer's C exchange API for host buffers)."""

    __slots__ = ("dc", "export", "handshake", "host", "imp", "plain", "sc", "steady", "to", "versioned", "wait",
                 "why")

    def __init__(self, src: Backend, dst: Backend, here: Any, dev: Any, dtype: str, sc: Any, dc: Any) -> None:
        if dev not in dst.devices():
            raise DeviceNotFoundError(
                f"convert: {dst.name} has no device {dev} (where the {src.name} tensor would live); available: "
                f"{', '.join(map(str, dst.devices()))}. Move it first with multidev.to(x, 'cpu')."
            )
        if dtype not in dc.dtypes_on(dev):
            raise CapabilityError(f"convert: {dst.name} cannot hold {dtype} on {dev}; cast the {src.name} "
                                  "tensor first")
        self.sc, self.dc = sc, dc
        self.why, self.handshake, self.wait = "", False, False
        #: an accelerator route (stream handshake) whose import gave dst's tensor of this dtype once:
        #: the same producer, consumer, devices and dtype give the same again, so later calls go
        #: straight from export to import
        self.steady = False
        self.export: Any = None
        self.imp: Any = None
        self.to: Any = None
        self.host = not here.is_gpu
        #: a host route whose producer declares every host export plain (``plain_host_exports``: an
        #: object with ``__dlpack__`` whose capsule comes once the buffer is written, of positive
        #: strides, never flagged read-only): once a first convert read its header and found it so,
        #: later ones hand its capsule straight to the consumer, unread and with no wait first
        self.plain = False
        self.versioned = bool(dc.mutable)
        if src.dlpack is None or dst.dlpack is None:
            self.why = f"{src.name if src.dlpack is None else dst.name} has no DLPack support"
            return
        try:
            self.export = require(src, SupportsDLPack, "convert").export_dlpack
            self.imp = require(dst, SupportsDLPack, "convert").import_dlpack
        except CapabilityError as e:
            self.why = f"CapabilityError: {e}"
        self.handshake = bool(here.kind != "cpu" and sc.dlpack_streams and dc.dlpack_streams)
        self.wait = bool(sc.async_execution and not self.handshake)
        self.to = _consumer_api(dst) if self.host else None
        self.versioned = bool(dc.mutable or self.to is not None)  # the capsule _host_share asks for
        self.plain = self.host and bool(getattr(src.dlpack, "plain_host_exports", False))


def _export(route: _Route, src: Backend, x: Any) -> Any:
    """:func:`exportable` through the route's export call."""
    obj = route.export(x)
    if hasattr(obj, "__dlpack__"):
        return obj
    return DLPackCapsule(obj, src.device_of(x))


def _convert(x: Any, backend: str, copy: bool | None, device: DeviceLike | None) -> Any:
    if copy is not None and not isinstance(copy, bool):
        raise InvalidArgumentError(f"convert: copy must be None, True or False, got {copy!r:.40}")
    src = cached_owner(type(x)) or backend_of(x)
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
        if src.dlpack is not None:  # relabel host memory with another virtual CPU device
            with contextlib.suppress(MultidevError, BufferError, RuntimeError, TypeError, ValueError):
                return require(src, SupportsDLPack, "convert").import_dlpack(exportable(src, x), dev)
        if copy is False:
            raise CapabilityError(f"convert: {src.name} cannot label this buffer with {dev} without a copy")
        return src.move(x, dev)
    dtype = src.dtype_of(x)
    sc, dc = src.capabilities, dst.capabilities
    key = (src, dst, here, dev, dtype, id(sc), id(dc))
    route = _ROUTES.get(key)
    if route is None or route.sc is not sc or route.dc is not dc:
        route = _Route(src, dst, here, dev, dtype, sc, dc)
        if len(_ROUTES) < 1024:
            _ROUTES[key] = route
    why = route.why
    if route.steady and not copy:
        try:
            if route.host:  # a plain producer's host route (see _Route.plain), checked on its first call;
                obj = route.export(x)  # its export has __dlpack__ and waits for the producer's work
                cap = obj.__dlpack__(max_version=(1, 0)) if route.versioned else obj.__dlpack__()
                return route.imp(cap if route.to is not None else _Exported(obj, cap, route.versioned), dev)
            return route.imp(_export(route, src, x), dev)
        except (MultidevError, BufferError, RuntimeError, TypeError, ValueError) as e:
            why = f"{type(e).__name__}: {e}"
    elif not why:
        try:
            if route.wait:
                src.wait(x)  # a bare capsule carries no stream: the producer's work must be done
            obj = _export(route, src, x)
            y, capsule = None, False
            if route.host:  # host buffers: layouts that abort or alias unsafely stay unshared
                y, prod = _host_share(obj, dst, src.name, route.to)
                if y is not None and dst.device_of(y) is not dev:  # (the C route lands on cpu:0)
                    y, prod = None, _export(route, src, x)
                capsule = y is None and prod is not obj  # a header read and found shareable
                obj = prod
            if y is None:
                y = route.imp(obj, dev)
            if (route.handshake or dst.device_of(y) is dev) and dst.dtype_of(y) == dtype:
                if not copy:
                    route.steady = route.handshake and not route.wait and not route.host
                    if route.plain and capsule and hasattr(obj0 := route.export(x), "__dlpack__"):
                        info = peek(obj0)  # once per route: the declaration against this export
                        route.steady = (info is not None and info.device[0] == _KDLCPU
                                        and _share_refusal(info, dst) is None)
                    return y
                out = dst.copy(y, dev)
                # The copy reads memory the producer's framework may write next, unseen by the
                # consumer's scheduler: let it land before handing it out.
                dst.wait(out)
                return out
            why = f"DLPack gave {dst.dtype_of(y)} on {dst.device_of(y)}"
        except (MultidevError, BufferError, RuntimeError, TypeError, ValueError) as e:
            why = f"{type(e).__name__}: {e}"
    if copy is False:
        raise CapabilityError(f"convert {src.name} -> {dst.name} on {dev} cannot share memory ({why}); "
                              "pass copy=None to allow a copy")
    return dst.asarray(src.to_numpy(x), dtype, dev)
