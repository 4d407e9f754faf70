"""Parsing, round-trips and enumeration (the D2L try_gpu / try_all_gpus rules)."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import multidev as md
from multidev import Device
from multidev.errors import DeviceNotFoundError, InvalidDeviceError

pytestmark = pytest.mark.md_feature("devices")


def test_devices_listed_cpu_first_and_unique(md_backend: Any) -> None:
    devs = md_backend.devices()
    assert devs, f"{md_backend.name} lists no device"
    assert all(isinstance(d, Device) for d in devs)
    assert len(set(devs)) == len(devs)
    assert devs[0] == Device("cpu", 0)
    kinds = [d.kind for d in devs]
    assert kinds == sorted(kinds, key=lambda k: k != "cpu"), "CPUs come first"
    for k in set(kinds):
        idx = [d.index for d in devs if d.kind == k]
        assert idx == list(range(len(idx))), f"{k} indices must be 0..n-1 in order, got {idx}"


def test_native_round_trip(md_backend: Any, md_device: Device) -> None:
    native = md_backend.to_native_device(md_device)
    assert md_backend.from_native_device(native) == md_device
    assert md.device(native) == md_device
    assert md.device(str(md_device)) == md_device
    assert Device.from_dlpack(md_device.to_dlpack()) == md_device


def test_from_native_device_rejects_foreign_objects(md_backend: Any) -> None:
    assert md_backend.from_native_device(object()) is None


def test_enumeration_rules(md_backend: Any) -> None:
    name = md_backend.name
    gpus = [d for d in md_backend.devices() if d.is_gpu]
    assert md.num_gpus(backend=name) == len(gpus)
    assert md.devices(backend=name) == md_backend.devices()
    assert md.devices(backend=name, kind="cpu") == [d for d in md_backend.devices() if d.kind == "cpu"]
    all_gpus = md.try_all_gpus(backend=name)
    assert all_gpus, "try_all_gpus is never empty"
    assert all_gpus == (gpus or [Device("cpu", 0)])
    assert md.try_gpu(0, backend=name) == (gpus[0] if gpus else Device("cpu", 0))
    assert md.try_gpu(len(gpus) + 5, backend=name) == Device("cpu", 0)


def test_missing_device_raises_typed_error(md_backend: Any) -> None:
    n_cpu = len([d for d in md_backend.devices() if d.kind == "cpu"])
    for bad in (f"gpu:{64}", f"cpu:{n_cpu + 64}"):
        with pytest.raises(DeviceNotFoundError, match=md_backend.name):
            md.zeros((2,), device=bad, backend=md_backend.name)


_KIND_SPELLINGS = {"cpu": ["cpu", "CPU", "Cpu"], "gpu": ["gpu", "GPU", "cuda", "CUDA", "Cuda"]}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["cpu", "gpu"]), index=st.integers(0, 4096), data=st.data())
def test_parse_spellings(md_backend: Any, kind: str, index: int, data: Any) -> None:
    word = data.draw(st.sampled_from(_KIND_SPELLINGS[kind]))
    tf_word = "GPU" if kind == "gpu" else "CPU"
    forms = [f"{word}:{index}", f" {word} : {index} ", f"/{tf_word}:{index}", f"/device:{tf_word}:{index}",
             f"/job:localhost/replica:0/task:0/device:{tf_word}:{index}", f"device:{word}:{index}"]
    want = Device(kind, index)
    for f in forms:
        assert md.device(f) == want, f
    if index == 0:
        assert md.device(word) == want


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=12))
def test_bad_spellings_raise_typed_error(md_backend: Any, text: str) -> None:
    try:
        d = md.device(text)
    except InvalidDeviceError as e:
        assert "Accepted" in str(e)
    else:
        assert isinstance(d, Device) and md.device(str(d)) == d
