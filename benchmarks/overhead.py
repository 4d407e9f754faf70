"""Suite ``overhead``: what multidev's own Python costs on calls that should cost nothing.

Per device (the primary device, and cpu:0 beside a GPU): no-op ``to`` (P1), ``device_of``,
``synchronize`` on an idle device (P2) and on an idle tensor, creation of a small tensor.
"""
from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np

import multidev as md

from . import Case, Context, Goal, Variant, all_ok, benchmark, close

N = 1000  # elements of the small tensor every row uses

#: P1: a no-op placement costs at most 1.5x the framework's own (much less where the framework's
#: own call does real work, as jax.device_put does).
TO_GOALS = (Goal("P1 no-op to", "to no-op", 1.5), Goal("P1 no-op to (str spec)", "to no-op (str)", 1.5))
#: P2: waiting on an idle device or tensor costs at most 1.2x (1.3x for a tensor) the native wait,
#: on accelerators (on CPUs the native waits are no-ops of tens of nanoseconds).
#: Each row also times the floor of any Python layer: the native call inside one Python function
#: ("floor"); md / floor shows what md adds beyond that frame.
SYNC_GOALS = (Goal("P2 synchronize(device)", "synchronize(device)", 1.2, gpu_only=True),
              Goal("P2 synchronize(device, backend=)", "synchronize(device, backend)", 1.2, gpu_only=True),
              Goal("P2 synchronize(x)", "synchronize(x)", 1.3, gpu_only=True),
              Goal("P2 synchronize(x) vs one Python frame", "synchronize(x)", 1.3, gpu_only=True,
                   den=("floor",), note="md / (the native call inside one Python function)"),
              Goal("P2 synchronize(device) vs one Python frame", "synchronize(device)", 1.3, gpu_only=True,
                   den=("floor",), note="md / (the native call inside one Python function)"))


#: Every thin call at native cost: at most 1.3x the framework's own call, or at most 0.3 µs above it
#: where that is more (a ratio means little against a native call of 60 ns), on every device.
THIN_SLACK_S = 0.3e-6
THIN_GOALS = tuple(Goal(f"thin call: {g}", g, 1.3, slack_s=THIN_SLACK_S, note="1.3x native or 0.3 µs above")
                   for g in ("to no-op", "to no-op (str)", "device_of", "dtype_of", "synchronize(device)",
                             "synchronize(device, backend)", "synchronize(x)", "creation")) + (
    # creation's native call is C bound to its arguments (functools.partial): one Python frame with
    # md.zeros's keyword arguments alone costs about 0.3 µs there, so the floor is shown beside it
    Goal("thin call: creation vs one Python frame", "creation", 1.3, slack_s=THIN_SLACK_S, den=("floor",),
         note="md / (the native call inside one Python function): 1.3x or 0.3 µs above"),)


def _framed(v: Variant | None) -> dict[str, Variant]:
    """The floor variant of a row: native ``v`` called from one Python function."""
    if v is None:
        return {}
    fn = v.fn

    def one_frame(*args: Any) -> Any:
        return fn(*args)
    return {"floor": Variant(one_frame, v.args, label=f"def f(*a): return ({v.label})(*a)")}


def _devices(ctx: Context) -> list[md.Device]:
    devs = [ctx.dev]
    if ctx.dev != ctx.host and ctx.host in ctx.devices:
        devs.append(ctx.host)
    return devs


@benchmark("overhead", goals=TO_GOALS + THIN_GOALS[:2])
def to_noop(ctx: Context) -> Iterator[Case]:
    """md.to(x, its own device) against the framework's own no-op placement call."""
    ref = np.ones(N, np.float32)
    for d in _devices(ctx):
        x = md.ones((N,), device=d, backend=ctx.backend)
        native = ctx.native_call("to", x, d)

        def check(x=x, d=d, native=native) -> tuple[bool, str]:
            same = md.to(x, d) is x
            checks = [(same, "md.to returns x itself" if same else "md.to copied a tensor already there"),
                      close(md.to(x, str(d)), ref, device=d)]
            if native is not None:
                checks.append(close(native.fn(*native.args), ref, device=ctx.ndev(d)))
            return all_ok(*checks)

        yield Case(f"to(x, Device) no-op [{d}]",
                   {"md": Variant(md.to, (x, d), label="md.to(x, device)"), "native": native},
                   devices=[d], check=check, params={"device": str(d), "elements": N}, group="to no-op")
        yield Case(f"to(x, '{d}') no-op, str spec [{d}]",
                   {"md": Variant(md.to, (x, str(d)), label=f"md.to(x, '{d}')"), "native": native},
                   devices=[d], check=check, params={"device": str(d), "elements": N}, group="to no-op (str)")


@benchmark("overhead", goals=THIN_GOALS[2:4])
def device_of(ctx: Context) -> Iterator[Case]:
    """md.device_of(x) against the framework's device attribute."""
    for d in _devices(ctx):
        x = md.ones((N,), device=d, backend=ctx.backend)
        native = ctx.native_call("device_of", x)

        def check(x=x, d=d, native=native) -> tuple[bool, str]:
            got = md.device_of(x)
            ok = got == d
            detail = f"md.device_of -> {got}"
            if native is not None:
                nd = md.device(native.fn(*native.args))
                ok = ok and nd == d
                detail += f", native -> {nd}"
            return ok, detail

        yield Case(f"device_of(x) [{d}]", {"md": Variant(md.device_of, (x,), label="md.device_of(x)"),
                                           "native": native},
                   devices=[d], check=check, params={"device": str(d)}, group="device_of")
        nd = ctx.native_call("dtype_of", x)

        def check_dtype(x: Any = x) -> tuple[bool, str]:
            return md.dtype_of(x) == "float32", f"md.dtype_of -> {md.dtype_of(x)}"

        yield Case(f"dtype_of(x) [{d}]", {"md": Variant(md.dtype_of, (x,), label="md.dtype_of(x)"), "native": nd},
                   devices=[d], check=check_dtype, params={"device": str(d)}, group="dtype_of")


@benchmark("overhead", goals=SYNC_GOALS + THIN_GOALS[4:7])
def synchronize(ctx: Context) -> Iterator[Case]:
    """md.synchronize(device) / md.synchronize(x) on idle work, against the native wait."""
    for d in _devices(ctx):
        x = md.ones((N,), device=d, backend=ctx.backend)
        md.synchronize(x)

        def check(x: Any = x, d: md.Device = d) -> tuple[bool, str]:
            md.synchronize(d, backend=ctx.backend)
            return close(x, np.ones(N))

        nat = ctx.native_call("sync", d, x)
        yield Case(f"synchronize(device) idle [{d}]",
                   {"md": Variant(md.synchronize, (d,), label="md.synchronize(device)"), "native": nat,
                    **_framed(nat)},
                   devices=[d], check=check, params={"device": str(d)}, group="synchronize(device)")
        yield Case(f"synchronize(device, backend=) idle [{d}]",
                   {"md": Variant(partial(md.synchronize, d, backend=ctx.backend), (),
                                  label="md.synchronize(device, backend=name)"), "native": nat},
                   devices=[d], check=check, params={"device": str(d)}, group="synchronize(device, backend)")
        wait = ctx.native_call("wait", x)
        yield Case(f"synchronize(x) idle tensor [{d}]",
                   {"md": Variant(md.synchronize, (x,), label="md.synchronize(x)"), "native": wait,
                    **_framed(wait)},
                   devices=[d], check=check, params={"device": str(d)}, group="synchronize(x)")


@benchmark("overhead", goals=THIN_GOALS[7:])
def creation(ctx: Context) -> Iterator[Case]:
    """md.zeros((1000,), device=d) against the framework's creation on a device."""
    for d in _devices(ctx):
        native = ctx.native_call("zeros", (N,), d)

        def check(d=d, native=native) -> tuple[bool, str]:
            checks = [close(md.zeros((N,), device=d, backend=ctx.backend), np.zeros(N), device=d)]
            if native is not None:
                checks.append(close(native.fn(*native.args), np.zeros(N), device=ctx.ndev(d)))
            return all_ok(*checks)

        yield Case(f"zeros(({N},), device) [{d}]",
                   {"md": Variant(partial(md.zeros, (N,), device=d, backend=ctx.backend), (),
                                  label="md.zeros(shape, device=d, backend=name)"), "native": native,
                    **_framed(native)},
                   devices=[d], check=check, params={"device": str(d), "elements": N}, group="creation")
