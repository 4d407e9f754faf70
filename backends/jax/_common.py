"""What several files of the JAX adapter share."""
from __future__ import annotations

from typing import Any

X64_DTYPES = frozenset({"int64", "uint64", "float64", "complex128"})


#: The 32-bit dtype JAX holds in place of each 64-bit one.
NARROW = {"int64": "int32", "uint64": "uint32", "float64": "float32", "complex128": "complex64"}


def x64_hint(dtype: str | None = None) -> str:
    """How to get ``dtype`` (a 64-bit dtype) onto JAX: 64-bit mode, or the 32-bit dtype asked for."""
    narrow = NARROW.get(dtype or "")
    also = (f", or ask for dtype={narrow!r} (a NumPy array is cast: md.asarray(a, dtype={narrow!r}, "
            "backend='jax'))") if narrow else ""
    return f"enable 64-bit types with jax.config.update('jax_enable_x64', True){also}"


class LossCache:
    """The jitted functions made for each loss function, by the loss function: a plain function, a
    bound method (a new object on every attribute read, equal to the last: a weak-keyed cache lost
    it at once and recompiled every step) or any hashable callable. At most ``size`` entries, the
    oldest dropped first (a loss made anew every step, e.g. a lambda, compiles every step anyway);
    an unhashable callable is not cached."""

    def __init__(self, size: int = 64) -> None:
        self._fns: dict[Any, Any] = {}
        self._size = size

    def get(self, key: Any) -> Any:
        try:
            return self._fns.get(key)
        except TypeError:
            return None

    def put(self, key: Any, fn: Any) -> Any:
        try:
            if len(self._fns) >= self._size:
                self._fns.pop(next(iter(self._fns)))
            self._fns[key] = fn
        except TypeError:
            pass
        return fn


def is_train_state(obj: Any) -> bool:
    """A flax ``TrainState``, or any object like it."""
    return all(hasattr(obj, a) for a in ("params", "opt_state", "tx", "apply_gradients", "replace"))


def trainable(jax: Any, model: Any, optimizer: Any, call: str) -> tuple[bool, Any] | None:
    """``(is a TrainState, its parameter tree)`` of a model data_parallel takes (a tree of
    ``jax.Array`` with an optax transformation, or a TrainState without one); None where ``model``
    is no JAX tree; InvalidArgumentError for an optimizer that does not fit (``call``: how to call
    it with a TrainState)."""
    from multidev.adapter import InvalidArgumentError

    state = is_train_state(model)
    params = model.params if state else model
    arrays = jax.tree_util.tree_leaves(params)
    if not arrays or not all(isinstance(a, jax.Array) for a in arrays):
        return None
    if state and optimizer is not None:
        raise InvalidArgumentError(f"data_parallel: a TrainState carries its own optimizer (its tx): pass {call}")
    if not state and not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
        raise InvalidArgumentError(f"data_parallel: JAX parameters train with an optax GradientTransformation "
                                   f"(init and update), got {type(optimizer).__name__}")
    return state, params


def refuse_uneven(layout: Any, shape: Any, hint: str = "") -> None:
    """CapabilityError where ``layout`` cuts a dimension of ``shape`` into pieces of several sizes
    (a ``NamedSharding`` places pieces of one size only)."""
    from multidev.adapter import CapabilityError

    odd = layout.uneven(shape)
    if odd:
        d, n, k = odd[0]
        raise CapabilityError(f"jax backend: a NamedSharding cuts a dimension into pieces of one size, but "
                              f"dimension {d} of shape {tuple(shape)} has {n} elements for {k} pieces "
                              f"(layout {layout.spec_text()}); pad it to a multiple of {k}{hint}")
