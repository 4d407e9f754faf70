"""The lazy, thread-safe backend registry.

Adapters are found through the ``multidev.backends`` entry-point group (the built-in ones too) or
:func:`register_backend`. Nothing is imported until it is needed:

- by name: the entry point is loaded and the adapter instantiated (which imports the framework),
  then checked against the protocol (:func:`multidev.adapter.validate_adapter`);
- by tensor: the tensor's type is looked up in a cache; on a miss, only adapters whose framework
  module is already in ``sys.modules`` are asked (a tensor cannot exist otherwise), those of the
  framework the type comes from first, so a NumPy array never starts TensorFlow.

Names, as every ``backend=`` argument and ``--backend`` flag takes them:

- ``NAME``: a registered adapter (entry point or :func:`register_backend`);
- ``FAMILY:ARG``: a member of an adapter *family* registered as ``FAMILY``: an object with a
  ``select(arg)`` method returning the adapter class named ``"FAMILY:ARG"`` (the generic
  array-API adapter: ``array_api:array_api_strict``). ``FAMILY`` alone is ``select(None)``, the
  family's default member. A family may also have ``select_for(x)``, the ``ARG`` serving tensor
  ``x``: tensors no other adapter of their framework claims are then found by type;
- ``module:attr``: an importable adapter class or factory (a function returning an instance),
  registered under the ``name`` of what it makes.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

from ._device import Device
from .adapter import validate_adapter
from .errors import AdapterError, BackendNotAvailableError, CapabilityError, UnsupportedTensorError
from .protocol import Backend

__all__ = [
    "DEFAULT_BACKEND",
    "ENTRY_POINT_GROUP",
    "available_backends",
    "backend_of",
    "configure_virtual_devices",
    "get_backend",
    "get_default_backend",
    "loaded_backends",
    "native_device",
    "prefer",
    "register_backend",
    "registered_backends",
    "require",
    "set_default_backend",
    "supports",
    "waiter_of",
]

ENTRY_POINT_GROUP = "multidev.backends"
#: The backend calls use when none is named: the embedded NumPy reference.
DEFAULT_BACKEND = "numpy"

_lock = threading.RLock()
_factories: dict[str, Callable[[], Backend]] = {}  # name -> factory (class or callable)
_frameworks: dict[str, str] = {}  # name -> framework module name, once known
_instances: dict[str, Backend] = {}
_name_locks: dict[str, threading.Lock] = {}  # per-backend creation locks
_failures: dict[str, str] = {}  # name -> why it could not load
_type_cache: dict[type, str] = {}
#: tensor class -> the owner's ``tensor_wait_fn()``: the hot path of ``synchronize(tensor)``.
#: Cleared with the type cache.
wait_cache: dict[type, Callable[[Any], Any]] = {}
#: backend name (or None: every loaded backend) -> {a device spelling (a str or a Device) -> the
#: zero-argument wait of ``synchronize(device)``}: its hot path. Cleared with ``wait_cache``, so a
#: backend loaded later joins ``synchronize(device)``.
device_wait_cache: dict[str | None, dict[Any, Callable[[], Any]]] = {}
wait_generation = 0  # counts the clearings, so a cache entry built across one is not kept
lock = _lock  # the registry's lock, for the caches above
_supports: dict[tuple[int, type], bool] = {}  # (id(adapter), capability protocol) -> implements it
_claims: dict[type, list[str]] = {}  # tensor class -> adapters claiming it, in creation order
_preferred: list[str] = []  # a stack: the adapter that wins a shared tensor class (conformance runs)
_entry_points_read = False
_default_backend: str | None = None


def _clear_wait_caches() -> None:
    global wait_generation
    with _lock:
        wait_generation += 1
        wait_cache.clear()
        device_wait_cache.clear()


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

    The factory is called lazily, on first use, and its product checked against the protocol.
    ``replace=True`` overrides an existing registration (loaded or not).
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise AdapterError(f"a backend name must be a non-empty string without ':', got {name!r}")
    if not callable(factory):
        raise AdapterError(f"register_backend({name!r}, ...) needs a class or a callable returning an "
                           f"adapter, got {type(factory).__name__}")
    _read_entry_points()
    with _lock:
        if name in _instances and not replace:
            raise AdapterError(f"backend {name!r} is already registered and loaded; pass replace=True")
        _factories[name] = factory
        _forget(name)


def _forget(name: str) -> None:
    old = _instances.pop(name, None)
    if old is not None:
        for key in [k for k in _supports if k[0] == id(old)]:
            del _supports[key]
    _failures.pop(name, None)
    _frameworks.pop(name, None)
    for t in [t for t, n in _type_cache.items() if n == name]:
        del _type_cache[t]
    _clear_wait_caches()
    if old is not None:
        for owners in _claims.values():
            if name in owners:
                owners.remove(name)


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
    except Exception:  # noqa: BLE001 - a broken third-party module: reported by get_backend
        return None
    fw = getattr(obj, "framework", None)
    if isinstance(fw, str):
        _frameworks[name] = fw
    return fw if isinstance(fw, str) else None


def _adapter_class(name: str) -> Any:
    """The adapter class (or factory) registered under ``name``, loading only its module."""
    fac = _factories.get(name)
    if isinstance(fac, _EntryPointFactory):
        try:
            return fac.load()
        except Exception:  # noqa: BLE001 - unavailable here; get_backend reports it
            return None
    return fac


def _install_hint(name: str) -> str:
    def norm(extra: str) -> str:  # Provides-Extra is normalized (PEP 685): array_api is array-api there
        return re.sub(r"[-_.]+", "-", extra).lower()

    try:
        extras = {norm(e) for e in metadata.metadata("multidev").get_all("Provides-Extra") or []}
    except metadata.PackageNotFoundError:
        extras = set()
    if norm(name) in extras:
        return f'Install it with `pip install "multidev[{name}]"`.'
    return f"Install the package that provides the {name!r} adapter and its framework."


def get_backend(name: str | None = None) -> Backend:
    """The adapter instance for ``name`` (the default backend when ``None``), loading it on first use.

    ``name`` may also be ``"module:attr"``: an importable adapter class or factory, registered under
    the ``name`` of what it makes. Raises BackendNotAvailableError naming the registered backends
    when it cannot be had, AdapterError when the adapter breaks the protocol.
    """
    if name is None:
        name = get_default_backend()
    if not isinstance(name, str):
        raise BackendNotAvailableError(f"backend must be a name string, got {name!r:.60}")
    inst = _instances.get(name)
    if inst is not None:
        return inst
    _read_entry_points()
    if ":" in name and name not in _factories:
        head = name.partition(":")[0]
        if head in _factories and _family(head) is not None:
            return _load_member(head, name.partition(":")[2])
        return _load_dotted(name)
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
                f"no backend named {name!r:.60}. Registered: {', '.join(registered_backends()) or 'none'}. "
                f"Third-party adapters register through the {ENTRY_POINT_GROUP!r} entry-point group, "
                "multidev.register_backend(name, factory), or as 'module:attr'."
            )
        if failure is not None:
            raise BackendNotAvailableError(failure)
        if _family(name) is not None:
            return _load_member(name, None)
        try:
            inst = fac()
        except BackendNotAvailableError as e:
            with _lock:
                _failures[name] = str(e)
            raise
        except ImportError as e:
            msg = f"backend {name!r} is not available: {e}. {_install_hint(name)}"
            with _lock:
                _failures[name] = msg
            raise BackendNotAvailableError(msg) from e
        except Exception as e:
            raise _factory_error(name, e) from e
        validate_adapter(inst, name)
        if inst.name != name:
            raise AdapterError(f"the adapter registered as {name!r} names itself {inst.name!r}; register it "
                               "under its own name")
        with _lock:
            _instances[name] = inst
            _frameworks[name] = inst.framework
            _record_claims(inst)
        return inst


def _record_claims(inst: Backend) -> None:
    for t in inst.tensor_types():
        owners = _claims.setdefault(t, [])
        others = [o for o in owners if o != inst.name]
        if others:
            warnings.warn(f"multidev: adapter {inst.name!r} claims {t.__module__}.{t.__qualname__}, which "
                          f"{', '.join(map(repr, others))} claims already; such tensors go to "
                          f"{others[0]!r} unless multidev.registry.prefer({inst.name!r}) is in effect",
                          RuntimeWarning, stacklevel=4)
        if inst.name not in owners:
            owners.append(inst.name)
    for t in [t for t, n in _type_cache.items() if t in inst.tensor_types()]:
        del _type_cache[t]
    _clear_wait_caches()


def _family(name: str) -> Any:
    """The adapter family registered under ``name`` (an object with ``select``), or None."""
    obj = _adapter_class(name)
    return obj if callable(getattr(obj, "select", None)) else None


def _load_member(head: str, arg: str | None) -> Backend:
    """The member ``head:arg`` of family ``head`` (its default member when ``arg`` is None),
    registered under its own name and validated like any adapter."""
    fam = _family(head)
    spec = head if arg is None else f"{head}:{arg}"
    try:
        factory = fam.select(arg)
    except BackendNotAvailableError:
        raise
    except ImportError as e:
        raise BackendNotAvailableError(f"backend {spec!r} is not available: {e}. {_install_hint(head)}") from e
    except Exception as e:
        raise _factory_error(spec, e) from e
    full = getattr(factory, "name", None)
    if not isinstance(full, str) or not full.startswith(head + ":") or len(full) <= len(head) + 1:
        raise AdapterError(f"adapter family {head!r} selected {factory!r} for {spec!r}, whose class attribute "
                           f"'name' is {full!r}; a member's name must be '{head}:ARG'")
    with _lock:
        if full not in _instances and _factories.get(full) is not factory:
            _factories[full] = factory
            _failures.pop(full, None)
    inst = get_backend(full)
    if spec != full:
        with _lock:
            _instances[spec] = inst
    return inst


def _dotted_object(spec: str) -> Any:
    """The object ``module:attr`` names (imported, not called), or None where it cannot be had."""
    try:
        return _import_dotted(spec)
    except BackendNotAvailableError:
        return None


def _import_dotted(spec: str) -> Any:
    mod_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as e:
        raise BackendNotAvailableError(f"cannot import adapter {spec!r}: {e}") from e
    return obj


def _load_dotted(spec: str) -> Backend:
    obj = _import_dotted(spec)
    if not callable(obj):
        raise AdapterError(f"adapter {spec!r} is a {type(obj).__name__}, not a class or factory")
    name = getattr(obj, "name", None)
    if not isinstance(name, str):
        # A factory function: make one instance to learn its name, and keep it.
        try:
            made = obj()
        except ImportError as e:
            raise BackendNotAvailableError(f"adapter {spec!r} is not available: {e}") from e
        except Exception as e:
            raise _factory_error(spec, e) from e
        name = getattr(made, "name", None)
        if not isinstance(name, str) or not name:
            raise AdapterError(f"adapter {spec!r} makes an object without a string 'name' attribute "
                               f"({type(made).__name__}); see multidev.protocol.Backend")
        validate_adapter(made, spec)
        with _lock:
            _factories[name] = obj
            _forget(name)
            _instances[name] = made
            _frameworks[name] = made.framework
            _record_claims(made)
            _instances[spec] = made
        return made
    with _lock:
        if _factories.get(name) is not obj:
            register_backend(name, obj, replace=True)
    inst = get_backend(name)
    with _lock:
        _instances[spec] = inst
    return inst


def _factory_error(name: str, e: Exception) -> AdapterError:
    """The AdapterError for an adapter factory (or class, or family) that raised while creating the
    adapter; the original exception is its ``__cause__`` (an AdapterError is kept as it is)."""
    if isinstance(e, AdapterError):
        return e
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return AdapterError(f"the adapter registered as {name!r} could not be created: its factory raised "
                        f"{type(e).__name__}{': ' + first if first else ''}. Fix the adapter (or its framework's "
                        "installation); the original error is chained below")


def available_backends() -> list[str]:
    """Names of the adapters whose framework can be imported (loading each one), each once under
    its own name (``array_api:array_api_strict``, not the family's bare ``array_api``)."""
    out: list[str] = []
    for name in registered_backends():
        try:
            inst = get_backend(name)
        except BackendNotAvailableError:
            continue
        if inst.name not in out:  # a family's bare name and its default member are one adapter
            out.append(inst.name)
    return sorted(out)


_loaded: tuple[tuple[int, ...], tuple[Backend, ...]] = ((), ())


def loaded_backends() -> tuple[Backend, ...]:
    """Adapters already instantiated in this process (each once), in load order."""
    global _loaded
    key = tuple(map(id, _instances.values()))
    if _loaded[0] == key:
        return _loaded[1]
    with _lock:
        seen: dict[int, Backend] = {}
        for n, b in _instances.items():
            if n == b.name:  # not the aliases ("module:attr" specs, a family's bare name)
                seen.setdefault(id(b), b)
        _loaded = (key, tuple(seen.values()))
        return _loaded[1]


def configure_virtual_devices(count: int, names: list[str] | None = None) -> dict[str, bool]:
    """Ask every registered adapter (or those in ``names``) for ``count`` virtual CPU devices
    through its ``configure_devices`` hook, before its framework starts. Values the user set
    already are kept. Returns, per adapter, whether the request is in place."""
    _read_entry_points()
    out = {}
    for n in names or registered_backends():
        if ":" in n and n not in _factories:
            cls = None if _family(n.partition(":")[0]) is not None else _dotted_object(n)
        else:
            cls = _adapter_class(n)
        hook = getattr(cls, "configure_devices", None)
        if callable(hook):
            try:
                out[n] = bool(hook(count))
            except Exception:  # noqa: BLE001 - a hook that fails leaves the backend's default
                out[n] = False
    return out


@contextlib.contextmanager
def prefer(name: str) -> Iterator[None]:
    """Within the block, tensors of a class that several loaded adapters claim go to ``name``
    (the conformance suite tests a renamed or mutated copy of an adapter this way)."""
    with _lock:
        _preferred.append(name)
        _type_cache.clear()
        _clear_wait_caches()
    try:
        yield
    finally:
        with _lock:
            _preferred.remove(name)
            _type_cache.clear()
            _clear_wait_caches()


def _related(root: str, fw: str) -> bool:
    """Whether a type from top-level module ``root`` can belong to framework ``fw`` (jaxlib/jax)."""
    return root == fw or root.startswith(fw) or fw.startswith(root)


def _roots(t: type) -> set[str]:
    return {c.__module__.split(".")[0] for c in t.__mro__ if c is not object}


def _defines(name: str, t: type) -> bool:
    """Whether ``t`` (or a base) is defined in the module of adapter ``name`` (a host-array class an
    adapter makes, such as CuPy's NumPy subclass, belongs to that adapter's framework)."""
    mod = getattr(_adapter_class(name), "__module__", None)
    return isinstance(mod, str) and any(c.__module__ == mod for c in t.__mro__)


def _specificity(x: Any, types: tuple[type, ...]) -> int:
    """How close x's type is to the nearest of ``types`` in its MRO (0: exactly one of them)."""
    mro = type(x).__mro__
    return min((mro.index(t) for t in types if t in mro), default=len(mro))


def backend_of(x: Any) -> Backend:
    """The adapter that owns tensor ``x``. Cached by type; never imports a framework.

    Adapters of the frameworks the type (or a base class) comes from are asked first, so
    identifying a tensor does not start other frameworks' runtimes; among several owners the most
    specific class wins (a framework's ndarray subclass is not claimed by the NumPy reference), then
    the preferred adapter (:func:`prefer`), then the one loaded first."""
    t = type(x)
    name = _type_cache.get(t)
    if name is not None:
        inst = _instances.get(name)
        if inst is not None:
            return inst
    _read_entry_points()
    with _lock:
        names = list(_factories)
    roots = _roots(t)
    # Python's own objects (numbers, lists, None, strings) belong to no framework: only adapters
    # already loaded are asked about them, so a stray non-tensor never starts a framework's adapter.
    plain = roots <= {"builtins"}
    related: list[str] = []
    others: list[str] = []
    for n in names:
        if plain and n not in _instances:
            continue
        fw = _frameworks.get(n) or _framework_of(n)
        if n not in _instances and (fw is None or fw not in sys.modules):
            continue
        is_related = (fw is not None and any(_related(r, fw) for r in roots)) or _defines(n, t)
        (related if is_related else others).append(n)
    broken: list[str] = []
    for group in (related, others):
        matches = []
        for n in group:
            try:
                inst = get_backend(n)
            except Exception as e:  # noqa: BLE001 - an adapter that cannot start here does not own this tensor
                broken.append(f"{n} ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
                continue
            types = inst.tensor_types()
            if isinstance(x, types):
                matches.append((_specificity(x, types), inst))
        if matches:
            best = min(m[0] for m in matches)
            tied = [m[1] for m in matches if m[0] == best]
            inst = tied[0]
            for p in reversed(_preferred):
                hit = [b for b in tied if b.name == p]
                if hit:
                    inst = hit[0]
                    break
            else:
                owners = _claims.get(t) or []
                for o in owners:
                    hit = [b for b in tied if b.name == o]
                    if hit:
                        inst = hit[0]
                        break
            with _lock:
                _type_cache[t] = inst.name
            return inst
    if not related:  # no adapter of this tensor's framework: ask the families (array API, ...)
        found = _family_member_for(x, names, broken)
        if found is not None:
            with _lock:
                _type_cache[t] = found.name
            return found
    raise UnsupportedTensorError(
        f"no backend recognises an object of type {t.__module__}.{t.__qualname__}. "
        f"Registered backends: {', '.join(registered_backends())}; loaded: "
        f"{', '.join(b.name for b in loaded_backends()) or 'none'}. Pass a native tensor of one of them."
        + (f" Adapters that could not load: {'; '.join(broken)}." if broken else "")
    )


def waiter_of(x: Any) -> Callable[[Any], Any]:
    """The function that waits for tensors of x's class (the owner's ``tensor_wait_fn()``), cached
    by class."""
    t = type(x)
    w = wait_cache.get(t)
    if w is None:
        b = backend_of(x)
        w = b.tensor_wait_fn()
        with _lock:
            if _type_cache.get(t) == b.name:
                wait_cache[t] = w
    return w


def require(b: Backend, protocol: type, what: str, hint: str = "") -> Any:
    """``b`` itself where it implements capability protocol ``protocol`` (see :func:`supports`), for
    calling that protocol's methods; else CapabilityError naming the backend, ``what`` needed it and
    the protocol it lacks."""
    if supports(b, protocol):
        return b
    raise CapabilityError(f"{what}: the {b.name} backend does not implement {protocol.__name__} "
                          f"(multidev.adapter.{protocol.__name__}){'; ' + hint if hint else ''}")


def supports(b: Backend, protocol: type) -> bool:
    """Whether adapter ``b`` implements capability protocol ``protocol`` (declared, or for an adapter
    written against 0.2, every method present), cached per adapter."""
    key = (id(b), protocol)
    hit = _supports.get(key)
    if hit is None:
        hit = isinstance(b, protocol)
        with _lock:
            if len(_supports) < 4096:
                _supports[key] = hit
    return hit


def _family_member_for(x: Any, names: list[str], broken: list[str]) -> Backend | None:
    """The family member serving ``x`` (through the families' ``select_for``), or None."""
    for n in names:
        if ":" in n:
            continue
        fam = _family(n)
        pick = getattr(fam, "select_for", None)
        if not callable(pick):
            continue
        try:
            arg = pick(x)
            if not arg:
                continue
            inst = get_backend(f"{n}:{arg}")
        except Exception as e:  # noqa: BLE001 - a member that cannot start here does not own x
            broken.append(f"{n} ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            continue
        if isinstance(x, inst.tensor_types()):
            return inst
    return None


def native_device(obj: Any) -> Device | None:
    """Resolve a framework's native device object through the adapter whose framework made it
    (adapters cache their own lookups)."""
    root = type(obj).__module__.split(".")[0]
    _read_entry_points()
    for n in list(_factories):
        fw = _framework_of(n)
        if fw is None or fw not in sys.modules or not _related(root, fw):
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
    return os.environ.get("MULTIDEV_BACKEND") or DEFAULT_BACKEND
