"""TensorFlow's own meshes (:class:`~multidev.adapter.SupportsMesh`): a DTensor mesh
(``tf.experimental.dtensor.create_mesh``, kind ``"dtensor"``) and a Keras ``DeviceMesh``
(``keras.distribution.DeviceMesh``, kind ``"keras"``, whose devices are spellings such as
``"cpu:0"``). Both list devices row-major, as :class:`~multidev.Mesh` does. TensorFlow has no
topology-aware factory for one process, so the device order is the one given. Tensors on a mesh
stay multidev's managed shards (a DTensor needs DTensor's own ops throughout)."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, cast

from multidev.adapter import CapabilityError, Concern, Device, Mesh, SupportsMesh

from .core import TensorflowCore

_TF_KIND = {"cpu": "CPU", "gpu": "GPU"}


class TensorflowMesh(Concern, SupportsMesh):
    """DTensor and Keras meshes both ways."""

    core: TensorflowCore

    def mesh_device_order(self, shape: tuple[int, ...], devices: Sequence[Device]) -> list[Device]:
        return list(devices)

    def native_mesh_kinds(self) -> tuple[str, ...]:
        return ("dtensor", "keras")

    def to_native_mesh(self, mesh: Any, kind: str) -> Any:
        kinds = {d.kind for d in mesh.devices}
        if not kinds <= set(_TF_KIND) or len(kinds) > 1:
            raise CapabilityError(f"tensorflow backend: a {kind} mesh holds devices of one kind, CPU or GPU; "
                                  f"this one holds {', '.join(sorted(kinds))}")
        if kind == "dtensor":
            from tensorflow.experimental import dtensor

            return dtensor.create_mesh(list(zip(mesh.axis_names, mesh.shape)),
                                       devices=[f"{_TF_KIND[d.kind]}:{d.index}" for d in mesh.devices])
        if kind == "keras":
            import keras

            return keras.distribution.DeviceMesh(mesh.shape, list(mesh.axis_names),
                                                 devices=[f"{d.kind}:{d.index}" for d in mesh.devices])
        raise CapabilityError(f"tensorflow backend makes meshes of kind 'dtensor' or 'keras', not {kind!r}")

    def from_native_mesh(self, obj: Any) -> Any:
        dt = sys.modules.get("tensorflow.dtensor.python.layout")
        mesh_type: Any = getattr(dt, "Mesh", ())
        if isinstance(obj, mesh_type):
            obj = cast(Any, obj)
            if len(obj.global_device_ids().reshape(-1)) != len(obj.local_devices()):
                raise CapabilityError("tensorflow backend: this DTensor mesh spans several clients; multidev reads "
                                      "the mesh of one process")
            devs = []
            for name in obj.local_devices():
                d = self.core.from_native_device(name)
                if d is None:
                    raise CapabilityError(f"tensorflow backend: the mesh holds {name}, which is none of multidev's")
                devs.append(d)
            return Mesh(tuple(int(s) for s in obj.shape()), tuple(obj.dim_names), devs)
        keras = sys.modules.get("keras")
        dist = getattr(keras, "distribution", None)
        if dist is not None and isinstance(obj, dist.DeviceMesh):
            flat = [str(d) for d in obj.devices.reshape(-1)]
            return Mesh(tuple(obj.shape), tuple(obj.axis_names), [Device.parse(d) for d in flat])
        return None
