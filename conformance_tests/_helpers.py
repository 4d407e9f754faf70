"""Shared helpers for the conformance suite: NumPy references, tolerances, device picking."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from multidev.adapter import Device, numpy_dtype

#: dtypes the creation and placement tests run over (each skipped where the backend lacks it).
CREATION_DTYPES = ("bool", "int32", "int64", "float16", "bfloat16", "float32", "float64")


def need_dtype(backend: Any, dtype: str, *devices: Device) -> None:
    """Skip unless the backend holds ``dtype`` (on each of ``devices``, when given)."""
    if dtype not in backend.capabilities.dtypes:
        pytest.skip(f"{backend.name} cannot hold {dtype} here (capabilities.dtypes)")
    lacking = [str(d) for d in devices if dtype not in backend.capabilities.dtypes_on(d)]
    if lacking:
        pytest.skip(f"{backend.name} cannot hold {dtype} on {', '.join(lacking)} (capabilities.device_dtypes)")


def other_device(devices: list[Device], device: Device) -> Device:
    """Another device of the backend, or skip: moves between devices need two."""
    others = [d for d in devices if d != device]
    if not others:
        pytest.skip(f"needs a second device; this backend has only {device} here "
                    "(virtual CPU devices or a second GPU provide one)")
    return others[0]


def need_devices(devices: list[Device], n: int) -> list[Device]:
    if len(devices) < n:
        pytest.skip(f"needs {n} devices; this backend has {len(devices)} here")
    return devices[:n]


def as_f64(backend: Any, x: Any) -> np.ndarray:
    """A float64 (or bool/int) host copy of x for comparisons (bfloat16 goes through float32)."""
    a = np.asarray(backend.to_numpy(x))
    if a.dtype.kind in "biu":
        return a.copy()
    return a.astype(np.float64)


def rtol_for(dtype: str, n_terms: int = 1) -> float:
    """Relative tolerance for a float dtype, growing with the number of summed terms."""
    eps = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1.2e-7, "float64": 2.3e-16}.get(dtype, 0.0)
    return 0.0 if eps == 0.0 else 4 * eps * max(1, n_terms)


def assert_close(actual: np.ndarray, expected: np.ndarray, dtype: str, n_terms: int = 1) -> None:
    rtol = rtol_for(dtype, n_terms)
    if rtol == 0.0:
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol)


def np_dtype(dtype: str) -> np.dtype:
    """NumPy dtype to build reference data with (bfloat16 references are built in float32)."""
    return np.dtype("float32") if dtype == "bfloat16" else numpy_dtype(dtype)
