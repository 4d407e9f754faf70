"""multidev's own sharding of the optimizer's state over one process's devices (Keras, Gluon:
``multidev.managed_sharding.ManagedDeviceShardedReplica``): the same losses and weights as one
device, each piece's state on its device, the user's optimizer followed, refusals before anything
moves. Each case runs in a fresh process (the frameworks' CPU devices are set before they start)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest


def _py(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(MULTIDEV_TF_CPU_DEVICES="4", MULTIDEV_MXNET_CPU_DEVICES="4", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    return r.stdout.strip()


def _need(*modules: str) -> None:
    for m in modules:
        if importlib.util.find_spec(m) is None:
            pytest.skip(f"{m} is not installed")


def test_keras_optimizer_state_cut_over_one_process_devices_matches_one_device() -> None:
    _need("tensorflow", "keras")
    out = _py("""
        import numpy as np, multidev as md
        md.devices(backend="tensorflow")  # its 4 logical CPU devices, before Keras starts TensorFlow
        import keras, tensorflow as tf
        from multidev.managed_sharding import ManagedDeviceShardedReplica

        def make():
            keras.utils.set_random_seed(0)
            return keras.Sequential([keras.Input((6,)), keras.layers.Dense(10, activation="tanh"),
                                     keras.layers.Dense(3)])

        def opt():
            return keras.optimizers.AdamW(learning_rate=keras.optimizers.schedules.CosineDecay(1e-2, 6),
                                          weight_decay=0.1)

        def loss_fn(m, b):
            return tf.reduce_mean((m(b[0]) - b[1]) ** 2)

        rng = np.random.default_rng(0)
        batches = [(rng.normal(size=(8, 6)).astype(np.float32), rng.normal(size=(8, 3)).astype(np.float32))
                   for _ in range(5)]
        mesh = md.make_mesh((2, 2), ("data", "model"), backend="tensorflow")
        ref, ro = make(), opt()
        net, o = make(), opt()
        dp = md.data_parallel(net, o, mesh=mesh, data_axis="data")
        rep = dp.replica
        assert isinstance(rep, ManagedDeviceShardedReplica), type(rep)
        assert rep.holders == mesh.devices[:2], rep.holders  # cpu:0 and cpu:1, along "model"
        for x, y in batches:
            with tf.GradientTape() as t:
                want = loss_fn(ref, (x, y))
            ro.apply_gradients(zip(t.gradient(want, ref.trainable_variables), ref.trainable_variables))
            got = dp.step((tf.constant(x), tf.constant(y)), loss_fn)
            assert abs(float(got) - float(want)) < 1e-5, (float(got), float(want))
        err = max(float(np.abs(a - b).max()) for a, b in zip(ref.get_weights(), net.get_weights()))
        assert err < 1e-5, err
        assert int(o.iterations.numpy()) == 5  # the user's optimizer counts the steps
        # each holder's optimizer holds its pieces and their moments on its own device
        shapes = [[tuple(v.shape) for v in p.variables] for p in rep._pieces]
        assert shapes == [[(3, 10), (5,), (5, 3), (3,)], [(3, 10), (5,), (5, 3)]], shapes
        for k, p in enumerate(rep._pieces):
            want_dev = f"CPU:{k}"
            for v in [*p.variables, *[w for w in p.optimizer.variables if len(w.shape)]]:
                assert v.value.device.endswith(want_dev), (k, v.path, v.value.device)
        # the copies on the other devices follow the model
        for c in rep.plain._copies:
            assert all(np.array_equal(np.asarray(a.value), np.asarray(b.value))
                       for a, b in zip(c.trainable_variables, net.trainable_variables))
        # a learning rate set between steps is the pieces' at the next step: 0 leaves the weights
        plain, po = make(), keras.optimizers.Adam(1e-2)
        dl = md.data_parallel(plain, po, mesh=mesh)
        dl.step((tf.constant(batches[0][0]), tf.constant(batches[0][1])), loss_fn)
        po.learning_rate = 0.0
        before = plain.get_weights()
        dl.step((tf.constant(batches[1][0]), tf.constant(batches[1][1])), loss_fn)
        assert all(np.array_equal(a, b) for a, b in zip(before, plain.get_weights()))
        assert int(po.iterations.numpy()) == 2
        # refused before anything moves: optimizers whose update is not element by element
        for bad in (lambda: keras.optimizers.Lamb(1e-2), lambda: keras.optimizers.Adam(1e-2, clipnorm=1.0)):
            other = make()
            w = other.get_weights()
            try:
                md.data_parallel(other, bad(), mesh=mesh)
            except md.CapabilityError as e:
                assert "data_parallel(param_axis=...)" in str(e), e
            else:
                raise AssertionError("not refused")
            assert all(np.array_equal(a, b) for a, b in zip(w, other.get_weights()))
        # a schedule's Python state is read at each step, not when the step was traced (0: the weights stay)
        @keras.saving.register_keras_serializable(package="test")
        class Box(keras.optimizers.schedules.LearningRateSchedule):
            def __init__(self, v=1e-2):
                self.v = v

            def __call__(self, step):
                return self.v

            def get_config(self):
                return {"v": self.v}

        box = Box()
        cl = make()
        dc = md.data_parallel(cl, keras.optimizers.SGD(box), mesh=mesh)
        dc.step((tf.constant(batches[0][0]), tf.constant(batches[0][1])), loss_fn)
        box.v = 0.0
        before = cl.get_weights()
        dc.step((tf.constant(batches[1][0]), tf.constant(batches[1][1])), loss_fn)
        assert all(np.array_equal(a, b) for a, b in zip(before, cl.get_weights()))
        # no_sync accumulates: the next step takes the sum of both batches' gradients
        ra, rao, na, nao = make(), keras.optimizers.Adam(1e-2), make(), keras.optimizers.Adam(1e-2)
        da = md.data_parallel(na, nao, mesh=mesh)
        gs = None
        for x, y in batches[:2]:
            with tf.GradientTape() as t:
                l = loss_fn(ra, (x, y))
            g = t.gradient(l, ra.trainable_variables)
            gs = g if gs is None else [a + b for a, b in zip(gs, g)]
        rao.apply_gradients(zip(gs, ra.trainable_variables))
        with da.no_sync():
            da.step((tf.constant(batches[0][0]), tf.constant(batches[0][1])), loss_fn)
        da.step((tf.constant(batches[1][0]), tf.constant(batches[1][1])), loss_fn)
        err = max(float(np.abs(a - b).max()) for a, b in zip(ra.get_weights(), na.get_weights()))
        assert err < 1e-5 and int(nao.iterations.numpy()) == 1, (err, int(nao.iterations.numpy()))
        # a parameter without a gradient is named before any piece steps
        lonely = make()
        lo = keras.optimizers.Adam(1e-2)
        dq = md.data_parallel(lonely, lo, mesh=mesh)
        w = lonely.get_weights()
        try:
            dq.step((tf.constant(batches[0][0]), tf.constant(batches[0][1])),
                    lambda m, b: tf.reduce_mean(m.layers[0](b[0])))
        except md.InvalidArgumentError as e:
            assert "received no gradient" in str(e), e
        else:
            raise AssertionError("not refused")
        assert all(np.array_equal(a, b) for a, b in zip(w, lonely.get_weights())) and int(lo.iterations) == 0
        try:
            dq.replica.optimizer_state()
        except md.CapabilityError:
            pass
        else:
            raise AssertionError("a whole optimizer state was read")
        print("ok")
    """)
    assert out.endswith("ok")


def test_keras_float64_and_an_unregistered_schedule_match_one_device() -> None:
    """The pieces' learning rate has the user's dtype (float64 here: no float32 rounding), and a
    schedule Keras cannot rebuild from its configuration (not registered) still shards."""
    _need("tensorflow", "keras")
    out = _py("""
        import numpy as np, multidev as md
        md.devices(backend="tensorflow")
        import keras, tensorflow as tf
        keras.config.set_floatx("float64")

        class Halving(keras.optimizers.schedules.LearningRateSchedule):  # (not registered with Keras)
            def __call__(self, step):
                return 0.0123 / (1.0 + tf.cast(step, "float64"))

            def get_config(self):
                return {}

        def make():
            keras.utils.set_random_seed(0)
            return keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="tanh"),
                                     keras.layers.Dense(2)])

        def loss_fn(m, b):
            return tf.reduce_mean((m(b[0]) - b[1]) ** 2)

        rng = np.random.default_rng(1)
        batches = [(rng.normal(size=(8, 6)), rng.normal(size=(8, 2))) for _ in range(4)]
        mesh = md.make_mesh((2, 2), ("data", "model"), backend="tensorflow")
        for opt in (lambda: keras.optimizers.Adam(0.0123), lambda: keras.optimizers.SGD(Halving(), momentum=0.5)):
            ref, ro, net = make(), opt(), make()
            dp = md.data_parallel(net, opt(), mesh=mesh, data_axis="data")
            for x, y in batches:
                with tf.GradientTape() as t:
                    want = loss_fn(ref, (x, y))
                ro.apply_gradients(zip(t.gradient(want, ref.trainable_variables), ref.trainable_variables))
                dp.step((tf.constant(x), tf.constant(y)), loss_fn)
            err = max(float(np.abs(a - b).max()) for a, b in zip(ref.get_weights(), net.get_weights()))
            assert err < 1e-13, err  # (a float32 learning rate is off by about 1e-10 here)
        print("ok")
    """)
    assert out.endswith("ok")


def test_mxnet_gluon_trainer_state_cut_over_one_process_devices_matches_one_device() -> None:
    _need("mxnet")
    out = _py("""
        import numpy as np, multidev as md
        md.backend("mxnet")  # the adapter first: it prepares MXNet's import on NumPy 1.26
        import mxnet as mx
        from mxnet import autograd, gluon
        from multidev.managed_sharding import ManagedDeviceShardedReplica

        def make():  # a whole bias (3 rows) before cut parameters, one of them with an lr_mult of its own
            mx.random.seed(0)
            net = gluon.nn.Sequential()
            net.add(gluon.nn.Dense(3, in_units=6, activation="tanh"), gluon.nn.Dense(4, in_units=3))
            net.initialize(mx.init.Xavier())
            net[1].weight.lr_mult = 0.5
            return net

        def trainer(net, kind="adam"):
            return gluon.Trainer(net.collect_params(), kind, {"learning_rate": 1e-2, "wd": 0.01})

        def loss_fn(m, b):
            return ((m(b[0]) - b[1]) ** 2).mean()

        def weights(net):
            return [p.data().asnumpy() for p in net.collect_params().values()]

        rng = np.random.default_rng(0)
        batches = [(rng.normal(size=(8, 6)).astype(np.float32), rng.normal(size=(8, 4)).astype(np.float32))
                   for _ in range(4)]
        mesh = md.make_mesh((2, 2), ("data", "model"), backend="mxnet")
        ref, net = make(), make()
        rt, t = trainer(ref), trainer(net)
        dp = md.data_parallel(net, t, mesh=mesh, data_axis="data")
        rep = dp.replica
        assert isinstance(rep, ManagedDeviceShardedReplica), type(rep)
        for x, y in batches:
            with autograd.record():
                want = loss_fn(ref, (mx.nd.array(x), mx.nd.array(y)))
            want.backward()
            rt.step(1)
            got = dp.step((mx.nd.array(x), mx.nd.array(y)), loss_fn)
            assert abs(float(got.asnumpy().sum()) - float(want.asscalar())) < 1e-5
        err = max(float(np.abs(a - b).max()) for a, b in zip(weights(ref), weights(net)))
        assert err < 1e-5, err
        assert t._optimizer.num_update == 4, t._optimizer.num_update
        ctxs = [[p.list_ctx() for p in pieces.params] for pieces in rep._pieces]
        assert ctxs == [[[mx.cpu(0)]] * 4, [[mx.cpu(1)]] * 3], ctxs
        assert [p.lr_mult for p in rep._pieces[1].params] == [1.0, 0.5, 1.0]  # each piece its parameter's
        t.set_learning_rate(0.0)  # followed at the next step: nothing moves
        before = weights(net)
        dp.step((mx.nd.array(batches[0][0]), mx.nd.array(batches[0][1])), loss_fn)
        assert all(np.array_equal(a, b) for a, b in zip(before, weights(net)))
        def refused(model, opt, error, text):
            try:
                md.data_parallel(model, opt, mesh=mesh)
            except error as e:
                assert text in str(e), e
            else:
                raise AssertionError("not refused")

        # no optimizer: refused before the block moves onto the other contexts
        lone = make()
        refused(lone, None, md.InvalidArgumentError, "needs the optimizer")
        assert all(p.list_ctx() == [mx.cpu(0)] for p in lone.collect_params().values())
        other = make()
        ot = trainer(other, "lamb")
        refused(other, ot, md.CapabilityError, "data_parallel(param_axis=...)")
        # the refusal came before the replica moved the block or the Trainer onto the other contexts
        assert all(p.list_ctx() == [mx.cpu(0)] for p in other.collect_params().values())
        assert ot._contexts == [mx.cpu(0)], ot._contexts
        md.data_parallel(other, trainer(other), mesh=mesh)  # (and a fresh Trainer then shards)
        # BatchNorm's running statistics: the first device's on every device after each step
        bn = gluon.nn.Sequential()
        bn.add(gluon.nn.Dense(4, in_units=6), gluon.nn.BatchNorm(in_channels=4))
        bn.initialize(mx.init.Xavier())
        dbn = md.data_parallel(bn, trainer(bn), mesh=mesh, verify=True)
        for x, y in batches[:2]:
            dbn.step((mx.nd.array(x), mx.nd.array(y)), loss_fn)  # (verify: every device's copy alike)
        print("ok")
    """)
    assert out.endswith("ok")
