"""NumPy's one-pass allreduce over its virtual devices (``shared_memory_allreduce``, which the core's
allreduce calls where a backend has it): the same values, dtypes, devices and types as the portable
algorithms in every reduction order, in place writing the inputs without allocating, new results
disjoint, and the inputs it declines left to the portable path."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import collectives as C
from multidev.adapters import numpy as npb
from multidev.errors import CollectiveInputError
from multidev.validate import check_op

DTYPES = ["float32", "float16", "float64", "int8", "uint8", "int64", "bool", "complex64",
          *(["bfloat16"] if "bfloat16" in md.backend("numpy").capabilities.dtypes else [])]  # (ml_dtypes)
SHAPES = [(7,), (3, 5), (2, 33), (0,), (1,)]


@pytest.fixture(autouse=True)
def eight_devices() -> Any:
    old = len(md.devices(backend="numpy"))
    npb.set_device_count(8)
    yield md.devices(backend="numpy")
    npb.set_device_count(old)


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 16 bytes: every tensor here spans several blocks and ring chunks cross them."""
    monkeypatch.setattr(npb, "_BLOCK_BYTES", 16)
    monkeypatch.setattr(npb, "host_threads", lambda: 1 << 16)  # (blocks are cut about one per thread)


def _inputs(n: int, shape: tuple[int, ...], dtype: str, seed: int = 0) -> list[Any]:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        hs = [rng.random(shape) > 0.5 for _ in range(n)]
    elif dtype[0] in "iu":
        hs = [rng.integers(0 if dtype[0] == "u" else -120, 120, shape) for _ in range(n)]
    elif dtype.startswith("complex"):
        hs = [rng.random(shape) + 1j * rng.random(shape) for _ in range(n)]
    else:
        hs = [rng.random(shape) * 10 for _ in range(n)]
    return [md.asarray(h, dtype=dtype, device=f"cpu:{i}", backend="numpy") for i, h in enumerate(hs)]


def _bits(x: Any) -> bytes:
    return np.ascontiguousarray(np.asarray(x)).tobytes()


def _portable(monkeypatch: pytest.MonkeyPatch, fn: Any) -> Any:
    """``fn()`` with NumPy's one-pass path switched off: the portable algorithms."""
    with monkeypatch.context() as m:
        m.delattr(npb.NumpyBackend, "shared_memory_allreduce")
        return fn()


def _same(got: list[Any], ref: list[Any]) -> None:
    b = md.backend("numpy")
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert type(g) is type(r) and g.dtype == r.dtype and g.shape == r.shape
        assert b.device_of(g) == b.device_of(r)
        assert _bits(g) == _bits(r)  # bitwise: the same reduction order


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("alg", ["naive", "ring", "tree"])
def test_values_are_the_portable_algorithms_bit_for_bit(monkeypatch: pytest.MonkeyPatch, small_blocks: None,
                                                        n: int, alg: str) -> None:
    ran = []
    fused = npb.NumpyBackend.shared_memory_allreduce

    def spy(self: Any, *a: Any, **k: Any) -> Any:
        ran.append(1)
        return fused(self, *a, **k)

    monkeypatch.setattr(npb.NumpyBackend, "shared_memory_allreduce", spy)
    for dtype in DTYPES:
        for shape in SHAPES:
            xs = _inputs(n, shape, dtype, seed=n)
            for op in C.OPS:
                try:
                    check_op(op, dtype, "test")
                except CollectiveInputError:
                    continue
                with np.errstate(all="ignore"):
                    ref = _portable(monkeypatch, lambda xs=xs, op=op: md.allreduce(xs, op, algorithm=alg))
                    before = len(ran)
                    got = md.allreduce(xs, op, algorithm=alg)
                    assert len(ran) == before + 1  # the one-pass path ran
                    _same(got, ref)
                    ys = [md.copy(x) for x in xs]
                    out = md.allreduce(ys, op, algorithm=alg, inplace=True)
                    assert all(o is y for o, y in zip(out, ys))
                    _same(ys, ref)


def test_in_place_writes_each_input_and_allocates_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    b = md.backend("numpy")
    xs = _inputs(4, (1000,), "float32")
    ref = md.allreduce(xs, "sum", algorithm="naive")
    buffers = [np.asarray(x).__array_interface__["data"][0] for x in xs]
    made = []
    for name in ("move", "copy", "empty", "full", "asarray", "combine", "concat", "assign"):
        real = getattr(b, name)
        monkeypatch.setattr(b, name, lambda *a, _n=name, _f=real, **k: made.append(_n) or _f(*a, **k))
    real_aligned = npb._aligned
    monkeypatch.setattr(npb, "_aligned", lambda *a, **k: made.append("_aligned") or real_aligned(*a, **k))
    for alg in ("naive", "ring", "tree", "auto"):
        out = md.allreduce(list(xs), "sum", algorithm=alg, inplace=True)
        assert all(o is x for o, x in zip(out, xs)), alg  # the inputs themselves come back
        assert [np.asarray(x).__array_interface__["data"][0] for x in xs] == buffers  # the same memory
        assert made == [], f"{alg}: in place called {made}"  # no result array made, nothing assigned after
        assert [b.device_of(x).index for x in xs] == [0, 1, 2, 3]
        for x, r in zip(xs, ref):
            np.testing.assert_allclose(np.asarray(x), np.asarray(r), rtol=1e-6)  # (orders differ)
        for x, h in zip(xs, _inputs(4, (1000,), "float32")):  # back to ref's inputs for the next algorithm
            np.copyto(np.asarray(x), np.asarray(h))
        made.clear()


def test_new_results_are_disjoint_aligned_and_on_their_devices() -> None:
    b = md.backend("numpy")
    xs = _inputs(8, (3, 101), "float64")
    out = md.allreduce(xs, "sum", algorithm="naive")
    for i, y in enumerate(out):
        assert b.device_of(y) == b.device_of(xs[i]) and y.flags.c_contiguous and y.flags.writeable
        assert np.asarray(y).__array_interface__["data"][0] % md.adapter.HOST_ALIGNMENT == 0
        for z in [*out[i + 1:], *xs]:
            assert not np.shares_memory(np.asarray(y), np.asarray(z))
    out[0][0, 0] = -1.0  # a write to one result leaves the others
    assert all(float(y[0, 0]) != -1.0 for y in out[1:])


def test_mean_of_integers_is_refused_and_writes_nothing() -> None:
    xs = _inputs(4, (10,), "int32")
    before = [_bits(x) for x in xs]
    for inplace in (False, True):
        with pytest.raises(CollectiveInputError, match="mean"):
            md.allreduce(xs, "mean", inplace=inplace)
    assert [_bits(x) for x in xs] == before


def test_deterministic_runs_are_bitwise_equal_and_auto_takes_naive(eight_devices: list[Any]) -> None:
    b = md.backend("numpy")
    xs = _inputs(8, (4099,), "float32", seed=3)
    assert C.choose_algorithm(b, (4099,), "float32", eight_devices, deterministic=True) == "naive"
    assert C.choose_algorithm(b, (4099,), "float32", eight_devices[:2]) == "naive"
    assert C.choose_algorithm(b, (3,), "float32", eight_devices[:4]) == "tree"  # fewer elements than devices
    first = md.allreduce(xs, "sum", deterministic=True)
    _same(md.allreduce(xs, "sum", deterministic=True), first)
    _same(md.allreduce(xs, "sum", algorithm="naive"), first)


def test_inputs_it_declines_take_the_portable_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strided inputs, 0-d inputs, and in place inputs that overlap: the one pass declines (None)
    and the portable algorithm gives today's results."""
    b = md.backend("numpy")
    strided = [md.asarray(np.arange(20.0) * (i + 1), device=f"cpu:{i}", backend="numpy")[::2] for i in range(3)]
    assert b.shared_memory_allreduce(strided, "sum", [(0, 10, ((0, 1), 2))], None, False) is None
    ref = _portable(monkeypatch, lambda: md.allreduce(strided, "sum", algorithm="ring"))
    _same(md.allreduce(strided, "sum", algorithm="ring"), ref)
    scalars = [md.asarray(np.float32(i + 1.5), device=f"cpu:{i}", backend="numpy") for i in range(2)]
    assert b.shared_memory_allreduce(scalars, "sum", [(0, 1, (0, 1))], None, False) is None
    _same(md.allreduce(scalars, "sum"), _portable(monkeypatch, lambda: md.allreduce(scalars, "sum")))
    base = np.arange(30.0)
    over = [npb._tag(base[:20], md.Device("cpu", 0)), npb._tag(base[10:], md.Device("cpu", 1))]
    assert b.shared_memory_allreduce(over, "sum", [(0, 20, (0, 1))], None, True) is None
    want = np.arange(20.0) + np.arange(10.0, 30.0)
    md.allreduce(over, "sum", algorithm="naive", inplace=True)
    np.testing.assert_array_equal(np.asarray(over[1]), want)  # written last, whole
    np.testing.assert_array_equal(base[20:], want[10:])


def test_structures_in_place_and_not(small_blocks: None) -> None:
    b = md.backend("numpy")
    trees = [{"w": _inputs(3, (5, 4), "float32", seed=i)[i], "b": _inputs(3, (4,), "float32", seed=9)[i]}
             for i in range(3)]
    total = {k: sum(np.asarray(t[k], dtype=np.float64) for t in trees) for k in ("w", "b")}
    out = md.allreduce(trees, "sum")
    for i, t in enumerate(out):
        for k in total:
            np.testing.assert_allclose(np.asarray(t[k]), total[k], rtol=1e-6)
            assert b.device_of(t[k]) == md.Device("cpu", i)
    res = md.allreduce(trees, "sum", inplace=True)
    assert res is trees or all(r is t for r, t in zip(res, trees))
    for t in trees:
        for k in total:
            np.testing.assert_allclose(np.asarray(t[k]), total[k], rtol=1e-6)


def test_in_place_under_raising_float_errors_writes_nothing_on_failure(small_blocks: None) -> None:
    """NumPy set to raise on overflow: the failure may come mid-way, so in place the one pass
    declines and the portable steps compute everything before writing (inputs bit-identical)."""
    xs = [md.asarray(np.ones(300), dtype="float16", device=f"cpu:{i}", backend="numpy") for i in range(3)]
    for x in xs:
        x[299] = 60000.0  # the overflow in the last block only: a one pass would have written the others
    before = [_bits(x) for x in xs]
    with np.errstate(over="raise"), pytest.raises(Exception) as e:
        md.allreduce(xs, "sum", algorithm="naive", inplace=True)
    assert "overflow" in str(e.value).lower()
    assert [_bits(x) for x in xs] == before


def test_check_op_refuses_the_same_pairs_after_passing_others() -> None:
    # check_op keeps the (op, dtype) pairs it passed (a hot path): a refused pair stays refused
    # however often the others pass, and an op that is no string is refused, not hashed
    names = ("bool", "int32", "float32", "complex64", "bfloat16")

    def refused() -> set[tuple[str, str]]:
        out = set()
        for dtype in names:
            for op in C.OPS:
                try:
                    check_op(op, dtype, "test")
                except CollectiveInputError:
                    out.add((op, dtype))
        return out
    first = refused()
    assert {("mean", "int32"), ("sum", "bool"), ("max", "complex64")} <= first
    assert refused() == first
    for bad in (["sum"], "avg", None):
        with pytest.raises(CollectiveInputError, match="unknown op"):
            check_op(bad, "float32", "test")
