"""JAX's own sharded arrays (:class:`~multidev.adapter.SupportsSharding`): a layout is a
``NamedSharding`` over the layout's mesh with a ``PartitionSpec`` per dimension. JAX places only
pieces of equal size (``device_put`` refuses others) and has no partial sums in a ``NamedSharding``:
uneven shapes raise CapabilityError, partial layouts are left to multidev's managed shards."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from multidev.adapter import CapabilityError, Device, Layout, SupportsSharding


class JaxSharding(SupportsSharding):
    """``NamedSharding`` both ways; ``device_put``; ``make_array_from_single_device_arrays``."""

    _jax: Any
    _native_meshes: dict[Any, Any]

    if TYPE_CHECKING:  # the core protocol (core.JaxCore) and the mesh (mesh.JaxMesh)
        def to_native_mesh(self, mesh: Any, kind: str) -> Any: ...
        def from_native_mesh(self, obj: Any) -> Any: ...
        def from_native_device(self, obj: Any) -> Device | None: ...

    def _native_mesh_of(self, mesh: Any) -> Any:
        cache = self._native_meshes
        nm = cache.get(mesh)
        if nm is None:
            nm = self.to_native_mesh(mesh, "jax")
            if len(cache) < 256:
                cache[mesh] = nm
        return nm

    def sharding_for(self, layout: Any, shape: tuple[int, ...]) -> Any:
        if layout.partial:
            return None
        odd = layout.uneven(shape)
        if odd:
            d, n, k = odd[0]
            raise CapabilityError(f"jax backend: a NamedSharding cuts a dimension into pieces of one size, but "
                                  f"dimension {d} of shape {tuple(shape)} has {n} elements for {k} pieces "
                                  f"(layout {layout.spec_text()}); pad it to a multiple of {k}, or use a backend "
                                  "with managed shards, which follow numpy.array_split")
        P = self._jax.sharding.PartitionSpec
        spec = P(*[None if not e else e[0] if len(e) == 1 else tuple(e) for e in layout.spec])
        return self._jax.sharding.NamedSharding(self._native_mesh_of(layout.mesh), spec)

    def layout_of(self, x: Any) -> Any:
        sh = getattr(x, "sharding", None)
        if sh is None or (len(sh.device_set) == 1 and not isinstance(sh, self._jax.sharding.NamedSharding)):
            return None
        if not isinstance(sh, self._jax.sharding.NamedSharding):
            raise CapabilityError(f"jax backend: this array's {type(sh).__name__} is no NamedSharding; multidev "
                                  "reads layouts of NamedShardings (jax.device_put(x, NamedSharding(...)) first)")
        mesh = self.from_native_mesh(sh.mesh)
        spec = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in sh.spec]
        return Layout(mesh, spec)

    def shards_of(self, x: Any) -> list[Any]:
        mesh = self.layout_of(x).mesh
        by_dev = {self.from_native_device(s.device): s.data for s in x.addressable_shards}
        return [by_dev[d] for d in mesh.devices]

    def place_sharded(self, x: Any, sharding: Any) -> Any:
        return self._jax.device_put(x, sharding)

    def assemble(self, shards: Sequence[Any], sharding: Any, shape: tuple[int, ...]) -> Any:
        return self._jax.make_array_from_single_device_arrays(tuple(shape), sharding, list(shards))
