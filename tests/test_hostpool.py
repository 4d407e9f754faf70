"""multidev.hostpool: a large host buffer comes back only once nothing refers to it, and the pool
keeps to its caps."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import multidev as md
from multidev import hostpool
from multidev.adapter import HOST_ALIGNMENT, aligned_empty

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _empty_pool() -> None:
    gc.collect()
    hostpool.clear()


def test_a_buffer_is_given_again_only_when_nothing_refers_to_it() -> None:
    a = aligned_empty((256, 1024), np.float32)  # 1 MiB
    assert a.flags.c_contiguous and a.ctypes.data % HOST_ALIGNMENT == 0 and a.shape == (256, 1024)
    b = aligned_empty((256 * 1024,), np.float32)
    assert b.ctypes.data != a.ctypes.data  # a is alive
    del b
    holders = {"a slice": lambda a: a[3:5], "a memoryview": memoryview, "a reshape": lambda a: a.reshape(-1),
               "a dtype view": lambda a: a.view(np.uint8), "a DLPack capsule": lambda a: a.__dlpack__()}
    for name, hold in holders.items():
        addr = a.ctypes.data
        keep = hold(a)
        del a
        gc.collect()
        other = aligned_empty((MiB,), np.uint8)
        assert other.ctypes.data != addr, name  # only the holder refers to it: still in use
        del keep
        a = aligned_empty((MiB // 8,), np.float64)
        assert a.ctypes.data == addr, name  # nothing refers to it any more: the same buffer again
        del other


def test_a_torch_tensor_sharing_the_buffer_keeps_it_in_use() -> None:
    torch = pytest.importorskip("torch")
    a = aligned_empty((MiB // 4,), np.float32)
    addr = a.ctypes.data
    t = torch.from_numpy(a)
    del a
    b = aligned_empty((MiB // 4,), np.float32)
    assert b.ctypes.data != addr
    b[:] = 1.0
    assert int(t.data_ptr()) == addr
    del t
    c = aligned_empty((MiB // 4,), np.float32)
    assert c.ctypes.data == addr


def test_small_and_huge_requests_are_plain_allocations() -> None:
    held = hostpool.held_bytes()[0]
    small = aligned_empty((1000,), np.float32)
    huge = aligned_empty((hostpool.MAX_BYTES + 1,), np.uint8)
    assert small.ctypes.data % HOST_ALIGNMENT == 0 and huge.ctypes.data % HOST_ALIGNMENT == 0
    assert hostpool.held_bytes()[0] == held
    assert hostpool.empty((1000,), np.float32) is None


@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3), (0, 5), (3, 1, 2), [4, 2], (np.int64(5),)])
@pytest.mark.parametrize("dtype", ["float32", "bool", "complex128", ">f4"])
def test_small_buffers_have_the_shape_dtype_and_alignment_asked(shape: tuple, dtype: str) -> None:
    a = aligned_empty(shape, dtype)
    assert a.shape == tuple(int(s) for s in shape) and a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable and (a.size == 0 or a.ctypes.data % HOST_ALIGNMENT == 0)


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(md.InvalidArgumentError, match="negative"):
        aligned_empty((-16,), np.uint8)  # (numpy's slice would give a buffer of the wrong size)
    with pytest.raises(md.InvalidArgumentError, match="negative"):
        aligned_empty((-2, 4), np.float32)


def test_the_caps_per_size_and_in_all() -> None:
    alive = [aligned_empty((MiB,), np.uint8) for _ in range(6)]  # 4 per size: the last two are plain
    held, free = hostpool.held_bytes()
    assert held == 4 * MiB and free == 0
    assert hostpool.empty((MiB,), np.uint8) is None
    del alive
    gc.collect()
    assert hostpool.held_bytes() == (4 * MiB, 4 * MiB)
    assert hostpool.clear() == 4 * MiB and hostpool.held_bytes() == (0, 0)


def test_the_cap_lets_the_least_recently_used_free_buffers_go_and_zero_turns_it_off() -> None:
    code = """
import gc, numpy as np
from multidev import hostpool
MiB = 1 << 20
a = [hostpool.empty((n * MiB,), np.uint8) for n in (1, 2)]
assert hostpool.held_bytes() == (3 * MiB, 0), hostpool.held_bytes()
del a
again = hostpool.empty((MiB,), np.uint8)  # the 1 MiB buffer again: its size is now the most recent
del again
b = hostpool.empty((3 * MiB,), np.uint8)  # over the 4 MiB cap: the 2 MiB buffer (least recent) goes
assert b is not None and hostpool.held_bytes() == (4 * MiB, MiB), hostpool.held_bytes()
c = hostpool.empty((5 * MiB,), np.uint8)  # does not fit beside b even with the rest let go
assert c is None and hostpool.held_bytes() == (3 * MiB, 0), hostpool.held_bytes()
print("OK")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, MULTIDEV_HOST_POOL_MB="4"))
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stdout + out.stderr
    off = subprocess.run([sys.executable, "-c", "import numpy as np; from multidev import hostpool; "
                          "assert hostpool.empty((1 << 20,), np.uint8) is None; print('OK')"],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, MULTIDEV_HOST_POOL_MB="0"))
    assert off.returncode == 0 and off.stdout.strip() == "OK", off.stdout + off.stderr


def test_threads_never_get_the_same_buffer_at_once() -> None:
    seen: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(200):
                a = aligned_empty((MiB // 4,), np.float32)
                a[:] = k * 1000 + i
                assert float(a[0]) == float(a[-1]) == k * 1000 + i  # no other thread wrote into it
                with lock:
                    seen.append(a.ctypes.data)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert hostpool.held_bytes()[0] <= 4 * MiB  # 4 per size at most


def test_numpy_backend_copies_and_results_recycle_their_buffers() -> None:
    x = np.ones(MiB // 4, np.float32)
    y = md.copy(x, "cpu:1")
    addr = md.to_numpy(y).ctypes.data
    np.testing.assert_array_equal(md.to_numpy(y), x)
    del y
    z = md.copy(x * 2, "cpu:1")
    assert md.to_numpy(z).ctypes.data == addr
    np.testing.assert_array_equal(md.to_numpy(z), x * 2)
