"""multidev: one device layer for PyTorch, TensorFlow, JAX, MXNet, NumPy and any array library.

Native tensors in, native tensors out. ``import multidev`` imports no framework: an adapter is
loaded when a call first needs it (by backend name or by a tensor's type).

Layers, bottom up (each imports only those below it): ``errors``, ``_device`` and ``dtypes``;
``protocol`` and ``adapter`` (the public API for adapter authors); ``registry``; ``placement`` and
``validate``; ``transfer`` and ``exchange``; ``api``, ``collectives`` and ``compilation``;
``distributed``; ``training`` and ``data_parallel``; ``cli``.
"""
from __future__ import annotations

from ._device import Device
from .api import (
                  arange,
                  asarray,
                  backend,
                  backends,
                  copy,
                  cpu,
                  default_device,
                  device,
                  device_of,
                  device_scope,
                  devices,
                  dtype_of,
                  empty,
                  full,
                  gpu,
                  native_device,
                  num_gpus,
                  ones,
                  rand,
                  synchronize,
                  to,
                  to_numpy,
                  try_all_gpus,
                  try_gpu,
                  zeros,
)
from .collectives import (
                  all_to_all,
                  allgather,
                  allreduce,
                  broadcast,
                  gather,
                  reduce,
                  reduce_scatter,
                  scatter,
                  sendrecv,
                  split_batch,
)
from .compilation import Compiled, compile
from .data_parallel import DataParallel, broadcast_state, data_parallel
from .dtypes import canonical_dtype
from .errors import (
                  AdapterError,
                  BackendError,
                  BackendNotAvailableError,
                  CapabilityError,
                  CollectiveInputError,
                  CollectiveMismatchError,
                  DeviceMismatchError,
                  DeviceNotFoundError,
                  DistributedError,
                  DistributedSetupError,
                  DistributedTimeoutError,
                  InvalidArgumentError,
                  InvalidDeviceError,
                  InvalidDtypeError,
                  MultidevError,
                  OutOfMemoryError,
                  ReplicaMismatchError,
                  ScopeError,
                  UnsupportedTensorError,
)
from .exchange import convert
from .mesh import Layout, Mesh
from .mesh_collectives import all_to_all_along, allgather_along, allreduce_along, reduce_scatter_along, sendrecv_along
from .protocol import Backend, Capabilities
from .registry import backend_of, get_default_backend, register_backend, registered_backends, set_default_backend
from .sharding import ShardedTensor, from_native_mesh, from_shards, layout_of, make_mesh, shards_of, to_native_mesh
from .training import replicate, train_batch
from .transfer import Transfer, to_host

__version__ = "0.2.0"

__all__ = [
    "AdapterError", "Backend", "BackendError", "BackendNotAvailableError", "Capabilities", "CapabilityError",
    "CollectiveInputError", "CollectiveMismatchError", "Compiled", "DataParallel", "Device", "DeviceMismatchError",
    "DeviceNotFoundError", "DistributedError", "DistributedSetupError", "DistributedTimeoutError",
    "InvalidArgumentError", "InvalidDeviceError",
    "InvalidDtypeError", "Layout", "Mesh", "MultidevError", "OutOfMemoryError", "ReplicaMismatchError",
    "ScopeError", "ShardedTensor", "Transfer", "UnsupportedTensorError",
    "all_to_all", "all_to_all_along", "allgather", "allgather_along", "allreduce", "allreduce_along",
    "arange", "asarray", "backend", "backend_of",
    "backends", "broadcast", "broadcast_state", "canonical_dtype", "compile", "convert", "copy", "cpu",
    "data_parallel", "default_device", "device",
    "device_of", "device_scope", "devices", "distributed", "dtype_of", "empty", "from_native_mesh", "from_shards",
    "full", "gather",
    "get_default_backend", "gpu", "layout_of", "make_mesh", "native_device", "num_gpus", "ones", "rand", "reduce",
    "reduce_scatter", "reduce_scatter_along",
    "register_backend",
    "registered_backends", "replicate", "scatter", "sendrecv", "sendrecv_along", "set_default_backend", "shards_of",
    "split_batch", "synchronize",
    "to", "to_host", "to_native_mesh", "to_numpy", "train_batch", "try_all_gpus", "try_gpu", "zeros",
]


def __getattr__(name: str) -> object:
    """``multidev.distributed`` is imported on first use (it is not needed by one-process programs)."""
    if name == "distributed":
        import importlib

        return importlib.import_module(f"{__name__}.distributed")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
