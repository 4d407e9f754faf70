"""One rank of tests/test_collectives_structures.py's cases on every engine: each collective of
``multidev.distributed`` over a structure (reduce, allgather, gather, reduce_scatter, scatter, and
allreduce/broadcast) against the same collective called once per tensor, bitwise, with one
consistency exchange per structure call, on the engine's own tensors (torch on the torch engine,
JAX arrays on the jax engine, NumPy on the mpi engine) and NumPy arrays. float32 and int32 only (the
jax engine carries no 64-bit dtypes by default). Writes ``{check: "OK" or its traceback}`` to
``OUT/report-RANK.json`` (argv[1])."""
from __future__ import annotations

import collections
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

import multidev as md
from multidev import distributed as dist
from multidev.distributed import collectives as dc
from multidev.distributed.group import current
from multidev.errors import CollectiveInputError, CollectiveMismatchError
from multidev.structured import structure_leaves

OUT = Path(sys.argv[1])
dist.init(timeout=60)
RANK, WORLD = dist.rank(), dist.world_size()
NATIVE = {"torch": "torch", "jax": "jax"}.get(dist.engine_name(), "numpy")
results: dict[str, str] = {"engine": dist.engine_name()}
exchanges: list[int] = []
_real_exchange = current().engine.exchange


def _counting(seq: int, row: Any, timeout: float) -> Any:
    exchanges.append(seq)
    return _real_exchange(seq, row, timeout)


current().engine.exchange = _counting  # type: ignore[method-assign]
Pair = collections.namedtuple("Pair", "x y")


def check(fn: Any, backends: tuple[str, ...] = (NATIVE, "numpy")) -> Any:
    # JAX arrays' eager reshapes and joins compile per shape (seconds per check): on the jax engine
    # the checks run on NumPy leaves (JAX arrays on the wire all the same), and jax_pytree on JAX's.
    for backend in dict.fromkeys(b for b in backends if b != "jax"):
        name = f"{fn.__name__}[{backend}]"
        t0 = time.perf_counter()
        try:
            fn(backend)
            results[name] = "OK"
            print(f"{name}: {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        except Exception:  # noqa: BLE001 - reported to the test
            results[name] = traceback.format_exc(limit=8)
    return fn


def arr(values: Any, dtype: str, backend: str) -> Any:
    return md.asarray(np.asarray(values), dtype=dtype, backend=backend)


def ragged(backend: str, rank: int = RANK) -> dict[str, Any]:
    """This rank's structure: lengths along axis 0 that differ by rank and by leaf; int32 and float32."""
    rng = np.random.default_rng(rank)
    return {"w": arr(rng.standard_normal((2 + rank, 3)), "float32", backend),
            "b": [arr(rng.standard_normal(1 + 2 * rank), "float32", backend), None],
            "p": Pair(arr(np.arange(3 + rank) * (rank + 1), "int32", backend),
                      arr(rng.standard_normal((1 + rank, 2, 2)), "float32", backend))}


def even(backend: str, rank: int = RANK) -> dict[str, Any]:
    """The same shapes on every rank (lengths that do not divide by the world size), values by rank."""
    rng = np.random.default_rng(10 + rank)
    return {"w": arr(rng.standard_normal((5, 3)), "float32", backend),
            "b": [arr(rng.standard_normal(7), "float32", backend), None],
            "p": Pair(arr(np.arange(4) * (rank + 1), "int32", backend), arr(rng.random((3, 2)), "float32", backend))}


def leaves(x: Any) -> list[Any]:
    return structure_leaves(x, "worker").tensors


def counted(fn: Any) -> tuple[Any, int]:
    before = len(exchanges)
    out = fn()
    return out, len(exchanges) - before


def same_structure(got: Any, want_leaves: list[Any], like: Any) -> None:
    assert type(got) is dict and list(got) == list(like), got
    assert type(got["b"]) is list and got["b"][1] is None and type(got["p"]) is Pair
    mine = leaves(got)
    assert len(mine) == len(want_leaves)
    for g, w in zip(mine, want_leaves):
        assert md.backend_of(g).name == md.backend_of(w).name and md.dtype_of(g) == md.dtype_of(w)
        assert md.device_of(g) == md.device_of(w)
        a, b = np.asarray(md.to_numpy(g)), np.asarray(md.to_numpy(w))
        assert a.shape == b.shape and np.array_equal(a, b), (a, b)


def usable() -> None:
    y = dist.allreduce(np.ones(3, np.float32))
    assert np.array_equal(y, np.full(3, float(WORLD), np.float32))


@check
def allreduce_and_broadcast(backend: str) -> None:
    s = even(backend)
    y, n = counted(lambda: dist.allreduce(s, "max"))
    assert n == 1
    same_structure(y, [dist.allreduce(t, "max") for t in leaves(s)], s)
    y, n = counted(lambda: dist.broadcast(s, src=WORLD - 1))
    assert n == 1
    same_structure(y, leaves(even(backend, WORLD - 1)), s)


@check
def reduce_to_the_last_rank(backend: str) -> None:
    s = even(backend)
    dst = WORLD - 1
    y, n = counted(lambda: dist.reduce(s, dst, "sum"))
    assert n == 1
    per = [dist.reduce(t, dst, "sum") for t in leaves(s)]
    if dst == RANK:
        same_structure(y, per, s)
    else:
        assert y is None and all(p is None for p in per)
    w = dist.reduce({"w": s["w"]}, 0, "mean", async_op=True)
    assert isinstance(w, dist.Work)
    got = w.wait()
    assert (got is None) == (RANK != 0)


@check
def allgather_of_ragged_leaves(backend: str) -> None:
    s = ragged(backend)
    y, n = counted(lambda: dist.allgather(s))
    assert n == 1
    same_structure(y, [dist.allgather(t) for t in leaves(s)], s)
    e = even(backend)
    w = dist.allgather(e, axis=-1, async_op=True)  # each leaf's last axis
    assert isinstance(w, dist.Work)
    same_structure(w.wait(), [dist.allgather(t, axis=-1) for t in leaves(e)], e)


@check
def gather_on_rank_zero(backend: str) -> None:
    s = ragged(backend)
    y, n = counted(lambda: dist.gather(s, 0))
    assert n == 1
    per = [dist.gather(t, 0) for t in leaves(s)]
    if RANK == 0:
        same_structure(y, per, s)
        # every rank's own structure, joined: what the ranks hold
        rows = [np.asarray(md.to_numpy(ragged(backend, r)["w"])) for r in range(WORLD)]
        assert np.array_equal(np.asarray(md.to_numpy(y["w"])), np.concatenate(rows))
    else:
        assert y is None


@check
def many_leaves_send_their_lengths_once(backend: str) -> None:
    s = [arr(np.full(1 + (i + RANK) % 3, i, np.float32), "float32", backend) for i in range(40)]  # > 32 leaves
    y, n = counted(lambda: dist.allgather(s))
    assert n == 1 and type(y) is list and len(y) == 40
    for i, g in enumerate(y):  # every rank's leaf i, joined (computed here: no per-leaf calls to compile)
        want = np.concatenate([np.full(1 + (i + r) % 3, i, np.float32) for r in range(WORLD)])
        assert np.array_equal(np.asarray(md.to_numpy(g)), want)


@check
def reduce_scatter_leaf_by_leaf(backend: str) -> None:
    s = even(backend)
    for op in ("sum", "max"):
        y, n = counted(lambda op=op: dist.reduce_scatter(s, op))
        assert n == 1
        same_structure(y, [dist.reduce_scatter(t, op) for t in leaves(s)], s)


@check
def scatter_from_the_last_rank(backend: str) -> None:
    s = even(backend)
    src = WORLD - 1
    for axis in (0, -1):
        y, n = counted(lambda axis=axis: dist.scatter(s, src, axis))
        assert n == 1
        same_structure(y, [dist.scatter(t, src, axis) for t in leaves(s)], s)


@check
def small_buckets_give_the_same_results(backend: str) -> None:
    old = dc.DEFAULT_BUCKET_MB
    dc.DEFAULT_BUCKET_MB = 24 / 2**20  # 24 bytes: most leaves alone, a few sharing
    try:
        s, r = even(backend), ragged(backend)
        got = [dist.reduce_scatter(s), dist.scatter(s, 0), dist.allgather(r), dist.reduce(s, 0)]
    finally:
        dc.DEFAULT_BUCKET_MB = old
    same_structure(got[0], [dist.reduce_scatter(t) for t in leaves(s)], s)
    same_structure(got[1], [dist.scatter(t, 0) for t in leaves(s)], s)
    same_structure(got[2], [dist.allgather(t) for t in leaves(r)], r)
    per = [dist.reduce(t, 0) for t in leaves(s)]
    if RANK == 0:
        same_structure(got[3], per, s)


@check
def mismatches_fail_on_every_rank(backend: str) -> None:
    bad = {"w": arr(np.zeros((2, 3 + RANK)), "float32", backend)}  # other dims differ: no gather
    try:
        dist.allgather(bad)
    except CollectiveMismatchError as e:
        assert "structure" in str(e), e
    else:
        raise AssertionError("no error")
    usable()
    x = even(backend) if RANK == 0 else None  # a structure's scatter needs one on every rank
    try:
        dist.scatter(x, 0)
    except CollectiveMismatchError as e:
        assert "containers cannot travel" in str(e), e
    else:
        raise AssertionError("no error")
    usable()
    odd = {"w": arr(np.zeros(2), "float32", backend)} if RANK == 0 else {"w": arr(np.zeros(2), "int32", backend)}
    try:
        dist.reduce(odd, 0)
    except CollectiveMismatchError as e:
        assert "structure" in str(e), e
    else:
        raise AssertionError("no error")
    usable()
    try:
        dist.reduce_scatter({"s": arr(1.0, "float32", backend)})  # a 0-d leaf cannot be cut: every rank refuses
    except CollectiveInputError as e:
        assert "tensor 0" in str(e) and "0-d" in str(e), e
    else:
        raise AssertionError("no error")
    usable()


if NATIVE == "jax":
    def jax_pytree(backend: str) -> None:
        import jax.numpy as jnp

        tree = {"w": jnp.full((2 + RANK, 3), RANK + 1.0), "b": (jnp.arange(4.0) * (RANK + 1), None)}
        y, n = counted(lambda: dist.allgather(tree))
        assert n == 1 and type(y) is dict and type(y["b"]) is tuple and y["b"][1] is None
        assert type(y["w"]).__module__.startswith("jax")
        rows = np.concatenate([np.full((2 + r, 3), r + 1.0, np.float32) for r in range(WORLD)])
        assert np.array_equal(np.asarray(y["w"]), rows)
        piece = dist.reduce_scatter({"b": tree["b"][0]})["b"]
        want = np.array_split(np.arange(4.0, dtype=np.float32) * sum(range(1, WORLD + 1)), WORLD)[RANK]
        assert np.array_equal(np.asarray(piece), want)

    check(jax_pytree, ("numpy",))

(OUT / f"report-{RANK}.json").write_text(json.dumps(results))
dist.shutdown()
