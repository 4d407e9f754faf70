"""Models for MXNet (:class:`~multidev.adapter.SupportsModels`): a Gluon ``Block`` is a
``"module"`` whose parameters move in place, as ``block.collect_params().reset_ctx(ctx)`` does
(the Parameter objects stay the same, their values and gradient buffers move; a Trainer built on
them keeps working). A parameter whose initialization is deferred (shape not known yet) takes the
new context when it is initialized. ``md.copy(block, dev)`` is ``copy.deepcopy`` of the block,
then moved.
"""
from __future__ import annotations

import copy
from typing import Any

from multidev.adapter import CapabilityError, Concern, Device, SupportsModels

from .core import MxnetCore


class MxnetModels(Concern, SupportsModels):
    """Gluon blocks as ``"module"``\\s."""

    core: MxnetCore

    def model_kind(self, obj: Any) -> str | None:
        return "module" if isinstance(obj, self.core.mx.gluon.Block) else None

    def flatten_tree(self, obj: Any) -> tuple[list[Any], Any]:
        raise CapabilityError("mxnet backend: a Gluon Block is a model, not a tree")

    def module_tensors(self, obj: Any) -> list[Any]:
        out: list[Any] = []
        for p in obj.collect_params().values():
            if getattr(p, "_data", None) is None:
                continue  # deferred initialization: no data yet
            out.extend(p.list_data())
        return out

    def move_module(self, obj: Any, device: Device) -> Any:
        ctx = self.core.to_native_device(device)
        params = obj.collect_params()
        if all(p.list_ctx() == [ctx] for p in params.values() if getattr(p, "_data", None) is not None) \
                and all(getattr(p, "_data", None) is not None for p in params.values()):
            return obj  # resident: nothing moves
        params.reset_ctx(ctx)
        return obj

    def copy_module(self, obj: Any, device: Device) -> Any:
        try:
            clone = copy.deepcopy(obj)
        except (TypeError, ValueError, RuntimeError) as e:
            raise CapabilityError(f"mxnet backend: this {type(obj).__name__} cannot be copied ({e}); build a "
                                  "second one and load_parameters into it") from e
        return self.move_module(clone, device)
