"""Training for JAX (:class:`~multidev.adapter.SupportsTraining` through
:class:`~multidev.adapter.TrainingDefaults`): ``jax.value_and_grad``, jitted once per loss function."""
from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

from multidev.adapter import TrainingDefaults

from .core import JaxCore


class JaxTraining(TrainingDefaults):
    """Gradients by ``jax.value_and_grad`` (jitted, op by op where the loss has data-dependent Python
    control flow); parameters are the shared default (arrays carry no autograd state); the SGD step
    ``p - lr * g`` for every parameter is one jitted call (out of place, each parameter's dtype and
    device kept), not one dispatch per array."""

    core: JaxCore

    def __init__(self, core: JaxCore) -> None:
        super().__init__(core)
        self._grad_fns: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loss fn -> jitted grad
        self._sgd_step: Any = None  # the jitted out-of-place SGD step, made on first use

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        step = self._sgd_step
        if step is None:
            jax = self.core.jax

            def update(ps: list[Any], gs: list[Any], lr: Any) -> list[Any]:
                return [p - lr * g for p, g in zip(ps, gs)]  # lr: a weakly typed scalar, p's dtype kept

            step = self._sgd_step = jax.jit(update)
        try:
            return list(step(list(params), list(grads), float(lr)))
        except ValueError:  # parameters on several devices: one jitted call cannot span them
            return super().sgd_update(params, grads, lr)

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        jax = self.core.jax
        vg = self._grad_fns.get(fn) if _weakrefable(fn) else None
        if vg is None:
            # The cached function holds fn weakly, so the cache entry goes when fn does.
            ref: Callable[[], Any] = weakref.ref(fn) if _weakrefable(fn) else (lambda: fn)
            vg = jax.value_and_grad(lambda ps, *a: self.core.jnp.sum(ref()(list(ps), *a)))
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
