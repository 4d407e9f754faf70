"""Transfers and exchange: non-blocking moves with handles, batched host copies, and convert()
between the backend under test and every partner (an installed backend of another framework) on
every shared device, for every dtype both hold; ``import_dlpack`` placement; zero-copy wherever
both sides can share memory, virtual CPU devices included; ``copy=False`` never a silent copy, at
any alignment; on GPUs, the DLPack stream hand-off (the consumer's next kernel reads the complete
tensor while the producer's kernels were still queued).

Every check that hands a buffer to another framework runs in the suite's child interpreter
(``@isolated``): a framework that aborts on a buffer fails that check, and the run goes on."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device
from multidev.errors import CapabilityError
from multidev.exchange import exportable

from ._helpers import (
    ALL_DTYPES,
    aligned_copy,
    as_f64,
    buffer_address,
    found,
    isolated,
    need_dtype,
    other_device,
    readiness,
    sample,
)


@pytest.mark.md_feature("transfers")
def test_nonblocking_move_returns_a_handle(md_backend: Any, md_device: Device, md_devices: list) -> None:
    src = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = md.asarray(src, device=md_device, backend=md_backend.name)
    same = md.to(x, md_device, non_blocking=True)
    assert isinstance(same, md.Transfer) and same.wait() is x
    other = other_device(md_devices, md_device)
    h = md.to(x, other, non_blocking=True)
    assert isinstance(h, md.Transfer)
    y = h.wait()
    assert h.done() and h.wait() is y
    assert md.device_of(y) == other and md.dtype_of(y) == "float32"
    np.testing.assert_array_equal(as_f64(md_backend, y), src)


@pytest.mark.md_feature("transfers")
@pytest.mark.parametrize("non_blocking", [False, True])
def test_to_host_many(md_backend: Any, md_device: Device, non_blocking: bool) -> None:
    b = md_backend
    xs = [md.rand((32, 16), device=md_device, backend=b.name, seed=s) for s in range(4)]
    ys = [b.combine("sum", x, x) for x in xs]  # queued work the copies must wait for
    got: Any = md.to_host(ys, non_blocking=non_blocking)
    if non_blocking:
        assert isinstance(got, md.Transfer)
        got = got.wait()
    assert len(got) == 4
    for x, a in zip(xs, got):
        assert type(a) is np.ndarray and a.shape == (32, 16)
        np.testing.assert_allclose(a.astype(np.float64), 2 * as_f64(b, x), rtol=1e-6)


def _shared(b: Any, partner: str) -> tuple[Any, list[Device]]:
    p = md.backend(partner)
    shared = [d for d in b.devices() if d in p.devices()]
    if not shared:
        pytest.skip(f"{b.name} and {p.name} have no device in common here")
    return p, shared


def _where(shared: list[Device]) -> list[Device]:
    """Devices the exchange cases run on: cpu:0, another CPU (a virtual device) and the first GPU."""
    cpus = [d for d in shared if d.kind == "cpu"]
    out = cpus[:1] + (cpus[-1:] if len(cpus) > 1 else [])
    return out + [d for d in shared if d.kind != "cpu"][:1]


@pytest.mark.md_feature("interop")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@isolated
def test_convert_keeps_every_dtype(md_backend: Any, md_partner_name: str, dtype: str) -> None:
    """convert both ways keeps values, device and dtype, for every dtype both backends hold."""
    b = md_backend
    p, shared = _shared(b, md_partner_name)
    need_dtype(b, dtype)
    need_dtype(p, dtype)
    both = [d for d in shared if dtype in b.capabilities.dtypes_on(d) and dtype in p.capabilities.dtypes_on(d)]
    if not both:
        pytest.skip(f"no device {b.name} and {p.name} share holds {dtype} on both sides (capabilities.device_dtypes)")
    src = sample(dtype, (3, 4), seed=30, high=5)
    ref = src.astype(np.complex128 if src.dtype.kind == "c" else np.float64)
    for dev in _where(both):
        for frm, to_ in ((b, p), (p, b)):
            x = md.asarray(src, dtype=dtype, device=dev, backend=frm.name)
            y = md.convert(x, to_.name)
            assert isinstance(y, to_.tensor_types()), f"{frm.name}->{to_.name}: got {type(y)}"
            assert md.device_of(y) == dev, f"{frm.name}->{to_.name} of {dtype}: on {md.device_of(y)}, not {dev}"
            assert md.dtype_of(y) == dtype, f"{frm.name}->{to_.name}: dtype {md.dtype_of(y)}, not {dtype}"
            np.testing.assert_array_equal(as_f64(to_, y), ref)


_address = buffer_address


def _labels_host_memory(c: Any, dev: Device) -> bool:
    """Whether consumer ``c`` can give a plain host buffer (an aligned NumPy array, the reference
    producer) the device ``dev`` without copying: every host buffer can then be shared there."""
    host = aligned_copy(np.arange(4, dtype=np.float32))
    try:
        y = c.dlpack.import_dlpack(host, dev)
    except CapabilityError:
        return False
    return bool(md.device_of(y) == dev and _address(c, y) == host.ctypes.data)


@pytest.mark.md_feature("interop")
@pytest.mark.parametrize("partner_side", ["to partner", "from partner"])
@isolated
def test_convert_shares_memory_wherever_both_sides_can(md_backend: Any, md_partner_name: str,
                                                      partner_side: str) -> None:
    """``copy=False`` shares memory (the same buffer address; a write on a mutable source shows
    through) on cpu:0, on GPUs, and on every virtual CPU device the consumer can label host memory
    with; elsewhere it raises CapabilityError. ``copy=True`` is always independent."""
    b = md_backend
    p, shared = _shared(b, md_partner_name)
    frm, to_ = (b, p) if partner_side == "to partner" else (p, b)
    if b.dlpack is None or p.dlpack is None:
        with pytest.raises(CapabilityError):
            md.convert(md.ones(3, device=shared[0], backend=frm.name), to_.name, copy=False)
        pytest.skip(f"{b.name} or {p.name} has no dlpack concern")
    labelled = []
    for dev in [d for d in shared if d.kind == "cpu"] + [d for d in shared if d.kind != "cpu"][:1]:
        x = md.asarray(np.arange(4, dtype=np.float32), device=dev, backend=frm.name)
        z = md.convert(x, to_.name, copy=True)
        try:
            y = md.convert(x, to_.name, copy=False)
        except CapabilityError as e:
            virtual = dev.kind == "cpu" and dev.index > 0
            assert virtual, f"{frm.name}->{to_.name} on {dev} must share memory: {e}"
            assert not _labels_host_memory(to_, dev), (
                f"{to_.name} labels host memory with {dev} (it shares a NumPy buffer there), but refused "
                f"{frm.name}'s buffer: {e}")
            assert "share" in str(e) and "copy=None" in str(e)
            labelled.append(False)
            continue  # refused where the consumer cannot label host memory with dev: that is the check
        labelled.append(True)
        assert md.device_of(y) == dev
        assert _address(to_, y) == _address(frm, x), f"{frm.name}->{to_.name} on {dev}: copy=False copied"
        assert _address(to_, z) != _address(frm, x), f"{frm.name}->{to_.name} on {dev}: copy=True shares"
        expect = np.arange(4.0)
        if frm.capabilities.mutable:
            # A write on the source shows through the shared view only. It happens before the first
            # read of y: immutable consumers (JAX) may cache a host copy once read.
            frm.assign(x, md.full(4, 7.0, device=dev, backend=frm.name))
            md.synchronize(x)
            expect = np.full(4, 7.0)
        np.testing.assert_array_equal(as_f64(to_, y), expect)
        np.testing.assert_array_equal(as_f64(to_, z), np.arange(4))
    if len(labelled) > 1:
        found(to_, "shares_on_virtual_cpus", all(labelled[1:]))


@pytest.mark.md_feature("interop")
@isolated
def test_import_dlpack_lands_on_the_requested_device(md_backend: Any, md_devices: list) -> None:
    """``import_dlpack(obj, device)`` of the backend's own export gives a tensor on ``device``,
    sharing memory, on every device (virtual CPUs included), or raises CapabilityError; never a
    tensor somewhere else."""
    b = md_backend
    if b.dlpack is None:
        pytest.skip(f"{b.name} has no dlpack concern")
    for dev in md_devices:
        x = md.asarray(np.arange(6, dtype=np.float32) + dev.index, device=dev, backend=b.name)
        md.synchronize(x)
        try:
            y = b.dlpack.import_dlpack(exportable(b, x), dev)
        except CapabilityError:
            assert dev.kind == "cpu" and dev.index > 0, f"{b.name} cannot import its own export on {dev}"
            continue  # refused on a virtual CPU device: allowed, and the core then copies
        assert md.device_of(y) == dev, f"import_dlpack(..., {dev}) landed on {md.device_of(y)}"
        assert _address(b, y) == _address(b, x), f"import_dlpack on {dev} copied"
        np.testing.assert_array_equal(as_f64(b, y), np.arange(6.0) + dev.index)


@pytest.mark.md_feature("interop")
@isolated
def test_import_dlpack_from_partner_lands_on_the_requested_device(md_backend: Any, md_partner_name: str) -> None:
    """The same for a partner's exports on every shared device (host buffers of every CPU device
    arrive labelled cpu:0 by DLPack: placing them is the consumer's job)."""
    b = md_backend
    p, shared = _shared(b, md_partner_name)
    if b.dlpack is None or p.dlpack is None:
        pytest.skip(f"{b.name} or {p.name} has no dlpack concern")
    for dev in shared:
        x = md.asarray(np.arange(6, dtype=np.float32) * (dev.index + 1), device=dev, backend=p.name)
        md.synchronize(x)
        try:
            y = b.dlpack.import_dlpack(exportable(p, x), dev)
        except CapabilityError:
            assert dev.kind == "cpu" and dev.index > 0, f"{b.name} cannot import {p.name}'s buffer on {dev}"
            continue  # refused on a virtual CPU device: allowed, and the core then copies
        assert md.device_of(y) == dev, f"import_dlpack of a {p.name} buffer on {dev} landed on {md.device_of(y)}"
        np.testing.assert_array_equal(as_f64(b, y), np.arange(6.0) * (dev.index + 1))


@pytest.mark.md_feature("interop")
def test_convert_same_backend(md_backend: Any, md_device: Device) -> None:
    x = md.ones(3, device=md_device, backend=md_backend.name)
    assert md.convert(x, md_backend.name) is x
    y = md.convert(x, md_backend.name, copy=True)
    assert y is not x and md.device_of(y) == md_device


@pytest.mark.md_feature("interop")
@isolated
def test_convert_transposed_view(md_backend: Any, md_partner_name: str) -> None:
    """A transposed (strided) view converts to the right values: zero-copy where the consumer takes
    strides, else through the documented explicit copy."""
    b = md_backend
    p, shared = _shared(b, md_partner_name)
    src = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = md.asarray(src, device=shared[0], backend=b.name)
    xt = getattr(x, "T", None)
    if xt is None:
        pytest.skip(f"{b.name} tensors have no .T view to make a strided source from")
    y = md.convert(xt, p.name)
    assert md.device_of(y) == shared[0]
    np.testing.assert_array_equal(as_f64(p, y), src.T)


#: Views whose buffer starts at the tensor's own start, 4 bytes past it (an address no
#: 64-byte-aligned allocation gives) and 64 bytes past it.
_OFFSETS = {"whole": 0, "4 bytes in": 1, "64 bytes in": 16}


@pytest.mark.md_feature("interop")
@pytest.mark.parametrize("offset", list(_OFFSETS))
@pytest.mark.parametrize("partner_side", ["to partner", "from partner"])
@isolated
def test_convert_copy_false_never_copies(md_backend: Any, md_partner_name: str, partner_side: str,
                                         offset: str) -> None:
    """``convert(x, copy=False)`` gives a tensor sharing x's buffer (the same address, the same
    values) or raises CapabilityError, for every producer/consumer pair, on every shared device and
    for buffers at any alignment (a view starting 4 or 64 bytes into its tensor, where the producer
    makes views): never a copy handed out as if shared."""
    b = md_backend
    p, shared = _shared(b, md_partner_name)
    frm, to_ = (b, p) if partner_side == "to partner" else (p, b)
    k = _OFFSETS[offset]
    src = np.arange(40, dtype=np.float32)
    for dev in _where(shared):
        base = md.asarray(src, device=dev, backend=frm.name)
        x = base[k:] if k else base  # the framework's own slicing (eager TF slices on its default device)
        here = md.device_of(x)
        md.synchronize(x)
        try:
            y = md.convert(x, to_.name, copy=False)
        except CapabilityError:
            continue  # refused: allowed (the core or the consumer cannot share this buffer)
        got, want = _address(to_, y), _address(frm, x)
        assert got is not None and got == want, (
            f"{frm.name}->{to_.name} on {here} ({offset}): copy=False returned a copy (buffer at "
            f"{got if got is None else hex(got)}, the source's at {want if want is None else hex(want)})")
        assert md.device_of(y) == here, f"{frm.name}->{to_.name} ({offset}): on {md.device_of(y)}, not {here}"
        np.testing.assert_array_equal(as_f64(to_, y), src[k:])


def _queued_on(b: Any, device: Device, value: float, steps: int) -> Any:
    """``value * (steps + 1)`` everywhere, as ``steps`` dependent additions queued on ``device``'s
    stream after its input is done (a large tensor: the additions take a while on a GPU)."""
    x = b.full((8192, 8192), value, "float32", device)
    b.wait(x)
    y = x
    for _ in range(steps):
        y = b.combine("sum", y, x)
    return y


@pytest.mark.md_feature("interop")
@pytest.mark.parametrize("partner_side", ["to partner", "from partner"])
@isolated
def test_convert_on_a_gpu_is_ordered_after_the_producers_kernels(md_backend: Any, md_partner_name: str,
                                                                 partner_side: str) -> None:
    """On a GPU both sides have, ``convert`` of a tensor whose producing kernels are still queued
    on the producer's stream, followed at once by a kernel of the consumer on the result, gives
    that kernel the complete tensor, with no host-wide synchronize in between: the DLPack stream
    hand-off orders the consumer's stream after the producer's (``dlpack_streams`` on both sides),
    or ``convert`` waits on the host for the producer. Fresh values every time, so a buffer reused
    from an earlier run cannot pass for the result."""
    b = md_backend
    p, shared = _shared(b, md_partner_name)
    frm, to_ = (b, p) if partner_side == "to partner" else (p, b)
    gpus = [d for d in shared if d.is_gpu]
    if not gpus:
        pytest.skip(f"the DLPack stream hand-off orders accelerator streams: {b.name} and {p.name} share no GPU here")
    if b.dlpack is None or p.dlpack is None:
        pytest.skip(f"{b.name} or {p.name} has no dlpack concern: convert copies through the host")
    dev = gpus[0]
    rng = np.random.default_rng()
    steps, pending = 40, False
    for _ in range(4):
        value = float(rng.integers(1, 1000))
        y = _queued_on(frm, dev, value, steps)
        ready = readiness(frm, y)
        pending = ready is None or not ready()
        z = md.convert(y, to_.name)
        w = to_.combine("sum", z, z)  # the consumer's next kernel, on the consumer's stream
        got = np.asarray(md.to_numpy(w))
        bad = np.flatnonzero(got.reshape(-1) != 2 * (steps + 1) * value)
        assert bad.size == 0, (
            f"{frm.name}->{to_.name} on {dev}: the consumer's kernel read the converted tensor before the "
            f"producer's kernels had written it ({bad.size} of {got.size} elements wrong, e.g. "
            f"{got.reshape(-1)[bad[0]]} for {2 * (steps + 1) * value}): the DLPack stream hand-off was dropped")
        del y, z, w
        if pending:
            break
        steps *= 3  # the producer finished before convert: queue more work, so the hand-off is tested
    found(frm, "converted_while_pending", pending)
