"""The CuPy adapter.

Two halves:

- on a machine with CuPy and a CUDA device (the lent H200, ``scripts/gpu/cupy.sh``): what only
  a GPU can show (pinned host buffers, the NCCL path, zero-copy DLPack with torch and JAX,
  placement under another current device);
- everywhere else: the adapter's logic through ``tests/fake_cupy.py``, a stand-in that enforces
  CuPy's rules (kernels on the current device, no implicit host conversion, NCCL's grouped raw
  pointers) but has no GPU, so nothing here claims to test CuPy itself. Each runs in a child
  process: the fake installs modules named ``cupy``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import multidev as md

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from _workers import child_suite  # noqa: E402


def _real_cupy_reason() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "needs CuPy (not installed here); its logic is tested through tests/fake_cupy.py below"
    try:
        import cupy
    except Exception as e:  # noqa: BLE001 - a broken install is a reason to skip, said as such
        return f"CuPy does not import here: {type(e).__name__}: {e}"
    if not cupy.cuda.is_available():
        return "needs a CUDA device; CuPy is installed but finds none (cupy.cuda.is_available() is False)"
    return None


REAL = _real_cupy_reason()
_needs_gpu = pytest.mark.skipif(REAL is not None, reason=REAL or "")


def gpu(fn: Any) -> Any:
    """A test of the real GPU half: marked ``gpu`` (``pytest -m gpu`` selects them) and skipped with
    the reason where there is none."""
    return pytest.mark.gpu(_needs_gpu(fn))
fake = pytest.mark.skipif(importlib.util.find_spec("cupy") is not None,
                          reason="a real CuPy is installed: the fake never shadows it (the GPU half runs instead)")


def _child(code: str, gpus: int = 2, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, FAKE_CUPY_GPUS=str(gpus),
               PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)


# == fake CuPy: the adapter's logic on CPU ===========================================================
@fake
@pytest.mark.slow
def test_suite_passes_on_fake_cupy_with_three_gpus(tmp_path: Path) -> None:
    """The whole conformance suite (with every installed partner) against the adapter over the fake:
    three GPUs and the host mapping make four devices, so the 'all' cases run too."""
    out = tmp_path / "m.json"
    scope, least = child_suite()
    r = _child("import sys; from multidev.cli import main; sys.exit(main(['conformance', '--backend', 'cupy', "
               f"'--import', 'fake_cupy', '--json', {str(out)!r}, '--', '-q', '-x', '-p', 'no:warnings', "
               f"*{scope!r}]))", gpus=3, timeout=900)  # (a whole suite: minutes on a loaded machine)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["backends"]["cupy"]["devices"] == ["cpu:0", "gpu:0", "gpu:1", "gpu:2"]
    m = doc["matrix"]["cupy"]
    assert sum(f["passed"] for f in m.values()) > least and all(f["failed"] == 0 for f in m.values())


@fake
def test_no_cuda_device_means_unavailable_not_a_crash() -> None:
    r = _child("""
import multidev as md, fake_cupy
from multidev.errors import BackendNotAvailableError
try:
    md.backend('cupy')
except BackendNotAvailableError as e:
    print('ERR', e)
print('LISTED', 'cupy' in md.backends())
from multidev.cli import main
print('RC', main(['devices', '--backend', 'cupy']))
""", gpus=0)
    assert r.returncode == 0, r.stderr
    assert "ERR cupy 14.2.0 is installed but finds no CUDA device" in r.stdout
    assert "cudaErrorInsufficientDriver" in r.stdout, "the CUDA reason is carried into the message"
    assert "LISTED False" in r.stdout and "RC 1" in r.stdout


@fake
def test_host_mapping_placement_and_native_paths() -> None:
    r = _child("""
import importlib.util, warnings, numpy as np, multidev as md, fake_cupy as cp
from multidev.adapters.cupy import CupyHostArray
warnings.simplefilter('error')  # no duplicate-claim warning for np.ndarray
b = md.backend('cupy')
assert b.capabilities.dlpack_streams and b.capabilities.pinned_memory, 'the stream handshake and pinned moves'
h = md.arange(6, dtype='float32', device='cpu:0', backend='cupy')
assert type(h) is CupyHostArray and h.ctypes.data % 64 == 0, 'host arrays: aligned NumPy subclass'
assert md.backend_of(h) is b and md.backend_of(np.zeros(3)).name == 'numpy'
g = md.to(h, 'gpu:1')
assert type(g) is cp.ndarray and md.device_of(g) == md.gpu(1) and md.to(g, 'gpu:1') is g
assert md.device(cp.Device(1)) == md.gpu(1) and b.to_native_device(md.gpu(1)) == cp.Device(1)
with cp.Device(0):  # CuPy's current device must not decide where results go
    z = md.zeros(3, device='gpu:1', backend='cupy')
    assert md.device_of(z) == md.gpu(1)
    s = md.allreduce([md.full(2, 1.0, device='gpu:0', backend='cupy'), z[:2]], algorithm='ring')
    assert [md.device_of(t) for t in s] == [md.gpu(0), md.gpu(1)]
a = md.to_numpy(g)
assert type(a) is np.ndarray and a.tolist() == [0, 1, 2, 3, 4, 5]
y, waiter = b.transfers.start_move(g, md.cpu())
assert any(any(o is y.base for o in objs) for _, objs in b.transfers._inflight), 'the buffers of a copy in flight are held'
waiter()
for dtype, op in (('bool', 'max'), ('bool', 'min'), ('int16', 'sum'), ('uint16', 'prod'), ('complex64', 'sum'), ('bfloat16', 'max')):
    if dtype not in b.capabilities.dtypes:
        # CuPy 14 holds bfloat16 through ml_dtypes, with NumPy >= 2.1.2
        assert dtype == 'bfloat16' and (int(np.__version__.split('.')[0]) < 2
                                        or importlib.util.find_spec('ml_dtypes') is None), dtype
        continue
    vals = [np.array([[1, 0], [3, 2]]) , np.array([[2, 1], [0, 2]])]
    xs = [md.asarray(v, dtype=dtype, device=f'gpu:{i}', backend='cupy') for i, v in enumerate(vals)]
    out = b.collectives.native_allreduce(xs, op)
    ref = {'sum': np.add, 'prod': np.multiply, 'max': np.maximum, 'min': np.minimum}[op](*[v.astype(np.float64) for v in vals])
    if dtype == 'bool':
        ref = ref.astype(bool)
    for t, d in zip(out, ('gpu:0', 'gpu:1')):
        assert md.device_of(t) == md.device(d) and md.dtype_of(t) == dtype, (dtype, op)
        got = md.to_numpy(t)
        assert np.array_equal(got, np.asarray(ref).astype(got.dtype)), (dtype, op, got)
try:
    b.collectives.native_allreduce(xs[:1] + [h[:4].reshape(2, 2).astype('float32')], 'sum')
except md.CapabilityError as e:
    assert 'GPU arrays' in str(e)
else:
    raise AssertionError('the native path must refuse host arrays')
print('OK')
""")
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


@fake
def test_large_uploads_are_staged_and_exact() -> None:
    """From staging.threshold bytes up, asarray of a pageable array runs the staging pipeline
    (several chunks, fewer buffers than chunks) and lands every byte on the asked-for GPU; smaller,
    strided and bfloat16 arrays go CuPy's own way. A 1 KiB plan makes the pipeline run on small data."""
    r = _child("""
import numpy as np, multidev as md, fake_cupy as cp
from multidev.adapter import StagingPlan
import multidev.adapters.cupy.transfers as mc  # the staged upload lives with the transfers
b = md.backend('cupy')
b.staging = StagingPlan(chunk=1024, depth=2, threads=2, threshold=4096)
calls = []
real = mc.staged_upload
mc.staged_upload = lambda src, *a: (calls.append(src.nbytes), real(src, *a))[1]
a = np.random.default_rng(0).integers(0, 2**31, size=(33, 77), dtype=np.int64)  # 20 KiB: 20 chunks
g = md.asarray(a, device='gpu:1', backend='cupy')
assert calls == [a.nbytes], calls
assert md.device_of(g) == md.gpu(1) and g.dtype == a.dtype and g.shape == a.shape
assert np.array_equal(g.get(), a), 'every byte lands'
a[0, 0] = -1
assert g.get()[0, 0] != -1, 'the upload is a copy'
for small in (np.arange(10.0), np.arange(4000, dtype=np.float64)[::2], np.float32(3)):
    calls.clear()
    y = md.asarray(small, device='gpu:0', backend='cupy')
    assert calls == [] and np.array_equal(y.get(), small)
print('OK')
""")
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


# == the real GPU ====================================================================================
@pytest.fixture(scope="module")
def cp() -> Any:
    import cupy

    return cupy


@gpu
def test_registry_finds_cupy_arrays_and_host_arrays(cp: Any) -> None:
    x = cp.arange(4, dtype=cp.float32)
    assert md.device_of(x) == md.gpu(x.device.id)
    assert md.to(x, md.gpu(x.device.id)) is x
    h = md.to(x, "cpu")
    assert md.backend_of(h).name == "cupy" and md.device_of(h) == md.cpu()
    np.testing.assert_array_equal(md.to_numpy(h), np.arange(4))


@gpu
def test_downloads_land_in_pinned_memory(cp: Any) -> None:
    b = md.backend("cupy")
    x = cp.arange(1 << 20, dtype=cp.float32) * 2
    y, waiter = b.transfers.start_move(x, md.cpu())
    assert waiter is not None
    waiter()
    attrs = cp.cuda.runtime.pointerGetAttributes(y.ctypes.data)
    assert attrs.type == cp.cuda.runtime.memoryTypeHost, f"not page-locked: {attrs.type}"
    np.testing.assert_array_equal(np.asarray(y)[:4], [0, 2, 4, 6])
    u, up_wait = b.transfers.start_move(np.arange(8, dtype=np.float32), md.gpu(0))
    up_wait()
    np.testing.assert_array_equal(u.get(), np.arange(8))


@gpu
def test_a_large_pageable_upload_is_exact(cp: Any) -> None:
    """The staging pipeline on a real GPU: 3 chunks of the default plan plus a ragged tail, exact."""
    b = md.backend("cupy")
    n = (3 * b.staging.chunk + 12345) // 4
    a = np.random.default_rng(1).random(n, dtype=np.float32)
    g = md.asarray(a, device="gpu:0", backend="cupy")
    assert a.nbytes >= b.staging.threshold and g.dtype == a.dtype
    assert np.array_equal(cp.asnumpy(g), a)


@gpu
def test_placement_ignores_the_current_device(cp: Any) -> None:
    n = cp.cuda.runtime.getDeviceCount()
    last = md.gpu(n - 1)
    with cp.cuda.Device(0):
        x = md.ones(3, device=last, backend="cupy")
        assert x.device.id == n - 1
        y = md.copy(x)
        assert y.device.id == n - 1 and y.data.ptr != x.data.ptr


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bool", "int16", "complex64", "bfloat16", "float64"])
def test_nccl_path_on_every_gpu(cp: Any, dtype: str) -> None:
    """The NCCL code path over every GPU there is (one on the H200: a communicator of one rank)."""
    b = md.backend("cupy")
    from cupy.cuda import nccl

    if not nccl.available:
        pytest.skip("CuPy finds no NCCL library here")
    if dtype not in b.capabilities.dtypes:
        pytest.skip(f"cupy cannot hold {dtype} here")
    n = cp.cuda.runtime.getDeviceCount()
    vals = [(np.arange(6).reshape(2, 3) % 3 + k) for k in range(n)]
    xs = [md.asarray(v, dtype=dtype, device=md.gpu(k), backend="cupy") for k, v in enumerate(vals)]
    op = "max" if dtype == "bool" else "sum"
    out = b.collectives.native_allreduce(xs, op)
    ref = np.sum(np.stack(vals), axis=0) if op == "sum" else np.max(np.stack(vals), axis=0).astype(bool)
    for k, y in enumerate(out):
        assert md.device_of(y) == md.gpu(k) and md.dtype_of(y) == dtype
        np.testing.assert_array_equal(md.to_numpy(y).astype(np.float64), np.asarray(ref, np.float64))


@gpu
@pytest.mark.parametrize("partner", ["torch", "jax"])
def test_dlpack_shares_gpu_memory_both_ways(cp: Any, partner: str) -> None:
    if partner not in md.backends():
        pytest.skip(f"{partner} is not installed here")
    x = cp.arange(8, dtype=cp.float32)
    y = md.convert(x, partner, copy=False)
    assert md.device_of(y) == md.device_of(x)
    back = md.convert(y, "cupy", copy=False)
    assert back.data.ptr == x.data.ptr, "a round trip through DLPack shares the buffer"
    x[...] = 5  # seen by the partner's view (read after the write: JAX caches host copies once read)
    cp.cuda.Device(x.device.id).synchronize()
    np.testing.assert_array_equal(md.to_numpy(y), np.full(8, 5.0))


@gpu
@pytest.mark.parametrize("partner", ["torch", "jax"])
def test_convert_orders_queued_work_on_the_gpu(cp: Any, partner: str) -> None:
    """dlpack_streams: convert does not wait on the host, yet the partner reads the finished values
    (the consumer's stream waits on CuPy's by an event), both ways."""
    if partner not in md.backends():
        pytest.skip(f"{partner} is not installed here")
    b = md.backend("cupy")
    assert b.capabilities.dlpack_streams
    x = cp.full((4096, 4096), 1.0, dtype=cp.float32)
    for _ in range(30):
        x = x + 1  # queued work: the result is 31 everywhere once it has run
    y = md.convert(x, partner, copy=False)
    np.testing.assert_array_equal(md.to_numpy(y)[::512, ::512], np.full((8, 8), 31.0))
    z = md.convert(md.full((4096, 4096), 2.0, device=md.device_of(x), backend=partner), "cupy", copy=False)
    np.testing.assert_array_equal(cp.asnumpy(z[::512, ::512] * 2), np.full((8, 8), 4.0))
