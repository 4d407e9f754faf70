"""Compilation for JAX (:class:`~multidev.adapter.SupportsCompile`): ``jax.jit``, traced at compile time."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from multidev.adapter import CapabilityError, Concern, SupportsCompile

from .core import JaxCore


class JaxCompile(Concern, SupportsCompile):
    """``jax.jit`` (traced with the first call's arguments, so an untraceable function fails then) and eager."""

    core: JaxCore

    def compile_routes(self, fn: Any) -> dict[str, bool]:
        return {"jax.jit": True, "eager": True}

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        if route == "eager":
            return fn
        jitted = self.core.jax.jit(fn)
        try:
            jitted.lower(*args)  # trace now: a function jit cannot trace fails here, typed
        except TypeError as e:  # jax.errors.ConcretizationTypeError and the other tracing errors
            raise CapabilityError(f"jax backend: jax.jit cannot trace this function: {type(e).__name__}: "
                                  f"{str(e).strip().splitlines()[0][:200]}") from e
        return jitted
