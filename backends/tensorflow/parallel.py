"""Data parallelism for TensorFlow (:class:`~multidev.adapter.SupportsDataParallel`): a Keras 3
model with its Keras optimizer, trained in place (its variables assigned, never replaced).

The step is the framework's own custom-training-loop step: ``tf.GradientTape`` around
``loss_fn(model, batch)``, ``optimizer.apply_gradients``; across processes the core averages the
tape's gradients in between. The optimizer's variables (iterations, slots) are built before the
first broadcast, so rank 0's state reaches every rank.

Several devices of one process: TensorFlow's own tool is ``tf.distribute.MirroredStrategy``, the
right choice for a model *built* inside its ``scope()`` and trained with ``model.fit`` or
``strategy.run``; variables made outside the scope cannot be mirrored afterwards. For the model you
already have, this adapter does what the strategy would: a copy of the model per further device
(``keras.models.clone_model`` under ``tf.device``: functional and Sequential models), the batch
split by rows, one tape per device, the gradients weighted by rows and added on the first device,
one optimizer step there, its variables assigned to the copies.
"""
from __future__ import annotations

import sys
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from multidev.adapter import (
    CapabilityError,
    Concern,
    Device,
    InvalidArgumentError,
    Ready,
    Replica,
    SupportsDataParallel,
)

from .core import TensorflowCore

#: Keras optimizers whose update is element by element: a piece of a parameter steps as it would
#: within the whole (multidev's own sharding of their state over processes)
ELEMENTWISE = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam", "Ftrl", "Lion")


def piece_refusal(keras: Any, model: Any, opt: Any) -> None:
    """CapabilityError where multidev cannot shard ``opt``'s state over ``model``'s pieces (an update
    not known to be element by element, a norm over whole gradients, the model's own constraints, an
    EMA, an optimizer that has stepped); None otherwise."""
    kind = type(opt).__name__
    if kind not in ELEMENTWISE or type(opt) is not getattr(keras.optimizers, kind, None):
        raise CapabilityError(f"data_parallel(param_axis=...): multidev cannot shard a {kind}'s state (its "
                              "update is not known to be element by element: a piece would step differently); "
                              f"sharded: keras.optimizers.{', '.join(ELEMENTWISE)}")
    cfg = opt.get_config()
    if cfg.get("clipnorm") is not None or cfg.get("global_clipnorm") is not None:
        raise CapabilityError("data_parallel(param_axis=...): clipnorm and global_clipnorm take a norm over "
                              "whole gradients, which a rank holding a piece does not have (clipvalue clips "
                              "element by element: it shards)")
    if any(getattr(v, "constraint", None) is not None for v in model.trainable_variables) or getattr(
            opt, "_exclude_from_weight_decay", None) or getattr(opt, "_exclude_from_weight_decay_pattern", None):
        raise CapabilityError("data_parallel(param_axis=...): a variable constraint or "
                              "exclude_from_weight_decay belongs to the model's own variables, which the "
                              "optimizer over pieces does not step; train this model without param_axis")
    if cfg.get("use_ema"):
        raise CapabilityError("data_parallel(param_axis=...): use_ema keeps a moving average of whole "
                              "variables, which the optimizer over pieces does not hold")
    if int(opt.iterations.numpy()) != 0:
        raise CapabilityError("data_parallel(param_axis=...): the optimizer has stepped already, and its "
                              "state cannot be cut into pieces; give data_parallel a fresh optimizer")

class TensorflowParallel(Concern, SupportsDataParallel):
    """Keras models with Keras optimizers."""

    core: TensorflowCore

    def piece_refusal(self, model: Any, optimizer: Any) -> None:
        """What :meth:`TensorflowReplica.piece_optimizer` would refuse, raised before a replica copies
        the model onto other devices (nothing here for what the replica refuses itself)."""
        keras = sys.modules.get("keras")
        if keras is not None and isinstance(model, keras.Model) and isinstance(optimizer, keras.optimizers.Optimizer):
            piece_refusal(keras, model, optimizer)

    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        keras = sys.modules.get("keras")
        if keras is None or not isinstance(model, keras.Model):
            if self.core.models.model_kind(model) == "module":
                raise InvalidArgumentError(f"data_parallel: TensorFlow models are Keras models; got "
                                           f"{type(model).__name__}")
            return None
        if optimizer is not None and not isinstance(optimizer, keras.optimizers.Optimizer):
            raise InvalidArgumentError(f"data_parallel: a Keras model trains with a keras.optimizers.Optimizer, got "
                                       f"{type(optimizer).__name__}")
        if not model.built:
            raise InvalidArgumentError("data_parallel: build the Keras model first (call it once, or give it an "
                                       "Input), so its variables exist")
        copies = [self.core.models.copy_module(model, d) for d in devices[1:]]
        return TensorflowReplica(self.core, self.core.tf, model, optimizer, list(devices), copies)


class TensorflowReplica(Replica):
    """The Keras model itself (and its copies on further devices)."""

    def __init__(self, backend: Any, tf: Any, model: Any, optimizer: Any, devices: list[Device],
                 copies: list[Any]) -> None:
        self.backend, self.tf, self.model, self.optimizer, self.devices = backend, tf, model, optimizer, devices
        self._copies = copies
        self._models = [model, *copies]
        self._acc: list[Any] | None = None
        if optimizer is not None and not optimizer.built:
            optimizer.build(model.trainable_variables)  # its state exists from the start: broadcastable

    @staticmethod
    def _named(variables: Sequence[Any]) -> list[tuple[str, Any]]:
        return [(getattr(v, "path", None) or v.name, v) for v in variables]

    def parameters(self) -> list[tuple[str, Any]]:
        return [(n, v.value) for n, v in self._named(self.model.trainable_variables)]

    def buffers(self) -> list[tuple[str, Any]]:
        return [(n, v.value) for n, v in self._named(self.model.non_trainable_variables)]

    def _sync_copies(self) -> None:
        for c in self._copies:
            for v, w in zip(c.trainable_variables, self.model.trainable_variables):
                v.assign(w.value)
            for v, w in zip(c.non_trainable_variables, self.model.non_trainable_variables):
                v.assign(w.value)

    def load(self, params: Sequence[Any] | None, buffers: Sequence[Any] | None) -> None:
        for v, x in zip(self.model.trainable_variables, params or ()):
            v.assign(x)
        for v, x in zip(self.model.non_trainable_variables if buffers is not None else (), buffers or ()):
            v.assign(x)
        self._sync_copies()

    def optimizer_state(self) -> Any:
        if self.optimizer is None:
            return None
        return [np.asarray(v.value) for v in self.optimizer.variables]

    def load_optimizer_state(self, state: Any) -> None:
        for v, x in zip(self.optimizer.variables, state):
            v.assign(x)

    def _rows(self, batch: Any) -> int:
        first = batch
        while isinstance(first, (tuple, list)) and first:
            first = first[0]
        if isinstance(first, dict):
            return self._rows(next(iter(first.values())))
        shape: Any = getattr(first, "shape", None)
        return int(shape[0]) if shape is not None and len(shape) else 0

    def _shards(self, batch: Any, sizes: list[int]) -> list[Any]:
        tf = self.tf
        if isinstance(batch, (tuple, list)):
            return [type(batch)(z) for z in zip(*(self._shards(x, sizes) for x in batch))]
        if isinstance(batch, dict):
            cols = {k: self._shards(v, sizes) for k, v in batch.items()}
            return [{k: cols[k][d] for k in batch} for d in range(len(sizes))]
        out = []
        for part, d in zip(tf.split(batch, sizes), self.devices):
            with tf.device(self.backend.to_native_device(d)):
                out.append(tf.identity(part))
        return out

    def backward(self, batch: Any, loss_fn: Callable[..., Any], ready: Ready | None) -> Any:
        tf = self.tf
        if self.optimizer is None:
            raise InvalidArgumentError("DataParallel.step needs the optimizer: data_parallel(model, optimizer)")
        if len(self._models) == 1:
            parts, weights = [batch], [1.0]
        else:
            n = self._rows(batch)
            if n < len(self._models):
                raise InvalidArgumentError(f"DataParallel.step: a batch of {n} rows cannot give each of "
                                           f"{len(self._models)} devices a row")
            sizes = [len(p) for p in np.array_split(np.empty(n, dtype=np.int8), len(self._models))]
            parts, weights = self._shards(batch, sizes), [s / n for s in sizes]
        dev0 = self.backend.to_native_device(self.devices[0])
        total, summed = None, None
        for m, part, w, d in zip(self._models, parts, weights, self.devices):
            with tf.device(self.backend.to_native_device(d)), tf.GradientTape() as tape:
                loss = loss_fn(m, part)
                scaled = loss * w if w != 1.0 else loss
            if getattr(loss, "shape", None) is None or loss.shape.num_elements() != 1:
                raise InvalidArgumentError(f"DataParallel.step: loss_fn must return a scalar tensor, got "
                                           f"{getattr(loss, 'shape', type(loss).__name__)}")
            grads = tape.gradient(scaled, m.trainable_variables)
            with tf.device(dev0):
                loss0 = tf.identity(tf.reshape(scaled, ()))
                total = loss0 if total is None else total + loss0
                gs = [None if g is None else tf.identity(g) for g in grads]
                summed = gs if summed is None else [a if b is None else (b if a is None else a + b)
                                                    for a, b in zip(summed, gs)]
        assert summed is not None
        if self._acc is None:
            self._acc = summed
        else:
            self._acc = [a if b is None else (b if a is None else a + b) for a, b in zip(self._acc, summed)]
        if ready is not None:
            for i in range(len(self._acc) - 1, -1, -1):
                if self._acc[i] is not None:
                    ready(i, self._acc[i])
        return total

    def drop_gradients(self) -> None:
        self._acc = None

    def apply(self, grads: Sequence[Any | None] | None) -> None:
        gs = self._acc if grads is None else list(grads)
        self._acc = None
        if gs is not None:
            pairs = [(g, v) for g, v in zip(gs, self.model.trainable_variables) if g is not None]
            if pairs:
                self.optimizer.apply_gradients(pairs)
        self._sync_copies()


    def piece_optimizer(self, pieces: list[Any]) -> Any:
        """A fresh optimizer of the given one's class and configuration over Keras variables holding
        ``pieces``, on the pieces' device (see :meth:`multidev.adapter.Replica.piece_optimizer`)."""
        keras, opt = sys.modules["keras"], self.optimizer
        piece_refusal(keras, self.model, opt)
        # the learning rate is the pieces' own variable, set from the given optimizer's at each step:
        # its configuration is taken without it (a schedule of the user's may not be rebuildable)
        cfg = {**opt.get_config(), "learning_rate": 0.0}
        given_lr = getattr(opt, "_learning_rate", None)
        lr_dtype = given_lr.dtype if given_lr is not None and hasattr(given_lr, "assign") else keras.config.floatx()
        held = [(i, p) for i, p in enumerate(pieces) if p is not None]
        dev = self.backend.device_of(held[0][1]) if held else self.devices[0]
        with self.tf.device(self.backend.to_native_device(dev)):  # the pieces' device holds their state
            new = type(opt).from_config(cfg)
            variables = [keras.Variable(p, trainable=True, name=f"piece_{i}") for i, p in held]
            new.build(variables)
            lr = keras.Variable(0.0, dtype=lr_dtype, trainable=False, name="piece_learning_rate")
        return _KerasPieces(new, variables, opt, self.tf, lr)

    def zeros_like(self, x: Any) -> Any:
        return self.tf.zeros_like(x)

    def flatten(self, tensors: Sequence[Any], dtype: str | None) -> Any:
        tf = self.tf
        flat = tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)
        return flat if dtype is None else tf.cast(flat, self.backend.to_native_dtype(dtype))

    def unflatten(self, flat: Any, like: Sequence[Any], scale: float | None) -> list[Any]:
        tf = self.tf
        if flat.dtype != like[0].dtype:
            flat = tf.cast(flat, like[0].dtype)
        if scale is not None and scale != 1.0:
            flat = flat * tf.constant(scale, flat.dtype)
        parts = tf.split(flat, [int(np.prod(t.shape, dtype=np.int64)) for t in like])
        return [tf.reshape(p, t.shape) for p, t in zip(parts, like)]

    def fingerprints(self) -> list[list[int]]:
        rows = []
        for m in self._models:
            vs = [*m.trainable_variables, *m.non_trainable_variables]
            rows.append([zlib.crc32(np.ascontiguousarray(np.asarray(v.value)).tobytes()) & 0x7FFFFFFF for v in vs])
        return rows

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)


class _KerasPieces:
    """A Keras optimizer over one rank's (or device's) pieces of the parameters (Keras variables),
    following the user's optimizer ``given``: its learning rate (a value, a schedule or a callable,
    evaluated eagerly at each step as Keras would, into a variable the step reads) and weight decay
    now, its step count after. Its step runs as one ``tf.function`` (Keras's eager update costs
    milliseconds a variable on a CPU), traced again when the weight decay changes."""

    def __init__(self, optimizer: Any, variables: list[Any], given: Any, tf: Any, lr: Any) -> None:
        self.optimizer, self.variables, self.given, self.tf, self._lr = optimizer, variables, given, tf, lr
        optimizer._learning_rate = lr
        self._traced: tuple[Any, Any] | None = None  # (the weight decay it was traced for, the function)

    def _run(self, grads: Sequence[Any], values: Sequence[Any]) -> list[Any]:
        for v, x in zip(self.variables, values):
            v.assign(x)
        self.optimizer.apply_gradients(zip(grads, self.variables))
        return [v.value for v in self.variables]

    def step(self, grads: Sequence[Any], values: Sequence[Any]) -> list[Any]:
        opt, given = self.optimizer, self.given
        lr = given._learning_rate  # a variable the user may have set, or a schedule or callable
        schedules = sys.modules["keras"].optimizers.schedules
        if isinstance(lr, schedules.LearningRateSchedule):
            lr = lr(opt._iterations)  # (Keras's own rule: the schedule at the step count before this step)
        elif callable(lr) and not hasattr(lr, "assign"):
            lr = lr()
        self._lr.assign(self.tf.cast(lr, self._lr.dtype))
        opt.weight_decay = given.weight_decay
        if self._traced is None or self._traced[0] != given.weight_decay:
            self._traced = (given.weight_decay, self.tf.function(self._run))
        out = self._traced[1](list(grads), list(values))
        given._iterations.assign(opt._iterations)
        return list(out)
