"""What several files of the JAX adapter share."""
from __future__ import annotations

from typing import Any

X64_DTYPES = frozenset({"int64", "uint64", "float64", "complex128"})


#: The 32-bit dtype JAX holds in place of each 64-bit one.
NARROW = {"int64": "int32", "uint64": "uint32", "float64": "float32", "complex128": "complex64"}


def x64_hint(dtype: str | None = None) -> str:
    """How to get ``dtype`` (a 64-bit dtype) onto JAX: 64-bit mode, or the 32-bit dtype asked for."""
    narrow = NARROW.get(dtype or "")
    also = (f", or ask for dtype={narrow!r} (a NumPy array is cast: md.asarray(a, dtype={narrow!r}, "
            "backend='jax'))") if narrow else ""
    return f"enable 64-bit types with jax.config.update('jax_enable_x64', True){also}"


class LossCache:
    """The jitted functions made for each loss function, by the loss function: a plain function, a
    bound method (a new object on every attribute read, equal to the last: a weak-keyed cache lost
    it at once and recompiled every step) or any hashable callable. At most ``size`` entries, the
    oldest dropped first (a loss made anew every step, e.g. a lambda, compiles every step anyway);
    an unhashable callable is not cached."""

    def __init__(self, size: int = 64) -> None:
        self._fns: dict[Any, Any] = {}
        self._size = size

    def get(self, key: Any) -> Any:
        try:
            return self._fns.get(key)
        except TypeError:
            return None

    def put(self, key: Any, fn: Any) -> Any:
        try:
            if len(self._fns) >= self._size:
                self._fns.pop(next(iter(self._fns)))
            self._fns[key] = fn
        except TypeError:
            pass
        return fn
