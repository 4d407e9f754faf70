"""Training for PyTorch (:class:`~multidev.adapter.SupportsTraining`): leaves that require grad,
``torch.autograd.grad``, in-place SGD."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from multidev.adapter import Concern, SupportsTraining

from .core import TorchCore


class TorchTraining(Concern, SupportsTraining):
    """Parameters are leaves that require grad; gradients by ``torch.autograd.grad`` on private
    leaves; SGD in place under ``no_grad``."""

    core: TorchCore

    def parameter_like(self, src: Any, y: Any) -> Any:
        # A copy of a tensor that requires grad is a non-leaf whose .grad stays None: cut it loose.
        return y.detach().requires_grad_(True) if src.requires_grad else y

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        torch = self.core.torch
        ps = [p.detach().requires_grad_(True) for p in params]  # private leaves: params' .grad untouched
        with torch.enable_grad():
            out = fn(ps, *args)
            total = out if out.ndim == 0 else out.sum()
            gs = torch.autograd.grad(total, ps, allow_unused=True)
        return total.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(ps, gs)]

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        with self.core.torch.no_grad():  # in place: leaves stay leaves
            for p, g in zip(params, grads):
                p.sub_(g, alpha=lr)
        return list(params)
