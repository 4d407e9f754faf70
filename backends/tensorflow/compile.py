"""Compilation for TensorFlow (:class:`~multidev.adapter.SupportsCompile`): ``tf.function``, with or
without XLA (``jit_compile``), run in the inputs' device scope."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from multidev.adapter import CapabilityError, Concern, SupportsCompile

from .core import TensorflowCore


class TensorflowCompile(Concern, SupportsCompile):
    """``tf.function`` (traced with the first call's arguments), ``tf.function:jit_compile`` and eager,
    each in the device scope of its inputs (TF would place ops on its default device)."""

    core: TensorflowCore

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        # In the D2L 12.1 measurements a plain function's tf.function is slower than eager, XLA
        # faster (benchmarks/results/compile-cpu-2026-12-01.md).
        return {"tf.function": True, "tf.function:jit_compile": True, "eager": True}

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        tf = self.core.tf
        f = fn if route == "eager" else tf.function(fn, jit_compile=route.endswith(":jit_compile"))
        if route != "eager":
            try:
                f.get_concrete_function(*args)  # trace now: a function TF cannot trace fails here, typed
            except (TypeError, ValueError, AttributeError, NotImplementedError, tf.errors.OpError) as e:
                raise CapabilityError(f"tensorflow backend: {route} cannot trace this function: "
                                      f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}") from e
        types: Any = self.core.tensor_types()
        devs = self.core.devices()
        default = next((d for d in devs if d.is_gpu), devs[0])  # where TF runs ops given no device scope
        where = next((a for a in args if isinstance(a, types)), None)

        def placed(*a: Any, **k: Any) -> Any:
            # Eager TF and tf.function place ops on the default device, not the inputs': keep the inputs'.
            x = next((x for x in a if isinstance(x, types)), where)
            if x is None or self.core.device_of(x) == default:
                return f(*a, **k)  # no scope needed (a scope costs time on every call)
            with tf.device(x.device):
                return f(*a, **k)
        return placed
