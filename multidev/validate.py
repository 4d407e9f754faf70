"""Argument checks done in the core before any framework sees the input: shapes, fill values, ranges,
seeds, reduction ops and axes. Each failure is a typed error naming the argument, the value and what
is accepted, so every backend refuses the same inputs the same way.
"""
from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .dtypes import ITEMSIZE, is_complex, is_floating
from .errors import CapabilityError, CollectiveInputError, InvalidArgumentError, MultidevError, OutOfMemoryError

__all__ = ["MAX_ELEMENTS", "MAX_NDIM", "OPS", "check_axis", "check_fill", "check_memory", "check_op", "check_range",
           "check_seed", "check_shape", "check_values", "check_writable", "numel", "range_length"]

#: Reductions accepted by the collectives (``mean`` is a sum and one division).
OPS = ("sum", "max", "min", "prod", "mean")
#: More dimensions than any framework takes (NumPy's limit is 64).
MAX_NDIM = 32
#: More elements than any device holds (2**48: 256 Ti elements); larger requests are refused before
#: a framework can abort on them.
MAX_ELEMENTS = 1 << 48


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def check_shape(shape: Any, what: str = "shape") -> tuple[int, ...]:
    """An int or a sequence of ints, each >= 0, as a tuple of Python ints. Floats, bools, strings,
    negative or huge sizes raise InvalidArgumentError (no coercion: ``(1.5,)`` is refused)."""
    if _is_int(shape):
        dims = [shape]
    elif isinstance(shape, (str, bytes)) or not isinstance(shape, (Sequence, np.ndarray)):
        raise InvalidArgumentError(f"{what} must be an int or a sequence of ints, got {shape!r:.60} "
                                   f"({type(shape).__name__})")
    else:
        dims = list(shape)
    if len(dims) > MAX_NDIM:
        raise InvalidArgumentError(f"{what} has {len(dims)} dimensions; at most {MAX_NDIM} are accepted")
    out = []
    for i, s in enumerate(dims):
        if not _is_int(s):
            raise InvalidArgumentError(f"{what}[{i}] must be an int, got {s!r:.40} ({type(s).__name__}) "
                                       f"in {what} {shape!r:.60}")
        if s < 0:
            raise InvalidArgumentError(f"{what}[{i}] is negative ({s}) in {what} {shape!r:.60}; sizes are >= 0")
        out.append(int(s))
    n = numel(out)
    if n > MAX_ELEMENTS:
        raise InvalidArgumentError(f"{what} {tuple(out)!r:.80} has {n:.3g} elements, more than any device "
                                   f"holds (limit {MAX_ELEMENTS:.3g})")
    return tuple(out)


_host_bytes: list[int | None] = []


def host_memory() -> int | None:
    """Bytes of memory this process may have: RAM plus swap (/proc/meminfo, else sysconf), or the
    container's cgroup limit when lower; read once. None where it cannot be told."""
    if not _host_bytes:
        total: int | None = None
        try:
            with open("/proc/meminfo") as f:
                kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in f if ln.split()[1:2] and ln.split()[1].isdigit()}
            total = (kb.get("MemTotal", 0) + kb.get("SwapTotal", 0)) * 1024 or None
        except (OSError, ValueError, IndexError):
            try:
                total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            except (ValueError, OSError, AttributeError):
                total = None
        for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
            try:  # a container's limit: beyond it the kernel kills the process instead of failing malloc
                with open(path) as f:
                    raw = f.read().strip()
            except OSError:
                continue
            if raw.isdigit() and (total is None or int(raw) < total):
                total = int(raw)
            break
        _host_bytes.append(total)
    return _host_bytes[0]


def check_memory(shape: Sequence[int], dtype: str, on_host: bool, what: str) -> None:
    """OutOfMemoryError before a framework tries to allocate more host memory than the machine has
    (RAM plus swap): frameworks may abort or be killed by the kernel instead of raising. Device
    memory is left to the framework, which raises its own out-of-memory error."""
    if not on_host:
        return
    need = numel(shape) * ITEMSIZE.get(dtype, 8)
    have = host_memory()
    if have is not None and need > have:
        raise OutOfMemoryError(f"{what}: a {dtype} tensor of shape {tuple(shape)!r:.80} needs {need / 2**30:.4g} GiB, "
                               f"more than this machine's {have / 2**30:.4g} GiB of memory (RAM and swap)")


def _limits(dtype: str) -> tuple[int, int] | None:
    if dtype == "bool":
        return 0, 1
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    return None


def _float_max(dtype: str) -> float:
    if dtype == "bfloat16":
        return 3.3895313892515355e38
    if dtype.startswith("complex"):
        return float(np.finfo("float32" if dtype == "complex64" else "float64").max)
    return float(np.finfo(dtype).max)


def check_fill(value: Any, dtype: str, what: str = "fill value") -> Any:
    """``value`` as a Python scalar exactly representable in ``dtype`` (floats may round, never
    overflow to infinity). InvalidArgumentError for None, strings, arrays, NaN or fractions into
    integers, out-of-range integers, an imaginary part into a real dtype."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (str, bytes)) or not isinstance(value, numbers.Number):
        raise InvalidArgumentError(f"{what} must be a real or complex number, got {value!r:.60} "
                                   f"({type(value).__name__})")
    if isinstance(value, complex) or (isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real)):
        c = complex(value)
        if not is_complex(dtype):
            if c.imag != 0:
                raise InvalidArgumentError(f"{what} {value!r} has an imaginary part, which a {dtype} tensor "
                                           "cannot hold; use a complex dtype or pass the real part")
            value = c.real
        else:
            for part in (c.real, c.imag):
                if math.isfinite(part) and abs(part) > _float_max(dtype):
                    raise InvalidArgumentError(f"{what} {value!r} overflows {dtype}")
            return c
    lim = _limits(dtype)
    if lim is not None:
        if isinstance(value, bool):
            return int(value) if dtype != "bool" else value
        if isinstance(value, float):
            if not math.isfinite(value) or value != int(value):
                raise InvalidArgumentError(f"{what} {value!r} is not an integer, so a {dtype} tensor cannot "
                                           "hold it exactly; round it first or use a floating dtype")
            value = int(value)
        if not isinstance(value, int):
            value = int(value)  # other Integral types
        lo, hi = lim
        if not lo <= value <= hi:
            raise InvalidArgumentError(f"{what} {value} does not fit {dtype} (range {lo}..{hi}); it would "
                                       "wrap silently. Use a wider dtype")
        return bool(value) if dtype == "bool" else value
    # floating (and complex, from a real value)
    if isinstance(value, bool):
        return float(value)
    f = float(value)
    if math.isfinite(f) and abs(f) > _float_max(dtype):
        raise InvalidArgumentError(f"{what} {value!r:.40} overflows {dtype} (max {_float_max(dtype):.4g}); "
                                   "it would become infinity")
    return complex(f) if is_complex(dtype) else f


def check_values(a: np.ndarray, dtype: str, what: str = "asarray") -> None:
    """Python data read as ``a`` (nested lists, scalars) must fit ``dtype`` exactly, by the rules of
    :func:`check_fill` (no wrapping integers, no fractions or NaN into integers, no imaginary part
    into a real dtype, no overflow to infinity). InvalidArgumentError names the first offender."""
    if a.size == 0 or dtype == a.dtype.name:
        return
    kind = a.dtype.kind
    if kind == "c" and not is_complex(dtype):
        bad = np.flatnonzero(a.imag != 0)
        if bad.size:
            raise InvalidArgumentError(f"{what}: value {a.flat[bad[0]]!r} has an imaginary part, which a {dtype} "
                                       "tensor cannot hold; pass the real parts or a complex dtype")
        a = a.real
        kind = a.dtype.kind
    lim = _limits(dtype)
    if lim is not None and kind in "fc":
        bad = np.flatnonzero(~np.isfinite(a) | (a != np.floor(a)))
        if bad.size:
            raise InvalidArgumentError(f"{what}: value {a.flat[bad[0]]!r} is not an integer, so a {dtype} tensor "
                                       "cannot hold it exactly; round it first or use a floating dtype")
    if lim is not None and kind in "iuf":
        lo, hi = lim
        mn, mx = a.min(), a.max()
        if mn < lo or mx > hi:
            off = mn if mn < lo else mx
            raise InvalidArgumentError(f"{what}: value {off!r} does not fit {dtype} (range {lo}..{hi}); it would "
                                       "wrap silently. Use a wider dtype")
    if lim is None and kind in "iuf":
        top = float(np.max(np.abs(a[np.isfinite(a)]))) if kind == "f" else float(max(abs(int(a.min())),
                                                                                     abs(int(a.max()))))
        if top > _float_max(dtype):
            raise InvalidArgumentError(f"{what}: value {top:.4g} overflows {dtype} (max {_float_max(dtype):.4g}); it "
                                       "would become infinity")


def check_range(start: Any, stop: Any, step: Any, dtype: str | None = None) -> tuple[Any, Any, Any]:
    """Real, finite bounds and a non-zero step; the number of elements must fit a device. Bounds of
    an integer dtype must be integers."""
    vals = []
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise InvalidArgumentError(f"arange {name} must be a real number, got {v!r:.40} ({type(v).__name__})")
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidArgumentError(f"arange {name} must be finite, got {v!r}")
        vals.append(v)
    start, stop, step = vals
    if step == 0:
        raise InvalidArgumentError("arange step must not be 0")
    if dtype is not None and not is_floating(dtype) and dtype != "bool":
        for name, v in (("start", start), ("stop", stop), ("step", step)):
            if not isinstance(v, numbers.Integral) and v != math.floor(v):
                raise InvalidArgumentError(f"arange {name} {v!r} is not an integer, but dtype {dtype} is")
    n = range_length(start, stop, step)
    if n > MAX_ELEMENTS:
        raise InvalidArgumentError(f"arange({start}, {stop}, {step}) would have {n:.3g} elements, more than any "
                                   "device holds")
    lim = _limits(dtype) if dtype is not None else None
    if lim is not None and n:
        last = start + (n - 1) * step
        lo, hi = lim
        if min(start, last) < lo or max(start, last) > hi:
            raise InvalidArgumentError(f"arange({start}, {stop}, {step}) runs from {start} to {last}, beyond {dtype} "
                                       f"(range {lo}..{hi}); the values would wrap. Use a wider dtype")
    elif dtype is not None and n:
        top = max(abs(float(start)), abs(float(start + (n - 1) * step)))
        if top > _float_max(dtype):
            raise InvalidArgumentError(f"arange({start}, {stop}, {step}) reaches {top:.4g}, beyond {dtype} (max "
                                       f"{_float_max(dtype):.4g})")
    return start, stop, step


def range_length(start: Any, stop: Any, step: Any) -> int:
    """The number of elements of ``arange(start, stop, step)``: exact for integers and fractions,
    NumPy's ``ceil((stop - start) / step)`` in float64 otherwise (never negative)."""
    if all(isinstance(v, numbers.Rational) for v in (start, stop, step)):
        d = stop - start
        q = -((-d) // step)  # exact ceil(d / step)
        return max(0, int(q))
    return max(0, math.ceil((float(stop) - float(start)) / float(step)))


def check_seed(seed: Any) -> int | None:
    """None or a non-negative int below 2**128."""
    if seed is None:
        return None
    if not _is_int(seed) or not 0 <= int(seed) < (1 << 128):
        raise InvalidArgumentError(f"seed must be None or an int in 0..2**128-1, got {seed!r:.40} "
                                   f"({type(seed).__name__})")
    return int(seed)


def nbytes(shape: Sequence[int], dtype: str) -> int:
    return numel(shape) * ITEMSIZE.get(dtype, 8)


_OPS_PASSED: set[tuple[str, str]] = set()  # (op, dtype) pairs check_op passed (a hot path: every collective)


def check_op(op: Any, dtype: str, what: str) -> None:
    """A reduction defined for ``dtype``: ``mean`` needs a floating dtype, bool takes max/min only,
    complex has no max/min."""
    if type(op) is str and (op, dtype) in _OPS_PASSED:
        return
    if not isinstance(op, str) or op not in OPS:
        raise CollectiveInputError(f"{what}: unknown op {op!r:.40}; expected one of {', '.join(OPS)}")
    if op == "mean" and not is_floating(dtype):
        raise CollectiveInputError(
            f"{what}: op='mean' on {dtype} tensors is refused (integer division would silently floor); "
            "cast to a floating dtype first, or use op='sum' and divide yourself"
        )
    if dtype == "bool" and op in ("sum", "prod"):
        raise CollectiveInputError(
            f"{what}: op={op!r} on bool tensors is refused (frameworks disagree on it); use op='max' "
            "for a logical or, op='min' for a logical and"
        )
    if is_complex(dtype) and op in ("max", "min"):
        raise CollectiveInputError(f"{what}: op={op!r} is undefined for {dtype} tensors")
    if type(op) is str and type(dtype) is str and len(_OPS_PASSED) < 256:
        _OPS_PASSED.add((op, dtype))


def check_axis(axis: Any, ndim: int, what: str) -> int:
    """``axis`` as a non-negative int below ``ndim``; 0-d tensors have no axis."""
    if isinstance(axis, bool) or not _is_int(axis):
        raise CollectiveInputError(f"{what}: axis must be an int, got {axis!r:.40}")
    if ndim == 0:
        raise CollectiveInputError(
            f"{what} splits or joins along an axis, which a 0-d tensor lacks; reshape it to (1,) first"
        )
    if not -ndim <= axis < ndim:
        raise CollectiveInputError(f"{what}: axis {axis} is out of range for {ndim}-d tensors")
    return int(axis) % ndim


def check_writable(b: Any, x: Any, what: str, src: Any = None) -> None:
    """The one writability probe: ``b.assign(x, src)`` (default: a copy of ``x`` itself, bitwise a
    no-op; skipped where the adapter's ``writable(x)`` answers from a flag), before anything else is
    written or any rank communicates. The framework's refusal
    (read-only arrays, inference or expanded tensors) comes as CapabilityError naming ``what``; an
    immutable backend (``capabilities.mutable`` False) is refused without trying."""
    if not b.capabilities.mutable:
        raise CapabilityError(f"{what}: {b.name} tensors are immutable, so they cannot be written in place; "
                              "use inplace=False and rebind the result")
    if src is None:
        known = b.writable(x) if hasattr(b, "writable") else None  # (adapters not built on BaseBackend)
        if known is True:
            return
        if known is False:
            raise CapabilityError(f"{what}: this {b.name} tensor cannot be written in place (it is read-only, or "
                                  "its elements share memory); pass writable tensors or use inplace=False")
    try:
        b.assign(x, b.copy(x, b.device_of(x)) if src is None else src)
    except MultidevError:
        raise
    except Exception as e:
        why = (str(e).strip().splitlines() or [""])[0][:200]
        raise CapabilityError(f"{what}: this {b.name} tensor cannot be written in place ({type(e).__name__}: "
                              f"{why}); pass writable tensors or use inplace=False") from e


def __getattr__(name: str) -> Any:
    """``translate_errors`` and ``framework_error`` moved to :mod:`multidev.errors` in 0.4; the old
    import path works until 0.5, with a DeprecationWarning."""
    if name in ("translate_errors", "framework_error"):
        import warnings

        from . import errors
        warnings.warn(f"multidev.validate.{name} moved to multidev.errors.{name} (0.4); the old path goes in 0.5",
                      DeprecationWarning, stacklevel=2)
        return getattr(errors, name)
    raise AttributeError(f"module 'multidev.validate' has no attribute {name!r}")
