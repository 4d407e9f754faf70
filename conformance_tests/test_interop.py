"""Transfers and exchange: non-blocking moves with handles, batched host copies, and convert()
between every ordered pair of installed backends on every shared device."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device
from multidev.errors import CapabilityError

from ._helpers import as_f64, need_dtype, other_device
from ._isolate import run_isolated

_PARTNERS = md.backends()


@pytest.mark.md_feature("transfers")
def test_nonblocking_move_returns_a_handle(md_backend: Any, md_device: Device, md_devices: list) -> None:
    src = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = md.asarray(src, device=md_device, backend=md_backend.name)
    same = md.to(x, md_device, non_blocking=True)
    assert isinstance(same, md.Transfer) and same.wait() is x
    other = other_device(md_devices, md_device)
    h = md.to(x, other, non_blocking=True)
    assert isinstance(h, md.Transfer)
    y = h.wait()
    assert h.done() and h.wait() is y
    assert md.device_of(y) == other and md.dtype_of(y) == "float32"
    np.testing.assert_array_equal(as_f64(md_backend, y), src)


@pytest.mark.md_feature("transfers")
@pytest.mark.parametrize("non_blocking", [False, True])
def test_to_host_many(md_backend: Any, md_device: Device, non_blocking: bool) -> None:
    b = md_backend
    xs = [md.rand((32, 16), device=md_device, backend=b.name, seed=s) for s in range(4)]
    ys = [b.combine("sum", x, x) for x in xs]  # queued work the copies must wait for
    got: Any = md.to_host(ys, non_blocking=non_blocking)
    if non_blocking:
        assert isinstance(got, md.Transfer)
        got = got.wait()
    assert len(got) == 4
    for x, a in zip(xs, got):
        assert type(a) is np.ndarray and a.shape == (32, 16)
        np.testing.assert_allclose(a.astype(np.float64), 2 * as_f64(b, x), rtol=1e-6)


def _pairs(b: Any, partner: str) -> tuple[Any, list[Device]]:
    if partner == b.name:
        pytest.skip("convert to the same backend is covered by test_convert_same_backend")
    p = md.backend(partner)
    shared = [d for d in b.devices() if d in p.devices()]
    return p, shared


@pytest.mark.md_feature("interop")
@pytest.mark.parametrize("partner", _PARTNERS)
@pytest.mark.parametrize("dtype", ["float32", "int32", "float64", "bfloat16"])
def test_convert_both_ways(request: pytest.FixtureRequest, md_backend: Any, partner: str, dtype: str) -> None:
    if run_isolated(request, md_backend.name, partner):
        return  # its checks ran, and passed, in a child process (risky partner: see _isolate)
    b = md_backend
    p, shared = _pairs(b, partner)
    need_dtype(b, dtype, *shared[:2])
    need_dtype(p, dtype, *shared[:2])
    src = (np.arange(12).reshape(3, 4) - 5).astype(np.float32 if dtype == "bfloat16" else dtype)
    for dev in shared[:2]:
        for frm, to_ in ((b, p), (p, b)):
            x = md.asarray(src, dtype=dtype, device=dev, backend=frm.name)
            y = md.convert(x, to_.name)
            assert isinstance(y, to_.tensor_types()), f"{frm.name}->{to_.name}: got {type(y)}"
            assert md.device_of(y) == dev and md.dtype_of(y) == dtype
            np.testing.assert_array_equal(as_f64(to_, y), src.astype(np.float64))


@pytest.mark.md_feature("interop")
@pytest.mark.parametrize("partner", _PARTNERS)
def test_convert_copy_flag_and_sharing(request: pytest.FixtureRequest, md_backend: Any, partner: str) -> None:
    if run_isolated(request, md_backend.name, partner):
        return  # its checks ran, and passed, in a child process (risky partner: see _isolate)
    b = md_backend
    p, shared = _pairs(b, partner)
    if not (b.capabilities.dlpack and p.capabilities.dlpack):
        with pytest.raises(CapabilityError):
            md.convert(md.ones(3, device=shared[0], backend=b.name), p.name, copy=False)
        pytest.skip(f"{b.name} or {p.name} has no DLPack (capabilities.dlpack)")
    for dev in shared[:2]:
        for frm, to_ in ((b, p), (p, b)):
            x = md.asarray(np.arange(4, dtype=np.float32), device=dev, backend=frm.name)
            z = md.convert(x, to_.name, copy=True)
            try:
                y = md.convert(x, to_.name, copy=False)
            except CapabilityError as e:
                # Zero-copy is the promise on the host and on GPUs. A virtual CPU device other
                # than cpu:0 may be out of a consumer's reach (DLPack names every CPU 0).
                assert dev.kind == "cpu" and dev.index > 0, f"{frm.name}->{to_.name} on {dev}: {e}"
                assert "share" in str(e) and "copy=None" in str(e)
                y = None
            expect = np.arange(4.0)
            if frm.capabilities.mutable:
                # A write on the source shows through the shared view only. It happens before the
                # first read of y: immutable consumers (JAX) may cache a host copy once read.
                frm.assign(x, md.full(4, 7.0, device=dev, backend=frm.name))
                md.synchronize(x)
                expect = np.full(4, 7.0)
            if y is not None:
                assert md.device_of(y) == dev
                np.testing.assert_array_equal(as_f64(to_, y), expect)
            np.testing.assert_array_equal(as_f64(to_, z), np.arange(4))


@pytest.mark.md_feature("interop")
def test_convert_same_backend(md_backend: Any, md_device: Device) -> None:
    x = md.ones(3, device=md_device, backend=md_backend.name)
    assert md.convert(x, md_backend.name) is x
    y = md.convert(x, md_backend.name, copy=True)
    assert y is not x and md.device_of(y) == md_device


@pytest.mark.md_feature("interop")
@pytest.mark.parametrize("partner", _PARTNERS)
def test_convert_transposed_view(request: pytest.FixtureRequest, md_backend: Any, partner: str) -> None:
    """A transposed (strided) view converts to the right values: zero-copy where the consumer takes
    strides, else through the documented explicit copy."""
    if run_isolated(request, md_backend.name, partner):
        return  # its checks ran, and passed, in a child process (risky partner: see _isolate)
    b = md_backend
    p, shared = _pairs(b, partner)
    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = md.asarray(src, device=shared[0], backend=b.name)
    xt = getattr(x, "T", None)
    if xt is None:
        pytest.skip(f"{b.name} tensors have no .T view to make a strided source from")
    y = md.convert(xt, p.name)
    assert md.device_of(y) == shared[0]
    np.testing.assert_array_equal(as_f64(p, y), src.T)
