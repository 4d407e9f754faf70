"""JAX's own mesh (:class:`~multidev.adapter.SupportsMesh`): ``jax.sharding.Mesh``, with the device
order ``jax.make_mesh`` would choose (``mesh_utils.create_device_mesh``: the hardware's topology on
TPUs and GPUs, the devices' order on CPUs)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from multidev.adapter import CapabilityError, Concern, Device, Mesh, SupportsMesh

from .core import JaxCore


class JaxMesh(Concern, SupportsMesh):
    """``jax.sharding.Mesh`` both ways; the order of ``mesh_utils.create_device_mesh``."""

    core: JaxCore

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
