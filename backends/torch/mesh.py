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

from multidev.adapter import CapabilityError, Concern, Device, Mesh, SupportsMesh

from .core import TorchCore

_TYPE_OF_KIND = {"cpu": "cpu", "gpu": "cuda", "mps": "mps"}


class TorchMesh(Concern, SupportsMesh):
    """``DeviceMesh`` both ways, for a process group of world size 1."""

    core: TorchCore

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

    def to_native_process_mesh(self, shape: tuple[int, ...], axis_names: tuple[str, ...], engine: str) -> Any:
        """The ``DeviceMesh`` of the torch engine's ranks laid out row-major on ``shape``."""
        dist = self.core.torch.distributed
        if engine != "torch" or not dist.is_available() or not dist.is_initialized():
            raise CapabilityError(f"torch backend: a DeviceMesh spans torch.distributed's ranks, which only the torch "
                                  f"engine starts (this group runs the {engine} engine)")
        from torch.distributed.device_mesh import DeviceMesh

        torch = self.core.torch
        kind = "cuda" if "nccl" in str(dist.get_backend()) and torch.cuda.is_available() else "cpu"
        ranks = torch.arange(int(dist.get_world_size())).reshape(shape)
        return DeviceMesh(kind, ranks, mesh_dim_names=axis_names)

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
