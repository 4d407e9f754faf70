"""What several files of the CuPy adapter share: the host array type."""
from __future__ import annotations

import numpy as np

from multidev.adapter import Device, host_aligned

HOST = Device("cpu", 0)


class CupyHostArray(np.ndarray):
    """A host (``cpu:0``) array of the CuPy backend: a plain ``numpy.ndarray`` subclass (see the
    package docstring); ``np.asarray(x)`` or ``x.view(np.ndarray)`` gives the plain array."""


# Named by its public module: the registry ties a host array class to the adapter defined in the same
# module (a NumPy subclass is CuPy's because CupyBackend lives there), and pickles find it there.
CupyHostArray.__module__ = "multidev.adapters.cupy"


def host_array(a: np.ndarray) -> CupyHostArray:
    """``a`` (a fresh buffer) as a host array of this backend, 64-byte aligned."""
    return host_aligned(a).view(CupyHostArray)
