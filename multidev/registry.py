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
import importlib.util
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ._device import Device
from .adapter import validate_adapter
from .errors import AdapterError, BackendNotAvailableError, CapabilityError, MultidevError, UnsupportedTensorError
from .protocol import CONCERNS, Backend

if TYPE_CHECKING:
    from importlib import metadata  # (imported when the entry points are first read: it costs a
    # fifth of import multidev)

__all__ = [
    "DEFAULT_BACKEND",
    "DEVICE_WAIT_SPELLINGS",
    "ENTRY_POINT_GROUP",
    "available_backends",
    "backend_of",
    "cached_device_waits",
    "cached_owner",
    "cached_tensor_wait",
    "configure_virtual_devices",
    "device_wait",
    "get_backend",
    "get_default_backend",
    "installed_backends",
    "loaded_backends",
    "native_device",
    "prefer",
    "preferred_backends",
    "register_backend",
    "registered_backends",
    "registry_generation",
    "require",
    "set_default_backend",
    "supports",
    "tie_cache",
    "tied_put",
    "unregister_backend",
    "waiter_of",
]

ENTRY_POINT_GROUP = "multidev.backends"
#: The backend calls use when none is named: the embedded NumPy reference.
DEFAULT_BACKEND = "numpy"

class _State:
    """Everything the registry knows, in one object behind one lock; the functions of this module
    are its only readers and writers (the hot paths read the two wait caches through
    :func:`cached_tensor_wait` and :func:`cached_device_wait`)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.factories: dict[str, Callable[[], Backend]] = {}  # name -> factory (class or callable)
        self.frameworks: dict[str, str] = {}  # name -> framework module name, once known
        self.instances: dict[str, Backend] = {}
        self.name_locks: dict[str, threading.Lock] = {}  # per-backend creation locks
        self.failures: dict[str, str] = {}  # name -> why it could not load
        #: name -> why its adapter was refused (validate_adapter's AdapterError, a wrong name): raised
        #: again without making another instance, until the name is registered or forgotten anew
        self.invalid: dict[str, str] = {}
        self.type_cache: dict[type, str] = {}  # tensor class -> its adapter's name
        #: tensor class -> its adapter: the hot path of ``backend_of`` and ``device_of`` (one lookup).
        self.owner_cache: dict[type, Backend] = {}
        #: class -> (len(sys.modules) then, the error): classes no adapter owns (containers, models),
        #: so walking a structure asks the adapters once per class, not once per node and call.
        #: Ownership is taken to be a function of the class and the loaded adapters (an ABC an adapter
        #: claims, registered with a class later, is seen after the next clearing or import).
        self.unowned: dict[type, tuple[int, str]] = {}
        #: caches of the layers above that hold adapters or what they answered (creation plans):
        #: cleared with the wait caches, whenever an adapter is loaded, registered or preferred.
        self.tied: list[dict[Any, Any]] = []
        #: tensor class -> the owner's ``tensor_wait_fn()``: the hot path of ``synchronize(tensor)``.
        self.wait_cache: dict[type, Callable[[Any], Any]] = {}
        #: backend name (or None: every loaded backend) -> {a device spelling (a str or a Device) ->
        #: the zero-argument wait of ``synchronize(device)``}: its hot path.
        self.device_wait_cache: dict[str | None, dict[Any, Callable[[], Any]]] = {}
        self.wait_generation = 0  # counts the clearings, so an entry built across one is not kept
        self.claims: dict[type, list[str]] = {}  # tensor class -> adapters claiming it, in creation order
        self.preferred: list[str] = []  # a stack: the adapter that wins a shared tensor class
        self.entry_points_read = False
        self.default_backend: str | None = None
        self.loaded: tuple[tuple[int, ...], tuple[Backend, ...]] = ((), ())


_s = _State()
#: At most this many device spellings per backend key in the device-wait cache (a bound on its size).
DEVICE_WAIT_SPELLINGS = 64


def _clear_wait_caches() -> None:
    with _s.lock:
        _s.wait_generation += 1
        _s.wait_cache.clear()
        _s.device_wait_cache.clear()
        _s.owner_cache.clear()
        _s.unowned.clear()
        for c in _s.tied:
            c.clear()


def _read_entry_points() -> None:
    if _s.entry_points_read:
        return
    with _s.lock:
        if _s.entry_points_read:
            return
        from importlib import metadata

        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            # Explicit register_backend calls win over entry points of the same name.
            _s.factories.setdefault(ep.name, _EntryPointFactory(ep))
        _s.entry_points_read = True


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
    if not isinstance(name, str) or not name:
        raise AdapterError(f"a backend name must be a non-empty string, got {name!r}")
    if ":" in name:
        head, _, arg = name.partition(":")
        _read_entry_points()
        if not arg or ":" in arg or _family(head) is None:
            raise AdapterError(f"backend name {name!r}: a name with ':' is FAMILY:ARG, a member of a registered "
                               "adapter family (such as array_api:LIB); plain names have no ':'")
    if not callable(factory):
        raise AdapterError(f"register_backend({name!r}, ...) needs a class or a callable returning an "
                           f"adapter, got {type(factory).__name__}")
    _read_entry_points()
    with _s.lock:
        if name in _s.instances and not replace:
            raise AdapterError(f"backend {name!r} is already registered and loaded; pass replace=True")
        _s.factories[name] = factory
        _forget(name)


def unregister_backend(name: str) -> None:
    """Remove a registration (made by :func:`register_backend`, or an entry point's) and its loaded
    adapter; unknown names are ignored. Tensors of the adapter's classes go to their other claimant."""
    with _s.lock:
        _forget(name)
        _s.factories.pop(name, None)


def _forget(name: str) -> None:
    old = _s.instances.pop(name, None)
    _s.failures.pop(name, None)
    _s.invalid.pop(name, None)
    _s.frameworks.pop(name, None)
    for t in [t for t, n in _s.type_cache.items() if n == name]:
        del _s.type_cache[t]
    _clear_wait_caches()
    if old is not None:
        for owners in _s.claims.values():
            if name in owners:
                owners.remove(name)


def registered_backends() -> list[str]:
    """Names of every registered adapter, installed framework or not."""
    _read_entry_points()
    return sorted(_s.factories)


def installed_backends() -> dict[str, str]:
    """The backends whose framework is installed, by name, each with its framework's module name,
    importing no framework that is not imported already (where :func:`multidev.backends` imports
    each): an adapter's framework counts as installed when its module is found on the path
    (``importlib.util.find_spec``), so one found there may still fail to import, which
    :func:`get_backend` then reports. A family's name is resolved to its default member (loading
    it), as is an adapter that names no framework or whose framework is imported already."""
    out: dict[str, str] = {}
    for name in registered_backends():
        fw = None if _family(name) is not None else _framework_of(name)
        if fw is not None and fw not in sys.modules:
            try:
                found = importlib.util.find_spec(fw) is not None
            except (ImportError, ValueError):
                found = False
            if found:
                out[name] = fw
            continue
        try:
            inst = get_backend(name)
        except BackendNotAvailableError:
            continue
        out.setdefault(inst.name, inst.framework)
    return dict(sorted(out.items()))


def _framework_of(name: str) -> str | None:
    """The framework module name of an adapter, loading its (light) module but not its framework."""
    if name in _s.frameworks:
        return _s.frameworks[name]
    fac = _s.factories.get(name)
    if fac is None:
        return None
    try:
        obj = fac.load() if isinstance(fac, _EntryPointFactory) else fac
    except Exception:  # noqa: BLE001 - a broken third-party module: reported by get_backend
        return None
    fw = getattr(obj, "framework", None)
    if isinstance(fw, str):
        _s.frameworks[name] = fw
    return fw if isinstance(fw, str) else None


def _adapter_class(name: str) -> Any:
    """The adapter class (or factory) registered under ``name``, loading only its module."""
    fac = _s.factories.get(name)
    if isinstance(fac, _EntryPointFactory):
        try:
            return fac.load()
        except Exception:  # noqa: BLE001 - unavailable here; get_backend reports it
            return None
    return fac


def _install_hint(name: str) -> str:
    _read_entry_points()
    hint = getattr(_adapter_class(name), "install_hint", None)
    if callable(hint):
        try:
            text = hint()
        except Exception:  # noqa: BLE001 - a broken hint must not hide the real error
            text = None
        if isinstance(text, str) and text:
            return text

    def norm(extra: str) -> str:  # Provides-Extra is normalized (PEP 685): array_api is array-api there
        return re.sub(r"[-_.]+", "-", extra).lower()

    from importlib import metadata

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
    inst = _s.instances.get(name)
    if inst is not None:
        return inst
    _read_entry_points()
    if ":" in name and name not in _s.factories:
        head = name.partition(":")[0]
        if head in _s.factories and _family(head) is not None:
            return _load_member(head, name.partition(":")[2])
        return _load_dotted(name)
    with _s.lock:
        name_lock = _s.name_locks.setdefault(name, threading.Lock())
    # One lock per name: a slow framework import (seconds for TF) blocks only callers of that
    # backend, never every other registry lookup.
    with name_lock:
        inst = _s.instances.get(name)
        if inst is not None:
            return inst
        with _s.lock:
            fac = _s.factories.get(name)
            failure = _s.failures.get(name)
        if fac is None:
            raise BackendNotAvailableError(
                f"no backend named {name!r:.60}. Registered: {', '.join(registered_backends()) or 'none'}. "
                f"Third-party adapters register through the {ENTRY_POINT_GROUP!r} entry-point group, "
                "multidev.register_backend(name, factory), or as 'module:attr'."
            )
        if failure is not None:
            raise BackendNotAvailableError(failure)
        refused = _s.invalid.get(name)
        if refused is not None:  # (a search of the adapters, backend_of's, asks it again on every miss)
            raise AdapterError(refused)
        if _family(name) is not None:
            return _load_member(name, None)
        try:
            inst = fac()
        except BackendNotAvailableError as e:
            with _s.lock:
                _s.failures[name] = str(e)
            raise
        except ImportError as e:
            msg = f"backend {name!r} is not available: {e}. {_install_hint(name)}"
            with _s.lock:
                _s.failures[name] = msg
            raise BackendNotAvailableError(msg) from e
        except Exception as e:
            if isinstance(e, MultidevError):
                raise  # raised on purpose (a bad device count, say): as it is
            raise _factory_error(name, e) from e
        try:
            validate_adapter(inst, name)
            if inst.name != name:
                raise AdapterError(f"the adapter registered as {name!r} names itself {inst.name!r}; register "
                                   "it under its own name")
        except AdapterError as e:  # a property of the adapter's class: the same next time
            with _s.lock:
                if _s.factories.get(name) is fac:
                    _s.invalid[name] = str(e)
            raise
        with _s.lock:
            _s.instances[name] = inst
            _s.frameworks[name] = inst.framework
            _record_claims(inst)
        return inst


def _record_claims(inst: Backend) -> None:
    for t in inst.tensor_types():
        owners = _s.claims.setdefault(t, [])
        others = [o for o in owners if o != inst.name]
        if others:
            warnings.warn(f"multidev: adapter {inst.name!r} claims {t.__module__}.{t.__qualname__}, which "
                          f"{', '.join(map(repr, others))} claims already; such tensors go to "
                          f"{others[0]!r} unless multidev.registry.prefer({inst.name!r}) is in effect",
                          RuntimeWarning, stacklevel=4)
        if inst.name not in owners:
            owners.append(inst.name)
    for t in [t for t, n in _s.type_cache.items() if t in inst.tensor_types()]:
        del _s.type_cache[t]
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
        if isinstance(e, MultidevError):
            raise
        raise _factory_error(spec, e) from e
    full = getattr(factory, "name", None)
    if not isinstance(full, str) or not full.startswith(head + ":") or len(full) <= len(head) + 1:
        raise AdapterError(f"adapter family {head!r} selected {factory!r} for {spec!r}, whose class attribute "
                           f"'name' is {full!r}; a member's name must be '{head}:ARG'")
    with _s.lock:
        if full not in _s.instances and _s.factories.get(full) is not factory:
            _s.factories[full] = factory
            _s.failures.pop(full, None)
    inst = get_backend(full)
    if spec != full:
        with _s.lock:
            _s.instances[spec] = inst
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
            if isinstance(e, MultidevError):
                raise  # raised on purpose (a bad device count, say): as it is
            raise _factory_error(spec, e) from e
        name = getattr(made, "name", None)
        if not isinstance(name, str) or not name:
            raise AdapterError(f"adapter {spec!r} makes an object without a string 'name' attribute "
                               f"({type(made).__name__}); see multidev.protocol.Backend")
        validate_adapter(made, spec)
        with _s.lock:
            _s.factories[name] = obj
            _forget(name)
            _s.instances[name] = made
            _s.frameworks[name] = made.framework
            _record_claims(made)
            _s.instances[spec] = made
        return made
    with _s.lock:
        if _s.factories.get(name) is not obj:
            register_backend(name, obj, replace=True)
    inst = get_backend(name)
    with _s.lock:
        _s.instances[spec] = inst
    return inst


def _factory_error(name: str, e: Exception) -> AdapterError:
    """The AdapterError for an adapter factory (or class, or family) that raised while creating the
    adapter; the original exception is its ``__cause__``."""
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


def loaded_backends() -> tuple[Backend, ...]:
    """Adapters already instantiated in this process (each once), in load order."""
    key = tuple(map(id, _s.instances.values()))
    if _s.loaded[0] == key:
        return _s.loaded[1]
    with _s.lock:
        seen: dict[int, Backend] = {}
        for n, b in _s.instances.items():
            if n == b.name:  # not the aliases ("module:attr" specs, a family's bare name)
                seen.setdefault(id(b), b)
        _s.loaded = (key, tuple(seen.values()))
        return _s.loaded[1]


def configure_virtual_devices(count: int, names: list[str] | None = None) -> dict[str, bool]:
    """Ask every registered adapter (or those in ``names``) for ``count`` virtual CPU devices
    through its ``configure_devices`` hook, before its framework starts. Values the user set
    already are kept. Returns, per adapter, whether the request is in place."""
    _read_entry_points()
    out = {}
    for n in names or registered_backends():
        if ":" in n and n not in _s.factories:
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


def preferred_backends() -> tuple[str, ...]:
    """The names :func:`prefer` has in effect now, the innermost first."""
    return tuple(reversed(_s.preferred))


@contextlib.contextmanager
def prefer(name: str) -> Iterator[None]:
    """Within the block, tensors of a class that several loaded adapters claim go to ``name``
    (the conformance suite tests a renamed or mutated copy of an adapter this way)."""
    with _s.lock:
        _s.preferred.append(name)
        _s.type_cache.clear()
        _clear_wait_caches()
    try:
        yield
    finally:
        with _s.lock:
            _s.preferred.remove(name)
            _s.type_cache.clear()
            _clear_wait_caches()


def _related(root: str, fw: str) -> bool:
    """Whether a type from top-level module ``root`` can belong to framework ``fw`` (jaxlib/jax)."""
    return root == fw or root.startswith(fw) or fw.startswith(root)


def _roots(t: type) -> set[str]:
    return {c.__module__.split(".")[0] for c in t.__mro__ if c is not object}


def _claims_class(name: str, t: type) -> bool:
    """Whether the loaded adapter ``name`` claims ``t`` or one of its bases by class (``tensor_types``):
    ownership by class, wherever the adapter (or a subclass of it) is defined. A host-array class an
    adapter makes (CuPy's NumPy subclass) belongs to it this way, not to the NumPy reference."""
    inst = _s.instances.get(name)
    if inst is None:
        return False
    mine = set(inst.tensor_types())
    return any(c in mine for c in t.__mro__ if c.__module__.split(".")[0] not in _roots_of_frameworks(inst))


def _roots_of_frameworks(inst: Backend) -> set[str]:
    """The top-level modules whose own classes do not make a claim by class (the adapter's framework's
    classes go by the framework rule; NumPy's ndarray is everyone's base)."""
    return {"numpy", "builtins", inst.framework.split(".")[0]}


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
    inst = _s.owner_cache.get(t)
    if inst is not None:
        return inst
    mods, generation = len(sys.modules), _s.wait_generation
    miss = _s.unowned.get(t)
    if miss is not None and miss[0] == mods:  # (a framework imported since may own it)
        raise UnsupportedTensorError(miss[1])
    name = _s.type_cache.get(t)
    if name is not None:
        inst = _s.instances.get(name)
        if inst is not None:
            _s.owner_cache[t] = inst
            return inst
    _read_entry_points()
    with _s.lock:
        names = list(_s.factories)
    roots = _roots(t)
    # Python's own objects (numbers, lists, None, strings) belong to no framework: only adapters
    # already loaded are asked about them, so a stray non-tensor never starts a framework's adapter.
    plain = roots <= {"builtins"}
    related: list[str] = []
    others: list[str] = []
    for n in names:
        if plain and n not in _s.instances:
            continue
        fw = _s.frameworks.get(n) or _framework_of(n)
        if n not in _s.instances and (fw is None or fw not in sys.modules):
            continue
        is_related = (fw is not None and any(_related(r, fw) for r in roots)) or _claims_class(n, t)
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
            for p in reversed(_s.preferred):
                hit = [b for b in tied if b.name == p]
                if hit:
                    inst = hit[0]
                    break
            else:
                owners = _s.claims.get(t) or []
                for o in owners:
                    hit = [b for b in tied if b.name == o]
                    if hit:
                        inst = hit[0]
                        break
            with _s.lock:
                _s.type_cache[t] = inst.name
                if _s.instances.get(inst.name) is inst:  # (the class seen once is a class seen before)
                    _s.owner_cache[t] = inst
            return inst
    if not related:  # no adapter of this tensor's framework: ask the families (array API, ...)
        found = _family_member_for(x, names, broken)
        if found is not None:
            with _s.lock:
                _s.type_cache[t] = found.name
            return found
    msg = (f"no backend recognises an object of type {t.__module__}.{t.__qualname__}. "
           f"Registered backends: {', '.join(registered_backends())}; loaded: "
           f"{', '.join(b.name for b in loaded_backends()) or 'none'}. Pass a native tensor of one of them."
           + (f" Adapters that could not load: {'; '.join(broken)}." if broken else ""))
    with _s.lock:
        # Remembered only where the answer cannot change without a clearing or an import: no adapter
        # failed to load (it is asked again next time), and no adapter was loaded, registered or
        # preferred during this search (another thread's; a clearing bumps the generation).
        if not broken and _s.wait_generation == generation and len(sys.modules) == mods:
            if len(_s.unowned) >= 1024:
                _s.unowned.clear()
            _s.unowned[t] = (mods, msg)
    raise UnsupportedTensorError(msg)


#: The hot path of ``device_of``/``dtype_of``: the adapter of a tensor class seen before, or None (a
#: bound ``dict.get`` of the registry's one owner cache, filled by :func:`backend_of`).
cached_owner: Callable[[type], Backend | None] = _s.owner_cache.get
#: The hot path of ``synchronize(tensor)``: the cached wait of a tensor class, or None (a bound
#: ``dict.get`` of the registry's one cache, which is only ever cleared, never replaced).
cached_tensor_wait: Callable[[type], Callable[[Any], Any] | None] = _s.wait_cache.get
#: The hot path of ``synchronize(device)``: ``{device spelling: wait}`` cached for a backend key, or None.
cached_device_waits: Callable[[str | None], dict[Any, Callable[[], Any]] | None] = _s.device_wait_cache.get


def tie_cache(cache: dict[Any, Any]) -> dict[Any, Any]:
    """``cache`` (a dict a layer above keeps of adapters and their answers, keyed by backend names or
    adapters), cleared whenever the registry changes: an adapter loaded, registered, unregistered or
    preferred, or the default backend set. Returns ``cache``. Write into it with :func:`tied_put`."""
    with _s.lock:
        _s.tied.append(cache)
    return cache


def registry_generation() -> int:
    """How many times the registry changed so far: read it before working out an answer to keep in
    a :func:`tie_cache` cache, and hand it to :func:`tied_put`."""
    return _s.wait_generation


def tied_put(cache: dict[Any, Any], key: Any, value: Any, generation: int, limit: int = 1024) -> None:
    """``cache[key] = value`` unless the registry changed since ``generation`` (the answer may hold an
    adapter it forgot since) or the cache holds ``limit`` entries."""
    with _s.lock:
        if _s.wait_generation == generation and len(cache) < limit:
            cache[key] = value


def device_wait(backend: str | None, spec: Any, build: Callable[[], Callable[[], Any]]) -> Callable[[], Any]:
    """The zero-argument wait of ``synchronize(spec, backend=backend)``: cached, else ``build()``
    and kept (unless an adapter loaded meanwhile, which must then join it, or the key already holds
    :data:`DEVICE_WAIT_SPELLINGS` spellings)."""
    per = _s.device_wait_cache.get(backend)
    fn = None if per is None else per.get(spec)
    if fn is not None:
        return fn
    generation = _s.wait_generation
    fn = build()
    with _s.lock:
        per = _s.device_wait_cache.setdefault(backend, {})
        if _s.wait_generation == generation and len(per) < DEVICE_WAIT_SPELLINGS:
            per[spec] = fn
    return fn


def waiter_of(x: Any) -> Callable[[Any], Any]:
    """The function that waits for tensors of x's class (the owner's ``tensor_wait_fn()``), cached
    by class."""
    t = type(x)
    w = _s.wait_cache.get(t)
    if w is None:
        b = backend_of(x)
        w = b.tensor_wait_fn()
        with _s.lock:
            if _s.type_cache.get(t) == b.name:
                _s.wait_cache[t] = w
    return w


def require(b: Backend, protocol: type, what: str, hint: str = "") -> Any:
    """``b``'s concern object for capability protocol ``protocol`` (its attribute of
    :data:`~multidev.protocol.CONCERNS`), for calling that protocol's methods; CapabilityError naming
    the backend, ``what`` needed it and the protocol it lacks where the attribute is None."""
    c = getattr(b, _ATTR[protocol], None)
    if c is not None:
        return c
    raise CapabilityError(f"{what}: the {b.name} backend does not implement {protocol.__name__} "
                          f"(its {_ATTR[protocol]} concern is None){'; ' + hint if hint else ''}")


def supports(b: Backend, protocol: type) -> bool:
    """Whether adapter ``b`` has capability protocol ``protocol``: its concern attribute is not None.
    A protocol that is no capability (:data:`~multidev.protocol.CONCERNS`): False."""
    attr = _ATTR.get(protocol)
    return attr is not None and getattr(b, attr, None) is not None


#: Each capability protocol's concern attribute.
_ATTR = {p: a for a, p in CONCERNS.items()}


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
    for n in list(_s.factories):
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
    if name is not None:
        get_backend(name)  # fail now, with the helpful message, not at first use
    _s.default_backend = name
    _clear_wait_caches()  # (answers kept for "the default backend" belong to the old one)


def get_default_backend() -> str:
    """The default backend's name: set_default_backend, else ``$MULTIDEV_BACKEND``, else ``numpy``."""
    if _s.default_backend is not None:
        return _s.default_backend
    return os.environ.get("MULTIDEV_BACKEND") or DEFAULT_BACKEND
