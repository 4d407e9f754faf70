"""Process meshes and the collectives along their axes (multidev/distributed/mesh.py) with 4
processes (a 2x2 mesh) on every engine installed here, launched by ``multidev.distributed.launch``:
allreduce, allgather (uneven lengths), reduce_scatter and all_to_all along each axis and both,
the ring sendrecv and the world all_to_all, each against the values every rank can work out; ranks
that call with other axes get CollectiveMismatchError on every rank; a rank that refuses its own
input raises its error and the others CollectiveMismatchError, and the group stays usable;
structures go leaf by leaf after one agreed exchange (ranks whose structures differ: mismatch); the
same results where the engine has no subgroups (whole-group allgathers); the framework's own mesh of
the processes both ways (torch's DeviceMesh, JAX's Mesh; none for NumPy). Point-to-point: shape,
dtype and backend travel in the header; a tag or ``out`` that does not fit raises
CollectiveMismatchError on the receiver, a sender's refusal reaches it as DistributedError, bad
peers and tags are refused, and a receive whose sender never comes times out naming it. Each
engine runs with its own tensors (torch tensors on the torch engine, JAX arrays on the JAX engine,
NumPy on MPI). One rank alone (no launcher) runs in process."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import multidev as md

WORKER = '''
import sys
import numpy as np
import multidev as md
from multidev import distributed as dist

NAME = sys.argv[1]
dist.init()
r, n = dist.rank(), dist.world_size()
shape = {1: (1, 1), 2: (2, 1), 4: (2, 2)}[n]
pm = dist.process_mesh(shape, ("a", "b"))

def t(a):
    return md.asarray(a, backend=NAME)

def host(y):
    return np.asarray(md.to_numpy(y))

x = t(np.full((6, 2), r + 1, np.float32))


def along(axes):
    g = pm.group_of(r, axes)
    k = g.index(r)
    y = dist.allreduce_along(x, pm, axes)
    assert md.backend_of(y).name == NAME and (host(y) == sum(q + 1 for q in g)).all(), (axes, host(y))
    assert (host(dist.allreduce_along(x, pm, axes, "max")) == max(g) + 1).all()
    z = dist.allgather_along(t(np.full((r + 1, 2), r, np.float32)), pm, axes)
    assert host(z)[:, 0].tolist() == [float(q) for q in g for _ in range(q + 1)], (axes, host(z))
    s = dist.reduce_scatter_along(x, pm, axes)
    sizes = [len(p) for p in np.array_split(np.arange(6), len(g))]
    assert host(s).shape == (sizes[k], 2) and (host(s) == sum(q + 1 for q in g)).all()
    rows = np.arange(12, dtype=np.float32).reshape(6, 2)  # every row its own values: the block order shows
    s2 = dist.reduce_scatter_along(t(rows * (r + 1)), pm, axes)
    want = np.array_split(rows * sum(q + 1 for q in g), len(g))[k]
    assert np.array_equal(host(s2), want), (axes, host(s2), want)
    a = dist.all_to_all_along(t(np.arange(6, dtype=np.float32) + 10 * r), pm, axes)
    want = np.concatenate([np.array_split(np.arange(6) + 10 * q, len(g))[k] for q in g])
    assert np.array_equal(host(a), want), (axes, host(a), want)


for axes in (("a",), ("b",), ("a", "b"), ("b", "a")):
    along(axes)
# an engine without subgroups: the same results over whole-group allgathers
from multidev.distributed.group import current
g0 = current()
kept, split = dict(g0.subs), type(g0.engine).split
g0.subs.clear()
def no_split(self, groups):
    raise md.CapabilityError("no subgroups here")
type(g0.engine).split = no_split
for axes in (("a",), ("b", "a")):
    along(axes)
assert all(v is None for k, v in g0.subs.items() if len(k) > 1), g0.subs
type(g0.engine).split = split
g0.subs.clear()
g0.subs.update(kept)
assert any(v is not None and v is not g0.engine for v in g0.subs.values())  # the engine's own subgroups ran
tree = {"w": x, "pair": (t(np.full(3, 10.0 * (r + 1), np.float32)), None)}
for axes in (("a",), ("a", "b")):
    g = pm.group_of(r, axes)
    y = dist.allreduce_along(tree, pm, axes)
    assert set(y) == {"w", "pair"} and y["pair"][1] is None
    assert (host(y["w"]) == sum(q + 1 for q in g)).all() and (host(y["pair"][0]) == 10 * sum(q + 1 for q in g)).all()
    z = dist.allgather_along([t(np.full((r + 1, 2), r, np.float32))], pm, axes)
    assert host(z[0])[:, 0].tolist() == [float(q) for q in g for _ in range(q + 1)]
rt = dist.sendrecv({"r": t(np.array([r], np.int32))}, shift=1)
assert int(host(rt["r"])[0]) == (r - 1) % n
ring = dist.sendrecv(t(np.array([r], np.int32)), shift=1)
assert int(host(ring)[0]) == (r - 1) % n
world = dist.all_to_all(t(np.arange(8, dtype=np.float32) + 100 * r))
assert np.array_equal(host(world), np.concatenate([np.array_split(np.arange(8) + 100 * q, n)[r] for q in range(n)]))
outcome = []
try:
    dist.allreduce_along(x, pm, ("a",) if r == 0 else ("b",))
    outcome.append("agreed")
except md.CollectiveMismatchError:
    outcome.append("mismatch")
try:
    dist.allreduce_along(t(np.ones(2, np.int32)) if r == 0 else x, pm, ("a", "b"), op="mean")
    outcome.append("agreed")
except md.CollectiveMismatchError:
    outcome.append("mismatch")
except md.CollectiveInputError:
    outcome.append("refused")
try:  # rank 0's structure has two leaves, the others' one
    dist.allreduce_along([x, t(np.ones(2, np.float32))] if r == 0 else [x], pm, ("a", "b"))
    outcome.append("agreed")
except md.CollectiveMismatchError:
    outcome.append("mismatch")
assert (host(dist.allreduce_along(x, pm, ("a", "b"))) == n * (n + 1) / 2).all()  # still usable
# in place: x itself written where the backend is mutable; refused on every rank where it is not
xm = t(np.full((4, 2), r + 1.0, np.float32))
try:
    y = dist.allreduce_along(xm, pm, "a", inplace=True)
    assert md.backend(NAME).capabilities.mutable and y is xm, "in place on an immutable backend"
    assert (host(xm) == sum(q + 1 for q in pm.group_of(r, "a"))).all(), host(xm)
except md.CapabilityError:
    assert not md.backend(NAME).capabilities.mutable
# what the group cannot carry, or a header cannot hold, is refused on every rank before anything
# moves, and the group stays usable
from multidev.distributed import carries
odd = next((d for d in ("uint16", "int64", "float64") if not carries(d, backend="numpy")), None)
for bad in ([lambda: dist.sendrecv(np.full(3, r, odd)), lambda: dist.allreduce_along(np.full(3, r, odd), pm, "a")]
            if odd else []) + [lambda: dist.sendrecv(np.zeros((1,) * 33, np.float32))]:
    try:
        bad()
        outcome.append("agreed")
    except (md.CapabilityError, md.CollectiveInputError):
        pass
assert (host(dist.allreduce_along(x, pm, ("a", "b"))) == n * (n + 1) / 2).all()
# the framework's own mesh of the processes, both ways (torch: DeviceMesh; jax: a Mesh of each
# process's device); none for NumPy under MPI
if NAME in ("torch", "jax"):
    nm = dist.to_native_mesh(pm, NAME)
    assert dist.from_native_mesh(nm) == pm
    if NAME == "torch":
        assert nm.mesh.tolist() == [[0, 1], [2, 3]] and tuple(nm.mesh_dim_names) == ("a", "b")
    else:
        assert nm.axis_names == ("a", "b") and [d.process_index for d in nm.devices.reshape(-1)] == [0, 1, 2, 3]
else:
    try:
        dist.to_native_mesh(pm, NAME)
        raise AssertionError("NumPy has no mesh of processes")
    except md.CapabilityError:
        pass
# point-to-point: 0 -> 1 (shape, dtype and backend travel), a tag or out that does not fit, a
# sender's refusal, then a receive whose sender never comes (a timeout naming it)
import time
if r == 0:
    assert dist.send(t(np.arange(6, dtype=np.float32).reshape(2, 3)), 1, tag=5) is None
    dist.send(t(np.zeros((0, 4), np.float32)), 1)
    dist.send(t(np.array(7, np.int32)), 1)
    dist.send(t(np.ones(3, np.float32)), 1, tag=1)
    try:
        dist.send([t(np.ones(2, np.float32))], 1)
    except md.CollectiveInputError:
        outcome.append("refused")
    for bad in (lambda: dist.send(x, 0), lambda: dist.recv(n), lambda: dist.send(x, 1, tag=-1)):
        try:
            bad()
            outcome.append("unchecked")
        except md.CollectiveInputError:
            pass
    dist.send(t(np.full(4, 3.0, np.float32)), 1)
    dist.send(t(np.full(2, 8.0, np.float32)), 1)
    dist.send(t(np.full(3, 9.0, np.float32)), 1)
    dist.send(t(np.full(1, 10.0, np.float32)), 1)
elif r == 1:
    y = dist.recv(0, tag=5)
    assert md.backend_of(y).name == NAME and np.array_equal(host(y), np.arange(6).reshape(2, 3)), host(y)
    assert host(dist.recv(0)).shape == (0, 4)
    s = dist.recv(0, backend="numpy")
    assert isinstance(s, np.ndarray) and s.shape == () and int(s) == 7 and s.dtype == np.int32
    try:
        dist.recv(0, tag=2)
        outcome.append("agreed")
    except md.CollectiveMismatchError:
        outcome.append("mismatch")
    try:
        dist.recv(0)
        outcome.append("agreed")
    except md.DistributedError:
        outcome.append("told")
    into = np.zeros(5, np.float32)
    try:
        dist.recv(0, out=into)
        outcome.append("agreed")
    except md.CollectiveMismatchError:
        outcome.append("mismatch")
    assert (into == 0).all()
    try:  # an argument error raises before anything is received: the message stays for the next recv
        dist.recv(0, device="cpu:99")
        outcome.append("agreed")
    except md.DeviceNotFoundError:
        pass
    w1, w2 = dist.recv(0, async_op=True), dist.recv(0, async_op=True)  # two receives pending from one rank
    w3 = dist.recv(0, async_op=True)
    assert host(w2.wait()).tolist() == [9.0] * 3 and host(w1.wait()).tolist() == [8.0] * 2, "out of order"
    assert host(w3.wait()).tolist() == [10.0]
assert (host(dist.allreduce_along(x, pm, ("a", "b"))) == n * (n + 1) / 2).all()  # still usable
# (JAX is left out: its receive is a program in the engine's dispatch thread, which waits for gloo's
# own 30 s before the process may exit; its timeouts are the conformance fault cases')
by_peer = dist.engine_name() != "jax"
dist.set_timeout(3)
if r == 2 and by_peer:
    try:
        dist.recv(3)
    except dist.DistributedTimeoutError as e:
        assert "rank 3" in str(e), str(e)
        outcome.append("timeout")
print(f"MDMESH rank {r}: {' '.join(outcome)}", flush=True)
if by_peer:
    time.sleep(4)  # rank 3 stays while rank 2 waits for it
dist.shutdown()
'''

ENGINES = {"torch": "torch", "jax": "jax", "mpi": "numpy"}


def _missing(engine: str) -> str | None:
    from multidev.distributed.engine import engine_class

    return engine_class(engine).missing()


@pytest.mark.multiprocess
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_collectives_along_a_process_mesh(engine: str, tmp_path: Path) -> None:
    why = _missing(engine)
    if why:
        pytest.skip(f"the {engine} engine is not available here: {why}")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, MULTIDEV_JAX_CPU_DEVICES="1", TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-m", "multidev.distributed.launch", "-n", "4", "--engine", engine,
                        str(script), ENGINES[engine]], capture_output=True, text=True, timeout=400, env=env,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    found = sorted(re.findall(r"MDMESH rank (\d): ([a-z ]*)", p.stdout))  # (the ranks' lines may interleave)
    assert found == [("0", "mismatch refused mismatch refused"), ("1", "mismatch mismatch mismatch mismatch told "
                                                                        "mismatch"),
                     ("2", "mismatch mismatch mismatch" + (" timeout" if engine != "jax" else "")),
                     ("3", "mismatch mismatch mismatch")], p.stdout[-3000:]


def test_one_rank_without_a_launcher() -> None:
    from multidev import distributed as dist

    dist.init()
    try:
        pm = dist.process_mesh((1, 1), ("a", "b"))
        assert pm.groups("a") == ((0,),) and pm.coords(0) == (0, 0)
        x = md.asarray(np.arange(4.0), backend="numpy")
        y = dist.allreduce_along(x, pm, ("a", "b"))
        assert np.array_equal(md.to_numpy(y), np.arange(4.0)) and not np.shares_memory(md.to_numpy(y), x)
        with pytest.raises(md.InvalidArgumentError, match="holds 4 ranks"):
            dist.process_mesh((2, 2), ("a", "b"))
        with pytest.raises(md.InvalidArgumentError, match="no axis 'c'"):
            dist.allreduce_along(x, pm, "c")
        with pytest.raises(md.CollectiveInputError):
            dist.sendrecv(x, shift=1.5)  # type: ignore[arg-type]
        assert np.array_equal(md.to_numpy(dist.sendrecv(x)), np.arange(4.0))
        tree = dist.allreduce_along({"x": x, "n": None}, pm, "a")  # a structure: leaf by leaf, rebuilt
        assert tree["n"] is None and np.array_equal(md.to_numpy(tree["x"]), np.arange(4.0))
        with pytest.raises(md.UnsupportedTensorError, match="str"):
            dist.allreduce_along({"x": x, "s": "text"}, pm, "a")
        with pytest.raises(md.InvalidArgumentError, match="no axis 'c'"):  # checked without tensors too
            dist.allreduce_along([], pm, "c")
        with pytest.raises(md.CollectiveInputError, match="unknown op"):
            dist.reduce_scatter_along({}, pm, "a", op="xx")
        with pytest.raises(md.InvalidArgumentError, match="ProcessMesh"):
            dist.allgather_along(x, "a mesh", "a")  # type: ignore[arg-type]
    finally:
        dist.shutdown()


def test_process_mesh_groups() -> None:
    from multidev.distributed import ProcessMesh

    pm = ProcessMesh((2, 3), ("x", "y"))
    assert pm.groups("y") == ((0, 1, 2), (3, 4, 5)) and pm.groups("x") == ((0, 3), (1, 4), (2, 5))
    assert pm.groups(("y", "x"))[0] == (0, 3, 1, 4, 2, 5) and pm.group_of(4, "x") == (1, 4)
    assert pm.coords(5) == (1, 2) and pm.size == 6 and hash(pm) == hash(ProcessMesh((2, 3), ("x", "y")))
