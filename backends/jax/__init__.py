"""JAX backend: ``jax.Array`` values committed to single JAX devices.

Mechanism. Devices are JAX's addressable devices of the ``cpu`` platform (``cpu:i``) and, where
present, of the ``gpu`` platform (CUDA or ROCm, ``gpu:i``), each numbered by its order (device id)
within its platform. Every tensor this adapter creates is *committed* to its device (JAX then refuses
arithmetic between committed arrays of two devices, as a GPU framework would), and ``to`` of an
uncommitted array on its own device commits it without a copy (``commit_resident``), as
``jax.device_put`` does: ``jit`` traces a step again for committed arguments. An array sharded or
replicated over several devices has no single device: ``device_of`` raises DeviceMismatchError.

Environment. ``$MULTIDEV_JAX_CPU_DEVICES=N`` gives JAX ``N`` virtual CPU devices: when the adapter is
created before ``import jax`` it appends ``--xla_force_host_platform_device_count=N`` to
``$XLA_FLAGS``; when jax is imported but its backends are not yet initialized it sets the config
option ``jax_num_cpu_devices`` (both work on jax 0.7 and 0.10); afterwards it cannot be changed.

JAX specifics. Arrays are immutable (``assign`` raises CapabilityError: rebind results instead).
64-bit dtypes exist only under ``jax_enable_x64``, so ``capabilities.dtypes`` is recomputed from the
flag. Execution is asynchronous; ``synchronize`` queues a marker computation behind each device's
work and waits for it (JAX runs a device's computations in order; results that were dropped are
waited for too), then for the live arrays, whose asynchronous errors it raises. ``native_allreduce``
is ``psum``/``pmax``/``pmin`` under ``jax.shard_map`` over exactly the inputs' devices (``prod`` and
complex max/min as an ordered fold over ``all_gather``; CPUs and GPUs mixed: per platform, then
combined). DLPack imports are zero-copy or CapabilityError; a host buffer becomes a view on the
requested virtual CPU device.

The files, one per concern (the same names in every adapter folder): ``core.py`` (the core protocol;
the adapter class is the core's class with one attribute per other file, such as ``b.dlpack``, an
object made from the core on first use, None for a concern the framework lacks), ``transfers.py``
(non-blocking moves, pinned host copies, staged uploads), ``dlpack.py``, ``collectives.py``
(``shard_map``), ``training.py`` (``jax.value_and_grad``), ``compile.py`` (``jax.jit``),
``models.py`` (pytree nodes as trees), ``scope.py`` (``jax.default_device``), ``mesh.py``
(``jax.sharding.Mesh``, ``jax.make_mesh``'s device order), ``sharding.py`` (``NamedSharding``: the
native type of ``multidev.to(x, layout)``), ``parallel.py`` (parameters with optax, or a flax
``TrainState``, data-parallel), ``sharded_training.py`` (the same on a mesh, each parameter and its
optimizer state a ``NamedSharding``); ``_common.py`` holds what several of them share. ``engine.py``
is the engine of :mod:`multidev.distributed` on this framework's runtime (an entry point of its own,
not a concern of the adapter).
"""
from __future__ import annotations

from multidev.adapter import concern

from .collectives import JaxCollectives
from .compile import JaxCompile
from .core import JaxCore
from .dlpack import JaxDLPack
from .mesh import JaxMesh
from .models import JaxModels
from .parallel import JaxParallel
from .scope import JaxScope
from .sharded_training import JaxShardedTraining
from .sharding import JaxSharding
from .training import JaxTraining
from .transfers import JaxTransfers

__all__ = ["JaxBackend"]


class JaxBackend(JaxCore):
    """The JAX backend (see the package docstring)."""

    transfers = concern(JaxTransfers)
    dlpack = concern(JaxDLPack)
    collectives = concern(JaxCollectives)
    training = concern(JaxTraining)
    compiler = concern(JaxCompile)
    models = concern(JaxModels)
    scope = concern(JaxScope)
    mesh = concern(JaxMesh)
    sharding = concern(JaxSharding)
    parallel = concern(JaxParallel)
    sharded_training = concern(JaxShardedTraining)
