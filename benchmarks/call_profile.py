"""Where the time of a thin call goes: each md call against its native call (interleaved rounds,
median per call), then a cProfile of the md call (its functions by own time). For the rows of
the GPU table that miss their ratio: ``convert`` torch->JAX, small uploads, ``synchronize``.

    python3 -m multidev.benchmarks.call_profile [--rows convert,asarray,sync] [--rounds N] [--out F]

Rows whose framework or GPU is missing are left out (and said so).
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import multidev as md

Row = tuple[str, Callable[[], Any], Callable[[], Any], Callable[[], Any]]  # name, md, native, settle


def _torch_gpu() -> Any:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU")
    return torch


def _upload(torch: Any, a: np.ndarray, d: Any) -> Any:
    return torch.from_numpy(a).to(d)


def _rows(which: set[str]) -> Iterator[Row | str]:
    if "convert" in which:
        try:
            torch = _torch_gpu()
            import jax.dlpack

            for mib in (1, 64):
                t = torch.ones(mib << 18, device="cuda:0")
                md.convert(t, "jax").block_until_ready()
                yield (f"convert torch->jax {mib} MiB", functools.partial(md.convert, t, "jax"),
                       functools.partial(jax.dlpack.from_dlpack, t), torch.cuda.synchronize)
        except Exception as e:  # noqa: BLE001 - the row is left out, and said so
            yield f"convert: {type(e).__name__}: {e}"
    if "asarray" in which:
        try:
            torch = _torch_gpu()
            d = torch.device("cuda:0")
            for mib in (1, 4):
                a = np.ones(mib << 18, np.float32)
                yield (f"asarray numpy->torch gpu {mib} MiB",
                       functools.partial(md.asarray, a, device="gpu:0", backend="torch"),
                       functools.partial(_upload, torch, a, d), torch.cuda.synchronize)
        except Exception as e:  # noqa: BLE001
            yield f"asarray: {type(e).__name__}: {e}"
    if "sync" in which:
        try:
            torch = _torch_gpu()
            dev = md.Device("gpu", 0)
            yield ("torch synchronize(device)", lambda: md.synchronize(dev), lambda: torch.cuda.synchronize(0),
                   lambda: None)
        except Exception as e:  # noqa: BLE001
            yield f"torch sync: {type(e).__name__}: {e}"
        try:
            import jax

            g = [d for d in jax.devices() if d.platform == "gpu"]
            if not g:
                raise RuntimeError("JAX sees no GPU")
            x = jax.device_put(np.ones(4, np.float32), g[0])
            md.synchronize(x)
            yield ("jax synchronize(x)", lambda: md.synchronize(x), x.block_until_ready, lambda: None)
        except Exception as e:  # noqa: BLE001
            yield f"jax sync: {type(e).__name__}: {e}"
        try:
            import cupy

            y = cupy.ones(4)
            cd = cupy.cuda.Device(0)
            dev = md.Device("gpu", 0)
            md.synchronize(y)
            yield ("cupy synchronize(x)", lambda: md.synchronize(y), y.device.synchronize, lambda: None)
            yield ("cupy synchronize(device)", lambda: md.synchronize(dev), cd.synchronize, lambda: None)
            yield ("cupy synchronize(device, backend=)", lambda: md.synchronize(dev, backend="cupy"),
                   cd.synchronize, lambda: None)
        except Exception as e:  # noqa: BLE001
            yield f"cupy sync: {type(e).__name__}: {e}"


def _per_call(fn: Callable[[], Any], settle: Callable[[], Any], n: int) -> float:
    settle()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    settle()
    return (time.perf_counter() - t0) / n


def _profile(fn: Callable[[], Any], n: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    return s.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rows", default="convert,asarray,sync")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    results = []
    for row in _rows(set(args.rows.split(","))):
        if isinstance(row, str):
            print("left out:", row)
            continue
        name, mdf, nat, settle = row
        mdf(), nat()  # warm-up
        settle()
        n = 1
        while _per_call(nat, settle, n) * n < 2e-3 and n < 1 << 16:
            n *= 2
        samples: dict[str, list[float]] = {"md": [], "native": []}
        for r in range(args.rounds):
            order = [("md", mdf), ("native", nat)] if r % 2 == 0 else [("native", nat), ("md", mdf)]
            for k, f in order:
                samples[k].append(_per_call(f, settle, n))
        m, v = statistics.median(samples["md"]), statistics.median(samples["native"])
        prof = _profile(mdf, max(200, n * 4))
        print(f"\n== {name}: md {m * 1e6:.2f} us, native {v * 1e6:.2f} us, ratio {m / v:.2f} (x{n} per sample)")
        print("\n".join(prof.splitlines()[:40]))
        results.append({"row": name, "md_s": m, "native_s": v, "ratio": m / v, "inner": n,
                         "samples": samples, "profile": prof})
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"rows": results, "versions": {"multidev": md.__version__}}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
