"""TensorFlow-specific behaviour of the tensorflow adapter that the shared conformance suite cannot
express: tf.Variable assign, TF's silent cross-device copies and device drift, device string forms,
buffer aliasing of tf.identity, and the CollectiveReduceV2 allreduce's dtype rewrites.

Tests that need several logical CPU devices run in a subprocess with MULTIDEV_TF_CPU_DEVICES=3,
because TF fixes its devices when its runtime starts (possibly earlier in this pytest process).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import multidev as md  # noqa: E402
from multidev import Device  # noqa: E402
from multidev.errors import CapabilityError  # noqa: E402


@pytest.fixture(scope="module")
def tb():
    return md.backend("tensorflow")


def _py(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env=full_env)


_SECTIONS: dict[str, str] = {}


def _multi(name: str, code: str) -> None:
    """Register a section of the one subprocess that has three logical CPU devices."""
    _SECTIONS[name] = textwrap.dedent(code)


@pytest.fixture(scope="module")
def multi() -> dict[str, str]:
    """Runs every registered section in one subprocess (TF starts once) and returns name -> "OK" or
    the section's traceback."""
    parts = ["""
import json, traceback
import numpy as np, pytest, multidev as md, tensorflow as tf
from multidev import Device
from multidev.errors import CapabilityError, DeviceMismatchError
b = md.backend("tensorflow")
D0, D1, D2 = Device("cpu", 0), Device("cpu", 1), Device("cpu", 2)
results = {}
"""]
    for name, code in _SECTIONS.items():
        parts.append(f"def _section_{name}():\n" + textwrap.indent(code, "    ") + "\n")
        parts.append(f"try:\n    _section_{name}()\n"
                     f"    results[{name!r}] = 'OK'\nexcept BaseException:\n"
                     f"    results[{name!r}] = traceback.format_exc()\n")
    parts.append("print('RESULTS ' + json.dumps(results))\n")
    r = _py("".join(parts), MULTIDEV_TF_CPU_DEVICES="3")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULTS ")]
    assert r.returncode == 0 and lines, r.stdout + r.stderr
    return json.loads(lines[-1][len("RESULTS "):])


def _addr(t) -> int:
    return np.from_dlpack(t).__array_interface__["data"][0]


# -- module hygiene and device configuration ---------------------------------------------------------
_multi("devices", """
        assert md.devices(backend="tensorflow") == [D0, D1, D2]
        assert [d.name for d in tf.config.list_logical_devices("CPU")] == [
            "/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]
""")


def test_cpu_device_count_from_env_and_kept_once_initialized(multi):
    assert multi["devices"] == "OK", multi["devices"]
    # TF's runtime already started: the adapter keeps its single CPU instead of crashing.
    r = _py("""
        import tensorflow as tf
        tf.constant(1.0)
        import multidev as md
        print(len(md.devices(backend="tensorflow")))
    """, MULTIDEV_TF_CPU_DEVICES="3")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


# -- device string forms -----------------------------------------------------------------------------
def test_device_string_forms(tb):
    cpu0 = Device("cpu", 0)
    assert tb.to_native_device(cpu0) == "/device:CPU:0"
    for native in ("/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0", "CPU:0",
                   tf.DeviceSpec(device_type="CPU", device_index=0),
                   tf.config.list_logical_devices("CPU")[0],
                   tf.config.list_physical_devices("CPU")[0]):
        assert tb.from_native_device(native) == cpu0, native
    assert md.device(tf.config.list_logical_devices("CPU")[0]) == cpu0
    for foreign in ("cuda:1", "/device:XLA_CPU:0", object()):
        assert tb.from_native_device(foreign) is None, foreign
    x = tf.constant([1.0])
    assert x.device.startswith("/job:") and md.device_of(x) == cpu0


# -- mutability: tf.Variable vs tf.Tensor ------------------------------------------------------------
def test_assign_writes_a_variable_and_refuses_a_tensor(tb):
    v = tf.Variable([1.0, 2.0, 3.0])
    tb.assign(v, md.full(3, 7.0, backend="tensorflow"))
    np.testing.assert_array_equal(v.numpy(), [7.0, 7.0, 7.0])
    t = md.ones(3, backend="tensorflow")
    with pytest.raises(CapabilityError, match="tf.Variable"):
        tb.assign(t, md.zeros(3, backend="tensorflow"))
    np.testing.assert_array_equal(t.numpy(), [1.0, 1.0, 1.0])


def test_copy_and_move_keep_the_variable_type(tb):
    v = tf.Variable([1.0, 2.0])
    c = md.copy(v)
    assert isinstance(c, tf.Variable) and c is not v
    c.assign([5.0, 5.0])
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])  # independent
    t = md.copy(md.ones(2, backend="tensorflow"))
    assert not isinstance(t, tf.Variable)


def test_copy_is_a_new_buffer_where_identity_aliases(tb):
    x = md.arange(16, dtype="float32", backend="tensorflow")
    assert _addr(tf.identity(x)) == _addr(x)  # why copy cannot use tf.identity
    y = md.copy(x)
    assert _addr(y) != _addr(x)
    np.testing.assert_array_equal(y.numpy(), x.numpy())


def test_dlpack_refuses_variables_and_strided_sources(tb):
    with pytest.raises(CapabilityError, match="Variable"):
        tb.dlpack.export_dlpack(tf.Variable([1.0]))
    with pytest.raises(CapabilityError, match="contiguous"):
        tb.dlpack.import_dlpack(np.arange(8.0)[::2], md.cpu(0))
    b = tb.dlpack.import_dlpack(tb.dlpack.export_dlpack(md.asarray([True, False], backend="tensorflow")), md.cpu(0))
    assert md.dtype_of(b) == "bool" and b.numpy().tolist() == [True, False]


# -- several logical CPUs (subprocess) ---------------------------------------------------------------
_multi("silent_copies", """
        a = md.ones(3, device=D1, backend="tensorflow")
        c = md.ones(3, device=D2, backend="tensorflow")
        tf.add(a, c)  # TF itself copies across devices without a word
        with tf.device("/device:CPU:1"):
            v = tf.Variable(a)
        for call in (lambda: b.combine("sum", a, c), lambda: b.concat([a, c], 0),
                     lambda: b.assign(v, c)):
            with pytest.raises(DeviceMismatchError, match="cpu:1, cpu:2"):
                call()
""")


def test_adapter_ops_catch_what_tf_copies_silently(multi):
    assert multi["silent_copies"] == "OK", multi["silent_copies"]


_multi("no_drift", """
        a = md.arange(6, dtype="float32", device=D2, backend="tensorflow")
        with tf.device("/device:CPU:2"):
            v = tf.Variable(tf.ones(6))
        # Unscoped eager ops and variable reads drift to CPU:0 ...
        assert md.device_of(tf.reshape(a, (2, 3))) == D0 and md.device_of(v.read_value()) == D0
        # ... the adapter's do not.
        assert md.device_of(b.reshape(a, (2, 3))) == D2
        assert md.device_of(b.combine("max", a, v)) == D2
        assert md.device_of(b.divide(a, 3)) == D2
        assert [md.device_of(p) for p in b.split(a, [2, 4], 0)] == [D2, D2]
        m = md.to(v, D1)
        assert isinstance(m, tf.Variable) and md.device_of(m) == D1
""")


def test_results_stay_on_the_operands_device(multi):
    assert multi["no_drift"] == "OK", multi["no_drift"]


_multi("native_allreduce", """
        def run(dtype, arrays, op):
            xs = [md.asarray(a, dtype=dtype, device=Device("cpu", i), backend="tensorflow")
                  for i, a in enumerate(arrays)]
            out = md.allreduce(xs, op=op, algorithm="native")
            assert [md.device_of(o) for o in out] == [D0, D1, D2]
            assert all(md.dtype_of(o) == dtype for o in out)
            return [o.numpy() for o in out]

        big = np.array([0, 2**63, 2**64 - 1], dtype=np.uint64)
        u = [big, big[::-1].copy(), np.array([1, 2, 3], np.uint64)]
        for got in run("uint64", u, "max"):  # sign-flipped int64 keeps unsigned order
            np.testing.assert_array_equal(got, np.maximum(np.maximum(u[0], u[1]), u[2]))
        for got in run("uint64", u, "sum"):  # wraps modulo 2**64, as NumPy does
            np.testing.assert_array_equal(got, u[0] + u[1] + u[2])
        i8 = [np.array([100, -100], np.int8)] * 3
        for got in run("int8", i8, "sum"):  # widened to int64 and cast back: wraps like int8
            np.testing.assert_array_equal(got, (i8[0].astype(np.int64) * 3).astype(np.int8))
        bl = [np.array([True, False, False]), np.array([False, False, True]), np.array([True, False, True])]
        for got in run("bool", bl, "max"):
            np.testing.assert_array_equal(got, [True, False, True])
        for got in run("bool", bl, "min"):
            np.testing.assert_array_equal(got, [False, False, False])
        c = [np.array([1 + 2j, -1j], np.complex64) * k for k in (1, 2, 3)]
        for got in run("complex64", c, "mean"):  # (real, imag) pairs
            np.testing.assert_allclose(got, (c[0] + c[1] + c[2]) / 3, rtol=1e-6)
        with pytest.raises(CapabilityError, match="prod"):
            run("complex64", c, "prod")
        # Empty tensors (CollectiveReduceV2 would segfault) and inputs that are tf.Variables.
        for got in run("float32", [np.zeros((3, 0), np.float32)] * 3, "sum"):
            assert got.shape == (3, 0)
        vs = []
        for i in range(3):
            with tf.device(f"/device:CPU:{i}"):
                vs.append(tf.Variable([float(i)]))
        out = md.allreduce(vs, algorithm="native")
        assert [o.numpy().tolist() for o in out] == [[3.0]] * 3
        assert [md.device_of(o) for o in out] == [D0, D1, D2]
""")


def test_native_allreduce_dtype_rewrites(multi):
    assert multi["native_allreduce"] == "OK", multi["native_allreduce"]
