"""The neutral :class:`Device` value and its parser."""
from __future__ import annotations

import functools
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

from .errors import DeviceMismatchError, InvalidDeviceError

__all__ = ["ACCEPTED_FORMS", "KINDS", "MAX_INDEX", "Device", "DeviceLike", "same_device"]

#: Device kinds multidev knows. ``gpu`` covers CUDA and ROCm; ``mps`` is Apple's Metal GPU.
KINDS = ("cpu", "gpu", "mps")

# DLPack device types (dlpack.h, DLDeviceType).
_DLPACK_TO_KIND = {1: "cpu", 2: "gpu", 3: "cpu", 8: "mps", 10: "gpu", 13: "cpu"}
_KIND_TO_DLPACK = {"cpu": 1, "gpu": 2, "mps": 8}

_ALIASES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "hip": "gpu", "mps": "mps",
            "metal": "mps"}

ACCEPTED_FORMS = (
    "'cpu', 'cpu:1', 'gpu', 'gpu:1', 'cuda:1', 'GPU:1', '/GPU:1', '/device:GPU:1', "
    "'/job:localhost/replica:0/task:0/device:GPU:1', 'mps', a (dlpack_type, index) pair, "
    "a Device, or a native device object (torch.device, a jax Device, mx.Context)"
)

# kind, optionally ":index". Everything before the last "device:" (TF's job/replica/task prefix) is dropped.
_SPEC = re.compile(r"^\s*([a-z]+)\s*(?::\s*(\d+))?\s*$")
_TF_PREFIX = re.compile(r"^(?:/job:[^/]+)?(?:/replica:\d+)?(?:/task:\d+)?(?:/device:|/)", re.IGNORECASE)


_INTERN: dict[tuple[str, int], Device] = {}
_INTERN_LOCK = threading.Lock()
#: The largest device index multidev accepts (more than any machine has; refuses 5000-digit indices).
MAX_INDEX = 1 << 16


@dataclass(frozen=True, order=True, init=False)
class Device:
    """A backend-neutral device: a kind (``"cpu"``, ``"gpu"``, ``"mps"``) and an index.

    Frozen, hashable and normalized: ``Device.parse("cuda:1") == Device.parse("/GPU:1")``. The index
    is the framework's ordinal for that kind, so ``gpu:0`` is the same GPU to every framework, as a
    DLPack ``(device_type, device_id)`` pair is. Interned: equal devices are one object (so
    comparing and hashing one is as cheap as for any object: the hot paths key caches by them).
    """

    kind: str
    index: int

    def __new__(cls, kind: str, index: int = 0) -> Device:
        inst = _INTERN.get((kind, index)) if type(kind) is str and type(index) is int else None
        if inst is not None:
            return inst
        if kind not in KINDS:
            raise InvalidDeviceError(f"unknown device kind {kind!r}; expected one of {KINDS}")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= MAX_INDEX:
            raise InvalidDeviceError(f"device index must be an int in 0..{MAX_INDEX}, got {index!r:.40}")
        index = int(index)  # an int subclass becomes a plain int
        with _INTERN_LOCK:  # one object per device, also when threads create it at once
            inst = _INTERN.get((kind, index))
            if inst is None:
                inst = object.__new__(cls)
                object.__setattr__(inst, "kind", kind)
                object.__setattr__(inst, "index", index)
                _INTERN[(kind, index)] = inst
        return inst

    def __init__(self, kind: str, index: int = 0) -> None:
        """Set up by ``__new__`` (interned)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError("multidev.Device cannot be subclassed: devices are interned by kind and index "
                        "(an equal device is the same object)")

    # Interned: an equal device is this very object, so identity is equality (and C-level fast).
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __reduce__(self) -> tuple:
        return (Device, (self.kind, self.index))

    def __repr__(self) -> str:
        return f"Device({self.kind!r}, {self.index})"

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"

    @property
    def is_gpu(self) -> bool:
        """True for accelerator devices (``gpu`` and ``mps``)."""
        return self.kind != "cpu"

    def to_dlpack(self) -> tuple[int, int]:
        """The DLPack ``(device_type, device_id)`` pair (kDLCPU=1, kDLCUDA=2, kDLMetal=8)."""
        return (_KIND_TO_DLPACK[self.kind], self.index)

    @classmethod
    def from_dlpack(cls, pair: tuple[int, int]) -> Device:
        """Build from a DLPack ``(device_type, device_id)`` pair, as ``__dlpack_device__`` returns."""
        dtype, idx = int(pair[0]), int(pair[1])
        if idx < 0 or idx > MAX_INDEX:
            raise InvalidDeviceError(f"DLPack device id {idx} is out of range (0..{MAX_INDEX})")
        if dtype not in _DLPACK_TO_KIND:
            raise InvalidDeviceError(f"unsupported DLPack device type {dtype}; known: {sorted(_DLPACK_TO_KIND)}")
        return cls(_DLPACK_TO_KIND[dtype], idx)

    @classmethod
    def parse(cls, spec: DeviceLike) -> Device:
        """Parse a spelling (``"cuda:1"``, ``"/GPU:1"``, ...), a DLPack ``(type, id)`` pair or a Device.

        Pure: consults nothing but its argument. Native device objects of frameworks
        (``torch.device``, a jax ``Device``) are resolved by :func:`multidev.device`, which asks the
        loaded adapters; here they raise InvalidDeviceError.
        """
        if isinstance(spec, Device):
            return spec
        if isinstance(spec, str):
            return _parse_str(spec)
        if (isinstance(spec, tuple) and len(spec) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in spec)):
            return cls.from_dlpack(spec)
        raise InvalidDeviceError(
            f"cannot interpret {spec!r} (type {type(spec).__name__}) as a device. Accepted: {ACCEPTED_FORMS}"
        )


@functools.lru_cache(maxsize=512)
def _parse_str(text: str) -> Device:
    raw = text
    s = text.strip()
    if s.startswith("/"):
        m = _TF_PREFIX.match(s)
        if not m:
            raise InvalidDeviceError(f"cannot parse device {raw!r}. Accepted: {ACCEPTED_FORMS}")
        s = s[m.end():]
    elif s.lower().startswith("device:"):
        s = s[len("device:"):]
    m = _SPEC.match(s.lower())
    if not m or m.group(1) not in _ALIASES:
        raise InvalidDeviceError(f"cannot parse device {raw!r:.60}. Accepted: {ACCEPTED_FORMS}")
    digits = m.group(2)
    if digits is not None and len(digits) > 6:
        raise InvalidDeviceError(f"device index {digits[:12]}... in {raw!r:.40} is out of range (0..{MAX_INDEX})")
    return Device(_ALIASES[m.group(1)], int(digits) if digits is not None else 0)


DeviceLike = Union[Device, str, tuple, Any]  # noqa: UP007 - a runtime alias, valid on Python 3.10


def same_device(backend: str, what: str, devices: Sequence[Device], note: str = "") -> Device | None:
    """The one device of ``devices`` (None when empty), or DeviceMismatchError naming them all.

    ``backend`` names the adapter in the message, ``what`` the operation (``"concat"``), ``note``
    is appended to the message (e.g. what the framework itself would have done)."""
    uniq = sorted(set(devices))
    if len(uniq) > 1:
        raise DeviceMismatchError(
            f"{backend} backend: {what} got operands on {', '.join(map(str, uniq))}{note}. Move them "
            "to one device first with multidev.to(x, device).")
    return uniq[0] if uniq else None
