"""An out-of-tree adapter, as a third party writes one: its own package, started from multidev's
template (``multidev.examples.template_adapter``), registered by its own ``pyproject.toml``, and
certified with ``multidev conformance --backend halfnp_multidev:HalfBackend --xfails
halfnp_multidev/xfails.txt`` (``tests/test_certification.py`` runs it, and docs/writing-an-adapter.md
shows it).

Its one known gap, kept in its expected-failures file with the reason: the library it adapts draws
random numbers from the operating system, so ``rand`` cannot honour a seed.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from multidev.adapter import Device, numpy_dtype
from multidev.examples.template_adapter import TemplateBackend

__all__ = ["HalfBackend"]


class HalfBackend(TemplateBackend):
    """The template's adapter under its own name, with random numbers from the operating system."""

    name = "halfnp"

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        # no seeded stream here: every call draws fresh entropy (the documented, expected failure)
        rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
        return self.asarray(rng.random(shape).astype(numpy_dtype(dtype)), dtype, device)
