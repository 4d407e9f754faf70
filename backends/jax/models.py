"""Trees for JAX (:class:`~multidev.adapter.SupportsModels`): every pytree node JAX knows beyond
Python's own containers (flax structs and ``FrozenDict``, equinox modules, classes registered with
``jax.tree_util``) is a ``"tree"``, rebuilt from new leaves with its own ``treedef``, one level at a
time (the core maps the call over the children). JAX arrays are immutable, so a "moved" model is a
new tree of moved arrays (resident leaves kept as the same objects); its leaves that are no arrays
(an equinox module's activation function, a Python number) are kept as they are. JAX has no models
that move in place.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from multidev.adapter import CapabilityError, Device, SupportsModels


class JaxModels(SupportsModels):
    """Registered pytree nodes as ``"tree"``s."""

    _jax: Any

    def model_kind(self, obj: Any) -> str | None:
        if obj is None or isinstance(obj, (str, bytes, int, float, complex)):
            return None  # scalars and strings are leaves, None an empty subtree: the core's
        if isinstance(obj, (list, tuple, dict)) and (
                type(obj).__module__ in ("builtins", "collections") or hasattr(type(obj), "_fields")):
            return None  # Python's containers (named tuples, OrderedDict, defaultdict too) are the core's
        tu = self._jax.tree_util
        try:
            children, treedef = tu.tree_flatten(obj, is_leaf=lambda x: x is not obj)
        except Exception:  # noqa: BLE001 - a node whose flatten raises is none of ours to take apart
            return None
        if treedef.num_nodes == 1 and treedef.num_leaves == 1 and len(children) == 1 and children[0] is obj:
            return None  # a leaf: not a node JAX knows
        return "tree"

    def flatten_tree(self, obj: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
        tu = self._jax.tree_util
        children, treedef = tu.tree_flatten(obj, is_leaf=lambda x: x is not obj)
        return list(children), lambda new: tu.tree_unflatten(treedef, new)

    def module_tensors(self, obj: Any) -> list[Any]:
        raise CapabilityError("jax backend: JAX has no models that move in place, only trees")

    def move_module(self, obj: Any, device: Device) -> Any:
        raise CapabilityError("jax backend: JAX has no models that move in place, only trees")

    def copy_module(self, obj: Any, device: Device) -> Any:
        raise CapabilityError("jax backend: JAX has no models that move in place, only trees")
