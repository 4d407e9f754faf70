"""DLPack interchange over an array-API namespace (:class:`~multidev.adapter.SupportsDLPack`): the
standard's ``__dlpack__`` out (behind a producer that falls back to an unversioned capsule), its
``from_dlpack(obj, device=, copy=False)`` in."""
from __future__ import annotations

from typing import Any

from multidev.adapter import CapabilityError, Concern, Device, SupportsDLPack

from .core import ArrayApiCore


class ArrayApiStandardDLPack(Concern, SupportsDLPack):
    """The standard's DLPack, with the 2023.12 keywords where the library has them (named apart
    from :class:`multidev.adapter.ArrayApiDLPack`, the shared route without them)."""

    core: ArrayApiCore

    @classmethod
    def available_on(cls, core: Any) -> bool:
        """Where the library's arrays have ``__dlpack__`` and the namespace ``from_dlpack``."""
        return callable(getattr(core.tensor_types()[0], "__dlpack__", None)) \
            and callable(getattr(core.xp, "from_dlpack", None))

    def export_dlpack(self, x: Any) -> Any:
        """``x`` behind a thin producer that answers ``max_version`` with an unversioned capsule
        where the library cannot make a versioned one (array-api-strict on NumPy 1.x raises),
        as the DLPack standard allows; no copy either way."""
        return _Producer(x)

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        """A view of a DLPack producer on ``device`` (``from_dlpack(obj, device=, copy=False)``):
        host buffers are labelled with the virtual CPU device asked for."""
        nd = self.core.to_native_device(device)
        errors = (TypeError, ValueError, BufferError, RuntimeError, NotImplementedError)
        try:
            try:
                y = self.core.xp.from_dlpack(obj, device=nd, copy=False)
            except errors:
                # a namespace older than the 2023.12 keywords, or a producer refusing dl_device
                # (TensorFlow): the library's own placement, checked below
                y = self.core.xp.from_dlpack(obj)
        except errors as e:
            raise CapabilityError(f"{self.core.name} cannot import {type(obj).__name__} through DLPack: {e}") from e
        if self.core.device_of(y) != device:
            raise CapabilityError(f"{self.core.name}: a DLPack buffer of {device} arrived on "
                                  f"{self.core.device_of(y)}")
        return y


class _Producer:
    """A DLPack producer for an array whose ``__dlpack__`` may not take ``max_version``."""

    __slots__ = ("_x",)

    def __init__(self, x: Any) -> None:
        self._x = x

    def __dlpack_device__(self) -> Any:
        return self._x.__dlpack_device__()

    def __dlpack__(self, **kwargs: Any) -> Any:
        try:
            return self._x.__dlpack__(**kwargs)
        except (TypeError, NotImplementedError, ValueError, BufferError):
            if kwargs.get("max_version") is None or kwargs.get("copy") is not None \
                    or kwargs.get("dl_device") is not None:
                raise  # a copy or another device was asked for: never silently dropped
            legacy = {k: v for k, v in kwargs.items() if k == "stream" and v is not None}
            return self._x.__dlpack__(**legacy)
