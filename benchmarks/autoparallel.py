"""Suite ``autoparallel`` (D2L "Automatic parallelism"): ``run(x)`` = 50 matmuls of x (4000² on a GPU,
scaled down on CPU devices), on device 1, device 2, both at once; then copying the 50 results to
the host, and running while copying. Devices: two GPUs where there are two; on one GPU, the GPU and
cpu:0 (the issue's "cpu plus cuda:0"); on CPU only, cpu:0 and cpu:1 where the backend has them.

The multidev variant places with ``md.to`` and waits with ``md.synchronize``; the native one uses
the framework's placement call (torch ``non_blocking=True`` for the overlapped copy, as D2L does)
and its own wait. The matmuls are the framework's in both.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import multidev as md

from . import Case, Context, Goal, Variant, all_ok, benchmark, close
from .asynchronous import tolerance


def _pair(ctx: Context) -> tuple[md.Device, md.Device | None]:
    g = ctx.gpus
    if len(g) >= 2:
        return g[0], g[1]
    if len(g) == 1:
        return g[0], (ctx.host if ctx.host in ctx.devices else None)
    c = ctx.cpus
    return c[0], (c[1] if len(c) > 1 else None)


def _size(ctx: Context, d: md.Device) -> int:
    if ctx.quick:
        return 64 if d.is_gpu else 32
    return 4000 if d.is_gpu else 256


def native_waiter(ctx: Context, devs: list[md.Device]) -> Callable[[Any], None]:
    """Wait natively for ``devs``: the framework's device sync, or (JAX) each result tensor."""
    calls: list[Any] = [None]  # JAX: its device wait (a marker) does not wait for copies off the device
    if getattr(ctx.native, "sync_waits_for_copies", True):
        calls = [ctx.native.call("sync", d) for d in devs]

    def flat(r: Any) -> list[Any]:
        if isinstance(r, (list, tuple)):
            return [t for item in r for t in flat(item)]
        return [r]

    if all(c is not None for c in calls):
        def wait_devices(_: Any) -> None:
            for fn, a, _label in calls:
                fn(*a)
        return wait_devices

    def wait_results(r: Any) -> None:
        for t in flat(r):
            fn, a, _label = ctx.native.call("wait", t)
            fn(*a)
    return wait_results


def _unless_host(wait: Callable[[Any], None]) -> Callable[[Any], None]:
    """``wait`` on results that are tensors; nothing for host NumPy arrays (already landed)."""
    def finish(r: Any) -> None:
        if not (isinstance(r, list) and all(isinstance(t, np.ndarray) for t in r)):
            wait(r)
    return finish


def _sync_on(d: md.Device) -> Callable[[Any], None]:
    return lambda _r: md.synchronize(d)


#: D2L's overlap through multidev: no slower than the larger of compute alone and the copies alone
#: (5% for dispatch), and faster than the book's recipe (one stream: compute, then copies).
OVERLAP_GOALS = (
    Goal("D2L overlap at the bound (per-result form)", "run + overlapped copy", 1.05, num="md",
         den=("compute", "copy"), gpu_only=True, note="<= 1.05x max(compute alone, copies alone)"),
    Goal("D2L overlap at the bound (iterable form)", "run + overlapped copy", 1.05, num="md_to_host",
         den=("compute", "copy"), gpu_only=True, note="<= 1.05x max(compute alone, copies alone)"),
    Goal("D2L overlap vs the book (per-result form)", "run + overlapped copy", 1.35, metric="speedup",
         num="md", den=("native",), gpu_only=True, note=">= 1.35x faster than the book's recipe"),
    Goal("D2L overlap vs the book (iterable form)", "run + overlapped copy", 1.35, metric="speedup",
         num="md_to_host", den=("native",), gpu_only=True, note=">= 1.35x faster than the book's recipe"),
)


@benchmark("autoparallel", precision=True, goals=OVERLAP_GOALS)
def d2l_autoparallel(ctx: Context) -> Iterator[Case]:
    """D2L automatic parallelism: 2 devices alone and together; run, copy to host, overlapped."""
    if ctx.native is None:
        return
    k = 4 if ctx.quick else 50
    d1, d2 = _pair(ctx)
    devs = [d1] + ([d2] if d2 is not None else [])
    rng = np.random.default_rng(0)
    xs, refs, runs = {}, {}, {}
    for d in devs:
        n = _size(ctx, d)
        h = rng.random((n, n), dtype=np.float32)
        xs[d] = md.asarray(h, device=d, backend=ctx.backend)
        refs[d] = h.astype(np.float64) @ h.astype(np.float64)
        mm = ctx.native.mm(d)
        runs[d] = (lambda x, mm=mm: [mm(x, x) for _ in range(k)])
    tol = tolerance(ctx.precision)

    def check_run(d: md.Device) -> Callable[[], tuple[bool, str]]:
        def check() -> tuple[bool, str]:
            y = runs[d](xs[d])
            md.synchronize(y[-1])
            return close(y[-1], refs[d], rtol=tol, device=d)
        return check

    params = {"matmuls": k, "sizes": {str(d): _size(ctx, d) for d in devs}, "dtype": "float32"}
    for d in devs:
        yield Case(f"run(x) on {d} ({k}× {_size(ctx, d)}²)",
                   {"md": Variant(runs[d], (xs[d],), finish=_sync_on(d),
                                  label="run(x); md.synchronize(d)"),
                    "native": Variant(runs[d], (xs[d],), finish=native_waiter(ctx, [d]),
                                      label="run(x); native wait")},
                   devices=[d], check=check_run(d),
                   params={**params, "device": str(d), "note": f"{d}, {k}x {_size(ctx, d)}²"},
                   group=f"device {devs.index(d) + 1}", key=f"device {devs.index(d) + 1}: run(x)")
    if d2 is not None:
        def both(a: Any, b: Any) -> Any:
            return runs[d1](a), runs[d2](b)
        yield Case(f"run(x) on {d1} and {d2} concurrently",
                   {"md": Variant(both, (xs[d1], xs[d2]), finish=lambda _r: md.synchronize(backend=ctx.backend),
                                  label="run(x1); run(x2); md.synchronize()"),
                    "native": Variant(both, (xs[d1], xs[d2]), finish=native_waiter(ctx, devs),
                                      label="run(x1); run(x2); native wait on both")},
                   devices=devs, check=lambda: all_ok(check_run(d1)(), check_run(d2)()),
                   params={**params, "devices": [str(d1), str(d2)], "note": f"{d1} + {d2}"}, group="both",
                   key="devices 1+2 concurrently")

    # Parallel computation and communication: results of `src` copied to the host.
    src = ctx.gpus[0] if ctx.gpus else devs[-1]
    dst = ctx.host
    same = src == dst
    y = runs[src](xs[src])
    md.synchronize(y[-1])
    ref_y = md.to_numpy(y[-1]).copy()
    md_put = (lambda t: md.copy(t, dst)) if same else (lambda t: md.to(t, dst))

    def native_copy(t: Any) -> Any:
        fn, a, _label = ctx.native.call("copy", t, dst)
        return fn(*a)
    nat_put = native_copy if same else ctx.native.mover(dst)
    nat_put_async = nat_put if same else ctx.native.mover(dst, non_blocking=True)
    what = "copy (same device)" if same else f"copy to {dst}"
    nbytes = sum(int(np.prod(md.backend_of(t).shape_of(t))) * 4 for t in y)

    has_to_host = hasattr(md, "to_host")

    def check_copy() -> tuple[bool, str]:
        a = md_put(y[-1])
        b = nat_put(y[-1])
        checks = [close(a, ref_y, device=dst), close(b, ref_y, device=ctx.ndev(dst))]
        if has_to_host:
            checks.append(close(md.to_host(y[-1:])[0], ref_y))
        return all_ok(*checks)

    cp = {**params, "src": str(src), "dst": str(dst), "tensors": k,
          "note": f"{k}x {_size(ctx, src)}² {src}->{dst}" + (" (same device: md.copy)" if same else "")}
    yield Case(f"{what}: {k} results from {src}",
               {"md": Variant(lambda ys: [md_put(t) for t in ys], (y,),
                              finish=lambda _r: md.synchronize(backend=ctx.backend),
                              label="[md.to(y, host) for y in ys]; md.synchronize()"),
                "md_to_host": (Variant(md.to_host, (y,),
                                       label="md.to_host(ys) (NumPy arrays; pinned where the backend has it)")
                               if has_to_host else None),
                "native": Variant(lambda ys: [nat_put(t) for t in ys], (y,), finish=native_waiter(ctx, [src, dst]),
                                  label="[y.to(host) for y in ys]; native wait")},
               devices=[src, dst] if not same else [src], check=check_copy, params=cp, bytes=nbytes,
               group="copy to host", key="copy results to host")

    mm_src = ctx.native.mm(src)

    def run_copy_md(x: Any) -> list[Any]:
        """The per-result form: each copy asked for right after its matmul is queued."""
        if same:
            return [md_put(mm_src(x, x)) for _ in range(k)]
        return [md.to(mm_src(x, x), dst, non_blocking=True) for _ in range(k)]  # Transfer handles

    def land(r: list[Any]) -> list[Any]:
        out = [t.wait() if isinstance(t, md.Transfer) else t for t in r]
        md.synchronize(backend=ctx.backend)
        return out

    def run_to_host(x: Any) -> Any:
        """The iterable form: a generator of results, each copy started as the generator yields it."""
        return md.to_host((mm_src(x, x) for _ in range(k)), non_blocking=True)

    def run_copy_native(x: Any) -> list[Any]:
        """The book's recipe: compute every result, then copy each (the framework's own way)."""
        ys = runs[src](x)
        book = None if same else ctx.native.call("d2h_book", ys)
        if book is not None:
            fn, a, _label = book
            return fn(*a)
        return [nat_put_async(t) for t in ys]

    def check_overlap() -> tuple[bool, str]:
        a = land(run_copy_md(xs[src]))
        checks = [close(a[-1], refs[src], rtol=tol, device=dst),
                  close(run_to_host(xs[src]).wait()[-1], refs[src], rtol=tol)]
        bound = ctx.native_call("overlap_bound", mm_src, xs[src], k)
        if bound is not None:
            checks.append(close(bound.fn(*bound.args)[-1], refs[src], rtol=tol))
        return all_ok(*checks)

    variants: dict[str, Variant | None] = {
        "md": Variant(run_copy_md, (xs[src],), finish=land,
                      label="[md.to(x @ x, host, non_blocking=True) for _ in range(k)]; wait each"),
        "md_to_host": Variant(run_to_host, (xs[src],), finish=lambda t: t.wait(),
                              label="md.to_host((x @ x for _ in range(k)), non_blocking=True).wait()"),
        "native": Variant(run_copy_native, (xs[src],), finish=_unless_host(native_waiter(ctx, [src, dst])),
                          label="the book: ys = run(x); [y.to(host, non_blocking=True) for y in ys]; native wait"),
    }
    if not same:
        # the bounds, measured in the same run: compute alone, the copies alone, and the best
        # hand-written overlap the framework allows (side stream, pinned memory, an event per result)
        variants["compute"] = Variant(runs[src], (xs[src],), finish=native_waiter(ctx, [src]),
                                      label="run(x) alone; native wait")
        alone = ctx.native_call("copy_alone", y)
        if alone is not None:
            variants["copy"] = Variant(alone.fn, alone.args, label=f"the copies alone: {alone.label}")
        bound = ctx.native_call("overlap_bound", mm_src, xs[src], k)
        if bound is not None:
            variants["bound"] = Variant(bound.fn, bound.args, label=bound.label)
    yield Case(f"run(x) on {src} + overlapped {what}", variants,
               devices=[src, dst] if not same else [src], check=check_overlap, params=cp, bytes=nbytes,
               group="run + overlapped copy", key="run + overlapped copy to host")
