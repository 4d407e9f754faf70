"""Collectives over structures (issue 32): every ``md`` collective of one structure per device (NumPy
virtual devices, JAX virtual CPU devices in a child, torch's one CPU device), ``dist.allreduce`` /
every ``dist`` collective of a structure in a 1-process group (exchanges counted), across 2 gloo
processes on the torch engine (tests/structs_worker.py), and across 2 processes of every engine
(tests/structs_engines_worker.py: torch, mpi, jax), and the shared bucket plan."""
from __future__ import annotations

import collections
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import buckets
from multidev import distributed as dist
from multidev.adapters import numpy as npb
from multidev.distributed.group import current
from multidev.errors import (
    CapabilityError,
    CollectiveInputError,
    UnsupportedTensorError,
)

Pair = collections.namedtuple("Pair", "x y")
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_JAX = importlib.util.find_spec("jax") is not None


@pytest.fixture(autouse=True)
def three_devices() -> Iterator[None]:
    old = len(md.devices(backend="numpy"))
    npb.set_device_count(3)
    yield
    npb.set_device_count(old)


def _a(values: Any, dtype: str, i: int) -> Any:
    return md.asarray(np.asarray(values), dtype=dtype, device=f"cpu:{i}", backend="numpy")


def _state(i: int, rng: np.random.Generator) -> dict[str, Any]:
    """A model's state on device ``i``: float32 weights, a float64 statistic, an int64 counter."""
    return {"conv.weight": _a(rng.standard_normal((6, 1, 5, 5)), "float32", i),
            "conv.bias": _a(rng.standard_normal(6), "float32", i),
            "fc.weight": _a(rng.standard_normal((10, 24)), "float32", i),
            "bn.running_var": _a(rng.random(6), "float64", i),
            "bn.count": _a([i + 1], "int64", i)}


def _states(n: int = 3) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    return [_state(i, rng) for i in range(n)]


def _host(x: Any) -> np.ndarray:
    return np.asarray(md.to_numpy(x))


# -- md.allreduce over structures (one process, several devices) ----------------------------------
@pytest.mark.parametrize("algorithm", ["naive", "tree"])
@pytest.mark.parametrize("op", ["sum", "max", "prod"])
def test_state_dicts_equal_per_tensor_allreduce_bitwise(op: str, algorithm: str) -> None:
    states = _states()
    before = [{k: _host(v).copy() for k, v in s.items()} for s in states]
    out = md.allreduce(states, op, algorithm=algorithm)
    assert isinstance(out, list) and len(out) == 3
    for k in states[0]:
        per = md.allreduce([s[k] for s in states], op, algorithm=algorithm)
        for i in range(3):
            y = out[i][k]
            assert type(out[i]) is dict and list(out[i]) == list(states[i])
            assert md.device_of(y) == md.device_of(states[i][k]) and md.dtype_of(y) == md.dtype_of(states[i][k])
            assert np.array_equal(_host(y), _host(per[i])), k
            assert y is not states[i][k]
    for s, b in zip(states, before):  # the inputs are unchanged
        for k in s:
            assert np.array_equal(_host(s[k]), b[k])


def test_ring_and_auto_agree_with_the_float64_reference() -> None:
    states = [{k: v for k, v in s.items() if k != "bn.count"} for s in _states()]
    for algorithm in ("ring", "auto"):
        out = md.allreduce(states, "mean", algorithm=algorithm)
        for k in states[0]:
            ref = sum(_host(s[k]).astype(np.float64) for s in states) / 3
            for i in range(3):
                np.testing.assert_allclose(_host(out[i][k]), ref, rtol=1e-6, atol=1e-6)


def test_containers_and_none_are_kept() -> None:
    xs = [{"a": (_a([1.0, 2.0], "float32", i), None, [_a(i, "int32", i)]), "p": Pair(_a([i], "float64", i), None)}
          for i in range(3)]
    out = md.allreduce(xs)
    for i, y in enumerate(out):
        assert type(y["a"]) is tuple and y["a"][1] is None and type(y["a"][2]) is list and type(y["p"]) is Pair
        assert np.array_equal(_host(y["a"][0]), [3.0, 6.0]) and int(_host(y["a"][2][0])) == 3
        assert md.device_of(y["a"][0]) == md.device_of(xs[i]["a"][0])


def test_inplace_writes_every_leaf_and_returns_the_structures() -> None:
    states = _states()
    expect = md.allreduce(states, "sum", algorithm="naive")
    ids = [{k: id(v) for k, v in s.items()} for s in states]
    res = md.allreduce(states, "sum", inplace=True, algorithm="naive")
    assert all(r is s for r, s in zip(res, states))
    for i, s in enumerate(states):
        for k, v in s.items():
            assert id(v) == ids[i][k] and np.array_equal(_host(v), _host(expect[i][k]))


def test_small_buckets_give_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    from multidev import collectives

    states = _states()
    whole = md.allreduce(states, algorithm="naive")
    monkeypatch.setattr(collectives, "DEFAULT_BUCKET_MB", 100 / 2**20)  # 100 bytes: most tensors alone
    calls = []
    real = collectives._allreduce_checked

    def spy(b: Any, xs: Any, *args: Any) -> Any:
        calls.append(len(xs))
        return real(b, xs, *args)

    monkeypatch.setattr(collectives, "_allreduce_checked", spy)
    parts = md.allreduce(states, algorithm="naive")
    assert len(calls) > 3  # one reduction per bucket
    for i in range(3):
        for k in states[0]:
            assert np.array_equal(_host(parts[i][k]), _host(whole[i][k]))


def test_mismatched_structures_are_refused_and_change_nothing() -> None:
    states = _states()
    keep = _host(states[0]["conv.bias"]).copy()
    short = [states[0], states[1], {k: v for k, v in states[2].items() if k != "bn.count"}]
    with pytest.raises(CollectiveInputError, match="structure 2 holds 4 tensors"):
        md.allreduce(short, inplace=True)
    odd = [states[0], states[1], {**states[2], "conv.bias": _a(np.zeros(5), "float32", 2)}]
    with pytest.raises(CollectiveInputError, match="tensor 1 of structure 2"):
        md.allreduce(odd, inplace=True)
    assert np.array_equal(_host(states[0]["conv.bias"]), keep)


def test_bad_leaves_and_devices_are_refused() -> None:
    states = _states()
    with pytest.raises(UnsupportedTensorError, match=r"\['lr'\]"):
        md.allreduce([{**states[0], "lr": 0.1}, states[1], states[2]])
    spread = {**states[0], "conv.bias": states[1]["conv.bias"]}
    with pytest.raises(CollectiveInputError, match="several devices"):
        md.allreduce([spread, states[2]])
    with pytest.raises(CollectiveInputError, match="appears|distinct|twice|repeated|same device"):
        md.allreduce([states[0], states[0]])
    with pytest.raises(CollectiveInputError, match="int64"):
        md.allreduce(states, "mean")


def test_read_only_leaf_refuses_inplace_and_changes_nothing() -> None:
    states = [{k: v for k, v in s.items() if k != "bn.count"} for s in _states()]
    states[2]["fc.weight"].setflags(write=False)
    keep = [{k: _host(v).copy() for k, v in s.items()} for s in states]
    with pytest.raises(CapabilityError):
        md.allreduce(states, inplace=True)
    for s, b in zip(states, keep):
        for k in s:
            assert np.array_equal(_host(s[k]), b[k])


def test_structures_without_tensors_are_rebuilt() -> None:
    xs: list[Any] = [{"a": [], "b": None} for _ in range(2)]
    out = md.allreduce(xs)
    assert out == xs and all(o is not x for o, x in zip(out, xs))


# -- the other one-process collectives: the tensor call leaf by leaf, bucketed ----------------------
def _ragged(i: int) -> dict[str, Any]:
    """Device ``i``'s structure: leaves of 3 dtypes and ranks, lengths along axis 0 that differ by device."""
    rng = np.random.default_rng(i)
    return {"w": _a(rng.standard_normal((4 + i, 3)), "float32", i),
            "b": [_a(rng.standard_normal(2 + i), "float32", i), None],
            "n": Pair(_a(np.arange(3 + 2 * i), "int64", i), _a(rng.random((1 + i, 2, 2)), "float64", i))}


def _leafwise(structs: list[Any], fn: Any) -> list[list[Any]]:
    """``fn`` applied to the list of leaf ``j`` of every structure, for each ``j`` (the tensor calls)."""
    from multidev.structured import structure_leaves

    lvs = [structure_leaves(s, "t") for s in structs]
    return [fn([lv.tensors[j] for lv in lvs]) for j in range(len(lvs[0].tensors))]


def _leaves(x: Any) -> list[Any]:
    from multidev.structured import structure_leaves

    return structure_leaves(x, "t").tensors


def _same(got: Any, want: Any) -> None:
    assert md.device_of(got) == md.device_of(want) and md.dtype_of(got) == md.dtype_of(want)
    assert np.array_equal(_host(got), _host(want))


def _kept(inputs: list[Any]) -> Any:
    before = [[_host(t).copy() for t in _leaves(s)] for s in inputs]

    def check(outs: list[Any]) -> None:
        for s, b in zip(inputs, before):
            assert all(np.array_equal(_host(t), v) for t, v in zip(_leaves(s), b))  # inputs unchanged
        mine = {id(t) for s in inputs for t in _leaves(s)}
        assert not any(id(t) in mine for o in outs for t in _leaves(o))  # new tensors
    return check


@pytest.mark.parametrize("small", [False, True])
def test_every_collective_over_structures_is_the_tensor_call_per_leaf(small: bool,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from multidev import collectives

    if small:  # 64 bytes: most leaves alone in their bucket, some sharing
        monkeypatch.setattr(collectives, "DEFAULT_BUCKET_MB", 64 / 2**20)
    devs = md.devices(backend="numpy")[:3]
    ragged = [_ragged(i) for i in range(3)]
    even = _states()
    cases = [
        ("reduce", even, lambda xs: md.reduce(xs, "cpu:1", "max"), lambda ts: [md.reduce(ts, "cpu:1", "max")]),
        ("allgather", ragged, lambda xs: md.allgather(xs), md.allgather),
        ("gather", ragged, lambda xs: md.gather(xs, "cpu:2"), lambda ts: [md.gather(ts, "cpu:2")]),
        ("reduce_scatter", even, lambda xs: md.reduce_scatter(xs, "sum"), lambda ts: md.reduce_scatter(ts, "sum")),
        ("all_to_all", even, lambda xs: md.all_to_all(xs), md.all_to_all),
        ("scatter", ragged[:1], lambda xs: md.scatter(xs[0], devs), lambda ts: md.scatter(ts[0], devs)),
        ("broadcast", ragged[1:2], lambda xs: md.broadcast(xs[0], devs), lambda ts: md.broadcast(ts[0], devs)),
    ]
    for name, inputs, whole, per_tensor in cases:
        check = _kept(inputs)
        got = whole(inputs)
        outs = [got] if name in ("reduce", "gather") else got
        want = _leafwise(inputs, per_tensor)  # want[leaf][result]
        assert len(outs) == len(want[0]), name
        for k, o in enumerate(outs):
            assert type(o) is dict and list(o) == list(inputs[0]), name
            if "b" in o:
                assert type(o["b"]) is list and o["b"][1] is None and type(o["n"]) is Pair, name
            for j, leaf in enumerate(_leaves(o)):
                _same(leaf, want[j][k])
        check(outs)


def test_gathers_take_a_negative_axis_per_leaf_and_join_other_axes() -> None:
    xs = [[_a(np.full((2, 1 + i), i), "float32", i), _a(np.full((3, 2, 1 + i), i), "int32", i)] for i in range(3)]
    got = md.gather(xs, "cpu:0", axis=-1)
    assert [_host(t).shape for t in got] == [(2, 6), (3, 2, 6)]
    assert np.array_equal(_host(got[0])[0], [0, 1, 1, 2, 2, 2])


def test_structure_refusals_name_the_leaf_and_change_nothing() -> None:
    ragged = [_ragged(i) for i in range(3)]
    with pytest.raises(CollectiveInputError, match=r"tensor 0 of structure 1 .* axis 0 only"):
        md.allgather([ragged[0], {**ragged[1], "w": _a(np.zeros((5, 4)), "float32", 1)}, ragged[2]])
    with pytest.raises(CollectiveInputError, match="one shape each"):
        md.reduce_scatter(ragged)
    with pytest.raises(CollectiveInputError, match="one shape each"):
        md.all_to_all(ragged)
    with pytest.raises(CollectiveInputError, match="int64"):
        md.reduce(_states(), "cpu:0", "mean")
    with pytest.raises(CollectiveInputError, match="tensor 0 .*0-d"):
        md.scatter({"s": _a(1.0, "float32", 0)}, ["cpu:0", "cpu:1"])
    with pytest.raises(CollectiveInputError, match="axis 2 is out of range"):
        md.allgather([[_a(np.zeros((2, 2)), "float32", i)] for i in range(2)], axis=2)
    with pytest.raises(UnsupportedTensorError, match=r"\['lr'\]"):
        md.broadcast({"w": _a([1.0], "float32", 0), "lr": 0.1}, ["cpu:1"])


def test_structures_without_tensors_and_split_batch_of_a_dict() -> None:
    assert md.broadcast({"a": []}, ["cpu:0", "cpu:1"]) == [{"a": []}, {"a": []}]
    assert md.reduce([[None], [None]], "cpu:0") == [None]
    X = {"img": _a(np.arange(10.0).reshape(5, 2), "float32", 0), "mask": _a(np.ones(5), "bool", 0)}
    xs, ys = md.split_batch(X, _a(np.arange(5), "int64", 0), ["cpu:0", "cpu:1"])
    assert [_host(x["img"]).shape for x in xs] == [(3, 2), (2, 2)] and [len(_host(y)) for y in ys] == [3, 2]
    assert md.device_of(xs[1]["mask"]) == md.device_of(ys[1])
    with pytest.raises(CollectiveInputError, match="same number of examples"):
        md.split_batch({"a": X["img"], "b": _a(np.ones(4), "float32", 0)}, X["mask"], ["cpu:0", "cpu:1"])


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_torch_state_dict_on_its_one_cpu_device() -> None:
    import torch

    sd = torch.nn.Linear(3, 2).state_dict()
    (out,) = md.allreduce([sd])
    assert type(out) is type(sd) and list(out) == list(sd)
    for k, v in sd.items():
        assert torch.equal(out[k], v) and out[k].data_ptr() != v.data_ptr()


@pytest.mark.skipif(not HAS_JAX, reason="JAX is not installed")
def test_jax_pytrees_on_virtual_cpu_devices() -> None:
    code = textwrap.dedent("""
        import numpy as np, jax, jax.numpy as jnp, multidev as md
        from multidev.errors import CapabilityError
        devs = md.devices(backend="jax")
        assert len(devs) == 2, devs
        trees = [md.to({"w": jnp.full((2, 3), i + 1.0), "b": (jnp.arange(3.0) * (i + 1), None)}, d)
                 for i, d in enumerate(devs)]
        out = md.allreduce(trees, "mean")
        for i, y in enumerate(out):
            assert type(y) is dict and type(y["b"]) is tuple and y["b"][1] is None
            assert md.device_of(y["w"]) == devs[i], (md.device_of(y["w"]), devs[i])
            assert np.array_equal(np.asarray(y["w"]), np.full((2, 3), 1.5))
            assert np.array_equal(np.asarray(y["b"][0]), np.arange(3.0) * 1.5)
        try:
            md.allreduce(trees, inplace=True)
        except CapabilityError as e:
            print("REFUSED", "immutable" in str(e))
        joined = md.gather(trees, devs[1])                   # leaf by leaf, on devs[1]
        assert type(joined["b"]) is tuple and joined["b"][1] is None and md.device_of(joined["w"]) == devs[1]
        assert np.array_equal(np.asarray(joined["w"]), np.concatenate([np.full((2, 3), 1.0), np.full((2, 3), 2.0)]))
        parts = md.scatter(trees[1], devs)                    # rows split over the devices
        assert [np.asarray(p["w"]).shape for p in parts] == [(1, 3), (1, 3)] and md.device_of(parts[0]["w"]) == devs[0]
        pieces = md.reduce_scatter(trees, axis=-1)
        assert np.array_equal(np.asarray(pieces[1]["b"][0]), (np.arange(3.0) * 3)[2:])
        print("OK")
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env.update(MULTIDEV_JAX_CPU_DEVICES="2", PYTHONWARNINGS="ignore", JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "REFUSED True" in p.stdout and p.stdout.strip().endswith("OK")


# -- dist.allreduce / broadcast over structures in a 1-process group -------------------------------
@pytest.fixture
def solo(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """A 1-process group whose consistency exchanges are counted (the list's length)."""
    for k in list(os.environ):
        if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "MULTIDEV_ENGINE") \
                or k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_", "JAX_")):
            monkeypatch.delenv(k)
    dist.shutdown()
    dist.init()
    seen: list[int] = []
    g = current()
    real = g.engine.exchange

    def counting(seq: int, row: Any, timeout: float) -> Any:
        seen.append(seq)
        return real(seq, row, timeout)

    monkeypatch.setattr(g.engine, "exchange", counting)
    yield seen
    dist.shutdown()


def test_one_exchange_per_structure_call(solo: list[int]) -> None:
    s = {"w": np.ones((2, 3), np.float32), "b": [np.arange(3.0), None], "p": Pair(np.float32(2) * np.ones(1), None)}
    for call in (lambda: dist.allreduce(s), lambda: dist.allreduce(s, "mean", inplace=True),
                 lambda: dist.broadcast(s, 0), lambda: dist.allreduce(s, async_op=True).wait(),
                 lambda: dist.reduce(s, 0), lambda: dist.allgather(s), lambda: dist.gather(s, 0, axis=-1),
                 lambda: dist.reduce_scatter(s), lambda: dist.scatter(s, 0), lambda: dist.gather(s, async_op=True).wait()):
        before = len(solo)
        y = call()
        assert len(solo) - before == 1
        assert type(y) is dict and type(y["b"]) is list and y["b"][1] is None and type(y["p"]) is Pair
    before = len(solo)
    for v in (s["w"], s["b"][0], s["p"].x):
        dist.allreduce(v)
    assert len(solo) - before == 3  # the per-tensor loop this replaces


def test_results_are_new_tensors_unless_inplace(solo: list[int]) -> None:
    s = [np.arange(4.0), np.ones(2, np.float32)]
    y = dist.allreduce(s)
    assert type(y) is list and all(a is not b and np.array_equal(a, b) for a, b in zip(y, s))
    y[0][:] = -1
    assert np.array_equal(s[0], np.arange(4.0))
    assert dist.allreduce(s, inplace=True) is s


def test_refusals_in_a_group(solo: list[int]) -> None:
    with pytest.raises(UnsupportedTensorError, match=r"\[1\]"):
        dist.allreduce([np.ones(2), "x"])
    with pytest.raises(CollectiveInputError, match="tensor 1 .*0-d"):
        dist.allgather([np.ones(2), np.float64(1) * np.ones(())])
    with pytest.raises(CollectiveInputError, match="axis must be an int"):
        dist.reduce_scatter({"a": np.ones(2)}, axis="0")
    with pytest.raises(CollectiveInputError, match="own leaves' devices"):
        dist.scatter({"a": np.ones(2)}, 0, device="cpu:0")
    ro = np.ones(3)
    ro.setflags(write=False)
    w = np.zeros(2)
    with pytest.raises(CapabilityError):
        dist.allreduce([w, ro], inplace=True)
    assert np.array_equal(w, np.zeros(2))


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_torch_state_dict_in_a_group(solo: list[int]) -> None:
    import torch

    sd = torch.nn.Linear(4, 3).state_dict()
    before = len(solo)
    y = dist.allreduce(sd, "mean")
    assert len(solo) - before == 1 and type(y) is type(sd)
    for k, v in sd.items():
        assert torch.equal(y[k], v) and y[k].data_ptr() != v.data_ptr()


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_mixed_backends_are_refused_and_change_nothing(solo: list[int]) -> None:
    import torch

    w = np.zeros(2)
    t = torch.zeros(2)
    with pytest.raises(CollectiveInputError, match="several backends"):
        dist.allreduce({"a": w, "b": t}, inplace=True)
    with pytest.raises(CollectiveInputError, match="several backends"):
        md.allreduce([[_a([1.0], "float64", 0)], [torch.ones(1, dtype=torch.float64)]])
    assert np.array_equal(w, np.zeros(2)) and torch.equal(t, torch.zeros(2))


def test_the_record_carries_the_leaf_count_and_signature() -> None:
    from multidev.distributed.consistency import Call

    c = Call("allreduce", op="mean", tkind="cpu", leaves=10, sig=(1 << 62) - 1, seq=4)
    assert Call.decode(c.encode()) == c
    assert len(c.encode()) == len(Call("barrier").encode())
    assert Call.decode(Call("allreduce", op="sum", dtype="float32", shape=(2,)).encode()).leaves is None
    states = _states()
    from multidev.structured import structure_leaves

    one, other = structure_leaves(states[0], "t"), structure_leaves(states[1], "t")
    assert one.signature() == other.signature()  # same dtypes and shapes, on another device each
    changed = structure_leaves({**states[1], "conv.bias": _a(np.zeros(7), "float32", 1)}, "t")
    assert changed.signature() != one.signature() and 0 <= one.signature() < 1 << 62


# -- the bucket plan, shared with data parallelism --------------------------------------------------
def test_plan_buckets_groups_by_dtype_and_device_under_the_cap() -> None:
    b = md.backend("numpy")
    ts = [_a(np.zeros(10), "float32", 0), _a(np.zeros(10), "float64", 0), _a(np.zeros(10), "float32", 0),
          _a(np.zeros(10), "float32", 1), _a(np.zeros(100), "float32", 0)]
    assert buckets.plan_buckets(b, ts, 80) == [[0, 2], [1], [3], [4]]
    assert buckets.plan_buckets(b, ts, 80, reverse=True) == [[4], [3], [2, 0], [1]]
    flat = buckets.flatten(b, ts[:3])
    assert _host(flat).shape == (30,)
    back = buckets.unflatten(b, buckets.flatten(b, [ts[0], ts[2]]), [(2, 5), (10,)])
    assert [np.asarray(x).shape for x in back] == [(2, 5), (10,)]


def test_the_first_bucket_closes_once_it_holds_first_bytes_as_ddp_does() -> None:
    """An MLP's gradients last layer first (bias 40 B, weight 20 KiB, bias 2 KiB, weight 1 MiB, bias
    2 KiB, weight 1.5 MiB): DDP's first bucket (1 MiB) takes the tensor that crosses it, so the
    first collective starts before the first layer's backward; the rest keep the cap's rule."""
    b = md.backend("numpy")
    sizes = [784 * 512, 512, 512 * 512, 512, 512 * 10, 10]  # parameters in model order (float32)
    ts = [_a(np.zeros(n), "float32", 0) for n in sizes]
    assert buckets.plan_buckets(b, ts, 25 * 2**20, reverse=True) == [[5, 4, 3, 2, 1, 0]]
    assert buckets.plan_buckets(b, ts, 25 * 2**20, reverse=True, first_bytes=2**20) == [[5, 4, 3, 2], [1, 0]]
    # a cap below the first size: the cap's own rule (a user's small bucket_mb is kept)
    assert buckets.plan_buckets(b, ts, 4096, reverse=True, first_bytes=2**20) == [[5], [4], [3], [2], [1], [0]]
    assert buckets.plan_buckets(b, ts, 4096, reverse=True) == [[5], [4], [3], [2], [1], [0]]
    # each dtype and device has its own first bucket
    two = [_a(np.zeros(200_000), "float32", 0), _a(np.zeros(200_000), "float32", 1)] * 3
    assert buckets.plan_buckets(b, two, 25 * 2**20, first_bytes=2**20) == [[0, 2], [1, 3], [4], [5]]
    from multidev.data_parallel import plan_buckets as dp_plan

    class Rep:
        backend = b
    assert dp_plan(Rep(), ts, 25 * 2**20, reverse=True) == [[5, 4, 3, 2], [1, 0]]  # type: ignore[arg-type]


def test_data_parallel_keeps_its_plan_buckets_name() -> None:
    from multidev.data_parallel import DEFAULT_BUCKET_MB, plan_buckets

    assert DEFAULT_BUCKET_MB == buckets.DEFAULT_BUCKET_MB and callable(plan_buckets)


# -- across processes: 2 gloo processes on the torch engine ---------------------------------------
@pytest.mark.multiprocess
def test_structures_across_two_gloo_processes(tmp_path: Path) -> None:
    from multidev.conformance.test_distributed import engine_unavailable, worker_env

    why = engine_unavailable("torch")
    if why:
        pytest.skip(why)
    worker = str(Path(__file__).with_name("structs_worker.py"))
    cmd = [sys.executable, "-m", "multidev.distributed.launch", "-n", "2", "--engine", "torch", "--grace", "10",
           worker, str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=worker_env())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    for r in range(2):
        report = json.loads((tmp_path / f"report-{r}.json").read_text())
        assert len(report) >= 14
        bad = {k: v for k, v in report.items() if v != "OK" and not v.startswith("SKIP")}
        assert not bad, f"rank {r}:\n" + "\n".join(f"{k}: {v}" for k, v in bad.items())


@pytest.mark.multiprocess
@pytest.mark.parametrize("engine", ["torch", "mpi", "jax"])
def test_every_collective_over_structures_on_every_engine(engine: str, tmp_path: Path) -> None:
    """tests/structs_engines_worker.py on 2 processes of ``engine`` (gloo for torch, mpiexec for mpi,
    JAX's CPU collectives over gloo): reduce, allgather, gather, reduce_scatter, scatter, allreduce
    and broadcast of structures, each against the per-tensor calls, one exchange per call."""
    from multidev.conformance.test_distributed import engine_unavailable, worker_env

    why = engine_unavailable(engine)
    if why:
        pytest.skip(why)
    worker = str(Path(__file__).with_name("structs_engines_worker.py"))
    cmd = [sys.executable, "-m", "multidev.distributed.launch", "-n", "2", "--engine", engine, "--grace", "10",
           worker, str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=worker_env(JAX_PLATFORMS="cpu"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    for r in range(2):
        report = json.loads((tmp_path / f"report-{r}.json").read_text())
        assert report.pop("engine") == engine and len(report) >= 9
        bad = {k: v for k, v in report.items() if v != "OK"}
        assert not bad, f"rank {r}:\n" + "\n".join(f"{k}: {v}" for k, v in bad.items())


def test_a_reduction_checks_its_op_without_leaves_too(solo: list[int]) -> None:
    """An unknown or missing op is refused for a structure as for one tensor, with no leaves as
    with some (a typed CollectiveInputError, never the record's own ValueError), and the group
    stays usable."""
    for x in ([], {}, [np.ones(2, np.float32)]):
        for op in ("xx", None, 3):
            with pytest.raises(md.CollectiveInputError, match="unknown op"):
                dist.allreduce(x, op=op)  # type: ignore[arg-type]
            with pytest.raises(md.CollectiveInputError, match="unknown op"):
                dist.reduce_scatter(x, op=op)  # type: ignore[arg-type]
    assert np.array_equal(dist.allreduce(np.ones(2, np.float32)), np.ones(2))
