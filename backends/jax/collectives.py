"""The native allreduce for JAX (:class:`~multidev.adapter.SupportsNativeCollectives`): ``psum``,
``pmax``, ``pmin`` (or an ordered fold over ``all_gather``) under ``jax.shard_map``."""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from multidev.adapter import CapabilityError, Concern, SupportsNativeCollectives, canonical_dtype

from .core import JaxCore

_ALLREDUCE_OPS = ("sum", "max", "min", "prod")
_CACHE_MAX = 256


def _reducer(prim: Callable[[Any, str], Any]) -> Callable[[Any], Any]:
    """``prim`` (``lax.pmax``, ...) over the mesh axis ``"i"``."""
    return lambda a: prim(a, "i")


class JaxCollectives(Concern, SupportsNativeCollectives):
    """A compiled ``shard_map`` per (devices, shape, dtype, op), over exactly the inputs' devices."""

    core: JaxCore

    def __init__(self, core: JaxCore) -> None:
        super().__init__(core)
        self._lock = threading.Lock()
        #: (devices, shape, dtype, op) -> the compiled psum and its sharding, at most _CACHE_MAX
        self._allreduce_cache: dict[tuple, tuple[Callable[[Any], Any], Any]] = {}

    def _allreduce_fn(self, natives: tuple, block: tuple[int, ...], dtype: Any, op: str) -> tuple:
        """A compiled shard_map over ``natives`` reducing one ``block``-shaped shard per device."""
        key = (natives, block, str(dtype), op)
        hit = self._allreduce_cache.get(key)
        if hit is not None:
            return hit
        jax, jnp = self.core.jax, self.core.jnp
        lax = jax.lax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        n = len(natives)
        name = canonical_dtype(dtype)
        is_bool, is_complex = name == "bool", name.startswith("complex")

        def fold(fn: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
            def body(a: Any) -> Any:  # same left-to-right order as the naive algorithm
                g = lax.all_gather(a, "i")
                acc = g[0]
                for k in range(1, n):
                    acc = fn(acc, g[k])
                return acc
            return body

        if op == "sum":
            body = (lambda a: lax.pmax(a, "i")) if is_bool else (lambda a: lax.psum(a, "i"))
        elif op in ("max", "min"):
            fn = jnp.maximum if op == "max" else jnp.minimum
            prim = lax.pmax if op == "max" else lax.pmin
            # XLA has no complex max/min all-reduce (UNIMPLEMENTED): fold over an all_gather.
            body = fold(fn) if is_complex else _reducer(prim)
        else:  # prod: there is no lax.pprod
            body = (lambda a: lax.pmin(a, "i")) if is_bool else fold(jnp.multiply)
        mesh = Mesh(np.array(natives, dtype=object), ("i",))
        sharding = NamedSharding(mesh, PartitionSpec("i"))
        smap = jax.shard_map(body, mesh=mesh, in_specs=PartitionSpec("i"),
                             out_specs=PartitionSpec("i"))
        gshape = (block[0] * n,) + tuple(block[1:])
        compiled = jax.jit(smap).lower(jax.ShapeDtypeStruct(gshape, dtype, sharding=sharding)).compile()
        with self._lock:
            if len(self._allreduce_cache) >= _CACHE_MAX:
                self._allreduce_cache.clear()
            self._allreduce_cache[key] = (compiled, sharding)
        return compiled, sharding

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        """``psum``/``pmax``/``pmin`` under ``jax.shard_map`` over the inputs' devices, compiled once
        per (devices, shape, dtype, op). The per-device inputs are the shards of one global array
        (no copy); result ``i`` is the output shard on input ``i``'s device.

        Asynchronous on GPUs; synchronous on CPU devices (several XLA:CPU collectives in flight
        can deadlock and abort the process). Devices of several platforms (CPUs and GPUs) cannot
        share one mesh: each platform reduces natively, the partial results are combined on the
        first input's device and copied back out.
        """
        jax = self.core.jax
        xs = list(xs)
        if op not in _ALLREDUCE_OPS:
            raise CapabilityError(f"jax backend: native allreduce has no op {op!r}; use one of "
                                  f"{', '.join(_ALLREDUCE_OPS)}")
        natives = tuple(self.core._native_of(x) for x in xs)
        shape, dtype = tuple(xs[0].shape), xs[0].dtype
        if 0 in shape:  # nothing to reduce (and XLA lays out empty shards unpredictably)
            return [self.core.jnp.empty(shape, dtype=dtype, device=nd) for nd in natives]
        groups: dict[str, list[int]] = {}
        for i, nd in enumerate(natives):
            groups.setdefault(nd.platform, []).append(i)
        if len(groups) == 1:
            return self._mesh_allreduce(xs, natives, op)
        home = natives[0]
        acc = None
        for idx in groups.values():
            part = self._mesh_allreduce([xs[i] for i in idx], tuple(natives[i] for i in idx), op)[0]
            part = part if part.devices() == {home} else jax.device_put(part, home)
            acc = part if acc is None else self.core.combine(op, acc, part)
        return [acc if nd == home else jax.device_put(acc, nd) for nd in natives]

    def _mesh_allreduce(self, xs: list[Any], natives: tuple, op: str) -> list[Any]:
        """The shard_map allreduce over devices of one platform (see native_allreduce)."""
        shape, dtype = tuple(xs[0].shape), xs[0].dtype
        scalar = len(shape) == 0
        block = (1,) if scalar else shape
        pieces = [x.reshape(1) for x in xs] if scalar else xs
        compiled, sharding = self._allreduce_fn(natives, block, dtype, op)
        if natives[0].platform == "cpu":
            # XLA:CPU starts each device's part of a collective as soon as that device's input is
            # ready, and aborts the process when the others have not joined within its rendezvous
            # timeout (15 s on jaxlib 0.7, 60 s on 0.10): an input still being computed (uneven
            # work before the allreduce) must be waited for here, on the host.
            for x in pieces:
                x.block_until_ready()
        gshape = (block[0] * len(xs),) + tuple(block[1:])
        glob = self.core.jax.make_array_from_single_device_arrays(gshape, sharding, pieces)
        out = compiled(glob)
        if natives[0].platform == "cpu":
            # Several collectives in flight deadlock XLA:CPU's device threads (each run's
            # participants wait for partners queued behind another run) until the rendezvous
            # timeout aborts the process: measured with jit(shard_map(psum)) alone, 2 devices,
            # 3,000 calls dispatched without waiting (jaxlib 0.10.2). So on CPU the collective is
            # synchronous: it returns once its result is ready (a queue gains nothing there).
            out.block_until_ready()
        by_dev = {s.device: s.data for s in out.addressable_shards}
        res = [by_dev[nd] for nd in natives]
        return [r.reshape(()) for r in res] if scalar else res
