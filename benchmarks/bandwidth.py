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

import numpy as np

import multidev as md

from . import Case, Context, MiB, Variant, benchmark, close, fmt_bytes


def sizes(ctx: Context) -> list[int]:
    return ctx.pick(quick=[64 << 10, 1 * MiB], cpu=[1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB],
                    gpu=[1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB])


def _d2d_target(ctx: Context) -> md.Device:
    d = ctx.dev
    same_kind = [e for e in ctx.devices if e.kind == d.kind and e != d]
    return same_kind[0] if same_kind else d


@benchmark("bandwidth")
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

        yield Case(f"H2D host->{d} {fmt_bytes(nbytes)}",
                   {"md": Variant(partial(md.asarray, a, device=d, backend=ctx.backend), (),
                                  label="md.asarray(a, device=d)"), "native": nat,
                    "native_pinned": ctx.native_call("h2d_pinned", a, d)},
                   devices=[d], check=check,
                   params={"src": "host", "dst": str(d), "size": nbytes, "note": f"host->{d}"},
                   bytes=nbytes, group="H2D", key=f"H2D {fmt_bytes(nbytes)}")


@benchmark("bandwidth")
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
                    "native": nat, "native_pinned": ctx.native_call("d2h_pinned", x)},
                   devices=[d], check=check,
                   params={"src": str(d), "dst": "host", "size": nbytes, "zero_copy_possible": not d.is_gpu,
                           "note": f"{d}->host" + ("" if d.is_gpu else " (may be a view)")},
                   bytes=nbytes, group="D2H", key=f"D2H {fmt_bytes(nbytes)}")


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

        yield Case(f"D2D {d}->{d2} {fmt_bytes(nbytes)}", {"md": mdv, "native": nat},
                   devices=[d] if same else [d, d2], check=check,
                   params={"src": str(d), "dst": str(d2), "size": nbytes, "same_device": same,
                           "note": f"{d}->{d2}" + (" (same device)" if same else "")},
                   bytes=nbytes, group="D2D", key=f"D2D {fmt_bytes(nbytes)}")


@benchmark("bandwidth")
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

            yield Case(f"convert {ctx.backend}->{other} {d} {fmt_bytes(nbytes)}",
                       {"md": Variant(partial(md.convert, x, other, copy=False), (),
                                      label=f"md.convert(x, '{other}', copy=False)")},
                       devices=[d], check=check, ratio=None,
                       params={"src": ctx.backend, "dst": other, "size": nbytes, "device": str(d)},
                       group=f"convert->{other}", key=f"convert->{other} {fmt_bytes(nbytes)}")
