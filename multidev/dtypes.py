"""Canonical dtype names shared by every backend, and the one parser of dtype spellings.

A canonical name is a NumPy-style string from :data:`DTYPES`. :func:`canonical_dtype` follows NumPy's
own reading of type codes exactly (``"B"`` is uint8, ``"b"`` int8, ``"f4"`` float32) and refuses
what no backend holds (strings, bytes, objects, datetimes, structured and extended-precision types)
with :class:`~multidev.errors.InvalidDtypeError`.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from .errors import InvalidDtypeError

__all__ = [
    "COMPLEX_DTYPES",
    "DTYPES",
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "ITEMSIZE",
    "canonical_dtype",
    "is_complex",
    "is_floating",
    "is_integer",
    "numpy_dtype",
]

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
COMPLEX_DTYPES = ("complex64", "complex128")
DTYPES = ("bool",) + INT_DTYPES + FLOAT_DTYPES + COMPLEX_DTYPES
#: Bytes per element of each canonical dtype.
ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
            "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8,
            "complex64": 8, "complex128": 16}

_REFUSED_KINDS = {"U": "strings", "S": "byte strings", "O": "Python objects", "M": "datetimes",
                  "m": "timedeltas", "V": "structured or raw bytes"}
# "torch.float32", "tf.float32", "np.float32", "jnp.bfloat16": a module prefix before the name.
_PREFIX = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*\.)+")


def _accepted() -> str:
    return ", ".join(DTYPES)


def canonical_dtype(d: Any) -> str:
    """The canonical name of a dtype spelling: ``"float32"``, ``np.float32``, ``np.dtype("f4")``,
    ``"f4"``, ``float``, a framework's dtype object (``torch.float32``, ``tf.float32``,
    ``jnp.bfloat16``), or a ``module.name`` string. Type codes keep NumPy's meaning (case matters:
    ``"B"`` is uint8); full names are case-insensitive. Raises InvalidDtypeError for anything else."""
    try:
        hit = _cache.get(d)
    except TypeError:  # unhashable
        hit = None
    if hit is not None:
        return hit
    name = _canonical(d)
    if len(_cache) < 4096:
        try:
            _cache[d] = name
        except TypeError:
            pass
    return name


_cache: dict[Any, str] = {}


def _canonical(d: Any) -> str:
    if d is None:
        raise InvalidDtypeError(f"dtype None is not a dtype; pass one of {_accepted()}")
    if isinstance(d, str):
        return _from_string(d)
    name = getattr(d, "name", None)  # tf.DType, np.dtype, ml_dtypes dtypes
    if isinstance(name, str) and name in DTYPES:
        return name
    if isinstance(d, type) and getattr(d, "__name__", None) == "bfloat16":
        return "bfloat16"
    if isinstance(d, (bool, int, float, complex, list, tuple, dict, bytes, np.generic)):
        raise InvalidDtypeError(f"{d!r} (a {type(d).__name__} value) is not a dtype; pass one of {_accepted()}")
    try:
        nd = np.dtype(d)
    except (TypeError, ValueError):
        text = str(d)
        if _PREFIX.match(text):
            return _from_string(text)  # torch.float32 and friends print as "module.name"
        raise InvalidDtypeError(f"cannot interpret {d!r} (type {type(d).__name__}) as a dtype; use one "
                                f"of {_accepted()}") from None
    return _from_numpy(nd, d)


def _from_string(text: str) -> str:
    s = _PREFIX.sub("", text.strip())
    if s.lower() in DTYPES and len(s) > 2:
        return s.lower()
    try:
        nd = np.dtype(s)
    except (TypeError, ValueError):
        raise InvalidDtypeError(f"unknown dtype {text!r}; use one of {_accepted()} (or a NumPy type "
                                "code such as 'f4' or 'B')") from None
    return _from_numpy(nd, text)


def _from_numpy(nd: np.dtype, given: Any) -> str:
    if nd.kind in _REFUSED_KINDS:
        raise InvalidDtypeError(f"dtype {given!r} ({nd}) holds {_REFUSED_KINDS[nd.kind]}, which no "
                                f"backend can hold; use one of {_accepted()}")
    if nd.name not in DTYPES or nd.fields is not None or nd.subdtype is not None:
        raise InvalidDtypeError(f"unsupported dtype {given!r} ({nd.name}); use one of {_accepted()}")
    return nd.name


def is_floating(dtype: str) -> bool:
    """Floating or complex (the dtypes a mean is defined for)."""
    return dtype in FLOAT_DTYPES or dtype in COMPLEX_DTYPES


def is_complex(dtype: str) -> bool:
    """Whether the canonical dtype name is a complex one (``complex64``, ``complex128``)."""
    return dtype in COMPLEX_DTYPES


def is_integer(dtype: str) -> bool:
    """Integer or bool."""
    return dtype in INT_DTYPES or dtype == "bool"


def numpy_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype for a canonical name; bfloat16 through ml_dtypes when installed."""
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise InvalidDtypeError("bfloat16 needs the 'ml_dtypes' package for NumPy") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)
