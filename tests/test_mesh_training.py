"""Training on a mesh (issue 34, first form): ``md.data_parallel(params, tx, mesh=m, data_axis=...)``
on JAX over a 2x2 mesh of virtual CPU devices, the batch cut along ``data`` and each parameter and
its optimizer state along ``model``, gives one device's losses and parameters (float tolerance);
the core's layout rule and argument checks; frameworks without ``SupportsShardedTraining`` refuse
with a typed error. The JAX cases run in a fresh interpreter with four virtual CPU devices."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import multidev as md
from multidev.sharded_training import param_layout


def _mesh() -> md.Mesh:
    return md.Mesh((2, 2), ("data", "model"), [md.cpu(i) for i in range(4)])


def test_param_layout_cuts_the_first_dimension_that_divides() -> None:
    m = _mesh()
    assert param_layout(m, (8, 16), ("model",)) == md.Layout(m, ("model", None))
    assert param_layout(m, (3, 16), ("model",)) == md.Layout(m, (None, "model"))
    assert param_layout(m, (3,), ("model",)) == md.Layout(m, (None,))  # whole everywhere
    assert param_layout(m, (), ("model",)) == md.Layout(m, ())  # a step count
    assert param_layout(m, (1, 2), ("model",)) == md.Layout(m, (None, "model"))
    assert param_layout(m, (8, 16), ()) == md.Layout(m, (None, None))  # replicated
    assert param_layout(m, (6, 8), ("data", "model")) == md.Layout(m, (None, ("data", "model")))
    # the rule itself, for a process mesh too (axis sizes only): JAX PartitionSpec entries
    from multidev.adapter import param_spec
    sizes = {"data": 2, "model": 2}
    assert param_spec(sizes, (8, 16), ("model",)) == ("model", None)
    assert param_spec(sizes, (3,), ("model",)) == (None,) and param_spec(sizes, (), ("model",)) == ()
    assert param_spec(sizes, (6, 8), ("data", "model")) == (None, ("data", "model"))
    assert param_spec({"data": 1, "model": 1}, (8,), ("data", "model")) == (None,)  # one piece: whole


def test_frameworks_without_sharded_training_refuse_and_change_nothing() -> None:
    m1 = md.make_mesh((1,), ("data",), backend="numpy")
    params = {"w": md.asarray(np.ones((2, 2)), backend="numpy")}
    with pytest.raises(md.CapabilityError, match="SupportsDataParallel|SupportsShardedTraining"):
        md.data_parallel(params, None, mesh=m1)
    if importlib.util.find_spec("torch") is None:
        return
    import torch

    from multidev.managed_sharding import ManagedDeviceShardedReplica

    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2)).sum().backward()
    grad = model.weight.grad.clone()
    mt = md.make_mesh((1, 1), ("data", "model"), backend="torch")
    # FSDP2 has no one-process mode: multidev shards the optimizer's state, element by element only
    with pytest.raises(md.CapabilityError, match="element by element"):
        md.data_parallel(model, torch.optim.LBFGS(model.parameters()), mesh=mt)
    assert torch.equal(model.weight.grad, grad)  # the refusal cleared no gradient
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref = torch.nn.Linear(2, 2)
    ref.load_state_dict(model.state_dict())
    ro = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    dp = md.data_parallel(model, opt, mesh=mt)
    assert isinstance(dp.replica, ManagedDeviceShardedReplica) and model.weight.grad is None
    for i in range(3):
        b = (torch.full((4, 2), float(i)), torch.ones(4, 2))
        loss = torch.nn.functional.mse_loss(ref(b[0]), b[1])
        ro.zero_grad()
        loss.backward()
        ro.step()
        dp.step(b, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]))
    assert torch.allclose(model.weight, ref.weight) and torch.allclose(model.bias, ref.bias)
    # parameters replicated (no parameter axis): plain data parallelism over the mesh's devices
    dp = md.data_parallel(model, opt, mesh=mt, param_axis=())
    assert dp.replica.devices == list(mt.devices)
    before = model.weight.detach().clone()
    dp.step((torch.ones(4, 2), torch.zeros(4, 2)), lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]))
    assert not torch.equal(model.weight, before)


def test_torch_adagrad_fresh_state_shards_and_a_stepped_one_is_refused() -> None:
    """Adagrad fills its state when it is made (a step count of 0): fresh, it shards; stepped, refused."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    import torch

    mt = md.make_mesh((1, 1), ("data", "model"), backend="torch")
    torch.manual_seed(0)
    model, ref = torch.nn.Linear(3, 4), torch.nn.Linear(3, 4)
    ref.load_state_dict(model.state_dict())
    ro = torch.optim.Adagrad(ref.parameters(), lr=0.1, initial_accumulator_value=0.5)
    dp = md.data_parallel(model, torch.optim.Adagrad(model.parameters(), lr=0.1, initial_accumulator_value=0.5),
                          mesh=mt)
    for i in range(3):
        b = (torch.full((4, 3), float(i) + 0.5), torch.ones(4, 4))
        ro.zero_grad()
        torch.nn.functional.mse_loss(ref(b[0]), b[1]).backward()
        ro.step()
        dp.step(b, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]))
    assert torch.allclose(model.weight, ref.weight, atol=1e-6) and torch.allclose(model.bias, ref.bias, atol=1e-6)
    with pytest.raises(md.CapabilityError, match="stepped already"):
        md.data_parallel(ref, ro, mesh=mt)


def test_piece_refusal_is_optional_for_an_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter whose replica gives an optimizer over pieces but has no ``piece_refusal`` hook
    still shards (the hook only moves the adapter's refusals before the replica is made)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    import torch

    from multidev.managed_sharding import ManagedDeviceShardedReplica

    parallel = type(md.backend("torch").parallel)
    monkeypatch.delattr(parallel, "piece_refusal")
    mt = md.make_mesh((1, 1), ("data", "model"), backend="torch")
    model = torch.nn.Linear(2, 2)
    dp = md.data_parallel(model, torch.optim.SGD(model.parameters(), lr=0.1), mesh=mt)
    assert isinstance(dp.replica, ManagedDeviceShardedReplica)
    with pytest.raises(md.CapabilityError, match="element by element"):  # the replica refuses in its place
        md.data_parallel(model, torch.optim.LBFGS(model.parameters()), mesh=mt)
    with pytest.raises(md.InvalidArgumentError, match="needs the optimizer"):
        md.data_parallel(model, None, mesh=mt)


@pytest.mark.parametrize(("kwargs", "err", "match"), [
    ({"mesh": "data"}, md.InvalidArgumentError, "mesh must be a multidev.Mesh"),
    ({"mesh": _mesh(), "data_axis": "batch"}, md.InvalidArgumentError, r"distinct axes of the mesh .*'batch'"),
    ({"mesh": _mesh(), "data_axis": ()}, md.InvalidArgumentError, "names no mesh axis"),
    ({"mesh": _mesh(), "param_axis": ("model", "model")}, md.InvalidArgumentError, "distinct axes"),
    ({"mesh": _mesh(), "param_axis": 3}, md.InvalidArgumentError, "axis name or a tuple"),
    ({"mesh": _mesh(), "devices": ["cpu:0"]}, md.InvalidArgumentError, "devices or mesh, not both"),
    ({"data_axis": "data"}, md.InvalidArgumentError, "pass mesh="),
])
def test_mesh_arguments_are_checked(kwargs: dict, err: type, match: str) -> None:
    params = {"w": md.asarray(np.ones((2, 2)), backend="numpy")}
    with pytest.raises(err, match=match):
        md.data_parallel(params, None, **kwargs)


JAX_CASE = """
    import jax, jax.numpy as jnp, numpy as np, optax
    import multidev as md

    mesh = md.make_mesh((2, 2), ("data", "model"), backend="jax")
    rng = np.random.default_rng(0)
    params = {"w1": jnp.asarray(rng.normal(size=(8, 16)), jnp.float32), "b1": jnp.zeros(16),
              "w2": jnp.asarray(rng.normal(size=(16, 3)), jnp.float32), "b2": jnp.zeros(3)}
    X = rng.normal(size=(48, 8)).astype(np.float32)
    Y = rng.normal(size=(48, 3)).astype(np.float32)

    def loss_fn(p, batch):
        x, y = batch
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    def batches():
        for i in range(6):
            yield jnp.asarray(X[8 * i:8 * i + 8]), jnp.asarray(Y[8 * i:8 * i + 8])

    def run(**kw):
        dp = md.data_parallel(params, optax.adam(1e-2), **kw)
        return dp, [float(dp.step(b, loss_fn)) for b in batches()]

    one, ref = run()
    for kw in ({"mesh": mesh, "data_axis": "data"},                               # batch on data, params on model
               {"mesh": mesh, "data_axis": ("data", "model"), "param_axis": "model"},  # ZeRO-3: batch on both
               {"mesh": mesh, "data_axis": "data", "param_axis": ()}):            # plain data parallel on the mesh
        dp, losses = run(**kw)
        np.testing.assert_allclose(losses, ref, rtol=2e-5, err_msg=str(kw))
        whole = (jnp.asarray(X), jnp.asarray(Y))
        assert loss_fn(dp.model, whole) < loss_fn(params, whole)  # it learned
        for k in params:
            np.testing.assert_allclose(np.asarray(dp.model[k]), np.asarray(one.model[k]), rtol=1e-4, atol=1e-5)
        want = "model" if kw.get("param_axis", "model") else None
        assert md.layout_of(dp.model["w1"]) == md.Layout(mesh, (want, None)), md.layout_of(dp.model["w1"])
        assert md.layout_of(dp.model["b2"]) == md.Layout(mesh, (None,))  # 3 rows: whole on every device
        pieces = [s.data.shape for s in dp.model["w1"].addressable_shards]
        assert pieces == [(4, 16) if want else (8, 16)] * 4, pieces
        mu = dp.replica.opt_state[0].mu
        assert mu["w1"].sharding == dp.model["w1"].sharding and mu["w2"].sharding == dp.model["w2"].sharding

    # the batch: cut along data (given already placed, it is not placed again), rows checked
    dp = md.data_parallel(params, optax.sgd(0.1), mesh=mesh, data_axis="data")
    placed = md.to(jnp.asarray(X[:8]), md.Layout(mesh, ("data", None)))
    assert dp.replica._place_batch((placed,))[0] is placed
    try:
        dp.step((jnp.asarray(X[:7]), jnp.asarray(Y[:7])), loss_fn)
        raise SystemExit("7 rows over 2 pieces were accepted")
    except md.InvalidArgumentError as e:
        assert "multiple of 2" in str(e), e

    # no_sync: two micro-batches accumulated, then one step: as one device's
    a = md.data_parallel(params, optax.sgd(0.1), mesh=mesh)
    b = md.data_parallel(params, optax.sgd(0.1))
    for dp in (a, b):
        bs = list(batches())
        with dp.no_sync():
            dp.step(bs[0], loss_fn)
        dp.step(bs[1], loss_fn)
    np.testing.assert_allclose(np.asarray(a.model["w1"]), np.asarray(b.model["w1"]), rtol=1e-5, atol=1e-6)
    a.verify()

    # a flax TrainState carries its optimizer: its moments sharded, its step count whole
    from flax.training.train_state import TrainState

    st = TrainState.create(apply_fn=None, params=params, tx=optax.adam(1e-2))
    ts = md.data_parallel(st, mesh=mesh)
    losses = [float(ts.step(b, loss_fn)) for b in batches()]
    np.testing.assert_allclose(losses, ref, rtol=2e-5)
    assert int(ts.model.step) == 6 and md.layout_of(ts.model.step) == md.Layout(mesh, ())
    assert ts.model.opt_state[0].mu["w1"].sharding == ts.model.params["w1"].sharding
    assert md.layout_of(ts.model.params["w1"]) == md.Layout(mesh, ("model", None))
    print("OK")
"""


def test_jax_on_a_2x2_mesh_matches_one_device() -> None:
    for module in ("jax", "optax", "flax"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(MULTIDEV_JAX_CPU_DEVICES="4")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(JAX_CASE)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"


def test_a_mesh_under_a_process_group_is_refused_before_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    dpm = sys.modules["multidev.data_parallel"]  # (the package's data_parallel attribute is the function)
    monkeypatch.setattr(dpm, "_group", lambda: object())  # a group of more than one rank
    params = {"w": md.asarray(np.ones((2, 2)), backend="numpy")}
    with pytest.raises(md.CapabilityError, match="a mesh of this process's devices under a process group of more "
                                                 "than one rank; across processes pass a process mesh"):
        md.data_parallel(params, None, mesh=_mesh())
