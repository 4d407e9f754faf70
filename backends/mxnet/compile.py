"""Compilation for MXNet (:class:`~multidev.adapter.SupportsCompile`): Gluon's ``hybridize``."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from multidev.adapter import CapabilityError, Concern, SupportsCompile

from .core import MxnetCore


class MxnetCompile(Concern, SupportsCompile):
    """``hybridize`` (static or not) and eager, for Gluon ``HybridBlock``s; the block itself is
    reconfigured."""

    core: MxnetCore

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        if not isinstance(fn, self.core.mx.gluon.HybridBlock):
            raise CapabilityError("mxnet backend compiles Gluon HybridBlocks (hybridize); MXNet has no compiler "
                                  f"for a plain {type(fn).__name__}: build the model from gluon.nn layers "
                                  "(nn.HybridSequential) or call the function as it is")
        # In the D2L 12.1 measurements static hybridize is the fastest, then hybridize, then eager
        # (benchmarks/results/compile-cpu-2026-12-01.md).
        return {"hybridize:static": True, "hybridize": True, "eager": True}

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        if route == "eager":
            fn.hybridize(active=False)
        else:  # hybridize resets the cached graph and flags every time it is called
            static = route == "hybridize:static"
            fn.hybridize(static_alloc=static, static_shape=static)
        return fn
