"""Suite ``mesh`` (opt-in: ``multidev bench --suite mesh``): placing a tensor by a layout, gathering
it back onto one device, and changing its layout, through ``multidev.to`` against the framework's
own sharded call in the same run (JAX: ``jax.device_put`` with a ``NamedSharding``). Backends without
a sharded type of their own give multidev's rows alone (managed shards: the pieces cut, copied and
joined by multidev), with the memory-copy bound of the bytes placed (one copy of the tensor per
replica) measured in the same run.

The mesh is ``(2, n // 2)`` over the backend's first ``n`` devices of one kind (4 where it has them,
else 2 as ``(2, 1)``); the tensor a float32 matrix, its rows cut along the first axis.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

import multidev as md

from . import Case, Context, Goal, MiB, Variant, benchmark, close

#: multidev's placement at the framework's own cost, where the framework has a sharded type.
MESH_GOALS = tuple(Goal(f"mesh {g} at native cost", g, 1.05, note="md / the framework's own sharded call")
                   for g in ("place", "gather", "change of layout"))


def _mesh(ctx: Context) -> md.Mesh | None:
    pool = ctx.gpus if len(ctx.gpus) >= 2 else ctx.cpus
    n = 4 if len(pool) >= 4 else 2 if len(pool) >= 2 else 0
    if not n:
        return None
    return md.make_mesh((2, n // 2), ("data", "model"), devices=pool[:n], backend=ctx.backend)


def _whole_after(x: Any, layout: md.Layout, ref: np.ndarray) -> tuple[bool, str]:
    return close(md.to_host(md.to(x, layout)), ref)


def _gathered(y: Any, dev: md.Device, ref: np.ndarray) -> tuple[bool, str]:
    return close(md.to(y, dev), ref, device=dev)


@benchmark("mesh", goals=MESH_GOALS)
def sharded_placement(ctx: Context) -> Iterator[Case]:
    """Place, gather and re-lay-out a sharded matrix: multidev against the framework's own."""
    mesh = _mesh(ctx)
    if mesh is None:
        return
    rows_layout = md.Layout(mesh, ("data", None))
    cols_layout = md.Layout(mesh, (None, "model"))
    sizes = [64 * 1024] if ctx.quick else ctx.sweep([1 * MiB, 16 * MiB] + ([256 * MiB] if ctx.accelerated else []))
    for nbytes in sizes:
        rows = nbytes // (4 * 256)
        ref = np.arange(rows * 256, dtype=np.float32).reshape(rows, 256)
        src = mesh.devices[0]
        x = md.asarray(ref, device=src, backend=ctx.backend)
        y = md.to(x, rows_layout)
        replicas = mesh.size // 2
        params = {"mesh": list(mesh.shape), "bytes": nbytes}
        yield Case(f"place rows along data ({nbytes // 1024} KiB)", {
            "md": Variant(md.to, (x, rows_layout)),
            "native": ctx.native_call("place_sharded", x, rows_layout)},
            devices=list(mesh.devices), group="place", bytes=nbytes, params=params,
            bound_copies=replicas, check=functools.partial(_whole_after, x, rows_layout, ref))
        yield Case(f"gather onto {src} ({nbytes // 1024} KiB)", {
            "md": Variant(md.to, (y, src)),
            "native": ctx.native_call("to", y, src) if ctx.native_call("place_sharded", x, rows_layout) else None},
            devices=list(mesh.devices), group="gather", bytes=nbytes, params=params, bound_copies=1,
            check=functools.partial(_gathered, y, src, ref))
        yield Case(f"rows -> columns ({nbytes // 1024} KiB)", {
            "md": Variant(md.to, (y, cols_layout)),
            "native": ctx.native_call("place_sharded", y, cols_layout)},
            devices=list(mesh.devices), group="change of layout", bytes=nbytes, params=params,
            check=functools.partial(_whole_after, y, cols_layout, ref))
