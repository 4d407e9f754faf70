"""MXNet backend: ``mx.nd.NDArray`` and ``mx.np.ndarray`` on ``mx.cpu(i)`` / ``mx.gpu(i)`` contexts.

Environment. MXNet 1.9.1 is the last release and needs numpy<2: on NumPy 2 this backend raises
BackendNotAvailableError before importing mxnet. On NumPy 1.24-1.26 it sets ``np.bool = np.bool_``
(mxnet uses the removed alias at import) and silences mxnet's import-time DeprecationWarnings.

Tensors. Both array types are native tensors: ``mx.nd.NDArray`` (legacy) and ``mx.np.ndarray`` (a
user under ``npx.set_np()``; it subclasses NDArray). Every operation on an existing array returns the
caller's type (an ``mx.np.ndarray`` in, ``mx.np.ndarray`` out). Creation (full, empty, arange,
asarray, rand, import_dlpack) returns ``mx.nd.NDArray``; ``x.as_np_ndarray()`` converts without a copy.

Devices. ``cpu:i`` is ``mx.cpu(i)`` for ``i < $MULTIDEV_MXNET_CPU_DEVICES`` (default 2): distinct
contexts sharing host memory. ``gpu:i`` is ``mx.gpu(i)`` for every GPU a CUDA build sees (untested
here: CPU-only build). ``mx.cpu_pinned``/``mx.cpu_shared`` arrays report ``cpu:0``.

MXNet quirks handled here, each also commented where it is worked around:
- mixed contexts do not raise (MXNet computes on the first operand's context), so combine, concat
  and assign check devices and raise DeviceMismatchError; ``capabilities.raises_on_mixed_devices`` is False;
- legacy NDArray shape semantics treat ``()`` and 0-sized dims as "unknown", so every op runs under
  NumPy shape semantics (thread-local, restored on exit) and 0-d / empty arrays work;
- bool arrays are not accepted by MXNet's arithmetic, concat, slice or kvstore: those paths go
  through an integer cast (sum/max of bools is "or", min/prod is "and", as in NumPy);
- ``mx.nd.array`` turns float64 input into float32 unless told the dtype: dtypes are always passed.

Asynchronous errors. MXNet runs ops on its engine threads; an op's error is raised at the first of
``mx.nd.waitall()`` (``synchronize``), ``wait_to_read()`` (``wait``) or ``asnumpy()`` (``to_numpy``) on
the failed array or anything computed from it. MXNet reports each error once: whichever of those
calls comes first raises it and clears it (and waitall clears every pending error, raising the
first one). mxnet#13234 ("waitall hides errors") was fixed by mxnet#14397 before 1.9.1; this
module's tests check that ``synchronize()`` raises.

The files, one per concern (the same names in every adapter folder): ``core.py`` (the core protocol;
the adapter class is the core's class with one attribute per other file, such as ``b.dlpack``, an
object made from the core on first use, None for a concern the framework lacks), ``transfers.py``
(non-blocking moves), ``dlpack.py``, ``collectives.py`` (KVStore), ``training.py`` (``autograd``,
``attach_grad``), ``compile.py`` (``hybridize``), ``models.py`` (Gluon blocks moved in place),
``scope.py`` (the default context), ``parallel.py`` (a block and its Trainer, data-parallel);
``_common.py`` holds what several of them share.
"""
from __future__ import annotations

from multidev.adapter import concern

from .collectives import MxnetCollectives
from .compile import MxnetCompile
from .core import MxnetCore
from .dlpack import MxnetDLPack
from .models import MxnetModels
from .parallel import MxnetParallel
from .scope import MxnetScope
from .training import MxnetTraining
from .transfers import MxnetTransfers

__all__ = ["MxnetBackend"]


class MxnetBackend(MxnetCore):
    """The MXNet backend (see the package docstring)."""

    transfers = concern(MxnetTransfers)
    dlpack = concern(MxnetDLPack)
    collectives = concern(MxnetCollectives)
    training = concern(MxnetTraining)
    compiler = concern(MxnetCompile)
    models = concern(MxnetModels)
    scope = concern(MxnetScope)
    parallel = concern(MxnetParallel)
