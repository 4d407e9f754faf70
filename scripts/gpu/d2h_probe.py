"""CuPy D2H at 64 MiB through md.to_numpy: each route alone, kept or dropped, interleaved with the
bench's other variants (the H200 bench rows read 13.8 and 32 ms, against 1.3 ms for md.to)."""
import time

import cupy as cp
import numpy as np

import multidev as md

pool = cp.get_default_pinned_memory_pool()


def times(fn, x, n=8, keep=False, between=None):
    ts, held = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        y = fn(x)
        ts.append((time.perf_counter() - t0) * 1e3)
        held = y if keep else None
        del y
        if between is not None:
            between(x)
    del held
    return " ".join(f"{t:.2f}" for t in ts)


routes = {"md.to_numpy": md.to_numpy, "md.to(cpu)": lambda t: md.to(t, "cpu:0"),
          "md.to_host": lambda t: md.to_host([t])[0], "x.get()": lambda t: t.get()}
pinned = {}


def native_pinned(t):
    out = pinned.get(t.nbytes)
    if out is None:
        out = pinned[t.nbytes] = cp.cuda.alloc_pinned_memory(t.nbytes)
    a = np.frombuffer(out, t.dtype, t.size)
    t.get(out=a)
    return a


routes["native pinned"] = native_pinned
for mib in (16, 64, 256):
    x = cp.ones(mib * 2**18, cp.float32)
    cp.cuda.Device().synchronize()
    for name, fn in routes.items():
        print(f"{mib:4d} MiB {name:14s} dropped: {times(fn, x)} ms | free blocks {pool.n_free_blocks()}")
    print(f"{mib:4d} MiB md.to_numpy kept:    {times(md.to_numpy, x, keep=True)}")
    print(f"{mib:4d} MiB md.to_numpy with x.get() between: {times(md.to_numpy, x, between=lambda t: t.get())}")
    print(f"{mib:4d} MiB md.to_numpy with md.to between: {times(md.to_numpy, x, between=lambda t: md.to(t, 'cpu:0'))}")
