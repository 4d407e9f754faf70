"""Real programs' first lines on every installed framework (one child interpreter per backend, 2
virtual CPU devices each): models and the framework's own trees through ``md.to``/``copy``/
``device_of``/``synchronize``/``to_host``, framework code inside ``md.device_scope``, native device
objects, MXNet's numpy mode, and the warnings and hints a user meets (virtual devices configured
too late, 64-bit dtypes on JAX). The D2L programs themselves are in tests/test_book.py."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workers import installed, run_worker

#: Per framework: the checks, as functions decorated with ``check`` (see tests/_workers.py).
FRAMEWORK = {
    "torch": """
        import copy, threading, torch
        D0 = md.Device("cpu", 0)

        def net():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))

        @check
        def a_resident_module_is_itself():
            n = net()
            ps = list(n.parameters())
            assert md.to(n, "cpu:0") is n and md.to(n, D0) is n
            assert list(n.parameters())[0] is ps[0], "the Parameters are the same objects"
            assert md.device_of(n) == D0
            md.synchronize(n)

        @check
        def a_copied_module_is_independent():
            n = net()
            c = md.copy(n)
            assert c is not n and type(c) is type(n) and md.device_of(c) == D0
            with torch.no_grad():
                c[0].weight.add_(1.0)
            assert not torch.equal(c[0].weight, n[0].weight)

        @check
        def containers_of_modules_and_tensors():
            n, x = net(), torch.ones(2)
            out = md.to({"model": n, "batch": [x]}, "cpu:0")
            assert out["model"] is n and out["batch"][0] is x

        @check
        def to_host_and_convert_refuse_a_model_saying_what_to_pass():
            for call in (lambda: md.to_host(net()), lambda: md.convert(net(), "numpy")):
                try:
                    call()
                except md.UnsupportedTensorError as e:
                    assert "a torch model" in str(e) and "parameters" in str(e), e
                else:
                    raise AssertionError("a model was taken as tensors")

        @check
        def native_device_and_scope():
            assert md.native_device("cpu:0", "torch") == torch.device("cpu")
            assert torch.ones(2, device=md.native_device(md.try_gpu(), "torch")).device.type in ("cpu", "cuda")
            with md.device_scope("cpu:0", backend="torch"):
                assert torch.ones(2).device == torch.device("cpu")
    """,
    "jax": """
        import dataclasses, threading, jax, jax.numpy as jnp
        D0, D1 = md.Device("cpu", 0), md.Device("cpu", 1)

        @jax.tree_util.register_dataclass
        @dataclasses.dataclass
        class Linear:                                   # flax.struct / equinox style: a registered node
            w: jax.Array
            b: jax.Array
            act: object = dataclasses.field(default=jnp.tanh, metadata=dict(static=True))

        @jax.tree_util.register_pytree_node_class
        class MLP:
            def __init__(self, layers, act):
                self.layers, self.act = layers, act
            def tree_flatten(self):
                return (self.layers, self.act), None      # act: a function leaf, kept as it is
            @classmethod
            def tree_unflatten(cls, aux, children):
                return cls(*children)
            def __call__(self, x):
                for l in self.layers:
                    x = self.act(x @ l.w + l.b)
                return x

        def model():
            w = jnp.ones((3, 4))
            return MLP([Linear(w, jnp.zeros(4)), Linear(jnp.ones((4, 2)), jnp.zeros(2))], jax.nn.relu)

        @check
        def a_registered_tree_moves_whole_and_keeps_its_static_parts():
            m = model()
            assert md.device_of(m) == D0
            m1 = md.to(m, "cpu:1")
            assert type(m1) is MLP and type(m1.layers[0]) is Linear and m1.act is jax.nn.relu
            assert md.device_of(m1) == D1 and md.device_of(m) == D0
            assert md.to(m1, "cpu:1").layers[0].w is m1.layers[0].w, "resident leaves are the same objects"
            assert np.allclose(host(m1(md.to(jnp.ones((1, 3)), "cpu:1"))), host(m(jnp.ones((1, 3)))))

        @check
        def tied_leaves_stay_one_array():
            w = jnp.ones(3)
            t = md.to({"a": w, "b": [w]}, "cpu:1")
            assert t["a"] is t["b"][0]

        @check
        def copy_to_host_and_convert_of_a_tree():
            m = model()
            c = md.copy(m)
            assert c.layers[0].w is not m.layers[0].w and md.device_of(c) == D0
            h = md.to_host(m)
            assert type(h) is MLP and type(h.layers[0].w) is np.ndarray
            n = md.convert(m, "numpy")
            assert type(n) is MLP and md.backend_of(n.layers[1].b).name == "numpy"
            md.synchronize(m)

        @check
        def device_scope_sets_jax_default_device_nested_and_per_thread():
            with md.device_scope("cpu:1", backend="jax"):
                assert md.device_of(jnp.ones(2)) == D1
                with md.device_scope("cpu:0", backend="jax"):
                    assert md.device_of(jnp.ones(2)) == D0
                assert md.device_of(jnp.ones(2)) == D1
                seen = []
                t = threading.Thread(target=lambda: seen.append(md.device_of(jnp.ones(2))))
                t.start(); t.join()
                assert seen == [D0], f"another thread saw {seen}: jax.default_device is per thread"
            assert md.device_of(jnp.ones(2)) == D0
            assert md.native_device("cpu:1", "jax") == jax.devices("cpu")[1]

        @check
        def int64_labels_hint_int32():
            if jax.config.jax_enable_x64:
                return
            try:
                md.asarray(np.arange(4), backend="jax")
            except md.CapabilityError as e:
                assert "dtype='int32'" in str(e) and "jax_enable_x64" in str(e), e
            else:
                raise AssertionError("int64 without x64 was not refused")
            assert md.dtype_of(md.asarray(np.arange(4), dtype="int32", backend="jax")) == "int32"
    """,
    "tensorflow": """
        import threading, tensorflow as tf, keras
        D0, D1 = md.Device("cpu", 0), md.Device("cpu", 1)

        def model():
            return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])

        @check
        def a_resident_model_is_itself_and_a_move_is_refused_saying_how():
            m = model()
            assert md.device_of(m) == D0 and md.to(m, "cpu:0") is m
            md.synchronize(m)
            try:
                md.to(m, "cpu:1")
            except md.CapabilityError as e:
                assert "device_scope" in str(e) and "md.copy" in str(e), e
            else:
                raise AssertionError("TensorFlow variables cannot move; the call must say so")

        @check
        def a_copy_is_a_clone_with_the_same_weights_on_the_target():
            m = model()
            c = md.copy(m, "cpu:1")
            assert c is not m and md.device_of(c) == D1
            x = np.ones((2, 3), np.float32)
            assert np.allclose(np.asarray(c(x)), np.asarray(m(x)))
            c.layers[0].kernel.assign(c.layers[0].kernel + 1.0)
            assert not np.allclose(np.asarray(c(x)), np.asarray(m(x))), "the weights are copied, not shared"

        @check
        def a_model_built_in_a_scope_lives_there_nested_and_per_thread():
            with md.device_scope("cpu:1", backend="tensorflow"):
                m = model()
                assert md.device_of(tf.ones(2)) == D1
                with md.device_scope("cpu:0", backend="tensorflow"):
                    assert md.device_of(tf.ones(2)) == D0
                seen = []
                t = threading.Thread(target=lambda: seen.append(md.device_of(tf.ones(2))))
                t.start(); t.join()
                assert seen == [D0], f"another thread saw {seen}: tf.device is per thread"
            assert md.device_of(m) == D1
            with tf.device(md.native_device("cpu:1", "tensorflow")):
                assert md.device_of(tf.ones(2)) == D1

        @check
        def a_tf_module_is_a_model_too():
            class M(tf.Module):
                def __init__(self):
                    self.v = tf.Variable(tf.ones(3))
            m = M()
            assert md.device_of(m) == D0 and md.to(m, "cpu:0") is m
            try:
                md.copy(m, "cpu:1")
            except md.CapabilityError as e:
                assert "no way to copy" in str(e), e
            else:
                raise AssertionError("a plain tf.Module cannot be copied; the call must say so")
    """,
    "mxnet": """
        import threading, mxnet as mx
        from mxnet import npx
        D0, D1 = md.Device("cpu", 0), md.Device("cpu", 1)

        def block():
            b = mx.gluon.nn.HybridSequential()
            b.add(mx.gluon.nn.Dense(4, in_units=3), mx.gluon.nn.Dense(2, in_units=4))
            b.initialize(ctx=mx.cpu(0))
            return b

        @check
        def a_block_moves_in_place():
            b = block()
            w = b[0].weight
            x = mx.nd.ones((1, 3))
            before = b(x).asnumpy()
            assert md.to(b, "cpu:0") is b and md.device_of(b) == D0
            assert md.to(b, "cpu:1") is b and md.device_of(b) == D1 and b[0].weight is w
            assert np.allclose(b(x.as_in_context(mx.cpu(1))).asnumpy(), before)
            md.synchronize(b)

        @check
        def a_copied_block_is_independent():
            b = block()
            c = md.copy(b, "cpu:1")
            assert c is not b and md.device_of(c) == D1 and md.device_of(b) == D0

        @check
        def device_scope_sets_the_default_context():
            with md.device_scope("cpu:1", backend="mxnet"):
                assert md.device_of(mx.nd.ones(2)) == D1
                with md.device_scope("cpu:0", backend="mxnet"):
                    assert md.device_of(mx.nd.ones(2)) == D0
                assert md.device_of(mx.nd.ones(2)) == D1
            assert md.native_device("cpu:1", "mxnet") == mx.cpu(1)

        @check
        def numpy_mode_gives_mx_np_arrays_and_takes_both_kinds():
            npx.set_np()
            try:
                for y in (md.zeros(2, backend="mxnet"), md.asarray([1.0, 2.0], backend="mxnet"),
                          md.rand(2, backend="mxnet"), md.arange(3, backend="mxnet"),
                          md.convert(np.ones(2, np.float32), "mxnet"), md.full(2, 3, backend="mxnet")):
                    assert isinstance(y, mx.np.ndarray), type(y)
                a = md.ones(2, device="cpu:0", backend="mxnet")
                assert float((a @ mx.np.ones(2)).item()) == 2.0  # mx.np operations work on them
                legacy = mx.nd.ones(2, ctx=mx.cpu(1))
                out = md.allreduce([a, legacy.as_np_ndarray()])
                assert np.allclose(host(out[1]), 2.0)
                assert np.allclose(host(md.to(legacy, "cpu:0")), 1.0)  # a legacy NDArray is taken too
            finally:
                npx.reset_np()
            assert isinstance(md.zeros(2, backend="mxnet"), mx.nd.NDArray)
    """,
}

_CACHE: dict[str, dict[str, str]] = {}
CASES = [(n, c.strip().split("(")[0].split()[-1]) for n in FRAMEWORK if n in installed()
         for c in textwrap.dedent(FRAMEWORK[n]).split("@check\n")[1:]]


def _results(name: str) -> dict[str, str]:
    if name not in _CACHE:
        _CACHE[name] = run_worker(textwrap.dedent(FRAMEWORK[name]), name)
    return _CACHE[name]


@pytest.mark.parametrize(("name", "check"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_framework(name: str, check: str) -> None:
    outcome = _results(name).get(check)
    assert outcome == "OK", outcome


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env))


@pytest.mark.parametrize("fw", [f for f in ("jax", "tensorflow") if f in installed()])
def test_virtual_devices_asked_too_late_warn_once_naming_the_variable_and_the_fix(fw: Any) -> None:
    """A program that started its framework before multidev could configure its CPU devices gets one
    RuntimeWarning naming the variable, the count it got and the fix, never a silent single device."""
    var = {"jax": "MULTIDEV_JAX_CPU_DEVICES", "tensorflow": "MULTIDEV_TF_CPU_DEVICES"}[fw]
    start = {"jax": "import jax.numpy as jnp; jnp.ones(1)", "tensorflow": "import tensorflow as tf; tf.ones(1)"}[fw]
    p = _run(f"""
        import os, warnings
        {start}
        os.environ["{var}"] = "4"
        import multidev as md
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            n = len(md.devices(backend="{fw}"))
            md.devices(backend="{fw}")
        msgs = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
        print(n, len(msgs))
        print(msgs[0] if msgs else "")
    """)
    assert p.returncode == 0, p.stderr[-3000:]
    first, msg = p.stdout.strip().splitlines()[-2:]
    assert first == "1 1", p.stdout
    assert f"${var}=4" in msg and "has 1" in msg and "before the program first uses" in msg, msg


@pytest.mark.parametrize("fw", [f for f in ("jax", "tensorflow") if f in installed()])
def test_an_explicit_request_that_cannot_be_honoured_raises(fw: Any) -> None:
    p = _run(f"""
        import multidev as md
        from multidev.registry import get_backend
        md.devices(backend="{fw}")  # the framework starts with its devices
        cls = type(get_backend("{fw}"))
        try:
            cls.configure_devices(7, strict=True)
        except md.CapabilityError as e:
            print("refused:", e)
        print("lenient:", cls.configure_devices(7))
    """, MULTIDEV_JAX_CPU_DEVICES="2", MULTIDEV_TF_CPU_DEVICES="2")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "refused:" in p.stdout and "cannot be given any more" in p.stdout and "lenient: False" in p.stdout, p.stdout
