"""The staging pipeline of pageable uploads (multidev.staging), with host primitives standing in for a
copy engine: every byte lands, a buffer is never refilled before its copy has left it, concurrent
uploads do not mix, and the plan is validated. (On a GPU the torch adapter's uploads run through it;
the conformance suite and the bandwidth suite's H2D rows cover that path there.)"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from multidev.adapter import StagingPlan, staged_upload


class FakeEngine:
    """A copy engine that copies only when waited for (the worst case for buffer reuse): a buffer
    refilled before its copy ran would deliver the wrong bytes."""

    def __init__(self, nbytes: int) -> None:
        self.dst = np.full(nbytes, 0xAB, dtype=np.uint8)
        self.pending: dict[int, tuple[np.ndarray, int, int]] = {}
        self.allocs = 0
        self.lock = threading.Lock()

    def alloc(self, n: int) -> tuple[object, np.ndarray]:
        self.allocs += 1
        buf = np.empty(n, dtype=np.uint8)
        return buf, buf

    def submit(self, buf: np.ndarray, n: int, off: int) -> int:
        key = id(buf) ^ off
        self.pending[key] = (buf, n, off)
        return key

    def wait(self, key: int) -> None:
        buf, n, off = self.pending.pop(key)
        self.dst[off:off + n] = buf[:n]

    def drain(self) -> None:
        for key in list(self.pending):
            self.wait(key)


@pytest.mark.parametrize("nbytes", [1, 4095, 4096, 5 << 20, (13 << 20) + 7])
@pytest.mark.parametrize("chunk_mib,depth", [(1, 1), (1, 2), (2, 3), (64, 3)])
def test_every_byte_lands_and_buffers_wait_before_reuse(nbytes: int, chunk_mib: int, depth: int) -> None:
    src = np.random.default_rng(nbytes).integers(0, 255, nbytes, dtype=np.uint8)
    eng = FakeEngine(nbytes)
    plan = StagingPlan(chunk=chunk_mib << 20, depth=depth, threads=4, threshold=0)
    staged_upload(src, eng.alloc, eng.submit, eng.wait, plan)
    eng.drain()
    np.testing.assert_array_equal(eng.dst, src)
    assert eng.allocs <= depth


def test_any_dtype_and_shape_travels_as_bytes() -> None:
    src = np.random.default_rng(1).standard_normal((300, 77)).astype(np.float32)
    eng = FakeEngine(src.nbytes)
    staged_upload(src, eng.alloc, eng.submit, eng.wait, StagingPlan(chunk=1 << 16, depth=2, threshold=0))
    eng.drain()
    np.testing.assert_array_equal(eng.dst.view(np.float32).reshape(300, 77), src)


def test_empty_source_copies_nothing() -> None:
    eng = FakeEngine(0)
    staged_upload(np.empty((0, 3), np.float32), eng.alloc, eng.submit, eng.wait)
    assert eng.allocs == 0 and not eng.pending


def test_concurrent_uploads_do_not_mix() -> None:
    """Eight threads upload different arrays at once through the shared copy threads."""
    errors: list[BaseException] = []

    def one(seed: int) -> None:
        try:
            src = np.random.default_rng(seed).integers(0, 255, (9 << 20) + seed, dtype=np.uint8)
            eng = FakeEngine(src.nbytes)
            staged_upload(src, eng.alloc, eng.submit, eng.wait, StagingPlan(chunk=2 << 20, depth=2, threads=4,
                                                                             threshold=0))
            eng.drain()
            np.testing.assert_array_equal(eng.dst, src)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_plan_is_validated() -> None:
    with pytest.raises(ValueError):
        StagingPlan(chunk=0)
    with pytest.raises(ValueError):
        StagingPlan(depth=0)
    assert "MiB" in repr(StagingPlan())
