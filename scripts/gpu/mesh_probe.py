"""Issue 34 on GPUs: a mesh of every GPU (one GPU: a 1x1 mesh) on JAX and torch; placement by each
layout (each piece on its GPU, the whole tensor back), JAX's NamedSharding to torch pieces and back
piece by piece (zero-copy where DLPack allows: the pieces share memory), collectives along the mesh
axes, and md.to(x, layout) against jax.device_put with the same NamedSharding. Prints one line per
check and exits non-zero on the first failure.

    python scripts/gpu/mesh_probe.py
"""
from __future__ import annotations

import time

import numpy as np

import multidev as md


def _grid(n: int) -> tuple[int, int]:
    return (2, n // 2) if n >= 4 and n % 2 == 0 else (n, 1)


def main() -> int:
    import jax
    import torch

    gpus = md.devices(backend="jax", kind="gpu")
    if not gpus:
        print("no GPU: nothing to probe")
        return 0
    shape = _grid(len(gpus))
    ref = np.arange(4096 * 256, dtype=np.float32).reshape(4096, 256)
    for name in ("jax", "torch"):
        mesh = md.make_mesh(shape, ("data", "model"), backend=name)
        print(f"{name}: {mesh!r}")
        x = md.asarray(ref, device=mesh.devices[0], backend=name)
        for spec, partial in [(("data", None), ()), (("data", "model"), ()), ((), ()), (("data",), ("model",))]:
            lay = md.Layout(mesh, spec, partial=partial)
            y = md.to(x, lay)
            pieces = md.shards_of(y)
            assert [md.device_of(p) for p in pieces] == list(mesh.devices), (name, lay)
            assert np.array_equal(md.to_host(y), ref), (name, lay)
            print(f"  {lay.spec_text():22s} partial={partial!s:12s} {type(y).__name__}: ok")
        xs = [md.full((4, 4), i + 1, device=d, backend=name) for i, d in enumerate(mesh.devices)]
        out = md.allreduce_along(xs, mesh, ("data", "model"))
        total = sum(range(1, mesh.size + 1))
        assert all(float(md.to_numpy(t)[0, 0]) == total for t in out)
        print(f"  allreduce_along over the mesh: ok ({total})")
    mesh = md.make_mesh(shape, ("data", "model"), backend="jax")
    lay = md.Layout(mesh, ("data", None))
    j = md.to(md.asarray(ref, device=mesh.devices[0], backend="jax"), lay)
    t = md.convert(j, "torch")
    if mesh.size > 1:
        assert isinstance(t, md.ShardedTensor) and all(isinstance(p, torch.Tensor) and p.is_cuda for p in t.shards)
        back = md.convert(t, "jax")
        assert isinstance(back, jax.Array) and md.layout_of(back) == lay
        shared = [p.data_ptr() == q.unsafe_buffer_pointer() for p, q in zip(t.shards, md.shards_of(back))]
        print(f"  JAX -> torch -> JAX piece by piece: ok (zero-copy pieces: {shared})")
    sharding = md.backend("jax").sharding_for(lay, ref.shape)
    x_j = md.asarray(ref, device=mesh.devices[0], backend="jax")
    calls = {"md.to(x, layout)": lambda: md.to(x_j, lay), "jax.device_put": lambda: jax.device_put(x_j, sharding)}
    for label, fn in calls.items():
        fn().block_until_ready()
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            fn().block_until_ready()
            times.append(time.perf_counter() - t0)
        print(f"  place 4 MiB {label}: median {np.median(times) * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
