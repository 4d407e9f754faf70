"""What several files of the JAX adapter share."""
from __future__ import annotations

X64_DTYPES = frozenset({"int64", "uint64", "float64", "complex128"})


#: The 32-bit dtype JAX holds in place of each 64-bit one.
NARROW = {"int64": "int32", "uint64": "uint32", "float64": "float32", "complex128": "complex64"}


def x64_hint(dtype: str | None = None) -> str:
    """How to get ``dtype`` (a 64-bit dtype) onto JAX: 64-bit mode, or the 32-bit dtype asked for."""
    narrow = NARROW.get(dtype or "")
    also = (f", or ask for dtype={narrow!r} (a NumPy array is cast: md.asarray(a, dtype={narrow!r}, "
            "backend='jax'))") if narrow else ""
    return f"enable 64-bit types with jax.config.update('jax_enable_x64', True){also}"
