"""multidev: one device layer for PyTorch, TensorFlow, JAX, MXNet and NumPy.

Native tensors in, native tensors out. ``import multidev`` imports no framework: an adapter is
loaded when a call first needs it (by backend name or by a tensor's type).
"""
from __future__ import annotations

from ._device import Device
from ._dtypes import canonical_dtype
from .api import (arange, asarray, backend, backends, copy, cpu, default_device, device, device_of,
                  device_scope, devices, dtype_of, empty, full, gpu, num_gpus, ones, rand, synchronize,
                  to, to_numpy, try_all_gpus, try_gpu, zeros)
from . import distributed
from .collectives import (allgather, allreduce, broadcast, gather, reduce, reduce_scatter, scatter,
                          split_batch)
from .errors import (BackendNotAvailableError, CapabilityError, CollectiveInputError,
                     DeviceMismatchError, DeviceNotFoundError, DistributedError,
                     DistributedTimeoutError, InvalidDeviceError, MultidevError,
                     UnsupportedTensorError)
from .protocol import Backend, Capabilities
from .transfer import Transfer, convert, to_host
from .registry import (backend_of, get_default_backend, register_backend, registered_backends,
                       set_default_backend)

__version__ = "0.1.0"

__all__ = [
    "Device", "Backend", "Capabilities", "canonical_dtype",
    "device", "cpu", "gpu", "devices", "num_gpus", "try_gpu", "try_all_gpus",
    "backends", "backend", "backend_of", "registered_backends", "register_backend",
    "set_default_backend", "get_default_backend", "device_scope", "default_device",
    "zeros", "ones", "full", "empty", "arange", "asarray", "rand",
    "device_of", "dtype_of", "to", "copy", "to_numpy", "synchronize",
    "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "scatter", "gather", "split_batch",
    "distributed",
    "Transfer", "convert", "to_host",
    "MultidevError", "InvalidDeviceError", "DeviceNotFoundError", "DeviceMismatchError",
    "BackendNotAvailableError", "UnsupportedTensorError", "CapabilityError", "CollectiveInputError", "DistributedError", "DistributedTimeoutError",
]
