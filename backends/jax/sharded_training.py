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

from multidev.adapter import (
    CapabilityError,
    Concern,
    Device,
    InvalidArgumentError,
    SupportsShardedTraining,
    param_spec,
)

from ._common import LossCache, host_array, own_copy, own_host_arrays, trainable
from .core import JaxCore
from .parallel import JaxReplica


class JaxShardedTraining(Concern, SupportsShardedTraining):
    """Parameter pytrees with optax, and flax ``TrainState``s, on a mesh."""

    core: JaxCore
    process_engine = "jax"  # (global arrays are JAX's multi-controller runtime's)

    def sharded_replica(self, model: Any, optimizer: Any, mesh: Any, data_axes: tuple[str, ...],
                        layout_for: Any) -> Any:
        jax = self.core.jax
        found = trainable(jax, model, optimizer, "data_parallel(state, mesh=...)")
        if found is None:
            return None
        state, params = found
        return JaxMeshReplica(self.core, jax, model if state else None, params, optimizer, mesh, data_axes, layout_for)

    def sharded_process_replica(self, model: Any, optimizer: Any, grid: Any, data_axes: tuple[str, ...],
                                param_axes: tuple[str, ...], grad_dtype: str | None) -> Any:
        """A replica of ``model`` (a parameter tree with an optax transformation, or a TrainState)
        as global arrays over the jax engine's processes laid out as ``grid`` (the process mesh):
        each tensor cut by the core's rule (:func:`multidev.adapter.param_spec`) along
        ``param_axes``, the batch along ``data_axes``. None where ``model`` is no JAX tree."""
        jax = self.core.jax
        found = trainable(jax, model, optimizer, "data_parallel(state, mesh=...)")
        if found is None:
            return None
        state, params = found
        if jax.process_count() != grid.size:
            raise CapabilityError(f"data_parallel over a process mesh of {grid.size} ranks shards JAX arrays with "
                                  f"JAX's multi-controller runtime, which has {jax.process_count()} process(es) here: "
                                  "start the group with the jax engine (python -m multidev.distributed.launch "
                                  "--engine jax, or JAX_COORDINATOR_ADDRESS and its variables)")
        if grad_dtype is not None:
            raise CapabilityError(f"data_parallel(grad_dtype={grad_dtype!r}) over a process mesh on JAX: XLA reduces "
                                  "the gradients inside the jitted step in their own dtype (cast the parameters to "
                                  "train in lower precision)")
        return JaxProcessMeshReplica(self.core, jax, model if state else None, params, optimizer, grid, data_axes,
                                     param_axes)


class JaxMeshReplica(JaxReplica):
    """The current trees, each tensor with its mesh layout's ``NamedSharding``."""

    processes_refusal: str | None = (
        "parameters sharded over a mesh across processes (one process over the mesh's devices)")

    def __init__(self, backend: Any, jax: Any, state: Any, params: Any, tx: Any, mesh: Any,
                 data_axes: tuple[str, ...], layout_for: Callable[[tuple[int, ...]], Any]) -> None:
        def sharding(x: Any) -> Any:
            shape = tuple(x.shape)
            return backend.sharding.sharding_for(layout_for(shape), shape)

        self.mesh = mesh
        self._setup(backend, jax, state, params, tx, list(mesh.devices), backend.mesh.to_native_mesh(mesh, "jax"),
                    data_axes, math.prod(mesh.sizes[a] for a in data_axes), sharding)

    def _setup(self, backend: Any, jax: Any, state: Any, params: Any, tx: Any, devices: list[Device], native: Any,
               data_axes: tuple[str, ...], rows: int, sharding: Callable[[Any], Any]) -> None:
        """The state over ``native`` (a ``jax.sharding.Mesh``): ``sharding(x)`` each tensor's, the
        batch cut into ``rows`` pieces along ``data_axes``."""
        from jax.sharding import NamedSharding, PartitionSpec

        self.backend, self.jax, self.jnp = backend, jax, backend.jnp
        self.devices: list[Device] = devices
        self._cpu_collectives = len(native.devices.flat) > 1 and all(d.kind == "cpu" for d in devices)
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
        self._replicated = NamedSharding(native, PartitionSpec())
        self._sharded = NamedSharding(native, PartitionSpec(data_axes if len(data_axes) > 1 else data_axes[0]))
        self._rows = rows
        self._sharding = sharding
        self._p_sh = tu.tree_map(sharding, params)
        opt = tx.init if state is None else state.tx.init
        self._o_sh = tu.tree_map(sharding, jax.eval_shape(opt, params))
        if state is None:  # made sharded: never whole on one device
            self._params = self._put(params, self._p_sh)
            self._opt_state = jax.jit(opt, out_shardings=self._o_sh)(self._params)
        self._place()
        self._update = jax.jit(self._update_fn, out_shardings=(self._p_sh, self._o_sh))
        self._add = jax.jit(lambda a, b: tu.tree_map(lambda x, y: x + y, a, b), out_shardings=self._p_sh)

    def _put(self, tree: Any, where: Any) -> Any:
        """``tree`` laid out as ``where`` (a sharding, or a tree of them like ``tree``)."""
        return self.jax.device_put(tree, where)

    def _place(self) -> None:
        if self._state is not None:
            s = self._state
            rest = s.replace(params=None, opt_state=None)
            rest = self._put(rest, self._replicated)  # the step count, batch statistics: whole everywhere
            self._state = rest.replace(params=self._put(s.params, self._p_sh),
                                       opt_state=self._put(s.opt_state, self._o_sh))
            self._params = self._state.params
        else:
            self._params = self._put(self._params, self._p_sh)
            self._opt_state = self._put(self._opt_state, self._o_sh)

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
        owned = own_host_arrays(jax, batch, leaves)  # (the caller may write its arrays once step returns)
        if owned is not batch:
            batch, leaves = owned, jax.tree_util.tree_leaves(owned)
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



class JaxProcessMeshReplica(JaxMeshReplica):
    """Global arrays over the processes' mesh (one device each), every process running the same
    jitted programs (JAX's multi-controller rule: each of this replica's calls is a collective).
    The trees read back whole on every rank (:attr:`model`, :attr:`opt_state`: one jitted gather,
    kept until the next step); the loss is the batch's mean as this process's own scalar."""

    #: XLA reduces the gradients inside the jitted step: no buckets, no start broadcast from the core.
    syncs_itself = True
    #: Every rank runs one program: the core checks that the ranks' batches agree before each step.
    one_program = True
    processes_refusal: str | None = None
    #: JAX's gradients are never missing (zeros where unused): the policy the core sets changes nothing.
    unused = "zero"

    def __init__(self, backend: Any, jax: Any, state: Any, params: Any, tx: Any, grid: Any,
                 data_axes: tuple[str, ...], param_axes: tuple[str, ...]) -> None:
        from jax.sharding import NamedSharding, PartitionSpec

        native = backend.mesh.to_native_process_mesh(tuple(grid.shape), tuple(grid.axis_names), "jax")
        me = jax.process_index()
        self._device = native.devices.reshape(-1)[me]  # this process's device of the mesh
        sizes = dict(zip(grid.axis_names, grid.shape))
        made: dict[tuple[int, ...], Any] = {}

        def sharding(x: Any) -> Any:
            shape = tuple(x.shape)
            hit = made.get(shape)
            if hit is None:
                hit = made[shape] = NamedSharding(native, PartitionSpec(*param_spec(sizes, shape, param_axes)))
            return hit

        rest = tuple(a for a in grid.axis_names if a not in param_axes)
        #: the ranks that hold the same pieces (they differ only along the axes that replicate them)
        self.peers = grid.groups(rest) if rest else tuple((r,) for r in range(grid.size))
        self._whole: tuple[Any, Any] = (None, None)  # (a tree, its gathered copy)
        self._gather: Any = None
        # The global batch is every rank's rows, cut along every mesh axis in rank order: ranks along
        # the parameter axes given the same rows (DataParallel.shard) hold duplicates, which leave the
        # mean as it is; given different rows, their mean counts them all (as FSDP's average does),
        # never one replica's rows mixed with another's.
        self._setup(backend, jax, state, params, tx, [backend.from_native_device(self._device)], native,
                    tuple(grid.axis_names), grid.size, sharding)
        self._cpu_collectives = self._device.platform == "cpu"

    # -- global arrays from each process's copy, and back ------------------------------------------------
    def _put(self, tree: Any, where: Any) -> Any:
        """Every process holds the same whole values (rank 0's, broadcast): each makes its own piece
        (no communication); a global array already laid out as wanted is kept."""
        jax = self.jax
        tu = jax.tree_util
        targets = tu.tree_map(lambda _: where, tree) if isinstance(where, jax.sharding.Sharding) else where

        def one(x: Any, sh: Any) -> Any:
            if isinstance(x, jax.Array) and x.sharding == sh:
                return x
            if isinstance(x, jax.Array) and not x.is_fully_addressable:
                raise CapabilityError("data_parallel over a process mesh: a global JAX array laid out otherwise "
                                      "cannot be re-laid out by one process alone")
            host = np.asarray(x)
            return jax.make_array_from_callback(host.shape, sh, lambda idx: host[idx])
        return tu.tree_map(one, tree, targets)

    def _local(self, tree: Any) -> Any:
        """This process's copies of replicated global arrays (single-device arrays)."""
        return self.jax.tree_util.tree_map(lambda a: a.addressable_data(0), tree)

    def _gathered(self, tree: Any) -> Any:
        """``tree`` whole on this process (a collective: one jitted gather), kept for the same tree."""
        kept, out = self._whole
        if kept is tree:
            return out
        if self._gather is None:
            self._gather = self.jax.jit(lambda t: t, out_shardings=self._replicated)
        out = self._local(self._gather(tree))
        if self._cpu_collectives:
            self.jax.block_until_ready(out)  # (see local_step)
        self._whole = (tree, out)
        return out

    @property
    def model(self) -> Any:
        """The parameters (or the TrainState) now, whole on this process (plain single-device arrays, a
        checkpoint as one process would write it). A collective the first time after a step: every
        rank reads it."""
        return self._gathered(self._params if self._state is None else self._state)

    @property
    def opt_state(self) -> Any:
        """The optimizer's state now, whole on this process (a collective, as :attr:`model`)."""
        return self._gathered(self._native_opt_state())

    def parameters(self) -> list[tuple[str, Any]]:
        """The parameters as the global arrays they are (each process holds its pieces)."""
        return list(zip(self._names, self.jax.tree_util.tree_leaves(self._params)))

    def buffers(self) -> list[tuple[str, Any]]:
        """A TrainState's batch statistics, this process's copies (they are replicated)."""
        return [(n, x.addressable_data(0)) for n, x in super().buffers()]

    def load(self, params: Any, buffers: Any) -> None:
        if params is not None:
            raise CapabilityError("data_parallel over a process mesh: the parameters are global arrays over the "
                                  "processes; give data_parallel the parameters to start from (it takes rank 0's)")
        if buffers is not None and self._state is not None:
            tu = self.jax.tree_util
            stats = self._state.batch_stats
            new = tu.tree_unflatten(tu.tree_structure(stats), list(buffers))
            self._state = self._state.replace(batch_stats=self._put(new, self._replicated))

    def optimizer_state(self) -> Any:
        """The optimizer's state, whole, as host copies (a collective)."""
        leaves = self.jax.tree_util.tree_leaves(self.opt_state)
        step = None if self._state is None else np.asarray(self._local(self._state.step))
        return {"leaves": [np.asarray(x) for x in leaves], "step": step}

    def load_optimizer_state(self, state: Any) -> None:
        tu = self.jax.tree_util
        like = self._opt_state if self._state is None else self._state.opt_state
        tree = self._put(tu.tree_unflatten(tu.tree_structure(like), [np.asarray(x) for x in state["leaves"]]),
                         self._o_sh)
        if self._state is None:
            self._opt_state = tree
        else:
            step = self._state.step if state["step"] is None else self._put(np.asarray(state["step"]),
                                                                            self._replicated)
            self._state = self._state.replace(opt_state=tree, step=step)

    # -- the step -------------------------------------------------------------------------------------------
    def _place_batch(self, batch: Any) -> Any:
        """This process's rows as its piece of one global batch cut along every mesh axis: the ranks'
        parts have one shape (the core checked), so the whole batch has world-size times the rows."""
        jax = self.jax

        def one(x: Any) -> Any:
            if isinstance(x, jax.Array) and x.sharding == self._sharded:
                return x
            if host_array(x):
                x = own_copy(x)  # (the caller may write its arrays once step returns)
            shape = tuple(x.shape)
            if not shape:
                raise InvalidArgumentError("DataParallel.step: every tensor of the batch has rows (a first axis), "
                                           "got a scalar")
            piece = jax.device_put(x, self._device)
            return jax.make_array_from_single_device_arrays((shape[0] * self._rows, *shape[1:]), self._sharded,
                                                            [piece])
        return jax.tree_util.tree_map(one, batch)

    def backward(self, batch: Any, loss_fn: Callable[..., Any], ready: Any) -> Any:
        return super().backward(batch, loss_fn, ready).addressable_data(0)

    def local_step(self, batch: Any, loss_fn: Callable[..., Any]) -> Any:
        """One jitted step over the processes; the loss (the whole batch's mean) as this process's
        scalar."""
        loss = super().local_step(batch, loss_fn)
        if self._cpu_collectives:
            # XLA:CPU may run two programs' collectives at once; the engine's own (the core's checks,
            # the user's dist calls) come from its dispatch thread: the step ends before they start
            self.jax.block_until_ready((loss, self._params, self._native_opt_state()))
        return loss.addressable_data(0)

    def _native_opt_state(self) -> Any:
        """The optimizer's state as the global arrays it is (no gather)."""
        return self._opt_state if self._state is None else self._state.opt_state

    def fingerprints(self) -> list[list[int]]:
        """One row: this process's pieces of the parameters, then the buffers."""
        return [[zlib.crc32(np.ascontiguousarray(np.asarray(t.addressable_data(0))).tobytes()) & 0x7FFFFFFF
                 for _, t in [*self.parameters(), *self.buffers()]]]
