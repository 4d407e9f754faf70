"""Models for PyTorch (:class:`~multidev.adapter.SupportsModels`): an ``nn.Module`` moves in place,
as ``module.to(device)`` does.

What moves: every parameter and buffer (persistent or not) and each parameter's ``.grad``, in
place, so the Parameter objects stay the same (an optimizer built on them keeps working, tied
weights stay tied); nothing is copied where every tensor is on the device already. What does not:
an optimizer's own state (momentum buffers), which ``torch.optim`` keeps apart from the module:
build the optimizer after moving the model, as PyTorch recommends, or move its ``state_dict()``.
torch has no tree nodes of its own beyond Python's containers, which the core handles.
"""
from __future__ import annotations

import copy
import sys
from typing import Any

from multidev.adapter import CapabilityError, Concern, Device, SupportsModels

from .core import TorchCore


class TorchModels(Concern, SupportsModels):
    """``nn.Module`` as a ``"module"``: moved in place, copied by ``copy.deepcopy``."""

    core: TorchCore

    def model_kind(self, obj: Any) -> str | None:
        nn = sys.modules.get("torch.nn")
        return "module" if nn is not None and isinstance(obj, nn.Module) else None

    def flatten_tree(self, obj: Any) -> tuple[list[Any], Any]:
        raise CapabilityError("torch backend: a torch.nn.Module is a model, not a tree")

    def module_tensors(self, obj: Any) -> list[Any]:
        seen: dict[int, Any] = {}
        for t in (*obj.parameters(), *obj.buffers()):
            seen.setdefault(id(t), t)
        return list(seen.values())

    def move_module(self, obj: Any, device: Device) -> Any:
        dev = self.core.to_native_device(device)
        for t in obj.parameters():  # the first parameter elsewhere: a real move, without walking the rest first
            if t.device != dev:
                return obj.to(dev)
            break
        tensors = self.module_tensors(obj)
        if all(t.device == dev for t in tensors):
            return obj  # resident: nothing moves (as_in_ctx)
        return obj.to(dev)  # in place: the same module, its Parameters kept

    def copy_module(self, obj: Any, device: Device) -> Any:
        return copy.deepcopy(obj).to(self.core.to_native_device(device))
