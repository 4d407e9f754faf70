"""Canonical dtype names shared by every backend."""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DTYPES", "FLOAT_DTYPES", "INT_DTYPES", "canonical_dtype", "is_floating", "is_integer",
           "numpy_dtype"]

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
DTYPES = ("bool",) + INT_DTYPES + FLOAT_DTYPES + ("complex64", "complex128")


def canonical_dtype(d: Any) -> str:
    """The canonical name of any dtype spelling: ``"float32"``, ``np.float32``, ``torch.float32``,
    ``tf.float32``, ``jnp.bfloat16``, ``"f4"`` all map to NumPy-style names."""
    if isinstance(d, str):
        s = d.strip().lower()
        for prefix in ("torch.", "tf.", "jnp.", "np.", "numpy."):
            if s.startswith(prefix):
                s = s[len(prefix):]
        if s in DTYPES:
            return s
        try:
            name = np.dtype(s).name
        except TypeError:
            raise TypeError(f"unknown dtype {d!r}; use one of {', '.join(DTYPES)}") from None
        if name not in DTYPES:
            raise TypeError(f"unsupported dtype {d!r} ({name}); use one of {', '.join(DTYPES)}")
        return name
    name = getattr(d, "name", None)  # tf.DType, np.dtype, ml_dtypes
    if isinstance(name, str) and name in DTYPES:
        return name
    if isinstance(d, type) and getattr(d, "__name__", None) == "bfloat16":
        return "bfloat16"
    try:
        name = np.dtype(d).name
        if name in DTYPES:
            return name
    except TypeError:
        pass
    return canonical_dtype(str(d))


def is_floating(dtype: str) -> bool:
    return dtype in FLOAT_DTYPES or dtype.startswith("complex")


def is_integer(dtype: str) -> bool:
    return dtype in INT_DTYPES or dtype == "bool"


def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype for a canonical name; bfloat16 through ml_dtypes when installed."""
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError("bfloat16 needs the 'ml_dtypes' package for NumPy") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)
