"""Training over a mesh with sharded parameters for JAX (:class:`~multidev.adapter.SupportsShardedTraining`):
the replica of ``parallel.py`` with a ``NamedSharding`` per tensor instead of one replicated layout.
The batch is cut along the data axes, each parameter and optimizer-state tensor follows the core's
layout for its shape, and the jitted step's outputs keep those shardings (XLA inserts the
all-gathers of the parameters and the reduce-scatters of the gradients). The optimizer's state is
made sharded (``jit(tx.init)`` with the shardings as outputs), never whole on one device.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from multidev.adapter import Concern, Device, InvalidArgumentError, SupportsShardedTraining

from ._common import LossCache
from .core import JaxCore
from .parallel import JaxReplica


def _is_train_state(obj: Any) -> bool:  # (parallel.py's test: a flax TrainState, or any object like it)
    return all(hasattr(obj, a) for a in ("params", "opt_state", "tx", "apply_gradients", "replace"))


class JaxShardedTraining(Concern, SupportsShardedTraining):
    """Parameter pytrees with optax, and flax ``TrainState``s, on a mesh."""

    core: JaxCore

    def sharded_replica(self, model: Any, optimizer: Any, mesh: Any, data_axes: tuple[str, ...],
                        layout_for: Any) -> Any:
        jax = self.core.jax
        state = _is_train_state(model)
        params = model.params if state else model
        arrays = jax.tree_util.tree_leaves(params)
        if not arrays or not all(isinstance(a, jax.Array) for a in arrays):
            return None
        if state and optimizer is not None:
            raise InvalidArgumentError("data_parallel: a TrainState carries its own optimizer (its tx): "
                                       "pass data_parallel(state, mesh=...)")
        if not state and not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update",
                                                                                               None))):
            raise InvalidArgumentError(f"data_parallel: JAX parameters train with an optax GradientTransformation "
                                       f"(init and update), got {type(optimizer).__name__}")
        return JaxMeshReplica(self.core, jax, model if state else None, params, optimizer, mesh, data_axes, layout_for)


class JaxMeshReplica(JaxReplica):
    """The current trees, each tensor with its mesh layout's ``NamedSharding``."""

    processes_refusal = "parameters sharded over a mesh across processes (one process over the mesh's devices)"

    def __init__(self, backend: Any, jax: Any, state: Any, params: Any, tx: Any, mesh: Any,
                 data_axes: tuple[str, ...], layout_for: Callable[[tuple[int, ...]], Any]) -> None:
        from jax.sharding import NamedSharding, PartitionSpec

        self.backend, self.jax, self.jnp = backend, jax, backend.jnp
        self.devices: list[Device] = list(mesh.devices)
        self._cpu_collectives = len(self.devices) > 1 and all(d.kind == "cpu" for d in self.devices)
        self.mesh = mesh
        self.optimizer = tx if state is None else state.tx
        self._state, self._params = state, params
        tu = jax.tree_util
        self._names = [tu.keystr(path) for path, _ in tu.tree_flatten_with_path(params)[0]]
        self._treedef = tu.tree_structure(params)
        self._acc = None
        self._grad_fns, self._step_fns = LossCache(), LossCache()
        self._splits = {}
        self._placed: dict[int, Any] = {}  # the state JaxReplica's batch placement and fused step keep
        self._last: tuple[Any, Any] = (None, None)
        self._leaves = jax.tree_util.tree_flatten
        native = backend.mesh.to_native_mesh(mesh, "jax")
        self._replicated = NamedSharding(native, PartitionSpec())
        self._sharded = NamedSharding(native, PartitionSpec(data_axes if len(data_axes) > 1 else data_axes[0]))
        self._rows = math.prod(mesh.sizes[a] for a in data_axes)

        def sharding(x: Any) -> Any:
            shape = tuple(x.shape)
            return backend.sharding.sharding_for(layout_for(shape), shape)

        self._sharding = sharding
        self._p_sh = tu.tree_map(sharding, params)
        opt = tx.init if state is None else state.tx.init
        self._o_sh = tu.tree_map(sharding, jax.eval_shape(opt, params))
        if state is None:  # made sharded: never whole on one device
            self._params = jax.device_put(params, self._p_sh)
            self._opt_state = jax.jit(opt, out_shardings=self._o_sh)(self._params)
        self._place()
        self._update = jax.jit(self._update_fn, out_shardings=(self._p_sh, self._o_sh))
        self._add = jax.jit(lambda a, b: tu.tree_map(lambda x, y: x + y, a, b), out_shardings=self._p_sh)

    def _place(self) -> None:
        jax = self.jax
        if self._state is not None:
            s = self._state
            rest = s.replace(params=None, opt_state=None)
            rest = jax.device_put(rest, self._replicated)  # the step count, batch statistics: whole everywhere
            self._state = rest.replace(params=jax.device_put(s.params, self._p_sh),
                                       opt_state=jax.device_put(s.opt_state, self._o_sh))
            self._params = self._state.params
        else:
            self._params = jax.device_put(self._params, self._p_sh)
            self._opt_state = jax.device_put(self._opt_state, self._o_sh)

    def _grad_fn(self, loss_fn: Callable[..., Any]) -> Any:
        fn = self._grad_fns.get(loss_fn)
        if fn is None:
            fn = self._grad_fns.put(loss_fn, self.jax.jit(self.jax.value_and_grad(loss_fn),
                                                           out_shardings=(self._replicated, self._p_sh)))
        return fn

    def _step_out_shardings(self) -> Any:
        return (self._replicated, self._p_sh, self._o_sh)

    def _place_batch(self, batch: Any) -> Any:
        jax = self.jax
        leaves = jax.tree_util.tree_leaves(batch)
        if leaves and all(isinstance(x, jax.Array) and x.sharding == self._sharded for x in leaves):
            return batch
        for x in leaves:
            rows = x.shape[0] if getattr(x, "ndim", 0) else 0
            if rows % self._rows:
                raise InvalidArgumentError(f"DataParallel.step: a batch of {rows} rows cut along the mesh's data axes "
                                           f"({self._rows} pieces): JAX cuts them evenly, so give it a multiple of "
                                           f"{self._rows}")
        return jax.device_put(batch, self._sharded)

    def fingerprints(self) -> list[list[int]]:
        """One row: each parameter and buffer is one global array over the mesh (its pieces are not
        copies of each other), read whole."""
        return [[zlib.crc32(np.ascontiguousarray(np.asarray(t)).tobytes()) & 0x7FFFFFFF
                 for _, t in [*self.parameters(), *self.buffers()]]]

