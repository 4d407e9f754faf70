"""multidev's own time per ``dist.allreduce`` call, without the collective: the engine's primitive is
replaced by one that is already complete (torch's ``all_reduce`` returns a finished work, MPI's
``Iallreduce`` a request whose ``Test()`` is True), so what is left is multidev's Python, free of the
network's noise. Four rows, each a best-of-15 mean over blocks of 2,000 calls, run in turn:

- ``md``: ``dist.allreduce(x, inplace=True)`` of 1,024 float32 values (checks off; ``CHECKS=1`` on,
  which in a one-process world still runs the record's exchange);
- ``md_out``: ``dist.allreduce(x)``, the same out of place (the result in new memory);
- ``engine``: the engine's own primitive, its timeout-bounded wait and its result, as the core calls
  them (:meth:`Engine.allreduce`, ``Handle.wait``, ``Handle.result``);
- ``stub``: the stubbed call as the engine's floor row makes it (torch: ``all_reduce(async_op=True)``
  then ``wait(timeout=...)``; MPI: ``Iallreduce`` then ``Test()``).

``md - stub`` is what multidev adds to a call; a real collective adds its own time to every row alike.
Run in a one-process world of the engine (nothing to wait for)::

    python -m multidev.distributed.launch -n 1 --engine torch scripts/bench/percall_stub.py
    python -m multidev.distributed.launch -n 1 --engine mpi scripts/bench/percall_stub.py

``--profile`` prints a cProfile of the ``md`` row (30 functions by own time).
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
from datetime import timedelta
from typing import Any

import numpy as np

from multidev import distributed as dist
from multidev.distributed.group import current


def _torch_rows(g: Any) -> tuple[Any, Any]:
    import torch
    import torch.distributed as tdist

    class Finished:
        def wait(self, timeout: Any = None) -> bool:
            return True

        def is_completed(self) -> bool:
            return True

    done = Finished()

    def all_reduce(t: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        return done if async_op else None

    tdist.all_reduce = all_reduce  # (the engine reads it from the module at each call)
    x = torch.ones(1024)
    limit = timedelta(seconds=300)
    return x, lambda: all_reduce(x, op=tdist.ReduceOp.SUM, group=None, async_op=True).wait(timeout=limit)


def _mpi_rows(g: Any) -> tuple[Any, Any]:
    class Request:
        def Test(self) -> bool:
            return True

    req = Request()
    comm = g.engine.comm

    class Comm:
        def __getattr__(self, name: str) -> Any:
            return getattr(comm, name)

        def Iallreduce(self, *args: Any) -> Any:
            return req

    stub = Comm()
    g.engine.comm = stub
    x = np.ones(1024, np.float32)
    MPI = g.engine.MPI

    def floor() -> None:
        r = stub.Iallreduce(MPI.IN_PLACE, [x, MPI.FLOAT], MPI.SUM)
        while not r.Test():
            pass
    return x, floor


def stubbed(script: str) -> tuple[Any, str, Any, Any, Any]:
    """The group started (``CHECKS=1``: checked) in a one-process world, its engine's primitive
    stubbed: ``(group, engine name, x, the engine row, the stub row)``; SystemExit naming ``script``
    where the world or the engine is not one this stubs."""
    dist.init()
    dist.set_checks(os.environ.get("CHECKS", "0") == "1")
    g = current()
    if g.world_size != 1:
        raise SystemExit(f"{script} runs in a one-process world (launch -n 1): the stub answers at once")
    name = dist.engine_name()
    if name == "torch":
        x, stub = _torch_rows(g)
    elif name == "mpi":
        x, stub = _mpi_rows(g)
    else:
        raise SystemExit(f"{script} stubs the torch and mpi engines' primitives, not {name}'s")

    def engine() -> Any:
        h = g.engine.allreduce(x, "sum")
        h.wait(g.timeout)
        return h.result()
    return g, name, x, engine, stub


def main() -> None:
    g, name, x, engine, stub = stubbed("percall_stub.py")
    rows = {"md": lambda: dist.allreduce(x, inplace=True), "md_out": lambda: dist.allreduce(x), "engine": engine,
            "stub": stub}
    best = {k: float("inf") for k in rows}
    for _ in range(15):
        for k, f in rows.items():
            t = time.perf_counter()
            for _ in range(2000):
                f()
            best[k] = min(best[k], (time.perf_counter() - t) / 2000 * 1e6)
    checks = "on" if g.check else "off"
    print(f"{name} engine, checks {checks}, 1,024 float32 in place, best of 15 blocks of 2,000 calls (us a call): "
          + ", ".join(f"{k} {v:.2f}" for k, v in best.items())
          + f"; multidev adds {best['md'] - best['stub']:.2f} us, the engine's wrapper "
          f"{best['engine'] - best['stub']:.2f} of them", flush=True)
    if "--profile" in sys.argv:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20000):
            rows["md"]()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
        print(s.getvalue())
    dist.shutdown()


if __name__ == "__main__":
    main()
