"""Every public call away from its defaults (issue 35): property-based checks (hypothesis) give
each keyword argument values other than its default and vary the inputs: dtypes at their limits
(the smallest and largest values, infinities and NaN, the smallest normal float), zero-size and
0-d shapes, host inputs that are strided, transposed or reversed views, the framework's own
non-contiguous views (``x[::2]``, ``x.T``), element counts around the collectives' boundaries (fewer
elements than devices, as many, one more). Few examples per backend: the suite runs on every
backend in CI, on two cores."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import multidev as md
from multidev.adapter import numpy_dtype

from ._helpers import need_dtype, ordered
from .plugin import algorithms_of

pytestmark = pytest.mark.md_feature("arguments")

_FEW = settings(max_examples=6, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

PLACEMENT_DTYPES = ("bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64",
                    "complex64")
COLLECTIVE_DTYPES = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")


def _finfo(dtype: str) -> Any:
    nd = numpy_dtype(dtype)
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(nd)
    return np.finfo(nd)


def limits(dtype: str) -> np.ndarray:
    """The values at the limits of ``dtype``, in ``dtype``: its extremes, zero and one (and -1), and
    for floats the smallest normal number, the infinities and NaN."""
    nd = numpy_dtype(dtype)
    if dtype == "bool":
        vals: list[Any] = [True, False]
    elif nd.kind in "iu":
        info = np.iinfo(nd)
        vals = [info.min, info.max, 0, 1] + ([-1] if nd.kind == "i" else [])
    else:
        real = "float32" if dtype == "complex64" else ("float64" if dtype == "complex128" else dtype)
        f = _finfo(real)
        vals = [float(f.max), -float(f.max), float(f.tiny), 0.0, 1.0, -1.0, np.inf, -np.inf, np.nan]
        if nd.kind == "c":
            vals = [complex(v, w) for v, w in zip(vals, vals[::-1])]
    return np.array(vals, dtype=object).astype(nd) if dtype != "bfloat16" else \
        np.array(vals, dtype=np.float32).astype(nd)


def _host(a: np.ndarray) -> np.ndarray:
    """``a`` in a type exact comparisons can use (bfloat16 through float32)."""
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype.name == "bfloat16" else a


def _same(got: Any, want: np.ndarray, what: str) -> None:
    g, w = _host(np.asarray(got)), _host(want)
    assert g.dtype == w.dtype, f"{what}: dtype {g.dtype}, expected {w.dtype}"
    assert g.shape == w.shape, f"{what}: shape {g.shape}, expected {w.shape}"
    np.testing.assert_array_equal(g, w, err_msg=what)  # NaN equals NaN here


def _data(draw: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An array of ``shape`` holding the limits of ``dtype`` (cycled, in a drawn order)."""
    lim = limits(dtype)
    size = int(np.prod(shape))
    order = draw(st.permutations(list(range(len(lim)))), label="order of the limits")
    return lim[[order[i % len(lim)] for i in range(size)]].reshape(shape)


def _laid_out(a: np.ndarray, layout: str) -> np.ndarray:
    """``a``'s values in a host array of the given layout (a view into a larger buffer)."""
    if layout == "strided" and a.ndim:
        big = np.empty((a.shape[0] * 2, *a.shape[1:]), dtype=a.dtype)
        big[::2] = a
        return big[::2]
    if layout == "transposed" and a.ndim == 2:
        return np.ascontiguousarray(a.T).T
    if layout == "reversed" and a.ndim:
        return np.ascontiguousarray(a[::-1])[::-1]
    return a.copy(order="C")


def _views(x: Any, ref: np.ndarray) -> list[tuple[str, Any, np.ndarray]]:
    """The framework's own non-contiguous views of ``x`` (a step slice, a transpose), where its
    tensors have them and its own operation computes them (MXNet's transpose refuses bool and
    zero-size arrays, reported when waited for), with the values each must hold."""
    out = []
    makers = [("x[::2]", lambda: x[::2], ref[::2] if ref.ndim else None),
              ("x.T", lambda: x.T, ref.T if ref.ndim == 2 else None)]
    for what, make, want in makers:
        if want is None:
            continue
        try:
            v = make()
            md.synchronize(v)
        except Exception:  # noqa: BLE001 - the framework has no such view of this tensor
            continue
        out.append((what, v, want))
    return out


_SHAPES = st.sampled_from([(), (0,), (3, 0), (5,), (2, 3), (4, 1, 2), (7, 3)])


@pytest.mark.parametrize("dtype", PLACEMENT_DTYPES)
def test_placement_calls_away_from_their_defaults(md_backend: Any, md_devices: list, dtype: str) -> None:
    """``asarray`` (dtype, device, backend given), ``to`` (blocking and not), ``copy`` (to its own
    device and to another), ``to_numpy``, ``to_host`` (blocking and not) and ``full`` keep every
    value at the dtype's limits, every shape (zero-size and 0-d included) and every layout of
    their input exactly; so do ``to``, ``copy`` and ``to_numpy`` of the framework's own
    non-contiguous views."""
    b = md_backend
    need_dtype(b, dtype, *md_devices[:1])

    @_FEW
    @given(data=st.data())
    def check(data: Any) -> None:
        shape = data.draw(_SHAPES, label="shape")
        layout = data.draw(st.sampled_from(["contiguous", "strided", "transposed", "reversed"]), label="layout")
        devs = [d for d in md_devices if dtype in b.capabilities.dtypes_on(d)]
        src = data.draw(st.sampled_from(devs), label="device")
        dst = data.draw(st.sampled_from(devs), label="target")
        ref = _data(data.draw, dtype, shape)
        x = md.asarray(_laid_out(ref, layout), dtype=dtype, device=src, backend=b.name)
        assert md.device_of(x) == src and md.dtype_of(x) == dtype
        _same(md.to_numpy(x), ref, f"asarray({layout} {shape}, dtype={dtype}, device={src})")
        blocking = data.draw(st.booleans(), label="non_blocking")
        y = md.to(x, dst, non_blocking=True).wait() if blocking else md.to(x, dst)
        assert md.device_of(y) == dst
        _same(md.to_numpy(y), ref, f"to({src} -> {dst}, non_blocking={blocking})")
        c = md.copy(x, data.draw(st.sampled_from([None, dst]), label="copy to"))
        _same(md.to_numpy(c), ref, "copy")
        h = md.to_host([x], non_blocking=True).wait() if blocking else md.to_host([x])
        _same(h[0], ref, f"to_host(non_blocking={blocking})")
        if ref.size:
            v = ref.reshape(-1)[0]
            f = md.full(shape, v.item() if dtype != "bfloat16" else float(v), dtype=dtype, device=dst, backend=b.name)
            _same(md.to_numpy(f), np.full(shape, v, dtype=ref.dtype), f"full({shape}, {v!r}, dtype={dtype})")
        for what, view, want in _views(x, ref):
            _same(md.to_numpy(view), want, f"to_numpy({what})")
            _same(md.to_numpy(md.copy(view, dst)), want, f"copy({what}, {dst})")
            _same(md.to_numpy(md.to(view, dst)), want, f"to({what}, {dst})")

    check()


def _values(dtype: str, op: str, n: int, shape: tuple[int, ...], seed: int) -> list[np.ndarray]:
    """Per-device inputs whose reduction by ``op`` stays in range: the limits themselves for max and
    min; for integer sums, values up to the limits divided by the device count; for float sums,
    small integers times the largest safe power of two, one or the smallest normal number (exact in
    any order); small values for products and means."""
    rng = np.random.default_rng(seed)
    nd = numpy_dtype(dtype)
    size = int(np.prod(shape))
    lim = limits(dtype)
    if op in ("max", "min"):  # NaN left out: whether max/min propagate it is not in the contract
        # (NumPy's and the portable algorithms' do; JAX's native pmax on CPUs drops it)
        lim = lim[~np.isnan(_host(lim).astype(np.float64))] if lim.dtype.kind in "fcV" or dtype == "bfloat16" else lim
        return [lim[rng.integers(0, len(lim), size=size)].reshape(shape) for _ in range(n)]
    if nd.kind in "iu":
        info = np.iinfo(nd)
        if op == "sum":
            hi, lo = info.max // n, (info.min // n) + (1 if info.min else 0)
            pool = np.array([hi, lo, 0, 1], dtype=nd)
            return [pool[rng.integers(0, 4, size=size)].reshape(shape) for _ in range(n)]
        return [rng.integers(0 if nd.kind == "u" else -2, 3, size=shape).astype(nd) for _ in range(n)]
    if op == "sum":  # per element one scale (near the largest power of two that cannot overflow, one, the
        # smallest normal), times small integers: every order of summation gives the same exact sum
        f = _finfo(dtype)
        big = 2.0 ** (int(np.floor(np.log2(float(f.max)))) - 4)
        scales = np.array([big, 1.0, float(f.tiny)])[rng.integers(0, 3, size=size)].reshape(shape)
        return [(scales * rng.integers(-2, 3, size=shape)).astype(np.float32 if dtype == "bfloat16" else nd).astype(nd)
                for _ in range(n)]
    return [rng.integers(1, 3, size=shape).astype(np.float32).astype(nd) for _ in range(n)]


def _reference(arrays: list[np.ndarray], op: str) -> np.ndarray:
    stack = np.stack([_host(a) for a in arrays])
    kind = stack.dtype.kind
    wide = stack.astype(object if kind in "iu" else np.float64)
    out = {"sum": lambda s: s.sum(0), "prod": lambda s: s.prod(0), "max": lambda s: s.max(0),
           "min": lambda s: s.min(0), "mean": lambda s: s.sum(0) / len(arrays)}[op](wide)
    return np.asarray(out, dtype=np.float64 if kind not in "iu" else stack.dtype)


@pytest.mark.parametrize("dtype", COLLECTIVE_DTYPES)
def test_allreduce_and_reduce_away_from_their_defaults(md_backend: Any, md_devices: list, dtype: str) -> None:
    """``allreduce`` with every op, ``inplace``, ``algorithm`` and ``deterministic`` drawn, and
    ``reduce`` to a drawn device, over values at the dtype's limits (the extremes for max and min,
    sums reaching them), element counts around the device count (fewer, as many, one more) and
    zero-size tensors: integers exact, floats within the dtype's rounding."""
    b = md_backend
    need_dtype(b, dtype, *md_devices)
    floating = np.dtype(_host(np.zeros(1, numpy_dtype(dtype))).dtype).kind == "f"
    ops = ["sum", "max", "min", "prod"] + (["mean"] if floating else [])

    @_FEW
    @given(data=st.data())
    def check(data: Any) -> None:
        devs = ordered(md_devices)[:data.draw(st.integers(1, len(md_devices)), label="devices")]
        n = len(devs)
        numel = data.draw(st.sampled_from(sorted({0, max(n - 1, 1), n, n + 1})), label="elements")
        shape = (numel,) if data.draw(st.booleans(), label="1-d") else (1, numel)
        algs = algorithms_of(b)
        if len({d.kind for d in devs}) > 1 and "native" in algs:
            algs.remove("native")
        alg = data.draw(st.sampled_from(algs), label="algorithm")
        deterministic = alg != "native" and data.draw(st.booleans(), label="deterministic")
        inplace = b.capabilities.mutable and data.draw(st.booleans(), label="inplace")
        seed = data.draw(st.integers(0, 2 ** 16), label="seed")
        for op in ops:
            arrays = _values(dtype, op, n, shape, seed)
            xs = [md.asarray(a, dtype=dtype, device=d, backend=b.name) for a, d in zip(arrays, devs)]
            out = md.allreduce(xs, op, inplace=inplace, algorithm=alg, deterministic=deterministic)
            want = _reference(arrays, op)
            what = f"allreduce({op}, {dtype}, {shape}, {n} devices, {alg}, inplace={inplace}, det={deterministic})"
            for y, d in zip(out, devs):
                assert md.device_of(y) == d and md.dtype_of(y) == dtype, what
                _close(md.to_numpy(y), want, dtype, n, what)
            target = data.draw(st.sampled_from(md_devices), label="reduce to")
            arrays = _values(dtype, op, n, shape, seed + 1)
            y = md.reduce([md.asarray(a, dtype=dtype, device=d, backend=b.name) for a, d in zip(arrays, devs)],
                          target, op)
            assert md.device_of(y) == target
            _close(md.to_numpy(y), _reference(arrays, op), dtype, n, f"reduce({op}, {dtype}) to {target}")

    check()


def _close(got: Any, want: np.ndarray, dtype: str, n: int, what: str) -> None:
    g = _host(np.asarray(got))
    assert g.shape == want.shape, f"{what}: shape {g.shape}, expected {want.shape}"
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(g, want, err_msg=what)
        return
    eps = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1.2e-7, "float64": 2.3e-16}[dtype]
    np.testing.assert_allclose(g.astype(np.float64), want, rtol=4 * eps * n, atol=0, err_msg=what)
