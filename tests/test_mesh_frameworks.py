"""Meshes and layouts against the frameworks' own: JAX's ``make_mesh`` order, ``NamedSharding`` in
and out (native in, native out), partial layouts kept as managed shards of JAX arrays, ``convert``
between JAX's sharded arrays and managed shards; torch's ``DeviceMesh`` in a process group of one;
TensorFlow's DTensor and Keras meshes and managed shards of TF tensors. Each framework runs in a
fresh interpreter with four virtual CPU devices (device counts are fixed once a framework starts)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest


def _py(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(MULTIDEV_JAX_CPU_DEVICES="4", MULTIDEV_TF_CPU_DEVICES="4", MULTIDEV_NUMPY_DEVICES="4",
               TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    return r.stdout.strip()


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def test_jax_native_in_native_out() -> None:
    _need("jax")
    out = _py("""
        import numpy as np, jax, multidev as md
        from jax.sharding import NamedSharding, PartitionSpec as P
        m = md.make_mesh((2, 2), ("data", "model"), backend="jax")
        jm = jax.make_mesh((2, 2), ("data", "model"))
        assert [d.id for d in jm.devices.flat] == [md.native_device(d, backend="jax").id for d in m.devices]
        assert md.from_native_mesh(jm) == m and md.from_native_mesh(md.to_native_mesh(m, "jax")) == m
        ref = np.arange(32, dtype=np.float32).reshape(8, 4)
        x = md.asarray(ref, backend="jax")
        lay = md.Layout(m, ("data", "model"))
        y = md.to(x, lay)
        assert isinstance(y, jax.Array) and isinstance(y.sharding, NamedSharding)
        assert y.sharding.is_equivalent_to(NamedSharding(jm, P("data", "model")), 2)
        assert md.layout_of(y) == lay
        native = jax.device_put(ref, NamedSharding(jm, P(None, ("data", "model"))))  # native in
        assert md.layout_of(native) == md.Layout(m, (None, ("data", "model")))
        back = md.to(native, md.Layout(m, ("model",)))
        assert isinstance(back, jax.Array) and md.layout_of(back) == md.Layout(m, ("model",))
        whole = md.to(native, "cpu:2")
        assert md.device_of(whole) == md.cpu(2) and np.array_equal(md.to_numpy(whole), ref)
        assert np.array_equal(md.to_host(native), ref) and np.array_equal(md.to_host(y), ref)
        part = md.to(x, md.Layout(m, ("data",), partial="model"))
        assert isinstance(part, md.ShardedTensor) and all(isinstance(p, jax.Array) for p in part.shards)
        md.synchronize(part)  # waits for every piece
        summed = md.to(part, md.Layout(m, ("data",)))
        assert isinstance(summed, jax.Array) and np.array_equal(md.to_host(summed), ref)
        try:
            md.to(md.asarray(np.zeros((6, 4), np.float32), backend="jax"), md.Layout(m, (("data", "model"),)))
        except md.CapabilityError as e:
            assert "6 elements for 4 pieces" in str(e)
        else:
            raise AssertionError("uneven pieces were not refused")
        c = md.convert(y, "numpy")
        assert isinstance(c, md.ShardedTensor) and c.layout == lay and c.backend == "numpy"
        assert [md.device_of(p) for p in c.shards] == list(m.devices)
        r = md.convert(c, "jax")
        assert isinstance(r, jax.Array) and md.layout_of(r) == lay and np.array_equal(md.to_host(r), ref)
        pieces = md.shards_of(y)
        assert all(p.shape == (4, 2) for p in pieces) and md.from_shards(pieces, lay).sharding == y.sharding
        print("ok")
    """)
    assert out.endswith("ok")


def test_torch_device_mesh_in_a_process_group_of_one() -> None:
    _need("torch")
    out = _py("""
        import tempfile, numpy as np, torch, torch.distributed as dist, multidev as md
        m = md.make_mesh((1, 1), ("dp", "tp"), backend="torch")
        try:
            md.to_native_mesh(m, "torch")
        except md.CapabilityError as e:
            assert "process group" in str(e)
        else:
            raise AssertionError("a DeviceMesh without a process group")
        dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
        dm = md.to_native_mesh(m, "torch")
        assert dm.mesh_dim_names == ("dp", "tp") and tuple(dm.mesh.shape) == (1, 1) and dm.device_type == "cpu"
        assert md.from_native_mesh(dm) == m
        x = torch.arange(12.).reshape(3, 4)
        y = md.to(x, md.Layout(m, ("dp", "tp")))
        assert isinstance(y, md.ShardedTensor) and torch.equal(y.shards[0], x) and y.shards[0] is not x
        try:
            import jax
        except ImportError:
            jax = None
        if jax is not None:  # JAX pieces to torch pieces and back, piece by piece (torch has one CPU device)
            mesh1 = md.make_mesh((1, 1), ("dp", "tp"), backend="jax")
            lay = md.Layout(mesh1, ("dp",), partial="tp")
            j = md.to(md.asarray(np.arange(6.0, dtype=np.float32).reshape(3, 2), backend="jax"), lay)
            t = md.convert(j, "torch")
            assert isinstance(t, md.ShardedTensor) and t.backend == "torch" and t.layout == lay
            assert isinstance(t.shards[0], torch.Tensor)
            back = md.convert(t, "jax")
            assert isinstance(back, md.ShardedTensor) and back.layout == lay
            assert np.array_equal(md.to_host(md.to(back, md.Layout(mesh1, ("dp",)))), np.arange(6.0).reshape(3, 2))
            one = md.to(md.asarray(np.ones(2, np.float32), backend="jax"), md.Layout(mesh1))
            assert isinstance(md.convert(one, "torch"), torch.Tensor)  # one device: the one tensor it is
        dist.destroy_process_group()
        print("ok")
    """)
    assert out.endswith("ok")


def test_tensorflow_and_keras_meshes_and_managed_shards() -> None:
    _need("tensorflow")
    out = _py("""
        import numpy as np, multidev as md, tensorflow as tf
        m = md.make_mesh((2, 2), ("batch", "model"), backend="tensorflow")
        d = md.to_native_mesh(m, "tensorflow")
        assert d.dim_names == ["batch", "model"] and md.from_native_mesh(d) == m
        k = md.to_native_mesh(m, "tensorflow", kind="keras")
        assert k.axis_names == ["batch", "model"] and md.from_native_mesh(k) == m
        flipped = md.Mesh((2, 2), ("batch", "model"), m.devices[::-1])
        assert md.from_native_mesh(md.to_native_mesh(flipped, "tensorflow")) == flipped
        ref = np.arange(30, dtype=np.float32).reshape(6, 5)
        y = md.to(md.asarray(ref, backend="tensorflow"), md.Layout(m, (None, ("batch", "model"))))
        assert [tuple(p.shape) for p in y.shards] == [(6, 2), (6, 1), (6, 1), (6, 1)]
        assert [md.device_of(p) for p in y.shards] == list(m.devices)
        assert np.array_equal(md.to_host(md.convert(y, "numpy")), ref)
        print("ok")
    """)
    assert out.endswith("ok")


def test_structures_of_jax_sharded_arrays_and_sharded_tensors() -> None:
    """A structure holding JAX's own sharded arrays and ShardedTensors moves, converts and copies as
    each would alone (to a device: gathered; convert: piece by piece, layout kept; no gather)."""
    _need("jax")
    out = _py("""
        import numpy as np, jax, multidev as md
        m = md.make_mesh((2, 2), ("data", "model"), backend="jax")
        ref = np.arange(32, dtype=np.float32).reshape(8, 4)
        y = md.to(md.asarray(ref, backend="jax"), md.Layout(m, ("data", "model")))
        nm = md.make_mesh((2, 2), ("data", "model"), backend="numpy")
        s = md.to(md.asarray(ref, backend="numpy"), md.Layout(nm, ("data",)))
        tree = {"jax": y, "numpy": s, "plain": md.asarray(ref, device="cpu:1", backend="jax")}
        moved = md.to(tree, "cpu:3")
        assert all(md.device_of(v) == md.cpu(3) for v in moved.values())
        assert all(np.array_equal(md.to_numpy(v), ref) for v in moved.values())
        conv = md.convert({"numpy": s, "jax": y}, "jax")
        assert isinstance(conv["numpy"], jax.Array) and md.layout_of(conv["numpy"]) == md.Layout(m, ("data",))
        assert conv["jax"] is y
        back = md.convert({"jax": y}, "numpy")
        assert isinstance(back["jax"], md.ShardedTensor) and md.layout_of(back["jax"]) == md.Layout(nm, ("data", "model"))
        assert np.array_equal(md.to_host(back)["jax"], ref)
        c = md.copy({"jax": y})["jax"]
        assert md.layout_of(c) == md.layout_of(y) and np.array_equal(md.to_host(c), ref)
        md.synchronize(tree)
        print("ok")
    """)
    assert out.endswith("ok"), out
