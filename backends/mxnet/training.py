"""Training for MXNet (:class:`~multidev.adapter.SupportsTraining`): ``attach_grad``,
``autograd.record``, in-place SGD."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from multidev.adapter import Concern, SupportsTraining

from .core import MxnetCore


class MxnetTraining(Concern, SupportsTraining):
    """A replica of an array with a gradient buffer gets its own; gradients by ``autograd.record``
    on private copies; SGD in place."""

    core: MxnetCore

    def parameter_like(self, src: Any, y: Any) -> Any:
        if src.grad is not None:  # D2L's attach_grad: the replica gets its own gradient buffer
            y.attach_grad()
        return y

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        ps = [p.copy() for p in params]  # private copies with fresh (zero) buffers: params' .grad untouched
        for q in ps:
            q.attach_grad()
        with self.core.mx.autograd.record():
            out = fn(ps, *args)
        out.backward()  # the gradient of out's sum
        return out.sum(), [q.grad for q in ps]

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        for p, g in zip(params, grads):
            p -= lr * g  # in place: the array keeps its gradient buffer
        return list(params)
