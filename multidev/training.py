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

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import distributed as dist
from ._device import DeviceLike
from .adapter import default_sgd_update
from .collectives import NONE_GRADIENT_HINT, allreduce, broadcast, reduce, split_batch
from .errors import InvalidArgumentError, UnsupportedTensorError
from .placement import device_list
from .protocol import SupportsTraining
from .registry import backend_of, require, supports

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

    Synchronous: it waits for the step to read the loss back (a Python float).
    """
    if (loss is None) == (grad is None):
        raise InvalidArgumentError("train_batch takes exactly one of loss= (differentiated by the framework) "
                                   "and grad= (returning (loss, grads))")
    b = backend_of(X)
    devs = device_list(b, devices, "train_batch")
    if not isinstance(replicas, list) or len(replicas) != len(devs) or not all(isinstance(r, list) for r in replicas):
        raise InvalidArgumentError(f"train_batch: replicas must be a list of {len(devs)} lists (one per device, "
                                   "as multidev.replicate returns)")
    n_params = len(replicas[0])
    if any(len(r) != n_params for r in replicas):
        raise InvalidArgumentError(f"train_batch: the replicas hold {[len(r) for r in replicas]} parameters")
    if distributed is None:
        distributed = dist.is_initialized() and dist.world_size() > 1
    world = dist.world_size() if distributed else 1
    if batch_size is None:
        batch_size = b.shape_of(X)[0] * world
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InvalidArgumentError(f"train_batch: batch_size must be a positive int, got {batch_size!r:.40}")
    X_shards, y_shards = split_batch(X, y, devs)
    losses, grads = [], []
    vg = None if grad is not None else require(
        b, SupportsTraining, "train_batch(loss=...)",
        "it has no automatic differentiation: pass a hand-written gradient, train_batch(..., grad=fn)").value_and_grad
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
    summed = [allreduce([g[i] for g in grads], "sum", algorithm=algorithm) for i in range(n_params)]
    if distributed:
        for i in range(n_params):
            total = dist.allreduce(summed[i][0], "sum")  # the local sum, on the first device
            summed[i] = broadcast(total, devs) if len(devs) > 1 else [total]
    step = float(lr) / int(batch_size)
    sgd = b.sgd_update if supports(b, SupportsTraining) else default_sgd_update  # type: ignore[attr-defined]
    for d, ps in enumerate(replicas):
        ps[:] = sgd(ps, [s[d] for s in summed], step)
    value = _loss_sum(losses, devs)
    if distributed:
        wide = "float64" if dist.carries("float64") else "float32"  # JAX's engine without x64 has no float64
        value = float(dist.allreduce(np.array([value], dtype=wide), "sum")[0])
    return value


def _loss_sum(losses: list[Any], devs: list[Any]) -> float:
    """The sum of the per-device losses as a float (tensors reduced onto the first device first)."""
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
