"""A template adapter for one real library, array-api-strict (``pip install array-api-strict``): copy it
and replace each ``xp`` call with your framework's (``docs/writing-an-adapter.md`` walks through it).
Its devices all live in host memory; two of them lack float64. Test it as it stands::

    multidev conformance --backend multidev.examples.template_adapter:TemplateBackend

and register yours under ``[project.entry-points."multidev.backends"]`` in your ``pyproject.toml``.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any, ClassVar

import numpy as np

from multidev.adapter import (
    ArrayApiDLPack,
    BaseBackend,
    Capabilities,
    CapabilityError,
    Device,
    canonical_dtype,
    concern,
    host_aligned,
    numpy_dtype,
)


class TemplateDLPack(ArrayApiDLPack):
    """The ``dlpack`` concern, made from the adapter (``self.core``): the shared array-API export; the
    import labels the view with the device asked for (DLPack calls every host buffer cpu:0). A concern
    some machines lack (NCCL needs two GPUs) overrides the class method ``available_on(core)``: False
    makes the attribute None on that adapter instance."""

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        try:
            return self.core.xp.from_dlpack(obj, device=self.core.native[device], copy=False)
        except (TypeError, ValueError, BufferError, RuntimeError) as e:
            raise CapabilityError(f"template backend cannot import this DLPack tensor: {e}") from e


class TemplateBackend(BaseBackend):
    """The core protocol, in its order; a comment names each method BaseBackend derives."""

    name: ClassVar[str] = "template"  # what backend= takes
    framework: ClassVar[str] = "array_api_strict"  # its tensors exist only once this module is imported
    dlpack = concern(TemplateDLPack)  # the capabilities it has; the others (collectives, training...) stay None

    def __init__(self) -> None:
        import array_api_strict as xp  # the framework is imported here, never at module import

        info = xp.__array_namespace_info__()
        natives = sorted(info.devices(), key=lambda d: d != info.default_device())  # the default is cpu:0
        self.xp, self.native = xp, {Device("cpu", i): d for i, d in enumerate(natives)}
        self.ours = {d: dev for dev, d in self.native.items()}
        per_device = {dev: frozenset(info.dtypes(device=d)) for dev, d in self.native.items()}
        every = frozenset().union(*per_device.values())
        self.dtypes = {n: t for d in natives for n, t in info.dtypes(device=d).items()}
        self.names = {t: n for n, t in self.dtypes.items()}
        self.caps = Capabilities(mutable=True, async_execution=False, pinned_memory=False, dtypes=every,
                                 device_dtypes={dev: ds for dev, ds in per_device.items() if ds != every})

    @property
    def capabilities(self) -> Capabilities:
        return self.caps

    # version(): the framework module's __version__.
    def tensor_types(self) -> tuple[type, ...]:
        return (type(self.xp.asarray(0)),)

    def devices(self) -> list[Device]:
        return list(self.native)

    def to_native_device(self, device: Device) -> Any:
        return self.native[device]

    def from_native_device(self, obj: Any) -> Device | None:
        return self.ours.get(obj) if isinstance(obj, self.xp.Device) else None

    def to_native_dtype(self, dtype: str) -> Any:
        if dtype not in self.dtypes:
            raise CapabilityError(f"template backend has no dtype {dtype!r}")
        return self.dtypes[dtype]

    def dtype_of(self, x: Any) -> str:
        return self.names.get(x.dtype) or canonical_dtype(x.dtype)

    # full(), empty(), arange(): made with NumPy on the host, placed by asarray.
    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        a = host_aligned(np.array(obj, dtype=None if dtype is None else numpy_dtype(dtype)))  # always a copy,
        dt = self.dtypes[dtype or canonical_dtype(a.dtype)]  # 64-byte aligned: XLA shares host memory only so
        return self.xp.asarray(a, dtype=dt, device=self.native[device], copy=False)

    # rand(): NumPy's generator, seeded (see above).

    def device_of(self, x: Any) -> Device:
        return self.ours[x.device]

    # move(), copy(): through the host (asarray of to_numpy).
    def to_numpy(self, x: Any) -> np.ndarray:
        return np.from_dlpack(x)  # a view of the host buffer

    def synchronize(self, device: Device | None) -> None:
        return None  # nothing is ever queued

    # wait(), device_wait_fn(), tensor_wait_fn(): synchronize and wait, bound. shape_of(): x.shape.
    def combine(self, op: str, a: Any, b: Any) -> Any:
        self.same_device(op, (a, b))  # DeviceMismatchError naming both devices
        xp = self.xp
        if self.dtype_of(a) == "bool":  # max/min of bools are or/and
            return (xp.logical_or if op in ("sum", "max") else xp.logical_and)(a, b)
        return {"sum": xp.add, "max": xp.maximum, "min": xp.minimum, "prod": xp.multiply}[op](a, b)

    def divide(self, x: Any, n: int) -> Any:
        return x / n  # (mean: floating dtypes only)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self.xp.reshape(x, shape)

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        self.same_device("concat", xs)
        return self.xp.concat(list(xs), axis=axis)

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        lead = (slice(None),) * (axis % x.ndim)
        return [x[(*lead, slice(int(a), int(b)), ...)] for a, b in pairwise(np.cumsum([0, *sizes]))]

    def assign(self, dst: Any, src: Any) -> None:
        self.same_device("assign", (dst, src))
        dst[...] = src
