"""Core tests of multidev.collectives on the NumPy backend: the algorithms' communication pattern,
the auto rule, split sizes, failure atomicity of inplace, and the distributed module's guards."""
from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import Device
from multidev import collectives as C
from multidev.adapters import numpy as npb
from multidev.errors import CapabilityError, CollectiveInputError


@pytest.fixture(autouse=True)
def four_devices() -> Any:
    old = len(md.devices(backend="numpy"))
    npb.set_device_count(4)
    yield md.devices(backend="numpy")
    npb.set_device_count(old)


@pytest.fixture
def portable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The portable algorithms as any backend runs them: NumPy's one-pass path over its shared memory
    (``shared_memory_allreduce``, tested in test_collectives_shared_memory.py) switched off."""
    monkeypatch.delattr(npb.NumpyBackend, "shared_memory_allreduce")


class _Spy:
    """Records every move/copy the collectives ask of the NumPy backend."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.moves: list[tuple[int, int]] = []
        self.copies = 0
        b = md.backend("numpy")
        move, copy = b.move, b.copy

        def spy_move(x: Any, d: Device) -> Any:
            self.moves.append((b.device_of(x).index, d.index))
            return move(x, d)

        def spy_copy(x: Any, d: Device) -> Any:
            self.copies += 1
            return copy(x, d)

        monkeypatch.setattr(b, "move", spy_move)
        monkeypatch.setattr(b, "copy", spy_copy)


def _xs(n: int, shape: tuple[int, ...] = (10,), dtype: str = "float32") -> list[Any]:
    return [md.asarray(np.full(shape, i + 1.0), dtype=dtype, device=f"cpu:{i}", backend="numpy") for i in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_moves_only_to_the_next_device(monkeypatch: pytest.MonkeyPatch, n: int, portable: None) -> None:
    spy = _Spy(monkeypatch)
    out = md.allreduce(_xs(n), algorithm="ring")
    assert spy.moves and all(dst == (src + 1) % n for src, dst in spy.moves)
    assert len(spy.moves) == 2 * n * (n - 1)  # n-1 reduce-scatter steps + n-1 allgather steps, n chunks each
    for y in out:
        np.testing.assert_array_equal(md.to_numpy(y), n * (n + 1) / 2)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_tree_and_naive_move_2n_minus_2_times(monkeypatch: pytest.MonkeyPatch, n: int, portable: None) -> None:
    spy = _Spy(monkeypatch)
    md.allreduce(_xs(n), algorithm="tree")
    assert len(spy.moves) == 2 * (n - 1)
    if n == 4:  # strides 1 then 2 up, 2 then 1 down
        assert spy.moves == [(1, 0), (3, 2), (2, 0), (0, 2), (0, 1), (2, 3)]
    spy.moves.clear()
    md.allreduce(_xs(n), algorithm="naive")
    assert sorted(spy.moves) == sorted([(i, 0) for i in range(1, n)] + [(0, i) for i in range(1, n)])


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """auto without a measured model: the built-in rule."""
    monkeypatch.setattr(C, "_MODEL", [{"version": 2, "models": {}}])
    monkeypatch.setattr(C, "_FITS", {})


def _model(monkeypatch: pytest.MonkeyPatch, per_n: dict[str, Any], backend: str = "numpy") -> None:
    monkeypatch.setattr(C, "_MODEL", [{"version": 2, "models": {backend: {"cpu": per_n}}}])
    monkeypatch.setattr(C, "_FITS", {})


def test_auto_chooses_from_the_measured_model(monkeypatch: pytest.MonkeyPatch, portable: None) -> None:
    """The least alpha + beta * bytes of the line of the size's band, at the nearest measured device
    count; native only where the backend has it and not deterministic."""
    b = md.backend("numpy")
    cpus = [Device("cpu", i) for i in range(4)]
    _model(monkeypatch, {"4": {"naive": [[None, 1e-5, 1e-9, 0.0, 3]],
                               "ring": [[1 << 20, 1e-3, 1e-12, 0.0, 3], [None, 1e-3, 1e-12, 0.0, 3]],
                               "tree": [[1 << 20, 1e-6, 2e-9, 0.0, 3], [None, 1.0, 1.0, 0.0, 3]],
                               "native": [[None, 0.0, 0.0, 0.0, 3]]}})
    assert C.choose_algorithm(b, (100,), "float32", cpus) == "tree"  # 400 B: tree's alpha is least
    assert C.choose_algorithm(b, (1 << 16,), "float32", cpus) == "naive"  # 256 KiB
    assert C.choose_algorithm(b, (1 << 24,), "float32", cpus) == "ring"  # 64 MiB: ring's beta wins
    assert C.choose_algorithm(b, (3,), "float32", cpus) == "tree"  # fewer elements than devices
    assert b.collectives is None  # so the model's native is never chosen
    assert C.choose_algorithm(b, (1 << 24,), "float32", cpus[:3]) == "ring"  # 3 devices: the model of 4
    _model(monkeypatch, {"2": {"naive": [[None, 0.0, 1e-9, 0.0, 3]]}}, backend="elsewhere")
    assert C.choose_algorithm(b, (1 << 24,), "float32", cpus) == "ring"  # no model for numpy: the rule


def test_the_model_file_the_environment_names_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, portable: None) -> None:
    import json

    f = tmp_path / "model.json"
    f.write_text(json.dumps({"version": 2, "models": {"numpy": {"cpu": {"2": {"tree": [[None, 0.0, 0.0, 0.0, 2]]}}}}}))
    monkeypatch.setenv("MULTIDEV_COLLECTIVE_MODEL", str(f))
    monkeypatch.setattr(C, "_MODEL", [])
    monkeypatch.setattr(C, "_FITS", {})
    cpus = [Device("cpu", i) for i in range(2)]
    assert C.cost_model()["models"]["numpy"]["cpu"]["2"]["tree"][0][1] == 0.0
    assert C.choose_algorithm(md.backend("numpy"), (1 << 24,), "float32", cpus) == "tree"


def test_the_shipped_model_covers_every_device_count_it_names() -> None:
    import json

    doc = json.loads(C.shipped_model_text())
    assert "/work/" not in json.dumps(doc) and "/home/" not in json.dumps(doc)  # no machine paths
    for kinds in doc["models"].values():
        for per_n in kinds.values():
            for n, algs in per_n.items():
                assert int(n) >= 2 and algs
                for segs in algs.values():
                    assert segs[-1][0] is None and all(g[1] >= 0 and g[2] >= 0 for g in segs)


def test_auto_rule(no_model: None, portable: None) -> None:
    b = md.backend("numpy")
    cpus = [Device("cpu", i) for i in range(4)]
    limit = C.AUTO_TREE_MAX_BYTES
    assert C.choose_algorithm(b, (limit // 4,), "float32", cpus) == "tree"
    assert C.choose_algorithm(b, (limit // 4 + 1,), "float32", cpus) == "ring"
    assert C.choose_algorithm(b, (limit // 8 + 1,), "float64", cpus) == "ring"
    assert C.choose_algorithm(b, (3,), "float32", cpus) == "tree"
    assert C.choose_algorithm(b, (), "float32", cpus) == "tree"

    class _Native:
        name = "fake"
        capabilities = md.Capabilities(mutable=True, async_execution=True, pinned_memory=False)
        collectives = object()  # a native allreduce (its concern)

    gpus = [Device("gpu", i) for i in range(4)]
    assert C.choose_algorithm(_Native(), (10,), "float32", gpus) == "native"
    assert C.choose_algorithm(_Native(), (10,), "float32", gpus, deterministic=True) == "tree"
    assert C.choose_algorithm(_Native(), (10,), "float32", cpus) == "tree"


@pytest.mark.parametrize("length", range(9))
@pytest.mark.parametrize("n", range(1, 6))
def test_split_sizes_match_array_split(length: int, n: int) -> None:
    assert C.split_sizes(length, n) == [len(p) for p in np.array_split(np.arange(length), n)]


def test_inplace_failure_on_a_read_only_input_writes_nothing() -> None:
    xs = _xs(3)
    xs[2].setflags(write=False)
    before = [np.array(x).tobytes() for x in xs]
    with pytest.raises(md.CapabilityError, match="input 2.*cannot be written"):
        md.allreduce(xs, inplace=True)
    assert [np.array(x).tobytes() for x in xs] == before


def test_single_tensor_gives_a_new_tensor() -> None:
    (x,) = _xs(1)
    for alg in ("naive", "ring", "tree", "auto"):
        (y,) = md.allreduce([x], op="mean", algorithm=alg)
        assert y is not x and not np.shares_memory(y, x)
        np.testing.assert_array_equal(y, x)
    (g,) = md.allgather([x])
    assert g is not x and not np.shares_memory(g, x)
    assert not np.shares_memory(md.gather([x], "cpu:0"), x)
    assert not np.shares_memory(md.scatter(x, ["cpu:0"])[0], x)


def test_deterministic_orders_are_documented() -> None:
    """naive folds in list order; values chosen so that another order would round differently."""
    vals = [np.float32(1e8), np.float32(1.0), np.float32(-1e8), np.float32(1.0)]
    xs = [md.asarray(np.array([v]), device=f"cpu:{i}", backend="numpy") for i, v in enumerate(vals)]
    naive = md.to_numpy(md.allreduce(xs, algorithm="naive", deterministic=True)[0])
    assert naive[0] == np.float32(((vals[0] + vals[1]) + vals[2]) + vals[3])
    tree = md.to_numpy(md.allreduce(xs, algorithm="tree", deterministic=True)[0])
    assert tree[0] == np.float32((vals[0] + vals[1]) + (vals[2] + vals[3]))


def test_mean_of_bool_and_int_refused_everywhere() -> None:
    ints = _xs(2, dtype="int32")
    for call in (lambda: md.allreduce(ints, "mean"), lambda: md.reduce(ints, "cpu:0", "mean"),
                 lambda: md.reduce_scatter(ints, "mean")):
        with pytest.raises(CollectiveInputError, match="mean"):
            call()
    bools = [md.asarray(np.array([True]), device=f"cpu:{i}", backend="numpy") for i in range(2)]
    with pytest.raises(CollectiveInputError, match="bool"):
        md.allreduce(bools, "sum")


def test_native_unavailable_and_deterministic_native() -> None:
    xs = _xs(2)
    with pytest.raises(CapabilityError, match="numpy"):
        md.allreduce(xs, algorithm="native")
    with pytest.raises(CapabilityError, match="deterministic"):
        md.allreduce(xs, algorithm="native", deterministic=True)


def test_distributed_imports_no_framework() -> None:
    code = ("import sys, multidev, multidev.distributed; "
            "print([m for m in ('torch', 'jax', 'tensorflow', 'mxnet') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_distributed_errors_are_typed() -> None:
    from multidev import distributed as dist

    assert issubclass(dist.DistributedTimeoutError, dist.DistributedError)
    assert issubclass(dist.DistributedTimeoutError, TimeoutError)
    assert issubclass(dist.DistributedError, md.MultidevError)
    e = dist._translate(RuntimeError("[gloo/pair.cc:534] Connection closed by peer [127.0.0.1]:1"), "x", 5)
    assert isinstance(e, dist.DistributedTimeoutError)
    e = dist._translate(RuntimeError("Timed out waiting 3000ms for recv operation to complete"), "x", 3)
    assert isinstance(e, dist.DistributedTimeoutError)
    # By type, not by message: argument errors are DistributedError, whatever they say.
    for err in (ValueError("invalid argument"), TypeError("timed out"), md.CollectiveInputError("peer")):
        e = dist._translate(err, "x", 3)
        assert isinstance(e, dist.DistributedError) and not isinstance(e, dist.DistributedTimeoutError), err
    tdist = pytest.importorskip("torch.distributed")
    for err in (tdist.DistStoreError("waiting for clients"), tdist.DistNetworkError("x"), TimeoutError("x")):
        assert isinstance(dist._translate(err, "x", 3), dist.DistributedTimeoutError), err


def test_data_parallel_example_runs() -> None:
    """The installed demo (``python -m multidev.examples.data_parallel``) trains: the loss falls."""
    res = subprocess.run([sys.executable, "-m", "multidev.examples.data_parallel", "--devices", "3",
                          "--steps", "30"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "loss" in res.stdout


def test_distributed_inplace_on_read_only_input_fails_locally_and_keeps_the_group() -> None:
    """A read-only input with inplace=True raises CapabilityError before any communication, and the
    group stays usable (one process, gloo)."""
    pytest.importorskip("torch.distributed", reason="multidev.distributed needs torch")
    import socket

    from multidev import distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init("gloo", rank=0, world_size=1, master_addr="127.0.0.1", master_port=port, timeout=30)
    try:
        ro = np.arange(4.0)
        ro.flags.writeable = False
        with pytest.raises(md.CapabilityError, match="cannot be written"):
            dist.allreduce(ro, inplace=True)
        np.testing.assert_array_equal(ro, np.arange(4.0))
        x = md.asarray(np.arange(4.0), backend="numpy")
        assert dist.allreduce(x, inplace=True) is x
        np.testing.assert_array_equal(md.to_numpy(x), np.arange(4.0))
    finally:
        dist.shutdown()


def test_auto_takes_naive_over_devices_of_two_kinds() -> None:
    """Devices of two kinds (a GPU beside the host): each step crosses the bus, so auto takes naive
    (measured on an H200 beside its host: within 1.05x of the best at every size; ring up to 11x
    slower), at every size, deterministic or not; the rule reads only the devices' kinds."""
    from multidev.collectives import choose_algorithm

    class Plain:  # an adapter with a native allreduce and no shared-memory pass
        name = "plain"
        capabilities = md.Capabilities(True, True, False, False, dtypes=frozenset({"float32"}))
        collectives = object()  # its native allreduce (never taken here)

    devs = [md.Device("gpu", 0), md.Device("cpu", 0)]
    for numel in (1024, 1 << 20, 1 << 26):
        assert choose_algorithm(Plain(), (numel,), "float32", devs) == "naive"
        assert choose_algorithm(Plain(), (numel,), "float32", devs, deterministic=True) == "naive"
    assert choose_algorithm(Plain(), (1,), "float32", devs) == "tree"  # fewer elements than devices
