"""Suite ``collectives``: the scaling study of the one-process collectives. Every collective, every
allreduce algorithm, out of place and in place, against the framework's own collective and the
memory-bandwidth bound measured in the same run, over sizes from 4 KiB (in steps of 4, up to
``--max-bytes``; 16 MiB on a CPU by default, 1 GiB on GPUs) and 2, 4, 8 ... devices (as many as the
backend has: ``--cpu-devices N`` gives N virtual CPU devices).

``size`` is the bytes of one device's input for allreduce, broadcast and reduce_scatter, and of one
device's *output* for allgather (each device contributes size/n), as in nccl-tests. algbw =
size / time; busbw = algbw x 2(n-1)/n (allreduce), x (n-1)/n (allgather, reduce_scatter), x 1
(broadcast).

An allreduce row holds every algorithm as a variant (``alg:naive``, ``alg:ring``, ``alg:tree``,
``alg:native`` where the adapter has a native path), the same in place (``inplace:*``, mutable
backends), ``auto`` (what :func:`multidev.collectives.choose_algorithm` picks, named in the row's
params), and ``framework_own``: the framework's own collective called directly (``jax.lax.psum`` under
``shard_map``, TF's ``CollectiveReduceV2``, MXNet's KVStore, NCCL; ``op_allreduce_framework`` of the
baselines).

The bound (``rec["bound"]``): the least memory traffic the collective needs, in copies of ``size``,
each at the time of the row's ``memcpy`` variant (a preallocated host copy, sampled alternately with
the others, so the machine's load hits both alike). Where every device shares one memory (virtual CPU
devices), allreduce must read the ``n`` inputs once and write the ``n`` results once (each result is
a buffer of its own; in place, the inputs): ``n`` copies of ``size``, the traffic of one copy of
``n x size`` bytes, which is what the row's ``memcpy`` times (its working set is the allreduce's: a
copy of ``size`` repeated ``n`` times would stay in the cache where the allreduce's buffers do not).
Broadcast makes ``n`` copies; allgather writes ``n`` outputs of ``size`` (n copies); reduce_scatter
reads ``n`` inputs and writes one ``size`` in pieces ((n+1)/2 copies). The runner takes the better of
the row's memcpy and the run's memcpy table (one thread and every core), so on a machine of many cores
the bound is that of a copy on every core. On GPUs the bound is not this one (links, not one memory):
rows there carry none.

Stability: every allreduce row of shared memory reports ``auto / memcpy`` as its ratio, so the
runner's pair check (:func:`multidev.benchmarks.report.stability`) marks a row UNSTABLE where that
ratio varies between alternating samples, besides a variant's own spread and the machine's load.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

import multidev as md
import multidev.collectives as mc

from . import Case, Context, GiB, Goal, KiB, MiB, Variant, all_ok, benchmark, close, fmt_bytes

#: The study's goals (judged on every row; ``multidev bench --check`` fails on a miss).
ALLREDUCE_GOALS = (
    Goal("allreduce at the memcpy bound from 1 MiB", "allreduce", 0.8, metric="bound_ratio", den=("alg:*",),
         min_bytes=MiB, note="the best algorithm's time within 1/0.8 of the bound: n copies of the size"),
    Goal("allreduce in place at the memcpy bound from 1 MiB", "allreduce", 0.8, metric="bound_ratio",
         den=("inplace:*",), min_bytes=MiB, note="the best algorithm in place within 1/0.8 of the bound"),
    Goal("auto within 1.1x of the best algorithm", "allreduce", 1.1, metric="time_ratio_best", num="auto",
         den=("alg:*",)),
    Goal("native within 1.05x of the framework's own", "allreduce", 1.05, num="alg:native", den=("framework_own",)),
    *(Goal(f"in place no slower than out of place ({a})", "allreduce", 1.0, num=f"inplace:{a}",
           den=(f"alg:{a}",), note="in place allocates nothing: it exists to be cheaper")
      for a in ("naive", "ring", "tree", "native")),
)
OTHER_GOALS = {name: (Goal(f"{name} at the memcpy bound from 16 MiB", name, 0.8, metric="bound_ratio", den=("md",),
                           min_bytes=16 * MiB),) for name in ("broadcast", "allgather", "reduce_scatter")}


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


def sizes(ctx: Context) -> list[int]:
    """4 KiB, 16 KiB, ... in steps of 4 up to ``--max-bytes`` (default 16 MiB on CPUs, 1 GiB on GPUs;
    64 KiB with --quick)."""
    top = ctx.max_bytes or ctx.pick(quick=64 * KiB, cpu=16 * MiB, gpu=GiB)
    out, n = [], 4 * KiB
    while n <= top:
        out.append(n)
        n *= 4
    return out


def _shared_memory(devs: Sequence[md.Device]) -> bool:
    """Whether the devices share one memory (virtual CPU devices): the bound below applies."""
    return all(not d.is_gpu for d in devs)


def _inputs(ctx: Context, devs: list[md.Device], elems: int, seed: int) -> tuple[list[Any], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    hs = [rng.random(elems, dtype=np.float32) for _ in devs]
    return [md.asarray(h, device=d, backend=ctx.backend) for h, d in zip(hs, devs)], hs


def _skip(ctx: Context, what: str) -> Case:
    return Case(f"{what}: needs 2 devices", {}, params={"skipped": f"{ctx.backend} has "
                f"{len(_devices(ctx))} device(s) of one kind here; set MULTIDEV_*_CPU_DEVICES or --cpu-devices"},
                ratio=None)


def _landed(r: Any) -> None:
    """Wait for a collective's results (a list, or a framework's global array): the clock stops when
    they are computed; the runner waits for the devices after it (``Variant(sync=False)``), so a
    device-wide wait (JAX's scans every live array) is not counted as the collective's time."""
    for t in r if isinstance(r, (list, tuple)) else [r]:
        md.synchronize(t)


def _timed(fn: Any, args: tuple = (), label: str = "") -> Variant:
    return Variant(fn, args, finish=_landed, sync=False, label=label)


def _memcpy(size: int) -> Variant:
    """The bound's unit, timed beside the row's variants (so load on the machine hits it alike): a
    copy of ``size`` bytes between two preallocated host arrays (allreduce: ``n x size``)."""
    src = np.ones(max(1, size // 8), np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    return Variant(np.copyto, (dst, src), label=f"np.copyto of {fmt_bytes(size)}, preallocated (the bound's unit)")


def _check_all(outs: Any, ref: np.ndarray, devs: Sequence[md.Device | None], rtol: float = 1e-5
               ) -> tuple[bool, str]:
    if isinstance(outs, (list, tuple)):
        if len(outs) != len(devs):
            return False, f"{len(outs)} results for {len(devs)} devices"
        return all_ok(*[close(o, ref, rtol=rtol, device=d) for o, d in zip(outs, devs)])
    return close(outs, np.concatenate([ref] * len(devs)), rtol=rtol)  # a framework's global array


@benchmark("collectives", goals=ALLREDUCE_GOALS)
def allreduce(ctx: Context) -> Iterator[Case]:
    """md.allreduce(sum): every algorithm, in place and not, auto, against the framework's own."""
    all_devs = _devices(ctx)
    if len(all_devs) < 2:
        yield _skip(ctx, "allreduce")
        return
    b = ctx.b
    has_native = b.collectives is not None
    algs = [a for a in mc.ALGORITHMS if a not in ("auto", "native")] + (["native"] if has_native else [])
    mutable = b.capabilities.mutable
    for n in _counts(len(all_devs)):
        devs = all_devs[:n]
        for size in sizes(ctx):
            elems = size // 4
            xs, hs = _inputs(ctx, devs, elems, seed=n)
            ref = np.sum([h.astype(np.float64) for h in hs], axis=0)
            bufs = [md.copy(x) for x in xs] if mutable else None
            framework = ctx.native_call("allreduce_framework", [md.copy(x) for x in xs])
            choice = mc.choose_algorithm(b, (elems,), "float32", devs)

            def check(xs: list[Any] = xs, ref: np.ndarray = ref, devs: list[md.Device] = devs,
                      framework: Variant | None = framework) -> tuple[bool, str]:
                checks = []
                for alg in [*algs, "auto"]:
                    checks.append(_check_all(md.allreduce(xs, "sum", algorithm=alg), ref, devs))
                    if mutable and alg != "auto":
                        ys = [md.copy(x) for x in xs]
                        out = md.allreduce(ys, "sum", algorithm=alg, inplace=True)
                        checks.append((all(o is y for o, y in zip(out, ys)), "in place returns its inputs"))
                        checks.append(_check_all(ys, ref, devs))
                if framework is not None and not mutable:  # (mutable: it reduces its buffers in place)
                    # values only: where a framework's own collective leaves its results is its own
                    # business (TF labels a tf.function's outputs CPU:0)
                    checks.append(_check_all(framework.fn(*framework.args), ref, [None] * len(devs)))
                return all_ok(*checks)

            variants: dict[str, Variant | None] = {}
            for alg in algs:
                variants[f"alg:{alg}"] = _timed(partial(md.allreduce, xs, "sum", algorithm=alg),
                                                label=f"md.allreduce(xs, algorithm='{alg}')")
                if bufs is not None:
                    variants[f"inplace:{alg}"] = _timed(partial(md.allreduce, bufs, "sum", algorithm=alg, inplace=True),
                                                        label=f"md.allreduce(bufs, algorithm='{alg}', inplace=True)")
            variants["auto"] = _timed(partial(md.allreduce, xs, "sum"), label=f"md.allreduce(xs) (auto: {choice} here)")
            variants["framework_own"] = (_timed(framework.fn, framework.args, framework.label)
                                     if framework is not None else None)
            shared = _shared_memory(devs)
            if shared:
                variants["memcpy"] = _memcpy(n * size)
            yield Case(f"allreduce n={n} {fmt_bytes(size)}", variants, devices=devs, check=check,
                       params={"op": "sum", "n": n, "size": size, "dtype": "float32", "algorithms": algs,
                               "auto_choice": choice},
                       bytes=size, busbw_factor=2 * (n - 1) / n, group="allreduce",
                       ratio=("alg:native", "framework_own") if has_native and framework is not None else
                       ("auto", "memcpy") if shared else None,
                       bound_copies=1.0 if shared else None, bound_bytes=n * size if shared else None)


@benchmark("collectives", goals=OTHER_GOALS["broadcast"])
def broadcast(ctx: Context) -> Iterator[Case]:
    """md.broadcast(x, devices) against the framework's own copy to each device."""
    all_devs = _devices(ctx)
    if len(all_devs) < 2:
        yield _skip(ctx, "broadcast")
        return
    for n in _counts(len(all_devs)):
        devs = all_devs[:n]
        for size in sizes(ctx):
            (x,), (h,) = _inputs(ctx, devs[:1], size // 4, seed=7)
            native = None
            if ctx.native is not None:
                # a new buffer on every device, as md.broadcast makes ("to" may alias: TF's logical CPUs)
                calls = [ctx.native.call("copy", x, d) for d in devs]

                def loop(calls: list[Any] = calls) -> list[Any]:
                    return [fn(*a) for fn, a, _ in calls]
                native = _timed(loop, label="[copy(x, d) for d in devices] (framework calls)")

            def check(x: Any = x, h: np.ndarray = h, devs: list[md.Device] = devs, native: Any = native
                      ) -> tuple[bool, str]:
                checks = [_check_all(md.broadcast(x, devs), h, devs)]
                if native is not None:
                    checks.append(_check_all(native.fn(), h, [ctx.ndev(d) for d in devs]))
                return all_ok(*checks)

            yield Case(f"broadcast n={n} {fmt_bytes(size)}",
                       {"md": _timed(md.broadcast, (x, devs), "md.broadcast(x, devices)"), "native": native,
                        "memcpy": _memcpy(size) if _shared_memory(devs) else None},
                       devices=devs, check=check, params={"n": n, "size": size, "dtype": "float32"},
                       bytes=size, busbw_factor=1.0, group="broadcast",
                       bound_copies=float(n) if _shared_memory(devs) else None)


@benchmark("collectives", goals=OTHER_GOALS["allgather"])
def allgather(ctx: Context) -> Iterator[Case]:
    """md.allgather(pieces): every device gets the concatenation (size = output bytes)."""
    all_devs = _devices(ctx)
    if len(all_devs) < 2:
        yield _skip(ctx, "allgather")
        return
    for n in _counts(len(all_devs)):
        devs = all_devs[:n]
        for size in sizes(ctx):
            xs, hs = _inputs(ctx, devs, size // 4 // n, seed=11)
            ref = np.concatenate(hs)

            def check(xs: list[Any] = xs, ref: np.ndarray = ref, devs: list[md.Device] = devs) -> tuple[bool, str]:
                return _check_all(md.allgather(xs), ref, devs)

            yield Case(f"allgather n={n} {fmt_bytes(size)}",
                       {"md": _timed(md.allgather, (xs,), "md.allgather(xs)"), "native": None,
                        "memcpy": _memcpy(size) if _shared_memory(devs) else None},
                       devices=devs, check=check, params={"n": n, "size": size, "dtype": "float32"},
                       bytes=size, busbw_factor=(n - 1) / n, ratio=None, group="allgather",
                       bound_copies=float(n) if _shared_memory(devs) else None)


@benchmark("collectives", goals=OTHER_GOALS["reduce_scatter"])
def reduce_scatter(ctx: Context) -> Iterator[Case]:
    """md.reduce_scatter(xs, 'sum'): device i gets piece i of the sum (size = input bytes)."""
    all_devs = _devices(ctx)
    if len(all_devs) < 2:
        yield _skip(ctx, "reduce_scatter")
        return
    for n in _counts(len(all_devs)):
        devs = all_devs[:n]
        for size in sizes(ctx):
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
                       {"md": _timed(md.reduce_scatter, (xs, "sum"), "md.reduce_scatter(xs, 'sum')"),
                        "native": None, "memcpy": _memcpy(size) if _shared_memory(devs) else None},
                       devices=devs, check=check, params={"n": n, "size": size, "dtype": "float32"},
                       bytes=size, busbw_factor=(n - 1) / n, ratio=None, group="reduce_scatter",
                       bound_copies=(n + 1) / 2 if _shared_memory(devs) else None)
