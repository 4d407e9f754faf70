"""Ways to upload a pageable NumPy array to a GPU with JAX, measured side by side (the JAX row of
the pageable H2D goal: ``jax.device_put`` reads pageable memory at about 8 GB/s on an H200).

Variants, each timed until the result is ready and checked against the source:
``device_put`` (native); ``chunks xT``: the array cut into ``chunk``-byte pieces, put from ``T``
threads, joined on the device; ``pinned_host``: through JAX's pinned host memory kind (whole, or
per chunk from ``T`` threads); ``torch staged + dlpack`` (where torch has CUDA): multidev's torch
staging pipeline, then a DLPack view in JAX (a bound, not a JAX path).

    python3 -m multidev.benchmarks.baselines.jax_upload_tuning [--mib 64,1024] [--reps 3] [--platform gpu] [--out F]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np


def _variants(jax: Any, a: np.ndarray, dev: Any, pool: ThreadPoolExecutor) -> dict[str, Callable[[], Any]]:
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    flat = a.reshape(-1)
    out: dict[str, Callable[[], Any]] = {"device_put": lambda: jax.device_put(a, dev)}
    kinds = {m.kind for m in dev.addressable_memories()} if hasattr(dev, "addressable_memories") else set()
    pinned = SingleDeviceSharding(dev, memory_kind="pinned_host") if "pinned_host" in kinds else None
    ondev = SingleDeviceSharding(dev, memory_kind="device") if "device" in kinds else SingleDeviceSharding(dev)

    def pieces(chunk_bytes: int) -> list[np.ndarray]:
        step = max(1, chunk_bytes // a.itemsize)
        return [flat[i:i + step] for i in range(0, flat.size, step)]

    def chunked(chunk: int, put: Callable[[np.ndarray], Any]) -> Callable[[], Any]:
        parts = pieces(chunk)

        def run() -> Any:
            ys = list(pool.map(put, parts))
            return jnp.concatenate(ys) if len(ys) > 1 else ys[0]
        return run

    for chunk in (16 << 20, 64 << 20):
        out[f"chunks {chunk >> 20} MiB x{pool._max_workers}"] = chunked(chunk, lambda p: jax.device_put(p, dev))
    if pinned is not None:
        out["pinned_host whole"] = lambda: jax.device_put(jax.device_put(a, pinned), ondev)
        for chunk in (16 << 20, 64 << 20):
            out[f"pinned_host chunks {chunk >> 20} MiB x{pool._max_workers}"] = chunked(
                chunk, lambda p: jax.device_put(jax.device_put(p, pinned), ondev))
    try:
        import torch

        import multidev as md

        if torch.cuda.is_available() and dev.platform == "gpu":
            out["torch staged + dlpack (bound)"] = lambda: jax.dlpack.from_dlpack(
                md.asarray(a, device="gpu:0", backend="torch"))
    except ImportError:
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--mib", default="64,1024")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", default="4,8")
    ap.add_argument("--platform", default="gpu", help="gpu (default), or cpu for a dry run")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    import jax

    try:
        devs = jax.devices(args.platform)
    except RuntimeError:
        devs = []
    if not devs:
        print(f"JAX sees no {args.platform}: nothing to tune")
        return 0
    dev = devs[0]
    rows = []
    for mib in (int(s) for s in args.mib.split(",")):
        a = np.random.default_rng(0).random(mib << 18, dtype=np.float32)
        for threads in (int(s) for s in args.threads.split(",")):
            with ThreadPoolExecutor(threads) as pool:
                for name, fn in _variants(jax, a, dev, pool).items():
                    if threads != int(args.threads.split(",")[0]) and "x" not in name.split()[-1]:
                        continue  # the thread-free variants once
                    try:
                        y = fn()
                        y.block_until_ready()
                        step = max(1, a.size // 4096)
                        ok = bool(np.array_equal(np.asarray(y[::step]), a[::step]))
                        times = []
                        for _ in range(args.reps):
                            t0 = time.perf_counter()
                            fn().block_until_ready()
                            times.append(time.perf_counter() - t0)
                        t = statistics.median(times)
                        print(f"{mib:5d} MiB  {name:34s} {t * 1e3:8.2f} ms  {a.nbytes / t / 1e9:6.2f} GB/s  exact={ok}")
                        rows.append({"mib": mib, "variant": name, "median_s": t, "gbps": a.nbytes / t / 1e9,
                                     "exact": ok, "samples": times})
                    except Exception as e:  # noqa: BLE001 - a variant this JAX cannot run: said so
                        print(f"{mib:5d} MiB  {name:34s} failed: {type(e).__name__}: {str(e)[:200]}")
                        rows.append({"mib": mib, "variant": name, "error": f"{type(e).__name__}: {e}"})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"jax": jax.__version__, "device": str(dev), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
