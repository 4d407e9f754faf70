"""Where the one-process NumPy allreduce's time goes on a many-core host (issue 36's "fraction of the
bound" row): in-place ``md.allreduce`` of ``n`` float32 buffers on NumPy's virtual devices against
(a) the bound, one preallocated copy of ``n x size`` bytes cut over every core, and (b) the same
reduction written by hand with NumPy over every core (one contiguous part per thread: the inputs
summed into the first result's part, copied into the others), for the block sizes of multidev's
loop given by ``--blocks``. Medians of alternating rounds, ms and the fraction bound / time.

    MULTIDEV_HOST_THREADS=16 python scripts/bench/numpy_allreduce_probe.py --n 8 --mib 16 --blocks 256,1024,4096
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--blocks", default="256,1024,4096", help="multidev's block sizes to try, KiB")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    os.environ.setdefault("MULTIDEV_NUMPY_DEVICES", str(a.n))
    import multidev as md
    from multidev.adapters import numpy as npad
    from multidev.hostthreads import threads

    cores = len(os.sched_getaffinity(0))
    pool = ThreadPoolExecutor(cores)
    elems = (a.mib << 20) // 4
    devs = md.devices(backend="numpy")[: a.n]
    rng = np.random.default_rng(0)
    bufs = [md.asarray(rng.random(elems, dtype=np.float32), device=d, backend="numpy") for d in devs]
    plain = [np.asarray(b).view(np.ndarray) for b in bufs]
    src = np.ones(a.n * elems // 2, np.float64)
    dst = np.empty_like(src)
    step = -(-src.size // cores)

    def bound() -> None:
        list(pool.map(lambda lo: np.copyto(dst[lo:lo + step], src[lo:lo + step]), range(0, src.size, step)))

    part = -(-elems // cores)

    def by_hand() -> None:
        def one(lo: int) -> None:
            hi = min(elems, lo + part)
            acc = plain[0][lo:hi]
            for x in plain[1:]:
                np.add(acc, x[lo:hi], out=acc)
            for x in plain[1:]:
                x[lo:hi] = acc
        list(pool.map(one, range(0, elems, part)))

    fns = {"bound: copy on every core": bound, "by hand over every core": by_hand}
    for kib in (int(k) for k in a.blocks.split(",")):
        def run(kib: int = kib) -> None:
            npad._BLOCK_BYTES = kib << 10
            md.allreduce(bufs, "sum", algorithm="naive", inplace=True)
        fns[f"md in place, blocks of {kib} KiB"] = run
    for f in fns.values():
        f()
        f()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(a.rounds):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t = time.perf_counter()
            fns[k]()
            samples[k].append(time.perf_counter() - t)
    b = statistics.median(samples["bound: copy on every core"])
    print(f"n={a.n} size={a.mib} MiB cores={cores} multidev host threads={threads()} rounds={a.rounds}")
    for k, v in samples.items():
        m = statistics.median(v)
        print(f"  {k:40s} {m * 1e3:8.2f} ms   fraction of the bound {b / m:5.2f}")


if __name__ == "__main__":
    main()
