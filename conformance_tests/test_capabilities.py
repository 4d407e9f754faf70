"""Capabilities checked against behaviour: every declared capability is exercised, and every
undeclared one is probed, so a flag that claims too much or too little fails (rather than turning
checks into skips). What the probes find is printed under the matrix and kept in the JSON."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device
from multidev.adapter import DTYPES, SupportsNativeCollectives, check_adapter
from multidev.errors import CapabilityError, MultidevError
from multidev.exchange import exportable
from multidev.registry import supports

from ._helpers import as_f64, found, isolated, need_devices, ordered, pending_work, sample

pytestmark = pytest.mark.md_feature("capabilities")


def test_capability_record_is_well_formed(md_backend: Any) -> None:
    b = md_backend
    assert check_adapter(b) == [], f"{b.name} breaks the protocol: {check_adapter(b)}"
    c = b.capabilities
    assert c.dtypes and set(c.dtypes) <= set(DTYPES)
    for dev in c.device_dtypes:
        assert dev in b.devices(), f"capabilities.device_dtypes names {dev}, which {b.name} does not list"


def test_dtypes_flag_matches_behaviour(md_backend: Any, md_device: Device) -> None:
    """Each dtype listed for this device is created with that dtype; each one not listed is refused
    by the core with CapabilityError, and by the adapter itself with any error (an adapter that
    holds a dtype it does not declare understates its capabilities)."""
    b = md_backend
    have = b.capabilities.dtypes_on(md_device)
    held = []
    for dtype in DTYPES:
        if dtype in have:
            x = md.zeros((2,), dtype=dtype, device=md_device, backend=b.name)
            assert md.dtype_of(x) == dtype and md.device_of(x) == md_device, f"zeros({dtype}) on {md_device}"
            held.append(dtype)
            continue
        with pytest.raises(CapabilityError):
            md.zeros((2,), dtype=dtype, device=md_device, backend=b.name)
        try:
            y = b.full((2,), 0, dtype, md_device)
        except Exception:  # noqa: BLE001 - out of the protocol's contract (only listed dtypes reach
            continue  # an adapter), so any refusal by the adapter too says the flag is right
        got = b.dtype_of(y)
        assert got != dtype, (f"{b.name} holds {dtype} on {md_device} (full() made one) but its "
                              "capabilities do not list it")
    found(b, "dtypes", len(held))


def test_mutable_flag_matches_behaviour(md_backend: Any, md_device: Device) -> None:
    """mutable=True: assign writes in place. mutable=False: assign raises CapabilityError and
    changes nothing (an adapter that accepts the write understates its capabilities)."""
    b = md_backend
    x = md.ones((3,), device=md_device, backend=b.name)
    z = md.zeros((3,), device=md_device, backend=b.name)
    try:
        b.assign(x, z)
        md.synchronize(x)
        wrote = True
    except CapabilityError:
        wrote = False
    found(b, "mutable", wrote)
    if b.capabilities.mutable:
        assert wrote, f"{b.name} declares mutable=True but assign raised CapabilityError"
        np.testing.assert_array_equal(as_f64(b, x), np.zeros(3))
    else:
        assert not wrote, f"{b.name} declares mutable=False but assign wrote into the tensor"
        np.testing.assert_array_equal(as_f64(b, x), np.ones(3))


def test_writable_answer_matches_behaviour(md_backend: Any, md_device: Device) -> None:
    """``writable(x)``, where the adapter answers (not None), agrees with a write: True for a
    tensor ``assign`` writes into, False for one it refuses (the in-place collectives skip their
    write probe on that answer, so a wrong True half-applies them). Tried on a fresh tensor and on
    what a read-only NumPy array becomes through ``md.convert``."""
    b = md_backend
    if not hasattr(b, "writable"):
        pytest.skip(f"{b.name} has no writable() (an adapter not built on BaseBackend): the core probes")
    ro = np.arange(3, dtype=np.float32)
    ro.setflags(write=False)
    cands = [("a fresh tensor", md.ones((3,), device=md_device, backend=b.name))]
    try:
        cands.append(("md.convert of a read-only NumPy array", md.convert(ro, b.name, device=md_device)))
    except MultidevError:
        pass  # this backend cannot take it: the fresh tensor alone
    asked = 0
    for what, x in cands:
        says = b.writable(x)
        if says is None:
            continue
        asked += 1
        before = as_f64(b, x).copy()
        try:
            b.assign(x, b.copy(x, b.device_of(x)))
            md.synchronize(x)
            wrote = True
        except Exception:  # noqa: BLE001 - any refusal of the write
            wrote = False
        np.testing.assert_array_equal(as_f64(b, x), before)
        assert says == wrote, (f"{b.name}.writable({what}) answers {says}, but assign "
                               f"{'wrote' if wrote else 'refused'}")
    if not asked:
        pytest.skip(f"{b.name}.writable() answers None (unknown): the core probes with a write")


def test_async_execution_flag_matches_behaviour(md_backend: Any, md_devices: list) -> None:
    """Work seen still running after the call that queued it returned means the backend is
    asynchronous: async_execution=False then fails. Needs the framework's readiness query."""
    b = md_backend
    devs = ordered(md_devices)
    q = pending_work(b, devs[0] if devs[0].is_gpu else devs[-1])
    if q.ready is None:
        pytest.skip(f"{b.name} tensors expose no readiness query (is_ready(), a CUDA stream): whether "
                    "work runs after the call returns cannot be observed")
    found(b, "async_execution", q.seen_pending)
    b.synchronize(None)
    if q.seen_pending:
        assert b.capabilities.async_execution, (
            f"{b.name} declares async_execution=False, but work it queued was still running after "
            "the calls returned (synchronize and wait must then really wait)")


@isolated
def test_dlpack_flag_matches_behaviour(md_backend: Any, md_devices: list) -> None:
    """dlpack=True: a float32 tensor on each device exports, and imports back onto its device
    with its values. dlpack=False: export_dlpack raises CapabilityError, and a CPU tensor the
    framework exports anyway (``__dlpack__`` that NumPy can read) fails the flag."""
    b = md_backend
    src = np.arange(6, dtype=np.float32)
    if b.capabilities.dlpack:
        for dev in md_devices:
            x = md.asarray(src, device=dev, backend=b.name)
            md.synchronize(x)
            try:
                y = b.dlpack.import_dlpack(exportable(b, x), dev)
            except CapabilityError as e:
                # DLPack names every host buffer cpu:0: a backend may be unable to label one with
                # another (virtual) CPU device; cpu:0 and accelerators must round-trip.
                assert dev.kind == "cpu" and dev.index > 0, f"{b.name} cannot import its own export on {dev}: {e}"
                continue
            assert md.device_of(y) == dev, f"a DLPack round trip on {dev} landed on {md.device_of(y)}"
            np.testing.assert_array_equal(as_f64(b, y), src)
        found(b, "dlpack", True)
        return  # every device checked
    dev = md_devices[0]
    x = md.asarray(src, device=dev, backend=b.name)
    with pytest.raises(CapabilityError):
        exportable(b, x)  # the adapter refuses, or declares no SupportsDLPack
    exports = False
    if dev.kind == "cpu" and hasattr(x, "__dlpack__"):
        try:
            exports = np.array_equal(np.from_dlpack(x), src)
        except (TypeError, ValueError, BufferError, RuntimeError):
            exports = False
    found(b, "dlpack", exports)
    assert not exports, f"{b.name} declares dlpack=False, but its tensors export through DLPack (NumPy read one)"


def _native_set(devices: list[Device]) -> list[Device]:
    gpus = [d for d in devices if d.is_gpu]
    return gpus if len(gpus) >= 2 else [d for d in devices if d.kind == "cpu"]


def test_native_allreduce_flag_matches_behaviour(md_backend: Any, md_devices: list) -> None:
    """native_collectives lists allreduce: native_allreduce sums float32 tensors on 2 devices of
    one kind. It does not: native_allreduce raises CapabilityError (a right answer instead is an
    understated capability, a wrong one a bug)."""
    b = md_backend
    devs = need_devices(_native_set(md_devices), 2)
    arrays = [np.full((2, 2), float(i + 1), dtype=np.float32) for i in range(len(devs))]
    xs = [md.asarray(a, device=d, backend=b.name) for a, d in zip(arrays, devs)]
    declared = "allreduce" in b.capabilities.native_collectives
    if not supports(b, SupportsNativeCollectives):
        found(b, "native_allreduce", False)
        assert not declared, f"{b.name} declares a native allreduce without implementing SupportsNativeCollectives"
        return  # no native path at all, as declared
    try:
        out = b.collectives.native_allreduce(xs, "sum")
    except CapabilityError as e:
        found(b, "native_allreduce", False)
        assert not declared, f"{b.name} declares a native allreduce, but it refused float32 sum on {devs}: {e}"
        return  # refused, as declared
    found(b, "native_allreduce", True)
    right = len(out) == len(xs) and all(
        md.device_of(y) == d and np.array_equal(as_f64(b, y), np.full((2, 2), 3.0)) for y, d in zip(out, devs))
    assert declared, (f"{b.name}'s native_allreduce returned {'right' if right else 'wrong'} results though "
                      "capabilities.native_collectives does not list allreduce (list it, or raise CapabilityError)")
    assert right, f"{b.name}'s native allreduce gave wrong results or devices"


def test_raises_on_mixed_devices_flag_matches_behaviour(md_backend: Any, md_devices: list) -> None:
    """The framework's own ``x + y`` on two devices raises exactly when the flag says so."""
    b = md_backend
    d0, d1 = need_devices(ordered(md_devices), 2)
    x = md.ones((2, 2), device=d0, backend=b.name)
    y = md.ones((2, 2), device=d1, backend=b.name)
    try:
        md.synchronize(x + y)
        raised = False
    except Exception:  # noqa: BLE001 - the framework's own error type
        raised = True
    found(b, "raises_on_mixed_devices", raised)
    assert raised == b.capabilities.raises_on_mixed_devices, (
        f"{b.name} declares raises_on_mixed_devices={b.capabilities.raises_on_mixed_devices}, but x + y on "
        f"{d0} and {d1} {'raised' if raised else 'did not raise'}")


def test_pinned_memory_flag_matches_behaviour(md_backend: Any, md_devices: list) -> None:
    """A move from an accelerator to the host lands in page-locked memory exactly when
    pinned_memory is declared (where the tensor can say: ``is_pinned()``)."""
    b = md_backend
    accel = [d for d in md_devices if d.kind != "cpu"]
    if not accel or Device("cpu", 0) not in md_devices:
        pytest.skip("pinned host memory is about accelerator-to-host copies; needs an accelerator and cpu:0 here")
    x = md.asarray(sample("float32", (256,)), device=accel[0], backend=b.name)
    y = md.to(x, "cpu:0", non_blocking=True).wait()
    query = getattr(y, "is_pinned", None)
    if not callable(query):
        pytest.skip(f"{b.name} host tensors cannot say whether they are pinned (no is_pinned())")
    pinned = bool(query())
    found(b, "pinned_memory", pinned)
    assert pinned == b.capabilities.pinned_memory, (
        f"{b.name} declares pinned_memory={b.capabilities.pinned_memory}, but a non-blocking move from "
        f"{accel[0]} to the host {'is' if pinned else 'is not'} pinned")
