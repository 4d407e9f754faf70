"""The generic array-API adapter: any library that follows the Python array API standard.

One adapter class per library, made on demand: ``array_api:LIB`` is the library importable as
``LIB`` (``array_api:array_api_strict``, ``array_api:numpy``, ``array_api:jax.numpy``); plain
``array_api`` is ``array_api:array_api_strict``, the standard's reference library. The entry point
``array_api`` is the family :class:`ArrayApiFamily`: the registry calls its ``select(LIB)`` for the
name ``array_api:LIB`` and its ``select_for(x)`` for a tensor no other adapter of its framework
claims, so ``md.device_of(x)`` works on such tensors without naming a backend.

What the library must offer: ``__array_namespace_info__()`` (``devices()``, ``default_device()``,
``dtypes(device=)``), the namespace functions ``full``, ``empty``, ``arange``, ``asarray``,
``reshape``, ``concat``, ``add``/``maximum``/``minimum``/``multiply``, ``logical_or``/``logical_and``,
``from_dlpack``, and arrays with ``device``, ``to_device``, ``__dlpack__`` and ``__dlpack_device__``.

Mechanism:

- Devices come from ``info.devices()`` (``None`` entries dropped, as JAX lists one). Each device's
  kind is what a probe array's ``__dlpack_device__()`` says: host devices become ``cpu:0``,
  ``cpu:1``, ... (the library's default device first), CUDA devices ``gpu:ID`` with the DLPack id.
  A library without a host device is refused (``cpu:0`` is every backend's first device).
- dtypes: ``info.dtypes(device=d)`` per device; ``Capabilities.device_dtypes`` lists the devices
  that hold fewer (array-api-strict's ``no_float64`` and ``no_x64`` devices).
- Mutability, DLPack and whether mixing devices raises are probed once, on the library itself.
- Creation uses the namespace (``full``, ``empty``, ``arange``, ``asarray`` with ``device=``);
  ``rand`` samples with NumPy's generator and places the samples with ``asarray`` (the standard
  has no random numbers). Host buffers are made 64-byte aligned (XLA's rule for sharing a host
  buffer, so JAX and TensorFlow take them without a copy): an unaligned result is copied once
  into an aligned NumPy buffer and re-imported with ``from_dlpack``.
- ``move``/``copy`` are ``asarray(x, device=, copy=True)``; ``to_numpy`` is ``numpy.from_dlpack``
  (a view of host memory; a host copy for other devices).
- Execution is taken as synchronous unless arrays have ``block_until_ready`` (JAX), which
  ``wait`` then calls; the standard has no synchronization call. It is the one method beyond the
  standard that the adapter probes for, by attribute (no library is imported or named in code).
- No native collectives; ``split`` is slicing (views).

The files, one per concern (the same names in every adapter folder): ``core.py`` (the core protocol;
the adapter class is the core's class with one attribute per other file, such as ``b.dlpack``, an
object made from the core on first use, None for a concern the framework lacks), ``dlpack.py`` (the
standard's ``from_dlpack`` with ``device=`` and ``copy=``); the family and the per-library classes
are made here.
"""
from __future__ import annotations

import importlib.util
import re
import threading
from typing import Any

from multidev.adapter import BackendNotAvailableError, concern

from .core import DEFAULT_LIBRARY, ArrayApiCore
from .dlpack import ArrayApiStandardDLPack

__all__ = ["DEFAULT_LIBRARY", "ArrayApiBackend", "ArrayApiFamily", "adapter_for"]


class ArrayApiBackend(ArrayApiCore):
    """The array-API adapter for one library; made per library by :func:`adapter_for`."""

    dlpack = concern(ArrayApiStandardDLPack)


_LIB_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_classes: dict[str, type[ArrayApiBackend]] = {}
_classes_lock = threading.Lock()


def adapter_for(library: str) -> type[ArrayApiBackend]:
    """The adapter class for ``library`` (made once, named ``array_api:LIBRARY``). Imports nothing."""
    with _classes_lock:
        cls = _classes.get(library)
        if cls is None:
            cls = type(f"ArrayApiBackend[{library}]", (ArrayApiBackend,),
                       {"name": f"array_api:{library}", "framework": library.split(".")[0], "library": library,
                        "__doc__": f"The array-API adapter for {library} (see the module docstring)."})
            _classes[library] = cls
        return cls


class ArrayApiFamily:
    """The ``array_api`` entry point: a family of adapters, one per library (see the module doc)."""

    @staticmethod
    def select(library: str | None) -> type[ArrayApiBackend]:
        """The adapter class for ``array_api:LIBRARY`` (``None``: the default library)."""
        lib = DEFAULT_LIBRARY if library is None else library.strip()
        if not _LIB_NAME.match(lib):
            raise BackendNotAvailableError(f"array_api:{library}: {library!r} is not a module name; use "
                                           "array_api:LIB with LIB an importable array-API namespace, e.g. "
                                           f"array_api:{DEFAULT_LIBRARY}")
        try:
            found = importlib.util.find_spec(lib.split(".")[0]) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            hint = ('pip install "multidev[array_api]"' if lib == DEFAULT_LIBRARY
                    else f"install the package that provides the module {lib!r}")
            raise BackendNotAvailableError(f"backend 'array_api:{lib}' is not available: {lib} is not installed. "
                                           f"Install it: {hint}.")
        return adapter_for(lib)

    @staticmethod
    def select_for(x: Any) -> str | None:
        """The library of ``x`` when it is an array-API array (its namespace module), else None."""
        get = getattr(x, "__array_namespace__", None)
        if not callable(get) or isinstance(x, type):
            return None
        try:
            ns = get()
        except Exception:  # noqa: BLE001 - not an array of a usable namespace
            return None
        name = getattr(ns, "__name__", None)
        if not isinstance(name, str) or not hasattr(ns, "__array_namespace_info__"):
            return None
        return name
