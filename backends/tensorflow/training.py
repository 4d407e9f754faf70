"""Training for TensorFlow (:class:`~multidev.adapter.SupportsTraining`): ``tf.Variable`` parameters,
``tf.GradientTape``, ``assign_sub``."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from multidev.adapter import Device, SupportsTraining

from ._common import SILENT


class TensorflowTraining(SupportsTraining):
    """A Variable's replica is a Variable; gradients by ``tf.GradientTape`` in the parameters' device
    scope; SGD in place on Variables (``assign_sub``), out of place on Tensors."""

    _tf: Any

    if TYPE_CHECKING:  # the core protocol (core.TensorflowCore)
        def to_native_device(self, device: Device) -> Any: ...
        def device_of(self, x: Any) -> Device: ...
        def same_device(self, what: str, xs: Sequence[Any], note: str = "") -> Device: ...
        def _placed(self, y: Any, device: Device, what: str) -> Any: ...
        def _read(self, x: Any) -> Any: ...
        def _new_variable(self, like: Any, device: Device, value: Any) -> Any: ...

    def parameter_like(self, src: Any, y: Any) -> Any:
        tf = self._tf
        if isinstance(src, tf.Variable) and not isinstance(y, tf.Variable):
            return self._new_variable(src, self.device_of(y), y)
        return y  # move and copy keep Variables Variables already

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        tf = self._tf
        ps = list(params)
        dev = self.same_device("value_and_grad", ps, SILENT)
        with tf.device(self.to_native_device(dev)):  # eager TF would run the ops on its default device
            with tf.GradientTape() as tape:
                tape.watch(ps)
                total = tf.reduce_sum(fn(ps, *args))
            gs = tape.gradient(total, ps)
            grads = [tf.zeros_like(self._read(p)) if g is None else tf.convert_to_tensor(g) for p, g in zip(ps, gs)]
        return total, [self._placed(g, dev, "value_and_grad") for g in grads]

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        tf = self._tf
        out = []
        for p, g in zip(params, grads):
            with tf.device(p.device):
                if isinstance(p, tf.Variable):
                    p.assign_sub(lr * g)  # in place: a Variable stays the same Variable
                    out.append(p)
                else:
                    out.append(p - lr * g)
        return out
