"""Models for TensorFlow (:class:`~multidev.adapter.SupportsModels`): a Keras model or layer, or a
``tf.Module``, is a ``"module"``.

TensorFlow places a variable on a device when the variable is created and never moves it, so:

- ``md.to(model, dev)`` returns the model itself where every variable is on ``dev`` already, and
  otherwise raises CapabilityError: build the model under ``md.device_scope(dev,
  backend="tensorflow")`` (``tf.device``) instead, or copy it;
- ``md.copy(model, dev)`` of a Keras model built with the functional or Sequential API is a new model
  made by ``keras.models.clone_model`` under ``tf.device(dev)``, with the same weights (copied, not
  shared; the optimizer, its state and the compile settings are not copied); other models (subclassed
  Keras models, plain ``tf.Module``\\s) raise CapabilityError, as TensorFlow has no generic copy;
- ``md.device_of(model)`` and ``md.synchronize(model)`` read every variable (Keras variables through
  the ``tf.Variable`` they hold).
"""
from __future__ import annotations

import sys
from typing import Any

from multidev.adapter import CapabilityError, Concern, Device, SupportsModels

from .core import TensorflowCore


class TensorflowModels(Concern, SupportsModels):
    """Keras models and layers, and ``tf.Module``, as ``"module"``\\s that cannot move."""

    core: TensorflowCore

    def model_kind(self, obj: Any) -> str | None:
        if isinstance(obj, self.core.tf.Module):
            return "module"
        keras = sys.modules.get("keras")
        layers = getattr(keras, "layers", None)
        layer = getattr(layers, "Layer", None)
        return "module" if isinstance(layer, type) and isinstance(obj, layer) else None

    def flatten_tree(self, obj: Any) -> tuple[list[Any], Any]:
        raise CapabilityError("tensorflow backend: a Keras model or tf.Module is a model, not a tree")

    def module_tensors(self, obj: Any) -> list[Any]:
        tf = self.core.tf
        found = getattr(obj, "weights", None)
        if found is None:
            found = obj.variables
        out: dict[int, Any] = {}
        for v in found:
            t = getattr(v, "value", v)  # a Keras variable holds a tf.Variable
            if not isinstance(t, (tf.Variable, tf.Tensor)):
                t = v
            out.setdefault(id(t), t)
        return list(out.values())

    def move_module(self, obj: Any, device: Device) -> Any:
        where = sorted({str(self.core.device_of(t)) for t in self.module_tensors(obj)})
        if not where or where == [str(device)]:
            return obj  # resident (or no variables yet): nothing to move
        raise CapabilityError(
            f"tensorflow backend: TensorFlow keeps a variable on the device it was created on, so this "
            f"{type(obj).__name__} (variables on {', '.join(where)}) cannot move to {device}. Build it under "
            f"md.device_scope({str(device)!r}, backend='tensorflow') (tf.device), or md.copy(model, "
            f"{str(device)!r}) for a Keras functional or Sequential model")

    def copy_module(self, obj: Any, device: Device) -> Any:
        keras = sys.modules.get("keras")
        models = getattr(keras, "models", None)
        if models is None or (isinstance(obj, self.core.tf.Module) and not hasattr(obj, "get_weights")):
            raise CapabilityError(f"tensorflow backend: TensorFlow has no way to copy a {type(obj).__name__} "
                                  "(only Keras functional and Sequential models can be cloned); build a second "
                                  "one under md.device_scope(device, backend='tensorflow') and assign its weights")
        try:
            with self.core.tf.device(self.core.to_native_device(device)):
                clone = models.clone_model(obj)
                clone.set_weights(obj.get_weights())
        except (ValueError, TypeError, NotImplementedError) as e:
            raise CapabilityError(f"tensorflow backend: keras.models.clone_model cannot copy this "
                                  f"{type(obj).__name__} ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                                  "only functional and Sequential models can be cloned") from e
        return clone
