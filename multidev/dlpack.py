"""DLPack helpers shared by the core and the adapters: reading a capsule's header without consuming
it, and presenting a bare capsule through the ``__dlpack__`` protocol. No dependencies."""
from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any

from ._device import Device
from .errors import CapabilityError

__all__ = ["DLPackCapsule", "DLPackInfo", "dlpack_info"]


@dataclass(frozen=True)
class DLPackInfo:
    """What a DLPack capsule's header says about the buffer (dlpack.h ``DLTensor``)."""

    device: tuple[int, int]
    """``(device_type, device_id)``, as ``__dlpack_device__`` gives it."""
    code_bits: tuple[int, int]
    """``(DLDataTypeCode, bits)``: (0 int, 1 uint, 2 float, 4 bfloat16, 5 complex, 6 bool)."""
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    """In elements; None for a compact row-major buffer (DLPack's convention)."""
    address: int
    """The first element's address (data pointer plus byte offset)."""
    read_only: bool
    """The versioned capsule's read-only flag (legacy capsules cannot say; False)."""

    @property
    def row_major(self) -> bool:
        """Compact C order (dimensions of size 1 may have any stride)."""
        if self.strides is None:
            return True
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n > 1 and s != expect:
                return False
            expect *= max(n, 1)
        return True

    @property
    def has_negative_or_zero_strides(self) -> bool:
        if self.strides is None:
            return False
        return any(s <= 0 for n, s in zip(self.shape, self.strides) if n > 1)

    def aligned(self, alignment: int) -> bool:
        return self.address % alignment == 0


_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype, _get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_get_ptr.restype, _get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
_string_at = ctypes.string_at
_new_info = object.__new__
_FLAGS = struct.Struct("<Q")
_TENSOR = struct.Struct("<QiiiBBHQQQ")  # DLTensor on a 64-bit machine: 48 bytes, no padding


def dlpack_info(capsule: Any) -> DLPackInfo:
    """The header of an unconsumed ``"dltensor"`` or ``"dltensor_versioned"`` capsule. Reads only;
    the capsule stays usable. CapabilityError for a consumed capsule or another object."""
    if type(capsule).__name__ != "PyCapsule":
        raise CapabilityError(f"not a DLPack capsule: {type(capsule).__name__}")
    name = _get_name(capsule)
    if name in (b"used_dltensor", b"used_dltensor_versioned"):
        raise CapabilityError("this DLPack capsule was already consumed (a capsule can be imported once); "
                              "export the tensor again")
    if name not in (b"dltensor", b"dltensor_versioned"):
        raise CapabilityError(f"not a DLPack capsule: its name is {name!r}")
    addr = _get_ptr(capsule, name) or 0
    read_only = False
    if name == b"dltensor_versioned":
        # DLManagedTensorVersioned: {u32 major, u32 minor}, void* ctx, void* deleter, u64 flags, DLTensor
        raw = _string_at(addr, 80)  # (one read of the whole header: each ctypes call costs)
        read_only = bool(_FLAGS.unpack_from(raw, 24)[0] & _READ_ONLY)
        head = _TENSOR.unpack_from(raw, 32)
    else:
        head = _TENSOR.unpack_from(_string_at(addr, _TENSOR.size))
    # DLTensor: void* data; DLDevice{i32 type, i32 id}; i32 ndim; DLDataType{u8 code, u8 bits, u16 lanes};
    # i64* shape; i64* strides; u64 byte_offset
    data, dev_type, dev_id, ndim, code, bits, _lanes, shape_p, strides_p, offset = head
    if ndim > 0 and shape_p:
        shape = struct.unpack(f"<{ndim}q", _string_at(shape_p, 8 * ndim))
    else:
        shape = ()
    strides = struct.unpack(f"<{ndim}q", _string_at(strides_p, 8 * ndim)) if ndim > 0 and strides_p else None
    info = _new_info(DLPackInfo)  # (the frozen dataclass's __init__ costs more than the reads above)
    info.__dict__.update(device=(dev_type, dev_id), code_bits=(code, bits), shape=shape, strides=strides,
                         address=(data or 0) + offset, read_only=read_only)
    return info


class DLPackCapsule:
    """Presents a legacy DLPack capsule through the ``__dlpack__`` protocol (for consumers that take
    only producer objects), once."""

    def __init__(self, capsule: Any, device: Device) -> None:
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        if kwargs.get("copy") is True:
            raise BufferError("this producer can only share memory (copy=True refused)")
        cap, self._capsule = self._capsule, None
        if cap is None:
            raise BufferError("a DLPack capsule can be consumed once")
        return cap

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device.to_dlpack()

    @property
    def capsule(self) -> Any:
        """The capsule, for inspection (None once consumed)."""
        return self._capsule
