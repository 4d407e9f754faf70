"""The lazy, thread-safe backend registry.

Adapters are found through the ``multidev.backends`` entry-point group (the built-in ones too) or
:func:`register_backend`. Nothing is imported until it is needed:

- by name: the entry point is loaded and the adapter instantiated (which imports the framework);
- by tensor: the tensor's type is looked up in a cache; on a miss, only adapters whose framework
  module is already in ``sys.modules`` are instantiated and asked (a tensor cannot exist otherwise).
"""
from __future__ import annotations

import os
import sys
import threading
from importlib import metadata
from typing import Any, Callable

from ._device import Device
from .errors import BackendNotAvailableError, UnsupportedTensorError
from .protocol import Backend

__all__ = [
    "ENTRY_POINT_GROUP",
    "register_backend",
    "get_backend",
    "backend_of",
    "available_backends",
    "registered_backends",
    "set_default_backend",
    "get_default_backend",
    "native_device",
]

ENTRY_POINT_GROUP = "multidev.backends"

_lock = threading.RLock()
_factories: dict[str, Callable[[], Backend]] = {}  # name -> factory (class or callable)
_frameworks: dict[str, str] = {}  # name -> framework module name, once known
_instances: dict[str, Backend] = {}
_name_locks: dict[str, threading.Lock] = {}  # per-backend creation locks
_failures: dict[str, str] = {}  # name -> why it could not load
_type_cache: dict[type, str] = {}
_entry_points_read = False
_default_backend: str | None = None


def _read_entry_points() -> None:
    global _entry_points_read
    if _entry_points_read:
        return
    with _lock:
        if _entry_points_read:
            return
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            # Explicit register_backend calls win over entry points of the same name.
            _factories.setdefault(ep.name, _EntryPointFactory(ep))
        _entry_points_read = True


class _EntryPointFactory:
    """Loads the entry point's object on first call; exposes its ``framework`` once loaded."""

    def __init__(self, ep: metadata.EntryPoint) -> None:
        self.ep = ep
        self._obj: Any = None

    def load(self) -> Any:
        if self._obj is None:
            self._obj = self.ep.load()
        return self._obj

    def __call__(self) -> Backend:
        return self.load()()


def register_backend(name: str, factory: Callable[[], Backend], *, replace: bool = False) -> None:
    """Register an adapter factory (usually the adapter class) under ``name`` at run time.

    The factory is called lazily, on first use. ``replace=True`` overrides an existing registration.
    """
    _read_entry_points()
    with _lock:
        if name in _instances and not replace:
            raise ValueError(f"backend {name!r} is already registered and loaded; pass replace=True")
        _factories[name] = factory
        _instances.pop(name, None)
        _failures.pop(name, None)
        _frameworks.pop(name, None)
        for t in [t for t, n in _type_cache.items() if n == name]:
            del _type_cache[t]


def registered_backends() -> list[str]:
    """Names of every registered adapter, installed framework or not."""
    _read_entry_points()
    return sorted(_factories)


def _framework_of(name: str) -> str | None:
    """The framework module name of an adapter, loading its (light) module but not its framework."""
    if name in _frameworks:
        return _frameworks[name]
    fac = _factories.get(name)
    if fac is None:
        return None
    try:
        obj = fac.load() if isinstance(fac, _EntryPointFactory) else fac
    except Exception:  # a broken third-party module: treat as unavailable, reported by get_backend
        return None
    fw = getattr(obj, "framework", None)
    if isinstance(fw, str):
        _frameworks[name] = fw
    return fw if isinstance(fw, str) else None


def get_backend(name: str | None = None) -> Backend:
    """The adapter instance for ``name`` (the default backend when ``None``), loading it on first use.

    ``name`` may also be ``"module:attr"``: an importable adapter class or factory that is
    registered under its own ``name`` attribute. Raises BackendNotAvailableError naming the
    registered and installed backends when it cannot be had.
    """
    if name is None:
        name = get_default_backend()
    if not isinstance(name, str):
        raise BackendNotAvailableError(f"backend must be a name string, got {name!r}")
    if ":" in name:
        return _load_dotted(name)
    inst = _instances.get(name)
    if inst is not None:
        return inst
    _read_entry_points()
    with _lock:
        name_lock = _name_locks.setdefault(name, threading.Lock())
    # One lock per name: a slow framework import (seconds for TF) blocks only callers of that
    # backend, never every other registry lookup.
    with name_lock:
        inst = _instances.get(name)
        if inst is not None:
            return inst
        with _lock:
            fac = _factories.get(name)
            failure = _failures.get(name)
        if fac is None:
            raise BackendNotAvailableError(
                f"no backend named {name!r}. Registered: {', '.join(registered_backends()) or 'none'}. "
                f"Third-party adapters register through the {ENTRY_POINT_GROUP!r} entry-point group "
                "or multidev.register_backend(name, factory)."
            )
        if failure is not None:
            raise BackendNotAvailableError(failure)
        try:
            inst = fac()
        except BackendNotAvailableError as e:
            with _lock:
                _failures[name] = str(e)
            raise
        except ImportError as e:
            msg = (f"backend {name!r} is not available: {e}. Install it with "
                   f"`pip install \"multidev[{name}]\"`.")
            with _lock:
                _failures[name] = msg
            raise BackendNotAvailableError(msg) from e
        with _lock:
            _instances[name] = inst
            _frameworks[name] = inst.framework
        return inst


def _load_dotted(spec: str) -> Backend:
    import importlib

    mod_name, _, attr = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise BackendNotAvailableError(f"cannot import adapter {spec!r}: {e}") from e
    name = getattr(obj, "name", None)
    if not isinstance(name, str):
        raise BackendNotAvailableError(f"adapter {spec!r} has no string 'name' attribute")
    with _lock:
        cur = _factories.get(name)
        if cur is not obj:
            register_backend(name, obj, replace=True)
    return get_backend(name)


def available_backends() -> list[str]:
    """Names of registered backends whose framework can be imported (loading each one)."""
    out = []
    for name in registered_backends():
        try:
            get_backend(name)
        except BackendNotAvailableError:
            continue
        out.append(name)
    return out


def loaded_backends() -> list[Backend]:
    """Adapters already instantiated in this process."""
    with _lock:
        return list(_instances.values())


def _related(root: str, fw: str) -> bool:
    """Whether a type from top-level module ``root`` can belong to framework ``fw`` (jaxlib/jax)."""
    return root == fw or root.startswith(fw) or fw.startswith(root)


def _specificity(x: Any, types: tuple[type, ...]) -> int:
    """How close x's type is to the nearest of ``types`` in its MRO (0: exactly one of them)."""
    mro = type(x).__mro__
    return min((mro.index(t) for t in types if t in mro), default=len(mro))


def backend_of(x: Any) -> Backend:
    """The adapter that owns tensor ``x``. Cached by type; never imports a framework.

    Adapters of the framework the type comes from are asked first, so identifying a tensor does
    not start other frameworks' runtimes; among several owners the most specific class wins (a
    framework's ndarray subclass is not claimed by the NumPy reference)."""
    t = type(x)
    name = _type_cache.get(t)
    if name is not None:
        inst = _instances.get(name)
        if inst is not None:
            return inst
    _read_entry_points()
    with _lock:
        names = list(_factories)
    root = t.__module__.split(".")[0]
    related, others = [], []
    for n in names:
        fw = _frameworks.get(n) or _framework_of(n)
        if n not in _instances and (fw is None or fw not in sys.modules):
            continue
        (related if fw is not None and _related(root, fw) else others).append(n)
    for group in (related, others):
        matches = []
        for n in group:
            try:
                inst = get_backend(n)
            except Exception:  # an adapter that cannot start here does not own this tensor
                continue
            types = inst.tensor_types()
            if isinstance(x, types):
                matches.append((_specificity(x, types), inst))
        if matches:
            inst = min(matches, key=lambda m: m[0])[1]
            with _lock:
                _type_cache[t] = inst.name
            return inst
    raise UnsupportedTensorError(
        f"no backend recognises an object of type {t.__module__}.{t.__qualname__}. "
        f"Registered backends: {', '.join(registered_backends())}; loaded: "
        f"{', '.join(b.name for b in loaded_backends()) or 'none'}. Pass a native tensor of one of them."
    )


_native_cache: dict[Any, Device] = {}


def native_device(obj: Any) -> Device | None:
    """Resolve a framework's native device object through the adapter whose framework made it.
    Cached for hashable device objects (torch.device, jax Device, mx.Context)."""
    try:
        hit = _native_cache.get((type(obj), obj))
    except TypeError:  # unhashable
        hit = None
    if hit is not None:
        return hit
    dev = _native_device(obj)
    if dev is not None and getattr(obj, "index", 0) is not None:  # torch.device("cuda"): current device
        try:
            if len(_native_cache) < 1024:
                _native_cache[(type(obj), obj)] = dev
        except TypeError:
            pass
    return dev


def _native_device(obj: Any) -> Device | None:
    root = type(obj).__module__.split(".")[0]
    _read_entry_points()
    for n in list(_factories):
        fw = _framework_of(n)
        if fw is None or fw not in sys.modules:
            continue
        if not _related(root, fw):
            continue
        try:
            dev = get_backend(n).from_native_device(obj)
        except BackendNotAvailableError:
            continue
        if dev is not None:
            return dev
    return None


def set_default_backend(name: str | None) -> None:
    """Set the backend used when a call names none. ``None`` restores ``$MULTIDEV_BACKEND`` or numpy."""
    global _default_backend
    if name is not None:
        get_backend(name)  # fail now, with the helpful message, not at first use
    _default_backend = name


def get_default_backend() -> str:
    """The default backend's name: set_default_backend, else ``$MULTIDEV_BACKEND``, else ``numpy``."""
    if _default_backend is not None:
        return _default_backend
    return os.environ.get("MULTIDEV_BACKEND") or "numpy"
