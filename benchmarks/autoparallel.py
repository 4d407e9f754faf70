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

from . import Case, Context, Variant, all_ok, benchmark, close
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


def _sync_on(d: md.Device) -> Callable[[Any], None]:
    return lambda _r: md.synchronize(d)


@benchmark("autoparallel", precision=True)
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

    def run_to_host(x: Any) -> Any:
        return md.to_host(runs[src](x), non_blocking=True)  # one Transfer for the whole list

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

    def run_copy_md(x: Any) -> list[Any]:
        if same:
            return [md_put(t) for t in runs[src](x)]
        return [md.to(t, dst, non_blocking=True) for t in runs[src](x)]  # Transfer handles

    def land(r: list[Any]) -> list[Any]:
        out = [t.wait() if isinstance(t, md.Transfer) else t for t in r]
        md.synchronize(backend=ctx.backend)
        return out

    def run_copy_native(x: Any) -> list[Any]:
        return [nat_put_async(t) for t in runs[src](x)]

    def check_overlap() -> tuple[bool, str]:
        a = land(run_copy_md(xs[src]))
        checks = [close(a[-1], refs[src], rtol=tol, device=dst)]
        if has_to_host:
            checks.append(close(run_to_host(xs[src]).wait()[-1], refs[src], rtol=tol))
        return all_ok(*checks)

    yield Case(f"run(x) on {src} + overlapped {what}",
               {"md": Variant(run_copy_md, (xs[src],), finish=land,
                              label="[md.to(y, host, non_blocking=True) for y in run(x)]; wait each"),
                "md_to_host": (Variant(run_to_host, (xs[src],), finish=lambda t: t.wait(),
                                       label="md.to_host(run(x), non_blocking=True).wait()") if has_to_host else None),
                "native": Variant(run_copy_native, (xs[src],), finish=native_waiter(ctx, [src, dst]),
                                  label="[y.to(host, non_blocking=True) for y in run(x)]; native wait")},
               devices=[src, dst] if not same else [src], check=check_overlap, params=cp, bytes=nbytes,
               group="run + overlapped copy", key="run + overlapped copy to host")
