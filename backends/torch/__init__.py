"""PyTorch backend: native ``torch.Tensor`` objects on ``cpu:0``, ``gpu:i`` (CUDA/ROCm) and ``mps:0``.

Mechanism. Devices map one to one: ``cpu:0`` is ``torch.device("cpu")``, ``gpu:i`` is
``torch.device("cuda", i)`` for every visible CUDA device, ``mps:0`` is Apple's Metal device where
torch has it. Creation passes ``device=``/``dtype=`` straight to torch, which places exactly.
CUDA work is queued on each device's current stream; ``start_move`` hands back a CUDA event to wait
on (pinned host buffers both ways). ``synchronize`` waits with
``torch.cuda.synchronize`` device by device (it only waits for one device per call), which also
raises any sticky asynchronous CUDA error. Torch refuses mixed-device arithmetic natively; this
adapter's own ops check devices first and raise :class:`~multidev.DeviceMismatchError` instead.
DLPack exports are the tensors themselves, except on a machine with several CUDA devices, where a
CUDA tensor goes out behind a producer that exports it under its own device (torch exports a CUDA
tensor only while its device is torch's current one), so no consumer needs to know that rule.
The native allreduce is ``torch.cuda.nccl.all_reduce`` (``torch.cuda.comm`` for sums where torch
has no NCCL) over one CUDA tensor per GPU.

The files, one per concern (the same names in every adapter folder): ``core.py`` (the core protocol;
the adapter class is the core's class with one attribute per other file, such as ``b.dlpack``, an
object made from the core on first use, None for a concern the framework lacks), ``transfers.py``
(non-blocking moves, copy streams, pinned buffers, staged uploads), ``dlpack.py``,
``collectives.py`` (NCCL), ``training.py`` (autograd), ``compile.py`` (TorchScript,
``torch.compile``), ``models.py`` (``nn.Module`` moved in place), ``scope.py`` (torch's
default-device context), ``mesh.py`` (``DeviceMesh``, in a process group of world size 1),
``parallel.py`` (a module and its optimizer, data-parallel), ``sharded_training.py`` (the same with
FSDP2 over a process mesh). ``engine.py`` is the engine of
:mod:`multidev.distributed` on this framework's runtime (an entry point of its own, not a concern of
the adapter).
"""
from __future__ import annotations

from multidev.adapter import concern

from .collectives import TorchCollectives
from .compile import TorchCompile
from .core import TorchCore
from .dlpack import TorchDLPack
from .mesh import TorchMesh
from .models import TorchModels
from .parallel import TorchParallel
from .scope import TorchScope
from .sharded_training import TorchShardedTraining
from .training import TorchTraining
from .transfers import TorchTransfers

__all__ = ["TorchBackend"]


class TorchBackend(TorchCore):
    """The PyTorch backend (see the package docstring)."""

    transfers = concern(TorchTransfers)
    dlpack = concern(TorchDLPack)
    collectives = concern(TorchCollectives)
    training = concern(TorchTraining)
    compiler = concern(TorchCompile)
    models = concern(TorchModels)
    scope = concern(TorchScope)
    mesh = concern(TorchMesh)
    parallel = concern(TorchParallel)
    sharded_training = concern(TorchShardedTraining)
