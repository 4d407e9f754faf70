"""Suite ``collectives``: allreduce (per algorithm, out of place and in place), broadcast, allgather
and reduce_scatter over a size sweep and the device counts available, as nccl-tests reports them.

``size`` is the bytes of one device's input for allreduce, broadcast and reduce_scatter, and of one
device's *output* for allgather (each device contributes size/n), as in nccl-tests. algbw =
size / time; busbw = algbw x 2(n-1)/n (allreduce), x (n-1)/n (allgather, reduce_scatter), x 1
(broadcast). The native row is the adapter's framework path (``native_allreduce``: NCCL, psum,
kvstore) called directly, where the backend advertises one; broadcast's native row is the
framework's own copy to each device in a loop.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

import multidev as md
import multidev.collectives as mc

from . import Case, Context, KiB, MiB, Variant, all_ok, benchmark, close, fmt_bytes


def _devices(ctx: Context) -> list[md.Device]:
    g = ctx.gpus
    return g if len(g) >= 2 else ctx.cpus


def _counts(n: int) -> list[int]:
    out, c = [], 2
    while c <= n:
        out.append(c)
        c *= 2
    if n >= 2 and n not in out:
        out.append(n)
    return out


def _sizes(ctx: Context) -> list[int]:
    return ctx.pick(quick=[4 * KiB, 64 * KiB], cpu=[4 * KiB, 256 * KiB, 4 * MiB, 16 * MiB],
                    gpu=[4 * KiB, 256 * KiB, 4 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB])


def _inputs(ctx: Context, devs: list[md.Device], elems: int, seed: int) -> tuple[list[Any], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    hs = [rng.random(elems, dtype=np.float32) for _ in devs]
    return [md.asarray(h, device=d, backend=ctx.backend) for h, d in zip(hs, devs)], hs


def _skip(ctx: Context, what: str) -> Case:
    return Case(f"{what}: needs 2 devices", {}, params={"skipped": f"{ctx.backend} has "
                f"{len(_devices(ctx))} device(s) of one kind here; set MULTIDEV_*_CPU_DEVICES"}, ratio=None)


def _check_all(outs: list[Any], ref: np.ndarray, devs: Sequence[md.Device | None], rtol: float = 1e-5
               ) -> tuple[bool, str]:
    if len(outs) != len(devs):
        return False, f"{len(outs)} results for {len(devs)} devices"
    return all_ok(*[close(o, ref, rtol=rtol, device=d) for o, d in zip(outs, devs)])


@benchmark("collectives")
def allreduce(ctx: Context) -> Iterator[Case]:
    """md.allreduce(sum) per algorithm, out of place and in place, against the native path."""
    all_devs = _devices(ctx)
    if len(all_devs) < 2:
        yield _skip(ctx, "allreduce")
        return
    b = ctx.b
    has_native = "allreduce" in b.capabilities.native_collectives
    algs = [a for a in getattr(mc, "ALGORITHMS", ("naive",)) if a not in ("auto", "native")]
    if has_native:
        algs.append("native")
    for n in _counts(len(all_devs)):
        devs = all_devs[:n]
        for size in _sizes(ctx):
            elems = size // 4
            xs, hs = _inputs(ctx, devs, elems, seed=n)
            ref = np.sum([h.astype(np.float64) for h in hs], axis=0)
            bufs = [md.zeros((elems,), device=d, backend=ctx.backend) for d in devs] if b.capabilities.mutable else None
            native = (Variant(b.native_allreduce, (xs, "sum"), label="adapter.native_allreduce(xs, 'sum')")
                      if has_native else None)
            # the framework's own collective on preallocated buffers (NCCL for torch), and D2L's recipe
            bound = ctx.native_call("allreduce_framework", [md.copy(x) for x in xs])
            book = ctx.native_call("allreduce_d2l", [md.copy(x) for x in xs])
            for alg in algs:
                def check(alg: str = alg, xs: list[Any] = xs, ref: np.ndarray = ref, devs: list[md.Device] = devs
                          ) -> tuple[bool, str]:
                    checks = [_check_all(md.allreduce(xs, "sum", algorithm=alg), ref, devs)]
                    if b.capabilities.mutable:
                        ys = [md.copy(x) for x in xs]
                        out = md.allreduce(ys, "sum", algorithm=alg, inplace=True)
                        checks.append((all(o is y for o, y in zip(out, ys)), "in place returns its inputs"))
                        checks.append(_check_all(ys, ref, devs))
                    if has_native:
                        checks.append(_check_all(b.native_allreduce(xs, "sum"), ref, devs))
                    return all_ok(*checks)

                variants: dict[str, Variant | None] = {
                    "md": Variant(partial(md.allreduce, xs, "sum", algorithm=alg), (),
                                  label=f"md.allreduce(xs, algorithm='{alg}')"),
                    "md_inplace": (Variant(partial(md.allreduce, bufs, "sum", algorithm=alg, inplace=True), (),
                                           label=f"md.allreduce(bufs, algorithm='{alg}', inplace=True)")
                                   if bufs is not None else None),
                    "native": native,
                    "bound": bound,
                    "book": book,
                }
                yield Case(f"allreduce {alg} n={n} {fmt_bytes(size)}", variants, devices=devs, check=check,
                           params={"op": "sum", "algorithm": alg, "n": n, "size": size, "dtype": "float32"},
                           bytes=size, busbw_factor=2 * (n - 1) / n, group=f"allreduce {alg}")


@benchmark("collectives")
def broadcast(ctx: Context) -> Iterator[Case]:
    """md.broadcast(x, devices) against the framework's own copy to each device."""
    if not hasattr(md, "broadcast"):
        return
    all_devs = _devices(ctx)
    if len(all_devs) < 2:
        yield _skip(ctx, "broadcast")
        return
    for n in _counts(len(all_devs)):
        devs = all_devs[:n]
        for size in _sizes(ctx):
            (x,), (h,) = _inputs(ctx, devs[:1], size // 4, seed=7)
            native = None
            if ctx.native is not None:
                calls = [ctx.native.call("copy" if d == devs[0] else "to", x, d) for d in devs]

                def loop(calls: list[Any] = calls) -> list[Any]:
                    return [fn(*a) for fn, a, _ in calls]
                native = Variant(loop, (), label="[copy/to(x, d) for d in devices] (framework calls)")

            def check(x: Any = x, h: np.ndarray = h, devs: list[md.Device] = devs, native: Any = native
                      ) -> tuple[bool, str]:
                checks = [_check_all(md.broadcast(x, devs), h, devs)]
                if native is not None:
                    checks.append(_check_all(native.fn(), h, [ctx.ndev(d) for d in devs]))
                return all_ok(*checks)

            yield Case(f"broadcast n={n} {fmt_bytes(size)}",
                       {"md": Variant(md.broadcast, (x, devs), label="md.broadcast(x, devices)"), "native": native},
                       devices=devs, check=check, params={"n": n, "size": size, "dtype": "float32"},
                       bytes=size, busbw_factor=1.0, group="broadcast")


@benchmark("collectives")
def allgather(ctx: Context) -> Iterator[Case]:
    """md.allgather(pieces): every device gets the concatenation (size = output bytes)."""
    if not hasattr(md, "allgather"):
        return
    all_devs = _devices(ctx)
    if len(all_devs) < 2:
        yield _skip(ctx, "allgather")
        return
    for n in _counts(len(all_devs)):
        devs = all_devs[:n]
        for size in _sizes(ctx):
            xs, hs = _inputs(ctx, devs, size // 4 // n, seed=11)
            ref = np.concatenate(hs)

            def check(xs: list[Any] = xs, ref: np.ndarray = ref, devs: list[md.Device] = devs) -> tuple[bool, str]:
                return _check_all(md.allgather(xs), ref, devs)

            yield Case(f"allgather n={n} {fmt_bytes(size)}",
                       {"md": Variant(md.allgather, (xs,), label="md.allgather(xs)"), "native": None},
                       devices=devs, check=check, params={"n": n, "size": size, "dtype": "float32"},
                       bytes=size, busbw_factor=(n - 1) / n, ratio=None, group="allgather")


@benchmark("collectives")
def reduce_scatter(ctx: Context) -> Iterator[Case]:
    """md.reduce_scatter(xs, 'sum'): device i gets piece i of the sum (size = input bytes)."""
    if not hasattr(md, "reduce_scatter"):
        return
    all_devs = _devices(ctx)
    if len(all_devs) < 2:
        yield _skip(ctx, "reduce_scatter")
        return
    for n in _counts(len(all_devs)):
        devs = all_devs[:n]
        for size in _sizes(ctx):
            xs, hs = _inputs(ctx, devs, size // 4, seed=13)
            ref = np.sum([h.astype(np.float64) for h in hs], axis=0)
            pieces = np.array_split(ref, n)

            def check(xs: list[Any] = xs, pieces: list[np.ndarray] = pieces, devs: list[md.Device] = devs
                      ) -> tuple[bool, str]:
                out = md.reduce_scatter(xs, "sum")
                if len(out) != len(devs):
                    return False, f"{len(out)} pieces for {len(devs)} devices"
                return all_ok(*[close(o, p, device=d) for o, p, d in zip(out, pieces, devs)])

            yield Case(f"reduce_scatter n={n} {fmt_bytes(size)}",
                       {"md": Variant(md.reduce_scatter, (xs, "sum"), label="md.reduce_scatter(xs, 'sum')"),
                        "native": None},
                       devices=devs, check=check, params={"n": n, "size": size, "dtype": "float32"},
                       bytes=size, busbw_factor=(n - 1) / n, ratio=None, group="reduce_scatter")
