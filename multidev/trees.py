"""Whole structures of tensors: nested lists, tuples, named tuples and dicts (written here), the
frameworks' own trees (JAX pytree nodes) and models (torch ``nn.Module``, Gluon ``Block``, Keras
models) through their adapters' :class:`~multidev.protocol.SupportsModels`.

:func:`tree_map` applies a tensor call to every tensor leaf and rebuilds the structure: a list
stays a list, a named tuple the same named tuple, a dict the same dict type with its keys in order,
a framework tree the framework's own node. ``None`` is an empty subtree and stays ``None``. A leaf
that is no tensor raises UnsupportedTensorError naming its path (``[1]['w']``), except in a framework's tree, whose
other leaves (a model's activation function, a Python number) are kept as they are. The same tensor
object reached twice (tied weights) gives the same result object twice. A ``"module"`` (moved in
place) is handed to the caller's ``module`` function as a whole.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from .errors import InvalidArgumentError, UnsupportedTensorError
from .protocol import Backend, SupportsModels
from .registry import backend_of, cached_owner, loaded_backends, preferred_backends, supports

__all__ = ["is_structure", "leaves", "structure_owner", "tree_map"]

#: Deeper nesting than any real structure: refused instead of exhausting the stack.
MAX_DEPTH = 256


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def structure_owner(obj: Any) -> tuple[Backend, str] | None:
    """The loaded adapter whose framework defines ``obj`` as a tree or module, with its kind, or None.
    Only adapters already loaded are asked (no structure exists before its framework starts), the
    preferred ones first (:func:`~multidev.registry.prefer`: a renamed or mutated copy of an adapter
    is asked before the original, as for tensors)."""
    backends = loaded_backends()
    first = preferred_backends()
    if first:
        backends = tuple(sorted(backends, key=lambda b: first.index(b.name) if b.name in first else len(first)))
    for b in backends:
        if supports(b, SupportsModels):
            kind = b.model_kind(obj)  # type: ignore[attr-defined]
            if kind is not None:
                return b, kind
    return None


def is_structure(obj: Any) -> bool:
    """Whether ``obj`` is a container or framework structure (not a tensor, not a plain value)."""
    if isinstance(obj, (list, tuple, dict)):
        return True
    try:
        backend_of(obj)
        return False
    except UnsupportedTensorError:
        return structure_owner(obj) is not None


def owner_or_structure(x: Any) -> Backend | None:
    """The adapter of tensor ``x`` (one lookup for a class seen before), or None where ``x`` is a
    structure (see :func:`is_structure`); UnsupportedTensorError for anything else. The one
    dispatch of the calls that take a tensor or a structure."""
    b = cached_owner(type(x))
    if b is not None:
        return b
    try:
        return backend_of(x)
    except UnsupportedTensorError:
        if not is_structure(x):
            raise
        return None


def _path(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p!r}]" for p in path) or "(the argument itself)"


def _remade(cls: type, items: list[Any]) -> Any:
    """A list subclass rebuilt from its new items (a plain list where its constructor refuses)."""
    try:
        return cls(items)
    except TypeError:
        return items


def tree_map(leaf: Callable[[Any], Any], obj: Any, what: str, *,
             module: Callable[[Backend, Any], Any] | None = None,
             is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """``obj`` with ``leaf(x)`` for every tensor ``x`` (or every object ``is_leaf`` accepts) and
    ``module(b, m)`` for every framework module ``m`` (owned by adapter ``b``); the structure rebuilt.
    ``what`` names the call in errors. Without ``module``, a module raises UnsupportedTensorError."""
    memo: dict[int, Any] = {}

    def go(x: Any, path: tuple[Any, ...], go: Callable[..., Any]) -> Any:
        # go gets itself as an argument: a closure over its own name would be a reference cycle
        # (go -> its cell -> go) keeping the memo, and every result in it, alive until a garbage
        # collection (md.to_host's pinned buffers then could not go back to CuPy's pool: a fresh
        # ~50 ms cudaHostAlloc for every 64 MiB copy on an H200).
        if len(path) > MAX_DEPTH:
            raise InvalidArgumentError(f"{what}: the structure is nested deeper than {MAX_DEPTH} levels at "
                                       f"{_path(path[:8])}...; is it circular?")
        if x is None:
            return None
        hit = memo.get(id(x))
        if hit is not None:
            return hit[1]
        if is_leaf is not None and is_leaf(x):
            y = leaf(x)
            memo[id(x)] = (x, y)
            return y
        try:
            backend_of(x)
        except UnsupportedTensorError:
            pass
        else:
            y = leaf(x)
            memo[id(x)] = (x, y)  # x kept alive so its id stays unique during the call
            return y
        cls = type(x)
        if isinstance(x, list) and not _framework_node(x):
            items = [go(v, (*path, i), go) for i, v in enumerate(x)]
            return items if cls is list else _remade(cls, items)
        if isinstance(x, tuple) and not _framework_node(x):
            items = [go(v, (*path, i), go) for i, v in enumerate(x)]
            return cls(*items) if _is_namedtuple(x) else (tuple(items) if cls is tuple else cls(items))
        if isinstance(x, dict) and not _framework_node(x):
            out = {k: go(v, (*path, k), go) for k, v in x.items()}
            if cls is dict:
                return out
            try:  # OrderedDict, defaultdict (its factory kept), other dict subclasses
                new = copy.copy(x)
                new.clear()
                new.update(out)
                return new
            except (TypeError, AttributeError):
                return out
        owner = structure_owner(x)
        if owner is not None:
            b, kind = owner
            if kind == "tree":
                children, rebuild = b.flatten_tree(x)  # type: ignore[attr-defined]
                return rebuild([go(c, (*path, i), go) if (is_leaf is not None and is_leaf(c)) or _holds_tensors(c)
                                else c for i, c in enumerate(children)])
            if module is None:
                raise UnsupportedTensorError(f"{what}: {_path(path)} is a {b.name} model "
                                             f"({cls.__module__}.{cls.__qualname__}), which {what} does not take; "
                                             "pass its tensors (a dict of its parameters and buffers)")
            return module(b, x)
        raise UnsupportedTensorError(f"{what}: {_path(path)} is a {cls.__module__}.{cls.__qualname__}, not a tensor "
                                     "or a structure of tensors (lists, tuples, named tuples, dicts, a framework's "
                                     "trees and models)")

    if obj is None:
        raise UnsupportedTensorError(f"{what}: got None, not a tensor or a structure of tensors")
    return go(obj, (), go)


def _holds_tensors(x: Any) -> bool:
    """Whether a framework tree's child is a tensor or a structure (else it is kept as it is: the
    static parts of a model, such as an equinox module's activation function or a Python number)."""
    return x is not None and (isinstance(x, (list, tuple, dict)) or is_structure(x) or _is_tensor(x))


def _is_tensor(x: Any) -> bool:
    try:
        backend_of(x)
        return True
    except UnsupportedTensorError:
        return False


def _framework_node(x: Any) -> bool:
    """A list, tuple or dict subclass that a framework registers as a tree node of its own (a flax
    FrozenDict, say) is rebuilt by that framework, not here."""
    if type(x) in (list, tuple, dict) or _is_namedtuple(x):
        return False
    owner = structure_owner(x)
    return owner is not None and owner[1] == "tree"


def leaves(obj: Any, what: str) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """``(path, tensor)`` for every tensor of ``obj`` (modules give every tensor they hold), each
    object once, in order. UnsupportedTensorError for a leaf that is no tensor."""
    found: list[tuple[tuple[Any, ...], Any]] = []
    seen: set[int] = set()

    def add(path: tuple[Any, ...], x: Any) -> None:
        if id(x) not in seen:
            seen.add(id(x))
            found.append((path, x))

    def go(x: Any, path: tuple[Any, ...], go: Callable[..., None]) -> None:  # itself: see tree_map
        if len(path) > MAX_DEPTH:
            raise InvalidArgumentError(f"{what}: the structure is nested deeper than {MAX_DEPTH} levels")
        if x is None:
            return
        try:
            backend_of(x)
        except UnsupportedTensorError:
            pass
        else:
            add(path, x)
            return
        if isinstance(x, (list, tuple)) and not _framework_node(x):
            for i, v in enumerate(x):
                go(v, (*path, i), go)
            return
        if isinstance(x, dict) and not _framework_node(x):
            for k, v in x.items():
                go(v, (*path, k), go)
            return
        owner = structure_owner(x)
        if owner is not None:
            b, kind = owner
            if kind == "tree":
                children, _ = b.flatten_tree(x)  # type: ignore[attr-defined]
                for i, c in enumerate(children):
                    if _holds_tensors(c):
                        go(c, (*path, i), go)
            else:
                for i, t in enumerate(b.module_tensors(x)):  # type: ignore[attr-defined]
                    add((*path, f"<{b.name} tensor {i}>"), t)
            return
        raise UnsupportedTensorError(f"{what}: {_path(path)} is a {type(x).__module__}.{type(x).__qualname__}, not a "
                                     "tensor or a structure of tensors")

    if obj is None:
        raise UnsupportedTensorError(f"{what}: got None, not a tensor or a structure of tensors")
    go(obj, (), go)
    return iter(found)
