"""What several files of the JAX adapter share."""
from __future__ import annotations

X64_DTYPES = frozenset({"int64", "uint64", "float64", "complex128"})


def x64_hint() -> str:
    return "enable 64-bit types with jax.config.update('jax_enable_x64', True)"
