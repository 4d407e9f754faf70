"""JAX's own sharded arrays (:class:`~multidev.adapter.SupportsSharding`): a layout is a
``NamedSharding`` over the layout's mesh with a ``PartitionSpec`` per dimension. JAX places only
pieces of equal size (``device_put`` refuses others) and has no partial sums in a ``NamedSharding``:
uneven shapes raise CapabilityError, partial layouts are left to multidev's managed shards."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from multidev.adapter import CapabilityError, Concern, Device, Layout, SupportsSharding

from ._common import refuse_uneven
from .core import JaxCore


class JaxSharding(Concern, SupportsSharding):
    """``NamedSharding`` both ways; ``device_put``; ``make_array_from_single_device_arrays``."""

    core: JaxCore

    def __init__(self, core: JaxCore) -> None:
        super().__init__(core)
        self._shardings: dict[Any, Any] = {}  # multidev Layout -> NamedSharding
        self._layouts: dict[Any, tuple[Any]] = {}  # jax sharding -> (its multidev Layout or None,)

    def sharding_for(self, layout: Any, shape: tuple[int, ...]) -> Any:
        if layout.partial:
            return None
        refuse_uneven(layout, shape, ", or use a backend with managed shards, which follow numpy.array_split")
        cache = self._shardings  # layout -> its NamedSharding (one object: JAX's own caches key by it)
        hit = cache.get(layout)
        if hit is None:
            P = self.core.jax.sharding.PartitionSpec
            spec = P(*[None if not e else e[0] if len(e) == 1 else tuple(e) for e in layout.spec])
            hit = self.core.jax.sharding.NamedSharding(self.core.mesh.to_native_mesh(layout.mesh, "jax"), spec)
            if len(cache) < 1024:
                cache[layout] = hit
        return hit

    def layout_of(self, x: Any) -> Any:
        sh = getattr(x, "sharding", None)
        try:
            hit = self._layouts.get(sh)
        except TypeError:  # an unhashable sharding: read it the long way
            hit = None
        if hit is not None:
            return hit[0]
        if sh is None or (len(sh.device_set) == 1 and not isinstance(sh, self.core.jax.sharding.NamedSharding)):
            if sh is not None and len(self._layouts) < 1024:
                self._layouts[sh] = (None,)
            return None
        if not sh.is_fully_addressable:  # across processes: the mesh concern's (process_layout_of)
            return None
        if not isinstance(sh, self.core.jax.sharding.NamedSharding):
            raise CapabilityError(f"jax backend: this array's {type(sh).__name__} is no NamedSharding; multidev "
                                  "reads layouts of NamedShardings (jax.device_put(x, NamedSharding(...)) first)")
        mesh = self.core.mesh.from_native_mesh(sh.mesh)
        spec = [() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in sh.spec]
        lay = Layout(mesh, spec)
        if len(self._layouts) < 1024:
            self._layouts[sh] = (lay,)
        return lay

    def shards_of(self, x: Any) -> list[Any]:
        mesh = self.layout_of(x).mesh
        by_dev = {self.core.from_native_device(s.device): s.data for s in x.addressable_shards}
        return [by_dev[d] for d in mesh.devices]

    def place_sharded(self, x: Any, sharding: Any) -> Any:
        return self.core.jax.device_put(x, sharding)

    def unshard(self, x: Any, device: Device) -> Any:
        return self.core.jax.device_put(x, self.core.to_native_device(device))

    def assemble(self, shards: Sequence[Any], sharding: Any, shape: tuple[int, ...]) -> Any:
        return self.core.jax.make_array_from_single_device_arrays(tuple(shape), sharding, list(shards))
