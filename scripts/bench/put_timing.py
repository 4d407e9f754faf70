"""The timing the upload probes share (round 28): one call of an upload, the microseconds until it
returns and until its result is ready (``jax.block_until_ready``). Used by
``scripts/bench/asarray_source.py``, ``scripts/gpu/put_source_probe.py`` and ``scripts/gpu/put_ways_probe.py``."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def returns_and_ready(put: Callable[[Any], Any], a: Any) -> tuple[float, float]:
    """(µs until ``put(a)`` returned, µs until its result was ready), the result dropped after."""
    import jax

    t0 = time.perf_counter()
    y = put(a)
    t1 = time.perf_counter()
    jax.block_until_ready(y)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e6, (t2 - t0) * 1e6
