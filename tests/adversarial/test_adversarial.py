"""Adversarial inputs on every installed backend, each group in its own child process: every case
ends in a correct result or a typed MultidevError, and nothing crashes (see _child.py).

- inputs: creation calls over hypothesis strategies of shapes, dtypes (NumPy type codes included),
  devices, fill values and seeds; arange bounds; asarray of host objects; non-tensors everywhere.
- views: reversed, strided, unaligned, broadcast, read-only, transposed, 0-d, empty, byte-swapped
  and framework-specific views through placement, convert to every backend and arithmetic.
- collectives: every collective against a float64 NumPy reference, one input made bad at random
  (shape, dtype, repeated device, non-tensor, bad op or algorithm, read-only); a failed call must
  leave its inputs bit-identical.
- leaks: the hot loops, RSS growth per call below a stated bound.

Set MULTIDEV_ADVERSARIAL_SEED to explore other examples than CI's fixed ones, and
MULTIDEV_ADVERSARIAL_SCALE to run more of them.
"""
from __future__ import annotations

from typing import Any

import pytest

BACKENDS = ("numpy", "torch", "jax", "tensorflow", "mxnet")


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs(backend: str, need: Any, run_group: Any) -> None:
    need(backend)
    s = run_group("inputs", backend)
    assert s["ok"] > 50 and s["typed"] > 50, s  # both sides were exercised


@pytest.mark.parametrize("backend", BACKENDS)
def test_views(backend: str, need: Any, run_group: Any) -> None:
    need(backend)
    s = run_group("views", backend)
    assert s["cases"] > 50, s


@pytest.mark.parametrize("backend", BACKENDS)
def test_collectives(backend: str, need: Any, run_group: Any) -> None:
    need(backend)
    s = run_group("collectives", backend)
    assert s["ok"] > 20 and s["typed"] > 20, s


@pytest.mark.parametrize("backend", BACKENDS)
def test_hot_loops_do_not_leak(backend: str, need: Any, run_group: Any) -> None:
    need(backend)
    s = run_group("leaks", backend)
    assert s["cases"] >= 10, s
