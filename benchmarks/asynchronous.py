"""Suite ``async`` (D2L "Asynchronous computation"): 10 matmuls of 1000² (scaled down on CPU).

Rows: time-to-result through NumPy, through the framework waited on by ``md.synchronize(y)`` and by
the framework's own wait; and the framework's dispatch time alone (the clock stops before any wait,
on purpose: that is the asynchrony being shown).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import multidev as md

from . import Case, Context, Variant, benchmark, close

K = 10  # matmuls per call, as in D2L


def run_k(mm: Callable[[Any, Any], Any], k: int) -> Callable[[Any], Any]:
    def run(x: Any) -> Any:
        y = None
        for _ in range(k):
            y = mm(x, x)
        return y
    return run


def tolerance(precision: str) -> float:
    return 2e-2 if precision == "tf32" else 1e-4


@benchmark("async", precision=True)
def matmuls(ctx: Context) -> Iterator[Case]:
    """10 matmuls: NumPy vs the framework, dispatch vs time-to-result."""
    n = ctx.pick(quick=64, cpu=512, gpu=1000)
    k = K if not ctx.quick else 3
    d = ctx.dev
    host = np.random.default_rng(0).random((n, n), dtype=np.float32)
    ref = host.astype(np.float64) @ host.astype(np.float64)
    x = md.asarray(host, device=d, backend=ctx.backend)
    params = {"n": n, "matmuls": k, "device": str(d), "dtype": "float32"}
    np_run = run_k(np.matmul, k)
    if ctx.native is None:
        return
    run = run_k(ctx.native.mm(d), k)
    wait = ctx.native_call("wait", x)

    def check() -> tuple[bool, str]:
        y = run(x)
        md.synchronize(y)
        ok1, d1 = close(y, ref, rtol=tolerance(ctx.precision), device=d)
        ok2, d2 = close(np_run(host), ref, rtol=1e-4)
        return ok1 and ok2, f"framework {d1}; numpy {d2}"

    variants: dict[str, Variant | None] = {
        "numpy": Variant(np_run, (host,), label=f"{k}x np.matmul (host)"),
        "md": Variant(run, (x,), finish=md.synchronize, label=f"{k}x matmul; md.synchronize(y)"),
    }
    if wait is not None:
        def native_wait(y: Any) -> None:
            fn, a, _ = ctx.native.call("wait", y)
            fn(*a)
        variants["native"] = Variant(run, (x,), finish=native_wait, label=f"{k}x matmul; {wait.label}")
    yield Case(f"{k} matmuls {n}², time to result [{d}]", variants, devices=[d], check=check,
               params=params, group="time to result")
    yield Case(f"{k} matmuls {n}², dispatch only [{d}]",
               {"framework": Variant(run, (x,), sync=False, label=f"{k}x matmul, clock stopped before any wait")},
               devices=[d], check=check, params=params, ratio=None, group="dispatch")
