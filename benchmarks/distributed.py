"""Suite ``distributed``: ``multidev.distributed.allreduce`` across processes against the engine's own
call in the same run, as nccl-tests reports it (busbw = algbw x 2(n-1)/n): ``torch.distributed.
all_reduce`` on the torch engine, mpi4py's ``Allreduce`` on NumPy buffers on the mpi engine, a jitted
sum over a global JAX array on the jax engine. Runs under any launcher (the runner joins the group;
rank 0 reports)::

    torchrun --nproc_per_node=2 -m multidev.benchmarks.runner --suite distributed --backend torch --json d.json
    mpiexec -n 2 python -m multidev.benchmarks.runner --suite distributed --backend numpy --json d.json
    python -m multidev.distributed.launch -n 2 --engine jax -m multidev.benchmarks.runner --suite distributed \\
        --backend jax --json d.json

Every row runs with the consistency checks off (the engine's path alone, the goal's variant ``md``)
and beside it the same call checked (variant ``md_checked``: the checks on for that call on every
rank), sampled alternately with it, so the check's cost per call (``md_checked`` less ``md``) is not
the drift between two passes minutes apart. ``python -m multidev.benchmarks.distributed_run``
runs every engine at 2 and 4 processes, with the hang-detection rows of
:mod:`multidev.benchmarks.distributed_faults`, into one report. Elsewhere every row says it needs
several processes.
"""
from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np

import multidev as md
from multidev import distributed as mdist
from multidev.distributed.group import current

from . import Case, Context, Goal, KiB, MiB, Variant, benchmark, close, fmt_bytes

GOALS = (
    Goal("distributed allreduce busbw vs the engine's own call", "dist allreduce", 0.9, metric="GBps_ratio",
         den=("native",), min_bytes=1 * MiB,
         note="checks off, from 1 MiB: multidev.distributed >= 0.9x the engine's own allreduce busbw (torch: "
              "torch.distributed.all_reduce; mpi: mpi4py Allreduce on NumPy buffers; jax: a jitted sum over a "
              "global array)"),
    Goal("distributed allreduce with the checks on vs the engine's own call", "dist allreduce", 0.8,
         metric="GBps_ratio", num="md_checked", den=("native",), min_bytes=16 * MiB,
         note="checks on, from 16 MiB: the consistency exchange (one small all-to-all per call) costs <= 20%; its "
              "cost per call at every size is md_checked's time less md's, sampled alternately"),
    Goal("hang detection time-to-error", "dist hang", 1.2, metric="time_ratio", num="time_to_error",
         den=("timeout",),
         note="a rank that never joins: the others raise DistributedTimeoutError within 1.2x the timeout "
              "(rows from multidev.benchmarks.distributed_faults)"),
)


def _sizes(ctx: Context) -> list[int]:
    return ctx.pick(quick=[4 * KiB, 1 * MiB], cpu=[4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB],
                    gpu=[4 * KiB, 1 * MiB, 16 * MiB, 256 * MiB, 1024 * MiB])


@benchmark("distributed", goals=GOALS)
def dist_allreduce(ctx: Context) -> Iterator[Case]:
    """multidev.distributed.allreduce (in place where the backend allows, as the engine's own call; out of place
    too; checks off and on) against the engine's own call."""
    if not mdist.is_initialized():
        yield Case("distributed allreduce: needs several processes", {},
                   params={"skipped": "run under a launcher (torchrun, mpiexec, JAX's variables) with N > 1"},
                   ratio=None)
        return
    engine, r, w = mdist.engine_name(), mdist.rank(), mdist.world_size()
    dev = ctx.gpus[mdist.local_rank() % len(ctx.gpus)] if ctx.gpus else ctx.host
    was = mdist.checks_enabled()
    mdist.set_checks(False)  # a collective: every rank; md_checked turns them on for its own calls
    try:
        for size in _sizes(ctx):
            elems = size // 4
            x = md.asarray(np.full(elems, r + 1, dtype=np.float32), device=dev, backend=ctx.backend)
            buf = md.copy(x)
            expect = np.full(min(4, elems), w * (w + 1) / 2)

            def check(x: object = x, expect: np.ndarray = expect) -> tuple[bool, str]:
                y = mdist.allreduce(x)
                return close(md.to_numpy(y)[:4], expect, device=None)

            native = ctx.native_call(f"dist_allreduce_{engine}", md.copy(x))
            if native is not None:
                native.inner = 1
            # the least a call that can give up on a lost peer does (where the baseline has one: MPI, torch)
            floor = ctx.native_call(f"dist_allreduce_floor_{engine}", md.copy(x))
            if floor is not None:
                floor.inner = 1
            # like with like: in place where the backend is mutable (as the engines' own calls are),
            # out of place where it is not (JAX: the jitted sum makes a new array too)
            mutable = ctx.b.capabilities.mutable
            fn, args, what = ((partial(mdist.allreduce, buf, inplace=True), (), "allreduce(x, inplace=True)")
                              if mutable else (mdist.allreduce, (x,), "allreduce(x)"))
            main = Variant(fn, args, inner=1, label=f"multidev.distributed.{what}")
            checked = Variant(partial(_checked, fn), args, inner=1,
                              label=f"multidev.distributed.{what}, the checks on for this call")
            out_of_place = (Variant(mdist.allreduce, (x,), inner=1, label="multidev.distributed.allreduce(x) "
                                    "(a new tensor: one allocation and copy more)") if mutable else None)
            yield Case(f"dist allreduce {engine} {w} processes {fmt_bytes(size)}",
                       {"md": main, "md_checked": checked, "md_out_of_place": out_of_place, "native": native,
                        "floor": floor},
                       devices=[dev], check=check, before=mdist.barrier,
                       params={"engine": engine, "transport": mdist.transport_name(), "processes": w,
                               "size": size, "dtype": "float32", "rank": r, "checks": False},
                       bytes=size, busbw_factor=2 * (w - 1) / w, group="dist allreduce",
                       key=f"dist allreduce {w} processes {fmt_bytes(size)}")
    finally:
        mdist.set_checks(was)


def _checked(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with the consistency checks on for this call alone. Every rank samples the row's
    variants in the same order and number, so every rank turns them on for the same calls (what
    :func:`multidev.distributed.set_checks` agrees on, without its exchange in the timed call)."""
    g = current()
    g.check = True
    try:
        return fn(*args)
    finally:
        g.check = False


#: The parameter shapes of D2L's LeNet (``nn.Sequential`` indices): 10 tensors, 61,706 float32 values.
LENET = (("0.weight", (6, 1, 5, 5)), ("0.bias", (6,)), ("3.weight", (16, 6, 5, 5)), ("3.bias", (16,)),
         ("7.weight", (120, 400)), ("7.bias", (120,)), ("9.weight", (84, 120)), ("9.bias", (84,)),
         ("11.weight", (10, 84)), ("11.bias", (10,)))


@benchmark("distributed")
def dist_allreduce_structure(ctx: Context) -> Iterator[Case]:
    """One multidev.distributed.allreduce of a LeNet-sized state (a dict of 10 tensors: one consistency exchange,
    one bucket) against one allreduce per tensor (10 exchanges, 10 collectives) and one of a hand-flattened tensor
    of the same values; ``native``: the engine's own call on that flat tensor. Checks on, as a user's loop runs."""
    if not mdist.is_initialized():
        yield Case("distributed allreduce of a structure: needs several processes", {},
                   params={"skipped": "run under a launcher (torchrun, mpiexec, JAX's variables) with N > 1"},
                   ratio=None)
        return
    engine, r, w = mdist.engine_name(), mdist.rank(), mdist.world_size()
    dev = ctx.gpus[mdist.local_rank() % len(ctx.gpus)] if ctx.gpus else ctx.host
    was = mdist.checks_enabled()
    mdist.set_checks(True)
    try:
        state = {k: md.asarray(np.full(shape, r + 1, dtype=np.float32), device=dev, backend=ctx.backend)
                 for k, shape in LENET}
        elems = sum(int(np.prod(shape)) for _, shape in LENET)
        flat = md.asarray(np.full(elems, r + 1, dtype=np.float32), device=dev, backend=ctx.backend)

        def per_tensor() -> dict[str, object]:
            return {k: mdist.allreduce(v) for k, v in state.items()}

        def check() -> tuple[bool, str]:
            y = mdist.allreduce(state)
            ok = list(y) == list(state) and all(
                np.array_equal(md.to_numpy(y[k]), md.to_numpy(v)) for k, v in per_tensor().items())
            return ok, "" if ok else "the structure's result differs from the per-tensor results"

        native = ctx.native_call(f"dist_allreduce_{engine}", md.copy(flat))
        if native is not None:
            native.inner = 1
        yield Case(f"dist allreduce {engine} {w} processes LeNet state (10 tensors)",
                   {"md": Variant(mdist.allreduce, (state,), inner=1, label="multidev.distributed.allreduce(state)"),
                    "md_per_tensor": Variant(per_tensor, (), inner=1,
                                             label="{k: multidev.distributed.allreduce(v) for k, v in state.items()}"),
                    "md_flat": Variant(mdist.allreduce, (flat,), inner=1,
                                       label="multidev.distributed.allreduce(flat) (flattened by hand)"),
                    "native": native},
                   devices=[dev], check=check, before=mdist.barrier,
                   params={"engine": engine, "transport": mdist.transport_name(), "processes": w, "tensors": len(LENET),
                           "size": elems * 4, "dtype": "float32", "rank": r, "checks": True},
                   bytes=elems * 4, busbw_factor=2 * (w - 1) / w, group="dist allreduce structure",
                   key=f"dist allreduce {w} processes LeNet state")
    finally:
        mdist.set_checks(was)


@benchmark("distributed")
def dist_allreduce_along(ctx: Context) -> Iterator[Case]:
    """multidev.distributed.allreduce_along over the ``model`` axis of a ``(2, n/2)`` process mesh (its record
    agreed in one consistency exchange, then the engine's subgroup collective; in place where the backend is
    mutable, and out of place beside it) against the engine's own subgroup call in place (torch: all_reduce on a
    new_subgroups_by_enumeration group; mpi: Allreduce on a Split communicator; jax: a jitted sum over the
    subgroup's devices)."""
    w = mdist.world_size() if mdist.is_initialized() else 1
    if w < 4 or w % 2:
        yield Case("distributed allreduce along a mesh axis: needs an even number of processes, 4 or more", {},
                   params={"skipped": "run under a launcher with N >= 4, N even"}, ratio=None)
        return
    engine, r = mdist.engine_name(), mdist.rank()
    dev = ctx.gpus[mdist.local_rank() % len(ctx.gpus)] if ctx.gpus else ctx.host
    pm = mdist.process_mesh((2, w // 2), ("data", "model"))
    group = pm.group_of(r, "model")
    for size in _sizes(ctx):
        elems = size // 4
        x = md.asarray(np.full(elems, r + 1, dtype=np.float32), device=dev, backend=ctx.backend)
        expect = np.full(min(4, elems), float(sum(q + 1 for q in group)))

        def check(x: object = x, expect: np.ndarray = expect) -> tuple[bool, str]:
            return close(md.to_numpy(mdist.allreduce_along(x, pm, "model"))[:4], expect, device=None)

        native = ctx.native_call(f"dist_allreduce_group_{engine}", md.copy(x), pm.groups("model"))
        if native is not None:
            native.inner = 1
        k = len(group)
        # like with like: in place where the backend is mutable (as the engines' own calls are)
        buf = md.copy(x)
        main = (Variant(partial(mdist.allreduce_along, buf, pm, "model", inplace=True), (), inner=1,
                        label="multidev.distributed.allreduce_along(x, mesh, 'model', inplace=True)")
                if ctx.b.capabilities.mutable else
                Variant(mdist.allreduce_along, (x, pm, "model"), inner=1,
                        label="multidev.distributed.allreduce_along(x, mesh, 'model')"))
        out_of_place = (Variant(mdist.allreduce_along, (x, pm, "model"), inner=1,
                                label="multidev.distributed.allreduce_along(x, mesh, 'model') (a new tensor)")
                        if ctx.b.capabilities.mutable else None)
        yield Case(f"dist allreduce_along {engine} {w} processes model axis of {k} {fmt_bytes(size)}",
                   {"md": main, "md_out_of_place": out_of_place, "native": native},
                   devices=[dev], check=check, before=mdist.barrier,
                   params={"engine": engine, "transport": mdist.transport_name(), "processes": w, "subgroup": k,
                           "size": size, "dtype": "float32", "rank": r},
                   bytes=size, busbw_factor=2 * (k - 1) / k, group="dist allreduce along",
                   key=f"dist allreduce_along {w} processes {fmt_bytes(size)}")


@benchmark("distributed")
def dist_layout(ctx: Context) -> Iterator[Case]:
    """A tensor laid out across the processes of a ``(2, n/2)`` process mesh, rows along ``data``,
    columns along ``model`` (``multidev.to(x, Layout(process_mesh, ("data", "model")))``), and gathered
    whole again (``multidev.to(y, device)``), checks off (each rank's own checks) and on (the call's record
    agreed first), against the framework's own calls where it has a sharded type for the engine: torch's
    ``distribute_tensor`` (a scatter from rank 0) and ``full_tensor``; JAX's ``broadcast_one_to_all`` (rank 0's
    tensor) then ``make_array_from_callback``, and a jitted replication. Elsewhere (NumPy under MPI) multidev's
    managed pieces, without a native row."""
    w = mdist.world_size() if mdist.is_initialized() else 1
    if w < 4 or w % 2:
        yield Case("distributed layouts: needs an even number of processes, 4 or more", {},
                   params={"skipped": "run under a launcher with N >= 4, N even"}, ratio=None)
        return
    engine, r = mdist.engine_name(), mdist.rank()
    dev = ctx.gpus[mdist.local_rank() % len(ctx.gpus)] if ctx.gpus else ctx.host
    pm = mdist.process_mesh((2, w // 2), ("data", "model"))
    lay = md.Layout(pm, ("data", "model"))
    was = mdist.checks_enabled()
    try:
        for checked in (False, True):
            mdist.set_checks(checked)  # a collective: every rank, in the same order
            for size in [s for s in _sizes(ctx) if s <= 16 * MiB]:
                cols = 256
                rows = max(2 * w, size // 4 // cols // (2 * w) * (2 * w))
                whole = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) % 1000
                x = md.asarray(whole, device=dev, backend=ctx.backend)
                place = partial(md.to, x, lay)
                y = place()

                def placed_ok(place: Any = place, whole: np.ndarray = whole) -> tuple[bool, str]:
                    return close(md.to_host(place()), whole, device=None)

                def gathered_ok(y: Any = y, whole: np.ndarray = whole) -> tuple[bool, str]:
                    return close(md.to(y, dev), whole, device=dev)

                nbytes = rows * cols * 4
                sz, label = fmt_bytes(nbytes), " checks on" if checked else ""
                params = {"engine": engine, "processes": w, "size": nbytes, "shape": [rows, cols], "rank": r,
                          "layout": "('data', 'model')", "type": type(y).__name__, "checks": checked}
                native = ctx.native_call(f"dist_place_{engine}", x, pm)
                if native is not None:
                    native.inner = 1  # (every rank the same number of calls: no per-rank calibration)
                yield Case(f"dist layout place {engine} {w} processes {sz}{label}",
                           {"md": Variant(place, (), inner=1, label="multidev.to(x, layout)"), "native": native},
                           devices=[dev], check=placed_ok, before=mdist.barrier, params=params, bytes=nbytes,
                           group="dist layout place" + (" checked" if checked else ""),
                           key=f"dist layout place {w} processes {sz}{label}")
                native = ctx.native_call(f"dist_gather_{engine}", y)
                if native is not None:
                    native.inner = 1
                yield Case(f"dist layout gather {engine} {w} processes {sz}{label}",
                           {"md": Variant(partial(md.to, y, dev), (), inner=1, label="multidev.to(sharded, device)"),
                            "native": native},
                           devices=[dev], check=gathered_ok, before=mdist.barrier, params=params, bytes=nbytes,
                           group="dist layout gather" + (" checked" if checked else ""),
                           key=f"dist layout gather {w} processes {sz}{label}")
    finally:
        mdist.set_checks(was)
