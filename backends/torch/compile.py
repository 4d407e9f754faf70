"""Compilation for PyTorch (:class:`~multidev.adapter.SupportsCompile`): TorchScript (script,
trace) and ``torch.compile``."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from multidev.adapter import CapabilityError, Concern, SupportsCompile

from .core import TorchCore


class TorchCompile(Concern, SupportsCompile):
    """``torch.jit.script``, ``torch.jit.trace`` (refused where it would freeze data-dependent
    control flow), ``torch.compile`` and its modes, and eager."""

    core: TorchCore

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        # script < trace < eager < torch.compile in the D2L 12.1 measurements (benchmarks/results/,
        # compile), and torch.compile's own compilation takes seconds: auto measures the first three.
        return {"torch.jit.script": True, "torch.jit.trace": True, "eager": True, "torch.compile": False,
                "torch.compile:reduce-overhead": False, "torch.compile:max-autotune": False}

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        import warnings

        torch = self.core.torch
        if route == "eager":
            return fn
        if route.startswith("torch.compile"):
            mode = route.partition(":")[2] or None
            return torch.compile(fn, mode=mode)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")  # torch >= 2.10 deprecates torch.jit: our choice, not the user's
            try:
                out = torch.jit.script(fn) if route == "torch.jit.script" else torch.jit.trace(fn, args)
            except Exception as e:  # any compiler error means "cannot compile this way"
                raise CapabilityError(f"torch backend: {route} cannot compile this function: "
                                      f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}") from e
        if any(issubclass(w.category, torch.jit.TracerWarning) for w in seen):
            raise CapabilityError("torch backend: torch.jit.trace would freeze data-dependent Python control "
                                  "flow of this function (TracerWarning); use torch.jit.script or eager")
        return out
