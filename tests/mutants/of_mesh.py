"""Mutants of the JAX adapter's mesh and sharded arrays (``backends/jax/mesh.py``, ``sharding.py``),
each caught by a check of ``conformance_tests/test_mesh.py``. (The managed shards of the other
backends are multidev's core, checked by ``tests/test_mesh.py``; their adapters' methods the
placement uses, split, move, concat, have mutants of their own.)"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from multidev.adapter import Device, Layout, concern
from multidev.adapters.jax import JaxBackend
from multidev.adapters.jax.mesh import JaxMesh
from multidev.adapters.jax.sharding import JaxSharding

from ._base import mutant


class _JaxMeshOrderRepeatsMesh(JaxMesh):
    def mesh_device_order(self, shape: tuple[int, ...], devices: Sequence[Device]) -> list[Device]:
        return [devices[0]] * len(devices)


@mutant("jax", "mesh_device_order gives the first device for every place on the grid",
        ["test_make_mesh_uses_distinct_devices_of_the_backend"])
class JaxMeshOrderRepeats(JaxBackend):
    name = "jax_mesh_order_repeats"
    mesh = concern(_JaxMeshOrderRepeatsMesh)


class _JaxNativeMeshColumnMajorMesh(JaxMesh):
    def to_native_mesh(self, mesh: Any, kind: str) -> Any:
        import numpy as np

        natives = np.empty(len(mesh.devices), dtype=object)
        natives[:] = [self.core.to_native_device(d) for d in mesh.devices]
        return self.core.jax.sharding.Mesh(natives.reshape(mesh.shape, order="F"), mesh.axis_names)


@mutant("jax", "to_native_mesh fills the grid column-major (numpy order='F')", ["test_native_mesh_round_trip"])
class JaxNativeMeshColumnMajor(JaxBackend):
    name = "jax_native_mesh_column_major"
    mesh = concern(_JaxNativeMeshColumnMajorMesh)


class _JaxShardsInJaxOrderSharding(JaxSharding):
    def shards_of(self, x: Any) -> list[Any]:
        return [s.data for s in sorted(x.addressable_shards, key=lambda s: s.device.id)]


@mutant("jax", "shards_of lists addressable_shards in JAX's order (device ids), not the mesh's",
        ["test_layout_places_each_piece_on_its_device"])
class JaxShardsInJaxOrder(JaxBackend):
    name = "jax_shards_in_jax_order"
    sharding = concern(_JaxShardsInJaxOrderSharding)


class _JaxLayoutOfMultiAxisSharding(JaxSharding):
    def layout_of(self, x: Any) -> Any:
        sh = getattr(x, "sharding", None)
        if sh is None or not isinstance(sh, self.core.jax.sharding.NamedSharding):
            return None
        spec = [() if e is None else (e if isinstance(e, str) else "+".join(e),) for e in sh.spec]
        return Layout(self.core.from_native_mesh(sh.mesh), spec)


@mutant("jax", "layout_of reads a PartitionSpec entry naming two axes as one axis name",
        ["test_layout_places_each_piece_on_its_device"])
class JaxLayoutOfMultiAxis(JaxBackend):
    name = "jax_layout_of_multi_axis"
    sharding = concern(_JaxLayoutOfMultiAxisSharding)


class _JaxLayoutOfHidesReplicasSharding(JaxSharding):
    def layout_of(self, x: Any) -> Any:
        sh = getattr(x, "sharding", None)
        if sh is not None and getattr(sh, "is_fully_replicated", False):
            return None
        return super().layout_of(x)


@mutant("jax", "layout_of takes a fully replicated array for one on a single device (None)",
        ["test_layout_round_trip"])
class JaxLayoutOfHidesReplicas(JaxBackend):
    name = "jax_layout_of_hides_replicas"
    sharding = concern(_JaxLayoutOfHidesReplicasSharding)


class _JaxPlaceKeepsShardedSharding(JaxSharding):
    def place_sharded(self, x: Any, sharding: Any) -> Any:
        if len(x.sharding.device_set) > 1:
            return x
        return super().place_sharded(x, sharding)


@mutant("jax", "place_sharded keeps an array that is already sharded as it is (no device_put)",
        ["test_change_of_layout"])
class JaxPlaceKeepsSharded(JaxBackend):
    name = "jax_place_keeps_sharded"
    sharding = concern(_JaxPlaceKeepsShardedSharding)


class _JaxShardingTakesUnevenSharding(JaxSharding):
    def sharding_for(self, layout: Any, shape: tuple[int, ...]) -> Any:
        if layout.partial:
            return None
        P = self.core.jax.sharding.PartitionSpec
        spec = P(*[None if not e else e[0] if len(e) == 1 else tuple(e) for e in layout.spec])
        return self.core.jax.sharding.NamedSharding(self.core.to_native_mesh(layout.mesh, "jax"), spec)


@mutant("jax", "sharding_for takes uneven shapes (device_put then fails with JAX's ValueError)",
        ["test_uneven_pieces_follow_array_split"])
class JaxShardingTakesUneven(JaxBackend):
    name = "jax_sharding_takes_uneven"
    sharding = concern(_JaxShardingTakesUnevenSharding)


class _JaxAssembleConcatenatesSharding(JaxSharding):
    def assemble(self, shards: Sequence[Any], sharding: Any, shape: tuple[int, ...]) -> Any:
        jax = self.core.jax
        host = [jax.device_put(s, jax.devices("cpu")[0]) for s in shards]
        return jax.device_put(self.core.jnp.concatenate(host, axis=0)[: shape[0]], sharding)


@mutant("jax", "assemble concatenates the pieces along dimension 0 and device_puts the result",
        ["test_from_shards_rebuilds_the_tensor"])
class JaxAssembleConcatenates(JaxBackend):
    name = "jax_assemble_concatenates"
    sharding = concern(_JaxAssembleConcatenatesSharding)


class _JaxShardsOnDefaultDeviceSharding(JaxSharding):
    def shards_of(self, x: Any) -> list[Any]:
        return [self.core.jax.device_put(p, self.core.jax.devices("cpu")[0]) for p in super().shards_of(x)]


@mutant("jax", "shards_of copies each piece with jnp.asarray, onto JAX's default device",
        ["test_convert_keeps_the_layout", "test_layout_places_each_piece_on_its_device"])
class JaxShardsOnDefaultDevice(JaxBackend):
    name = "jax_shards_on_default_device"
    sharding = concern(_JaxShardsOnDefaultDeviceSharding)


class _JaxUnshardGivesAPieceSharding(JaxSharding):
    def unshard(self, x: Any, device: Device) -> Any:
        pieces = {self.core.from_native_device(s.device): s.data for s in x.addressable_shards}
        piece = pieces.get(device, next(iter(pieces.values())))
        return self.core.jax.device_put(piece, self.core.to_native_device(device))


@mutant("jax", "unshard gives the piece on the target device (or the first piece), not the whole tensor",
        ["test_layout_round_trip"])
class JaxUnshardGivesAPiece(JaxBackend):
    name = "jax_unshard_gives_a_piece"
    sharding = concern(_JaxUnshardGivesAPieceSharding)
