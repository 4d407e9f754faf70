"""The contracts of copies in flight: a handle never gives data before it has landed, values are
exact, the copy is independent of its source once waited for, the handle keeps its source alive
(four moves queued behind work whose sources were dropped land their own values), ``to_host``
starts each copy as soon as an iterable yields its tensor, and transfers above the staging
threshold are exact with a partial last chunk."""
from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device
from multidev.adapter import StagingPlan, start_to_numpy

from ._helpers import as_f64

pytestmark = pytest.mark.md_feature("transfers")

HOST = Device("cpu", 0)


def _queued(b: Any, dev: Device, seed: int, rounds: int = 6) -> tuple[Any, np.ndarray]:
    """A tensor produced by queued work (asynchronous where the backend is), and its value."""
    x = md.rand((128, 64), device=dev, backend=b.name, seed=seed)
    ref = as_f64(b, x)
    acc = x
    for _ in range(rounds):
        acc = b.combine("sum", acc, x)
    return acc, ref * (rounds + 1)


def test_nonblocking_to_host_gives_exact_values_after_queued_work(md_backend: Any, md_device: Device) -> None:
    b = md_backend
    y, ref = _queued(b, md_device, seed=11)
    h = md.to(y, HOST, non_blocking=True)
    assert isinstance(h, md.Transfer)
    got = h.wait()
    assert md.device_of(got) == HOST and md.dtype_of(got) == md.dtype_of(y)
    np.testing.assert_allclose(as_f64(b, got), ref, rtol=1e-5)


def test_to_host_takes_a_generator(md_backend: Any, md_device: Device) -> None:
    """The iterable form: each copy starts as the generator yields its result; values exact, order kept."""
    b = md_backend
    refs: list[np.ndarray] = []

    def results() -> Any:
        for s in range(5):
            y, r = _queued(b, md_device, seed=20 + s, rounds=2)
            refs.append(r)
            yield y

    for non_blocking in (False, True):
        refs.clear()
        out: Any = md.to_host(results(), non_blocking=non_blocking)
        if non_blocking:
            assert isinstance(out, md.Transfer)
            out = out.wait()
        assert len(out) == 5
        for a, r in zip(out, refs):
            assert type(a) is np.ndarray and a.shape == r.shape
            np.testing.assert_allclose(a.astype(np.float64), r, rtol=1e-5)


def test_copy_is_independent_of_its_source_after_wait(md_backend: Any, md_device: Device) -> None:
    b = md_backend
    if not b.capabilities.mutable:
        pytest.skip(f"{b.name} tensors are immutable (capabilities.mutable=False): the source cannot be written")
    src = np.arange(64, dtype=np.float32).reshape(8, 8)
    x = md.asarray(src, device=md_device, backend=b.name)
    targets = [HOST] + [d for d in md.devices(backend=b.name) if d != md_device][:1]
    for dev in targets:
        if dev == md_device:
            continue
        got = md.to(x, dev, non_blocking=True).wait()
        # to_host's arrays of a host tensor may share its memory (documented); of others they are copies
        host = md.to_host([x], non_blocking=True).wait()[0] if md_device != HOST else None
        b.assign(x, md.full((8, 8), -1.0, device=md_device, backend=b.name))
        md.synchronize(x)
        np.testing.assert_array_equal(as_f64(b, got), src, err_msg=f"the copy on {dev} follows its source")
        if host is not None:
            np.testing.assert_array_equal(np.asarray(host, dtype=np.float64), src,
                                          err_msg="to_host's array follows its source")
        b.assign(x, md.asarray(src, device=md_device, backend=b.name))


def test_handle_keeps_its_source_alive(md_backend: Any, md_device: Device) -> None:
    """The caller may drop the source before waiting: the copy still lands with the right values."""
    b = md_backend
    y, ref = _queued(b, md_device, seed=31)
    handles = [md.to(y, HOST, non_blocking=True), md.to_host([y], non_blocking=True)]
    del y
    gc.collect()
    for _ in range(3):  # new work that could reuse a freed source buffer
        md.rand((128, 64), device=md_device, backend=b.name, seed=99)
    np.testing.assert_allclose(as_f64(b, handles[0].wait()), ref, rtol=1e-5)
    np.testing.assert_allclose(handles[1].wait()[0].astype(np.float64), ref, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["bool", "int32", "float16", "bfloat16", "float32", "float64"])
def test_start_to_numpy_gives_what_to_numpy_gives(md_backend: Any, md_device: Device, dtype: str) -> None:
    """The adapter's fast path to host arrays (SupportsNonBlocking), or the core's way without it
    (start_move, then to_numpy), gives exactly what to_numpy gives: the path to_host takes."""
    b = md_backend
    start = b.transfers.start_to_numpy if b.transfers is not None else (lambda x: start_to_numpy(b, x))
    if dtype not in b.capabilities.dtypes_on(md_device):
        pytest.skip(f"{b.name} cannot hold {dtype} on {md_device} (capabilities)")
    src = (np.arange(12).reshape(3, 4) % 3).astype(np.float32)
    x = md.asarray(src, dtype=dtype, device=md_device, backend=b.name)
    got = start(x)()
    want = b.to_numpy(x)
    assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == (3, 4)
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64))


# -- large transfers: the staging pipeline ---------------------------------------------------------
#: A staging plan small enough to test cheaply on any machine: 96 KiB chunks from 256 KiB up.
SMALL_PLAN = StagingPlan(chunk=96 << 10, depth=2, threads=2, threshold=256 << 10)


def _odd_size(plan: StagingPlan) -> int:
    """A float32 count above ``plan``'s threshold whose bytes end inside a chunk (3.5 chunks past
    the threshold, plus 12 bytes), so no chunk boundary falls on the end."""
    return (plan.threshold + 3 * plan.chunk + plan.chunk // 2 + 12) // 4


def _round_trips(b: Any, device: Device, n: int) -> None:
    """Upload ``n`` distinct float32 values to ``device`` (``asarray`` of a NumPy array, and ``to``
    of a host tensor, blocking and not), download them (``to_numpy``, ``to`` the host, ``to_host``),
    and require every element back exactly."""
    src = (np.arange(n, dtype=np.uint32) & 0xFFFFFF).astype(np.float32)  # distinct, exact in float32
    src[::7] *= -1
    ups = {"asarray": md.asarray(src, device=device, backend=b.name)}
    if device != HOST:
        host = md.asarray(src, device=HOST, backend=b.name)
        ups["to"] = md.to(host, device)
        ups["to(non_blocking=True)"] = md.to(host, device, non_blocking=True).wait()
    for how, y in ups.items():
        assert md.device_of(y) == device, f"{how}: on {md.device_of(y)}, not {device}"
        downs: dict[str, Callable[[Any], Any]] = {
            "to_numpy": md.to_numpy,
            "to host": lambda t: md.to_numpy(md.to(t, HOST)),
            "to_host(non_blocking=True)": lambda t: md.to_host([t], non_blocking=True).wait()[0]}
        for down, read in downs.items():
            got = np.asarray(read(y))
            assert got.shape == src.shape, f"{how} to {device}, back through {down}: shape {got.shape}"
            bad = np.flatnonzero(got != src)
            del got
            assert bad.size == 0, (
                f"{n * 4} bytes through {how} to {device}, back through {down}: {bad.size} elements wrong, "
                f"the first at byte {4 * int(bad[0]) if bad.size else '?'}")


def test_staged_transfers_are_exact(md_backend: Any, md_device: Device) -> None:
    """Uploads and downloads above the staging threshold are exact, with the last chunk a partial
    one (chunk boundaries not aligned to the size): with a small plan (96 KiB chunks from 256 KiB,
    set on the adapter's ``staging`` for the check), so the pipeline runs cheaply on every device
    of an adapter that stages, and on accelerators with the adapter's own plan (tens of MiB) too."""
    b = md_backend
    own = getattr(b, "staging", None)
    if isinstance(own, StagingPlan):
        b.staging = SMALL_PLAN
    try:
        _round_trips(b, md_device, _odd_size(SMALL_PLAN))
    finally:
        if isinstance(own, StagingPlan):
            b.staging = own
    if md_device.is_gpu:
        _round_trips(b, md_device, _odd_size(own if isinstance(own, StagingPlan) else StagingPlan()))


# -- copies in flight whose sources the caller dropped ---------------------------------------------
def _moves(devices: list[Device]) -> list[tuple[Device, Device]]:
    """(source, target) pairs: the host to the first accelerator and back, else cpu:0 to another
    CPU device and back."""
    accel = [d for d in devices if d.is_gpu]
    other = accel[0] if accel else next((d for d in devices if d != HOST), None)
    if other is None or HOST not in devices:
        pytest.skip(f"needs a second device; this backend has only {', '.join(map(str, devices))} here "
                    "(virtual CPU devices or a GPU provide one)")
    return [(HOST, other), (other, HOST)]


def test_nonblocking_moves_survive_their_dropped_sources(md_backend: Any, md_devices: list) -> None:
    """Four non-blocking moves of distinct values, started behind work queued on the device (so
    the copies are still in flight), whose sources the caller then drops with every other
    reference, new buffers being made meanwhile: each lands its own values, ``[1, 2, 3, 4]``,
    never the last source's four times (a source freed and its memory reused before the copy read
    it)."""
    b = md_backend
    for src_dev, dst_dev in _moves(md_devices):
        dev = dst_dev if dst_dev != HOST else src_dev  # the copies queue behind this device's work
        side = 4096 if dev.is_gpu else 512
        busy = md.rand((side, side), device=dev, backend=b.name, seed=5)
        for _ in range(20):  # work queued ahead of the copies
            busy = b.combine("sum", busy, busy)
        handles = []
        for k in range(1, 5):
            x = md.full((256, 256), float(k), device=src_dev, backend=b.name)
            handles.append(md.to(x, dst_dev, non_blocking=True))
            del x  # the last reference: the source goes now, unless the move keeps it
        litter = [md.full((256, 256), -9.0, device=src_dev, backend=b.name) for _ in range(8)]
        landed = [as_f64(b, h.wait()) for h in handles]
        del busy, litter
        got = [sorted(set(a.reshape(-1).tolist())) for a in landed]
        assert got == [[1.0], [2.0], [3.0], [4.0]], (
            f"four non-blocking moves {src_dev} -> {dst_dev} whose sources were dropped landed as {got}")
