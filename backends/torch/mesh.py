"""torch's own mesh (:class:`~multidev.adapter.SupportsMesh`): ``torch.distributed``'s
``DeviceMesh``. A ``DeviceMesh`` is a grid of ranks, one device per rank, and exists only inside a
process group: in one process (world size 1) it holds one device, so a mesh of several devices of
one process has no torch counterpart (CapabilityError saying so; multidev then keeps managed shards,
``multidev.to(x, layout)``). torch has no topology-aware mesh factory (``init_device_mesh`` lays the
ranks out in order), so the device order is the one given. A process mesh of the torch engine's
group (``multidev.distributed.process_mesh``) is a ``DeviceMesh`` both ways
(``multidev.distributed.to_native_mesh``)."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from multidev.adapter import CapabilityError, Concern, Device, Layout, Mesh, ProcessMesh, SupportsMesh

from .core import TorchCore

_TYPE_OF_KIND = {"cpu": "cpu", "gpu": "cuda", "mps": "mps"}


class TorchMesh(Concern, SupportsMesh):
    """``DeviceMesh`` both ways, for a process group of world size 1; over the torch engine's
    processes, ``DeviceMesh`` and DTensor (multidev's process meshes and layouts)."""

    core: TorchCore

    def __init__(self, core: TorchCore) -> None:
        super().__init__(core)
        self._process_meshes: dict[Any, tuple[Any, Any]] = {}  # (shape, names, group id) -> (group, DeviceMesh)
        self._process_layouts: dict[Any, Any] = {}  # (DeviceMesh, placements, shape, world) -> Layout

    def mesh_device_order(self, shape: tuple[int, ...], devices: Sequence[Device]) -> list[Device]:
        return list(devices)

    def native_mesh_kinds(self) -> tuple[str, ...]:
        return ("torch",)

    def _world(self) -> int:
        dist = self.core.torch.distributed
        if not dist.is_available() or not dist.is_initialized():
            return 0
        return int(dist.get_world_size())

    def to_native_mesh(self, mesh: Any, kind: str) -> Any:
        if kind != "torch":
            raise CapabilityError(f"torch backend makes meshes of kind 'torch', not {kind!r}")
        world = self._world()
        if mesh.size != 1 or world != 1:
            raise CapabilityError(
                f"torch backend: a DeviceMesh is a grid of torch.distributed ranks, one device per rank; this "
                f"process {'has no process group' if not world else f'is one of {world} ranks'}, and a mesh of "
                f"{mesh.size} devices of one process has no DeviceMesh (multidev keeps managed shards for it). "
                "In one process only a one-device mesh converts, after torch.distributed.init_process_group with "
                "world_size=1")
        dev = mesh.devices[0]
        current = self.core.torch.cuda.current_device() if dev.kind == "gpu" else None
        if dev.kind == "gpu" and dev.index != current:
            raise CapabilityError(f"torch backend: rank 0 of this process group uses cuda:{current}, not {dev}; "
                                  f"torch.cuda.set_device({dev.index})")
        from torch.distributed.device_mesh import DeviceMesh

        ranks = self.core.torch.zeros(mesh.shape, dtype=self.core.torch.int64)
        return DeviceMesh(_TYPE_OF_KIND[dev.kind], ranks, mesh_dim_names=mesh.axis_names)

    def _runs_group(self, size: int, rank: int) -> bool:
        """Whether torch.distributed runs with this group's ranks (``size`` of them, this one
        ``rank``): under the torch engine, or started by the program itself beside another engine."""
        dist = self.core.torch.distributed
        return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() == size
                    and dist.get_rank() == rank)

    def to_native_process_mesh(self, shape: tuple[int, ...], axis_names: tuple[str, ...], engine: str) -> Any:
        """The ``DeviceMesh`` of the torch engine's ranks laid out row-major on ``shape`` (made once
        per shape, names and process group: making one is collective, it creates its subgroups)."""
        dist = self.core.torch.distributed
        if engine != "torch" or not dist.is_available() or not dist.is_initialized():
            raise CapabilityError(f"torch backend: a DeviceMesh spans torch.distributed's ranks, which only the torch "
                                  f"engine starts (this group runs the {engine} engine)")
        key = (tuple(shape), tuple(axis_names), id(dist.group.WORLD))
        hit = self._process_meshes.get(key)
        if hit is not None and hit[0] is dist.group.WORLD:
            return hit[1]
        from torch.distributed.device_mesh import DeviceMesh

        torch = self.core.torch
        kind = "cuda" if "nccl" in str(dist.get_backend()) and torch.cuda.is_available() else "cpu"
        ranks = torch.arange(int(dist.get_world_size())).reshape(shape)
        made = DeviceMesh(kind, ranks, mesh_dim_names=axis_names)
        self._process_meshes[key] = (dist.group.WORLD, made)
        return made

    # -- DTensor: tensors sharded across the torch engine's processes --------------------------------
    def process_native(self, layout: Any, shape: Any, engine: str, rank: int) -> bool:
        """Whether a layout over a process mesh becomes a DTensor here: torch.distributed runs the
        group's ranks, rank for rank (decided without making anything)."""
        return engine == "torch" or self._runs_group(layout.mesh.size, rank)

    def process_sharding(self, layout: Any, shape: tuple[int, ...], engine: str, rank: int) -> Any:
        """``(DeviceMesh, placements)`` for ``layout`` (over a process mesh) where torch.distributed
        runs with the group's ranks (the torch engine, or a process group the program started
        beside another engine, rank for rank); None (multidev's managed pieces) elsewhere, or where
        DTensor would cut otherwise than ``numpy.array_split`` (uneven pieces: DTensor follows
        ``torch.chunk``) or cannot say it (a dimension cut along several axes out of mesh order)."""
        if not self.process_native(layout, shape, engine, rank):
            return None
        m = layout.mesh
        for d, entry in enumerate(layout.spec):
            idx = [m.axis(a) for a in entry]
            if idx != sorted(idx) or (entry and shape[d] % layout.pieces(d)):
                return None
        from torch.distributed.tensor import Partial, Replicate, Shard

        placements: list[Any] = [Replicate()] * m.ndim
        for d, entry in enumerate(layout.spec):
            for a in entry:
                placements[m.axis(a)] = Shard(d)
        for a in layout.partial:
            placements[m.axis(a)] = Partial()
        return self.to_native_process_mesh(m.shape, m.axis_names, "torch"), tuple(placements)

    def process_place(self, x: Any, sharding: Any, src: int | None) -> Any:
        """``distribute_tensor`` of ``x`` (of a copy where its first step would write into ``x`` or
        keep views of it: a broadcast along a replicated first axis, a cut without ``src``),
        scattering rank 0's pieces, or each rank's own with ``src=None``; None (multidev's
        path) for another source rank (torch's ``src_data_rank`` counts within each mesh
        dimension's group) or partial sums (torch divides the value among the ranks)."""
        mesh, placements = sharding
        if src not in (0, None) or any(p.is_partial() for p in placements):
            return None
        from torch.distributed.tensor import distribute_tensor

        if src is None or not placements[0].is_shard():  # (its first step would broadcast into x, or cut views)
            x = x.detach().clone()
        return distribute_tensor(x, mesh, placements, src_data_rank=src)

    def process_relayout(self, x: Any, sharding: Any) -> Any:
        """A DTensor's ``redistribute`` onto the same ``DeviceMesh`` (its own collectives: an
        all-to-all, a reduce-scatter, ...); None (multidev's path) onto another mesh object, or into
        partial sums (torch divides the value among the ranks where multidev's first rank holds it)."""
        mesh, placements = sharding
        if x.device_mesh != mesh or any(p.is_partial() for p in placements):
            return None
        y = x.redistribute(mesh, placements)
        if y.to_local().data_ptr() == x.to_local().data_ptr():  # (a piece kept as it was: still a new buffer)
            y = type(y).from_local(y.to_local().clone(), mesh, placements, run_check=False, shape=y.shape,
                                   stride=y.stride())
        return y

    def process_whole(self, x: Any) -> Any:
        """A DTensor's ``full_tensor()`` (its collectives), as a new buffer."""
        full = x.full_tensor()
        if full.data_ptr() == x.to_local().data_ptr():  # (replicated already: the local tensor itself)
            full = full.clone()
        return full

    def from_local(self, piece: Any, sharding: Any, shape: tuple[int, ...]) -> Any:
        """The DTensor whose local tensor is ``piece`` (``DTensor.from_local``, no communication)."""
        from torch.distributed.tensor import DTensor

        torch = self.core.torch
        stride, acc = [], 1
        for n in reversed(shape):
            stride.append(acc)
            acc *= max(int(n), 1)
        mesh, placements = sharding
        return DTensor.from_local(piece, mesh, placements, run_check=False, shape=torch.Size(shape),
                                  stride=tuple(reversed(stride)))

    def process_layout_of(self, x: Any) -> Any:
        """The layout of a DTensor over the whole group (a :class:`~multidev.Layout` over a
        :class:`~multidev.distributed.ProcessMesh`); None for another tensor. CapabilityError for a DTensor
        multidev cannot describe: over a part of the group, partial sums of another reduction than a
        sum, uneven pieces (``torch.chunk``'s sizes differ from ``numpy.array_split``'s)."""
        mod = sys.modules.get("torch.distributed.tensor")
        if mod is None or not isinstance(x, mod.DTensor):
            return None
        key: Any = (x.device_mesh, tuple(x.placements), tuple(x.shape), self._world())
        try:
            hit = self._process_layouts.get(key)
        except TypeError:  # (a mesh or placement that does not hash)
            key, hit = None, None
        if hit is not None:
            return hit
        lay = self._read_layout(x)
        if key is not None and lay is not None and len(self._process_layouts) < 256:
            self._process_layouts[key] = lay
        return lay

    def _read_layout(self, x: Any) -> Any:
        found = self.from_native_process_mesh(x.device_mesh)
        if found is None:
            return None
        shape, names = found
        entries: list[list[str]] = [[] for _ in range(x.ndim)]
        partial = []
        for i, p in enumerate(x.placements):
            if p.is_replicate():
                continue
            if p.is_partial() and getattr(p, "reduce_op", "sum") == "sum":
                partial.append(names[i])
            elif type(p).__name__ == "Shard":
                entries[p.dim].append(names[i])
            else:
                raise CapabilityError(f"torch backend: a DTensor placed by {p} has no multidev layout (it describes "
                                      "Shard, Replicate and Partial sums)")
        lay = Layout(ProcessMesh(shape, names), [tuple(e) for e in entries], tuple(partial))
        for d in range(len(lay.spec)):
            n, length = lay.pieces(d), int(x.shape[d])
            chunk = -(-length // n) if n else 0
            if [min(chunk, max(0, length - i * chunk)) for i in range(n)] != [length // n + (i < length % n)
                                                                               for i in range(n)]:
                raise CapabilityError(f"torch backend: this DTensor cuts dimension {d} of {length} into {n} pieces "
                                      "as torch.chunk does, which multidev's layouts (numpy.array_split's sizes) do "
                                      "not describe")
        return lay

    def local_pieces(self, x: Any) -> list[Any]:
        """A DTensor's local tensor (no copy)."""
        return [x.to_local()]

    def from_native_process_mesh(self, obj: Any) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
        """A ``DeviceMesh`` over the whole group, ranks row-major: its shape and axis names."""
        dm = sys.modules.get("torch.distributed.device_mesh")
        if dm is None or not isinstance(obj, dm.DeviceMesh):
            return None
        grid = obj.mesh
        if grid.reshape(-1).tolist() != list(range(self._world())):
            raise CapabilityError(f"torch backend: this DeviceMesh's ranks {grid.tolist()} are not the group's "
                                  "ranks in row-major order, the layout of a multidev process mesh")
        names = obj.mesh_dim_names or tuple(f"dim{i}" for i in range(obj.ndim))
        return tuple(grid.shape), tuple(names)

    def from_native_mesh(self, obj: Any) -> Any:
        dm = sys.modules.get("torch.distributed.device_mesh")
        if dm is None or not isinstance(obj, dm.DeviceMesh):
            return None
        if obj.size() != 1 or self._world() != 1:
            raise CapabilityError(f"torch backend: this DeviceMesh spans {obj.size()} ranks; multidev reads the mesh "
                                  "of one process (world size 1), whose one rank is one device")
        kind = obj.device_type
        if kind == "cuda":
            dev = self.core.from_native_device(self.core.torch.device("cuda", self.core.torch.cuda.current_device()))
        else:
            dev = self.core.from_native_device(self.core.torch.device(kind))
        if dev is None:
            raise CapabilityError(f"torch backend: this DeviceMesh's device type {kind!r} is none of multidev's")
        names = obj.mesh_dim_names or tuple(f"dim{i}" for i in range(obj.ndim))
        return Mesh(tuple(obj.mesh.shape), tuple(names), [dev])
