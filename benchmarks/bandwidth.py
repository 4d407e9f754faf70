"""Suite ``bandwidth``: host-to-device, device-to-host and device-to-device copies, 1 MiB to 1 GiB
(1 to 64 MiB on CPU-only machines, where "device" is the framework's CPU device and D2D goes
cpu:0 -> cpu:1 where the backend has two CPU devices, else is a same-device copy).

GB/s are 10^9 bytes of payload per second. Host buffers are ordinary (pageable) NumPy arrays; on
CUDA the ``native_pinned`` rows show the framework's best case, from or into a pinned host buffer
allocated beforehand.
On CPU, ``to_numpy`` and the native D2H may return a view (zero-copy): those rows then time the
view, not a copy, and say so in their params.
"""
from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np

import multidev as md

from . import Case, Context, GiB, Goal, MiB, Variant, benchmark, close, fmt_bytes
from .baseline import native_for

#: Pageable uploads: at least 18 GB/s and 2.5x the framework's own upload at 1 GiB (staged through
#: pinned memory), and no slower than the framework's own at 1 MiB (below the staging threshold).
H2D_GOALS = (
    Goal("pageable H2D at 1 GiB", "H2D", 18.0, metric="GBps", gpu_only=True, min_bytes=GiB),
    Goal("pageable H2D vs native at 1 GiB", "H2D", 2.5, metric="GBps_ratio", den=("native",), gpu_only=True,
         min_bytes=GiB),
    Goal("pageable H2D vs native at 1 MiB", "H2D", 1.1, den=("native",), gpu_only=True, max_bytes=MiB,
         note="no slower than native (10% for noise)"),
)
#: Host copies at PCIe speed: within 10% of the framework's best (a preallocated pinned buffer), and
#: at least 45 GB/s at 1 GiB.
D2H_GOALS = (
    Goal("D2H at pinned speed", "D2H", 0.9, metric="GBps_ratio", den=("native_pinned",), gpu_only=True,
         min_bytes=64 * MiB),
    Goal("D2H at 1 GiB", "D2H", 45.0, metric="GBps", gpu_only=True, min_bytes=GiB),
)
#: convert is a thin call over the consumer's own from_dlpack.
CONVERT_GOALS = (Goal("convert vs the native DLPack call", "convert", 1.3, gpu_only=True),)


def sizes(ctx: Context) -> list[int]:
    """1 MiB to 1 GiB on a GPU, to 64 MiB on a CPU (up to ``--max-bytes``)."""
    return ctx.sweep(ctx.pick(quick=[64 << 10, 1 * MiB], cpu=[1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB],
                              gpu=[1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB])) or [MiB]


def _d2d_target(ctx: Context) -> md.Device:
    d = ctx.dev
    same_kind = [e for e in ctx.devices if e.kind == d.kind and e != d]
    return same_kind[0] if same_kind else d


@benchmark("bandwidth", goals=H2D_GOALS)
def h2d(ctx: Context) -> Iterator[Case]:
    """NumPy array -> device: md.asarray(a, device=d) against the framework's own upload."""
    d = ctx.dev
    for nbytes in sizes(ctx):
        a = np.random.default_rng(1).random(nbytes // 4, dtype=np.float32)
        nat = ctx.native_call("h2d", a, d)

        def check(a: np.ndarray = a, nat: Variant | None = nat) -> tuple[bool, str]:
            ok, det = close(md.asarray(a, device=d, backend=ctx.backend), a, rtol=0, atol=0, device=d)
            if nat is not None:
                ok2, det2 = close(nat.fn(*nat.args), a, rtol=0, atol=0, device=ctx.ndev(d))
                ok, det = ok and ok2, f"md {det}; native {det2}"
            return ok, det

        xc = md.asarray(a, device=ctx.host, backend=ctx.backend) if d.is_gpu else None
        yield Case(f"H2D host->{d} {fmt_bytes(nbytes)}",
                   {"md": Variant(partial(md.asarray, a, device=d, backend=ctx.backend), (),
                                  label="md.asarray(a, device=d)"), "native": nat,
                    "md_to": (Variant(md.to, (xc, d), label="md.to(x_cpu, d) (a CPU tensor of the backend)")
                              if xc is not None else None),
                    "native_pinned": ctx.native_call("h2d_pinned", a, d)},
                   devices=[d], check=check,
                   params={"src": "host", "dst": str(d), "size": nbytes, "note": f"host->{d}"},
                   bytes=nbytes, group="H2D", key=f"H2D {fmt_bytes(nbytes)}")


@benchmark("bandwidth", goals=D2H_GOALS)
def d2h(ctx: Context) -> Iterator[Case]:
    """Device -> NumPy: md.to_numpy(x) against the framework's own download."""
    d = ctx.dev
    for nbytes in sizes(ctx):
        a = np.random.default_rng(2).random(nbytes // 4, dtype=np.float32)
        x = md.asarray(a, device=d, backend=ctx.backend)
        nat = ctx.native_call("d2h", x)

        def check(x: object = x, a: np.ndarray = a, nat: Variant | None = nat) -> tuple[bool, str]:
            ok, det = close(md.to_numpy(x), a, rtol=0, atol=0)
            if hasattr(md, "to_host"):
                ok3, det3 = close(md.to_host([x])[0], a, rtol=0, atol=0)
                ok, det = ok and ok3, det if ok3 else f"to_host {det3}"
            if nat is not None:
                ok2, det2 = close(np.asarray(nat.fn(*nat.args)), a, rtol=0, atol=0)
                ok, det = ok and ok2, f"md {det}; native {det2}"
            return ok, det

        to_host = Variant(lambda t: md.to_host([t])[0], (x,),
                          label="md.to_host([x])[0] (pinned where the backend has it)")
        yield Case(f"D2H {d}->host {fmt_bytes(nbytes)}",
                   {"md": Variant(md.to_numpy, (x,), label="md.to_numpy(x)"), "md_to_host": to_host,
                    "md_to": (Variant(md.to, (x, ctx.host), label="md.to(x, 'cpu') (a CPU tensor of the backend)")
                              if d.is_gpu else None),
                    "native": nat, "native_pinned": ctx.native_call("d2h_pinned", x)},
                   devices=[d], check=check,
                   params={"src": str(d), "dst": "host", "size": nbytes, "zero_copy_possible": not d.is_gpu,
                           "note": f"{d}->host" + ("" if d.is_gpu else " (may be a view)")},
                   bytes=nbytes, group="D2H", key=f"D2H {fmt_bytes(nbytes)}")


def _aliases(x: Any, v: Variant) -> bool:
    """Whether ``v``'s result shares ``x``'s host memory (a move between virtual CPU devices that
    relabels instead of copying, as TF's logical CPU devices do): such a row times no copy."""
    try:
        y = v.fn(*v.args)
        return bool(np.shares_memory(np.asarray(md.to_numpy(y)), np.asarray(md.to_numpy(x))))
    except Exception:  # noqa: BLE001 - a probe only: the row's check reports real failures
        return False


@benchmark("bandwidth")
def d2d(ctx: Context) -> Iterator[Case]:
    """Device -> device: md.to(x, d2) (md.copy on one device) against the framework's copy."""
    d, d2 = ctx.dev, _d2d_target(ctx)
    same = d == d2
    for nbytes in sizes(ctx):
        a = np.random.default_rng(3).random(nbytes // 4, dtype=np.float32)
        x = md.asarray(a, device=d, backend=ctx.backend)
        if same:
            mdv = Variant(md.copy, (x, d2), label="md.copy(x, d)")
            nat = ctx.native_call("copy", x, d2)
        else:
            mdv = Variant(md.to, (x, d2), label="md.to(x, d2)")
            nat = ctx.native_call("to", x, d2)

        def check(x: object = x, a: np.ndarray = a, nat: Variant | None = nat, mdv: Variant = mdv
                  ) -> tuple[bool, str]:
            y = mdv.fn(*mdv.args)
            ok, det = close(y, a, rtol=0, atol=0, device=d2)
            if y is x:
                ok, det = False, "md returned its input: no copy was made"
            if nat is not None:
                ok2, det2 = close(nat.fn(*nat.args), a, rtol=0, atol=0, device=ctx.ndev(d2))
                ok, det = ok and ok2, f"md {det}; native {det2}"
            return ok, det

        alias = _aliases(x, mdv) if not d.is_gpu else False  # (TF's logical CPUs share one buffer)
        yield Case(f"D2D {d}->{d2} {fmt_bytes(nbytes)}", {"md": mdv, "native": nat},
                   devices=[d] if same else [d, d2], check=check,
                   params={"src": str(d), "dst": str(d2), "size": nbytes, "same_device": same,
                           "zero_copy_possible": alias,
                           "note": f"{d}->{d2}" + (" (same device)" if same else "")
                           + (" (the move aliases: no copy)" if alias else "")},
                   bytes=nbytes, group="D2D", key=f"D2D {fmt_bytes(nbytes)}")


@benchmark("bandwidth", goals=CONVERT_GOALS)
def convert(ctx: Context) -> Iterator[Case]:
    """md.convert(x, other backend) against size: zero-copy through DLPack, so flat in size. The
    'native' side is the consumer framework's own from_dlpack on the same tensor."""
    d = ctx.dev
    partners = [n for n in md.backends() if n != ctx.backend and d in md.devices(backend=n)]
    for other in partners[:2]:
        for nbytes in sizes(ctx):
            a = np.random.default_rng(4).random(nbytes // 4, dtype=np.float32)
            x = md.asarray(a, device=d, backend=ctx.backend)

            def check(x: object = x, a: np.ndarray = a, other: str = other) -> tuple[bool, str]:
                return close(md.convert(x, other, copy=False), a, rtol=0, atol=0, device=d)

            consumer = native_for(md.backend(other))
            nat = None
            if consumer is not None and ctx.native is not None:
                spec = consumer.call("from_dlpack", x)
                export = ctx.native.call("export_dlpack", x)  # for tensors without __dlpack__
                if spec is not None and export is not None:
                    imp, (exp, exp_args, exp_label) = spec[0], export

                    def native(imp: Any = imp, exp: Any = exp, exp_args: tuple = exp_args) -> Any:
                        return imp(exp(*exp_args))
                    nat = Variant(native, (), label=spec[2].replace("(x)", f"({exp_label})"))
                elif spec is not None:
                    nat = Variant(spec[0], spec[1], label=spec[2])
            yield Case(f"convert {ctx.backend}->{other} {d} {fmt_bytes(nbytes)}",
                       {"md": Variant(partial(md.convert, x, other), (), label=f"md.convert(x, '{other}')"),
                        "native": nat},
                       devices=[d], check=check, ratio=("md", "native") if nat is not None else None,
                       params={"src": ctx.backend, "dst": other, "size": nbytes, "device": str(d)},
                       group="convert", key=f"convert->{other} {fmt_bytes(nbytes)}")


@benchmark("staging")
def h2d_staging(ctx: Context) -> Iterator[Case]:
    """The staging plan of pageable uploads (chunk size, buffers in flight, threads) against size:
    the measurement the adapter's defaults come from. Adapters with a ``staging`` plan, on a GPU."""
    from multidev.adapter import StagingPlan

    b = ctx.b
    if not ctx.gpus or not hasattr(b, "staging"):
        yield Case("H2D staging plans: needs a GPU backend with a staging plan", {},
                   params={"skipped": "no GPU, or the adapter stages no uploads"}, ratio=None)
        return
    d = ctx.gpus[0]
    plans = [StagingPlan(chunk=c * MiB, depth=k, threads=t, threshold=0)
             for c in (8, 16, 32, 64) for k in (2, 3) for t in (4, 8)]
    for nbytes in ctx.pick(quick=[MiB], cpu=[MiB], gpu=[4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, GiB]):
        a = np.random.default_rng(5).random(nbytes // 4, dtype=np.float32)
        for plan in plans:
            def up(a: np.ndarray = a, plan: StagingPlan = plan) -> object:
                saved, b.staging = b.staging, plan
                try:
                    return md.asarray(a, device=d, backend=ctx.backend)
                finally:
                    b.staging = saved
            def check(up: Any = up, a: np.ndarray = a) -> tuple[bool, str]:
                return close(up(), a, rtol=0, atol=0, device=d)

            yield Case(f"H2D staged {fmt_bytes(nbytes)} {plan!r}",
                       {"md": Variant(up, ()), "native": ctx.native_call("h2d", a, d)}, devices=[d], check=check,
                       params={"size": nbytes, "chunk": plan.chunk, "depth": plan.depth, "threads": plan.threads},
                       bytes=nbytes, group="H2D staging", key=f"H2D staged {fmt_bytes(nbytes)} {plan!r}")
