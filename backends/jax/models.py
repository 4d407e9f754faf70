"""Trees for JAX (:class:`~multidev.adapter.SupportsModels`): every pytree node JAX knows beyond
Python's own containers (flax structs and ``FrozenDict``, equinox modules, classes registered with
``jax.tree_util``) is a ``"tree"``, rebuilt from new leaves with its own ``treedef``, one level at a
time (the core maps the call over the children). JAX arrays are immutable, so a "moved" model is a
new tree of moved arrays (committed resident leaves kept as the same objects, uncommitted ones
committed without a copy). Its leaves that are no arrays follow ``jax.device_put`` where it takes
them: ``to`` and ``copy`` turn a Python or NumPy scalar (a ``TrainState``'s ``step``) into an array on
the target (:meth:`JaxModels.tree_scalar`, :meth:`JaxModels.put_scalar`), so ``jit`` sees what it sees
after ``device_put``; the others (an equinox module's activation function, a string) are kept as they
are. JAX has no models that move in place.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from multidev.adapter import CapabilityError, Concern, Device, SupportsModels

from .core import JaxCore


class JaxModels(Concern, SupportsModels):
    """Registered pytree nodes as ``"tree"``s."""

    core: JaxCore

    def model_kind(self, obj: Any) -> str | None:
        if obj is None or isinstance(obj, (str, bytes, int, float, complex)):
            return None  # scalars and strings are leaves, None an empty subtree: the core's
        if isinstance(obj, (list, tuple, dict)) and (
                type(obj).__module__ in ("builtins", "collections") or hasattr(type(obj), "_fields")):
            return None  # Python's containers (named tuples, OrderedDict, defaultdict too) are the core's
        tu = self.core.jax.tree_util
        try:
            children, treedef = tu.tree_flatten(obj, is_leaf=lambda x: x is not obj)
        except Exception:  # noqa: BLE001 - a node whose flatten raises is none of ours to take apart
            return None
        if treedef.num_nodes == 1 and treedef.num_leaves == 1 and len(children) == 1 and children[0] is obj:
            return None  # a leaf: not a node JAX knows
        return "tree"

    def flatten_tree(self, obj: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
        tu = self.core.jax.tree_util
        children, treedef = tu.tree_flatten(obj, is_leaf=lambda x: x is not obj)
        return list(children), lambda new: tu.tree_unflatten(treedef, new)

    def tree_scalar(self, obj: Any) -> bool:
        """Whether ``obj``, a leaf of a JAX tree that is no tensor, is a value ``jax.device_put`` turns
        into an array: a Python or NumPy scalar (a flax ``TrainState``'s ``step`` is a Python int)."""
        return isinstance(obj, (bool, int, float, complex, np.number, np.bool_))

    def put_scalar(self, obj: Any, device: Device | None) -> Any:
        """Scalar ``obj`` as ``jax.device_put(obj, device)`` makes it: a weakly typed (Python scalars)
        array committed to ``device``; uncommitted on JAX's default device where ``device`` is None."""
        jax = self.core.jax
        return jax.device_put(obj) if device is None else jax.device_put(obj, self.core.to_native_device(device))

    def module_tensors(self, obj: Any) -> list[Any]:
        raise CapabilityError("jax backend: JAX has no models that move in place, only trees")

    def move_module(self, obj: Any, device: Device) -> Any:
        raise CapabilityError("jax backend: JAX has no models that move in place, only trees")

    def copy_module(self, obj: Any, device: Device) -> Any:
        raise CapabilityError("jax backend: JAX has no models that move in place, only trees")
