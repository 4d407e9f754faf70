"""The adversarial cases, run in a child process so that a crash fails one test, not the run.

``python _child.py GROUP BACKEND``: GROUP is ``inputs`` (creation calls and placement calls over
hypothesis strategies of devices, dtypes, shapes, values and non-tensors), ``views`` (every view
layout of BACKEND's tensors through convert, placement and arithmetic to every installed backend),
``collectives`` (the single-process collectives over hypothesis strategies, against a float64
NumPy reference, with one input made bad at random) or ``leaks`` (the hot loops, RSS growth per
call). Every case must end in a correct result or a :class:`multidev.MultidevError`.

Before each case the child appends one line describing it to ``$MD_ADV_LOG``, so after a crash the
parent names the case that was running. Findings are printed as ``FINDING <text>``; the last line
is ``DONE <json>``. Exit status 0 when nothing was found.
"""
from __future__ import annotations

import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from fractions import Fraction
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
for _var in ("MULTIDEV_NUMPY_DEVICES", "MULTIDEV_JAX_CPU_DEVICES", "MULTIDEV_TF_CPU_DEVICES",
             "MULTIDEV_MXNET_CPU_DEVICES"):
    os.environ.setdefault(_var, "3")

import numpy as np  # noqa: E402

import multidev as md  # noqa: E402
from multidev.dtypes import DTYPES  # noqa: E402

_LOG = os.environ.get("MD_ADV_LOG")
_log_file = open(_LOG, "a", buffering=1) if _LOG else None  # noqa: SIM115 - line-buffered for the whole run
FINDINGS: list[str] = []
COUNTS = {"cases": 0, "ok": 0, "typed": 0}


def log(text: str) -> None:
    if _log_file is not None:
        _log_file.write(text.replace("\n", " ")[:400] + "\n")


def finding(text: str) -> None:
    FINDINGS.append(text)
    print("FINDING " + text.replace("\n", "\n    ")[:3000], flush=True)


class Bad(AssertionError):
    """A wrong result or an untyped error (fails the hypothesis example)."""


def outcome(desc: str, fn: Callable[[], Any], check: Callable[[Any], None] | None = None,
            must_fail: bool = False, allowed: tuple[type, ...] = (md.MultidevError,)) -> Any:
    """Run one case: a MultidevError is fine (unless its class is not in ``allowed``); an untyped
    error, a wrong result (``check`` raises) or a success where ``must_fail`` is a finding."""
    COUNTS["cases"] += 1
    log(desc)
    try:
        y = fn()
    except md.MultidevError as e:
        if not isinstance(e, allowed):
            raise Bad(f"{desc}: {type(e).__name__} where only {[a.__name__ for a in allowed]} fit: {e}") from None
        COUNTS["typed"] += 1
        return None
    except Exception as e:  # noqa: BLE001 - the finding this suite exists for
        raise Bad(f"{desc}: untyped {type(e).__module__}.{type(e).__name__}: {str(e)[:300]}\n"
                  f"{traceback.format_exc()[-1200:]}") from None
    if must_fail:
        raise Bad(f"{desc}: succeeded (returned {type(y).__name__}) but must raise a MultidevError")
    if check is not None:
        try:
            check(y)
        except Bad:
            raise
        except Exception as e:  # noqa: BLE001
            raise Bad(f"{desc}: wrong result: {type(e).__name__}: {str(e)[:400]}") from None
    COUNTS["ok"] += 1
    return y


def host(x: Any) -> np.ndarray:
    return np.asarray(md.to_numpy(x))


def same_values(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape} != {want.shape}")
    if dtype.startswith(("int", "uint")) or dtype == "bool":
        if not np.array_equal(got, want):
            raise AssertionError(f"values {got.ravel()[:6]} != {want.ravel()[:6]}")
        return
    tol = {"float16": 2e-3, "bfloat16": 2e-2}.get(dtype, 1e-5)
    g, w = got.astype(np.complex128), want.astype(np.complex128)
    if not np.allclose(g, w, rtol=tol, atol=tol, equal_nan=True):
        raise AssertionError(f"values {got.ravel()[:6]} != {want.ravel()[:6]}")


def run_given(name: str, test: Callable[[], None]) -> None:
    """Run a hypothesis test function; a falsifying example is a finding."""
    try:
        test()
    except Bad as e:
        finding(f"[{name}] {e}")
    except Exception as e:  # noqa: BLE001 - hypothesis's own errors (flaky, health checks) too
        finding(f"[{name}] {type(e).__name__}: {str(e)[:1500]}\n{traceback.format_exc()[-1500:]}")


# == strategies ======================================================================================
def settings(n: int) -> Any:
    from hypothesis import HealthCheck
    from hypothesis import settings as hsettings

    seed = os.environ.get("MULTIDEV_ADVERSARIAL_SEED") or None
    return hsettings(max_examples=int(n * float(os.environ.get("MULTIDEV_ADVERSARIAL_SCALE", "1"))),
                     deadline=None, database=None, derandomize=seed is None, print_blob=False,
                     suppress_health_check=list(HealthCheck))


def seeded(fn: Any) -> Any:
    seed = os.environ.get("MULTIDEV_ADVERSARIAL_SEED") or None
    if seed is None:
        return fn
    from hypothesis import seed as hseed

    return hseed(int(seed))(fn)


BAD_DEVICES: list[Any] = ["banana", "cpu:-1", "cpu:99", "gpu:7", "cuda:x", "cpu:" + "9" * 40, 3, 2.5, object(),
                          ("cpu",), b"cpu:0", "", " cpu:0 ", "tpu:0"]
GOOD_DTYPE_SPELLINGS = ["?", "b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "e", "f", "d", "F", "D",
                        "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "c16", "<f4",
                        "=i8", "Float32", "INT64", "bool", "np.float32", "torch.float64"]
BAD_DTYPES: list[Any] = ["float33", "U1", "S1", "O", "M8[s]", "m8[s]", "V8", "f16", "g", "G", "u", "E", "str",
                         "object", "", " ", "float", "complex", 3, 1.5, None, object(), [], (1,), {"a": 1},
                         b"f4", np.float32(1), np.dtype("U3"), np.dtype([("a", "f4")]), str, object]


def expected_dtype(spec: Any) -> str | None:
    """The canonical name multidev must give a dtype spelling (NumPy's reading of type codes;
    full names case-insensitive; module prefixes allowed), or None when it must be refused."""
    if isinstance(spec, str):
        s = spec.strip()
        if "." in s:
            s = s.rsplit(".", 1)[1]
        if s.lower() in DTYPES and len(s) > 2:
            return s.lower()
        try:
            nd = np.dtype(s)
        except (TypeError, ValueError):
            return None
        return nd.name if nd.kind in "biufc" and nd.name in DTYPES else None
    if isinstance(spec, np.dtype):
        return spec.name if spec.kind in "biufc" and spec.name in DTYPES else None
    if spec in (float, int, bool, complex):
        return np.dtype(spec).name
    if isinstance(spec, type) and issubclass(spec, np.generic):
        nd = np.dtype(spec)
        return nd.name if nd.kind in "biufc" and nd.name in DTYPES else None
    return None


def md_parse_fails(spec: Any) -> bool:
    try:
        md.device(spec)
    except md.MultidevError:
        return True
    return False


def st_devices(b: Any) -> Any:
    from hypothesis import strategies as st

    good = [str(d) for d in b.devices()] + [md.Device(d.kind, d.index) for d in b.devices()]
    return st.one_of(st.sampled_from(good), st.sampled_from(good + [None]), st.sampled_from(BAD_DEVICES))


def st_dtypes() -> Any:
    from hypothesis import strategies as st

    return st.one_of(st.sampled_from(list(DTYPES)), st.sampled_from(GOOD_DTYPE_SPELLINGS), st.sampled_from(BAD_DTYPES),
                     st.sampled_from([np.float32, np.int8, np.uint16, np.bool_, np.complex64, np.float64, float, int,
                                      bool, complex, np.dtype("f2"), np.dtype(">f4"), np.dtype("u8")]), st.none())


def st_shapes() -> Any:
    from hypothesis import strategies as st

    dim = st.integers(0, 4)
    good = st.one_of(dim, st.tuples(), st.lists(dim, max_size=4).map(tuple), st.lists(dim, max_size=3),
                     st.lists(dim, max_size=3).map(lambda xs: tuple(np.int64(x) for x in xs)))
    bad = st.sampled_from([-1, (-1,), (2, -3), (1.5,), 1.0, "34", (True, 2), True, None, (None,), ((2,), 3),
                           (2 ** 62,), 2 ** 62, (2 ** 31, 2 ** 31), (2 ** 24, 2 ** 24, 2 ** 24), (1,) * 40, object(),
                           (-0.45, -0.45), np.float64(3), (np.float32(2),), "", b"\x02", {"a": 2}, (2 ** 80,),
                           ("1", "2"), (complex(2, 0),)])
    return st.one_of(good, good, bad)


def valid_shape(shape: Any) -> tuple[int, ...] | None:
    """The shape as a tuple when it is valid (small, as generated), else None."""
    def is_int(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))

    if is_int(shape):
        dims = [shape]
    elif isinstance(shape, (list, tuple)):
        dims = list(shape)
    else:
        return None
    if len(dims) > 32 or not all(is_int(d) and d >= 0 for d in dims):
        return None
    if math.prod(int(d) for d in dims) > 2 ** 20:
        return None  # generated huge shapes: a typed refusal or OutOfMemoryError is the right answer
    return tuple(int(d) for d in dims)


def st_values() -> Any:
    from hypothesis import strategies as st

    return st.one_of(
        st.integers(-3, 3), st.integers(-(2 ** 70), 2 ** 70), st.sampled_from([127, 128, -129, 255, 256, 2 ** 31,
                                                                                2 ** 63, 2 ** 64 - 1, -(2 ** 63)]),
        st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, -0.0, 1e300, 65504.0, 65520.0, 3.0]),
        st.booleans(), st.complex_numbers(max_magnitude=1e6), st.sampled_from([1 + 0j, 2 + 3j]),
        st.sampled_from([None, "1", b"1", [1], (1,), np.float16(1.5), np.int8(-3), np.uint64(2 ** 64 - 1),
                         np.bool_(True), np.complex64(1j), np.float64("nan"), Fraction(1, 3), Fraction(4, 2),
                         np.array(2.0), object()]))


def fill_expectation(value: Any, dtype: str) -> Any:
    """What ``full(shape, value, dtype)`` must hold: the exact value, or None when it must be refused
    (the dtype cannot hold it exactly: out of range, fractional into integers, NaN or infinity
    into integers, an imaginary part into a real dtype, overflow to infinity; or no number)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int, Fraction, float)):
        pass
    elif isinstance(value, complex):
        if dtype.startswith("complex"):
            lim = float(np.finfo("float32" if dtype == "complex64" else "float64").max)
            if any(math.isfinite(p) and abs(p) > lim for p in (value.real, value.imag)):
                return None
            return value
        if value.imag != 0:
            return None
        value = value.real
    else:
        return None
    if dtype == "bool":
        return bool(value) if value in (0, 1) and not (isinstance(value, float) and math.isnan(value)) else None
    if dtype.startswith(("int", "uint")):
        if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
            return None
        if isinstance(value, Fraction) and value.denominator != 1:
            return None
        v = int(value)
        info = np.iinfo(dtype)
        return v if info.min <= v <= info.max else None
    f = float(value)
    fmax = 3.3895313892515355e38 if dtype == "bfloat16" else float(np.finfo(
        {"complex64": "float32", "complex128": "float64"}.get(dtype, dtype)).max)
    if math.isfinite(f) and abs(f) > fmax:
        return None
    return f


def default_fill_dtype(value: Any, b: Any, dev: md.Device) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64" if "int64" in b.capabilities.dtypes_on(dev) else "int32"
    if isinstance(value, complex):
        return "complex64"
    return "float32"


# == inputs ==========================================================================================
def group_inputs(name: str) -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    b = md.backend(name)
    types = b.tensor_types()
    devices = b.devices()

    def resolve(spec: Any) -> md.Device | None:
        if spec is None:
            return md.Device("cpu", 0)
        try:
            d = md.device(spec)
        except md.MultidevError:
            return None
        return d if d in devices else None

    def check_tensor(y: Any, dev: md.Device, dtype: str, shape: tuple[int, ...]) -> None:
        if not isinstance(y, types):
            raise AssertionError(f"{type(y).__name__} is not a {name} tensor")
        if md.device_of(y) != dev:
            raise AssertionError(f"on {md.device_of(y)}, asked for {dev}")
        if md.dtype_of(y) != dtype:
            raise AssertionError(f"dtype {md.dtype_of(y)}, expected {dtype}")
        if tuple(b.shape_of(y)) != shape:
            raise AssertionError(f"shape {b.shape_of(y)}, expected {shape}")

    @settings(160)
    @seeded
    @given(call=st.sampled_from(["zeros", "ones", "empty", "rand", "full"]), shape=st_shapes(), dtype=st_dtypes(),
           device=st_devices(b), value=st_values(), seed=st.one_of(st.none(), st.integers(-2, 2 ** 130),
                                                                   st.sampled_from([1.5, "1", True])))
    def creation(call: str, shape: Any, dtype: Any, device: Any, value: Any, seed: Any) -> None:
        dev = resolve(device)
        shp = valid_shape(shape)
        want = expected_dtype(dtype) if dtype is not None else None
        bad_dtype = dtype is not None and want is None
        args: dict[str, Any] = {"dtype": dtype, "device": device, "backend": name}
        if call == "full":
            fn = lambda: md.full(shape, value, **args)
            want = want or (default_fill_dtype(value, b, dev) if dev is not None else None)
        elif call == "rand":
            fn = lambda: md.rand(shape, seed=seed, **args)
        else:
            fn = lambda: getattr(md, call)(shape, **args)
        want = want or "float32"
        desc = f"{name} {call}(shape={shape!r:.60}, dtype={dtype!r}, device={device!r:.50}, value={value!r:.40}, seed={seed!r:.30})"
        invalid = dev is None or bad_dtype or shp is None
        if call == "rand" and seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool)
                                                        and 0 <= seed < 2 ** 128):
            invalid = True
        if call == "rand" and not want.startswith(("float", "bfloat", "complex")):
            invalid = True  # uniform [0, 1) samples in an integer or bool dtype would be all 0 / all True
        fill = None
        if call == "full" and not invalid:
            fill = fill_expectation(value, want)
            invalid = fill is None
        if not invalid and shp is None:
            invalid = True

        def check(y: Any) -> None:
            assert dev is not None and shp is not None
            check_tensor(y, dev, want, shp)
            h = host(y)
            if call in ("zeros", "ones"):
                same_values(h, np.full(shp, 0 if call == "zeros" else 1).astype(h.dtype), want)
            elif call == "full":
                same_values(h, np.full(shp, fill, dtype=h.dtype), want)
            elif call == "rand" and h.size:
                hv = h.astype(np.complex128) if want.startswith("complex") else h.astype(np.float64)
                if not (np.all(hv.real >= 0) and np.all(hv.real < 1)):
                    raise AssertionError(f"rand outside [0, 1): {h.ravel()[:5]}")

        if invalid:
            outcome(desc, fn, must_fail=True)
        else:
            # a valid request: the right tensor, or a refusal naming a capability (dtype here) or memory
            outcome(desc, fn, check, allowed=(md.CapabilityError, md.OutOfMemoryError))

    @settings(100)
    @seeded
    @given(start=st_values(), stop=st.one_of(st.none(), st_values()), step=st.one_of(st.just(1), st_values()),
           dtype=st.one_of(st.none(), st.sampled_from(["int32", "int64", "float32", "float64", "int8", "uint8",
                                                       "float16", "bool"])), device=st_devices(b))
    def ranges(start: Any, stop: Any, step: Any, dtype: Any, device: Any) -> None:
        desc = f"{name} arange({start!r:.30}, {stop!r:.30}, {step!r:.30}, dtype={dtype}, device={device!r:.40})"
        dev = resolve(device)

        def real(v: Any) -> bool:
            if isinstance(v, np.generic):
                v = v.item()
            return (isinstance(v, (int, float, Fraction)) and not isinstance(v, bool)
                    and math.isfinite(float(v)))

        lo, hi = (0, start) if stop is None else (start, stop)
        vals = [lo, hi, step]
        invalid = dev is None or not all(real(v) for v in vals) or dtype == "bool"
        if not invalid and float(step) == 0:
            invalid = True
        py: list[Any] = [v.item() if isinstance(v, np.generic) else v for v in vals]
        n = 0
        if not invalid:
            assert dev is not None
            ints = all(isinstance(v, int) for v in py)
            want = dtype or ("int64" if ints and "int64" in b.capabilities.dtypes_on(dev) else
                             "int32" if ints else "float32")
            if all(isinstance(v, (int, Fraction)) for v in py):
                n = max(0, math.ceil(Fraction(py[1] - py[0]) / Fraction(py[2])))
            else:
                n = max(0, math.ceil((float(py[1]) - float(py[0])) / float(py[2])))
            integral = all(isinstance(v, int) or (isinstance(v, Fraction) and v.denominator == 1)
                           or (isinstance(v, float) and v.is_integer()) for v in py)
            if want.startswith(("int", "uint")) and not integral:
                invalid = True
            elif n:
                last = py[0] + (n - 1) * py[2]
                if want.startswith(("int", "uint")):
                    info = np.iinfo(want)
                    invalid = min(py[0], last) < info.min or max(py[0], last) > info.max
                else:
                    fmax = 3.3895313892515355e38 if want == "bfloat16" else float(np.finfo(want).max)
                    invalid = max(abs(float(py[0])), abs(float(last))) > fmax
        if invalid:
            outcome(desc, lambda: md.arange(start, stop, step, dtype=dtype, device=device, backend=name),
                    must_fail=True)
            return
        if n > 4096:
            outcome(desc, lambda: None)  # too long to build here; the sizes path is checked by shapes
            return

        def check(y: Any) -> None:
            assert dev is not None
            if all(isinstance(v, int) for v in py):
                ref = np.array([py[0] + i * py[2] for i in range(n)], dtype=np.float64)
            else:
                ref = float(py[0]) + float(py[2]) * np.arange(n, dtype=np.float64)
            check_tensor(y, dev, want, (n,))
            got = host(y).astype(np.float64)
            scale = float(np.max(np.abs(ref))) if n else 1.0
            tol = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-6}.get(want, 0.0) * max(scale, 1.0)
            if want.startswith(("int", "uint")):
                tol = 0.0 if scale < 2 ** 53 else scale * 2e-16
            if not np.allclose(got, ref, rtol=0, atol=tol + 1e-12):
                raise AssertionError(f"values {got[:5]} != {ref[:5]}")

        outcome(desc, lambda: md.arange(start, stop, step, dtype=dtype, device=device, backend=name), check,
                allowed=(md.CapabilityError, md.InvalidArgumentError))

    host_objs = st.one_of(
        st.lists(st.integers(-5, 5), max_size=4), st.lists(st.floats(-1e3, 1e3), max_size=4),
        st.lists(st.lists(st.integers(0, 3), min_size=2, max_size=2), max_size=3), st.booleans(),
        st.integers(-(2 ** 70), 2 ** 70), st.floats(), st.complex_numbers(max_magnitude=10),
        st.sampled_from([[[1, 2], [3]], [1, "a"], [None], [object()], "str", b"bytes", None, {"a": 1}, {1, 2},
                         [[1], [[2]]], [], [[]], (1, 2.5), [True, 2], [1 + 2j, 3], np.array(["a", "b"]),
                         np.array([1, None], dtype=object), np.array(["2020-01-01"], dtype="M8[D]"),
                         np.arange(6, dtype=">f4"), np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],
                         np.arange(5)[::-1], np.float16(2), np.ones((2, 0)), np.zeros((), np.uint64),
                         np.array([1, 2], dtype=np.dtype([("a", "i4")])), np.ones(3, dtype="c16"),
                         np.arange(4, dtype=np.int16), range(3), iter([1, 2]), np.longdouble(1.0)]))

    @settings(100)
    @seeded
    @given(obj=host_objs, dtype=st.one_of(st.none(), st.sampled_from(list(DTYPES)), st.sampled_from(BAD_DTYPES[:6])),
           device=st_devices(b))
    def asarrays(obj: Any, dtype: Any, device: Any) -> None:
        desc = f"{name} asarray({obj!r:.60}, dtype={dtype!r}, device={device!r:.40})"
        dev = resolve(device)
        want = expected_dtype(dtype) if dtype is not None else None
        try:
            ref = np.asarray(obj)
            ok_ref = ref.dtype.kind in "biufc" and ref.dtype.name in DTYPES and not isinstance(obj, (str, bytes))
        except (ValueError, TypeError):
            ok_ref = False
        if ok_ref and not isinstance(obj, np.ndarray) and ref.size:
            # Python numbers must fit the dtype exactly (or the framework's default when none is asked)
            target = want if want is not None else None
            if target is not None and any(fill_expectation(v, target) is None for v in ref.ravel().tolist()):
                ok_ref = False
        if dev is None or (dtype is not None and want is None) or not ok_ref:
            outcome(desc, lambda: md.asarray(obj, dtype=dtype, device=device, backend=name), must_fail=True)
            return

        def check(y: Any) -> None:
            assert dev is not None
            got = md.dtype_of(y)
            if want is not None and got != want:
                raise AssertionError(f"dtype {got}, asked for {want}")
            if want is None and isinstance(obj, np.ndarray) and got != ref.dtype.name:
                raise AssertionError(f"dtype {got}, the NumPy array's is {ref.dtype}")
            mx_default = name == "mxnet" and got == "float32"  # the adapter's documented default for Python data
            if want is None and np.dtype(got).kind != ref.dtype.kind and not mx_default and not (
                    ref.dtype.kind in "iu" and np.dtype(got).kind in "iu"):
                raise AssertionError(f"dtype {got} is not of the kind of {ref.dtype}")
            check_tensor(y, dev, got, tuple(ref.shape))
            h = host(y)
            if isinstance(obj, np.ndarray) or want is None:
                expect = ref.astype(h.dtype)  # NumPy arrays are cast as astype casts; inference may round
            else:
                expect = np.array([fill_expectation(v, got) for v in ref.ravel().tolist()],
                                  dtype=h.dtype).reshape(ref.shape) if ref.size else ref.astype(h.dtype)
            same_values(h, expect, got if got not in ("float16", "bfloat16") else "bfloat16")

        outcome(desc, lambda: md.asarray(obj, dtype=dtype, device=device, backend=name), check,
                allowed=(md.CapabilityError, md.InvalidArgumentError, md.OutOfMemoryError))

    non_tensors = [None, 1, 2.5, True, "x", b"x", [1, 2], (md.ones(2, backend=name),), {"a": 1}, object(), range(3),
                   md.Device("cpu", 0), np.dtype("f4"), type, Fraction(1, 2), 1j]

    @settings(60)
    @seeded
    @given(obj=st.sampled_from(non_tensors), call=st.sampled_from(
        ["device_of", "dtype_of", "to", "to_nb", "copy", "to_numpy", "convert", "allreduce", "broadcast",
         "scatter", "to_host", "synchronize", "reduce"]), device=st_devices(b))
    def non_tensor(obj: Any, call: str, device: Any) -> None:
        calls = {
            "device_of": lambda: md.device_of(obj), "dtype_of": lambda: md.dtype_of(obj),
            "to": lambda: md.to(obj, device), "to_nb": lambda: md.to(obj, device, non_blocking=True).wait(),
            "copy": lambda: md.copy(obj), "to_numpy": lambda: md.to_numpy(obj),
            "convert": lambda: md.convert(obj, name), "allreduce": lambda: md.allreduce(obj),
            "broadcast": lambda: md.broadcast(obj, [device]), "scatter": lambda: md.scatter(obj, [device]),
            "to_host": lambda: md.to_host(obj), "synchronize": lambda: md.synchronize(obj),
            "reduce": lambda: md.reduce([obj], device),
        }
        desc = f"{name} {call}(non-tensor {obj!r:.50}, device={device!r:.30})"
        if call == "synchronize" and (obj is None or isinstance(obj, md.Device)):
            outcome(desc, calls[call])  # a device is a fine target
            return
        if isinstance(obj, tuple) and call in ("to_host", "allreduce", "device_of", "to", "to_nb", "copy", "convert",
                                                "synchronize"):
            outcome(desc, calls[call])  # a tuple of one tensor is a fine list, and a structure of tensors
            return
        outcome(desc, calls[call], must_fail=True)

    @settings(60)
    @seeded
    @given(call=st.sampled_from(["to", "to_nb", "copy", "convert", "synchronize", "device_scope", "try_gpu",
                                 "devices"]),
           device=st_devices(b), index=st.one_of(st.integers(-2, 3), st.sampled_from(["a", None, 1.5, True, 10 ** 40])))
    def placement(call: str, device: Any, index: Any) -> None:
        x = md.ones((2,), device=devices[-1], backend=name)
        dev = resolve(device) if device is not None else None
        desc = f"{name} {call}(tensor on {devices[-1]}, device={device!r:.40}, index={index!r:.30})"

        def on(d: md.Device) -> Callable[[Any], None]:
            def check(y: Any) -> None:
                if md.device_of(y) != d:
                    raise AssertionError(f"on {md.device_of(y)}, asked for {d}")
                same_values(host(y), np.ones(2, np.float32), "float32")
            return check

        if call == "try_gpu":
            ok = isinstance(index, int) and not isinstance(index, bool)
            outcome(desc, lambda: md.try_gpu(index, backend=name), must_fail=not ok)
        elif call == "devices":
            outcome(desc, lambda: md.devices(backend=name, kind=device),
                    must_fail=(device is not None and not isinstance(device, str)) or device in BAD_DEVICES[:1])
        elif dev is None or device is None:
            fns = {"to": lambda: md.to(x, device), "to_nb": lambda: md.to(x, device, non_blocking=True).wait(),
                   "copy": lambda: md.copy(x, device), "convert": lambda: md.convert(x, name, device=device),
                   "synchronize": lambda: md.synchronize(device, backend=name),
                   "device_scope": lambda: md.device_scope(device, backend=name).__enter__()}
            if device is None and call in ("copy", "convert", "synchronize"):
                outcome(desc, fns[call])  # None: x's own device / every device
            elif device is None:
                outcome(desc, fns[call], must_fail=call in ("to", "to_nb", "device_scope"))
            else:  # a device the backend does not have (or cannot parse): refused, device_scope too
                outcome(desc, fns[call], must_fail=True)
        else:
            fns = {"to": lambda: md.to(x, device), "to_nb": lambda: md.to(x, device, non_blocking=True).wait(),
                   "copy": lambda: md.copy(x, device), "convert": lambda: md.convert(x, name, device=device)}
            if call in fns:
                if call == "convert" and dev != devices[-1] and not (dev.kind == devices[-1].kind == "cpu"):
                    outcome(desc, fns[call], must_fail=True)
                else:
                    outcome(desc, fns[call], on(dev), allowed=(md.CapabilityError,) if call == "convert"
                            else (md.MultidevError,))
            elif call == "synchronize":
                outcome(desc, lambda: md.synchronize(device, backend=name))
            else:
                with md.device_scope(device, backend=name):
                    outcome(desc, lambda: md.ones(2), on(dev))

    run_given("placement", placement)
    run_given("creation", creation)
    run_given("arange", ranges)
    run_given("asarray", asarrays)
    run_given("non-tensors", non_tensor)


# == views ===========================================================================================
def _views(name: str) -> list[tuple[str, Callable[[], Any], bool]]:
    """``(label, builder, read_only_source)`` for layouts of ``name``'s tensors a framework may not
    take: reversed, strided, offset (unaligned), broadcast, read-only, transposed, 0-d, empty,
    byte-swapped, framework-specific views (conjugate, expanded, inference, sliced, variables)."""
    out: list[tuple[str, Callable[[], Any], bool]] = []
    base = np.arange(24, dtype=np.float32)
    if name == "numpy":
        def ro() -> Any:
            a = np.arange(6, dtype=np.float32)
            a.flags.writeable = False
            return a

        def misaligned() -> Any:
            raw = np.zeros(4 * 6 + 3, dtype=np.uint8)
            v = raw[3:3 + 24].view(np.float32)
            v[...] = np.arange(6)
            return v

        out += [("reversed", lambda: base[::-1], False), ("strided", lambda: base[::3], False),
                ("offset 1 (unaligned)", lambda: base[1:], False), ("offset 3 bytes", misaligned, False),
                ("broadcast (zero strides)", lambda: np.broadcast_to(np.float32(2), (3, 4)), True),
                ("read-only", ro, True), ("transposed", lambda: base.reshape(4, 6).T, False),
                ("fortran", lambda: np.asfortranarray(base.reshape(4, 6)), False),
                ("0-d", lambda: np.array(3.5, dtype=np.float32), False), ("empty", lambda: base[:0], False),
                ("empty 2-d", lambda: np.zeros((0, 3), np.float32), False),
                ("big-endian", lambda: np.arange(6, dtype=">f4"), False),
                ("reversed 2-d", lambda: base.reshape(4, 6)[::-1, ::-2], False),
                ("bool reversed", lambda: (base > 5)[::-1], False), ("float16 offset", lambda: base.astype("f2")[1:], False),
                ("int8", lambda: np.arange(-4, 4, dtype=np.int8), False),
                ("uint64 max", lambda: np.array([2 ** 64 - 1, 0], dtype=np.uint64), False),
                ("complex64 strided", lambda: (base + 1j * base).astype("c8")[::2], False),
                ("virtual cpu:1", lambda: md.asarray(base, device="cpu:1"), False),
                ("scalar", lambda: np.float32(1.5), False)]
    elif name == "torch":
        import torch

        t = torch.arange(24, dtype=torch.float32)

        def inference() -> Any:
            with torch.inference_mode():
                return torch.arange(6, dtype=torch.float32)

        out += [("strided", lambda: t[::3], False), ("offset 1", lambda: t[1:], False),
                ("transposed", lambda: t.reshape(4, 6).t(), False), ("expanded", lambda: torch.ones(1).expand(5), False),
                ("conjugate view", lambda: torch.tensor([1 + 2j, 3 - 1j]).conj(), False),
                ("negative view", lambda: torch._neg_view(torch.arange(3.0)), False),
                ("requires_grad", lambda: torch.ones(3, requires_grad=True), False),
                ("inference", inference, False), ("0-d", lambda: torch.tensor(2.5), False),
                ("empty", lambda: torch.zeros(0, 3), False), ("bfloat16", lambda: t.to(torch.bfloat16)[1:], False),
                ("bool", lambda: (t > 3)[::2], False), ("permuted 3-d", lambda: t.reshape(2, 3, 4).permute(2, 0, 1), False),
                ("channels_last", lambda: torch.ones(1, 2, 2, 3).to(memory_format=torch.channels_last), False),
                ("sparse", lambda: torch.eye(3).to_sparse(), False), ("meta", lambda: torch.empty(3, device="meta"), False),
                ("uint8 offset", lambda: torch.arange(10, dtype=torch.uint8)[3:], False)]
    elif name == "jax":
        import jax
        import jax.numpy as jnp

        devs = jax.devices("cpu")
        out += [("array", lambda: jnp.arange(6, dtype=jnp.float32), True),
                ("sliced", lambda: jnp.arange(24, dtype=jnp.float32)[1::3], True),
                ("bfloat16", lambda: jnp.arange(6, dtype=jnp.bfloat16), True),
                ("0-d", lambda: jnp.float32(2.0) + 0, True), ("empty", lambda: jnp.zeros((0, 3)), True),
                ("on cpu:1", lambda: jax.device_put(jnp.arange(4.0), devs[min(1, len(devs) - 1)]), True),
                ("bool", lambda: jnp.arange(4) > 1, True)]
        if len(devs) > 1:
            from jax.sharding import Mesh, NamedSharding, PartitionSpec

            mesh = Mesh(np.array(devs[:2]), ("d",))
            out.append(("sharded over 2 devices",
                        lambda: jax.device_put(jnp.arange(8.0), NamedSharding(mesh, PartitionSpec("d"))), True))
    elif name == "tensorflow":
        import tensorflow as tf

        out += [("tensor", lambda: tf.range(6, dtype=tf.float32), True),
                ("sliced", lambda: tf.range(24, dtype=tf.float32)[1::3], True),
                ("variable", lambda: tf.Variable(tf.ones(3)), False), ("bfloat16", lambda: tf.ones(4, tf.bfloat16), True),
                ("0-d", lambda: tf.constant(2.0), True), ("empty", lambda: tf.zeros((0, 3)), True),
                ("string", lambda: tf.constant(["a", "b"]), True), ("ragged", lambda: tf.ragged.constant([[1], [2, 3]]), True),
                ("sparse", lambda: tf.sparse.eye(3), True), ("bool", lambda: tf.constant([True, False]), True),
                ("uint64", lambda: tf.constant([2 ** 64 - 1], tf.uint64), True)]
    elif name == "mxnet":
        import mxnet as mx

        out += [("nd", lambda: mx.nd.arange(6), False), ("np", lambda: mx.np.arange(6), False),
                ("nd slice", lambda: mx.nd.arange(24).reshape((4, 6))[1:3], False),
                ("nd on cpu:1", lambda: mx.nd.ones((3,), ctx=mx.cpu(1)), False),
                ("bool np", lambda: mx.np.array([True, False]), False), ("0-d np", lambda: mx.np.array(2.0), False),
                ("empty np", lambda: mx.np.zeros((0, 3)), False), ("float16 nd", lambda: mx.nd.ones((3,), dtype="float16"), False)]
    return out


def group_views(name: str) -> None:
    targets = md.backends()
    for label, build, read_only in _views(name):
        log(f"build {name} {label}")
        try:
            x = build()
        except Exception as e:  # noqa: BLE001 - a view this framework version cannot make: not ours
            print(f"NOTE cannot build {name} {label}: {type(e).__name__}: {e}", flush=True)
            continue
        try:
            ref = np.array(_reference(name, x))
        except Exception:  # noqa: BLE001 - no NumPy view of it: only typed errors are checked then
            ref = None
        desc0 = f"{name} [{label}]"
        try:
            _view_cases(desc0, x, ref, read_only, targets)
        except Bad as e:
            finding(str(e))


def _reference(name: str, x: Any) -> Any:
    """The values of ``x`` through its framework's own host copy (no multidev involved)."""
    if name == "torch":
        return x.detach().resolve_conj().resolve_neg().cpu().to_dense().numpy() if x.layout != __import__(
            "torch").strided else x.detach().resolve_conj().resolve_neg().cpu().numpy()
    if name == "jax":
        return np.asarray(x)
    if name == "tensorflow":
        return x.numpy()
    if name == "mxnet":
        return x.asnumpy()
    return np.asarray(x)


def _view_cases(desc0: str, x: Any, ref: np.ndarray | None, read_only: bool, targets: list[str]) -> None:
    def values(expect: np.ndarray | None) -> Callable[[Any], None]:
        def check(y: Any) -> None:
            if expect is None:
                return
            try:
                h = host(y)
            except md.MultidevError:
                return  # a layout multidev refuses to read back (sparse): typed, so fine
            if expect.dtype.kind not in "biufc" or h.dtype.kind not in "biufc":
                if not np.array_equal(h, expect):
                    raise AssertionError(f"values {h.ravel()[:4]} != {expect.ravel()[:4]}")
                return
            same_values(h.astype(np.complex128) if h.dtype.kind == "c" else h.astype(np.float64),
                        expect.astype(np.complex128) if expect.dtype.kind == "c" else expect.astype(np.float64),
                        "float32" if expect.dtype.kind == "f" and expect.dtype.itemsize <= 2 else "float64")
        return check

    before = None if ref is None else ref.copy()
    outcome(f"{desc0} device_of", lambda: md.device_of(x))
    outcome(f"{desc0} dtype_of", lambda: md.dtype_of(x))
    outcome(f"{desc0} to_numpy", lambda: md.to_numpy(x), values(ref))
    outcome(f"{desc0} copy", lambda: md.copy(x), values(ref))
    outcome(f"{desc0} allreduce", lambda: md.allreduce([x])[0], values(ref))
    outcome(f"{desc0} asarray(numpy)", lambda: md.asarray(np.asarray(md.to_numpy(x)), backend=targets[0]), values(ref))
    converted: list[tuple[str, Any, Any]] = []
    for dst in targets:
        db = md.backend(dst)
        y = outcome(f"{desc0} convert -> {dst}", lambda dst=dst: md.convert(x, dst), values(ref))
        if y is None:
            continue
        if isinstance(y, md.ShardedTensor):
            # a sharded source keeps its layout: the target's managed pieces (docs/mesh.md), each
            # one of its native tensors: read every element of every piece
            outcome(f"{desc0} convert -> {dst}, then combine each piece",
                    lambda y=y, db=db: [md.to_numpy(db.combine("sum", p, p)) for p in md.shards_of(y)])
        else:
            # arithmetic that reads every element (TF aborted here on an unaligned buffer)
            outcome(f"{desc0} convert -> {dst}, then combine", lambda y=y, db=db: md.to_numpy(db.combine("sum", y, y)))
        outcome(f"{desc0} convert -> {dst}, then to_numpy", lambda y=y: md.to_numpy(y), values(ref))
        outcome(f"{desc0} convert -> {dst} (copy=True)", lambda dst=dst: md.convert(x, dst, copy=True), values(ref))
        converted.append((dst, db, y))
    # Writes through the results last: a result that aliases an immutable source (DLPack between JAX
    # and a mutable framework) writes into it, and a later target's value check would read the 7s
    # (a flaky finding in CI's MXNet lane: JAX -> tensorflow read [7 7 7 ...] after JAX -> mxnet).
    for dst, db, y in converted:
        if read_only and ref is not None and db.capabilities.mutable and md.dtype_of(y) not in ("bool",):
            # a read-only source must never be written through the converted tensor
            def write(y: Any = y, db: Any = db) -> None:
                db.assign(y, db.full(tuple(db.shape_of(y)), 7, md.dtype_of(y), md.device_of(y)))

            try:
                write()
            except Exception:  # noqa: BLE001 - refusing the write is one right answer
                pass
            after = np.array(_reference_any(x))
            if before is not None and not np.array_equal(after, before, equal_nan=True):
                if _is_numpy_read_only(x):
                    raise Bad(f"{desc0} convert -> {dst}: writing the result changed the read-only source")
                print(f"NOTE {desc0} convert -> {dst}: the result aliases the (immutable) source writable, "
                      "as DLPack between these frameworks does", flush=True)
                break


def _reference_any(x: Any) -> Any:
    """The values in ``x``'s buffer now. For JAX through a fresh device copy: ``np.asarray`` of a
    JAX array caches a host copy when it had to make one (a buffer not aligned for a zero-copy
    view), and a cached copy would hide a write through an aliasing view (a flaky finding in CI)."""
    for name in ("torch", "jax", "tensorflow", "mxnet"):
        if name in sys.modules and isinstance(x, md.backend(name).tensor_types()) and md.backend_of(x).name == name:
            if name == "jax":
                return np.asarray(sys.modules["jax"].numpy.array(x, copy=True))
            return _reference(name, x)
    return np.asarray(x)


def _is_numpy_read_only(x: Any) -> bool:
    return isinstance(x, np.ndarray) and not x.flags.writeable


# == collectives =====================================================================================
def group_collectives(name: str) -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    b = md.backend(name)
    devices = b.devices()
    dtypes = sorted(set(b.capabilities.dtypes) & {"bool", "int8", "int32", "int64", "uint8", "float16", "bfloat16",
                                                   "float32", "float64", "complex64"})
    algorithms = ["auto", "naive", "ring", "tree"] + (["native"] if b.collectives is not None else [])
    ops = ["sum", "mean", "max", "min", "prod"]
    faults = ["none", "none", "none", "shape", "dtype", "duplicate device", "non-tensor", "empty", "op", "algorithm",
              "other backend", "not a list", "read-only"]

    def build(vals: np.ndarray, dtype: str, dev: md.Device) -> Any:
        return md.asarray(vals.astype(np.float64).astype(_np(dtype)) if dtype != "bfloat16" else vals.astype(np.float32),
                          dtype=dtype, device=dev, backend=name)

    def snapshot(xs: list[Any]) -> list[bytes]:
        out = []
        for x in xs:
            try:
                out.append(np.array(md.to_numpy(x)).tobytes())
            except md.MultidevError:
                out.append(b"?")
        return out

    @settings(120)
    @seeded
    @given(n=st.integers(1, len(devices)), shape=st.lists(st.integers(0, 3), max_size=3).map(tuple),
           dtype=st.sampled_from(dtypes), op=st.sampled_from(ops), algorithm=st.sampled_from(algorithms),
           inplace=st.booleans(), fault=st.sampled_from(faults), data=st.data())
    def allreduce(n: int, shape: tuple[int, ...], dtype: str, op: str, algorithm: str, inplace: bool, fault: str,
                  data: Any) -> None:
        devs = list(devices[:n])
        raw = [np.asarray(data.draw(st.lists(st.integers(-3, 3), min_size=math.prod(shape), max_size=math.prod(shape))),
                          dtype=np.float64).reshape(shape) for _ in devs]
        if dtype in ("uint8",):
            raw = [np.abs(r) for r in raw]
        if dtype == "bool":
            raw = [r > 0 for r in raw]
        xs: Any = [build(r, dtype, d) for r, d in zip(raw, devs)]
        the_op = op
        alg = algorithm
        if fault == "shape":
            odd = build(np.zeros(shape + (2,)), dtype, devs[-1])
            if n > 1:
                xs[-1] = odd
            else:
                xs.append(odd)
        elif fault == "dtype":
            odd = build(raw[-1], "float32" if dtype != "float32" else "int32", devs[-1])
            if n > 1:
                xs[-1] = odd
            else:
                xs.append(odd)
        elif fault == "duplicate device":
            xs.append(build(raw[0], dtype, devs[0]))
        elif fault == "non-tensor":
            xs.append([1, 2])
        elif fault == "empty":
            xs = []
        elif fault == "op":
            the_op = data.draw(st.sampled_from(["add", "", None, "SUM", 3, "avg"]))
        elif fault == "algorithm":
            alg = data.draw(st.sampled_from(["fast", None, "", 1]))
        elif fault == "other backend":
            others = [o for o in md.backends() if o != name]
            if others:
                xs.append(md.ones(shape, backend=others[0]))
        elif fault == "not a list":
            xs = xs[0]
        elif fault == "read-only" and name == "numpy":
            xs[-1] = xs[-1].copy()
            xs[-1].setflags(write=False)
        desc = (f"{name} allreduce(n={n}, shape={shape}, {dtype}, op={the_op!r}, algorithm={alg!r}, inplace={inplace}, "
                f"fault={fault})")
        before = snapshot(xs) if isinstance(xs, list) else None
        invalid = (fault not in ("none", "read-only") or (fault == "read-only" and name == "numpy" and inplace)
                   or (op == "mean" and dtype in ("bool", "int8", "int32", "int64", "uint8"))
                   or (dtype == "bool" and op in ("sum", "prod")) or (dtype.startswith("complex") and op in ("max", "min"))
                   or (inplace and not b.capabilities.mutable))
        if fault == "other backend" and not [o for o in md.backends() if o != name]:
            invalid = fault not in ("other backend",) and invalid
        stack = np.stack([r.astype(np.float64) for r in raw]) if raw else None

        def check(ys: Any) -> None:
            assert stack is not None
            ref = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}[op](stack, axis=0)
            if dtype == "bool":
                ref = {"max": np.any, "min": np.all}[op](stack, axis=0)
            elif dtype.startswith(("int", "uint")):
                ref = ref.astype(_np(dtype))  # wraps as the framework's integer arithmetic does
            if len(ys) != n:
                raise AssertionError(f"{len(ys)} results for {n} inputs")
            for y, d in zip(ys, devs):
                if md.device_of(y) != d or md.dtype_of(y) != dtype:
                    raise AssertionError(f"result on {md.device_of(y)} as {md.dtype_of(y)}, expected {d} {dtype}")
                same_values(host(y).astype(np.float64) if dtype != "bool" else host(y),
                            ref.astype(np.float64) if dtype != "bool" else ref,
                            dtype if dtype not in ("int8", "uint8") else "int64")

        if invalid:
            outcome(desc, lambda: md.allreduce(xs, op=the_op, algorithm=alg, inplace=inplace), must_fail=True)
            if before is not None and snapshot(xs) != before:
                raise Bad(f"{desc}: a failed call changed its inputs")
        else:
            outcome(desc, lambda: md.allreduce(xs, op=the_op, algorithm=alg, inplace=inplace), check,
                    allowed=(md.CapabilityError,))
            if not inplace and snapshot(xs) != before:
                raise Bad(f"{desc}: an out-of-place allreduce changed its inputs")

    @settings(80)
    @seeded
    @given(call=st.sampled_from(["broadcast", "reduce", "allgather", "gather", "reduce_scatter", "scatter",
                                 "split_batch"]),
           n=st.integers(1, len(devices)), rows=st.lists(st.integers(0, 4), min_size=len(devices), max_size=len(devices)),
           cols=st.integers(0, 3), axis=st.one_of(st.integers(-3, 2), st.sampled_from([1.0, None, "0", True])),
           dtype=st.sampled_from([d for d in dtypes if d != "bool"]), target=st_devices(b))
    def others(call: str, n: int, rows: list[int], cols: int, axis: Any, dtype: str, target: Any) -> None:
        devs = list(devices[:n])
        pieces = [np.arange(r * cols, dtype=np.float64).reshape(r, cols) + 10 * i for i, r in enumerate(rows[:n])]
        xs = [build(p, dtype, d) for p, d in zip(pieces, devs)]
        desc = f"{name} {call}(n={n}, rows={rows[:n]}, cols={cols}, axis={axis!r}, {dtype}, target={target!r:.30})"
        ax_ok = isinstance(axis, int) and not isinstance(axis, bool) and -2 <= axis < 2
        ax = axis % 2 if ax_ok else 0
        try:
            tdev = md.device(target) if target is not None else md.Device("cpu", 0)  # None: the default device
        except md.MultidevError:
            tdev = None
        tdev_ok = tdev is not None and tdev in devices
        full = np.concatenate(pieces, axis=0) if pieces else None
        exact = "float64" if dtype not in ("float16", "bfloat16") else "bfloat16"

        def vals(expect: np.ndarray, dev: md.Device) -> Callable[[Any], None]:
            def check(y: Any) -> None:
                if md.device_of(y) != dev or md.dtype_of(y) != dtype:
                    raise AssertionError(f"on {md.device_of(y)} as {md.dtype_of(y)}, expected {dev} {dtype}")
                same_values(host(y).astype(np.float64), expect, exact)
            return check

        if call == "broadcast":
            x = xs[0]
            ok = tdev_ok
            fn = lambda: md.broadcast(x, [target])
            if ok:
                assert tdev is not None
                outcome(desc, fn, lambda ys: vals(pieces[0], tdev)(ys[0]))
            else:
                outcome(desc, fn, must_fail=True)
        elif call == "reduce":
            same = len(set(rows[:n])) == 1
            fn = lambda: md.reduce(xs, target)
            if same and tdev_ok:
                assert tdev is not None
                outcome(desc, fn, vals(np.sum(np.stack(pieces), axis=0), tdev))
            else:
                outcome(desc, fn, must_fail=True)
        elif call in ("allgather", "gather"):
            fn = (lambda: md.allgather(xs, axis=axis)) if call == "allgather" else (lambda: md.gather(xs, target, axis=axis))
            ok = ax_ok and (ax == 0 or len(set(rows[:n])) == 1) and (call == "allgather" or tdev_ok)
            if not ok:
                outcome(desc, fn, must_fail=True)
                return
            ref = np.concatenate(pieces, axis=ax)
            if call == "allgather":
                outcome(desc, fn, lambda ys: [vals(ref, d)(y) for y, d in zip(ys, devs)])
            else:
                assert tdev is not None
                outcome(desc, fn, vals(ref, tdev))
        elif call == "reduce_scatter":
            fn = lambda: md.reduce_scatter(xs, axis=axis)
            same = len(set(rows[:n])) == 1
            if not (same and ax_ok):
                outcome(desc, fn, must_fail=True)
                return
            ref = np.array_split(np.sum(np.stack(pieces), axis=0), n, axis=ax)
            outcome(desc, fn, lambda ys: [vals(r, d)(y) for y, r, d in zip(ys, ref, devs)])
        elif call == "scatter":
            x = build(full, dtype, devs[0]) if full is not None else None
            fn = lambda: md.scatter(x, devs, axis=axis)
            if not ax_ok:
                outcome(desc, fn, must_fail=True)
                return
            assert full is not None
            ref = np.array_split(full, n, axis=ax)
            outcome(desc, fn, lambda ys: [vals(r, d)(y) for y, r, d in zip(ys, ref, devs)])
        else:
            assert full is not None
            X = build(full, dtype, devs[0])
            y_lab = build(np.arange(full.shape[0], dtype=np.float64), dtype, devs[0])
            fn = lambda: md.split_batch(X, y_lab, devs)
            if full.shape[0] < n:
                outcome(desc, fn, must_fail=True)
                return
            ref = np.array_split(full, n)
            outcome(desc, fn, lambda res: [vals(r, d)(y) for y, r, d in zip(res[0], ref, devs)])

    run_given("allreduce", allreduce)
    run_given("other collectives", others)


def _np(dtype: str) -> Any:
    return md.dtypes.numpy_dtype(dtype) if dtype != "bfloat16" else np.float32


# == leaks ===========================================================================================
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


#: RSS growth per call that counts as a leak (the TF native allreduce leaked ~1,300 B a call).
LEAK_BYTES_PER_CALL = 256
#: Calls per measured window (two windows after a warm-up; the smaller growth counts, so a one-off
#: allocator step in one window is not a leak, while a steady leak shows in both).
WINDOW = int(os.environ.get("MULTIDEV_ADVERSARIAL_LEAK_WINDOW", "2500"))


def group_leaks(name: str) -> None:
    b = md.backend(name)
    devs = b.devices()
    d0, d1 = devs[0], devs[min(1, len(devs) - 1)]
    x = md.ones((64,), device=d0, backend=name)
    xs = [md.ones((64,), device=d, backend=name) for d in devs[:2]]
    h = np.ones(64, np.float32)
    loops: dict[str, Callable[[], Any]] = {
        "to (no-op)": lambda: md.to(x, d0),
        "to (another device)": lambda: md.to(x, d1),
        "copy": lambda: md.copy(x),
        "to_numpy": lambda: md.to_numpy(x),
        "asarray": lambda: md.asarray(h, device=d0, backend=name),
        "zeros": lambda: md.zeros(64, device=d0, backend=name),
        "allreduce (auto)": lambda: md.allreduce(xs),
        "convert to numpy": lambda: md.convert(x, "numpy"),
        "non-blocking to": lambda: md.to(x, d1, non_blocking=True).wait(),
        "typed error path": lambda: _swallow(lambda: md.zeros((-1,), backend=name)),
    }
    if b.collectives is not None and len(xs) > 1:
        loops["allreduce (native)"] = lambda: md.allreduce(xs, algorithm="native")
        # Large buffers, no waiting: MXNet's per-call KVStore was freed with its reduction still
        # queued (SIGFPE/SIGSEGV within a few thousand calls). Must end, and give the right sum.
        big = [md.ones((300_000,), device=d, backend=name) for d in devs[:2]]
        log(f"{name} native allreduce loop, 300k floats")
        ys: Any = None
        for _ in range(int(os.environ.get("MULTIDEV_ADVERSARIAL_CRASH_LOOP", "3000"))):
            ys = md.allreduce(big, algorithm="native")
        md.synchronize()
        if not np.all(host(ys[-1]) == 2.0):
            finding(f"{name} native allreduce loop: wrong sum {host(ys[-1])[:4]}")
        COUNTS["cases"] += 1
    for label, fn in loops.items():
        log(f"{name} leak loop {label}")
        try:
            for i in range(300):
                fn()
                if i % 10 == 0:
                    md.synchronize()
            md.synchronize()
            growth = []
            for _ in range(2):
                r0 = _rss()
                for i in range(WINDOW):
                    fn()
                    if i % 10 == 0:
                        md.synchronize()  # bounds an asynchronous engine's queue (not a leak)
                md.synchronize()
                growth.append((_rss() - r0) / WINDOW)
        except Exception as e:  # noqa: BLE001
            finding(f"{name} leak loop {label}: {type(e).__name__}: {e}")
            continue
        per_call = min(growth)
        print(f"LEAK {name} {label}: {growth[0]:.0f} / {growth[1]:.0f} B per call", flush=True)
        if per_call > LEAK_BYTES_PER_CALL:
            finding(f"{name} {label}: RSS grows {per_call:.0f} B per call over 2 x {WINDOW} calls "
                    f"(bound {LEAK_BYTES_PER_CALL})")
        COUNTS["cases"] += 1


def _swallow(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except md.MultidevError:
        pass


GROUPS = {"inputs": group_inputs, "views": group_views, "collectives": group_collectives, "leaks": group_leaks}


def main(group: str, backend: str) -> int:
    import warnings

    warnings.simplefilter("ignore")
    md.backend(backend)
    GROUPS[group](backend)
    print("DONE " + json.dumps({"findings": len(FINDINGS), **COUNTS}), flush=True)
    return 1 if FINDINGS else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
