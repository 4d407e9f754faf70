"""The neutral Device value: parsing, normalization, hashing, DLPack pairs."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

import multidev as md
from multidev import Device
from multidev.errors import InvalidDeviceError, MultidevError


def test_issue_examples_are_equal() -> None:
    forms = ["cuda:1", "gpu:1", "/GPU:1", "/job:localhost/replica:0/task:0/device:GPU:1", "GPU:1", "CUDA:1",
             "/device:GPU:1", (2, 1)]
    devs = {md.device(f) for f in forms}
    assert devs == {Device("gpu", 1)}


def test_defaults_and_str() -> None:
    assert md.device("cpu") == Device("cpu", 0) == md.cpu()
    assert md.device("cuda") == md.gpu(0)
    assert str(Device("gpu", 3)) == "gpu:3" and repr(Device("cpu", 1)) == "Device('cpu', 1)"
    assert md.device(Device("cpu", 2)) == Device("cpu", 2)


def test_frozen_and_hashable() -> None:
    d = Device("gpu", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.index = 2  # type: ignore[misc]
    assert {d: 1}[md.device("cuda:1")] == 1
    assert sorted([Device("gpu", 0), Device("cpu", 1), Device("cpu", 0)])[0] == Device("cpu", 0)


@given(kind=st.sampled_from(["cpu", "gpu", "mps"]), index=st.integers(0, 10_000))
def test_round_trips(kind: str, index: int) -> None:
    d = Device(kind, index)
    assert Device.parse(str(d)) == d
    assert Device.from_dlpack(d.to_dlpack()) == d
    assert hash(Device.parse(str(d).upper())) == hash(d)


@pytest.mark.parametrize("bad", ["", "tpu:0", "gpu:-1", "gpu:one", "/job:x/TPU:0", "/replica:0/GPU:x", "cuda:1:2", "gpu 1 2", "::"])
def test_bad_spellings(bad: str) -> None:
    with pytest.raises(InvalidDeviceError) as ei:
        md.device(bad)
    assert "Accepted" in str(ei.value) and repr(bad) in str(ei.value)
    assert isinstance(ei.value, MultidevError) and isinstance(ei.value, ValueError)


@pytest.mark.parametrize("bad", [object(), 1.5, None, [0, 1], (99, 0)])
def test_bad_objects(bad: object) -> None:
    with pytest.raises(InvalidDeviceError):
        md.device(bad)


def test_constructor_validates() -> None:
    with pytest.raises(InvalidDeviceError):
        Device("tpu", 0)
    with pytest.raises(InvalidDeviceError):
        Device("cpu", -1)
    with pytest.raises(InvalidDeviceError):
        Device("cpu", True)  # type: ignore[arg-type]


def test_devices_are_interned_also_when_threads_make_them_at_once() -> None:
    """Equal devices are one object (caches key by them at identity-hash cost), whatever the index
    and however many threads create the same device first."""
    import threading

    got: list[Device] = []
    barrier = threading.Barrier(8)

    def make() -> None:
        barrier.wait()
        got.append(Device("gpu", 4321))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(d) for d in got}) == 1 and got[0] == Device.parse("cuda:4321")
    assert {Device("cpu", 0): 1}[Device.parse("/CPU:0")] == 1


def test_device_cannot_be_subclassed() -> None:
    """Devices are interned by kind and index: a subclass would take an equal device's place."""
    with pytest.raises(TypeError, match="cannot be subclassed"):
        type("MyDevice", (Device,), {})


def test_a_missing_cpu_device_hint_fits_the_backend() -> None:
    """A backend without virtual CPU devices is not told to configure more (torch cannot)."""
    import pytest

    import multidev as md
    from multidev.adapters.numpy import NumpyBackend
    from multidev.placement import resolve

    class OneCpu(NumpyBackend):
        virtual_devices_env = None

        def devices(self):  # type: ignore[no-untyped-def]
            return [md.device("cpu:0")]

    with pytest.raises(md.DeviceNotFoundError, match="no virtual CPU devices") as e:
        resolve(OneCpu(), "cpu:1")
    assert "configure more" not in str(e.value)
    with pytest.raises(md.DeviceNotFoundError, match="MULTIDEV_NUMPY_DEVICES"):
        resolve(md.backend("numpy"), "cpu:9")
