"""Where md.convert's time goes beyond the native DLPack call, part by part (issue 36's JAX -> torch
row): each step convert takes on its steady route timed alone on the same arrays, in interleaved
rounds (median us per call), beside the native call and the whole convert.

    python3 scripts/gpu/convert_parts.py [--cpu]
"""
from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch

import multidev as md
from multidev import exchange
from multidev.registry import cached_owner, get_backend

ROUNDS, PER = 40, 200


def table(parts: dict[str, Callable[[], object]], sync: Callable[[], None]) -> None:
    rows: dict[str, list[float]] = {k: [] for k in parts}
    for _ in range(ROUNDS):
        for k, f in parts.items():
            t = time.perf_counter()
            for _ in range(PER):
                f()
            sync()
            rows[k].append((time.perf_counter() - t) / PER)
    for k, v in rows.items():
        print(f"  {k:42s} {statistics.median(v) * 1e6:8.2f} us")


def size(n: int, gpu: bool) -> None:
    jdev = jax.devices("gpu" if gpu else "cpu")[0]
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    src, dst = md.backend("jax"), md.backend("torch")
    x = jax.device_put(jnp.ones(n, jnp.float32), jdev)
    x.block_until_ready()
    exchange._ROUTES.clear()
    md.convert(x, "torch")
    md.convert(x, "torch")
    here, dtype = src.device_of(x), src.dtype_of(x)
    route = next(iter(exchange._ROUTES.values()))
    y = torch.from_dlpack(x)
    key = (src, dst, here, here, dtype, id(src.capabilities), id(dst.capabilities))
    print(f"jax -> torch {'gpu' if gpu else 'cpu'} {n * 4 >> 20} MiB (steady={route.steady}, host={route.host})")
    table({
        "native torch.from_dlpack(x)": lambda: torch.from_dlpack(x),
        "md.convert(x, 'torch')": lambda: md.convert(x, "torch"),
        "exchange._convert(x, 'torch', None, None)": lambda: exchange._convert(x, "torch", None, None),
        "cached_owner(type(x))": lambda: cached_owner(type(x)),
        "get_backend('torch')": lambda: get_backend("torch"),
        "jax device_of(x)": lambda: src.device_of(x),
        "jax dtype_of(x)": lambda: src.dtype_of(x),
        "jax capabilities + torch capabilities": lambda: (src.capabilities, dst.capabilities),
        "route key + lookup": lambda: exchange._ROUTES.get(key),
        "jax export_dlpack(x)": lambda: src.dlpack.export_dlpack(x),
        "torch import_dlpack(x, here)": lambda: dst.dlpack.import_dlpack(x, here),
        "torch device_of(y)": lambda: dst.device_of(y),
        "x.__dlpack_device__()": lambda: x.__dlpack_device__(),
    }, sync)


def main() -> None:
    for n in (1 << 18, 1 << 26):
        size(n, "--cpu" not in sys.argv)


if __name__ == "__main__":
    main()
