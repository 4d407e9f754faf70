"""DLPack helpers shared by the core and the adapters: reading a capsule's header without consuming
it, and presenting a bare capsule through the ``__dlpack__`` protocol. No dependencies."""
from __future__ import annotations

import ctypes
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
        read_only = bool(ctypes.c_uint64.from_address(addr + 24).value & _READ_ONLY)
        addr += 32
    # DLTensor: void* data; DLDevice{i32 type, i32 id}; i32 ndim; DLDataType{u8 code, u8 bits, u16 lanes};
    # i64* shape; i64* strides; u64 byte_offset
    data = ctypes.c_void_p.from_address(addr).value or 0
    dev = (ctypes.c_int32 * 2).from_address(addr + 8)
    ndim = ctypes.c_int32.from_address(addr + 16).value
    dt = (ctypes.c_uint8 * 2).from_address(addr + 20)
    shape_p = ctypes.c_void_p.from_address(addr + 24).value
    strides_p = ctypes.c_void_p.from_address(addr + 32).value
    offset = ctypes.c_uint64.from_address(addr + 40).value
    shape = tuple((ctypes.c_int64 * ndim).from_address(shape_p)) if ndim > 0 and shape_p else ()
    strides = tuple((ctypes.c_int64 * ndim).from_address(strides_p)) if ndim > 0 and strides_p else None
    return DLPackInfo((int(dev[0]), int(dev[1])), (int(dt[0]), int(dt[1])), tuple(map(int, shape)),
                      None if strides is None else tuple(map(int, strides)), data + offset, read_only)


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
