"""Training for JAX (:class:`~multidev.adapter.SupportsTraining` through
:class:`~multidev.adapter.TrainingDefaults`): ``jax.value_and_grad``, jitted once per loss function."""
from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

from multidev.adapter import TrainingDefaults


class JaxTraining(TrainingDefaults):
    """Gradients by ``jax.value_and_grad`` (jitted, op by op where the loss has data-dependent Python
    control flow); parameters and SGD are the shared defaults (arrays carry no autograd state)."""

    _jax: Any
    _jnp: Any
    _grad_fns: weakref.WeakKeyDictionary

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        jax = self._jax
        vg = self._grad_fns.get(fn) if _weakrefable(fn) else None
        if vg is None:
            # The cached function holds fn weakly, so the cache entry goes when fn does.
            ref: Callable[[], Any] = weakref.ref(fn) if _weakrefable(fn) else (lambda: fn)
            vg = jax.value_and_grad(lambda ps, *a: self._jnp.sum(ref()(list(ps), *a)))
            try:
                jitted = jax.jit(vg)
                value, grads = jitted(list(params), *args)  # runs where its committed inputs live
            except jax.errors.ConcretizationTypeError:
                jitted = vg  # data-dependent Python control flow: differentiate op by op
                value, grads = vg(list(params), *args)
            if _weakrefable(fn):
                self._grad_fns[fn] = jitted
            return value, list(grads)
        value, grads = vg(list(params), *args)
        return value, list(grads)


def _weakrefable(fn: Any) -> bool:
    try:
        weakref.ref(fn)
    except TypeError:
        return False
    return True
