"""Where the time of a small pageable upload goes (the torch 1 MiB row that missed its goal on the
H200; the figures are in benchmarks/results/). Each layer of md's path is timed on its own,
against the backend's native baseline: ``md.asarray`` (validation + adapter), the adapter's
``asarray`` alone, ``md.to`` of a CPU tensor made beforehand, and the baseline's ``h2d``. The
variants are interleaved round by round (each round reverses the order, so none always runs
first), every call followed by a synchronize of the GPU. Prints a table; ``--out`` writes JSON.

    python3 -m multidev.benchmarks.h2d_breakdown --backend B [--sizes 1,4,16] (MiB) [--rounds N]
        [--device D] [--out F]
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import multidev as md

from .baseline import native_for


def _variants(name: str, a: np.ndarray, dev: md.Device) -> dict[str, Callable[[], Any]]:
    b = md.backend(name)
    host = md.asarray(a, device="cpu:0", backend=name)
    out: dict[str, Callable[[], Any]] = {
        "md.asarray(a, device=d)": lambda: md.asarray(a, device=dev, backend=name),
        "adapter asarray(a, 'float32', d)": lambda: b.asarray(a, "float32", dev),
        "md.to(x_cpu, d)": lambda: md.to(host, dev),
    }
    nat = native_for(b)
    for op, args in (("h2d", (a, dev)), ("to", (host, dev))):
        c = nat.call(op, *args) if nat is not None else None
        if c is not None:
            out[f"native {c[2]}"] = functools.partial(c[0], *c[1])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--backend", required=True)
    p.add_argument("--sizes", default="1,4,16")
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--device", default=None, help="the target (default: the backend's first GPU)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    gpus = [d for d in md.devices(backend=args.backend) if d.is_gpu]
    if args.device is None and not gpus:
        print(f"h2d_breakdown: {args.backend} has no GPU here (pass --device to time another device)")
        return 2
    dev = md.device(args.device) if args.device else gpus[0]
    rows = []
    for mib in (int(s) for s in args.sizes.split(",")):
        a = np.random.default_rng(1).random((mib << 20) // 4, dtype=np.float32)
        vs = _variants(args.backend, a, dev)
        samples: dict[str, list[float]] = {k: [] for k in vs}
        for fn in vs.values():  # warm-up: allocators, first-call costs
            for _ in range(5):
                fn()
        md.synchronize(dev, backend=args.backend)
        for r in range(args.rounds):
            order = list(vs.items())[:: -1 if r % 2 else 1]
            for label, fn in order:
                t0 = time.perf_counter()
                fn()
                md.synchronize(dev, backend=args.backend)
                samples[label].append(time.perf_counter() - t0)
        for label, s in samples.items():
            q = statistics.quantiles(s, n=4)
            rows.append({"MiB": mib, "variant": label, "median_us": statistics.median(s) * 1e6,
                         "iqr_us": (q[2] - q[0]) * 1e6, "rounds": args.rounds})
            print(f"{mib:4d} MiB  {label:60s} {rows[-1]['median_us']:9.1f} µs  (IQR {rows[-1]['iqr_us']:.1f})")
    if args.out:
        b = md.backend(args.backend)
        with open(args.out, "w") as f:
            json.dump({"backend": args.backend, "version": b.version(), "device": str(dev), "rows": rows}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
