"""The contract of each protocol method, checked directly and for every dtype the backend declares:
copies and moves keep the dtype; ``asarray`` never shares the caller's buffer; ``to_numpy`` gives an
exact ``numpy.ndarray`` (0-d and empty included); the arithmetic the collectives are built from
(combine, divide, reshape, concat, split, shape_of) matches NumPy; ``synchronize`` and ``wait``
observably wait and raise asynchronous errors; the native allreduce is right for every op it takes."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device
from multidev.adapter import COMPLEX_DTYPES, FLOAT_DTYPES, numpy_dtype
from multidev.errors import CapabilityError, InvalidDtypeError

from ._helpers import (
    ALL_DTYPES,
    as_f64,
    assert_close,
    async_failure,
    collect,
    found,
    isolated,
    native_array,
    need_devices,
    need_dtype,
    np_dtype,
    ordered,
    other_device,
    pending_work,
    readiness,
    restart_child,
    sample,
)

_OPS = ("sum", "max", "min", "prod")
_NP_OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}


def _ref_type(dtype: str) -> Any:
    """The dtype references are compared in (what :func:`as_f64` gives for ``dtype``)."""
    kind = np_dtype(dtype).kind
    return np_dtype(dtype) if kind in "biu" else (np.complex128 if kind == "c" else np.float64)


def _same(b: Any, y: Any, device: Device, dtype: str, expect: np.ndarray, what: str, n_terms: int = 1) -> None:
    assert isinstance(y, b.tensor_types()), f"{what}: {type(y).__name__} is not a native {b.name} tensor"
    assert md.device_of(y) == device, f"{what}: on {md.device_of(y)}, expected {device}"
    assert md.dtype_of(y) == dtype, f"{what}: dtype {md.dtype_of(y)}, expected {dtype}"
    got = as_f64(b, y)
    assert got.shape == expect.shape, f"{what}: shape {got.shape}, expected {expect.shape}"
    assert_close(got, np.asarray(expect).astype(_ref_type(dtype)), dtype, n_terms)


def _target(devices: list[Device]) -> Device:
    """The device single-device contracts run on: the first accelerator, else the last CPU (a
    device other than cpu:0 where there is one, so a result left on cpu:0 shows)."""
    devs = ordered(devices)
    return devs[0] if devs[0].is_gpu else devs[-1]


# -- dtypes: copy, move, to_numpy, asarray -------------------------------------------------------
@pytest.mark.md_feature("dtypes")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_copy_keeps_every_dtype(md_backend: Any, md_device: Device, dtype: str) -> None:
    b = md_backend
    need_dtype(b, dtype, md_device)
    src = sample(dtype, (2, 3), seed=1, high=5)
    x = md.asarray(src, dtype=dtype, device=md_device, backend=b.name)
    _same(b, x, md_device, dtype, src, f"asarray({dtype})")
    y = md.copy(x)
    assert y is not x
    _same(b, y, md_device, dtype, src, f"copy({dtype})")
    _same(b, md.convert(x, b.name, copy=True), md_device, dtype, src, f"convert(copy=True) of {dtype}")


@pytest.mark.md_feature("dtypes")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_move_keeps_every_dtype(md_backend: Any, md_device: Device, md_devices: list, dtype: str) -> None:
    b = md_backend
    other = other_device(md_devices, md_device)
    need_dtype(b, dtype, md_device)
    need_dtype(b, dtype, other)
    src = sample(dtype, (3, 2), seed=2, high=5)
    x = md.asarray(src, dtype=dtype, device=md_device, backend=b.name)
    y = md.to(x, other)
    _same(b, y, other, dtype, src, f"to({dtype}, {other})")
    _same(b, md.to(y, md_device), md_device, dtype, src, f"to({dtype}) and back")
    _same(b, md.copy(x, other), other, dtype, src, f"copy({dtype}, {other})")
    _same(b, md.to(x, other, non_blocking=True).wait(), other, dtype, src, f"to({dtype}, non_blocking=True)")
    # a structure's tensors move together (the adapter's move_all where it has one): each as to() gives it
    srcs = [sample(dtype, shape, seed=7 + i, high=5) for i, shape in enumerate(_SHAPES)]
    xs = [x, *(md.asarray(s, dtype=dtype, device=md_device, backend=b.name) for s in srcs)]
    moved = md.to(xs, other)
    assert type(moved) is list and len(moved) == len(xs)
    for i, (t, want) in enumerate(zip(moved, [src, *srcs], strict=True)):
        _same(b, t, other, dtype, want, f"to([{len(xs)} {dtype} tensors], {other})[{i}]")


_SHAPES = [(), (0,), (2, 0), (2, 3)]


@pytest.mark.md_feature("dtypes")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_to_numpy_gives_an_exact_ndarray(md_backend: Any, md_devices: list, dtype: str) -> None:
    """``to_numpy`` is a ``numpy.ndarray`` (that class exactly, never a scalar or a subclass) with
    x's shape, dtype and values, 0-d and empty tensors included (on cpu:0 and on the device the
    single-device contracts use)."""
    b = md_backend
    devs = [d for d in dict.fromkeys([md_devices[0], _target(md_devices)]) if dtype in b.capabilities.dtypes_on(d)]
    if not devs:
        need_dtype(b, dtype, md_devices[0])
    try:
        want = numpy_dtype(dtype)
    except InvalidDtypeError as e:  # bfloat16 without ml_dtypes: NumPy has no such dtype here
        pytest.skip(f"to_numpy cannot give a {dtype} ndarray here: {e}")
    for dev in devs:
        for shape in _SHAPES:
            src = sample(dtype, shape, seed=3, high=5)
            x = md.asarray(src, dtype=dtype, device=dev, backend=b.name)
            for how, a in (("md.to_numpy", md.to_numpy(x)), ("to_numpy", b.to_numpy(x))):
                assert type(a) is np.ndarray, f"{how} of a {shape} {dtype} tensor on {dev} gave " \
                    f"{type(a).__module__}.{type(a).__qualname__}, not numpy.ndarray"
                assert a.shape == shape, f"{how}: shape {a.shape}, expected {shape}"
                assert a.dtype == want, f"{how}: dtype {a.dtype}, expected {want}"
                np.testing.assert_array_equal(a.astype(_ref_type(dtype)), src.astype(_ref_type(dtype)))


@pytest.mark.md_feature("dtypes")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_asarray_never_shares_the_callers_buffer(md_backend: Any, md_device: Device, dtype: str) -> None:
    """``asarray`` of a NumPy array copies, even where the framework could share it (a 64-byte
    aligned, C-contiguous buffer of the same dtype, with and without ``dtype=``): writing the
    array afterwards does not change the tensor, and writing the tensor does not change the array."""
    b = md_backend
    need_dtype(b, dtype, md_device)
    src = sample(dtype, (64,), seed=4, high=3)
    changed = sample(dtype, (64,), seed=5, low=3, high=5)
    for kw in ({}, {"dtype": dtype}):
        host = native_array(dtype, src)
        x = md.asarray(host, device=md_device, backend=b.name, **kw)
        md.synchronize(x)
        host[...] = native_array(dtype, changed)
        _same(b, x, md_device, dtype, src, f"asarray({dtype}, {kw or 'dtype=None'}) after the caller wrote its array")
    if b.capabilities.mutable:
        host = native_array(dtype, src)
        x = md.asarray(host, device=md_device, backend=b.name)
        b.assign(x, md.asarray(changed, dtype=dtype, device=md_device, backend=b.name))
        md.synchronize(x)
        np.testing.assert_array_equal(host.astype(_ref_type(dtype)), src.astype(_ref_type(dtype)),
                                      err_msg="a write into the tensor reached the caller's array")


@pytest.mark.md_feature("protocol")
@pytest.mark.parametrize("n", [64, 512 << 10, 8 << 20])
def test_asarray_is_done_with_the_callers_array_when_it_returns(md_backend: Any, md_device: Device, n: int) -> None:
    """``asarray`` of a NumPy array may copy asynchronously into the device, but the caller's array is
    free once it returns: writing it at once (nothing waited for; its last element first, which a
    copy still running reads last) changes nothing, at 256 bytes, 2 MiB and 32 MiB of float32 (where
    an upload may go in pieces)."""
    b = md_backend
    need_dtype(b, "float32", md_device)
    want = np.arange(n, dtype=np.float32)
    host = want.copy()
    x = md.asarray(host, device=md_device, backend=b.name)
    host[-1] = -1.0
    host[...] = -1.0
    md.synchronize(x)
    got = md.to_numpy(x)
    bad = int(np.count_nonzero(got != want))
    assert bad == 0, f"asarray of {n} float32 on {md_device}: {bad} values written by the caller after it " \
        "returned reached the tensor (the copy read the caller's array after returning)"


# -- the arithmetic the collectives are built from ------------------------------------------------
@pytest.mark.md_feature("protocol")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("op", _OPS)
def test_combine_matches_numpy(md_backend: Any, md_devices: list, op: str, dtype: str) -> None:
    """``combine(op, a, b)`` is NumPy's elementwise op in the operands' dtype (bool: sum is or,
    prod is and), a new tensor on their device; the operands are unchanged."""
    b = md_backend
    if dtype in COMPLEX_DTYPES and op in ("max", "min"):
        pytest.skip(f"{op} is undefined for complex tensors: the core refuses it (validate.check_op), so "
                    "combine is never asked for it")
    dev = _target(md_devices)
    need_dtype(b, dtype, dev)
    a0, b0 = sample(dtype, (3, 4), seed=6, high=4), sample(dtype, (3, 4), seed=7, high=4)
    x = md.asarray(a0, dtype=dtype, device=dev, backend=b.name)
    y = md.asarray(b0, dtype=dtype, device=dev, backend=b.name)
    z = b.combine(op, x, y)
    assert z is not x and z is not y
    _same(b, z, dev, dtype, _NP_OPS[op](a0, b0), f"combine({op}) of {dtype}")
    _same(b, x, dev, dtype, a0, f"combine({op}) left its first operand")
    _same(b, y, dev, dtype, b0, f"combine({op}) left its second operand")


@pytest.mark.md_feature("protocol")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES + COMPLEX_DTYPES)
def test_divide_keeps_the_floating_dtype(md_backend: Any, md_devices: list, dtype: str) -> None:
    b = md_backend
    dev = _target(md_devices)
    need_dtype(b, dtype, dev)
    src = sample(dtype, (2, 5), seed=8, high=9)
    x = md.asarray(src, dtype=dtype, device=dev, backend=b.name)
    for n in (1, 3, 4):
        _same(b, b.divide(x, n), dev, dtype, src.astype(_ref_type(dtype)) / n, f"divide({dtype}, {n})", 2)


@pytest.mark.md_feature("protocol")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_reshape_concat_split(md_backend: Any, md_devices: list, dtype: str) -> None:
    """reshape, concat and split keep values, dtype and device, pieces of size 0 included."""
    b = md_backend
    dev = _target(md_devices)
    need_dtype(b, dtype, dev)
    src = sample(dtype, (4, 6), seed=9, high=5)
    x = md.asarray(src, dtype=dtype, device=dev, backend=b.name)
    _same(b, b.reshape(x, (24,)), dev, dtype, src.reshape(24), "reshape")
    _same(b, b.reshape(x, (2, 3, 4)), dev, dtype, src.reshape(2, 3, 4), "reshape")
    for axis, sizes in ((0, [1, 0, 3]), (1, [2, 4, 0]), (-1, [5, 1]), (-2, [4])):
        parts = b.split(x, sizes, axis)
        assert isinstance(parts, list) and len(parts) == len(sizes), f"split({sizes}) gave {len(parts)} pieces"
        cuts = np.cumsum(sizes)[:-1]
        for p, r in zip(parts, np.split(src, cuts, axis=axis)):
            _same(b, p, dev, dtype, r, f"split({sizes}, axis={axis})")
        _same(b, b.concat(parts, axis), dev, dtype, src, f"concat(split({sizes}), axis={axis})")


@pytest.mark.md_feature("protocol")
def test_shape_of_gives_a_tuple_of_ints(md_backend: Any, md_device: Device) -> None:
    b = md_backend
    for shape in [(), (0,), (3, 0, 2), (2, 3), (1, 1, 1, 5)]:
        s = b.shape_of(md.zeros(shape, device=md_device, backend=b.name))
        assert type(s) is tuple and all(type(v) is int for v in s), f"shape_of gave {s!r} ({type(s).__name__})"
        assert s == shape, f"shape_of gave {s}, expected {shape}"


# -- synchronize, wait, to_numpy and transfers wait ----------------------------------------------
_WAITS: dict[str, Callable[[Any, Device, Any], None]] = {
    "synchronize(device)": lambda b, d, y: b.synchronize(d),
    "synchronize(None)": lambda b, d, y: b.synchronize(None),
    "wait(tensor)": lambda b, d, y: b.wait(y),
    "md.synchronize(tensor)": lambda b, d, y: md.synchronize(y),
    "md.synchronize(device)": lambda b, d, y: md.synchronize(d, backend=b.name),
}


@pytest.mark.md_feature("synchronize")
@pytest.mark.parametrize("how", list(_WAITS))
def test_synchronize_waits_for_queued_work(md_backend: Any, md_devices: list, how: str) -> None:
    """Work queued on a device has finished when the wait returns, as the framework's own
    readiness query shows (where it has one)."""
    b = md_backend
    dev = _target(md_devices)
    q = pending_work(b, dev)
    if q.ready is None:
        pytest.skip(f"{b.name} tensors expose no readiness query (is_ready(), a CUDA stream): waiting "
                    "cannot be observed here")
    _WAITS[how](b, dev, q.y)
    assert q.ready(), f"{how} returned while the work queued on {dev} was still running"
    found(b, "queued_work_seen", q.seen_pending)
    np.testing.assert_array_equal(as_f64(b, q.y), q.terms * as_f64(b, q.x))


@pytest.mark.md_feature("synchronize")
def test_reads_and_transfers_wait_for_queued_work(md_backend: Any, md_devices: list) -> None:
    """to_numpy, to_host and a non-blocking move of a tensor whose work is still queued give the
    final values (and the moved tensor is ready when ``wait()`` returns, where that is observable)."""
    b = md_backend
    dev = _target(md_devices)
    q = pending_work(b, dev)
    got = md.to_numpy(q.y).astype(np.float64)
    np.testing.assert_array_equal(got, q.terms * as_f64(b, q.x), err_msg="to_numpy read before the work finished")
    q = pending_work(b, dev)
    host = md.to_host([q.y], non_blocking=True).wait()
    np.testing.assert_array_equal(host[0].astype(np.float64), q.terms * as_f64(b, q.x),
                                  err_msg="to_host read before the work finished")
    moves = [(dev, other) for other in [d for d in md_devices if d != dev][:1] or [dev]]
    cpus = [d for d in md_devices if d.kind == "cpu"]
    if dev.is_gpu and len(cpus) > 1:
        moves.append((cpus[-1], cpus[0]))  # between CPU devices too, as on a machine without a GPU
    for src, other in moves:
        q = pending_work(b, src)
        z = md.to(q.y, other, non_blocking=True).wait()
        ready = readiness(b, z)
        if ready is not None:
            assert ready(), f"Transfer.wait() returned before the move to {other} had landed"
        np.testing.assert_array_equal(as_f64(b, z), q.terms * as_f64(b, q.x),
                                      err_msg=f"a non-blocking move to {other} read before the work finished")


_RAISES: dict[str, Callable[[Any, Device, Any], None]] = {
    "synchronize(device)": lambda b, d, t: b.synchronize(d),
    "synchronize(None)": lambda b, d, t: b.synchronize(None),
    "wait(tensor)": lambda b, d, t: b.wait(t),
    "md.synchronize()": lambda b, d, t: md.synchronize(),
}


@pytest.mark.md_feature("synchronize")
@pytest.mark.parametrize("how", list(_RAISES))
@isolated
def test_synchronize_raises_asynchronous_errors(md_backend: Any, md_devices: list, how: str) -> None:
    """An error that happens after the call that queued the work returned is raised by the next
    wait (runs in the suite's child interpreter: a CUDA device-side error poisons its process)."""
    b = md_backend
    dev = _target(md_devices)
    try:
        made = async_failure(b, dev)
    except Exception as e:  # noqa: BLE001 - the framework raised at once: nothing asynchronous to surface
        pytest.skip(f"{b.framework} raised the failure when it was queued ({type(e).__name__}): no "
                    "asynchronous error to surface")
    if made is None:
        pytest.skip(f"no way to make an asynchronous failure on {b.framework} is known to the suite: "
                    "error surfacing is not checked here")
    t, poisons = made
    raised = False
    try:
        _RAISES[how](b, dev, t)
    except Exception:  # noqa: BLE001 - any framework error type will do
        raised = True
    finally:
        if poisons or not raised:
            restart_child()  # the framework (or its pending error) must not reach later checks
        del t, made
        collect()
    found(b, "async_errors", True if raised else "swallowed")
    assert raised, f"{how} returned without raising the asynchronous error behind the work it waited for"


#: Every spelling of a wait for all work on a device.
_DROPPED_WAITS: dict[str, Callable[[Any, Device], None]] = {
    "synchronize(device)": lambda b, d: b.synchronize(d),
    "synchronize(None)": lambda b, d: b.synchronize(None),
    "md.synchronize()": lambda b, d: md.synchronize(),
    "md.synchronize(device)": lambda b, d: md.synchronize(d),
    "md.synchronize(device, backend=)": lambda b, d: md.synchronize(d, backend=b.name),
}


def _queue_and_wait(b: Any, dev: Device, steps: int, side: int, kept: Callable[[Any], None] | None = None,
                    dropped: Callable[[], None] | None = None) -> tuple[float, float]:
    """Queue ``steps`` dependent additions of a ``side`` x ``side`` tensor on ``dev``, then wait:
    ``kept(result)``, or ``dropped()`` once the result is dropped. Returns (seconds the calls took
    to return, seconds from their return to the end of the wait)."""
    x = b.full((side, side), 3, "float32", dev)
    b.wait(x)
    t0 = time.perf_counter()
    y = x
    for _ in range(steps):
        y = b.combine("sum", y, x)
    t1 = time.perf_counter()
    if kept is not None:
        kept(y)
    else:
        del y  # the only reference to the result (and with it to every intermediate one)
        assert dropped is not None
        dropped()
    return t1 - t0, time.perf_counter() - t1


@pytest.mark.md_feature("synchronize")
@pytest.mark.parametrize("how", list(_DROPPED_WAITS))
def test_synchronize_waits_for_work_whose_results_were_dropped(md_backend: Any, md_devices: list,
                                                               how: str) -> None:
    """Work queued on a device whose results the caller dropped (D2L 12.2's ``run(x)``) is done
    when synchronize returns, in every spelling. Observed by time, needing no readiness query of a
    tensor (there is none left to ask): the same work, its result kept and waited for, shows how
    long it runs after the calls that queued it return; a synchronize that returns much sooner
    than that (a quarter of it, in each of three tries) left it queued."""
    b = md_backend
    if not b.capabilities.async_execution:
        pytest.skip(f"{b.name} runs every call to completion before it returns (capabilities.async_execution="
                    "False): nothing stays queued for synchronize to wait for")
    dev = _target(md_devices)
    steps, side, biggest = 20, 1024, (8192 if dev.is_gpu else 2048)
    # Enough work to stay queued for 10 ms after the calls return; 4 ms on a GPU, where JAX's client
    # bounds the computations in flight: on an H200 about 6 ms of 8192 x 8192 additions stayed queued
    # however many were dispatched (h200-2026-12-02-round3c-gpu-checks-first.log).
    enough = 0.004 if dev.is_gpu else 0.01
    for _ in range(9):
        # Each shape twice, the first untimed: a framework's first call at a new shape may compile
        # (JAX: ~65 ms on an H200) and would make the calls that queue the work look synchronous.
        _queue_and_wait(b, dev, steps, side, kept=b.wait)
        queued, left = _queue_and_wait(b, dev, steps, side, kept=b.wait)
        if left >= enough:
            break
        if queued > 0.05 and left < 0.05 * queued:
            pytest.skip(f"the calls that queue work on {dev} take as long as the work ({queued * 1e3:.0f} ms, "
                        f"{left * 1e3:.2f} ms left after them): nothing stays queued to observe a wait by time")
        if side < biggest:
            side *= 2  # more work per call first (an accelerator can run calls faster than they come)
        else:
            steps *= 2
    else:
        pytest.skip(f"work queued on {dev} was done {left * 1e3:.2f} ms after the calls that queued it returned "
                    f"(they took {queued * 1e3:.1f} ms): too little is left queued to observe a wait by time")
    sync = _DROPPED_WAITS[how]
    tries = []
    for _ in range(3):
        _, ref = _queue_and_wait(b, dev, steps, side, kept=b.wait)
        _, waited = _queue_and_wait(b, dev, steps, side, dropped=lambda: sync(b, dev))
        tries.append(f"{waited * 1e3:.2f} ms of {ref * 1e3:.1f}")
        if waited >= 0.25 * ref:
            return
    pytest.fail(f"{how} returned while work whose results were dropped was still queued on {dev}: it waited "
                f"{', '.join(tries)} ms that the same work runs once queued (three tries)")


# -- the native allreduce, directly ---------------------------------------------------------------
def _native_devices(b: Any, devices: list[Device]) -> list[Device]:
    """The devices a native collective takes: every GPU when there are 2 or more, else every CPU,
    in reversed order (results must follow the input order, not the devices' numbering)."""
    gpus = [d for d in devices if d.is_gpu]
    devs = gpus if len(gpus) >= 2 else [d for d in devices if d.kind == "cpu"]
    need_devices(devs, 2)
    return devs[::-1]


@pytest.mark.md_feature("native")
@pytest.mark.md_requires("native_allreduce")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("op", _OPS)
def test_native_allreduce_every_op_and_dtype(md_backend: Any, md_devices: list, op: str, dtype: str) -> None:
    """``native_allreduce`` called directly: out of place, result i on input i's device in input
    order, exact for every op and dtype it accepts (it may refuse one with CapabilityError)."""
    b = md_backend
    devs = _native_devices(b, md_devices)
    need_dtype(b, dtype, *devs)
    low = 1 if op == "prod" else 0
    arrays = [sample(dtype, (3, 4), seed=20 + i, low=low, high=3) for i in range(len(devs))]
    xs = [md.asarray(a, dtype=dtype, device=d, backend=b.name) for a, d in zip(arrays, devs)]
    try:
        out = b.collectives.native_allreduce(xs, op)
    except CapabilityError as e:
        pytest.skip(f"{b.name}'s native allreduce refuses {op} on {dtype}: {str(e).splitlines()[0]}")
    assert isinstance(out, list) and len(out) == len(xs), "one result per input"
    ref = arrays[0]
    for a in arrays[1:]:
        ref = _NP_OPS[op](ref, a)
    for y, x, d in zip(out, xs, devs):
        assert y is not x, "native_allreduce is out of place"
        _same(b, y, d, dtype, ref, f"native_allreduce({op}) of {dtype} in input order {[str(v) for v in devs]}",
              len(devs))
    for a, x, d in zip(arrays, xs, devs):
        _same(b, x, d, dtype, a, f"native_allreduce({op}) left its inputs")


@pytest.mark.md_feature("native")
@pytest.mark.md_requires("native_allreduce")
def test_native_allreduce_mean_is_the_mean_or_refused(md_backend: Any, md_devices: list) -> None:
    """The core never asks a native path for ``mean`` (it sums and divides); an adapter that takes
    ``mean`` anyway must compute the mean, not the sum."""
    b = md_backend
    devs = _native_devices(b, md_devices)
    arrays = [np.full((2, 3), 2.0 * (i + 1), dtype=np.float32) for i in range(len(devs))]
    xs = [md.asarray(a, device=d, backend=b.name) for a, d in zip(arrays, devs)]
    try:
        out = b.collectives.native_allreduce(xs, "mean")
    except CapabilityError:
        found(b, "native_mean", "refused")
        return  # a refusal is the other allowed answer
    found(b, "native_mean", "computed")
    for y, d in zip(out, devs):
        _same(b, y, d, "float32", np.mean(np.stack(arrays), axis=0), "native_allreduce('mean')", len(devs))
