"""Collectives across processes, on the engine the job already runs: torch.distributed (torchrun),
MPI (mpiexec, mpirun, srun) or JAX's multi-controller runtime, one API over all three.

One process per rank, started by the engine's launcher::

    torchrun --nproc_per_node=4 train.py            # or: mpiexec -n 4 python train.py, or JAX's variables:
                                                     # python -m multidev.distributed.launch -n 4 --engine jax train.py
    # train.py
    import multidev as md
    from multidev import distributed as dist

    dist.init()                                   # the engine from the launcher's environment, and why
    g = dist.allreduce(grad, op="mean")           # grad: a tensor of any backend
    h = dist.allreduce(grad, async_op=True)       # a handle; h.wait() gives the result
    dist.shutdown()

Any backend's tensor travels as a tensor of the engine's transport (torch tensors for torch, NumPy
arrays for MPI, or device buffers where the MPI build is CUDA-aware, JAX arrays for JAX) through
:func:`multidev.convert`: zero-copy through DLPack where possible, else a copy; the result comes
back as a tensor of the input's backend, on the input's device, with its dtype.

``allreduce`` and ``broadcast`` also take a structure of tensors (what :func:`multidev.to` takes: a
``state_dict``, a JAX pytree, nested lists, tuples and dicts) and return the same structure: one
consistency exchange per call, the leaves flattened into buckets (see :func:`allreduce`).

Semantics follow :mod:`multidev.collectives`: the same ops (``mean`` is a sum divided by the world
size and is refused for integers; ``bool`` takes max/min only), uneven pieces follow
``numpy.array_split`` (``scatter``, ``reduce_scatter``, and ``allgather``/``gather`` accept pieces
that differ along ``axis``). Every rank must call every collective in the same order with tensors of
one dtype and (except along ``axis`` for the gathers) one shape.

Consistency checks (on by default): before each collective the ranks exchange a small record of
the call (:mod:`.consistency`), so a rank that calls another collective, another op, or passes
another shape or dtype makes every rank raise :class:`CollectiveMismatchError`; a rank that refuses
its own input (``mean`` of integers, a read-only tensor with ``inplace=True``) makes the others
raise :class:`DistributedError` naming it. The group stays usable after either.
``init(check=False)``, ``set_checks(False)`` or ``MULTIDEV_DISTRIBUTED_CHECK=0`` turns them off.

Point-to-point (:mod:`.p2p`): ``send(x, dst)`` and ``recv(src)`` move one tensor between two
ranks (the receiver needs no shape: it travels in the message's header, which the receiver checks
against ``out=`` and ``tag=``); ``sendrecv`` is the ring exchange. Process meshes (:mod:`.mesh`):
collectives along named axes, within the engine's own subgroups. Layouts over a process mesh
(:mod:`.layouts`): ``multidev.to(x, Layout(process_mesh, spec))`` (or :func:`distribute`) lays a
tensor out across the processes, each rank keeping its piece (a DTensor under torch, a global
``jax.Array`` under jax, else a ShardedTensor of the piece); :func:`from_local` builds one from the
ranks' pieces; ``multidev.to_host`` gathers it.

Failure (:mod:`.hangs`): a rank that dies, hangs or never arrives makes the others raise
:class:`DistributedTimeoutError` within the ``timeout`` given to :func:`init`, naming the ranks
that did not arrive and the call, never hang and never abort. The group is then unusable: call
:func:`shutdown`.

Engines are plug-ins (:mod:`.engine`, the ``multidev.engines`` entry-point group); this package
imports no framework.
"""
from __future__ import annotations

import warnings
from typing import Any

from ..errors import CollectiveMismatchError, DistributedError, DistributedTimeoutError
from .collectives import (
    allgather,
    allreduce,
    barrier,
    broadcast,
    carries,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from .consistency import MAX_DIMS, set_checks
from .engine import Engine, engine_class, engine_names, legacy_engine, register_engine
from .group import (
    CHECK_ENV,
    DEFAULT_TIMEOUT,
    ENGINE_ENV,
    MAX_TIMEOUT,
    GroupInfo,
    backend_name,
    checks_enabled,
    detect_launch,
    engine_name,
    group_info,
    init,
    is_initialized,
    launched,
    local_rank,
    rank,
    set_timeout,
    shutdown,
    transport_name,
    world_size,
)
from .handles import Work
from .hangs import classify as _translate  # noqa: F401 - the old name, kept for callers that classified errors
from .layouts import distribute, from_local
from .mesh import (
    ProcessMesh,
    all_to_all,
    all_to_all_along,
    allgather_along,
    allreduce_along,
    from_native_mesh,
    process_mesh,
    reduce_scatter_along,
    sendrecv,
    to_native_mesh,
)
from .p2p import recv, send
from .transport import transport_path

__all__ = [
    "CHECK_ENV",
    "DEFAULT_TIMEOUT",
    "ENGINE_ENV",
    "MAX_DIMS",
    "MAX_TIMEOUT",
    "CollectiveMismatchError",
    "DistributedError",
    "DistributedTimeoutError",
    "Engine",
    "GroupInfo",
    "ProcessMesh",
    "Work",
    "all_to_all",
    "all_to_all_along",
    "allgather",
    "allgather_along",
    "allreduce",
    "allreduce_along",
    "backend_name",
    "barrier",
    "broadcast",
    "carries",
    "checks_enabled",
    "detect_launch",
    "distribute",
    "engine_name",
    "engine_names",
    "from_local",
    "from_native_mesh",
    "gather",
    "group_info",
    "init",
    "is_initialized",
    "launched",
    "local_rank",
    "process_mesh",
    "rank",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_along",
    "register_engine",
    "scatter",
    "send",
    "sendrecv",
    "set_checks",
    "set_timeout",
    "shutdown",
    "to_native_mesh",
    "transport_name",
    "transport_path",
    "world_size",
]


def __getattr__(name: str) -> Any:
    if name == "TRANSPORT":  # deprecated: the one engine's one transport, before there were engines
        warnings.warn("multidev.distributed.TRANSPORT is deprecated (removed in 0.4): each engine has its own "
                      "transport; transport_path(x) says how a tensor travels in the current group",
                      DeprecationWarning, stacklevel=2)
        if is_initialized():
            return engine_class(engine_name()).tensors
        found = detect_launch()
        return engine_class(found[0].engine if found else legacy_engine()).tensors
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
