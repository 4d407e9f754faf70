"""What several files of the CuPy adapter share: the host array type."""
from __future__ import annotations

import numpy as np

from multidev.adapter import Device, host_aligned

HOST = Device("cpu", 0)


class CupyHostArray(np.ndarray):
    """A host (``cpu:0``) array of the CuPy backend: a plain ``numpy.ndarray`` subclass (see the
    package docstring); ``np.asarray(x)`` or ``x.view(np.ndarray)`` gives the plain array."""


# Named by its public module (multidev.adapters.cupy.CupyHostArray, as before the adapter became a
# folder), where reprs and pickles find it.
CupyHostArray.__module__ = "multidev.adapters.cupy"


def host_array(a: np.ndarray) -> CupyHostArray:
    """``a`` (a fresh buffer) as a host array of this backend, 64-byte aligned."""
    return host_aligned(a).view(CupyHostArray)
