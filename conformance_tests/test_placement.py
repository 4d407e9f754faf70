"""Creation honours device and dtype; to is identity when resident; copy is independent; moves keep
values; mismatched devices raise; synchronize and to_numpy give the computed values."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device
from multidev.errors import (
    BackendNotAvailableError,
    CapabilityError,
    DeviceMismatchError,
    DeviceNotFoundError,
    InvalidDeviceError,
    UnsupportedTensorError,
)

from ._helpers import CREATION_DTYPES, as_f64, buffer_address, need_dtype, np_dtype, other_device

pytestmark = pytest.mark.md_feature("placement")


def _check(b: Any, x: Any, device: Device, dtype: str, expected: np.ndarray) -> None:
    assert isinstance(x, b.tensor_types()), f"{type(x)} is not a native {b.name} tensor"
    assert md.device_of(x) == device
    assert md.dtype_of(x) == dtype
    assert b.shape_of(x) == expected.shape
    np.testing.assert_array_equal(as_f64(b, x), expected.astype(as_f64(b, x).dtype))


_INT = object()  # int64, or int32 on a device that holds no int64
#: What each creation call gives without a dtype: the README's rule, on every backend.
_DEFAULTS: dict[str, tuple[Any, Any]] = {
    "zeros(2)": (lambda n, d: md.zeros(2, device=d, backend=n), "float32"),
    "ones(2)": (lambda n, d: md.ones(2, device=d, backend=n), "float32"),
    "empty(2)": (lambda n, d: md.empty(2, device=d, backend=n), "float32"),
    "rand(2)": (lambda n, d: md.rand(2, device=d, backend=n), "float32"),
    "full(2, True)": (lambda n, d: md.full(2, True, device=d, backend=n), "bool"),
    "full(2, 3)": (lambda n, d: md.full(2, 3, device=d, backend=n), _INT),
    "full(2, 1.5)": (lambda n, d: md.full(2, 1.5, device=d, backend=n), "float32"),
    "full(2, 1j)": (lambda n, d: md.full(2, 1j, device=d, backend=n), "complex64"),
    "arange(3)": (lambda n, d: md.arange(3, device=d, backend=n), _INT),
    "arange(0.5)": (lambda n, d: md.arange(0.5, device=d, backend=n), "float32"),
    "asarray([1, 2])": (lambda n, d: md.asarray([1, 2], device=d, backend=n), _INT),
    "asarray([1.0])": (lambda n, d: md.asarray([1.0], device=d, backend=n), "float32"),
    "asarray(2.5)": (lambda n, d: md.asarray(2.5, device=d, backend=n), "float32"),
    "asarray([True])": (lambda n, d: md.asarray([True], device=d, backend=n), "bool"),
    "asarray([1j])": (lambda n, d: md.asarray([1j], device=d, backend=n), "complex64"),
    "asarray(int8 array)": (lambda n, d: md.asarray(np.ones(2, np.int8), device=d, backend=n), "int8"),
    "asarray(float64 array)": (lambda n, d: md.asarray(np.ones(2), device=d, backend=n), "float64"),
}


@pytest.mark.md_feature("creation")
@pytest.mark.parametrize("call", list(_DEFAULTS))
def test_default_dtypes_are_the_documented_ones(md_backend: Any, md_device: Device, call: str) -> None:
    """Without a dtype, creation gives the README's defaults on every backend (not each framework's
    own inference: a list of ints is int64 on torch, JAX and TF alike)."""
    b, n = md_backend, md_backend.name
    make, want = _DEFAULTS[call]
    held = b.capabilities.dtypes_on(md_device)
    if want is _INT:
        want = "int64" if "int64" in held else "int32"
    if want not in held:
        pytest.skip(f"{n} cannot hold {want} on {md_device} (capabilities.dtypes): the call refuses it")
    got = md.dtype_of(make(n, md_device))
    assert got == want, f"{n} {call} on {md_device} gave {got}, the documented default is {want}"


@pytest.mark.md_feature("creation")
@pytest.mark.parametrize("dtype", CREATION_DTYPES)
def test_creation_honours_device_and_dtype(md_backend: Any, md_device: Device, dtype: str) -> None:
    b, n = md_backend, md_backend.name
    need_dtype(b, dtype, md_device)
    nd = np_dtype(dtype)
    _check(b, md.zeros((2, 3), dtype=dtype, device=md_device, backend=n), md_device, dtype, np.zeros((2, 3), nd))
    _check(b, md.ones((4,), dtype=dtype, device=md_device, backend=n), md_device, dtype, np.ones((4,), nd))
    _check(b, md.full((3, 1), 1, dtype=dtype, device=md_device, backend=n), md_device, dtype, np.full((3, 1), 1, nd))
    e = md.empty((2, 2), dtype=dtype, device=md_device, backend=n)
    assert md.device_of(e) == md_device and md.dtype_of(e) == dtype and b.shape_of(e) == (2, 2)
    if dtype != "bool":
        _check(b, md.arange(0, 5, 1, dtype=dtype, device=md_device, backend=n), md_device, dtype,
               np.arange(0, 5, 1).astype(nd))
    src = (np.arange(6).reshape(2, 3) % 2).astype(nd)
    _check(b, md.asarray(src, dtype=dtype, device=md_device, backend=n), md_device, dtype, src)
    _check(b, md.asarray(src.tolist(), dtype=dtype, device=md_device, backend=n), md_device, dtype, src)


@pytest.mark.md_feature("creation")
def test_creation_defaults(md_backend: Any, md_device: Device) -> None:
    n = md_backend.name
    assert md.dtype_of(md.zeros(3, device=md_device, backend=n)) == "float32"
    assert md.dtype_of(md.arange(4, device=md_device, backend=n)) in ("int64", "int32")
    assert md.dtype_of(md.arange(0.0, 1.0, 0.25, device=md_device, backend=n)) == "float32"
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    x = md.asarray(a, device=md_device, backend=n)
    assert md.dtype_of(x) == "float32" and md.device_of(x) == md_device
    with md.device_scope(md_device):
        assert md.device_of(md.ones(2, backend=n)) == md_device
    assert md.device_of(md.ones(2, backend=n)) == Device("cpu", 0), "scope must end with the block"
    with md.device_scope(md_device, backend=n):
        y = md.zeros(2)
        assert isinstance(y, md_backend.tensor_types()) and md.device_of(y) == md_device


@pytest.mark.md_feature("creation")
@pytest.mark.parametrize("dtype", ("float32", "float64", "bfloat16"))
def test_rand_uniform_and_seeded(md_backend: Any, md_device: Device, dtype: str) -> None:
    need_dtype(md_backend, dtype, md_device)
    n = md_backend.name
    x = md.rand((64, 8), dtype=dtype, device=md_device, backend=n, seed=7)
    y = md.rand((64, 8), dtype=dtype, device=md_device, backend=n, seed=7)
    assert md.device_of(x) == md_device and md.dtype_of(x) == dtype
    v = as_f64(md_backend, x)
    assert v.shape == (64, 8) and v.min() >= 0.0 and v.max() <= 1.0 and v.std() > 0.1
    np.testing.assert_array_equal(v, as_f64(md_backend, y))


def test_to_is_identity_when_resident(md_backend: Any, md_device: Device) -> None:
    x = md.ones((2, 3), device=md_device, backend=md_backend.name)
    assert md.to(x, md_device) is x
    assert md.to(x, str(md_device)) is x
    assert md.to(x, md_backend.to_native_device(md_device)) is x


def test_move_keeps_values(md_backend: Any, md_device: Device, md_devices: list) -> None:
    other = other_device(md_devices, md_device)
    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = md.asarray(src, device=md_device, backend=md_backend.name)
    y = md.to(x, other)
    assert y is not x and md.device_of(y) == other and md.device_of(x) == md_device
    assert md.dtype_of(y) == "float32"
    np.testing.assert_array_equal(as_f64(md_backend, y), src)
    z = md.to(y, md_device)
    np.testing.assert_array_equal(as_f64(md_backend, z), src)


def test_copy_is_a_new_buffer(md_backend: Any, md_device: Device, md_devices: list) -> None:
    """copy always makes a new buffer: never x itself, never x's memory (by buffer address where
    DLPack can tell, and through a write on mutable backends)."""
    b = md_backend
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = md.asarray(src, device=md_device, backend=b.name)
    y = md.copy(x)
    assert y is not x and md.device_of(y) == md_device
    np.testing.assert_array_equal(as_f64(b, y), src)
    here = buffer_address(b, x)
    targets = [md_device] + [d for d in md_devices if d != md_device][:1]
    for dev in targets:
        z = md.copy(x, dev)
        assert md.device_of(z) == dev
        np.testing.assert_array_equal(as_f64(b, z), src)
        if here is not None:
            assert buffer_address(b, z) != here, f"copy to {dev} shares x's buffer"
    if not b.capabilities.mutable:
        if here is None:
            pytest.skip(f"{b.name} tensors are immutable (capabilities.mutable=False) and have no DLPack: "
                        "independence cannot be observed")
        return  # immutable: the buffer addresses above were the check
    b.assign(y, b.full((2, 3), 9, "float32", md_device))
    np.testing.assert_array_equal(as_f64(b, x), src)
    np.testing.assert_array_equal(as_f64(b, y), np.full((2, 3), 9.0))


def test_immutable_assign_raises_capability_error(md_backend: Any, md_device: Device) -> None:
    if md_backend.capabilities.mutable:
        pytest.skip(f"{md_backend.name} tensors are mutable (capabilities.mutable=True)")
    x = md.ones(3, device=md_device, backend=md_backend.name)
    with pytest.raises(CapabilityError, match=md_backend.name):
        md_backend.assign(x, md.zeros(3, device=md_device, backend=md_backend.name))
    np.testing.assert_array_equal(as_f64(md_backend, x), np.ones(3))


def test_device_mismatch_raises_typed_error(md_backend: Any, md_device: Device, md_devices: list) -> None:
    b = md_backend
    other = other_device(md_devices, md_device)
    x = md.ones((2, 2), device=md_device, backend=b.name)
    y = md.ones((2, 2), device=other, backend=b.name)
    with pytest.raises(DeviceMismatchError) as ei:
        b.combine("sum", x, y)
    assert str(md_device) in str(ei.value) and str(other) in str(ei.value)
    with pytest.raises(DeviceMismatchError):
        b.concat([x, y], 0)
    if b.capabilities.mutable:
        with pytest.raises(DeviceMismatchError):
            b.assign(x, y)
        np.testing.assert_array_equal(as_f64(b, x), np.ones((2, 2)))
    if b.capabilities.raises_on_mixed_devices:
        with pytest.raises(Exception):
            md.to_numpy(x + y)


def test_synchronize_makes_results_visible(md_backend: Any, md_device: Device) -> None:
    b = md_backend
    x = md.rand((256, 256), device=md_device, backend=b.name, seed=1)
    acc = x
    for _ in range(8):
        acc = b.combine("sum", acc, x)
    md.synchronize(md_device, backend=b.name)
    md.synchronize(acc)
    md.synchronize()
    md.synchronize(backend=b.name)
    np.testing.assert_allclose(as_f64(b, acc), 9 * as_f64(b, x), rtol=1e-5)


def test_to_numpy(md_backend: Any, md_device: Device) -> None:
    src = np.arange(10, dtype=np.int32).reshape(2, 5)
    x = md.asarray(src, device=md_device, backend=md_backend.name)
    a = md.to_numpy(x)
    assert type(a) is np.ndarray and a.dtype == np.int32 and a.shape == (2, 5)
    np.testing.assert_array_equal(a, src)


def test_bad_inputs_raise_typed_errors(md_backend: Any, md_device: Device) -> None:
    n = md_backend.name
    x = md.ones(2, device=md_device, backend=n)
    with pytest.raises(InvalidDeviceError, match="Accepted"):
        md.to(x, "tpu:banana")
    with pytest.raises(DeviceNotFoundError, match=n):
        md.to(x, "gpu:97")
    with pytest.raises(UnsupportedTensorError, match="no backend recognises"):
        md.device_of(object())
    with pytest.raises(TypeError):
        md.zeros(2, dtype="not-a-dtype", backend=n)
    with pytest.raises(BackendNotAvailableError, match="Registered"):
        md.zeros(2, backend="no-such-backend")
    np.testing.assert_array_equal(as_f64(md_backend, x), np.ones(2))
