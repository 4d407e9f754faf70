"""Capabilities checked against behaviour: every declared capability (a flag, or a concern attribute
that is not None) is exercised, and every undeclared one is probed, so a flag or concern that claims
too much or too little fails (rather than turning checks into skips). What the probes find is
printed under the matrix and kept in the JSON."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device
from multidev.adapter import DTYPES, SupportsNativeCollectives, check_adapter
from multidev.errors import CapabilityError, MultidevError
from multidev.exchange import exportable

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


def _declared_concern(b: Any, attr: str) -> Any:
    """The concern ``attr`` that ``b``'s class declares but this instance has None of (its
    ``available_on`` said no, or a deprecated flag hid it), made anyway to probe; None where the
    class declares none."""
    import inspect

    from multidev.adapter import concern

    desc = inspect.getattr_static(type(b), attr, None)
    if not isinstance(desc, concern):
        return None
    try:
        return desc.cls(b)
    except Exception:  # noqa: BLE001 - a concern that cannot even be made here: nothing to probe
        return None


@isolated
def test_dlpack_concern_matches_behaviour(md_backend: Any, md_devices: list) -> None:
    """A dlpack concern (``b.dlpack``): a float32 tensor on each device exports, and imports back
    onto its device with its values. None: ``convert`` still works (through the host), and a CPU
    tensor the framework exports anyway (``__dlpack__`` that NumPy can read) fails: the concern is
    missing where it would work."""
    b = md_backend
    src = np.arange(6, dtype=np.float32)
    if b.dlpack is not None:
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
        exportable(b, x)  # no concern: the exchange layer refuses
    host = md.asarray(src, device="cpu:0", backend=b.name)
    there = md.convert(host, "numpy")  # an explicit copy through the host, both ways
    np.testing.assert_array_equal(np.asarray(there), src)
    back = md.convert(np.array(src), b.name)
    assert md.device_of(back) == Device("cpu", 0)
    np.testing.assert_array_equal(as_f64(b, back), src)
    exports = False
    if dev.kind == "cpu" and hasattr(x, "__dlpack__"):
        try:
            exports = np.array_equal(np.from_dlpack(x), src)
        except (TypeError, ValueError, BufferError, RuntimeError):
            exports = False
    found(b, "dlpack", exports)
    assert not exports, (f"{b.name} has no dlpack concern (b.dlpack is None), but its tensors export through "
                         "DLPack (NumPy read one): give it one (dlpack = concern(...)), or let its available_on "
                         "say True here")


def _views(x: Any) -> dict[str, Any]:
    """Views of the 2-d tensor ``x`` made by Python's own operators, where the framework has them:
    what a framework exports with odd strides if it exports views at all."""
    out: dict[str, Any] = {"whole": x}
    for name, make in (("transposed", lambda: x.T), ("reversed rows", lambda: x[::-1]),
                       ("every other column", lambda: x[:, ::2]), ("a new axis", lambda: x[None]),
                       ("one row", lambda: x[1])):
        try:
            out[name] = make()
        except Exception:  # noqa: BLE001 - a view this framework has no operator for
            continue
    return out


@isolated
def test_plain_host_exports_match_behaviour(md_backend: Any, md_devices: list) -> None:
    """A dlpack concern declaring ``plain_host_exports`` (``convert`` then hands its host exports
    to the consumer unread and without waiting): every host export, views and results of pending work
    included, is an object with ``__dlpack__`` whose capsule is not flagged read-only, has no negative or
    zero strides, and holds the finished values."""
    b = md_backend
    if b.dlpack is None or not getattr(b.dlpack, "plain_host_exports", False):
        pytest.skip(f"{b.name} does not declare plain_host_exports: convert reads each host export's header")
    from multidev.exchange import peek

    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    for dev in [d for d in md_devices if d.kind == "cpu"]:
        x = md.asarray(src, device=dev, backend=b.name)
        expected = _views(src)
        views: dict[str, tuple[Any, Any]] = {k: (v, np.asarray(expected[k])) for k, v in _views(x).items()}
        q = pending_work(b, dev)
        views["pending work"] = (q.y, None)
        for name, (v, expect) in views.items():
            obj = b.dlpack.export_dlpack(v)
            assert hasattr(obj, "__dlpack__"), f"{b.name}: the export of {name} on {dev} has no __dlpack__"
            info = peek(obj)
            assert info is not None, f"{b.name}: the export of {name} on {dev} gave no readable capsule"
            assert not info.read_only, f"{b.name} declares plain host exports, but {name} exports read-only"
            assert not info.has_negative_or_zero_strides, (
                f"{b.name} declares plain host exports, but {name} exports strides {info.strides}")
            got = np.from_dlpack(b.dlpack.export_dlpack(v))
            if expect is None:  # x + x + ... + x: read at once from the export, finished
                want = np.asarray(md.to_numpy(q.x), np.float64) * q.terms
                np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5,
                                           err_msg=f"{b.name}: an export of pending work gave unfinished values")
            else:
                np.testing.assert_array_equal(got, expect, err_msg=f"{b.name}: the export of {name}")
    found(b, "plain_host_exports", True)


def _native_set(devices: list[Device]) -> list[Device]:
    gpus = [d for d in devices if d.is_gpu]
    return gpus if len(gpus) >= 2 else [d for d in devices if d.kind == "cpu"]


def test_native_allreduce_concern_matches_behaviour(md_backend: Any, md_devices: list) -> None:
    """A collectives concern (``b.collectives``): ``native_allreduce`` sums float32 tensors on 2
    devices of one kind, each result on its input's device and equal to the portable path's. None
    where the adapter's class has a collectives concern (its ``available_on`` said no here): that
    concern, made anyway, must refuse with CapabilityError (a right answer is a concern hidden where
    it works, a wrong one a bug)."""
    b = md_backend
    devs = need_devices(_native_set(md_devices), 2)
    arrays = [np.full((2, 2), float(i + 1), dtype=np.float32) for i in range(len(devs))]
    xs = [md.asarray(a, device=d, backend=b.name) for a, d in zip(arrays, devs)]
    want = np.full((2, 2), float(sum(range(1, len(devs) + 1))))
    coll = b.collectives
    if coll is None:
        coll = _declared_concern(b, "collectives")
        if coll is None:
            found(b, "native_allreduce", False)
            return  # no native path at all
        try:
            out = coll.native_allreduce(xs, "sum")
        except CapabilityError:
            found(b, "native_allreduce", False)
            return  # it cannot work here, and the attribute says so
        found(b, "native_allreduce", True)
        right = len(out) == len(xs) and all(md.device_of(y) == d and np.array_equal(as_f64(b, y), want)
                                            for y, d in zip(out, devs))
        pytest.fail(f"{b.name}'s collectives concern is None here (available_on said no), but made anyway its "
                    f"native_allreduce returned {'right' if right else 'wrong'} results on {devs}")
    assert isinstance(coll, SupportsNativeCollectives), f"{b.name}'s collectives concern declares no protocol"
    try:
        out = coll.native_allreduce(xs, "sum")
    except CapabilityError as e:
        found(b, "native_allreduce", False)
        pytest.fail(f"{b.name} has a collectives concern, but its native_allreduce refused float32 sum on {devs}: "
                    f"{e} (where it cannot work, its available_on must say so: the attribute is then None)")
    found(b, "native_allreduce", True)
    portable = md.allreduce(list(xs), algorithm="naive", inplace=False)
    assert len(out) == len(xs), f"{b.name}'s native allreduce gave {len(out)} results for {len(xs)} inputs"
    for y, p, d in zip(out, portable, devs):
        assert md.device_of(y) == d, f"{b.name}'s native allreduce put the result for {d} on {md.device_of(y)}"
        np.testing.assert_array_equal(as_f64(b, y), as_f64(b, p), err_msg=f"native vs naive on {d}")
        np.testing.assert_array_equal(as_f64(b, y), want, err_msg=f"{b.name}'s native allreduce on {d}")


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
