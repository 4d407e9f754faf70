"""Torch-specific behaviour of the torch adapter that the shared conformance suite cannot express.

CPU tests run everywhere; tests marked ``gpu`` need CUDA (one or two GPUs) and skip with a reason.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import multidev as md  # noqa: E402
from multidev import Device  # noqa: E402
from multidev.errors import CapabilityError, DeviceMismatchError, InvalidDeviceError  # noqa: E402

N_CUDA = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_cuda = pytest.mark.skipif(N_CUDA < 1,
                                reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
needs_2_cuda = pytest.mark.skipif(N_CUDA < 2, reason=f"needs 2 CUDA GPUs, torch sees {N_CUDA}")


@pytest.fixture(scope="module")
def tb():
    return md.backend("torch")


def _py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)


# -- module hygiene ---------------------------------------------------------------------------------
def test_synchronize_all_does_not_initialise_cuda():
    # synchronize(None) must not create CUDA contexts in a process that never used CUDA.
    r = _py("""
        import multidev as md, torch
        md.synchronize(backend="torch")
        print(torch.cuda.is_initialized())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


# -- devices ----------------------------------------------------------------------------------------
def test_devices_match_torch(tb):
    devs = tb.devices()
    assert devs[0] == Device("cpu", 0)
    assert [d for d in devs if d.kind == "gpu"] == [Device("gpu", i) for i in range(N_CUDA)]
    assert (Device("mps", 0) in devs) == bool(torch.backends.mps.is_available())


@pytest.mark.parametrize("native, expected", [
    (torch.device("cpu"), Device("cpu", 0)),
    (torch.device("cuda", 3), Device("gpu", 3)),
    (torch.device("cuda:1"), Device("gpu", 1)),
    (torch.device("mps"), Device("mps", 0)),
])
def test_from_native_device(tb, native, expected):
    assert tb.from_native_device(native) == expected
    assert md.device(native) == expected  # through Device.parse and the registry


def test_from_native_cuda_without_index_is_current_device(tb):
    expected = torch.cuda.current_device() if torch.cuda.is_available() else 0
    assert tb.from_native_device(torch.device("cuda")) == Device("gpu", expected)


def test_from_native_device_rejects_foreign(tb):
    assert tb.from_native_device("cuda:0") is None
    assert tb.from_native_device(Device("gpu", 0)) is None
    assert tb.from_native_device(torch.device("meta")) is None


def test_to_native_device_round_trips(tb):
    for d in tb.devices():
        nd = tb.to_native_device(d)
        assert isinstance(nd, torch.device)
        assert tb.from_native_device(nd) == d
    assert tb.to_native_device(Device("gpu", 2)) == torch.device("cuda", 2)


def test_device_of_unmodelled_device_raises(tb):
    with pytest.raises(InvalidDeviceError, match="meta"):
        tb.device_of(torch.empty(2, device="meta"))


# -- dtypes -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64"])
def test_wide_unsigned_advertised_only_with_arithmetic(tb, name):
    dt = getattr(torch, name, None)
    works = dt is not None
    if works:
        try:
            a = torch.ones(2, dtype=dt)
            torch.add(a, a), torch.maximum(a, a), torch.minimum(a, a), torch.arange(0, 2, dtype=dt)
        except (RuntimeError, NotImplementedError):
            works = False
    assert (name in tb.capabilities.dtypes) == works
    if not works:
        with pytest.raises(CapabilityError):
            tb.to_native_dtype(name)
    if dt is not None:  # held tensors still have a name
        assert tb.dtype_of(torch.zeros(1, dtype=dt)) == name


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_dtype_of_unnamed_torch_dtype(tb):
    with pytest.raises(CapabilityError, match="complex32|ComplexHalf|chalf"):
        tb.dtype_of(torch.zeros(1, dtype=torch.complex32))


# -- creation ---------------------------------------------------------------------------------------
def test_arange_empty_and_kernelless_dtypes_follow_numpy(tb):
    cpu = Device("cpu", 0)
    assert tb.arange(5, 0, 1, "int64", cpu).shape == (0,)  # torch.arange raises here natively
    b = tb.arange(0, 2, 1, "bool", cpu)
    assert b.dtype == torch.bool and b.tolist() == [False, True]
    c = tb.arange(0, 3, 1, "complex64", cpu)
    assert c.dtype == torch.complex64
    assert np.array_equal(c.numpy(), np.arange(0, 3, 1, dtype=np.complex64))


def test_rand_seeded_generator(tb):
    cpu = Device("cpu", 0)
    a, b = tb.rand((64,), "float32", cpu, 7), tb.rand((64,), "float32", cpu, 7)
    assert torch.equal(a, b)
    assert not torch.equal(a, tb.rand((64,), "float32", cpu, 8))
    assert float(a.min()) >= 0.0 and float(a.max()) < 1.0
    state = torch.random.get_rng_state()
    tb.rand((4,), "float32", cpu, 1)
    assert torch.equal(state, torch.random.get_rng_state())  # a seed never touches the global RNG
    assert tb.rand((3,), "int32", cpu, 1).dtype == torch.int32  # torch.rand has no int kernel


def test_asarray_numpy_awkward_layouts_are_copied(tb):
    cpu = Device("cpu", 0)
    src = np.arange(6, dtype=np.float32)
    rev = tb.asarray(src[::-1], None, cpu)  # negative strides: torch.from_numpy refuses them
    assert rev.tolist() == [5, 4, 3, 2, 1, 0]
    ro = src.copy()
    ro.flags.writeable = False
    assert tb.asarray(ro, None, cpu).tolist() == list(range(6))
    be = np.arange(3, dtype=">i4")
    got = tb.asarray(be, None, cpu)
    assert got.dtype == torch.int32 and got.tolist() == [0, 1, 2]
    t = tb.asarray(src, None, cpu)
    src[0] = 99
    assert t[0].item() == 0  # always a copy


def test_asarray_from_tensor_requiring_grad_is_a_detached_copy(tb):
    x = torch.ones(3, requires_grad=True)
    y = tb.asarray(x, "float64", Device("cpu", 0))
    assert y.dtype == torch.float64 and not y.requires_grad
    y[0] = 5
    assert x[0].item() == 1


def test_asarray_bfloat16_numpy(tb):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    arr = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    t = tb.asarray(arr, None, Device("cpu", 0))
    assert t.dtype == torch.bfloat16 and t.float().tolist() == [1.5, -2.0, 3.25]
    zero_d = tb.asarray(np.array(2.5, dtype=ml_dtypes.bfloat16), None, Device("cpu", 0))
    assert zero_d.shape == () and zero_d.item() == 2.5
    rev = tb.asarray(arr[::-1], None, Device("cpu", 0))
    assert rev.float().tolist() == [3.25, -2.0, 1.5]


# -- placement --------------------------------------------------------------------------------------
def test_copy_same_device_is_a_new_buffer(tb):
    x = torch.arange(4.0)
    y = tb.copy(x, Device("cpu", 0))
    assert y.data_ptr() != x.data_ptr()
    y[0] = 42
    assert x[0].item() == 0


def test_to_numpy_of_tensor_requiring_grad(tb):
    x = torch.ones(3, requires_grad=True) * 3  # non-leaf with grad_fn
    assert np.array_equal(tb.to_numpy(x), np.full(3, 3, np.float32))
    leaf = torch.nn.Parameter(torch.zeros(2))
    assert tb.to_numpy(leaf).tolist() == [0.0, 0.0]


def test_to_numpy_resolves_conj_and_neg_views(tb):
    c = torch.tensor([1 + 2j, 3 - 1j])
    assert np.array_equal(tb.to_numpy(c.conj()), np.array([1 - 2j, 3 + 1j], np.complex64))
    assert np.array_equal(tb.to_numpy(torch._neg_view(c)), -c.numpy())


@needs_cuda
def test_device_to_host_reads_of_conj_and_neg_views_keep_their_values(tb):
    """An asynchronous device-to-host copy of a conj or neg view into a plain host tensor applies the bit
    on the host before the copy lands (pytorch#146286): the blocking reads and the asynchronous
    download resolve the view on the device first. Work queued ahead makes the copy land late."""
    c = torch.tensor([1 + 2j, 3 - 1j], device="cuda:0")
    want = np.array([1 - 2j, 3 + 1j], np.complex64)
    for view, expected in ((c.conj(), want), (torch._neg_view(c), -c.cpu().numpy())):
        torch.cuda._sleep(50_000_000)  # (the copy queued behind it)
        assert np.array_equal(tb.to_numpy(view), expected)
        torch.cuda._sleep(50_000_000)
        assert np.array_equal(tb.move(view, Device("cpu", 0)).numpy(), expected)
        torch.cuda._sleep(50_000_000)
        host, wait = tb.transfers.start_download(view)
        wait()
        assert np.array_equal(host.numpy(), expected)


def test_to_numpy_bfloat16(tb):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    n = tb.to_numpy(x)
    assert n.dtype == np.dtype(ml_dtypes.bfloat16) and n.astype(np.float32).tolist() == [1.5, -2.0]


def test_to_numpy_bfloat16_without_ml_dtypes(tb, monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # makes `import ml_dtypes` fail
    with pytest.raises(CapabilityError, match="ml_dtypes"):
        tb.to_numpy(torch.ones(2, dtype=torch.bfloat16))


# -- arithmetic for collectives ---------------------------------------------------------------------
def test_adapter_ops_check_devices_before_torch(tb, monkeypatch):
    # One CPU device here: pretend meta tensors live on cpu:1 to reach the adapter's own check.
    monkeypatch.setattr(tb, "device_of",
                        lambda x: Device("cpu", 1) if x.device.type == "meta" else Device("cpu", 0))
    a, m = torch.ones(2), torch.empty(2, device="meta")
    with pytest.raises(DeviceMismatchError, match="cpu:0, cpu:1"):
        tb.combine("sum", a, m)
    with pytest.raises(DeviceMismatchError):
        tb.concat([a, m], 0)
    with pytest.raises(DeviceMismatchError):
        tb.assign(a, m)


def test_combine_complex_max_is_capability_error(tb):
    c = torch.tensor([1j])
    with pytest.raises(CapabilityError):
        tb.combine("max", c, c)


def test_assign_into_parameter(tb):
    p = torch.nn.Parameter(torch.zeros(3))
    tb.assign(p, torch.ones(3))
    assert p.tolist() == [1.0, 1.0, 1.0] and p.requires_grad


def test_divide_keeps_dtype(tb):
    assert tb.divide(torch.ones(2, dtype=torch.bfloat16), 3).dtype == torch.bfloat16
    assert tb.divide(torch.tensor([-7, 7]), 2).tolist() == [-3, 3]  # truncation, like NumPy's astype


# -- interchange ------------------------------------------------------------------------------------
def test_export_dlpack_requires_grad_and_zero_copy(tb):
    x = torch.arange(4.0, requires_grad=True)
    n = np.from_dlpack(tb.dlpack.export_dlpack(x))
    assert n.tolist() == [0, 1, 2, 3]
    with torch.no_grad():
        x[0] = 9
    assert n[0] == 9  # shares memory


def test_export_dlpack_conj_view_refused(tb):
    with pytest.raises(CapabilityError, match="resolve_conj"):
        tb.dlpack.export_dlpack(torch.tensor([1j]).conj())


def test_import_dlpack_object_and_capsule_share_memory(tb):
    a = np.arange(3, dtype=np.int64)
    t = tb.dlpack.import_dlpack(a, md.cpu(0))
    a[0] = 7
    assert t[0].item() == 7
    src = torch.arange(3)
    t2 = tb.dlpack.import_dlpack(src.__dlpack__(), md.cpu(0))
    assert t2.data_ptr() == src.data_ptr()
    with pytest.raises(CapabilityError):
        tb.dlpack.import_dlpack(object(), md.cpu(0))


# -- native fast paths ------------------------------------------------------------------------------
def test_native_allreduce_advertised_only_with_two_gpus(tb):
    assert (tb.collectives is not None) == (N_CUDA >= 2)
    if N_CUDA < 2:  # the concern's forwarder on the adapter says why, as an AttributeError
        with pytest.raises(AttributeError, match="no collectives concern"):
            tb.native_allreduce([], "sum")


def test_native_allreduce_refuses_cpu_tensors(tb):
    from multidev.adapters.torch.collectives import TorchCollectives

    coll = tb.collectives or TorchCollectives(tb)  # (made anyway where fewer than two GPUs leave it None)
    with pytest.raises(CapabilityError, match="CUDA"):
        coll.native_allreduce([torch.ones(2)], "sum")


# -- CUDA -------------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_cuda
def test_cuda_creation_placement_and_dtype(tb):
    g = Device("gpu", 0)
    for dt in sorted(tb.capabilities.dtypes):
        for x in (tb.full((2, 2), 1, dt, g), tb.empty((2,), dt, g), tb.rand((3,), dt, g, 0),
                  tb.asarray(np.zeros(2), dt, g), tb.asarray([1, 0], dt, g)):
            assert x.device == torch.device("cuda", 0) and tb.dtype_of(x) == dt
    assert tb.arange(0, 5, 1, "int64", g).device.type == "cuda"
    assert torch.equal(tb.rand((16,), "float32", g, 3), tb.rand((16,), "float32", g, 3))


@pytest.mark.gpu
@needs_cuda
def test_cuda_move_copy_to_numpy(tb):
    x = torch.arange(6.0, requires_grad=True)
    g = tb.move(x, Device("gpu", 0))
    assert g.device == torch.device("cuda", 0)
    c = tb.copy(g, Device("gpu", 0))
    assert c.data_ptr() != g.data_ptr()
    back = tb.move(g * 2, Device("cpu", 0))
    assert back.device.type == "cpu" and back.tolist() == [0, 2, 4, 6, 8, 10]
    assert np.array_equal(tb.to_numpy(g), np.arange(6.0, dtype=np.float32))
    bf = md.to_numpy(torch.ones(3, dtype=torch.bfloat16, device="cuda"))
    assert np.array_equal(bf.astype(np.float32), np.ones(3, np.float32))
    tb.wait(g)
    tb.synchronize(None)
    tb.synchronize(Device("gpu", 0))


@pytest.mark.gpu
@needs_cuda
def test_cuda_start_move_both_ways(tb):
    x = torch.arange(1 << 20, dtype=torch.float32)
    g, wait_h2d = tb.transfers.start_move(x, Device("gpu", 0))
    assert wait_h2d is not None and g.device == torch.device("cuda", 0)
    x.zero_()  # the source was snapshotted into a pinned buffer before start_move returned
    wait_h2d()
    assert g[5].item() == 5
    h, wait_d2h = tb.transfers.start_move(g * 2, Device("cpu", 0))
    assert wait_d2h is not None and h.device.type == "cpu" and h.is_pinned()
    wait_d2h()
    assert h[5].item() == 10 and h[-1].item() == 2 * ((1 << 20) - 1)
    host = md.to(g, "cpu", non_blocking=True).wait()
    assert torch.equal(host, torch.arange(1 << 20, dtype=torch.float32))


@pytest.mark.gpu
@needs_cuda
def test_cuda_mixed_devices_raise_device_mismatch(tb):
    a, b = torch.ones(2), torch.ones(2, device="cuda")
    for call in (lambda: tb.combine("sum", a, b), lambda: tb.concat([a, b], 0), lambda: tb.assign(a, b)):
        with pytest.raises(DeviceMismatchError, match="cpu:0, gpu:0"):
            call()


@pytest.mark.gpu
@needs_cuda
def test_cuda_async_error_surfaces_in_synchronize():
    # A device-side assert is reported at the next synchronization; it must not be swallowed.
    r = _py("""
        import multidev as md, torch
        x = torch.zeros(4, device="cuda")
        y = x[torch.tensor([40], device="cuda")]
        try:
            md.synchronize(backend="torch")
        except RuntimeError as e:
            print("raised", type(e).__name__)
        else:
            print("silent")
    """)
    assert "silent" not in r.stdout, "the asynchronous CUDA error was swallowed"
    assert "raised" in r.stdout or "device-side assert" in r.stderr, (r.stdout, r.stderr)


@pytest.mark.gpu
@needs_2_cuda
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int32", "int64",
                                   "int16", "int8", "uint8", "bool", "complex64"])
@pytest.mark.parametrize("op", ["sum", "max", "min", "prod", "mean"])
def test_native_allreduce_matches_naive(tb, dtype, op):
    if op == "mean" and not md.canonical_dtype(dtype).startswith(("float", "bfloat", "complex")):
        pytest.skip("mean is refused on integer dtypes by the core")
    if dtype.startswith("complex") and op in ("max", "min", "prod"):
        with pytest.raises(CapabilityError):
            tb.collectives.native_allreduce([torch.ones(2, dtype=torch.complex64, device=f"cuda:{i}")
                                 for i in range(N_CUDA)], op)
        return
    gen = torch.Generator().manual_seed(0)
    base = [(torch.rand((3, 5), generator=gen) * 4).to(tb.to_native_dtype(dtype)) for _ in range(N_CUDA)]
    if dtype.startswith("complex"):
        base = [b + 1j * b.flip(0) for b in base]
    # non-contiguous inputs (column-major layouts), one per GPU
    xs = [b.to(f"cuda:{i}").t().contiguous().t() for i, b in enumerate(base)]
    assert not xs[0].is_contiguous()
    before = [x.clone() for x in xs]
    out = md.allreduce(xs, op=op, algorithm="native")
    ref = md.allreduce(xs, op=op, algorithm="naive")
    for i, (o, r, x, b) in enumerate(zip(out, ref, xs, before)):
        assert o.device == torch.device("cuda", i) and o.dtype == x.dtype and o.shape == x.shape
        assert o.data_ptr() != x.data_ptr()
        assert torch.equal(x, b)  # out of place: inputs untouched
        if dtype in ("float16", "bfloat16", "float32", "complex64"):
            torch.testing.assert_close(o.cpu(), r.cpu(), rtol=2e-2, atol=1e-2)
        else:
            assert torch.equal(o.cpu(), r.cpu()), (o, r)


@pytest.mark.gpu
@needs_2_cuda
def test_native_allreduce_unsupported_dtype(tb):
    if "uint16" in tb.capabilities.dtypes:
        pytest.skip("this torch has uint16 arithmetic")
    xs = [torch.zeros(2, dtype=torch.uint16, device=f"cuda:{i}") for i in range(2)]
    with pytest.raises(CapabilityError):
        tb.collectives.native_allreduce(xs, "sum")



@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bool", "bfloat16"])
def test_zeros_and_ones_through_the_filler_give_what_full_gives(tb, dtype):
    """md.zeros/ones call the adapter's filler (torch's own zeros/ones with dtype and device bound),
    kept per (dtype, device): the same tensors as ``full``, for every spelling of the shape."""
    dev = Device("cpu", 0)
    for value, fn in ((0, md.zeros), (1, md.ones)):
        want = tb.full((2, 3), value, dtype, dev)
        for shape in ((2, 3), [2, 3]):
            got = fn(shape, dtype=dtype, device="cpu:0", backend="torch")
            assert got.dtype == want.dtype and torch.equal(got, want)
        assert torch.equal(fn(4, dtype=dtype, backend="torch"), tb.full((4,), value, dtype, dev))
        assert torch.equal(fn((4,), dtype=dtype, backend="torch"), tb.full((4,), value, dtype, dev))
        assert fn((), dtype=dtype, backend="torch").shape == ()
    assert tb.filler(2.5, "float32", dev)((2,)).tolist() == [2.5, 2.5]  # a fill neither 0 nor 1: torch.full
    with pytest.raises(md.InvalidArgumentError):
        md.zeros(-1, backend="torch")
    with pytest.raises(md.InvalidArgumentError):
        md.zeros((2, -1), backend="torch")
    with pytest.raises(md.OutOfMemoryError):
        md.zeros((1 << 40, 1 << 10), backend="torch")


def test_writable_answers_only_where_assign_always_writes(tb):
    """``writable`` says True for a plain contiguous tensor (parameters too: assign writes under
    no_grad), False for one whose elements share memory (an expanded tensor: torch refuses the
    write, and a probe of its first row, which the in-place collectives write, would not see it)
    and None where only a write can tell (the core then probes): inference tensors and other
    strided views."""
    from multidev.validate import check_writable

    assert tb.writable(torch.zeros(3)) is True
    assert tb.writable(torch.nn.Parameter(torch.zeros(3))) is True
    with torch.inference_mode():
        inf = torch.zeros(3)
    assert tb.writable(inf) is None
    expanded = torch.zeros(1).expand(4)
    assert tb.writable(expanded) is False and tb.writable(torch.zeros(3, 1).expand(3, 2)) is False
    assert tb.writable(torch.zeros(4, 4)[:, 1]) is None and tb.writable(torch.zeros(1, 4).expand(1, 4)) is True
    with pytest.raises(RuntimeError, match="single memory location"):
        tb.assign(expanded, torch.ones(4))  # (what False stands for)
    with pytest.raises(CapabilityError, match="cannot be written in place"):
        check_writable(tb, inf, "probe")
    with pytest.raises(CapabilityError, match="cannot be written in place"):
        check_writable(tb, expanded, "probe")
    check_writable(tb, torch.nn.Parameter(torch.zeros(3)), "probe")


def test_a_subclass_overriding_full_gets_its_full_through_the_filler(tb):
    """torch's filler binds torch.zeros/ones; a subclass that overrides ``full`` gets the default
    filler (its own ``full``), so md.zeros/ones go through what it wrote."""
    calls = []

    class Counted(type(tb)):
        def full(self, shape, value, dtype, device):
            calls.append(shape)
            return super().full(shape, value, dtype, device)

    sub = Counted()
    assert sub.filler(0, "float32", Device("cpu", 0))((2,)).tolist() == [0.0, 0.0] and calls == [(2,)]
    plain = tb.filler(0, "float32", Device("cpu", 0))  # torch.zeros itself, sizes passed as arguments
    assert plain((2,)).tolist() == [0.0, 0.0] and calls == [(2,)]  # (not through anyone's full)
    assert plain(()).shape == () and plain((2, 0)).shape == (2, 0) and plain((3, 2)).dtype == torch.float32
    assert tb.filler(1, "int8", Device("cpu", 0))((2, 1)).tolist() == [[1], [1]]
