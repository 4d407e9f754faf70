"""Issues 31 and 32: the one rule for leaves that are no tensor (docs/transfers.md#structures), in
every container kind, and ``md.to`` of a JAX tree giving ``jit`` what ``jax.device_put`` gives it.

The rule: ``None`` is kept everywhere; inside a framework's tree the framework decides (a JAX tree's
Python and NumPy scalars become arrays as ``jax.device_put`` makes them, its functions and strings
are kept); anywhere else a leaf that is no tensor raises UnsupportedTensorError naming its path,
before anything moved. JAX checks run on ``cpu:0`` here (a move between two virtual CPU devices in
a child process, as the device count is fixed once JAX starts).
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import multidev as md

P = collections.namedtuple("P", "w b")

#: Each Python container kind, holding a tensor and the leaf under test at key/index 1 or "k".
CONTAINERS: dict[str, Any] = {
    "list": lambda t, v: ([t, v], [1]),
    "tuple": lambda t, v: ((t, v), [1]),
    "dict": lambda t, v: ({"t": t, "k": v}, ["k"]),
    "namedtuple": lambda t, v: (P(t, v), [1]),
    "OrderedDict": lambda t, v: (collections.OrderedDict([("t", t), ("k", v)]), ["k"]),
    "nested": lambda t, v: ({"a": [t, (t, v)]}, ["a", 1, 1]),
}
NOT_TENSORS = [0, 1.5, True, 2j, "s", b"b", object()]  # (a NumPy scalar is a NumPy tensor)


def _calls(dev: str) -> dict[str, Any]:
    return {"to": lambda s: md.to(s, dev), "copy": lambda s: md.copy(s, dev),
            "to_nb": lambda s: md.to(s, dev, non_blocking=True).wait(), "device_of": md.device_of,
            "synchronize": md.synchronize}


@pytest.mark.parametrize("kind", sorted(CONTAINERS))
@pytest.mark.parametrize("leaf", NOT_TENSORS, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("call", sorted(_calls("cpu:1")))
def test_outside_a_framework_tree_a_leaf_that_is_no_tensor_is_refused_with_its_path(kind: str, leaf: Any,
                                                                                    call: str) -> None:
    t = md.ones(2, device="cpu:0")
    obj, path = CONTAINERS[kind](t, leaf)
    where = "".join(f"[{p!r}]" for p in path)
    with pytest.raises(md.UnsupportedTensorError, match=re.escape(where) + " is a "):
        _calls("cpu:1")[call](obj)


@pytest.mark.parametrize("kind", sorted(CONTAINERS))
def test_none_is_kept_in_every_container(kind: str) -> None:
    t = md.ones(2, device="cpu:0")
    obj, path = CONTAINERS[kind](t, None)
    for name, call in _calls("cpu:1").items():
        out = call(obj)
        if name in ("device_of", "synchronize"):
            continue
        node = out
        for p in path:
            node = node[p]
        assert node is None, name
        assert type(out) is type(obj) and md.device_of(out) == md.Device("cpu", 1), name


def test_a_refused_structure_moves_nothing() -> None:
    moved = md.ones(2, device="cpu:0")
    with pytest.raises(md.UnsupportedTensorError, match=r"\['n'\] is a builtins.int"):
        md.to({"x": moved, "n": 3}, "cpu:1")
    assert md.device_of(moved) == md.Device("cpu", 0)


# -- JAX trees -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jax() -> Any:
    return pytest.importorskip("jax", reason="the JAX half of the rule needs JAX")


def _box(jax: Any) -> Any:
    @jax.tree_util.register_pytree_node_class
    class Box:
        def __init__(self, a: Any, n: Any, fn: Any, name: Any, extra: Any) -> None:
            self.a, self.n, self.fn, self.name, self.extra = a, n, fn, name, extra

        def tree_flatten(self) -> tuple[tuple[Any, ...], None]:
            return (self.a, self.n, self.fn, self.name, self.extra), None

        @classmethod
        def tree_unflatten(cls, _aux: None, ch: Any) -> Any:
            return cls(*ch)
    return Box


@pytest.mark.parametrize("call", ["to", "copy", "to_nb"])
def test_in_a_jax_tree_scalars_become_arrays_as_device_put_makes_them_others_are_kept(jax: Any, call: str) -> None:
    jnp = jax.numpy
    Box = _box(jax)
    x = jnp.ones(3)  # uncommitted
    tree = Box(x, 7, jnp.tanh, "name", {"lr": 0.5, "none": None, "t": (1, "s")})
    out = _calls("cpu:0")[call](tree)
    ref = jax.device_put(Box(x, 7, None, None, {"lr": 0.5, "none": None, "t": (1, None)}),
                         jax.devices("cpu")[0])
    assert type(out) is Box and out.fn is jnp.tanh and out.name == "name" and out.extra["t"][1] == "s"
    assert out.extra["none"] is None
    for got, want in [(out.n, ref.n), (out.extra["lr"], ref.extra["lr"]), (out.extra["t"][0], ref.extra["t"][0]),
                      (out.a, ref.a)]:
        assert isinstance(got, jax.Array) and got.committed
        assert (got.dtype, got.weak_type, got.shape) == (want.dtype, want.weak_type, want.shape)
        assert md.device_of(got) == md.Device("cpu", 0)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    if call != "copy":  # to: the uncommitted resident array committed over the same buffer, not copied
        assert out.a.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
    else:
        assert out.a.unsafe_buffer_pointer() != x.unsafe_buffer_pointer()
    assert md.device_of(tree) == md.Device("cpu", 0)  # the scalars, function and string are no tensors


def test_to_of_a_resident_array_commits_an_uncommitted_one_without_a_copy(jax: Any) -> None:
    x = jax.numpy.arange(4.0)
    assert not x.committed
    y = md.to(x, "cpu:0")
    assert y.committed and y.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
    assert md.to(y, "cpu:0") is y, "a committed resident array is the no-op: the same object"
    assert md.to((y, y), "cpu:0") is not None and md.to([y], "cpu:0")[0] is y
    z = md.to([x, y], "cpu:0")
    assert z[0].committed and z[1] is y
    assert md.to(x, "cpu:0", non_blocking=True).wait().committed


def _train_state(jax: Any) -> Any:
    pytest.importorskip("flax", reason="a flax TrainState needs flax")
    pytest.importorskip("optax", reason="a flax TrainState needs optax")
    import optax
    from flax import linen as nn
    from flax.training import train_state

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            return nn.Dense(2)(nn.relu(nn.Dense(8)(x)))
    m = MLP()
    params = m.init(jax.random.PRNGKey(0), jax.numpy.ones((1, 4)))["params"]
    return train_state.TrainState.create(apply_fn=m.apply, params=params, tx=optax.adam(1e-2))


def _compiles_of_three_steps(jax: Any, state: Any) -> int:
    """How many programs a jitted training step compiles over three steps from ``state``."""
    def loss(p: Any, x: Any) -> Any:
        return (state.apply_fn({"params": p}, x) ** 2).mean()

    @jax.jit
    def step(s: Any, x: Any) -> Any:
        return s.apply_gradients(grads=jax.grad(loss)(s.params, x))
    x = np.ones((5, 4), np.float32)
    for _ in range(3):
        state = step(state, x)
    assert int(state.step) == 3
    return int(step._cache_size())


def test_a_flax_train_state_moved_with_to_compiles_as_often_as_with_device_put(jax: Any) -> None:
    state = _train_state(jax)
    assert type(state.step) is int  # as TrainState.create gives it: the trap of issue 32
    assert _compiles_of_three_steps(jax, state) == 2, "unplaced: the int step and uncommitted arrays recompile"
    native = _compiles_of_three_steps(jax, jax.device_put(state, jax.devices("cpu")[0]))
    ours = _compiles_of_three_steps(jax, md.to(state, "cpu:0"))
    assert ours == native == 1


def test_a_flax_train_state_moves_with_its_optax_state_like_device_put(jax: Any) -> None:
    state = _train_state(jax)
    moved = md.to(state, "cpu:0")
    ref = jax.device_put(state, jax.devices("cpu")[0])
    assert jax.tree_util.tree_structure(moved) == jax.tree_util.tree_structure(ref)
    for a, b in zip(jax.tree_util.tree_leaves(moved), jax.tree_util.tree_leaves(ref), strict=True):
        assert a.committed and (a.dtype, a.weak_type) == (b.dtype, b.weak_type)
    assert moved.apply_fn == state.apply_fn and moved.tx is state.tx
    assert md.copy(state, "cpu:0").step.committed
    free = md.copy(state).step  # no device: as jax.device_put(tree) makes it, on JAX's default device
    ref_free = jax.device_put(state).step
    assert isinstance(free, jax.Array) and free.committed == ref_free.committed and free.weak_type


def test_a_train_state_and_its_optax_state_move_between_devices() -> None:
    pytest.importorskip("jax", reason="needs JAX")
    pytest.importorskip("flax", reason="a flax TrainState needs flax")
    code = textwrap.dedent("""
        import multidev as md
        md.devices(backend="jax")  # before any JAX work: the adapter gives JAX its two CPU devices
        import jax, optax
        from flax import linen as nn
        from flax.training import train_state
        m = nn.Dense(3)
        params = m.init(jax.random.PRNGKey(0), jax.numpy.ones((1, 2)))["params"]
        st = train_state.TrainState.create(apply_fn=m.apply, params=params, tx=optax.adam(1e-2))
        out = md.to(st, "cpu:1")
        devs = {str(md.device_of(leaf)) for leaf in jax.tree_util.tree_leaves(out)}
        assert devs == {"cpu:1"}, devs
        assert md.device_of(out.opt_state) == md.Device("cpu", 1) and md.device_of(out) == md.Device("cpu", 1)
        print("OK", len(jax.tree_util.tree_leaves(out.opt_state)))
    """)
    env = dict(os.environ, MULTIDEV_JAX_CPU_DEVICES="2", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stderr[-2000:]


# -- torch: a state_dict is a dict, a model moves as a whole --------------------------------------


def test_a_torch_state_dict_and_model_follow_the_rule() -> None:
    torch = pytest.importorskip("torch", reason="the torch half needs torch")
    net = torch.nn.Linear(2, 3)
    sd = net.state_dict()
    out = md.to(sd, "cpu:0")
    assert type(out) is type(sd) and all(out[k] is sd[k] for k in sd)
    sd["extra"] = None
    assert md.copy(sd)["extra"] is None
    sd["epoch"] = 3
    with pytest.raises(md.UnsupportedTensorError, match=r"\['epoch'\] is a builtins.int"):
        md.to(sd, "cpu:0")
    assert md.to([net, None], "cpu:0")[0] is net  # a model is moved whole (its own attributes are its own)
    with pytest.raises(md.UnsupportedTensorError, match=r"\[1\] is a builtins.str"):
        md.to([net, "x"], "cpu:0")
