"""MXNet-specific behaviour of the mxnet adapter that the shared conformance suite cannot express.

Needs mxnet 1.9.1 on numpy<2 (the "with MXNet" environment); each test skips with the reason
otherwise, except the NumPy-2 refusal, which runs everywhere.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device
from multidev.errors import BackendNotAvailableError, CapabilityError, DeviceMismatchError, DeviceNotFoundError

HAVE_MXNET = importlib.util.find_spec("mxnet") is not None


def _py(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def b() -> Any:
    if not HAVE_MXNET:
        pytest.skip("mxnet is not installed (the \"with MXNet\" environment has it)")
    try:
        return md.backend("mxnet")
    except BackendNotAvailableError as e:
        pytest.skip(f"mxnet backend not available here: {e}")


@pytest.fixture(scope="module")
def mx(b: Any) -> Any:
    return b.mx


@pytest.fixture
def b3(b: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh adapter instance with three CPU contexts (the registry's one may have two)."""
    from multidev.adapters.mxnet import MxnetBackend

    monkeypatch.setenv("MULTIDEV_MXNET_CPU_DEVICES", "3")
    return MxnetBackend()


@pytest.fixture(autouse=True)
def _no_leftover_async_error(request: pytest.FixtureRequest) -> Any:
    yield
    if "mxnet" in sys.modules and HAVE_MXNET:
        try:
            sys.modules["mxnet"].nd.waitall()
        except Exception as e:  # noqa: BLE001  # an error a test left behind would surface in the next one
            pytest.fail(f"an asynchronous MXNet error was left pending: {e}")


# -- environment ------------------------------------------------------------------------------------
@pytest.mark.skipif(importlib.util.find_spec("mxnet") is None,
                    reason="mxnet is not installed: the numpy<2 refusal applies to an installed mxnet")
def test_numpy2_refused_before_importing_mxnet() -> None:
    r = _py("""
        import sys
        import numpy
        numpy.__version__ = "2.1.0"
        from multidev.adapters.mxnet import MxnetBackend
        from multidev.errors import BackendNotAvailableError
        try:
            MxnetBackend()
        except BackendNotAvailableError as e:
            print(e)
        else:
            print("NOT REFUSED")
        print("mxnet imported:", "mxnet" in sys.modules)
    """)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "NOT REFUSED" not in out
    assert "numpy<2" in out and "2.1.0" in out
    assert 'pip install torch==2.13.0 && pip install ".[all,mxnet]"' in out
    assert "numpy 1.26.4" in out and "JAX 0.7.1" in out
    assert "mxnet imported: False" in out, "the refusal must come before any import of mxnet"


@pytest.mark.skipif(int(np.__version__.split(".")[0]) < 2, reason="needs NumPy 2 (the modern environment)")
def test_numpy2_environment_reports_mxnet_unavailable() -> None:
    # Not installed (the modern environment): says so; installed beside numpy 2: the numpy<2 rule.
    why = r"numpy<2" if importlib.util.find_spec("mxnet") is not None else r"No module named 'mxnet'.*multidev\[mxnet\]"
    with pytest.raises(BackendNotAvailableError, match=why):
        md.backend("mxnet")
    assert "mxnet" not in md.backends()


def test_import_shim_silences_warnings_and_leaves_logging_alone(b: Any) -> None:
    # -W error: any DeprecationWarning escaping mxnet's import (or a use) fails the subprocess.
    # mx.util.np_shape logs through the root logger, which would install a handler on it.
    r = _py("""
        import logging, warnings
        import numpy as np
        import multidev as md
        x = md.asarray(np.float32(2.0), device="cpu:1", backend="mxnet")
        y = md.backend("mxnet").combine("sum", x, x)
        assert md.to_numpy(y).shape == ()
        print("bool" in vars(np), logging.root.handlers)
    """, "-W", "error::DeprecationWarning")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True []"


# -- devices ----------------------------------------------------------------------------------------
def test_native_devices_map_both_ways(b: Any, mx: Any) -> None:
    assert b.from_native_device(mx.cpu(1)) == Device("cpu", 1)
    assert b.from_native_device(mx.gpu(0)) == Device("gpu", 0)
    assert b.from_native_device(mx.cpu_pinned(0)) == Device("cpu", 0)
    assert b.from_native_device("cpu(1)") is None
    assert md.device(mx.cpu(1)) == Device("cpu", 1)
    assert b.to_native_device(Device("cpu", 1)) == mx.cpu(1) != mx.cpu(0)
    assert b.to_native_device(Device("gpu", 2)) == mx.gpu(2)


def test_devices_follow_env_and_gpus(b3: Any, mx: Any) -> None:
    try:
        n_gpu = mx.context.num_gpus()
    except Exception:  # noqa: BLE001
        n_gpu = 0
    assert b3.devices() == [Device("cpu", i) for i in range(3)] + [Device("gpu", i) for i in range(n_gpu)]
    if n_gpu == 0:
        with pytest.raises(DeviceNotFoundError, match="mxnet"):
            md.ones(2, device="gpu:0", backend="mxnet")


# -- tensors and placement --------------------------------------------------------------------------
def test_creation_gives_legacy_ndarray_on_the_context(b: Any, mx: Any) -> None:
    x = md.ones((2, 3), device="cpu:1", backend="mxnet")
    assert type(x) is mx.nd.NDArray and x.context == mx.cpu(1)
    for y in (md.zeros(2, device="cpu:1", backend="mxnet"), md.arange(3, device="cpu:1", backend="mxnet"),
              md.asarray([1, 2], device="cpu:1", backend="mxnet"),
              md.rand(3, device="cpu:1", backend="mxnet", seed=1)):
        assert type(y) is mx.nd.NDArray and y.context == mx.cpu(1)


def test_to_is_as_in_context_and_copy_is_copyto(b: Any, mx: Any) -> None:
    x = md.ones((2, 3), device="cpu:1", backend="mxnet")
    assert md.to(x, "cpu:1") is x and md.to(x, mx.cpu(1)) is x
    c = md.copy(x)
    assert c is not x and c.context == mx.cpu(1)
    b.assign(c, md.zeros((2, 3), device="cpu:1", backend="mxnet"))
    np.testing.assert_array_equal(md.to_numpy(x), np.ones((2, 3)))
    y = md.to(x, "cpu:0")
    assert y is not x and y.context == mx.cpu(0)


def test_mx_np_arrays_keep_their_type(b: Any, mx: Any) -> None:
    npt = mx.np.ndarray
    x = mx.np.array(np.arange(6, dtype=np.float32).reshape(2, 3), ctx=mx.cpu(0))
    x1 = mx.np.array(np.ones((2, 3), dtype=np.float32), ctx=mx.cpu(1))
    assert md.device_of(x) == Device("cpu", 0) and md.dtype_of(x) == "float32"
    results = {
        "to": md.to(x, "cpu:1"), "copy": md.copy(x), "combine": b.combine("sum", x, x),
        "divide": b.divide(x, 2), "reshape": b.reshape(x, (3, 2)), "concat": b.concat([x, x], 0),
        "allreduce_naive": md.allreduce([x, x1], algorithm="naive")[1],
        "allreduce_native": md.allreduce([x, x1], algorithm="native")[0],
        "allreduce_native_max": md.allreduce([x, x1], op="max", algorithm="native")[1],
    }
    results.update({f"split{i}": p for i, p in enumerate(b.split(x, [1, 0, 1], 0))})
    for what, y in results.items():
        assert isinstance(y, npt), f"{what} gave {type(y)}"
    np.testing.assert_array_equal(md.to_numpy(results["combine"]), 2 * np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(md.to_numpy(results["allreduce_native"]),
                                  np.arange(6).reshape(2, 3) + 1)
    dst = mx.np.zeros((2, 3), ctx=mx.cpu(0))
    b.assign(dst, x)
    assert isinstance(dst, npt)
    np.testing.assert_array_equal(md.to_numpy(dst), np.arange(6).reshape(2, 3))


def test_device_mismatch_raises_although_mxnet_does_not(b: Any, mx: Any) -> None:
    x = md.ones((2, 2), device="cpu:0", backend="mxnet")
    y = md.full((2, 2), 2.0, device="cpu:1", backend="mxnet")
    assert (x + y).context == mx.cpu(0)  # MXNet itself: silently on the first operand's context
    assert b.capabilities.raises_on_mixed_devices is False
    with pytest.raises(DeviceMismatchError, match=r"cpu:0.*cpu:1"):
        b.combine("sum", x, y)
    with pytest.raises(DeviceMismatchError, match="mxnet"):
        b.concat([x, y], 0)
    with pytest.raises(DeviceMismatchError, match="mxnet"):
        b.assign(x, y)
    np.testing.assert_array_equal(md.to_numpy(x), np.ones((2, 2)))


def test_asarray_keeps_numpy_dtype(b: Any) -> None:
    # mx.nd.array(float64 data) alone would give float32.
    x = md.asarray(np.arange(3, dtype=np.float64) / 3, device="cpu:1", backend="mxnet")
    assert md.dtype_of(x) == "float64"
    np.testing.assert_array_equal(md.to_numpy(x), np.arange(3) / 3)
    # Python data takes multidev's documented defaults, not MXNet's own float32 for everything
    assert md.dtype_of(md.asarray([1, 2], device="cpu:1", backend="mxnet")) == "int64"
    assert md.dtype_of(md.asarray([1.5], device="cpu:1", backend="mxnet")) == "float32"
    assert md.dtype_of(md.asarray(np.int8(3), backend="mxnet")) == "int8"


def test_full_keeps_huge_int64_exact(b: Any) -> None:
    x = md.full(2, 2 ** 60 + 1, dtype="int64", device="cpu:1", backend="mxnet")
    assert md.to_numpy(x).tolist() == [2 ** 60 + 1] * 2


def test_zero_d_and_empty_arrays_work_and_leave_legacy_shapes_alone(b: Any, mx: Any) -> None:
    s = md.asarray(np.float32(2.5), device="cpu:1", backend="mxnet")
    e = md.zeros((0, 3), device="cpu:1", backend="mxnet")
    assert b.shape_of(s) == () and b.shape_of(e) == (0, 3)
    assert md.to_numpy(b.combine("prod", s, s)).tolist() == 6.25
    assert md.to_numpy(md.to(s, "cpu:0")).shape == ()
    assert md.to_numpy(md.copy(e, "cpu:0")).shape == (0, 3)
    assert b.shape_of(b.reshape(e, (3, 0))) == (3, 0)
    assert [b.shape_of(p) for p in b.split(e, [1, 0, 2], 1)] == [(0, 1), (0, 0), (0, 2)]
    assert md.to_numpy(md.arange(0, 0, backend="mxnet")).shape == (0,)
    out = md.allreduce([s, md.asarray(np.float32(1.0), device="cpu:0", backend="mxnet")], algorithm="native")
    assert [md.to_numpy(o).tolist() for o in out] == [3.5, 3.5]
    assert mx.util.is_np_shape() is False, "the adapter must restore MXNet's legacy shape mode"


def test_bool_goes_through_integer_casts(b: Any) -> None:
    t = md.asarray(np.array([True, False, True, False]), device="cpu:1", backend="mxnet")
    f = md.asarray(np.array([True, True, False, False]), device="cpu:1", backend="mxnet")
    assert md.to_numpy(b.combine("sum", t, f)).tolist() == [True, True, True, False]
    assert md.to_numpy(b.combine("min", t, f)).tolist() == [True, False, False, False]
    both = b.concat([t, f], 0)
    assert md.dtype_of(both) == "bool" and md.to_numpy(both).tolist() == [True, False, True, False,
                                                                           True, True, False, False]
    assert [md.to_numpy(p).tolist() for p in b.split(t, [3, 1], 0)] == [[True, False, True], [False]]
    t0 = md.to(t, "cpu:0")
    for op, want in (("max", [True, True, True, False]), ("min", [True, False, False, False])):
        out = md.allreduce([t0, f], op=op, algorithm="native")
        assert [md.to_numpy(o).tolist() for o in out] == [want, want]


def test_seeded_rand_repeats_across_cpu_contexts(b: Any) -> None:
    a = md.to_numpy(md.rand((16,), device="cpu:0", backend="mxnet", seed=3))
    c = md.to_numpy(md.rand((16,), device="cpu:1", backend="mxnet", seed=3))
    d = md.to_numpy(md.rand((16,), device="cpu:1", backend="mxnet", seed=4))
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(a, d)
    h = md.to_numpy(md.rand((4096,), dtype="float16", device="cpu:1", backend="mxnet", seed=0))
    assert h.dtype == np.float16 and h.min() >= 0 and h.max() < 1


# -- native allreduce through KVStore ---------------------------------------------------------------
def test_kvstore_allreduce_on_three_cpus(b3: Any, mx: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    created = []
    real = mx.kv.create

    def spy(name: str = "local") -> Any:
        created.append(name)
        return real(name)

    monkeypatch.setattr(mx.kv, "create", spy)
    for dtype in ("float32", "int64", "float16"):
        xs = [b3.full((2, 3), i + 1, dtype, Device("cpu", i)) for i in range(3)]
        out = b3.collectives.native_allreduce(xs, "sum")
        assert [o.context for o in out] == [mx.cpu(0), mx.cpu(1), mx.cpu(2)]
        for o in out:
            assert b3.dtype_of(o) == dtype
            np.testing.assert_array_equal(o.asnumpy(), np.full((2, 3), 6))
        for i, x in enumerate(xs):  # out of place
            np.testing.assert_array_equal(x.asnumpy(), np.full((2, 3), i + 1))
        b3.assign(out[0], b3.full((2, 3), 0, dtype, Device("cpu", 0)))  # results never alias
        np.testing.assert_array_equal(out[1].asnumpy(), np.full((2, 3), 6))
        np.testing.assert_array_equal(xs[0].asnumpy(), np.ones((2, 3)))
    assert created == ["local"] * 3, "sum must go through a KVStore"
    assert b3.collectives is not None


def test_native_max_min_prod_and_mean(b3: Any) -> None:
    vals = [np.array([1.0, 5.0, -2.0]), np.array([4.0, 2.0, 0.5]), np.array([3.0, -1.0, 2.0])]
    xs = [b3.asarray(v, "float64", Device("cpu", i)) for i, v in enumerate(vals)]
    stack = np.stack(vals)
    for op, ref in (("max", stack.max(0)), ("min", stack.min(0)), ("prod", stack.prod(0)),
                    ("mean", stack.mean(0))):
        out = b3.collectives.native_allreduce(xs, op)
        for i, o in enumerate(out):
            assert b3.device_of(o) == Device("cpu", i)
            np.testing.assert_allclose(o.asnumpy(), ref, rtol=1e-12)
    with pytest.raises(CapabilityError, match="mxnet"):
        b3.collectives.native_allreduce(xs, "median")


# -- asynchronous errors ----------------------------------------------------------------------------
def _failing(mx: Any) -> Any:
    """An array whose computation fails on MXNet's engine thread: the call itself returns fine."""
    return mx.nd.random.normal(0, -1, shape=(4,), ctx=mx.cpu(1))


_ROUTES = {
    "synchronize()": lambda x: md.synchronize(),
    "synchronize(backend)": lambda x: md.synchronize(backend="mxnet"),
    "synchronize(device)": lambda x: md.synchronize("cpu:1", backend="mxnet"),
    "synchronize(other device)": lambda x: md.synchronize("cpu:0", backend="mxnet"),
    "synchronize(tensor)": lambda x: md.synchronize(x),
    "to_numpy": lambda x: md.to_numpy(x),
    "a moved copy": lambda x: md.synchronize(md.to(x, "cpu:0")),
    "a non-blocking move": lambda x: md.to(x, "cpu:0", non_blocking=True).wait(),
    "a result computed from it": lambda x: md.to_numpy(md.backend("mxnet").combine("sum", x, x)),
}


@pytest.mark.parametrize("route", list(_ROUTES))
def test_async_error_surfaces(b: Any, mx: Any, route: str) -> None:
    x = _failing(mx)  # no error yet: MXNet queues the op
    # multidev's calls raise it as BackendError, MXNet's message and exception kept (__cause__)
    with pytest.raises(md.BackendError, match="scale") as info:
        _ROUTES[route](x)
    assert isinstance(info.value.__cause__, mx.base.MXNetError)


def test_async_error_is_reported_once(b: Any, mx: Any) -> None:
    # MXNet's own rule, documented in the adapter: the first wait that sees an error clears it.
    _failing(mx)
    with pytest.raises(md.BackendError):
        md.synchronize(backend="mxnet")
    md.synchronize(backend="mxnet")


# -- DLPack -----------------------------------------------------------------------------------------
def test_dlpack_with_torch(b: Any, mx: Any) -> None:
    torch = pytest.importorskip("torch")
    x = md.arange(0, 6, dtype="float32", device="cpu:1", backend="mxnet")
    t = torch.from_dlpack(b.dlpack.export_dlpack(x))
    b.assign(x, md.full(6, 7.0, device="cpu:1", backend="mxnet"))
    md.synchronize(x)
    assert t.tolist() == [7.0] * 6, "export shares memory"
    src = torch.arange(4, dtype=torch.float32)
    y = b.dlpack.import_dlpack(src, md.cpu(0))
    src += 1
    assert y.asnumpy().tolist() == [1.0, 2.0, 3.0, 4.0], "import shares memory"
    assert md.device_of(y) == Device("cpu", 0)  # MXNet's FromDLPack: every CPU tensor on cpu(0)
    with pytest.raises(CapabilityError, match="compact"):
        b.dlpack.import_dlpack(torch.arange(6.0).reshape(2, 3).T, md.cpu(0))
    with pytest.raises(CapabilityError, match="mxnet"):
        b.dlpack.import_dlpack(torch.ones(2, dtype=torch.bfloat16), md.cpu(0))
    with pytest.raises(CapabilityError, match="mxnet"):
        b.dlpack.import_dlpack(torch.ones(2, dtype=torch.bool), md.cpu(0))


def test_dlpack_export_refuses_bool_and_takes_views(b: Any, mx: Any) -> None:
    with pytest.raises(CapabilityError, match="bool"):
        b.dlpack.export_dlpack(md.ones(2, dtype="bool", backend="mxnet"))
    base = md.asarray(np.arange(12, dtype=np.float32).reshape(4, 3), backend="mxnet")
    view = base[1:3]  # an axis-0 slice is a compact view in MXNet
    back = mx.nd.from_dlpack(b.dlpack.export_dlpack(view))
    np.testing.assert_array_equal(back.asnumpy(), np.arange(3, 9).reshape(2, 3))
