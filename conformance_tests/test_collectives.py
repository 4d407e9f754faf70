"""Collectives against a float64 NumPy reference, on every backend with several devices."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import multidev as md
from multidev.errors import CapabilityError, CollectiveInputError

from ._helpers import as_f64, assert_close, need_devices, need_dtype, np_dtype

pytestmark = pytest.mark.md_feature("collectives")

_REF = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod, "mean": np.mean}


def _inputs(b: Any, devs: list, arrays: list[np.ndarray], dtype: str) -> list[Any]:
    return [md.asarray(a, dtype=dtype, device=d, backend=b.name) for a, d in zip(arrays, devs)]


def _algorithms(b: Any) -> list[str]:
    algs = ["naive", "auto"]
    if "allreduce" in b.capabilities.native_collectives:
        algs.append("native")
    return algs


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_allreduce_ops_match_reference(md_backend: Any, md_devices: list, op: str, dtype: str) -> None:
    b = md_backend
    need_dtype(b, dtype)
    devs = need_devices(md_devices, 2)
    rng = np.random.default_rng(0)
    arrays = [(rng.integers(1, 4, size=(3, 5))).astype(np_dtype(dtype)) for _ in devs]
    expect = _REF[op](np.stack([a.astype(np.float64) for a in arrays]), axis=0)
    for alg in _algorithms(b):
        xs = _inputs(b, devs, arrays, dtype)
        if op == "mean" and dtype.startswith("int"):
            with pytest.raises(CollectiveInputError, match="mean"):
                md.allreduce(xs, op=op, algorithm=alg)
            continue
        if alg == "native":
            try:
                out = md.allreduce(xs, op=op, algorithm=alg)
            except CapabilityError as e:
                assert b.name in str(e)
                continue
        else:
            out = md.allreduce(xs, op=op, algorithm=alg)
        assert len(out) == len(xs)
        for x, y, d in zip(xs, out, devs):
            assert md.device_of(y) == d, f"{alg}: result must live on its input's device"
            assert md.dtype_of(y) == dtype
            assert_close(as_f64(b, y), expect, dtype, len(devs))
        for a, x in zip(arrays, xs):  # out of place: inputs untouched
            np.testing.assert_array_equal(as_f64(b, x), a.astype(np.float64))


def test_allreduce_inplace(md_backend: Any, md_devices: list) -> None:
    b = md_backend
    devs = need_devices(md_devices, 2)
    arrays = [np.full((4,), i + 1, dtype=np.float32) for i in range(len(devs))]
    xs = _inputs(b, devs, arrays, "float32")
    if not b.capabilities.mutable:
        with pytest.raises(CapabilityError, match=b.name):
            md.allreduce(xs, inplace=True)
        for a, x in zip(arrays, xs):
            np.testing.assert_array_equal(as_f64(b, x), a)
        return
    out = md.allreduce(xs, inplace=True)
    assert all(o is x for o, x in zip(out, xs))
    for x in xs:
        np.testing.assert_array_equal(as_f64(b, x), np.full((4,), sum(range(1, len(devs) + 1))))


def test_allreduce_bad_inputs_leave_inputs_untouched(md_backend: Any, md_devices: list) -> None:
    b = md_backend
    devs = need_devices(md_devices, 2)
    a = md.ones((2, 3), device=devs[0], backend=b.name)
    c = md.ones((3, 2), device=devs[1], backend=b.name)
    i = md.ones((2, 3), dtype="int32", device=devs[1], backend=b.name)
    same = md.ones((2, 3), device=devs[0], backend=b.name)
    for bad, match in (([], "at least one"), ([a, c], "shape"), ([a, i], "dtype"), ([a, same], "more than once")):
        with pytest.raises(CollectiveInputError, match=match):
            md.allreduce(bad, inplace=b.capabilities.mutable)
    with pytest.raises(CollectiveInputError, match="op"):
        md.allreduce([a, md.ones((2, 3), device=devs[1], backend=b.name)], op="median")
    with pytest.raises(CollectiveInputError, match="algorithm"):
        md.allreduce([a, md.ones((2, 3), device=devs[1], backend=b.name)], algorithm="telepathy")
    for x in (a, c, same):
        assert float(as_f64(b, x).sum()) == 6.0
    if "allreduce" not in b.capabilities.native_collectives:
        with pytest.raises(CapabilityError, match=b.name):
            md.allreduce([a, md.ones((2, 3), device=devs[1], backend=b.name)], algorithm="native")


def test_allreduce_mixed_backends_raise(md_backend: Any, md_device: Any) -> None:
    if md_backend.name == "numpy":
        pytest.skip("needs a second backend; the numpy reference is the other side")
    x = md.ones(2, device=md_device, backend=md_backend.name)
    y = md.ones(2, device="cpu:0", backend="numpy")
    with pytest.raises(CollectiveInputError, match="several backends"):
        md.allreduce([x, y])


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_allreduce_property(md_backend: Any, md_devices: list, data: Any) -> None:
    b = md_backend
    if len(md_devices) < 2:
        pytest.skip(f"needs 2 devices; {b.name} has {len(md_devices)} here")
    n = data.draw(st.integers(2, len(md_devices)), label="devices")
    shape = tuple(data.draw(st.lists(st.integers(0, 5), min_size=0, max_size=3), label="shape"))
    op = data.draw(st.sampled_from(["sum", "max", "min", "mean"]), label="op")
    vals = st.floats(-1e3, 1e3, allow_nan=False, width=32)
    arrays = [np.asarray(data.draw(st.lists(vals, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))),
                         dtype=np.float32).reshape(shape) for _ in range(n)]
    devs = md_devices[:n]
    out = md.allreduce(_inputs(b, devs, arrays, "float32"), op=op)
    expect = _REF[op](np.stack([a.astype(np.float64) for a in arrays]), axis=0)
    for y, d in zip(out, devs):
        assert md.device_of(y) == d
        got = as_f64(b, y)
        assert got.shape == shape
        np.testing.assert_allclose(got, expect, rtol=1e-5 * n, atol=1e-3 * n)
