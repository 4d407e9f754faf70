"""One rank of tests/test_collectives_structures.py's multi-process cases: ``dist.allreduce``,
``dist.broadcast`` and ``dist.allgather`` of structures on the torch engine (gloo), every check run on every rank in the
same order, each rank writing ``{check: "OK" or its traceback}`` to ``OUT/report-RANK.json``
(argv[1]). The engine's consistency exchange is wrapped to count the exchanges of each call."""
from __future__ import annotations

import collections
import importlib.util
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from multidev import distributed as dist
from multidev.distributed import collectives as dc
from multidev.distributed.group import current
from multidev.errors import (
    CapabilityError,
    CollectiveInputError,
    CollectiveMismatchError,
    DistributedError,
    UnsupportedTensorError,
)

OUT = Path(sys.argv[1])
dist.init(timeout=60)
RANK, WORLD = dist.rank(), dist.world_size()
results: dict[str, str] = {}
exchanges: list[int] = []
_real_exchange = current().engine.exchange


def _counting(seq: int, row: Any, timeout: float) -> Any:
    exchanges.append(seq)
    return _real_exchange(seq, row, timeout)


current().engine.exchange = _counting  # type: ignore[method-assign]


def check(fn: Any) -> Any:
    try:
        fn()
        results[fn.__name__] = "OK"
    except Exception:  # noqa: BLE001 - reported to the test
        results[fn.__name__] = traceback.format_exc(limit=8)
    return fn


def lenet(seed: int) -> dict[str, torch.Tensor]:
    """D2L's LeNet's state_dict (10 tensors, 61,706 float32 values), different on every seed."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 5, padding=2), torch.nn.Sigmoid(), torch.nn.AvgPool2d(2, 2),
        torch.nn.Conv2d(6, 16, 5), torch.nn.Sigmoid(), torch.nn.AvgPool2d(2, 2), torch.nn.Flatten(),
        torch.nn.Linear(16 * 5 * 5, 120), torch.nn.Sigmoid(), torch.nn.Linear(120, 84), torch.nn.Sigmoid(),
        torch.nn.Linear(84, 10))
    return net.state_dict()


def counted(fn: Any) -> tuple[Any, int]:
    before = len(exchanges)
    out = fn()
    return out, len(exchanges) - before


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.device == b.device and a.shape == b.shape
    assert torch.equal(a, b), (a, b)


def usable() -> None:
    """The group still works after a refused call."""
    y = dist.allreduce(torch.ones(3))
    assert torch.equal(y, torch.full((3,), float(WORLD)))


@check
def state_dict_equals_per_tensor_bitwise() -> None:
    sd = lenet(RANK)
    before = {k: v.clone() for k, v in sd.items()}
    for op in ("sum", "mean", "max"):
        y, n = counted(lambda op=op: dist.allreduce(sd, op))
        assert n == 1, f"{op}: {n} exchanges for one structure"
        per, m = counted(lambda op=op: {k: dist.allreduce(v, op) for k, v in sd.items()})
        assert m == len(sd) == 10
        assert type(y) is type(sd) and list(y) == list(sd)
        for k in sd:
            same(y[k], per[k])
            assert y[k].data_ptr() != sd[k].data_ptr()
    for k in sd:
        same(sd[k], before[k])  # the inputs are unchanged


@check
def many_buckets_still_one_exchange() -> None:
    sd = lenet(RANK)
    old = dc.DEFAULT_BUCKET_MB
    dc.DEFAULT_BUCKET_MB = 2 / 1024  # 2 KiB: the small tensors share buckets, the large ones go alone
    try:
        y, n = counted(lambda: dist.allreduce(sd, "sum"))
    finally:
        dc.DEFAULT_BUCKET_MB = old
    assert n == 1
    for k, v in sd.items():
        same(y[k], dist.allreduce(v, "sum"))


Pair = collections.namedtuple("Pair", "x y")


@check
def nested_containers_mixed_dtypes() -> None:
    r = RANK + 1
    s = {"a": (torch.full((2, 2), float(r)), None, [torch.arange(3, dtype=torch.int32) * r]),
         "p": Pair(torch.tensor(float(r), dtype=torch.float64), torch.ones(4, dtype=torch.bfloat16) * r)}
    y, n = counted(lambda: dist.allreduce(s))
    assert n == 1
    total = sum(range(1, WORLD + 1))
    assert type(y) is dict and type(y["a"]) is tuple and y["a"][1] is None and type(y["a"][2]) is list
    assert type(y["p"]) is Pair
    same(y["a"][0], torch.full((2, 2), float(total)))
    same(y["a"][2][0], torch.arange(3, dtype=torch.int32) * total)
    same(y["p"].x, torch.tensor(float(total), dtype=torch.float64))
    same(y["p"].y, torch.ones(4, dtype=torch.bfloat16) * total)


@check
def inplace_writes_every_leaf() -> None:
    sd = lenet(RANK)
    expect = {k: dist.allreduce(v, "mean") for k, v in sd.items()}
    ptrs = {k: v.data_ptr() for k, v in sd.items()}
    res, n = counted(lambda: dist.allreduce(sd, "mean", inplace=True))
    assert n == 1 and res is sd
    for k, v in sd.items():
        assert v.data_ptr() == ptrs[k]
        same(v, expect[k])


@check
def async_returns_the_structure() -> None:
    sd = lenet(RANK)
    w = dist.allreduce(sd, async_op=True)
    assert isinstance(w, dist.Work)
    y = w.wait()
    assert list(y) == list(sd)
    for k, v in sd.items():
        same(y[k], dist.allreduce(v))
    w = dist.broadcast([sd["0.weight"], sd["0.bias"]], src=0, inplace=True, async_op=True)
    out = w.wait()
    assert isinstance(out, list) and out[0] is sd["0.weight"]
    same(sd["0.bias"], lenet(0)["0.bias"])


@check
def broadcast_from_rank_one() -> None:
    sd = lenet(RANK)
    y, n = counted(lambda: dist.broadcast(sd, src=1))
    assert n == 1
    want = lenet(1)
    for k in sd:
        same(y[k], want[k])
    res = dist.broadcast(sd, src=1, inplace=True)
    assert res is sd
    for k in sd:
        same(sd[k], want[k])


@check
def mismatched_shapes_fail_on_every_rank() -> None:
    s = {"w": torch.ones(2 + RANK), "b": torch.zeros(3)}
    before = len(exchanges)
    try:
        dist.allreduce(s)
    except CollectiveMismatchError as e:
        assert "structure" in str(e), e
        assert len(exchanges) - before == 1  # the one exchange found it: nothing was sent
    else:
        raise AssertionError("no error")
    usable()


@check
def mismatched_leaf_count_fails_on_every_rank() -> None:
    s = [torch.ones(2) for _ in range(2 + RANK)]
    try:
        dist.allreduce(s)
    except CollectiveMismatchError as e:
        assert "2 tensors" in str(e) and "3 tensors" in str(e), e
    else:
        raise AssertionError("no error")
    usable()


@check
def tensor_against_structure_fails_on_every_rank() -> None:
    x: Any = torch.ones(2) if RANK == 0 else [torch.ones(2)]
    try:
        dist.allreduce(x)
    except CollectiveMismatchError as e:
        assert "one tensor" in str(e), e
    else:
        raise AssertionError("no error")
    usable()


@check
def bad_leaf_refused_on_its_rank_others_told() -> None:
    keep = torch.ones(2)
    s = {"w": keep, "n": 3 if RANK == 1 else torch.zeros(1)}
    try:
        dist.allreduce(s, inplace=True)
    except UnsupportedTensorError as e:
        assert RANK == 1 and "['n']" in str(e), e
    except DistributedError as e:
        assert RANK != 1 and "rank 1" in str(e), e
    else:
        raise AssertionError("no error")
    assert torch.equal(keep, torch.ones(2))  # nothing written
    usable()


@check
def mean_of_integers_refused_everywhere() -> None:
    s = [torch.ones(2), torch.arange(3)]
    try:
        dist.allreduce(s, "mean")
    except CollectiveInputError as e:
        assert "int64" in str(e), e
    else:
        raise AssertionError("no error")
    usable()


@check
def allgather_of_a_state_dict_joins_each_tensor() -> None:
    sd = lenet(RANK)
    y, n = counted(lambda: dist.allgather(sd))
    assert n == 1 and type(y) is type(sd) and list(y) == list(sd)
    for k, v in sd.items():
        same(y[k], dist.allgather(v))
    usable()


@check
def empty_structure_is_agreed_and_sends_nothing() -> None:
    s: dict[str, Any] = {"a": [], "b": None}
    y, n = counted(lambda: dist.allreduce(s))
    assert n == 1 and y == {"a": [], "b": None} and y is not s
    assert dist.allreduce(s, inplace=True) is s


@check
def numpy_structure_travels_and_comes_back_numpy() -> None:
    s = (np.full(3, RANK + 1.0, dtype=np.float32), np.arange(4, dtype=np.float64))
    y = dist.allreduce(s)
    total = sum(range(1, WORLD + 1))
    assert type(y) is tuple and all(isinstance(v, np.ndarray) for v in y)
    assert y[0].dtype == np.float32 and np.array_equal(y[0], np.full(3, total, dtype=np.float32))
    assert np.array_equal(y[1], np.arange(4.0) * WORLD)
    res = dist.allreduce(s, inplace=True)
    assert res is s and np.array_equal(s[0], np.full(3, total, dtype=np.float32))


if importlib.util.find_spec("jax") is not None:
    @check
    def jax_pytree() -> None:
        import jax.numpy as jnp

        tree = {"w": jnp.full((2, 3), RANK + 1.0), "b": [jnp.arange(3.0)]}
        y, n = counted(lambda: dist.allreduce(tree, "mean"))
        assert n == 1 and type(y["w"]).__module__.startswith("jax")
        assert np.array_equal(np.asarray(y["w"]), np.full((2, 3), (WORLD + 1) / 2))
        try:
            dist.allreduce(tree, inplace=True)
        except CapabilityError as e:
            assert "immutable" in str(e), e
        else:
            raise AssertionError("no error")
        usable()
else:
    results["jax_pytree"] = "SKIP: JAX is not installed"

(OUT / f"report-{RANK}.json").write_text(json.dumps(results))
dist.shutdown()
