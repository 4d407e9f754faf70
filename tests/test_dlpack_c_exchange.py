"""DLPack's C exchange API (DLPack 1.3, a tensor type's ``__dlpack_c_exchange_api__``) in
``multidev.convert``: where the producer's and the consumer's types both have it, the producer's
managed tensor goes to the consumer's C import with no capsule and no ``__dlpack__`` call, and the
core's safety rules still hold. torch 2.13 has the API; no other installed framework does, so the
producer here is a fake, written with ctypes: a NumPy buffer behind a type whose
``managed_tensor_from_py_object_no_sync`` builds a ``DLManagedTensorVersioned`` for it."""
from __future__ import annotations

import ctypes
from typing import Any, ClassVar

import numpy as np
import pytest

import multidev as md
from multidev import exchange
from multidev.adapters.numpy import NumpyBackend

torch = pytest.importorskip("torch")
if exchange.c_exchange_api(torch.Tensor) is None:
    pytest.skip("this torch has no __dlpack_c_exchange_api__", allow_module_level=True)


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("ctx", ctypes.c_void_p),
                ("deleter", _DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_FROM_PY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
_ANY = ctypes.CFUNCTYPE(ctypes.c_int)


class _API(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev", ctypes.c_void_p),
                ("allocator", ctypes.c_void_p), ("from_py", _FROM_PY), ("to_py", ctypes.c_void_p),
                ("dltensor_from_py", ctypes.c_void_p), ("stream", ctypes.c_void_p)]


_LIVE: dict[int, tuple[Any, ...]] = {}  # managed tensor address -> what keeps it alive until its deleter
CALLS = {"from_py": 0, "deleter": 0, "__dlpack__": 0}


@_DELETER
def _delete(addr: int) -> None:
    CALLS["deleter"] += 1
    _LIVE.pop(addr, None)


@_FROM_PY
def _from_py(obj: int, out: Any) -> int:
    """managed_tensor_from_py_object_no_sync for FakeTensor: a DLManagedTensorVersioned viewing its buffer."""
    CALLS["from_py"] += 1
    t = ctypes.cast(obj, ctypes.py_object).value
    a = t.array
    shape = (ctypes.c_int64 * a.ndim)(*a.shape)
    strides = (ctypes.c_int64 * a.ndim)(*(s // a.itemsize for s in a.strides))
    m = _Managed(1, 0, None, _delete, 0 if a.flags.writeable else 1,
                 _DLTensor(a.__array_interface__["data"][0], 1, 0, a.ndim, 2, a.itemsize * 8, 1, shape, strides, 0))
    addr = ctypes.addressof(m)
    _LIVE[addr] = (m, shape, strides, a)
    out[0] = addr
    return 0


_TABLE = _API(1, 3, None, None, _from_py, None, None, None)
_NAME = b"dlpack_exchange_api"
_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype, _new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class FakeTensor:
    """A float32 host buffer whose type offers DLPack's C exchange API (the producer half) and,
    for every other consumer, the Python protocol."""

    __dlpack_c_exchange_api__: ClassVar[Any] = _new_capsule(ctypes.addressof(_TABLE), _NAME, None)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @property
    def dtype(self) -> Any:
        return self.array.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def __dlpack__(self, **kwargs: Any) -> Any:
        CALLS["__dlpack__"] += 1
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class FakeBackend(NumpyBackend):
    """The NumPy reference, over FakeTensor: one CPU device."""

    name: ClassVar[str] = "fake_c_exchange"

    def tensor_types(self) -> tuple[type, ...]:
        return (FakeTensor,)

    def devices(self) -> list[md.Device]:
        return [md.Device("cpu", 0)]

    def device_of(self, x: Any) -> md.Device:
        return md.Device("cpu", 0)

    def dtype_of(self, x: Any) -> str:
        return super().dtype_of(x.array)

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(x.array)

    def export_dlpack(self, x: Any) -> Any:
        return x


@pytest.fixture(autouse=True)
def fake_backend() -> Any:
    md.register_backend(FakeBackend.name, FakeBackend, replace=True)
    md.backend(FakeBackend.name)
    for k in CALLS:
        CALLS[k] = 0
    yield
    from multidev.registry import unregister_backend

    unregister_backend(FakeBackend.name)


def test_the_api_tables_are_read_from_the_types() -> None:
    api = exchange.c_exchange_api(torch.Tensor)
    assert api is not None and api.version[0] == 1 and api.to_py is not None and api.from_py is not None
    fake = exchange.c_exchange_api(FakeTensor)
    assert fake is not None and fake.version == (1, 3) and fake.from_py is not None and fake.to_py is None
    assert exchange.c_exchange_api(np.ndarray) is None


def test_convert_goes_through_both_c_apis_and_shares_memory() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = md.convert(FakeTensor(a), "torch")
    assert isinstance(y, torch.Tensor) and y.shape == (3, 4) and y.dtype == torch.float32
    assert CALLS == {"from_py": 1, "deleter": 0, "__dlpack__": 0}  # the C route: no capsule at all
    y[0, 0] = 42.0
    assert a[0, 0] == 42.0  # zero-copy: the consumer views the producer's buffer
    np.testing.assert_array_equal(y.numpy(), a)
    del y
    import gc

    gc.collect()
    assert CALLS["deleter"] == 1  # torch released the managed tensor through the producer's deleter


def test_the_core_rules_hold_on_the_c_route() -> None:
    """A read-only buffer is not handed to a mutable consumer (a copy instead, or CapabilityError
    under copy=False), and the producer's managed tensor is freed through its deleter."""
    a = np.arange(4, dtype=np.float32)
    a.setflags(write=False)
    y = md.convert(FakeTensor(a), "torch")
    assert CALLS["from_py"] == 1 and CALLS["deleter"] == 1  # refused on the C route, freed at once
    assert not np.shares_memory(y.numpy(), a)
    np.testing.assert_array_equal(y.numpy(), a)
    with pytest.raises(md.CapabilityError, match="read-only"):
        md.convert(FakeTensor(a), "torch", copy=False)
    b = np.arange(8, dtype=np.float32)[::-2]
    z = md.convert(FakeTensor(b), "torch")  # negative strides: never shared
    assert not np.shares_memory(z.numpy(), b)
    np.testing.assert_array_equal(z.numpy(), b)
