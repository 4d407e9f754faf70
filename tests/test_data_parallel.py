"""``md.data_parallel`` in one process: torch on its one CPU device (and its several-device path,
driven here on two copies of the CPU device), JAX over 4 virtual CPU devices (a child
interpreter: device counts are fixed when JAX starts), the checkpoint, accumulation and argument
rules. Across processes: tests/test_data_parallel_processes.py."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import multidev as md

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _net(seed: int = 0, bn: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), *([torch.nn.BatchNorm1d(8)] if bn else []), torch.nn.ReLU(),
                               torch.nn.Linear(8, 3))


def _batch(step: int, n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _loss(m: torch.nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(m(b[0]), b[1])


def _plain_steps(net: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for k in range(steps):
        opt.zero_grad()
        _loss(net, _batch(k)).backward()
        opt.step()


def test_one_device_is_the_framework_own_step() -> None:
    """Without a group and on one device the step is the plain loop's: bitwise the same parameters,
    with momentum, weight decay and an LR schedule."""
    a, b = _net(), _net()
    oa = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    ob = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    sa = torch.optim.lr_scheduler.StepLR(oa, 1, 0.5)
    sb = torch.optim.lr_scheduler.StepLR(ob, 1, 0.5)
    dp = md.data_parallel(a, oa, verify=True)
    assert dp.world_size == 1 and dp.sync is None and dp.devices == [md.device("cpu:0")]
    for k in range(3):
        loss = dp.step(_batch(k), _loss)
        sa.step()
        ob.zero_grad()
        ref = _loss(b, _batch(k))
        ref.backward()
        ob.step()
        sb.step()
        assert torch.equal(loss, ref.detach())
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_checkpoint_of_the_wrapped_model_loads_into_the_plain_model(tmp_path: object) -> None:
    net = _net(bn=True)
    dp = md.data_parallel(net, torch.optim.Adam(net.parameters(), lr=1e-2))
    dp.step(_batch(0), _loss)
    sd = dp.model.state_dict()
    assert dp.model is net and all(not k.startswith(("module.", "model.")) for k in sd)
    plain = _net(seed=5, bn=True)
    plain.load_state_dict(sd, strict=True)  # no prefix to strip
    for k, v in plain.state_dict().items():
        assert torch.equal(v, sd[k]), k
    assert torch.equal(dp(_batch(1)[0]), net(_batch(1)[0]))  # the wrapper calls the model


def test_no_sync_accumulates_and_the_next_step_applies_the_sum() -> None:
    """Two half-loss micro-batches (the first inside no_sync) make one step with the whole batch's
    gradient, as one step on the 24 rows would."""
    a, b = _net(), _net()
    oa, ob = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    dp = md.data_parallel(a, oa)
    before = [p.detach().clone() for p in a.parameters()]
    with dp.no_sync():
        dp.step(_batch(0), lambda m, x: _loss(m, x) / 2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), before))  # no optimizer step inside
    assert all(p.grad is not None for p in a.parameters())  # but the gradients are there
    dp.step(_batch(1), lambda m, x: _loss(m, x) / 2)
    both = tuple(torch.cat(z) for z in zip(_batch(0), _batch(1)))
    _loss(b, both).backward()
    ob.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)
    assert all(p.grad is None for p in a.parameters())  # the step cleared them


def test_drop_gradients_forgets_a_refused_step_on_one_device_and_on_several() -> None:
    """A step the other ranks refused after its backward pass (dp.step's exchange completes before
    the first bucket): Replica.drop_gradients clears what it accumulated, on the first device and the
    copies, so the next step is the one a fresh model takes."""
    from multidev.data_parallel import DataParallel

    b = md.backend("torch")
    cpu = md.device("cpu:0")
    for devices in ([cpu], [cpu, cpu]):  # several devices: the replica over two copies of the CPU device
        dps, nets = [], []
        for _ in range(2):
            net = _net()
            rep = b.parallel.data_parallel_replica(net, torch.optim.SGD(net.parameters(), lr=0.1), devices)
            dps.append(DataParallel(rep, None, bucket_mb=25, grad_dtype=None, buffers="broadcast", unused="error",
                                    verify=False))
            nets.append(net)
        fresh, used = dps
        used.replica.backward(_batch(1), _loss, None)
        assert any(p.grad is not None for p in nets[1].parameters())
        used.replica.drop_gradients()
        assert all(p.grad is None for p in nets[1].parameters())
        assert all(p.grad is None for c in getattr(used.replica, "_copies", []) for p in c.parameters())
        fresh.step(_batch(2, n=13), _loss)
        used.step(_batch(2, n=13), _loss)
        assert all(torch.equal(p, q) for p, q in zip(nets[0].parameters(), nets[1].parameters())), devices


def test_the_several_device_path_matches_one_device() -> None:
    """torch's one-process mode over several devices needs GPUs; its replica is driven here over two
    copies of the CPU device: the batch split by rows, the copies' gradients weighted and added into
    the first, the optimizer's step, the parameters and buffers copied back (bitwise equal copies),
    the same parameters as one device on the whole batch."""
    from multidev.data_parallel import DataParallel

    b = md.backend("torch")
    cpu = md.device("cpu:0")
    a, ref = _net(bn=False), _net(bn=False)
    oa = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    oref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    rep = b.parallel.data_parallel_replica(a, oa, [cpu, cpu])
    dp = DataParallel(rep, None, bucket_mb=25, grad_dtype=None, buffers="broadcast", unused="error", verify=True)
    for k in range(3):
        batch = _batch(k, n=13)  # uneven: 7 + 6 rows, weighted by rows
        loss = dp.step(batch, _loss)
        oref.zero_grad()
        want = _loss(ref, batch)
        want.backward()
        oref.step()
        torch.testing.assert_close(loss, want.detach(), rtol=1e-6, atol=1e-7)
    for pa, pr in zip(a.parameters(), ref.parameters()):
        torch.testing.assert_close(pa, pr, rtol=1e-5, atol=1e-6)
    rows = rep.fingerprints()
    assert len(rows) == 2 and rows[0] == rows[1]
    with torch.no_grad():
        next(rep._copies[0].parameters()).add_(1e-3)  # a drifted copy is named
    with pytest.raises(md.ReplicaMismatchError, match=r"0\.weight differs between cpu:0 and cpu:0"):
        dp.verify()


def test_several_torch_cpu_devices_are_refused_with_the_way_out() -> None:
    net = _net()
    with pytest.raises(md.DeviceNotFoundError) as e:
        md.data_parallel(net, torch.optim.SGD(net.parameters(), lr=0.1), devices=["cpu:0", "cpu:1"])
    assert "configure more" not in str(e.value) and "multidev.distributed" in str(e.value), str(e.value)


def test_bad_arguments_are_typed_errors_that_change_nothing() -> None:
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = [p.detach().clone() for p in net.parameters()]
    bad = [{"bucket_mb": 0}, {"bucket_mb": True}, {"grad_dtype": "int8"}, {"buffers": "sync"}, {"unused": "skip"},
           {"verify": "yes"}]
    for kw in bad:
        with pytest.raises(md.InvalidArgumentError):
            md.data_parallel(net, opt, **kw)
    with pytest.raises(md.InvalidArgumentError, match="torch.optim.Optimizer"):
        md.data_parallel(net, object())
    other = _net()
    with pytest.raises(md.InvalidArgumentError, match="not parameters of the model"):
        md.data_parallel(net, torch.optim.SGD(other.parameters(), lr=0.1))
    with pytest.raises(md.InvalidArgumentError, match="takes a model"):
        md.data_parallel("not a model", opt)
    dp = md.data_parallel(net, opt)
    with pytest.raises(md.InvalidArgumentError, match="scalar"):
        dp.step(_batch(0), lambda m, b: m(b[0]))
    with pytest.raises(md.InvalidArgumentError, match="callable"):
        dp.step(_batch(0), None)  # type: ignore[arg-type]
    with pytest.raises(md.InvalidArgumentError, match="needs the optimizer"):
        md.data_parallel(net).step(_batch(0), _loss)
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), before))


def test_broadcast_state_without_a_group_is_a_no_op() -> None:
    net = _net()
    assert md.broadcast_state(net) is net


JAX_DEVICES = textwrap.dedent("""
    import numpy as np, jax, jax.numpy as jnp, optax
    import multidev as md
    from flax.training import train_state
    assert len(jax.devices("cpu")) == 4
    devs = [f"cpu:{i}" for i in range(4)]
    g = np.random.default_rng(0)
    p0 = {"w": jnp.asarray(g.standard_normal((6, 3)).astype(np.float32)), "b": jnp.zeros(3, jnp.float32)}
    def loss(p, b):
        return optax.softmax_cross_entropy_with_integer_labels(b[0] @ p["w"] + p["b"], b[1]).mean()
    def batch(k):
        r = np.random.default_rng(10 + k)
        return jnp.asarray(r.standard_normal((16, 6)).astype(np.float32)), jnp.asarray(r.integers(0, 3, 16))
    tx = lambda: optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(optax.cosine_decay_schedule(0.1, 3), 0.9))
    one, four = md.data_parallel(p0, tx()), md.data_parallel(p0, tx(), devices=devs, verify=True)
    for k in range(3):
        l1, l4 = one.step(batch(k), loss), four.step(batch(k), loss)
        np.testing.assert_allclose(float(l1), float(l4), rtol=1e-5)
    for k in p0:
        np.testing.assert_allclose(np.asarray(one.model[k]), np.asarray(four.model[k]), rtol=1e-5, atol=1e-6)
        assert len(four.model[k].sharding.device_set) == 4  # replicated on the four devices
    rows = four.replica.fingerprints()
    assert len(rows) == 4 and all(r == rows[0] for r in rows)
    st = md.data_parallel(train_state.TrainState.create(apply_fn=None, params=p0, tx=optax.adam(1e-2)), devices=devs)
    st.step(batch(0), loss)
    assert int(st.model.step) == 1 and len(st.model.params["w"].sharding.device_set) == 4
    class Model:  # a loss given as a bound method (a new object at every attribute read)
        traces = 0
        def loss(self, p, b):
            Model.traces += 1  # runs when jit traces, not on a cached call
            return loss(p, b)
    m = Model()
    for k in range(3):
        one.step(batch(k), m.loss)
    assert Model.traces == 1, f"a bound-method loss was traced {Model.traces} times in 3 steps"
    for k in range(20):  # micro-batches without waiting: several CPU all-reduces must not be in flight
        with four.no_sync():
            four.step(batch(k % 3), loss)
    four.step(batch(0), loss)
    try:
        four.step((batch(0)[0][:6], batch(0)[1][:6]), loss)
        raise SystemExit("6 rows over 4 devices were not refused")
    except md.InvalidArgumentError as e:
        assert "multiple of 4" in str(e), e
    # one device that is not JAX's default: host batches (the jitted step copies them there), batches
    # committed to another device (moved), resident ones (a sharding seen before), a non-scalar loss
    cpu = jax.devices("cpu")
    two, ref = md.data_parallel(p0, tx(), devices=["cpu:2"]), md.data_parallel(p0, tx(), devices=["cpu:2"])
    for k in range(3):
        host = tuple(np.asarray(a) for a in batch(k))
        la = two.step(host if k != 1 else jax.device_put(batch(k), cpu[3]), loss)
        lb = ref.step(jax.device_put(batch(k), cpu[2]), loss)
        assert float(la) == float(lb), (k, float(la), float(lb))
        assert all(np.array_equal(two.model[n], ref.model[n]) for n in p0), k
        assert two.model["w"].devices() == {cpu[2]} and la.devices() == {cpu[2]}
    before = {n: np.asarray(v) for n, v in two.model.items()}
    for bad in (host, jax.device_put(batch(0), cpu[2])):
        try:
            two.step(bad, lambda p, b: b[0] @ p["w"])
            raise SystemExit("a non-scalar loss was not refused")
        except md.InvalidArgumentError as e:
            assert "scalar" in str(e) and "(16, 3)" in str(e), e
    assert all(np.array_equal(before[n], two.model[n]) for n in p0)
    # a step the other ranks refused after its backward pass: its gradients are dropped
    fresh, used = md.data_parallel(p0, tx()), md.data_parallel(p0, tx())
    used.replica.backward(batch(1), loss, None)
    used.replica.drop_gradients()
    fresh.step(batch(2), loss), used.step(batch(2), loss)
    assert all(np.array_equal(fresh.model[n], used.model[n]) for n in p0)
    print("OK")
""")


def test_jax_over_four_virtual_devices_matches_one_device() -> None:
    """One process, 4 XLA host devices: the sharded step ends where one device on the same batch
    ends, the parameters replicated bitwise on every device; a TrainState too; uneven rows refused."""
    for mod in ("jax", "optax", "flax"):
        pytest.importorskip(mod)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-c", JAX_DEVICES], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stdout[-2000:] + p.stderr[-3000:]


def test_jax_over_devices_of_two_kinds_is_a_typed_refusal() -> None:
    """A GPU beside cpu:0 (what the suite's "several devices" is on a one-GPU machine): JAX replicates
    over one mesh, whose devices share a kind; refused with CapabilityError before any device is
    touched (it was JAX's raw "DeviceList contains non-IFRT devices" on the H200)."""
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    b = md.backend("jax")
    with pytest.raises(md.CapabilityError, match="one kind"):
        b.parallel.data_parallel_replica({"w": jax.numpy.ones(3)}, optax.sgd(0.1), [md.device("cpu:0"),
                                                                                    md.device("gpu:0")])


def test_replicate_on_torch_cpu_names_the_way_out() -> None:
    with pytest.raises(md.DeviceNotFoundError) as e:
        md.replicate([torch.zeros(2)], ["cpu:0", "cpu:1"])
    assert "configure more" not in str(e.value), str(e.value)


def test_default_replica_helpers_round_trip() -> None:
    """The Replica base class's flatten/unflatten (what an adapter without its own gets)."""
    from multidev.adapter import Replica

    class Plain(Replica):
        def __init__(self) -> None:
            self.backend, self.devices, self.model, self.optimizer = md.backend("numpy"), [md.device("cpu:0")], None, None

        def parameters(self) -> list:
            return [("a", np.ones((2, 3), np.float32)), ("b", np.arange(4, dtype=np.float32))]

        def buffers(self) -> list:
            return []

        def load(self, params: object, buffers: object) -> None:
            pass

        def optimizer_state(self) -> None:
            return None

        def load_optimizer_state(self, state: object) -> None:
            pass

        def backward(self, batch: object, loss_fn: object, ready: object) -> float:
            return 0.0

        def apply(self, grads: object) -> None:
            pass

    r = Plain()
    ts = [t for _, t in r.parameters()]
    flat = r.flatten(ts, None)
    assert flat.shape == (10,)
    back = r.unflatten(flat, ts, 0.5)
    np.testing.assert_array_equal(back[0], ts[0] * 0.5)
    np.testing.assert_array_equal(back[1], ts[1] * 0.5)
    assert r.fingerprints() == r.fingerprints() and len(r.fingerprints()[0]) == 2


TF_DEVICES = textwrap.dedent("""
    import multidev as md
    md.backend("tensorflow")  # its 2 logical CPU devices are made before TensorFlow starts
    import numpy as np, keras, tensorflow as tf
    devs = md.devices(backend="tensorflow")[:2]
    assert len(devs) == 2
    def make():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    def loss_fn(m, b):
        out = m(b[0], training=True)
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(b[1], out, from_logits=True))
    def batch(k):
        g = np.random.default_rng(k)
        return g.standard_normal((13, 6)).astype(np.float32), g.integers(0, 3, 13)
    a, b, c = make(), make(), make()
    sgd = lambda: keras.optimizers.SGD(0.1, momentum=0.9)
    ob = sgd()
    one, two = md.data_parallel(a, sgd()), md.data_parallel(c, sgd(), devices=devs, verify=True)
    for k in range(3):
        l1, l2 = one.step(batch(k), loss_fn), two.step(batch(k), loss_fn)
        with tf.GradientTape() as t:  # the framework's own loop
            lb = loss_fn(b, batch(k))
        ob.apply_gradients(zip(t.gradient(lb, b.trainable_variables), b.trainable_variables))
        assert float(l1) == float(lb)
        np.testing.assert_allclose(float(l2), float(lb), rtol=1e-5)
    for x, y, z in zip(a.weights, b.weights, c.weights):
        assert np.array_equal(np.asarray(x.value), np.asarray(y.value))  # one device: bitwise the plain loop
        np.testing.assert_allclose(np.asarray(z.value), np.asarray(y.value), rtol=1e-5, atol=1e-6)
    rows = two.replica.fingerprints()
    assert len(rows) == 2 and rows[0] == rows[1]
    assert "/device:CPU:1" in two.replica._copies[0].weights[0].value.device
    # a mesh of the two devices with the parameters replicated: plain data parallelism over them
    d = make()
    mesh = md.make_mesh((2,), ("data",), backend="tensorflow")
    three = md.data_parallel(d, sgd(), mesh=mesh, data_axis="data")
    assert three.replica.devices == list(mesh.devices)
    for k in range(3):
        three.step(batch(k), loss_fn)
    for x, z in zip(c.weights, d.weights):
        np.testing.assert_allclose(np.asarray(x.value), np.asarray(z.value), rtol=1e-6, atol=1e-7)
    # a parameter axis: Keras has no sharded training of its own, so multidev cuts the optimizer's
    # state over the two devices (multidev.managed_sharding): the same weights
    g = make()
    four = md.data_parallel(g, sgd(), mesh=md.make_mesh((1, 2), ("data", "model"), backend="tensorflow"))
    assert type(four.replica).__name__ == "ManagedDeviceShardedReplica", type(four.replica)
    for k in range(3):
        four.step(batch(k), loss_fn)
    for x, z in zip(c.weights, g.weights):
        np.testing.assert_allclose(np.asarray(x.value), np.asarray(z.value), rtol=1e-6, atol=1e-7)
    # a step the other ranks refused after its backward pass: its gradients are dropped
    e, f = make(), make()
    fresh, used = md.data_parallel(e, sgd()), md.data_parallel(f, sgd())
    used.replica.backward(batch(1), loss_fn, None)
    used.replica.drop_gradients()
    fresh.step(batch(2), loss_fn), used.step(batch(2), loss_fn)
    assert all(np.array_equal(np.asarray(x.value), np.asarray(y.value)) for x, y in zip(e.weights, f.weights))
    print("OK")
""")


def test_keras_over_two_logical_devices_matches_one_device_and_the_plain_loop() -> None:
    """Keras/TensorFlow: on one device the step is bitwise the framework's own GradientTape loop; over
    2 logical CPU devices (a copy of the model on the second, 13 rows split 7 + 6 and weighted) it
    ends where one device ends, the copies bitwise equal."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("keras")
    env = dict(os.environ, MULTIDEV_TF_CPU_DEVICES="2", TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-c", TF_DEVICES], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stdout[-2000:] + p.stderr[-3000:]


MX_DEVICES = textwrap.dedent("""
    import multidev as md
    md.backend("mxnet")  # the adapter first: it prepares MXNet's import
    import numpy as np, mxnet as mx
    from mxnet import autograd, gluon
    def make():
        mx.random.seed(0)
        net = gluon.nn.Sequential()
        net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
        net.initialize(mx.init.Xavier())
        net(mx.nd.zeros((2, 6)))
        return net
    CE = gluon.loss.SoftmaxCrossEntropyLoss()
    loss_fn = lambda net, b: CE(net(b[0]), b[1]).mean()
    def batch(k):
        g = np.random.default_rng(k)
        return mx.nd.array(g.standard_normal((13, 6)).astype(np.float32)), mx.nd.array(g.integers(0, 3, 13).astype(np.float32))
    sgd = lambda net: gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    a, b, c = make(), make(), make()
    tb = sgd(b)
    one, two = md.data_parallel(a, sgd(a)), md.data_parallel(c, sgd(c), devices=["cpu:0", "cpu:1"], verify=True)
    for k in range(3):
        l1, l2 = one.step(batch(k), loss_fn), two.step(batch(k), loss_fn)
        with autograd.record():  # the framework's own loop
            lb = loss_fn(b, batch(k))
        lb.backward()
        tb.step(1)
        assert l1.asscalar() == lb.asscalar()
        np.testing.assert_allclose(l2.asscalar(), lb.asscalar(), rtol=1e-5)
    for p, q, r in zip(a.collect_params().values(), b.collect_params().values(), c.collect_params().values()):
        assert np.array_equal(p.data().asnumpy(), q.data().asnumpy())  # one device: bitwise the plain loop
        assert r.list_ctx() == [mx.cpu(0), mx.cpu(1)]
        np.testing.assert_allclose(r.data(mx.cpu(1)).asnumpy(), q.data().asnumpy(), rtol=1e-5, atol=1e-6)
    rows = two.replica.fingerprints()
    assert len(rows) == 2 and rows[0] == rows[1]
    # a step the other ranks refused after its backward pass: its gradients are dropped
    e, f = make(), make()
    fresh, used = md.data_parallel(e, sgd(e)), md.data_parallel(f, sgd(f))
    used.replica.backward(batch(1), loss_fn, None)
    used.replica.drop_gradients()
    fresh.step(batch(2), loss_fn), used.step(batch(2), loss_fn)
    for p, q in zip(e.collect_params().values(), f.collect_params().values()):
        assert np.array_equal(p.data().asnumpy(), q.data().asnumpy())
    print("OK")
""")


def test_mxnet_gluon_over_two_contexts_matches_one_context_and_the_plain_loop() -> None:
    """MXNet Gluon: on one context the step is bitwise the framework's own record/backward/Trainer
    loop; over mx.cpu(0) and mx.cpu(1) (the parameters on both, 13 rows split 7 + 6 and weighted,
    the Trainer's kvstore summing) it ends where one context ends, the contexts bitwise equal."""
    if importlib.util.find_spec("mxnet") is None or int(np.__version__.split(".")[0]) >= 2:
        pytest.skip("MXNet 1.9 is installed beside numpy<2 only (the with-MXNet lane)")
    env = dict(os.environ, MULTIDEV_MXNET_CPU_DEVICES="2", PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-c", MX_DEVICES], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stdout[-2000:] + p.stderr[-3000:]


def test_the_jax_step_overhead_benchmark_runs(tmp_path: Path) -> None:
    """benchmarks/baselines/data_parallel_jax_overhead.py gives both rows with their figures (the
    figures themselves are benchmarks/results', not a test's)."""
    for mod in ("jax", "optax"):
        pytest.importorskip(mod)
    out = tmp_path / "rows.json"
    p = subprocess.run([sys.executable, "-m", "multidev.benchmarks.baselines.data_parallel_jax_overhead",
                        "--chunk", "20", "--chunks", "2", "--json", str(out)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["inputs"] for r in rows] == ["host", "resident"]
    assert all(r["native_us_min"] > 0 and r["md_us_min"] > 0 and r["ratio_min"] > 0 for r in rows)
