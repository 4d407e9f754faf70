"""TensorFlow backend: eager ``tf.Tensor`` and ``tf.Variable`` on TF's logical CPU and GPU devices.

Mechanism. Devices are TF's *logical* devices (``tf.config.list_logical_devices``): ``/device:CPU:i``
is ``cpu:i`` and ``/device:GPU:i`` is ``gpu:i``. Every operation the adapter runs is wrapped in
``with tf.device(...)`` and the result's ``.device`` is checked, because eager TF places an op with
no device scope on the default device (``CPU:0``/``GPU:0``), whatever its inputs' devices, and copies
operands across devices silently. For the same reason TF arithmetic never raises on mixed devices
(``capabilities.raises_on_mixed_devices`` is False): the adapter's own ``combine``, ``concat`` and ``assign``
check devices and raise DeviceMismatchError.

Several CPU devices. ``$MULTIDEV_TF_CPU_DEVICES=N`` (N >= 2) splits the physical CPU into N logical
devices when the adapter is created, provided TF's runtime is not initialized yet and nobody has
configured the CPU's logical devices already; otherwise the existing devices are kept.

Mutability. Creation returns immutable ``tf.Tensor`` values (``capabilities.mutable`` is False);
``assign`` works when the destination is a ``tf.Variable``. ``move`` and ``copy`` keep the type:
a Variable in gives a new Variable out (so it stays assignable), a Tensor in gives a Tensor out.

Execution is synchronous on CPUs unless ``tf.config.experimental.set_synchronous_execution(False)``
was called; GPU kernels are asynchronous. ``synchronize`` runs TF's ``SyncDevice`` op on each device
and then ``async_wait``, which raises pending asynchronous errors.

The files, one per concern (the same names in every adapter folder): ``core.py`` (the core protocol;
the adapter class is the core's class with one attribute per other file, such as ``b.dlpack``, an
object made from the core on first use, None for a concern the framework lacks), ``transfers.py``
(non-blocking moves), ``dlpack.py``, ``collectives.py`` (``CollectiveReduceV2``), ``training.py``
(``tf.GradientTape``, Variables), ``compile.py`` (``tf.function``), ``models.py`` (Keras models and
``tf.Module``: variables stay where they were made), ``scope.py`` (``tf.device``), ``mesh.py``
(DTensor and Keras meshes), ``parallel.py`` (a Keras model and its optimizer, data-parallel);
``_common.py`` holds what several of them share.
"""
from __future__ import annotations

from multidev.adapter import concern

from .collectives import TensorflowCollectives
from .compile import TensorflowCompile
from .core import TensorflowCore
from .dlpack import TensorflowDLPack
from .mesh import TensorflowMesh
from .models import TensorflowModels
from .parallel import TensorflowParallel
from .scope import TensorflowScope
from .training import TensorflowTraining
from .transfers import TensorflowTransfers

__all__ = ["TensorflowBackend"]


class TensorflowBackend(TensorflowCore):
    """The TensorFlow adapter (see the package docstring)."""

    transfers = concern(TensorflowTransfers)
    dlpack = concern(TensorflowDLPack)
    collectives = concern(TensorflowCollectives)
    training = concern(TensorflowTraining)
    compiler = concern(TensorflowCompile)
    models = concern(TensorflowModels)
    scope = concern(TensorflowScope)
    mesh = concern(TensorflowMesh)
    parallel = concern(TensorflowParallel)
