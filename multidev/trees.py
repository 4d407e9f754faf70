"""Whole structures of tensors: nested lists, tuples, named tuples and dicts (written here), the
frameworks' own trees (JAX pytree nodes) and models (torch ``nn.Module``, Gluon ``Block``, Keras
models) through their adapters' :class:`~multidev.protocol.SupportsModels`.

:func:`tree_map` applies a tensor call to every tensor leaf and rebuilds the structure: a list
stays a list, a named tuple the same named tuple, a dict the same dict type with its keys in order,
a framework tree the framework's own node. The rule for leaves that are no tensor (the one rule of
every structure call, docs/transfers.md#structures): ``None`` is an empty subtree everywhere and stays
``None``; inside a framework's tree (at any depth, its nested lists and dicts included) the framework
decides: a value its own transfer turns into an array (:meth:`tree_scalar`: JAX's Python and NumPy
scalars) goes to the caller's ``scalar`` function (``to`` and ``copy`` put it as the framework does;
without one it is kept), any other (a model's activation function, a string) is kept as it is;
outside every framework tree a leaf that is no tensor raises UnsupportedTensorError naming its path
(``[1]['w']``): no framework owns it, so nothing can say what it should become. The same tensor
object reached twice (tied weights) gives the same result object twice. A ``"module"`` (moved in
place) is handed to the caller's ``module`` function as a whole.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from .errors import InvalidArgumentError, MultidevError, UnsupportedTensorError
from .protocol import Backend, SupportsModels
from .registry import (
    backend_of,
    cached_owner,
    get_backend,
    loaded_backends,
    preferred_backends,
    registry_generation,
    require,
    tie_cache,
    tied_put,
)
from .sharding import ShardedTensor

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
        models = b.models
        if models is not None:
            kind = models.model_kind(obj)
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
    structure (see :func:`is_structure`; one lookup for a framework's structure class seen before);
    UnsupportedTensorError for anything else. The one dispatch of the calls that take a tensor or a
    structure."""
    cls = type(x)
    b = cached_owner(cls)
    if b is not None:
        return b
    if cls in _FRAMEWORK_STRUCTURES:
        return None
    generation = registry_generation()
    try:
        return backend_of(x)
    except UnsupportedTensorError:
        if isinstance(x, (list, tuple, dict)):
            return None
        owner = structure_owner(x)
        if owner is None:
            raise
        # (its framework decides by class: isinstance, pytree nodes)
        tied_put(_FRAMEWORK_STRUCTURES, cls, owner[0] if owner[1] == "module" else None, generation, 4096)
        return None


def model_owner(x: Any) -> Backend | None:
    """The adapter whose framework's model ``x`` is, where :func:`owner_or_structure` has seen its
    class before (else None: ask :func:`structure_owner`)."""
    return _FRAMEWORK_STRUCTURES.get(type(x))


#: The classes of frameworks' structures seen by :func:`owner_or_structure`, with the adapter for a
#: model class (None for a tree class). Cleared when the registry changes (an adapter loaded may
#: take a class as its tensors).
_FRAMEWORK_STRUCTURES: dict[type, Backend | None] = tie_cache({})


def _path(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p!r}]" for p in path) or "(the argument itself)"


def _remade(cls: type, items: list[Any]) -> Any:
    """A list subclass rebuilt from its new items (a plain list where its constructor refuses)."""
    try:
        return cls(items)
    except TypeError:
        return items


def _same_items(y: Any, items: list[Any]) -> bool:
    try:
        return type(y) is not None and len(y) == len(items) and all(a is b for a, b in zip(y, items))
    except Exception:  # noqa: BLE001 - a constructor that makes something else: not a rebuild
        return False


def _tuple_maker(x: tuple, path: tuple[Any, ...], what: str) -> Callable[[list[Any]], Any]:
    """How to rebuild tuple ``x`` (a plain tuple, a named tuple or another tuple subclass) from new
    items, found before anything is moved: a subclass is rebuilt with ``cls(items)`` or
    ``cls(*items)``, whichever gives back ``x``'s own items when given them; one that takes neither
    is refused (UnsupportedTensorError naming its path), so a call never fails half-way on it."""
    cls = type(x)
    if cls is tuple:
        return tuple
    if _is_namedtuple(x):
        return lambda items: cls(*items)
    old = list(x)
    for make in (lambda items: cls(items), lambda items: cls(*items)):
        try:
            probe = make(old)
        except Exception:  # noqa: BLE001 - this spelling of the constructor does not fit
            continue
        if type(probe) is cls and _same_items(probe, old):
            return make
    raise UnsupportedTensorError(
        f"{what}: {_path(path)} is a {cls.__module__}.{cls.__qualname__}, a tuple subclass whose constructor "
        "rebuilds it neither from a list of its items nor from the items as arguments; pass a tuple or a list "
        "(nothing was moved)")


# The nodes of a flattened structure (see tree_map): (kind, payload, first child, child count).
_NONE, _LEAF, _MODULE, _LIST, _TUPLE, _DICT, _TREE, _SCALAR, _KEPT = range(9)
_NO_TREE = (_NONE, _LEAF, _MODULE, _SCALAR, _KEPT)


def _tree_scalar(b: Backend | None, x: Any) -> bool:
    """Whether ``x`` (no tensor, inside a tree of ``b``'s framework) is a value that framework's own
    transfer makes an array of (the optional ``SupportsModels.tree_scalar``)."""
    fn = getattr(getattr(b, "models", None), "tree_scalar", None)
    return fn is not None and bool(fn(x))


def tree_map(leaf: Callable[[Any], Any], obj: Any, what: str, *,
             module: Callable[[Backend, Any], Any] | None = None,
             is_leaf: Callable[[Any], bool] | None = None,
             check: Callable[[Backend], Any] | None = None,
             scalar: Callable[[Backend, Any], Any] | None = None,
             batch: Callable[[list[Any]], list[Any]] | None = None) -> Any:
    """``obj`` with ``leaf(x)`` for every tensor ``x`` (or every object ``is_leaf`` accepts),
    ``module(b, m)`` for every framework module ``m`` (owned by adapter ``b``) and ``scalar(b, v)`` for
    every scalar ``v`` of a tree of ``b``'s framework (kept as it is without ``scalar``); the structure
    rebuilt. ``what`` names the call in errors. Without ``module``, a module raises UnsupportedTensorError.
    ``batch``: called once with the structure's distinct tensors (in order) in place of ``leaf``, it
    gives their results as a list of as many, in the same order (a framework's one call for many).

    All or nothing where it can be: the whole structure is walked first (every leaf recognised,
    every container's rebuild found, ``check(b)`` called once for each adapter owning a tensor or a
    module, say to resolve the target device), so a bad leaf anywhere raises before ``leaf`` or
    ``module`` ran on anything; then every tensor leaf, then the modules (moved in place: last, so a
    failing tensor leaves every model as it was). A module call that fails after others succeeded
    says which were changed (a note on the error). The walk is iterative: neither a deep structure
    nor a deep caller leaks RecursionError."""
    if obj is None:
        raise UnsupportedTensorError(f"{what}: got None, not a tensor or a structure of tensors")
    cls = type(obj)
    if (cls is list or cls is tuple or cls is dict) and is_leaf is None:
        plain = _flat_map(leaf, obj, cls, check, batch, what)
        if plain is _NESTED:
            plain = _plain_map(leaf, obj, check, batch, what)
        if plain is not _NOT_FLAT:
            return plain
    # -- 1. flatten: nodes in pre-order (a node's children follow it), nothing called yet ------------
    kinds: list[int] = []
    payload: list[Any] = []
    children: list[list[int]] = []
    owners: dict[int, Backend] = {}
    # (x, path, parent, slot, the adapter whose tree x is inside)
    stack: list[tuple[Any, tuple[Any, ...], int, int, Backend | None]] = [(obj, (), -1, 0, None)]
    while stack:
        x, path, parent, slot, inside = stack.pop()
        i = len(kinds)
        if parent >= 0:
            children[parent][slot] = i
        kids: list[Any] = []
        if len(path) > MAX_DEPTH:
            raise InvalidArgumentError(f"{what}: the structure is nested deeper than {MAX_DEPTH} levels at "
                                       f"{_path(path[:8])}...; is it circular?")
        kind, data = _classify(x, path, what, module is not None, is_leaf, kids, owners, inside,
                               scalar is not None)
        kinds.append(kind)
        payload.append(data)
        children.append([-1] * len(kids))
        for s in range(len(kids) - 1, -1, -1):  # pushed in reverse: popped (numbered) in order
            c, cpath, cin = kids[s]
            stack.append((c, cpath, i, s, cin))
    if check is not None:
        for b in {id(b): b for b in owners.values()}.values():
            check(b)
    # -- 2. the calls: tensors first, then the models (moved in place) -------------------------------
    out: list[Any] = [None] * len(kinds)
    memo: dict[int, Any] = {}
    for i, k in enumerate(kinds):
        if k == _LEAF:
            x = payload[i]
            hit = memo.get(id(x))
            if batch is not None:  # (its result: filled in after the one call)
                if hit is None:
                    memo[id(x)] = (x, len(memo))
                continue
            if hit is None:
                hit = memo[id(x)] = (x, leaf(x))  # x kept alive so its id stays unique during the call
            out[i] = hit[1]
        elif k == _SCALAR:
            out[i] = scalar(*payload[i])  # type: ignore[misc]
        elif k == _KEPT:
            out[i] = payload[i]
    if batch is not None and memo:
        xs = [x for x, _ in memo.values()]
        ys = batch(xs)
        if len(ys) != len(xs):
            raise RuntimeError(f"{what}: the batched call gave {len(ys)} results for {len(xs)} tensors")
        for i, k in enumerate(kinds):
            if k == _LEAF:
                out[i] = ys[memo[id(payload[i])][1]]
    done: list[str] = []
    for i, k in enumerate(kinds):
        if k == _MODULE:
            b, m, path = payload[i]
            hit = memo.get(id(m))
            if hit is None:
                try:
                    hit = memo[id(m)] = (m, module(b, m))  # type: ignore[misc]
                except BaseException as e:
                    if done and hasattr(e, "add_note"):
                        e.add_note(f"{what}: the models at {', '.join(done)} were already changed in place; the "
                                   f"one at {_path(path)} and those after it were not")
                    raise
                done.append(_path(path))
            out[i] = hit[1]
    # -- 3. rebuild, children before parents ---------------------------------------------------------
    for i in range(len(kinds) - 1, -1, -1):
        k = kinds[i]
        if k in _NO_TREE:
            continue
        items = [out[c] for c in children[i]]
        data = payload[i]
        if k == _LIST:
            out[i] = items if data is list else _remade(data, items)
        elif k == _TUPLE:
            out[i] = data(items)
        elif k == _DICT:
            x, keys = data
            d = dict(zip(keys, items))
            if type(x) is dict:
                out[i] = d
            else:
                try:  # OrderedDict, defaultdict (its factory kept), other dict subclasses
                    new = copy.copy(x)
                    new.clear()
                    new.update(d)
                    out[i] = new
                except (TypeError, AttributeError):
                    out[i] = d
        else:  # _TREE
            out[i] = data(items)
    return out[0]


_NOT_FLAT: Any = object()
_NESTED: Any = object()


def _flat_map(leaf: Callable[[Any], Any], obj: Any, cls: type, check: Callable[[Backend], Any] | None,
              batch: Callable[[list[Any]], list[Any]] | None, what: str) -> Any:
    """:func:`tree_map` of a plain list, tuple or dict (not empty, at most :data:`RESIDENT_MAX` items)
    whose items are all tensors of classes seen before (``cached_owner``), without the walk: what
    the walk gives for it (each item a leaf, ``check`` per adapter first, the container rebuilt);
    :data:`_NESTED` where an item is one of Python's own containers (:func:`_plain_map` takes it),
    :data:`_NOT_FLAT` for anything else (the walk takes it)."""
    if cls is dict:
        keys = list(obj)  # (read once: the rebuilt dict pairs each key with its own value's result)
        items = [obj[k] for k in keys]
    else:
        items = obj if cls is tuple else list(obj)  # (a list read once, as the walk reads it)
    if not items or len(items) > RESIDENT_MAX:
        return _NOT_FLAT
    owners: dict[int, Backend] = {}
    for t in items:
        c = type(t)
        b = cached_owner(c)
        if b is None or c is ShardedTensor:
            return _NESTED if c is dict or c is list or c is tuple else _NOT_FLAT
        owners[id(b)] = b
    res = _leaf_results(leaf, items, owners, check, batch, what)
    if cls is list:
        return res
    if cls is tuple:
        return tuple(res)
    return dict(zip(keys, res))


def _leaf_results(leaf: Callable[[Any], Any], found: list[Any], owners: dict[int, Backend],
                  check: Callable[[Backend], Any] | None, batch: Callable[[list[Any]], list[Any]] | None,
                  what: str) -> list[Any]:
    """The fast paths' calls: each of ``found`` (tensors in order) deduplicated, then :func:`_calls`;
    one result per item of ``found``."""
    if len(set(map(id, found))) == len(found):  # no tensor twice (the common case): no index kept
        return _calls(leaf, found, owners, check, batch, what)
    at: dict[int, int] = {}
    xs: list[Any] = []
    for t in found:
        if id(t) not in at:
            at[id(t)] = len(xs)
            xs.append(t)
    ys = _calls(leaf, xs, owners, check, batch, what)
    return [ys[at[id(t)]] for t in found]


def _calls(leaf: Callable[[Any], Any], xs: list[Any], owners: dict[int, Backend],
           check: Callable[[Backend], Any] | None, batch: Callable[[list[Any]], list[Any]] | None,
           what: str) -> list[Any]:
    """The fast paths' calls: ``check`` once per adapter of ``owners``, then the result of each of
    ``xs`` (distinct tensors, in pre-order): ``leaf`` once each, in order, or ``batch`` once with them
    all."""
    if check is not None:
        for b in owners.values():
            check(b)
    if batch is None:
        return [leaf(t) for t in xs]
    ys = batch(xs)
    if len(ys) != len(xs):
        raise RuntimeError(f"{what}: the batched call gave {len(ys)} results for {len(xs)} tensors")
    return ys


def _plain_map(leaf: Callable[[Any], Any], obj: Any, check: Callable[[Backend], Any] | None,
               batch: Callable[[list[Any]], list[Any]] | None, what: str) -> Any:
    """:func:`tree_map` of Python's own lists, tuples and dicts, nested (at most :data:`RESIDENT_MAX`
    nodes), whose leaves are all tensors of classes seen before (``cached_owner``), without the walk's
    bookkeeping (paths, node tables): what the walk gives for it (``check`` per adapter first, each
    distinct tensor once in pre-order, a tied tensor one object, every container rebuilt as its own
    type); :data:`_NOT_FLAT` for anything else (the walk takes it, and names what it refuses). Each
    container is read once."""
    walked = plain_walk(obj)
    if walked is None:
        return _NOT_FLAT
    shape, found = walked
    owners: dict[int, Backend] = {}
    for c in dict.fromkeys(map(type, found)):  # (in the order first met: which adapter's check raises first)
        b = cached_owner(c)
        if b is None or c is ShardedTensor:
            return _NOT_FLAT
        owners[id(b)] = b
    return plain_rebuild(shape, _leaf_results(leaf, found, owners, check, batch, what))


def plain_walk(obj: Any) -> tuple[list[Any], list[Any]] | None:
    """``(shape, tensors)`` of Python's own lists, tuples and dicts nested in ``obj`` (one of them; at most
    :data:`RESIDENT_MAX` nodes, :data:`MAX_DEPTH` levels): ``shape`` a container's ``(type, item
    count, a dict's keys)`` or None for anything else (a leaf), in pre-order; ``tensors`` the leaves
    in pre-order (a tied one as often as it occurs), not yet told apart from other objects. None
    where there is no leaf, or the structure is too large or too deep (:func:`tree_map`'s walk
    takes it, and names what it refuses). Each container is read once."""
    shape: list[Any] = []
    found: list[Any] = []
    try:  # (recursion: a third less Python a node than the stack below, for the common shallow structure)
        _walk_into(obj, shape, found, 0)
    except (_Deep, RecursionError):  # deeper than _SHALLOW levels (or a deep caller): the stack's walk
        shape, found = [], []
    else:
        return (shape, found) if found and len(shape) <= RESIDENT_MAX else None
    containers = 0
    stack = [obj]
    while stack:
        x = stack.pop()
        cls = type(x)
        if cls is dict or cls is list or cls is tuple:
            if cls is dict:
                keys = list(x)
                vals = [x[k] for k in keys]
            else:
                keys, vals = None, list(x)
            shape.append((cls, len(vals), keys))
            stack.extend(reversed(vals))
            containers += 1
            if len(shape) + len(stack) > RESIDENT_MAX:  # (the nodes read and to read; a circular structure ends
                return None  # here too: the walk names it)
        else:
            found.append(x)
            shape.append(None)
    # (the walk's depth limit, MAX_DEPTH: read from the shape once the structure has more containers)
    if not found or (containers > MAX_DEPTH and _deeper_than_the_limit(shape)):
        return None
    return shape, found


#: The levels :func:`plain_walk` walks by recursion; a deeper structure is walked by its stack.
_SHALLOW = 32


class _Deep(Exception):
    pass


def _walk_into(x: Any, shape: list[Any], found: list[Any], depth: int) -> None:
    """:func:`plain_walk` of container ``x`` (a dict, list or tuple), ``depth`` levels down, by recursion;
    raises :class:`_Deep` past :data:`_SHALLOW` levels or :data:`RESIDENT_MAX` nodes."""
    cls = type(x)
    if cls is dict:
        keys = list(x)
        vals = [x[k] for k in keys]
    else:
        keys, vals = None, list(x)
    if depth >= _SHALLOW or len(shape) + len(vals) >= RESIDENT_MAX:
        raise _Deep
    shape.append((cls, len(vals), keys))
    for v in vals:
        c = type(v)
        if c is dict or c is list or c is tuple:
            _walk_into(v, shape, found, depth + 1)
        else:
            found.append(v)
            shape.append(None)


def plain_rebuild(shape: list[Any], res: list[Any]) -> Any:
    """The structure :func:`plain_walk` read as ``shape``, rebuilt with ``res`` (one result per
    leaf, in its order) in place of its leaves: every container a new one of its own type."""
    # children before parents: a container's items are the top of the stack, first item on top
    built: list[Any] = []
    i = len(res)
    for node in reversed(shape):
        if node is None:
            i -= 1
            built.append(res[i])
            continue
        cls, n, keys = node
        items = built[len(built) - n:][::-1] if n else []
        del built[len(built) - n:]
        built.append(items if cls is list else tuple(items) if cls is tuple else dict(zip(keys, items)))
    return built[0]


def _deeper_than_the_limit(shape: list[Any]) -> bool:
    """Whether a container of ``shape`` (:func:`_plain_map`'s nodes in pre-order) lies MAX_DEPTH levels
    down or deeper, where the walk refuses the structure. (Read only for a structure of more than
    MAX_DEPTH containers: no smaller one is so deep.)"""
    pending: list[int] = []  # the children still to come of each open container, innermost last
    for node in shape:
        if pending:
            pending[-1] -= 1
        if node is not None:
            if len(pending) >= MAX_DEPTH:
                return True
            pending.append(node[1])
        while pending and pending[-1] == 0:
            pending.pop()
    return False


def _classify(x: Any, path: tuple[Any, ...], what: str, modules: bool, is_leaf: Callable[[Any], bool] | None,
              kids: list[Any], owners: dict[int, Backend], inside: Backend | None,
              scalars: bool) -> tuple[int, Any]:
    """One node of :func:`tree_map`'s walk: its kind and payload; its children appended to ``kids``
    as ``(child, path, the adapter whose tree it is inside)``. Raises for what the call cannot take
    (nothing has been called yet)."""
    if x is None:
        return _NONE, None
    if is_leaf is not None and is_leaf(x):
        return _LEAF, x
    if x.__class__ is ShardedTensor:  # multidev's own sharded tensor: a leaf of its pieces' adapter
        b = get_backend(x.backend)
        owners[id(b)] = b
        return _LEAF, x
    cls = type(x)
    if cls is not dict and cls is not list and cls is not tuple:  # (Python's own containers are no tensors)
        try:
            b = backend_of(x)
        except UnsupportedTensorError:
            pass
        else:
            owners[id(b)] = b
            return _LEAF, x
    if isinstance(x, list) and not _framework_node(x):
        kids.extend((v, (*path, i), inside) for i, v in enumerate(x))
        return _LIST, cls
    if isinstance(x, tuple) and not _framework_node(x):
        make = _tuple_maker(x, path, what)
        kids.extend((v, (*path, i), inside) for i, v in enumerate(x))
        return _TUPLE, make
    if isinstance(x, dict) and not _framework_node(x):
        keys = list(x.keys())
        kids.extend((x[k], (*path, k), inside) for k in keys)
        return _DICT, (x, keys)
    owner = structure_owner(x)
    if owner is not None:
        b, kind = owner
        if kind == "tree":
            parts, rebuild = require(b, SupportsModels, "a tree").flatten_tree(x)
            kids.extend((c, (*path, i), b) for i, c in enumerate(parts))
            return _TREE, rebuild
        if not modules:
            raise UnsupportedTensorError(f"{what}: {_path(path)} is a {b.name} model "
                                         f"({cls.__module__}.{cls.__qualname__}), which {what} does not take; "
                                         "pass its tensors (a dict of its parameters and buffers)")
        owners[id(b)] = b
        return _MODULE, (b, x, path)
    if inside is not None:  # a framework tree's leaf that is no tensor: the framework's rule
        if scalars and _tree_scalar(inside, x):
            owners[id(inside)] = inside  # (its device is resolved as a tensor's would be)
            return _SCALAR, (inside, x)
        return _KEPT, x  # a static part (an activation function, a string): kept as it is
    raise UnsupportedTensorError(f"{what}: {_path(path)} is a {cls.__module__}.{cls.__qualname__}, not a tensor "
                                 "or a structure of tensors (lists, tuples, named tuples, dicts, a framework's "
                                 "trees and models); outside a framework's tree no framework says what it should "
                                 "become: make it a tensor (md.asarray) or leave it out (None is kept)")


def _framework_node(x: Any) -> bool:
    """A list, tuple or dict subclass that a framework registers as a tree node of its own (a flax
    FrozenDict, say) is rebuilt by that framework, not here."""
    if type(x) in (list, tuple, dict) or _is_namedtuple(x):
        return False
    owner = structure_owner(x)
    return owner is not None and owner[1] == "tree"


def leaves(obj: Any, what: str) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """``(path, tensor)`` for every tensor of ``obj`` (modules give every tensor they hold), each
    object once, in order. UnsupportedTensorError for a leaf that is no tensor outside every
    framework tree (inside one, such a leaf is skipped: see the module's rule)."""
    found: list[tuple[tuple[Any, ...], Any]] = []
    seen: set[int] = set()

    def add(path: tuple[Any, ...], x: Any) -> None:
        if id(x) not in seen:
            seen.add(id(x))
            found.append((path, x))

    if obj is None:
        raise UnsupportedTensorError(f"{what}: got None, not a tensor or a structure of tensors")
    # (x, path, whether x is inside a framework tree); iterative: no RecursionError from deep callers
    stack: list[tuple[Any, tuple[Any, ...], bool]] = [(obj, (), False)]
    while stack:
        x, path, inside = stack.pop()
        if len(path) > MAX_DEPTH:
            raise InvalidArgumentError(f"{what}: the structure is nested deeper than {MAX_DEPTH} levels")
        if x is None:
            continue
        if x.__class__ is ShardedTensor:  # a leaf, as a tensor is
            add(path, x)
            continue
        try:
            backend_of(x)
        except UnsupportedTensorError:
            pass
        else:
            add(path, x)
            continue
        kids: list[tuple[Any, tuple[Any, ...], bool]] = []
        if isinstance(x, (list, tuple)) and not _framework_node(x):
            kids = [(v, (*path, i), inside) for i, v in enumerate(x)]
        elif isinstance(x, dict) and not _framework_node(x):
            kids = [(v, (*path, k), inside) for k, v in x.items()]
        else:
            owner = structure_owner(x)
            if owner is None:
                if inside:
                    continue  # a framework tree's leaf that is no tensor (a scalar, a function): no tensor
                raise UnsupportedTensorError(f"{what}: {_path(path)} is a {type(x).__module__}."
                                             f"{type(x).__qualname__}, not a tensor or a structure of tensors")
            b, kind = owner
            if kind == "tree":
                parts, _ = require(b, SupportsModels, "a tree").flatten_tree(x)
                kids = [(c, (*path, i), True) for i, c in enumerate(parts)]
            else:
                for i, t in enumerate(require(b, SupportsModels, "a model").module_tensors(x)):
                    add((*path, f"<{b.name} tensor {i}>"), t)
        stack.extend(reversed(kids))  # popped in order: the tensors come in the structure's order
    return iter(found)


#: The most items :func:`resident_container` looks at: larger containers take tree_map's route.
RESIDENT_MAX = 1 << 16


def resident_container(x: Any, device: Any) -> bool:
    """Whether ``x`` is a plain ``tuple``, ``list`` or ``dict`` of at most :data:`RESIDENT_MAX`
    tensors (a dict: values) of classes seen before (``cached_owner``), every one already on
    ``device`` (an interned Device) as ``to`` gives it (``commit_resident``): then ``to(x, device)``
    moves nothing, and the structure's walk
    (validation, flattening, rebuilding) can be skipped. False for anything else (nested, a model, a
    subclass, a stranger), which then takes :func:`tree_map`'s route."""
    cls = x.__class__
    if cls is dict:
        items = x.values()
    elif cls is tuple or cls is list:
        items = x
    else:
        return False
    if not x or len(x) > RESIDENT_MAX:
        return False
    for t in items:
        b = cached_owner(t.__class__)
        if b is None:
            return False
        try:
            if b.device_of(t) is not device:
                return False
        except MultidevError:  # no single device (a framework's sharded array): tree_map's route
            return False
        commit = getattr(b, "commit_resident", None)
        if commit is not None and commit(t) is not t:  # (JAX: an uncommitted array is committed by to)
            return False
    return True
