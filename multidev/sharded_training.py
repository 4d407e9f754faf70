"""Training over a device mesh, parameters sharded: what ``multidev.data_parallel(model,
optimizer, mesh=m, data_axis="data", param_axis="model")`` adds to data parallelism.

- One process over the mesh's devices (a :class:`~multidev.Mesh`): a batch's rows are cut along the
  data axes, each parameter and its optimizer state along the parameter axes (FSDP/ZeRO-style: each
  device holds its piece), and the framework's compiler inserts the collectives (JAX: ``jit`` over
  ``NamedSharding``s). The rule for a tensor's layout is here, once, framework-free:
  :func:`param_layout`.
- One process per device (a :class:`~multidev.distributed.ProcessMesh` of the group's ranks): the
  framework's own sharded data parallelism (torch: FSDP2, its own layout rule; JAX: one jitted
  program over global arrays on the jax engine's processes, the rule above), or multidev's own where
  the framework has none (Keras, Gluon: the optimizer's state sharded, :mod:`multidev.managed_sharding`),
  every rank starting from rank 0's state; each rank takes its rows of a batch cut along the data axes.
"""
from __future__ import annotations

import math
from typing import Any

from .errors import CapabilityError, InvalidArgumentError, MultidevError
from .managed_sharding import ManagedShardedReplica, has_piece_optimizer
from .mesh import Layout, Mesh
from .placement import device_list
from .protocol import SupportsShardedTraining
from .registry import require
from .replicas import param_spec

__all__ = ["device_mesh_axes", "mesh_axes", "param_layout", "sharded_process_replica", "sharded_replica"]


def mesh_axes(mesh: Any, axes: Any, what: str, arg: str) -> tuple[str, ...]:
    """``axes`` (a mesh axis name or a tuple or list of them) as a tuple of distinct axis
    names of ``mesh`` (a Mesh or a process mesh); InvalidArgumentError otherwise."""
    names = (axes,) if isinstance(axes, str) else axes
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
        raise InvalidArgumentError(f"{what}: {arg} must be a mesh axis name or a tuple of them, got {axes!r:.60}")
    bad = [n for n in names if n not in mesh.axis_names]
    if bad or len(set(names)) != len(names):
        raise InvalidArgumentError(f"{what}: {arg}={tuple(names)!r} must name distinct axes of the mesh "
                                   f"{mesh.axis_names} (unknown: {bad})")
    return tuple(names)


def param_layout(mesh: Mesh, shape: tuple[int, ...], param_axes: tuple[str, ...]) -> Layout:
    """The layout of a parameter (or optimizer-state tensor) of ``shape``: its first dimension that
    the parameter axes' size divides evenly, cut along them; whole on every device where no
    dimension divides (biases of odd sizes, scalars such as a step count) or ``param_axes`` is
    empty. (:func:`multidev.adapter.param_spec` is the rule itself, for a process mesh too.)"""
    return Layout(mesh, param_spec(mesh.sizes, shape, param_axes))


def device_mesh_axes(mesh: Any, data_axis: Any, param_axis: Any, what: str) -> tuple[tuple[str, ...],
                                                                                   tuple[str, ...]]:
    """``(data axes, parameter axes)`` of a :class:`~multidev.Mesh` of one process's devices, checked
    (InvalidArgumentError): ``data_axis`` default the mesh's first axis, ``param_axis`` default every
    other axis, ``()`` none (the parameters replicated on every device)."""
    if not isinstance(mesh, Mesh):
        raise InvalidArgumentError(f"{what}: mesh must be a multidev.Mesh (md.make_mesh), got {type(mesh).__name__}")
    data = mesh_axes(mesh, mesh.axis_names[0] if data_axis is None else data_axis, what, "data_axis")
    if not data:
        raise InvalidArgumentError(f"{what}: data_axis names no mesh axis (the batch is cut along it)")
    params = (tuple(a for a in mesh.axis_names if a not in data) if param_axis is None
              else mesh_axes(mesh, param_axis, what, "param_axis"))
    return data, params


def sharded_replica(b: Any, model: Any, optimizer: Any, mesh: Any, data_axis: Any, param_axis: Any,
                    what: str) -> Any:
    """The replica of ``model`` on backend ``b`` laid out on ``mesh`` (arguments checked first,
    nothing moved before): ``data_axis`` the batch's axes (default: the mesh's first axis),
    ``param_axis`` the parameters' (None: every other axis; ``()``: replicated)."""
    data, params = device_mesh_axes(mesh, data_axis, param_axis, what)
    sharded = require(b, SupportsShardedTraining, f"{what}(mesh=...)",
            "training with parameters sharded over a mesh is not supported for this framework yet "
            "(supported: jax); data_parallel(devices=...) replicates them")
    device_list(b, list(mesh.devices), what)  # the mesh's devices are this backend's
    rep = sharded.sharded_replica(model, optimizer, mesh, data, lambda shape: param_layout(mesh, tuple(shape), params))
    if rep is None:
        raise InvalidArgumentError(f"{what}: the {b.name} backend does not take a {type(model).__name__} as a model")
    return rep


def sharded_process_replica(b: Any, model: Any, optimizer: Any, mesh: Any, data_axis: Any, param_axis: Any,
                            grad_dtype: str | None, unused: str, group: Any, plain: Any, broadcast: Any,
                            what: str) -> Any:
    """The replica of ``model`` on backend ``b`` sharded over the process mesh ``mesh`` (checked
    first): every rank takes rank 0's state through ``plain()`` (the unsharded replica) and
    ``broadcast`` before the adapter shards it; the replica's ``rows`` is this rank's part of a
    batch cut along the data axes."""
    from .distributed.group import current

    g = current()
    if mesh.size != g.world_size:
        raise InvalidArgumentError(f"{what}: the process mesh has {mesh.size} ranks, the group {g.world_size}")
    data = mesh_axes(mesh, mesh.axis_names[0] if data_axis is None else data_axis, what, "data_axis")
    if not data:
        raise InvalidArgumentError(f"{what}: data_axis names no mesh axis (the batch is cut along it)")
    params = (tuple(a for a in mesh.axis_names if a not in data) if param_axis is None
              else mesh_axes(mesh, param_axis, what, "param_axis"))
    if not params:
        raise InvalidArgumentError(f"{what}: no parameter axis: parameters replicated on every rank are "
                                   "data_parallel(model, optimizer) without a mesh")
    make: Any = getattr(b.sharded_training, "sharded_process_replica", None)
    native = make is not None and getattr(b.sharded_training, "process_engine", None) in (None, g.info.engine)
    rep0 = plain()
    # multidev shards the optimizer itself where the framework has no mode of its own under this engine
    managed = not native and has_piece_optimizer(rep0)
    if make is None and not managed:
        if b.sharded_training is not None:
            raise CapabilityError(f"{what}: the {b.name} backend shards parameters over one process's devices only "
                                  "(a multidev.Mesh); over processes: torch (FSDP2), jax (multi-controller jit), "
                                  "Keras and Gluon (multidev's own)")
        require(b, SupportsShardedTraining, f"{what}(mesh=process mesh)",
                "training with parameters sharded over processes is not supported for this framework yet "
                "(supported: torch, with FSDP2 under the torch engine; jax, multi-controller jit under the "
                "jax engine; Keras and Gluon, multidev's own, under any engine)")
    rep: Any = None
    if managed:  # the refusals (the optimizer, the dtypes) agreed by every rank before anything moves
        from . import distributed
        from .distributed.mesh import agree_call

        def carried(dtype: str) -> bool:
            try:
                return bool(distributed.carries(dtype, rep0.devices[0], backend=b.name))
            except MultidevError:
                return False

        def refusals() -> tuple[tuple[Any, ...], int]:
            if grad_dtype is not None and not carried(grad_dtype):
                raise CapabilityError(f"{what}(grad_dtype={grad_dtype!r}): the {g.info.engine} engine cannot carry "
                                      f"{grad_dtype} tensors of this backend")
            ManagedShardedReplica(rep0, mesh, g.rank, data, params, grad_dtype)  # (made again after the broadcast)
            return (what, "managed sharding"), 0
        agree_call(f"{what}(mesh=process mesh)", refusals)
    if group is not None:
        broadcast(rep0, group, 0)  # every rank starts from rank 0's parameters, buffers and optimizer state
    if managed:
        rep = ManagedShardedReplica(rep0, mesh, g.rank, data, params, grad_dtype)  # over rank 0's optimizer
    else:
        rep0.detach()
        # rep0.model: the model given where it trained in place (torch), else the broadcast tree (JAX)
        rep = make(rep0.model, optimizer, mesh, data, params, grad_dtype)
    if rep is None:
        raise InvalidArgumentError(f"{what}: the {b.name} backend does not take a {type(model).__name__} as a model")
    rep.unused = unused
    coords = mesh.coords(g.rank)
    idx = [mesh.axis_names.index(a) for a in data]
    part = 0
    for i in idx:
        part = part * mesh.shape[i] + coords[i]
    rep.rows = (part, math.prod(mesh.shape[i] for i in idx))
    return rep

