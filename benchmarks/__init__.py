"""Benchmark definitions for ``multidev bench`` (installed as ``multidev.benchmarks``).

A benchmark is one function, registered with :func:`benchmark`, that takes a :class:`Context` and
yields :class:`Case` objects. A case is one row of the report: named variants (``"md"`` through
multidev, ``"native"`` through the framework's own call, sometimes others such as ``"numpy"``),
the devices to synchronize, and an untimed correctness check. The runner (:mod:`multidev.benchmarks.runner`)
does all the timing: warm-up, synchronization, repetitions, statistics, JSON, table and plot.

Adding a benchmark::

    from multidev.benchmarks import Case, Variant, benchmark, close

    @benchmark("overhead")
    def my_op(ctx):
        x = md.ones((1000,), device=ctx.dev, backend=ctx.backend)
        yield Case("my op", {"md": Variant(md.to, (x, ctx.dev)),
                             "native": ctx.native_call("to", x, ctx.dev)},
                   devices=[ctx.dev], check=lambda: close(md.to(x, ctx.dev), np.ones(1000)))

The native side of every suite is a baseline (:mod:`multidev.benchmarks.baseline`): one class per
framework, written directly against the framework and kept beside the adapters
(``multidev.benchmarks.baselines``). Goals are data of the suites (:class:`Goal`, passed to
:func:`benchmark`); ``multidev bench --check`` exits non-zero when a measured goal is missed.
"""
from __future__ import annotations

from .suite import (
    SUITES,
    Benchmark,
    Case,
    Context,
    GiB,
    Goal,
    KiB,
    MiB,
    Variant,
    all_ok,
    benchmark,
    close,
    fmt_bytes,
    goals,
    iter_cases,
    load_all,
    registry,
)

__all__ = ["SUITES", "Benchmark", "Case", "Context", "GiB", "Goal", "KiB", "MiB", "Variant", "all_ok", "benchmark",
           "close", "fmt_bytes", "goals", "iter_cases", "load_all", "registry"]

# One path per module: this folder is the package 'multidev.benchmarks' (pyproject maps it), never a
# top-level 'benchmarks' beside it (that would load every module a second time).
if __name__ != 'multidev.benchmarks':
    raise ImportError(f"benchmarks/ is the package multidev.benchmarks; import it under that name "
                      f"(pip install -e . maps it), not as {__name__!r}")

