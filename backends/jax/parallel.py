"""Data parallelism for JAX (:class:`~multidev.adapter.SupportsDataParallel`): a parameter pytree
with any optax ``GradientTransformation``, or a flax ``TrainState`` (which carries its optimizer).

Arrays are immutable, so the replica holds the current tree and rebinds it each step (``dp.model``
is always the latest). The gradient is one jitted ``jax.value_and_grad`` of the loss function, the
optimizer's update one jitted call; across processes the core averages the gradients between the
two (flattened into buckets by jitted concatenations).

Several devices of one process are JAX's own data parallelism: one ``Mesh`` over them, the batch
sharded along its first axis (``NamedSharding(mesh, P("batch"))``), the parameters and optimizer
state replicated, and the same jitted functions, for which XLA inserts the gradient's all-reduce.
The replicated outputs are one value on every device. Rows must divide evenly over the devices.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from multidev.adapter import (
    CapabilityError,
    Concern,
    Device,
    InvalidArgumentError,
    Ready,
    Replica,
    SupportsDataParallel,
)

from ._common import LossCache, own_host_arrays, trainable
from .core import JaxCore


def _scalar_loss(loss_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``loss_fn`` refusing, while it is traced, a loss that is not a scalar (InvalidArgumentError,
    before value_and_grad's own TypeError): the check costs nothing per step."""
    def checked(params: Any, batch: Any) -> Any:
        loss = loss_fn(params, batch)
        if getattr(loss, "shape", None) != ():
            raise InvalidArgumentError(f"DataParallel.step: loss_fn must return a scalar, got shape "
                                       f"{getattr(loss, 'shape', type(loss).__name__)}")
        return loss
    return checked


class JaxParallel(Concern, SupportsDataParallel):
    """Parameter pytrees with optax, and flax ``TrainState``s."""

    core: JaxCore

    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        jax = self.core.jax
        found = trainable(jax, model, optimizer, "data_parallel(state)")
        if found is None:
            return None
        state, params = found
        kinds = sorted({d.kind for d in devices})
        if len(kinds) > 1:
            raise CapabilityError(f"data_parallel: JAX replicates over one mesh, whose devices are of one kind; got "
                                  f"{', '.join(map(str, devices))} ({' and '.join(kinds)}): pass devices of one kind")
        return JaxReplica(self.core, jax, model if state else None, params, optimizer, list(devices))


class JaxReplica(Replica):
    """The current parameters and optimizer state (or TrainState), rebound every step."""

    def __init__(self, backend: Any, jax: Any, state: Any, params: Any, tx: Any, devices: list[Device]) -> None:
        self.backend, self.jax, self.jnp, self.devices = backend, jax, backend.jnp, devices
        self.optimizer = tx if state is None else state.tx
        self._state = state
        self._params = params
        tu = jax.tree_util
        self._names = [tu.keystr(path) for path, _ in tu.tree_flatten_with_path(params)[0]]
        self._treedef = tu.tree_structure(params)
        self._acc: Any = None
        self._grad_fns, self._step_fns = LossCache(), LossCache()
        self._splits: dict[Any, Any] = {}
        self._placed: dict[int, Any] = {}  # shardings seen equal to the batch's target, by id (kept alive)
        self._last: tuple[Any, Any] = (None, None)  # the last loss function and its fused step
        self._leaves = jax.tree_util.tree_flatten  # (leaves, treedef): cheaper a step than tree_leaves
        self._replicated = self._sharded = None
        self._cpu_collectives = len(devices) > 1 and all(d.kind == "cpu" for d in devices)
        if len(devices) > 1:
            self.processes_refusal = (
                "JAX over several devices of each of several processes: run one process per device, or "
                "one process over all of them")
            from jax.sharding import Mesh, NamedSharding, PartitionSpec

            mesh = Mesh(np.array([backend.to_native_device(d) for d in devices]), ("batch",))
            self._replicated = NamedSharding(mesh, PartitionSpec())
            self._sharded = NamedSharding(mesh, PartitionSpec("batch"))
        else:
            from jax.sharding import SingleDeviceSharding

            self._one = backend.to_native_device(devices[0])
            self._one_sharding = SingleDeviceSharding(self._one)
        if state is None:
            self._opt_state = tx.init(params)
        self._place()
        self._update = jax.jit(self._update_fn)
        self._add = jax.jit(lambda a, b: jax.tree_util.tree_map(lambda x, y: x + y, a, b))

    # -- the current trees ------------------------------------------------------------------------
    @property
    def model(self) -> Any:
        return self._params if self._state is None else self._state

    @property
    def opt_state(self) -> Any:
        """The optimizer's state now (a TrainState's own ``opt_state``)."""
        return self._opt_state if self._state is None else self._state.opt_state

    def _place(self) -> None:
        """The trees on the replica's devices: replicated over several, committed to one."""
        where = self._replicated if self._replicated is not None else self._one
        if self._state is not None:
            self._state = self.jax.device_put(self._state, where)
            self._params = self._state.params
        else:
            self._params = self.jax.device_put(self._params, where)
            self._opt_state = self.jax.device_put(self._opt_state, where)

    def _set_params(self, params: Any) -> None:
        self._params = params
        if self._state is not None:
            self._state = self._state.replace(params=params)

    # -- Replica --------------------------------------------------------------------------------------
    def parameters(self) -> list[tuple[str, Any]]:
        return list(zip(self._names, self.jax.tree_util.tree_leaves(self._params)))

    def buffers(self) -> list[tuple[str, Any]]:
        stats = getattr(self._state, "batch_stats", None) if self._state is not None else None
        if stats is None:
            return []
        tu = self.jax.tree_util
        return [(".batch_stats" + tu.keystr(p), x) for p, x in tu.tree_flatten_with_path(stats)[0]]

    def load(self, params: Sequence[Any] | None, buffers: Sequence[Any] | None) -> None:
        tu = self.jax.tree_util
        if params is not None:
            self._set_params(tu.tree_unflatten(self._treedef, list(params)))
        if buffers is not None and self._state is not None:
            stats = self._state.batch_stats
            self._state = self._state.replace(batch_stats=tu.tree_unflatten(tu.tree_structure(stats), list(buffers)))
        self._place()

    def optimizer_state(self) -> Any:
        leaves = self.jax.tree_util.tree_leaves(self.opt_state)
        step = None if self._state is None else np.asarray(self._state.step)
        return {"leaves": [np.asarray(x) for x in leaves], "step": step}

    def load_optimizer_state(self, state: Any) -> None:
        tu = self.jax.tree_util
        tree = tu.tree_unflatten(tu.tree_structure(self.opt_state), [self.jnp.asarray(x) for x in state["leaves"]])
        if self._state is None:
            self._opt_state = tree
        else:
            step = state["step"]
            self._state = self._state.replace(opt_state=tree, step=self.jnp.asarray(step) if step is not None
                                              else self._state.step)
        self._place()

    def _grad_fn(self, loss_fn: Callable[..., Any]) -> Any:
        fn = self._grad_fns.get(loss_fn)
        if fn is None:
            vg = self.jax.value_and_grad(loss_fn)
            if self._replicated is not None:
                fn = self.jax.jit(vg, out_shardings=(self._replicated, self._replicated))
            else:
                fn = self.jax.jit(vg)
            self._grad_fns.put(loss_fn, fn)
        return fn

    def _place_batch(self, batch: Any) -> Any:
        leaves = self._leaves(batch)[0]
        owned = own_host_arrays(self.jax, batch, leaves)  # (the caller may write its arrays once step returns)
        if owned is not batch:
            batch, leaves = owned, self._leaves(owned)[0]
        placed, one = self._placed, self._sharded is None
        for x in leaves:
            if id(getattr(x, "sharding", None)) not in placed:
                if one and type(x) is np.ndarray:
                    continue  # a host array: the jitted step copies it to its parameters' device itself
                break
        else:
            if leaves:
                return batch  # already there: a sharding seen before (an identity lookup, no __eq__)
        return self._place_new(batch, leaves)

    def _place_new(self, batch: Any, leaves: list[Any]) -> Any:
        jax, placed = self.jax, self._placed
        target = self._sharded if self._sharded is not None else self._one_sharding
        if leaves and all(isinstance(x, jax.Array) and x.sharding == target for x in leaves):
            if len(placed) >= 64:
                placed.clear()
            placed.update((id(x.sharding), x.sharding) for x in leaves)
            return batch  # already there (device_put of resident arrays costs ~45 us a step)
        if self._sharded is None:
            if leaves and all(type(x) is np.ndarray for x in leaves):
                # Host arrays: the jitted step copies them to the device of its committed parameters
                # itself (in C++; a device_put first cost ~200 us of Python a step).
                return batch
            return jax.device_put(batch, self._one)
        n = len(self.devices)
        for x in leaves:
            rows = x.shape[0] if getattr(x, "ndim", 0) else 0
            if rows % n:
                raise InvalidArgumentError(f"DataParallel.step: a batch of {rows} rows over {n} devices: JAX shards "
                                           f"the rows evenly, so give it a multiple of {n}")
        return jax.device_put(batch, self._sharded)

    def backward(self, batch: Any, loss_fn: Callable[..., Any], ready: Ready | None) -> Any:
        loss, grads = self._grad_fn(loss_fn)(self._params, self._place_batch(batch))
        if getattr(loss, "shape", None) != ():
            raise InvalidArgumentError(f"DataParallel.step: loss_fn must return a scalar, got shape "
                                       f"{getattr(loss, 'shape', type(loss).__name__)}")
        self._acc = grads if self._acc is None else self._add(self._acc, grads)
        if self._cpu_collectives:
            # Micro-batches' gradients (no_sync) do not wait for each other: on several CPU devices
            # their all-reduces would be in flight together, which deadlocks XLA:CPU (see
            # collectives.py). One at a time there.
            self.jax.block_until_ready(self._acc)
        if ready is not None:
            gs = self.jax.tree_util.tree_leaves(self._acc)
            for i in range(len(gs) - 1, -1, -1):  # last layers first: the first buckets fill first
                ready(i, gs[i])
        return loss

    def drop_gradients(self) -> None:
        self._acc = None

    def local_step(self, batch: Any, loss_fn: Callable[..., Any]) -> Any:
        """The gradient and the optimizer's update in one jitted call (one dispatch, as a JAX
        user's own ``train_step``), where no gradients were accumulated before."""
        if self._acc is not None:
            return super().local_step(batch, loss_fn)
        last, fn = self._last
        if last is not loss_fn:
            fn = self._step_fn(loss_fn)
            self._last = (loss_fn, fn)
        # The loss's shape is checked while tracing (_scalar_loss): once per batch shape, not per step.
        loss, params, opt_state = fn(self._params, self._opt_state if self._state is None else self._state.opt_state,
                                     self._place_batch(batch))
        if self._state is None:
            self._params, self._opt_state = params, opt_state
        else:
            self._state = self._state.replace(params=params, opt_state=opt_state, step=self._state.step + 1)
            self._params = params
        return loss

    def _step_fn(self, loss_fn: Callable[..., Any]) -> Any:
        fn = self._step_fns.get(loss_fn)
        if fn is None:
            vg = self.jax.value_and_grad(_scalar_loss(loss_fn))

            def fused(params: Any, opt_state: Any, batch: Any) -> tuple[Any, Any, Any]:
                loss, grads = vg(params, batch)
                return (loss, *self._update_fn(params, opt_state, grads))

            outs = self._step_out_shardings()
            fn = self._step_fns.put(loss_fn, self.jax.jit(fused) if outs is None else
                                    self.jax.jit(fused, out_shardings=outs))
        return fn

    def _step_out_shardings(self) -> Any:
        """The fused step's output shardings (loss, parameters, optimizer state): replicated over
        several devices, JAX's own choice (None) on one."""
        return None if self._replicated is None else (self._replicated,) * 3

    def _update_fn(self, params: Any, opt_state: Any, grads: Any) -> tuple[Any, Any]:
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        new = self.jax.tree_util.tree_map(lambda p, u: (p + u).astype(p.dtype), params, updates)
        return new, opt_state

    def apply(self, grads: Sequence[Any | None] | None) -> None:
        tree = self._acc if grads is None else self.jax.tree_util.tree_unflatten(self._treedef, list(grads))
        self._acc = None
        if tree is None:
            return
        if self._state is None:
            self._params, self._opt_state = self._update(self._params, self._opt_state, tree)
        else:
            params, opt_state = self._update(self._state.params, self._state.opt_state, tree)
            self._state = self._state.replace(params=params, opt_state=opt_state, step=self._state.step + 1)
            self._params = params

    def piece_optimizer(self, pieces: list[Any]) -> Any:
        """The optax transformation over ``pieces`` (this rank's piece of every parameter), refused
        where its traced update is not element by element (see ``backends/jax/_common.py``) or a
        TrainState has stepped already (see :meth:`multidev.adapter.Replica.piece_optimizer`)."""
        from ._common import JaxPieces, elementwise_refusal

        if any(p is None for p in pieces):
            raise CapabilityError("data_parallel(param_axis=...): a JAX optimizer over pieces steps a piece of "
                                  "every parameter")
        if self._state is not None and int(self._state.step) != 0:
            raise CapabilityError("data_parallel(param_axis=...): the TrainState has stepped already, and its "
                                  "optimizer's state cannot be cut into pieces; start from a fresh one")
        tree = self.jax.tree_util.tree_unflatten(self._treedef, list(pieces))
        whole = self.jax.tree_util.tree_map(lambda x: self.jax.ShapeDtypeStruct(x.shape, x.dtype), self._params)
        why = elementwise_refusal(self.jax, self.optimizer, tree, whole)
        if why is not None:
            raise CapabilityError(f"data_parallel(param_axis=...): multidev cannot shard this optax "
                                  f"transformation's state, its update is not element by element: {why} (under "
                                  "the jax engine JAX's own global arrays shard any transformation)")
        return JaxPieces(self.jax, self.optimizer, list(pieces), self._treedef, self)

    def drop_whole_optimizer_state(self) -> None:
        """Forget the optimizer's state over the whole parameters (an optimizer over pieces holds it)."""
        if self._state is None:
            self._opt_state = None
        else:
            self._state = self._state.replace(opt_state=None)

    def zeros_like(self, x: Any) -> Any:
        return self.jnp.zeros_like(x)

    def flatten(self, tensors: Sequence[Any], dtype: str | None) -> Any:
        key = ("flat", dtype)
        fn = self._splits.get(key)
        if fn is None:
            jnp = self.jnp
            to = None if dtype is None else self.backend.to_native_dtype(dtype)

            def flat(ts: list[Any]) -> Any:
                out = jnp.concatenate([t.reshape(-1) for t in ts])
                return out if to is None else out.astype(to)
            fn = self._splits[key] = self.jax.jit(flat)
        return fn(list(tensors))

    def unflatten(self, flat: Any, like: Sequence[Any], scale: float | None) -> list[Any]:
        shapes = tuple(tuple(t.shape) for t in like)
        key = (shapes, str(like[0].dtype), scale)
        fn = self._splits.get(key)
        if fn is None:
            dtype = like[0].dtype
            sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]

            def cut(f: Any) -> list[Any]:
                f = f.astype(dtype) if scale is None else (f.astype(dtype) * scale).astype(dtype)
                out, at = [], 0
                for s, n in zip(shapes, sizes):
                    out.append(f[at:at + n].reshape(s))
                    at += n
                return out
            fn = self._splits[key] = self.jax.jit(cut)
        return list(fn(flat))

    def fingerprints(self) -> list[list[int]]:
        tensors = [t for _, t in [*self.parameters(), *self.buffers()]]
        rows: list[list[int]] = [[] for _ in self.devices]
        native = [self.backend.to_native_device(d) for d in self.devices]
        for t in tensors:
            by_device = {s.device: s.data for s in t.addressable_shards}
            for row, dev in zip(rows, native):
                data = by_device.get(dev, t)
                row.append(zlib.crc32(np.ascontiguousarray(np.asarray(data)).tobytes()) & 0x7FFFFFFF)
        return rows
