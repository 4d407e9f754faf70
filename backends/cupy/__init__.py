"""CuPy backend: native ``cupy.ndarray`` objects on ``gpu:i``, NumPy arrays for ``cpu:0``.

Mechanism.

- Devices: ``cpu:0`` and one ``gpu:i`` per CUDA device (``cupy.cuda.runtime.getDeviceCount()``);
  every call that makes or touches a GPU array runs under ``cupy.cuda.Device(i)``, so arrays land
  exactly where asked, whatever CuPy's current device is.
- The host mapping: CuPy has no host arrays, so ``cpu:0`` tensors are :class:`CupyHostArray`, a
  ``numpy.ndarray`` subclass with nothing added (every NumPy function takes it). The subclass
  only tells the registry which adapter owns a host array, so ``md.to(host, "gpu:0")`` works;
  ``to_numpy`` returns the plain ndarray view. Host buffers are aligned to
  :data:`multidev.adapter.HOST_ALIGNMENT`, so partners that share host memory only when it is
  aligned take them without a copy.
- Moves: host to GPU and GPU to host go through page-locked buffers (``cupyx.empty_pinned``):
  ``x.get(stream, out=pinned, blocking=False)`` downloads at the pinned rate (many times the
  pageable one: benchmarks/results, the H200 CuPy bench), and an upload is staged through a pinned
  snapshot so ``set`` runs asynchronously. Each copy is queued on the current stream of the GPU
  involved, after the work that produces ``x``, and a ``cupy.cuda.Event`` recorded behind it is
  what ``start_move``'s waiter and the blocking moves wait on. GPU to GPU: the target's stream
  waits on an event of the source's stream, then CuPy's peer copy runs. Buffers an in-flight copy
  reads or writes are kept alive until its event completes (the transfers concern's ``_inflight``), whether or not the
  caller waits.
- ``synchronize(gpu:i)`` is ``cupy.cuda.Device(i).synchronize()`` (which raises a pending CUDA
  error); ``synchronize(None)`` does so for every GPU this adapter placed work on and CuPy's
  current device. The host side is synchronous.
- DLPack both ways: GPU arrays export themselves (``__dlpack__`` orders the consumer's stream
  after CuPy's by an event); ``cupy.from_dlpack`` imports GPU buffers under the producer's
  device, passing CuPy's current stream (so ``dlpack_streams``: ``convert`` between GPUs does not
  wait on the host); host arrays use NumPy's DLPack.
- The native allreduce is NCCL through ``cupy.cuda.nccl`` (one communicator per device list,
  ``initAll``, grouped ``allReduce`` calls on each device's current stream), advertised when NCCL
  is available and there are at least two GPUs.

On a machine without a CUDA device ``import cupy`` may still work; the adapter then raises
BackendNotAvailableError saying so, and the registry reports cupy as unavailable.

The files, one per concern (the same names in every adapter folder): ``core.py`` (the core protocol;
the adapter class is the core's class with one attribute per other file, such as ``b.dlpack``, an
object made from the core on first use, None for a concern the framework lacks), ``transfers.py``
(non-blocking moves, pinned buffers, staged uploads), ``dlpack.py``, ``collectives.py`` (NCCL),
``scope.py`` (the current CUDA device); ``_common.py`` holds what several of them share (the host
array type).
"""
from __future__ import annotations

from multidev.adapter import concern

from ._common import CupyHostArray
from .collectives import CupyCollectives
from .core import CupyCore
from .dlpack import CupyDLPack
from .scope import CupyScope
from .transfers import CupyTransfers

__all__ = ["CupyBackend", "CupyHostArray"]


class CupyBackend(CupyCore):
    """The CuPy backend (see the package docstring)."""

    transfers = concern(CupyTransfers)
    dlpack = concern(CupyDLPack)
    collectives = concern(CupyCollectives)
    scope = concern(CupyScope)
