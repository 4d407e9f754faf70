"""Does a NumPy source written right after an upload returns change the uploaded result? (round 27)
For each size, ``--trials`` times: a NumPy array put on the GPU by ``jax.device_put`` (whole), by one
``device_put`` of its 16 MiB pieces' list, by ``md.asarray(..., backend="jax")`` and by ``md.to`` of
it; the source overwritten at once; the result compared with the original values afterwards.

    python scripts/gpu/put_source_probe.py [--device gpu:0] [--trials 5] [--sizes-mib 1,4,16,32,64,256]
"""
from __future__ import annotations

import argparse

import jax
import numpy as np

import multidev as md
from multidev.adapter import split_pieces

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="gpu:0")
ap.add_argument("--trials", type=int, default=5)
ap.add_argument("--sizes-mib", default="1,4,16,32,64,256")
args = ap.parse_args()
target = md.device(args.device)
dst = md.backend("jax").to_native_device(target)
ways = {
    "device_put whole": lambda a: jax.device_put(a, dst),
    "device_put of 16 MiB pieces": lambda a: jax.device_put(split_pieces(a, 16 << 20), dst),
    "md.asarray": lambda a: md.asarray(a, device=target, backend="jax"),
}
for mib in (int(v) for v in args.sizes_mib.split(",")):
    want = np.random.default_rng(mib).random((mib << 20) // 4, dtype=np.float32)
    for name, put in ways.items():
        changed = 0
        for _ in range(args.trials):
            a = want.copy()
            y = put(a)
            a[:] = -1.0  # (at once, as a caller reusing its buffer would)
            got = np.concatenate([np.asarray(p) for p in y]) if isinstance(y, list) else np.asarray(y)
            changed += not np.array_equal(got, want)
        print(f"{mib} MiB, {name}: result changed by the later write in {changed} of {args.trials}", flush=True)
