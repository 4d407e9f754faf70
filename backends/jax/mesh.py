"""JAX's own mesh (:class:`~multidev.adapter.SupportsMesh`): ``jax.sharding.Mesh``, with the device
order ``jax.make_mesh`` would choose (``mesh_utils.create_device_mesh``: the hardware's topology on
TPUs and GPUs, the devices' order on CPUs)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from multidev.adapter import CapabilityError, Concern, Device, Layout, Mesh, ProcessMesh, SupportsMesh

from ._common import refuse_uneven
from .core import JaxCore


class JaxMesh(Concern, SupportsMesh):
    """``jax.sharding.Mesh`` both ways; the order of ``mesh_utils.create_device_mesh``; over the
    jax engine's processes, global arrays (multidev's process meshes and layouts)."""

    core: JaxCore

    def __init__(self, core: JaxCore) -> None:
        super().__init__(core)
        self._process_shardings: dict[Any, tuple[int, Any]] = {}  # layout -> (process count, NamedSharding)
        self._gathers: dict[Any, Any] = {}  # a global array's sharding -> its jitted gather
        self._reshards: dict[Any, Any] = {}  # (from sharding, to sharding) -> its jitted resharding
        self._process_layouts: dict[Any, tuple[Any]] = {}  # a global array's sharding -> (its Layout,)

    def mesh_device_order(self, shape: tuple[int, ...], devices: Sequence[Device]) -> list[Device]:
        from jax.experimental import mesh_utils

        natives = [self.core.to_native_device(d) for d in devices]
        if len({nd.platform for nd in natives}) > 1:  # create_device_mesh wants one kind
            return list(devices)
        grid = mesh_utils.create_device_mesh(tuple(shape), natives)
        back = {id(nd): d for nd, d in zip(natives, devices)}
        return [back[id(nd)] for nd in grid.reshape(-1)]

    def native_mesh_kinds(self) -> tuple[str, ...]:
        return ("jax",)

    def to_native_mesh(self, mesh: Any, kind: str) -> Any:
        if kind != "jax":
            raise CapabilityError(f"jax backend makes meshes of kind 'jax', not {kind!r}")
        natives = np.empty(len(mesh.devices), dtype=object)
        natives[:] = [self.core.to_native_device(d) for d in mesh.devices]
        return self.core.jax.sharding.Mesh(natives.reshape(mesh.shape), mesh.axis_names)

    def to_native_process_mesh(self, shape: tuple[int, ...], axis_names: tuple[str, ...], engine: str) -> Any:
        """The ``jax.sharding.Mesh`` of the jax engine's processes (each one's first device of the
        default platform, the engine's), row-major on ``shape``."""
        jax = self.core.jax
        if engine != "jax":
            raise CapabilityError(f"jax backend: a mesh over processes is JAX's multi-controller runtime's, which only "
                                  f"the jax engine starts (this group runs the {engine} engine)")
        every = jax.devices()
        firsts = [min((d for d in every if d.process_index == p), key=lambda d: d.id)
                  for p in range(jax.process_count())]
        natives = np.empty(len(firsts), dtype=object)
        natives[:] = firsts
        return jax.sharding.Mesh(natives.reshape(shape), axis_names)

    def from_native_process_mesh(self, obj: Any) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
        """A ``jax.sharding.Mesh`` of one device per process, processes row-major: shape and names."""
        if not isinstance(obj, self.core.jax.sharding.Mesh):
            return None
        procs = [d.process_index for d in np.asarray(obj.devices, dtype=object).reshape(-1)]
        if procs != list(range(self.core.jax.process_count())):
            raise CapabilityError(f"jax backend: this mesh's devices belong to processes {procs}, not one device per "
                                  "process in process order, the layout of a multidev process mesh")
        return tuple(obj.devices.shape), tuple(str(n) for n in obj.axis_names)

    # -- global arrays: tensors sharded across the jax engine's processes ------------------------------
    def process_native(self, layout: Any, shape: Any, engine: str, rank: int) -> bool:
        """Whether a layout over a process mesh becomes a global array here: no partial sums, and
        JAX's runtime runs the group's processes, process for rank (decided without making anything)."""
        if layout.partial:
            return False
        jax = self.core.jax
        return engine == "jax" or (jax.process_count() == layout.mesh.size and jax.process_index() == rank)

    def process_sharding(self, layout: Any, shape: tuple[int, ...], engine: str, rank: int) -> Any:
        """The ``NamedSharding`` over the processes' mesh for ``layout`` where JAX's multi-controller
        runtime runs with the group's processes (the jax engine, or ``jax.distributed`` started by
        the program beside another engine, process for rank); None (multidev's managed pieces)
        elsewhere or for partial sums (a ``NamedSharding`` has none). CapabilityError for uneven
        pieces, which JAX does not place."""
        jax = self.core.jax
        if not self.process_native(layout, shape, engine, rank):
            return None
        refuse_uneven(layout, shape)
        hit = self._process_shardings.get(layout)
        if hit is None or hit[0] != jax.process_count():
            P = jax.sharding.PartitionSpec
            m = layout.mesh
            spec = P(*[None if not e else e[0] if len(e) == 1 else tuple(e) for e in layout.spec])
            hit = (jax.process_count(), jax.sharding.NamedSharding(
                self.to_native_process_mesh(m.shape, m.axis_names, "jax"), spec))
            if len(self._process_shardings) < 256:
                self._process_shardings[layout] = hit
        return hit[1]

    def from_local(self, piece: Any, sharding: Any, shape: tuple[int, ...]) -> Any:
        """The global array whose piece in this process is ``piece``, moved first to this process's
        device of the mesh where it lies elsewhere (``make_array_from_single_device_arrays``)."""
        jax = self.core.jax
        mine = jax.process_index()
        dev = next(d for d in sharding.mesh.devices.flat if d.process_index == mine)
        if piece.sharding.device_set != {dev}:
            piece = jax.device_put(piece, dev)
        return jax.make_array_from_single_device_arrays(tuple(shape), sharding, [piece])

    def process_relayout(self, x: Any, sharding: Any) -> Any:
        """A global array resharded by one jitted program (XLA's own collectives), waited for (see
        :meth:`process_whole`)."""
        jax = self.core.jax
        if 0 in x.shape:  # (XLA's resharding of an empty array keeps the old pieces' shapes: multidev's path)
            return None
        key = (x.sharding, sharding)
        fn = self._reshards.get(key)
        if fn is None:
            fn = jax.jit(lambda a: a, out_shardings=sharding)
            if len(self._reshards) < 256:
                self._reshards[key] = fn
        return jax.block_until_ready(fn(x))

    def process_cut(self, whole: Any, sharding: Any) -> Any:
        """The global array of which this process holds ``whole`` (each process cuts its own piece:
        ``make_array_from_callback``, no communication)."""
        jax = self.core.jax
        mine = jax.process_index()
        dev = next(d for d in sharding.mesh.devices.flat if d.process_index == mine)
        if whole.sharding.device_set != {dev}:
            whole = jax.device_put(whole, dev)
        return jax.make_array_from_callback(tuple(whole.shape), sharding, lambda idx: whole[idx])

    def process_whole(self, x: Any) -> Any:
        """The whole of a global array on this process's device: one jitted program replicating it
        over the processes' mesh (every process runs it), this process's copy taken, waited for."""
        jax = self.core.jax
        sh = x.sharding
        fn = self._gathers.get(sh)
        if fn is None:
            fn = jax.jit(lambda a: a, out_shardings=jax.sharding.NamedSharding(sh.mesh, jax.sharding.PartitionSpec()))
            if len(self._gathers) < 256:
                self._gathers[sh] = fn
        out = fn(x).addressable_shards[0].data
        # (waited for: XLA on CPU may run two programs' collectives at once, and the engine's own
        # collectives, which may come next, start from its dispatch thread)
        return jax.block_until_ready(out)

    def process_layout_of(self, x: Any) -> Any:
        """The layout of a global array over a mesh of one device per process (a
        :class:`~multidev.Layout` over a :class:`~multidev.distributed.ProcessMesh`); None for an array this
        process holds whole (or on its own devices only)."""
        sh = getattr(x, "sharding", None)
        try:
            hit = self._process_layouts.get(sh)
        except TypeError:  # an unhashable sharding
            hit = None
        if hit is not None:
            return hit[0]
        jax = self.core.jax
        if sh is None or not isinstance(sh, jax.sharding.NamedSharding) or sh.is_fully_addressable:
            return None
        found = self.from_native_process_mesh(sh.mesh)
        if found is None:
            return None
        spec = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in sh.spec]
        lay = Layout(ProcessMesh(*found), spec)
        if len(self._process_layouts) < 256:
            self._process_layouts[sh] = (lay,)
        return lay

    def local_pieces(self, x: Any) -> list[Any]:
        """This process's pieces of a global array (``addressable_shards``' data, no copy)."""
        return [s.data for s in x.addressable_shards]

    def from_native_mesh(self, obj: Any) -> Any:
        if not isinstance(obj, self.core.jax.sharding.Mesh):
            return None
        devs = []
        for nd in np.asarray(obj.devices, dtype=object).reshape(-1):
            d = self.core.from_native_device(nd)
            if d is None:
                raise CapabilityError(f"jax backend: the mesh holds {nd}, which is not one of this process's "
                                      "devices (a mesh over several processes is multidev.distributed's)")
            devs.append(d)
        return Mesh(tuple(obj.devices.shape), tuple(str(n) for n in obj.axis_names), devs)
