"""Training for TensorFlow (:class:`~multidev.adapter.SupportsTraining`): ``tf.Variable`` parameters,
``tf.GradientTape``, ``assign_sub``."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from multidev.adapter import Concern, SupportsTraining

from ._common import SILENT
from .core import TensorflowCore


class TensorflowTraining(Concern, SupportsTraining):
    """A Variable's replica is a Variable; gradients by ``tf.GradientTape`` in the parameters' device
    scope; SGD in place on Variables (``assign_sub``), out of place on Tensors."""

    core: TensorflowCore

    def parameter_like(self, src: Any, y: Any) -> Any:
        tf = self.core.tf
        if isinstance(src, tf.Variable) and not isinstance(y, tf.Variable):
            return self.core._new_variable(src, self.core.device_of(y), y)
        return y  # move and copy keep Variables Variables already

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        tf = self.core.tf
        ps = list(params)
        dev = self.core.same_device("value_and_grad", ps, SILENT)
        with tf.device(self.core.to_native_device(dev)):  # eager TF would run the ops on its default device
            with tf.GradientTape() as tape:
                tape.watch(ps)
                total = tf.reduce_sum(fn(ps, *args))
            gs = tape.gradient(total, ps)
            grads = [tf.zeros_like(self.core._read(p)) if g is None else tf.convert_to_tensor(g)
                     for p, g in zip(ps, gs)]
        return total, [self.core._placed(g, dev, "value_and_grad") for g in grads]

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        tf = self.core.tf
        out = []
        for p, g in zip(params, grads):
            with tf.device(p.device):
                if isinstance(p, tf.Variable):
                    p.assign_sub(lr * g)  # in place: a Variable stays the same Variable
                    out.append(p)
                else:
                    out.append(p - lr * g)
        return out
