"""The contracts of copies in flight: a handle never gives data before it has landed, values are
exact, the copy is independent of its source once waited for, the handle keeps its source alive, and
``to_host`` starts each copy as soon as an iterable yields its tensor."""
from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device
from multidev.adapter import SupportsNonBlocking, start_to_numpy
from multidev.registry import supports

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
    start = b.start_to_numpy if supports(b, SupportsNonBlocking) else (lambda x: start_to_numpy(b, x))
    if dtype not in b.capabilities.dtypes_on(md_device):
        pytest.skip(f"{b.name} cannot hold {dtype} on {md_device} (capabilities)")
    src = (np.arange(12).reshape(3, 4) % 3).astype(np.float32)
    x = md.asarray(src, dtype=dtype, device=md_device, backend=b.name)
    got = start(x)()
    want = b.to_numpy(x)
    assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == (3, 4)
    np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64))
