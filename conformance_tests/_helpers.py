"""Shared helpers for the conformance suite: NumPy references, tolerances, device picking, sample
data in every dtype, and the probes that look at what a framework exposes (readiness of queued
work, an asynchronous failure) without naming any framework."""
from __future__ import annotations

import functools
import gc
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from multidev.adapter import DTYPES, Device, numpy_dtype

from ._state import record_found, request_child_restart

#: dtypes the creation and placement tests run over (each skipped where the backend lacks it).
CREATION_DTYPES = ("bool", "int32", "int64", "float16", "bfloat16", "float32", "float64")
#: Every canonical dtype: the dtype-preservation checks run over each one the backend declares.
ALL_DTYPES = DTYPES


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


def need_gloo() -> None:
    """Skip unless torch.distributed with gloo is there (multidev.distributed's transport)."""
    try:
        import torch.distributed as tdist
    except ImportError:
        pytest.skip("multidev.distributed needs torch (torch.distributed) installed")
    if not tdist.is_available() or not tdist.is_gloo_available():
        pytest.skip("this torch build lacks torch.distributed with gloo")


def need_devices(devices: list[Device], n: int) -> list[Device]:
    if len(devices) < n:
        pytest.skip(f"needs {n} devices; this backend has {len(devices)} here")
    return devices[:n]


def ordered(devices: list[Device]) -> list[Device]:
    """Accelerators first: on a machine with GPUs the 2- and 3-device cases run on GPUs."""
    return [d for d in devices if d.is_gpu] + [d for d in devices if not d.is_gpu]


def as_f64(backend: Any, x: Any) -> np.ndarray:
    """A float64 (or bool/int/complex128) host copy of x for comparisons (bfloat16 through float32)."""
    a = np.asarray(backend.to_numpy(x))
    if a.dtype.kind in "biu":
        return a.copy()
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    return a.astype(np.float32).astype(np.float64) if a.dtype.name == "bfloat16" else a.astype(np.float64)


def rtol_for(dtype: str, n_terms: int = 1) -> float:
    """Relative tolerance for a float dtype, growing with the number of summed terms."""
    eps = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1.2e-7, "float64": 2.3e-16,
           "complex64": 1.2e-7, "complex128": 2.3e-16}.get(dtype, 0.0)
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


def sample(dtype: str, shape: tuple[int, ...] = (2, 3), seed: int = 0, low: int = 0, high: int = 4) -> np.ndarray:
    """Small exact values in ``dtype``'s reference type (NumPy's, float32 for bfloat16): integers
    in [low, high) (``{False, True}`` for bool), with an imaginary part for complex dtypes. Sums and
    products of a few of them are exact in every dtype, 8-bit ones and float16 included."""
    rng = np.random.default_rng(seed)
    v = rng.integers(low, high, size=shape)
    if dtype == "bool":
        return (v % 2).astype(bool)
    nd = np_dtype(dtype)
    if nd.kind == "c":
        return (v + 1j * rng.integers(low, high, size=shape)).astype(nd)
    if nd.kind == "u":
        v = np.abs(v)
    return v.astype(nd)


def native_array(dtype: str, values: np.ndarray) -> np.ndarray:
    """``values`` as a NumPy array of ``dtype`` itself (ml_dtypes' bfloat16 included), in a
    64-byte aligned buffer: the layout frameworks share rather than copy."""
    a = np.asarray(values).astype(numpy_dtype(dtype))
    return aligned_copy(a)


def aligned_copy(a: np.ndarray, alignment: int = 64) -> np.ndarray:
    """A C-contiguous copy of ``a`` whose buffer starts on an ``alignment``-byte boundary."""
    raw = np.empty(a.nbytes + alignment, dtype=np.uint8)
    off = (-raw.ctypes.data) % alignment
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


# -- probes of what a framework exposes ----------------------------------------------------------
def buffer_address(b: Any, x: Any) -> int | None:
    """The address of x's first element (None where it cannot be read): from its DLPack export,
    read without consuming it, else from what the tensor itself tells (``__array_interface__``,
    ``data_ptr()``, ``unsafe_buffer_pointer()``), else from NumPy's view of it (``__array__``: NumPy
    before 2.0 cannot export a read-only array, and its DLPack imports are read-only; a copy there
    only gives another address). Two tensors with elements share memory exactly when their
    addresses are equal."""
    from multidev.errors import MultidevError
    from multidev.exchange import exportable, peek

    if b.dlpack is not None:
        try:
            info = peek(exportable(b, x))
        except (MultidevError, BufferError, TypeError, ValueError, RuntimeError):
            info = None
        if info is not None:
            return info.address
    ai = getattr(x, "__array_interface__", None)
    if isinstance(ai, dict) and isinstance(ai.get("data"), tuple):
        return int(ai["data"][0])
    for attr in ("data_ptr", "unsafe_buffer_pointer"):
        fn = getattr(x, attr, None)
        if callable(fn):
            try:
                return int(fn())
            except Exception:  # noqa: BLE001 - the tensor cannot say (a multi-device array...)
                return None
    if callable(getattr(x, "__array__", None)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                a = np.asarray(x)
        except Exception:  # noqa: BLE001 - no host view (an accelerator array, a refused device)
            return None
        return int(a.ctypes.data)
    return None


def readiness(b: Any, x: Any) -> Callable[[], bool] | None:
    """A callable telling whether the work producing ``x`` has finished, where the framework
    exposes one: an ``is_ready()`` method on the tensor, or the CUDA stream of a CUDA tensor
    (``framework.cuda.current_stream(device).query()``). None where there is no such query."""
    ready = getattr(x, "is_ready", None)
    if callable(ready):
        return lambda: bool(ready())
    fw = sys.modules.get(b.framework)
    cuda: Any = getattr(fw, "cuda", None)
    if getattr(x, "is_cuda", False) is True and hasattr(cuda, "current_stream"):
        stream = cuda.current_stream(x.device)
        return lambda: bool(stream.query())
    return None


@dataclass
class Queued:
    """Work queued by :func:`pending_work`: ``y = x + x + ... + x`` (``terms`` terms)."""

    x: Any
    y: Any
    terms: int
    ready: Callable[[], bool] | None
    """The framework's readiness query for ``y``; None where it has none."""
    seen_pending: bool
    """Whether ``y`` was observed unfinished right after the calls that queued it returned."""


def queue_work(b: Any, device: Device, steps: int = 40, side: int = 2048) -> tuple[Any, Any]:
    """``(x, y)`` with ``y = x + x + ... + x`` (``steps + 1`` terms) built from ``steps`` dependent
    :meth:`combine` calls on ``device``, so an asynchronous backend has work queued when this
    returns. The values are small integers in float32: ``y == (steps + 1) * x`` exactly."""
    if device.is_gpu:
        side *= 4
    x = b.full((side, side), 3, "float32", device)
    b.wait(x)
    y = x
    for _ in range(steps):
        y = b.combine("sum", y, x)
    return x, y


def pending_work(b: Any, device: Device, attempts: int = 3) -> Queued:
    """Queue work on ``device`` until it is seen still running right after the calls return
    (growing it up to ``attempts`` times). Where readiness cannot be observed, the work is queued
    once and ``ready`` is None."""
    probe = b.full((2,), 1, "float32", device)
    if readiness(b, probe) is None:
        x, y = queue_work(b, device, steps=8, side=256)
        return Queued(x, y, 9, None, False)
    steps = 40
    for _ in range(attempts):
        x, y = queue_work(b, device, steps=steps)
        ready = readiness(b, y)
        assert ready is not None
        if not ready():
            return Queued(x, y, steps + 1, ready, True)
        steps *= 3
    return Queued(x, y, steps // 3 + 1, ready, False)


def async_failure(b: Any, device: Device) -> tuple[Any, bool] | None:
    """``(t, poisons)``: a tensor on ``device`` whose computation fails *after* the call that made
    it has returned, where the framework has such a failure; ``poisons`` tells whether the failure
    leaves the framework unusable in this process (a CUDA device-side error). None where no way to
    make one is known. Probes, by what the framework exposes:

    - a host callback under jit that raises (``framework.pure_callback``), fed by pending work so
      that it runs asynchronously;
    - a random-normal op with a negative scale, which fails on the engine thread
      (``framework.nd.random.normal``);
    - an out-of-range gather on a CUDA tensor (a device-side assert, reported at the next sync).
    """
    fw = sys.modules.get(b.framework)
    if fw is None:
        return None
    if hasattr(fw, "pure_callback") and hasattr(fw, "jit") and hasattr(fw, "ShapeDtypeStruct"):
        def fail(v: Any) -> Any:
            raise RuntimeError("multidev conformance: an asynchronous failure on purpose")

        f = fw.jit(lambda v: fw.pure_callback(fail, fw.ShapeDtypeStruct(v.shape, v.dtype), v))
        _, y = queue_work(b, device)
        return f(y), False
    nd = getattr(fw, "nd", None)
    normal = getattr(getattr(nd, "random", None), "normal", None)
    if callable(normal) and hasattr(fw, "cpu"):
        ctx = b.to_native_device(device)
        return normal(0, -1, shape=(4,), ctx=ctx), False
    x = b.full((4,), 0, "float32", device)
    if getattr(x, "is_cuda", False) is True and hasattr(fw, "tensor"):
        idx = fw.tensor([40], device=x.device)
        return x[idx], True
    return None


def collect() -> None:
    """Drop unreachable tensors now (a failed asynchronous tensor must not outlive its test)."""
    gc.collect()


# -- findings and isolation ------------------------------------------------------------------------
def found(backend: Any, key: str, value: Any) -> None:
    """Record a capability the checks observed (shown under the matrix and in the JSON)."""
    record_found(backend.name, key, value)


def restart_child() -> None:
    """Inside an isolated check: the framework is unusable now; end this child after the answer."""
    request_child_restart()


def isolated(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run this test's body in the suite's child interpreter (see :mod:`._isolation`): a framework
    that aborts on a buffer fails this check, not the run. Its arguments must be fixtures the child
    can rebuild (the adapter, devices, names, numbers)."""

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> None:
        from . import plugin

        plugin.run_isolated(fn, kwargs)

    return wrapper
