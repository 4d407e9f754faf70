"""Tensors laid out across processes (multidev/distributed/layouts.py): 4 processes on a 2x2
process mesh, on every engine installed here, launched by ``multidev.distributed.launch``.

Each engine runs with its own framework's tensors and gets that framework's own sharded type
(torch's DTensor under the torch engine, a global ``jax.Array`` under jax) and, beside them, NumPy's
managed pieces (a ShardedTensor holding this rank's piece); MPI runs NumPy and torch, both managed.
Checked on every rank against values every rank can work out: ``md.to(x, layout)`` takes rank 0's
tensor and leaves each rank its piece (``src=None``: each rank's own); ``layout_of``,
``shards_of``, ``is_sharded``; ``device_of`` refuses (no single device); ``to_host`` and
``md.to(x, device)`` give the whole on every rank; changes of layout (to a partial layout and back,
to another process layout, to one device); ``from_local`` with the whole shape given and worked
out (uneven pieces, managed); ``convert`` piece by piece between frameworks, keeping the layout;
``copy``; the layout of a tensor the framework sharded itself; ranks that call with different
layouts, or a rank refusing its own input, raise on every rank and leave the group usable."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = '''
import os
import sys
import numpy as np
import multidev as md
from multidev import distributed as dist

NAMES = sys.argv[1].split(",")
dist.init()
r, n = dist.rank(), dist.world_size()
pm = dist.process_mesh((2, 2), ("a", "b"))
engine = dist.engine_name()
outcome = []
NATIVE = {("torch", "torch"): "DTensor", ("jax", "jax"): "ArrayImpl"}


def whole(seed, shape=(8, 8)):
    return (np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 100 * seed).astype(np.float32)


def piece_of(w, layout, rank):
    box = layout.block(rank, w.shape)
    return w[tuple(slice(s, e) for s, e in box)]


def check(y, layout, w, name):
    kind = type(y).__name__
    want_kind = NATIVE.get((engine, name), "ShardedTensor")
    assert kind == want_kind, (name, kind, want_kind)
    assert md.layout_of(y) == layout, (md.layout_of(y), layout)
    md.synchronize(y)  # (waits for its pieces: no single device needed)
    pieces = md.shards_of(y)
    assert len(pieces) == 1
    p = np.asarray(md.to_numpy(pieces[0]))
    if any(pm.coords(r)[pm.axis(a)] for a in layout.partial):
        assert (p == 0).all()
    else:
        assert np.array_equal(p, piece_of(w, layout, r)), (name, layout, p, piece_of(w, layout, r))
    try:
        md.device_of(y)
        raise AssertionError("device_of of a tensor across processes")
    except md.DeviceMismatchError:
        pass
    assert np.array_equal(md.to_host(y), w), (name, layout)
    whole_copy = md.copy(y, "cpu:0")  # the whole, a new tensor on every rank
    assert md.layout_of(whole_copy) is None and np.array_equal(np.asarray(md.to_numpy(whole_copy)), w)
    assert np.array_equal(np.asarray(md.to_numpy(y)), w)  # (a collective too, as to_host)
    back = md.to(y, "cpu:0")
    assert md.backend_of(back).name == name and md.layout_of(back) is None
    assert np.array_equal(np.asarray(md.to_numpy(back)), w)


for name in NAMES:
    def t(a):
        return md.asarray(a, backend=name)
    w0 = whole(0)
    x = t(whole(r))  # every rank's own values: rank 0's are the tensor
    for spec, partial in (((("a", "b"),), ()), (("a", "b"), ()), ((None, "b"), ()), ((), ()), (("a",), ("b",))):
        if partial and (engine, name) == ("jax", "jax"):
            continue  # (a NamedSharding has no partial sums: below, as managed pieces)
        lay = md.Layout(pm, spec, partial)
        y = md.to(x, lay)
        check(y, lay, w0, name)
        assert md.to(y, lay) is y
        z = md.to(y, md.Layout(pm, (None, ("b", "a"))))  # (out of mesh order: managed pieces on torch too)
        assert np.array_equal(md.to_host(z), w0)
    own = dist.distribute(x, md.Layout(pm, ("a", "b")), src=None)  # every rank's own whole: its piece
    assert np.array_equal(np.asarray(md.to_numpy(md.shards_of(own)[0])), piece_of(whole(r), md.Layout(pm, ("a", "b")), r))
    # the ranks' pieces made into one (uneven: 7 rows in two pieces; numpy.array_split's sizes)
    lay = md.Layout(pm, ("a",))
    w7 = whole(3, (7, 2))
    mine = t(piece_of(w7, lay, r))
    if (engine, name) != ("jax", "jax"):
        f = dist.from_local(mine, lay)
        assert md.layout_of(f) == lay and np.array_equal(md.to_host(f), w7)
    f2 = dist.from_local(t(piece_of(whole(3), lay, r)), lay, shape=(8, 8))
    assert np.array_equal(md.to_host(f2), whole(3))
    assert np.array_equal(md.to_host(md.from_shards([t(piece_of(whole(3), lay, r))], lay, (8, 8))), whole(3))
    c = md.copy(f2)
    assert md.layout_of(c) == lay and np.array_equal(md.to_host(c), whole(3))
    # partial sums: each rank's piece a summand
    plan = md.Layout(pm, ("a",), partial=("b",))
    if (engine, name) != ("jax", "jax"):
        ps = dist.from_local(t(piece_of(whole(0), lay, r) * (pm.coords(r)[1] + 1)), plan, shape=(8, 8))
        assert np.array_equal(md.to_host(ps), whole(0) * 3), md.to_host(ps)
        back = md.to(ps, md.Layout(pm, ("a", "b")))
        assert np.array_equal(md.to_host(back), whole(0) * 3)
    # across frameworks, piece by piece: the layout kept, the consumer's own type where it has one
    for other in NAMES:
        cv = md.convert(f2, other)
        assert md.backend_of(md.shards_of(cv)[0]).name == other and md.layout_of(cv) == lay
        assert type(cv).__name__ == NATIVE.get((engine, other), "ShardedTensor"), type(cv).__name__
        assert np.array_equal(md.to_host(cv), whole(3))
    # a one-process layout of a tensor sharded across processes: gathered, then laid out
    one = md.Layout(md.Mesh((1,), ("x",), [md.device_of(x)]), ("x",))
    assert np.array_equal(md.to_host(md.to(f2, one)), whole(3))

# an axis of size 1 (its subgroups are one rank each: nothing moves along it), uneven pieces
line = dist.process_mesh((1, 4), ("a", "b"))
for name in NAMES:
    if (engine, name) == ("jax", "jax"):
        continue  # (JAX places even pieces only)
    w5 = whole(5, (5, 3))
    for lay in (md.Layout(line, ("a", "b")), md.Layout(line, ("b",), partial=("a",)), md.Layout(line, (None, "b"))):
        u = md.to(md.asarray(w5, backend=name), lay)
        assert np.array_equal(md.to_host(u), w5), (name, lay)
        assert np.array_equal(md.to_host(md.to(u, md.Layout(line, ("b", "a")))), w5), (name, lay)
if engine == "jax":  # an empty array changes layout: pieces of the new layout's shape
    e = md.to(md.to(md.asarray(np.zeros((0, 8), np.float32), backend="jax"), md.Layout(pm, ())),
              md.Layout(pm, (None, ("a", "b"))))
    assert md.shards_of(e)[0].shape == (0, 2), md.shards_of(e)[0].shape
if engine == "mpi" and "torch" in NAMES:  # torch.distributed started beside MPI with its ranks in another order
    import torch
    import torch.distributed as tdist
    tdist.init_process_group("gloo", init_method="file://" + os.path.abspath("torch-store"), rank=[0, 1, 3, 2][r],
                             world_size=n)
    try:
        md.to(torch.zeros(8, 8), md.Layout(pm, ("a", "b")))
    except dist.CollectiveMismatchError:
        outcome.append("order")
    tdist.destroy_process_group()

# changes of layout on managed pieces: each rank's new piece exactly, and only what it lacks moved
# (one all-to-all where a cut moves to another dimension along the same axes and the pieces are even;
# a gather along one dimension; nothing at all towards a finer cut)
import multidev.distributed.layouts as L
moves = []
for fn in ("allgather_along_one", "all_to_all_along", "allreduce_along_one"):
    def counted(*a, _f=getattr(L, fn), _n=fn, **k):
        moves.append(_n.split("_")[0] if _n != "all_to_all_along" else "a2a")
        return _f(*a, **k)
    setattr(L, fn, counted)
PAIRS = [((("a",), ()), (None, "a"), ["a2a"], ["allgather"]),
         (((None, "a"), ()), ("a",), ["a2a"], ["allgather"]),
         (((("a", "b"),), ()), (None, ("a", "b")), ["a2a"], ["allgather"]),
         ((("a", "b"), ()), ("b", "a"), ["allgather", "allgather"], ["allgather", "allgather"]),
         (((), ()), ("a", "b"), [], []),
         ((("a",), ()), (("a", "b"),), [], []),
         (((("a", "b"),), ()), ("a",), ["allgather"], ["allgather"]),
         ((("a",), ("b",)), (None, "a"), ["allreduce", "a2a"], ["allreduce", "allgather"])]
for name in NAMES:
    if (engine, name) in NATIVE:
        continue  # (the framework's own change of layout: redistribute, a jitted resharding)
    for w, which in ((whole(7, (8, 6)), 2), (whole(8, (7, 5)), 3)):
        for (spec, partial), new_spec, even, uneven in PAIRS:
            old_lay, new_lay = md.Layout(pm, spec, partial), md.Layout(pm, new_spec)
            summand = piece_of(w, old_lay, r) * (1 if not partial else (pm.coords(r)[1] + 1) / 3)
            src = dist.from_local(md.asarray(summand.astype(np.float32), backend=name), old_lay, shape=w.shape)
            del moves[:]
            z = md.to(src, new_lay)
            got = np.asarray(md.to_numpy(md.shards_of(z)[0]))
            assert np.allclose(got, piece_of(w, new_lay, r)), (name, spec, partial, new_spec, got)
            assert moves == (even if which == 2 else uneven), (name, spec, partial, new_spec, moves)
            if not moves:  # nothing moved: still a buffer of its own
                assert not np.shares_memory(got, np.asarray(md.to_numpy(md.shards_of(src)[0])))
    # onto another mesh of the same ranks (its axes named the other way): each rank's new piece
    flipped = dist.process_mesh((2, 2), ("b", "a"))
    w = whole(9, (4, 6))
    for (spec, partial), new_spec, new_partial in (((("a",), ()), (None, "a"), ()), ((("a",), ()), ("a",), ("b",)),
                                                  ((("a",), ("b",)), (None, ("a", "b")), ())):
        old_lay, new_lay = md.Layout(pm, spec, partial), md.Layout(flipped, new_spec, new_partial)
        summand = piece_of(w, old_lay, r) * (1 if not partial else (pm.coords(r)[1] + 1) / 3)
        src = dist.from_local(md.asarray(summand.astype(np.float32), backend=name), old_lay, shape=w.shape)
        z = md.to(src, new_lay)
        got = np.asarray(md.to_numpy(md.shards_of(z)[0]))
        want = np.zeros_like(piece_of(w, new_lay, r)) if any(flipped.coords(r)[flipped.axis(a)] for a in new_partial) \
            else piece_of(w, new_lay, r)
        assert got.shape == want.shape and np.allclose(got, want), (name, spec, new_spec, new_partial, got.shape)
        assert np.allclose(md.to_host(z), w)

# ranks that lay out differently: every rank raises, the group stays usable
x = md.asarray(whole(r), backend=NAMES[0])
try:
    md.to(x, md.Layout(pm, ("a",) if r != 1 else ("b",)))
except dist.CollectiveMismatchError:
    outcome.append("mismatch")
# a rank refusing its own input (a layout cutting more dimensions than its tensor has)
try:
    md.to(x if r != 2 else md.asarray(np.zeros(3, np.float32), backend=NAMES[0]), md.Layout(pm, (None, "a")))
except md.InvalidArgumentError:
    outcome.append("refused")
except dist.CollectiveMismatchError:
    outcome.append("mismatch")
try:
    md.to(x, md.Layout(dist.ProcessMesh((2,), ("a",)), ("a",)))  # not the group's size: refused on every rank
except md.InvalidArgumentError:
    outcome.append("size")
y = md.to(x, md.Layout(pm, ("a", "b")))
assert np.array_equal(md.to_host(y), whole(0))  # still usable
if engine in ("torch", "jax"):  # the framework's own sharded tensor, made by the framework: read as a layout
    nm = dist.to_native_mesh(pm, engine)
    if engine == "torch":
        from torch.distributed.tensor import Shard, Replicate, distribute_tensor
        import torch
        d = distribute_tensor(torch.as_tensor(whole(0)), nm, [Replicate(), Shard(1)])
    else:
        import jax
        from jax.sharding import NamedSharding, PartitionSpec as P
        s = NamedSharding(nm, P(None, "b"))
        d = jax.make_array_from_callback((8, 8), s, lambda idx: whole(0)[idx])
    assert md.layout_of(d) == md.Layout(pm, (None, "b")), md.layout_of(d)
    assert np.array_equal(md.to_host(d), whole(0))
    outcome.append("native")
if engine == "jax" and len(NAMES) > 2:  # torch.distributed started beside the jax engine: JAX <-> DTensor, no gather
    import torch.distributed as tdist
    tdist.init_process_group("gloo", init_method="file://" + os.path.abspath("torch-store"), rank=r, world_size=n)
    lay = md.Layout(pm, ("a", "b"))
    g = md.to(md.asarray(whole(0), backend="jax"), lay)
    dt = md.convert(g, "torch")
    assert type(dt).__name__ == "DTensor" and md.layout_of(dt) == lay
    assert dt.to_local().data_ptr() == md.shards_of(g)[0].unsafe_buffer_pointer()  # zero-copy, piece by piece
    again = md.convert(dt, "jax")
    assert type(again).__name__ == "ArrayImpl" and md.layout_of(again) == lay
    assert np.array_equal(md.to_host(again), whole(0)) and np.array_equal(md.to_host(dt), whole(0))
    tdist.destroy_process_group()
    outcome.append("dtensor")
print(f"MDLAYOUT rank {r}: {' '.join(outcome)}", flush=True)
dist.shutdown()
'''

ENGINES = {"torch": "torch,numpy", "jax": "jax,numpy,torch", "mpi": "numpy,torch"}


def _missing(engine: str) -> str | None:
    from multidev.distributed.engine import engine_class

    return engine_class(engine).missing()


@pytest.mark.multiprocess
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_layouts_across_processes(engine: str, tmp_path: Path) -> None:
    why = _missing(engine)
    if why:
        pytest.skip(f"the {engine} engine is not available here: {why}")
    names = ENGINES[engine]
    for name in names.split(","):
        pytest.importorskip({"numpy": "numpy", "torch": "torch", "jax": "jax"}[name],
                            reason=f"{name} is not installed: its tensors cannot be laid out")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, MULTIDEV_JAX_CPU_DEVICES="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-m", "multidev.distributed.launch", "-n", "4", "--engine", engine,
                        str(script), names], capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    found = sorted(re.findall(r"MDLAYOUT rank (\d): ([a-z ]*)", p.stdout))  # (the ranks' lines may interleave)
    tail = {"torch": " native", "jax": " native dtensor"}.get(engine, "")
    head = "order " if engine == "mpi" else ""
    assert found == [(str(k), (head + "mismatch " + ("refused" if k == 2 else "mismatch") + " size" + tail))
                     for k in range(4)], p.stdout[-3000:]


def test_layout_over_a_process_mesh_is_a_value() -> None:
    import pickle

    import multidev as md
    from multidev.distributed import ProcessMesh

    pm = ProcessMesh((2, 2), ("a", "b"))
    lay = md.Layout(pm, ("a", None), partial="b")
    assert lay.across_processes and not md.Layout(md.Mesh((1,), ("x",), [md.Device("cpu", 0)])).across_processes
    assert pickle.loads(pickle.dumps(lay)) == lay and hash(lay) == hash(md.Layout(pm, ("a",), partial=("b",)))
    assert lay.block(3, (5, 4)) == ((3, 5), (0, 4)) and lay.shard_shape(0, (5, 4)) == (3, 4)
    assert pm.index_along(3, ("b", "a")) == 3 and pm.index_along(1, ("b", "a")) == 2
    with pytest.raises(md.InvalidArgumentError, match="no axis"):
        md.Layout(pm, ("c",))
    with pytest.raises(md.InvalidArgumentError, match="distinct names"):
        ProcessMesh((2, 2), ("a", "a"))
    x = md.asarray(np.zeros((4, 4), np.float32), backend="numpy")
    with pytest.raises(md.DistributedError, match="not initialised"):  # no group: a typed error, nothing moved
        md.to(x, lay)
    assert np.array_equal(md.to_numpy(x), np.zeros((4, 4), np.float32))
