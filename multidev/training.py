"""Data-parallel training, D2L "Multi-GPU training" (12.5), written once over the adapter protocol.

- :func:`replicate`: one replica of a parameter list per device, each a training parameter as its
  source is (torch leaves that require grad, MXNet arrays with a gradient buffer, TF Variables,
  plain arrays on JAX and NumPy).
- :func:`train_batch`: D2L's ``train_batch`` on any backend: split the minibatch over the devices,
  compute each device's loss and gradients with the framework's own autodiff (or a hand-written
  gradient), allreduce the gradients, and give every replica the same SGD step. Under
  ``multidev.distributed`` (torchrun) the gradients are also summed across processes, so the
  same call trains on one device, many devices, and many processes or machines.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._device import DeviceLike
from .adapter import default_sgd_update
from .collectives import NONE_GRADIENT_HINT, allreduce, broadcast, reduce, split_batch
from .errors import CollectiveInputError, InvalidArgumentError, UnsupportedTensorError, translate_errors
from .placement import device_list
from .protocol import SupportsTraining
from .registry import backend_of, require

__all__ = ["replicate", "train_batch"]

LossFn = Callable[..., Any]
GradFn = Callable[..., tuple[Any, Sequence[Any]]]


def replicate(params: Sequence[Any], devices: Sequence[DeviceLike]) -> list[list[Any]]:
    """One replica of ``params`` per device: ``out[d][i]`` is a new copy of ``params[i]`` on
    ``devices[d]`` (a new buffer on the source's own device too), a training parameter wherever the
    source is one (see :func:`multidev.broadcast`). The sources are left as they are."""
    if isinstance(params, (str, bytes)) or not isinstance(params, Sequence):
        raise InvalidArgumentError(f"replicate takes a list of tensors, got {type(params).__name__}")
    params = list(params)
    if not params:
        raise InvalidArgumentError("replicate needs at least one parameter")
    try:
        owner = backend_of(params[0])
    except UnsupportedTensorError as e:
        raise InvalidArgumentError(f"replicate: parameter 0 is not a tensor ({e})") from None
    devs = device_list(owner, devices, "replicate")  # checked here, so errors name this call
    per_param = [broadcast(p, devs) for p in params]
    return [list(r) for r in zip(*per_param)]




def train_batch(X: Any, y: Any, replicas: list[list[Any]], devices: Sequence[DeviceLike], lr: float, *,
                loss: LossFn | None = None, grad: GradFn | None = None, batch_size: int | None = None,
                algorithm: str = "auto", distributed: bool | None = None) -> float:
    """One step of data-parallel SGD (D2L's ``train_batch``); returns the minibatch's summed loss.

    - ``replicas[d]`` is device ``d``'s list of parameters (from :func:`replicate`); it is updated
      for every device: in place where the parameters are writable (torch, MXNet, TF Variables,
      NumPy), by rebinding ``replicas[d][i]`` elsewhere (JAX, TF tensors).
    - ``loss(params, X_shard, y_shard)``: the shard's summed loss, differentiated by the
      framework's autodiff (the adapter's ``value_and_grad``); or ``grad(params, X_shard, y_shard)
      -> (loss, grads)``, hand-written (NumPy). Exactly one of the two.
    - the update is ``p -= lr * g / batch_size`` with ``g`` the gradient summed over every device
      (and every process); ``batch_size`` defaults to the global batch: X's rows times the number
      of processes, so every rank must pass batches of one size (or pass ``batch_size``).
    - ``distributed``: sum across processes too (``multidev.distributed``); default: when a group
      of more than one process is initialized.

    On one device the step is the framework's own: the batch is moved there only where it lives
    elsewhere (no split, no copy), and the gradients go to the update as autodiff gave them (no
    allreduce). Synchronous: it waits for the step to read the loss back (a Python float).
    """
    if (loss is None) == (grad is None):
        raise InvalidArgumentError("train_batch takes exactly one of loss= (differentiated by the framework) "
                                   "and grad= (returning (loss, grads))")
    b = backend_of(X)
    devs = _device_list(b, devices)
    if not isinstance(replicas, list) or len(replicas) != len(devs) or not all(isinstance(r, list) for r in replicas):
        raise InvalidArgumentError(f"train_batch: replicas must be a list of {len(devs)} lists (one per device, "
                                   "as multidev.replicate returns)")
    n_params = len(replicas[0])
    if len(replicas) > 1 and any(len(r) != n_params for r in replicas):
        raise InvalidArgumentError(f"train_batch: the replicas hold {[len(r) for r in replicas]} parameters")
    if distributed is None:  # (multidev.distributed is imported by a program that starts a group)
        running = sys.modules.get(f"{__package__}.distributed")
        distributed = bool(running is not None and running.is_initialized() and running.world_size() > 1)
    if distributed:
        from . import distributed as dist
    world = dist.world_size() if distributed else 1
    sx = b.shape_of(X)
    if not sx:
        raise CollectiveInputError("train_batch needs X with a batch axis (got a 0-d tensor)")
    if batch_size is None:
        batch_size = sx[0] * world
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InvalidArgumentError(f"train_batch: batch_size must be a positive int, got {batch_size!r:.40}")
    vg = None if grad is not None else require(
        b, SupportsTraining, "train_batch(loss=...)",
        "it has no automatic differentiation: pass a hand-written gradient, train_batch(..., grad=fn)").value_and_grad
    one = len(devs) == 1
    X_shards, y_shards = _one_shard(b, X, sx, y, devs[0]) if one else split_batch(X, y, devs)
    losses, grads = [], []
    for d, (ps, Xs, ys) in enumerate(zip(replicas, X_shards, y_shards)):
        if grad is not None:
            value, gs = grad(list(ps), Xs, ys)
        else:
            assert vg is not None
            value, gs = vg(loss, ps, (Xs, ys))
        gs = list(gs)
        if len(gs) != n_params:
            raise InvalidArgumentError(f"train_batch: {len(gs)} gradients for {n_params} parameters on {devs[d]}")
        for i, g in enumerate(gs):
            if g is None:
                raise InvalidArgumentError(f"train_batch: the gradient of parameter {i} on {devs[d]} is None. "
                                           + NONE_GRADIENT_HINT)
        losses.append(value)
        grads.append(gs)
    if one:  # nothing to sum over: each gradient as autodiff gave it (checked to be a tensor, as allreduce does)
        _check_tensors(grads[0])
        summed = [[g] for g in grads[0]]
    else:
        summed = [allreduce([g[i] for g in grads], "sum", algorithm=algorithm) for i in range(n_params)]
    if distributed:
        for i in range(n_params):
            total = dist.allreduce(summed[i][0], "sum")  # the local sum, on the first device
            summed[i] = broadcast(total, devs) if len(devs) > 1 else [total]
    step = float(lr) / int(batch_size)
    training, scope = b.training, b.scope
    if training is not None:
        for d, ps in enumerate(replicas):
            ps[:] = training.sgd_update(ps, [s[d] for s in summed], step)
    else:  # the shared update with the tensors' own operators, run where each replica lives (CuPy
        # computes on its current device, not its operands')
        for d, ps in enumerate(replicas):
            with scope.device_scope(devs[d]) if scope is not None and len(devs) > 1 else contextlib.nullcontext():
                ps[:] = default_sgd_update(ps, [s[d] for s in summed], step)
    value = _loss_sum(losses, devs)
    if distributed:
        wide = "float64" if dist.carries("float64") else "float32"  # JAX's engine without x64 has no float64
        value = float(dist.allreduce(np.array([value], dtype=wide), "sum")[0])
    return value


#: (adapter, the caller's devices) -> the resolved, checked device list: train_batch is called with
#: the same devices every step, and resolving them is the step's own overhead on one device.
_DEVICE_LISTS: dict[tuple[Any, tuple[Any, ...]], list[Any]] = {}


def _device_list(b: Any, devices: Sequence[DeviceLike]) -> list[Any]:
    """``device_list(b, devices, "train_batch")``, remembered for a list or tuple of hashable devices."""
    if devices.__class__ is not list and devices.__class__ is not tuple:
        return device_list(b, devices, "train_batch")
    try:
        key = (b, tuple(devices))
        hit = _DEVICE_LISTS.get(key)
    except TypeError:  # an unhashable device spelling: resolved every time
        return device_list(b, devices, "train_batch")
    if hit is None:
        hit = device_list(b, devices, "train_batch")  # raises for a bad list: nothing is cached then
        if len(_DEVICE_LISTS) > 256:
            _DEVICE_LISTS.clear()
        _DEVICE_LISTS[key] = hit
    return hit


def _one_shard(b: Any, X: Any, sx: tuple[int, ...], y: Any, dev: Any) -> tuple[list[Any], list[Any]]:
    """split_batch's checks and result for one device, without its copies: X and y themselves where
    they live on ``dev`` already, else moved there."""
    by = backend_of(y)
    if by is not b and by.name != b.name:
        raise CollectiveInputError(f"split_batch: X is a {b.name} tensor and y a {by.name} tensor; "
                                   "use one backend for both")
    sy = by.shape_of(y)
    if not sx or not sy:
        raise CollectiveInputError("split_batch needs X and y with a batch axis (got a 0-d tensor)")
    if sx[0] != sy[0]:
        raise CollectiveInputError(f"split_batch: X has {sx[0]} examples but y has {sy[0]}")
    if sx[0] < 1:
        raise CollectiveInputError(f"split_batch: a batch of {sx[0]} cannot give each of 1 "
                                   "devices an example; use a larger batch or fewer devices")
    with translate_errors(lambda: f"{b.name} train_batch: moving the batch to {dev}"):
        Xs = X if b.device_of(X) == dev else b.move(X, dev)
        ys = y if b.device_of(y) == dev else b.move(y, dev)
    return [Xs], [ys]


def _check_tensors(gs: list[Any]) -> None:
    """Every gradient is a tensor (what allreduce checks on several devices): once per class."""
    seen: set[type] = set()
    for i, g in enumerate(gs):
        cls = g.__class__
        if cls in seen:
            continue
        try:
            backend_of(g)
        except UnsupportedTensorError as e:
            raise CollectiveInputError(f"train_batch: the gradient of parameter {i} is not a tensor ({e})") from None
        seen.add(cls)


def _loss_sum(losses: list[Any], devs: list[Any]) -> float:
    """The sum of the per-device losses as a float (tensors reduced onto the first device first)."""
    if len(losses) == 1:  # one device: a 0-d loss read as the framework reads a scalar (no host staging)
        v = losses[0]
        try:
            zero_d = backend_of(v).shape_of(v) == ()
        except UnsupportedTensorError:
            zero_d = False
        if zero_d:
            try:
                return float(v)
            except TypeError:  # a framework whose tensors have no __float__
                pass
    try:
        backs = {backend_of(v).name for v in losses}
    except UnsupportedTensorError:  # hand-written gradients may return host scalars
        backs = set()
    if len(backs) == 1:
        b = backend_of(losses[0])
        flat = [b.reshape(v, (1,)) if b.shape_of(v) == () else v for v in losses]
        if len({b.shape_of(v) for v in flat}) == 1 and len({b.device_of(v) for v in flat}) == len(flat):
            total = reduce(flat, devs[0]) if len(flat) > 1 else flat[0]
            return float(np.sum(b.to_numpy(total), dtype=np.float64))
    return float(sum(np.sum(np.asarray(_host(v)), dtype=np.float64) for v in losses))


def _host(v: Any) -> Any:
    try:
        return backend_of(v).to_numpy(v)
    except UnsupportedTensorError:  # a Python or NumPy scalar
        return v
