"""Where the time of a thin call goes: each md call against its native call (interleaved rounds,
median per call), then a cProfile of the md call (its functions by own time). For the rows of
the GPU table that miss their ratio: ``convert`` torch->JAX, small uploads, ``synchronize``.

    python3 -m multidev.benchmarks.baselines.call_profile [--rows thin,convert,asarray,sync,cexchange]
        [--rounds N] [--cpu] [--out F]

(``thin``: torch's device_of, dtype_of, synchronize, no-op to and zeros; ``cexchange``: DLPack's C
exchange route and the capsule route torch to torch.) Rows whose framework or GPU is missing are
left out (and said so).
"""
from __future__ import annotations

import argparse
import cProfile
import ctypes
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


def _torch(kind: str) -> Any:
    import torch

    if kind == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU")
    return torch


def _attr(x: Any, name: str) -> Callable[[], Any]:
    """``x.<name>`` as a C-level call (operator.attrgetter bound to x)."""
    import operator

    return functools.partial(operator.attrgetter(name), x)


def _upload(torch: Any, a: np.ndarray, d: Any) -> Any:
    return torch.from_numpy(a).to(d)


def _c_route(api: Any, t: Any) -> Any:
    """What convert does where both types have DLPack's C exchange API: the producer's managed
    tensor into the consumer's C import, through ctypes (torch's own table on both sides here)."""
    out = ctypes.c_void_p()
    api.from_py(t, ctypes.byref(out))
    res = ctypes.c_void_p()
    api.to_py(out.value, ctypes.byref(res))
    y = ctypes.cast(res.value or 0, ctypes.py_object).value  # the new reference C handed back is ours:
    _DECREF(res.value)  # (as multidev.exchange does)
    return y


_DECREF = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("Py_DecRef", ctypes.pythonapi))


def _capsule_route(torch: Any, t: Any) -> Any:
    """convert's route where only the consumer's import takes bare capsules: one export, the capsule in."""
    return torch.from_dlpack(t.__dlpack__(max_version=(1, 0)))


def _rows(which: set[str], kind: str) -> Iterator[Row | str]:
    """The rows on ``kind`` ("gpu", or "cpu" to try the script where there is none). Every md call
    is a C-level partial, as the native one is a bound method: no extra Python frame on either side.
    synchronize(device) is timed with ``backend=``: without it md waits on every loaded backend."""
    dev = md.Device(kind, 0)
    if "thin" in which:  # torch's thin calls and creation (the goal rows of suite overhead)
        try:
            torch = _torch(kind)
            t = torch.ones(1000, device="cuda:0" if kind == "gpu" else "cpu")
            nd = t.device
            settle = torch.cuda.synchronize if kind == "gpu" else (lambda: None)
            native_sync = (functools.partial(torch.cuda.synchronize, 0) if kind == "gpu" else torch.cpu.synchronize)
            yield (f"torch device_of(x) [{dev}]", functools.partial(md.device_of, t), _attr(t, "device"), settle)
            yield (f"torch dtype_of(x) [{dev}]", functools.partial(md.dtype_of, t), _attr(t, "dtype"), settle)
            yield (f"torch synchronize(x) [{dev}]", functools.partial(md.synchronize, t), native_sync, settle)
            yield (f"torch synchronize(device, backend=) [{dev}]",
                   functools.partial(md.synchronize, dev, backend="torch"), native_sync, settle)
            yield (f"torch to(x, device) no-op [{dev}]", functools.partial(md.to, t, dev),
                   functools.partial(t.to, nd), settle)
            yield (f"torch zeros((1000,), device) [{dev}]", functools.partial(md.zeros, (1000,), device=dev,
                                                                             backend="torch"),
                   functools.partial(torch.zeros, (1000,), dtype=torch.float32, device=nd), settle)
        except Exception as e:  # noqa: BLE001 - the rows are left out, and said so
            yield f"thin: {type(e).__name__}: {e}"
    if "convert" in which:
        try:
            torch = _torch(kind)
            import jax.dlpack

            settle = torch.cuda.synchronize if kind == "gpu" else (lambda: None)
            for mib in (1, 64):
                t = torch.ones(mib << 18, device="cuda:0" if kind == "gpu" else "cpu")
                md.convert(t, "jax").block_until_ready()
                yield (f"convert torch->jax {mib} MiB [{dev}]", functools.partial(md.convert, t, "jax"),
                       functools.partial(jax.dlpack.from_dlpack, t), settle)
        except Exception as e:  # noqa: BLE001 - the row is left out, and said so
            yield f"convert: {type(e).__name__}: {e}"
    if "cexchange" in which:
        try:
            torch = _torch(kind)
            from multidev.exchange import c_exchange_api

            api = c_exchange_api(torch.Tensor)
            if api is None or api.from_py is None or api.to_py is None:
                raise RuntimeError("this torch has no DLPack C exchange API")
            t = torch.ones(1 << 18, device="cuda:0" if kind == "gpu" else "cpu")
            settle = torch.cuda.synchronize if kind == "gpu" else (lambda: None)
            yield (f"DLPack C exchange torch->torch, 1 MiB [{dev}] (md's C route against torch.from_dlpack(t))",
                   functools.partial(_c_route, api, t), functools.partial(torch.from_dlpack, t), settle)
            yield (f"DLPack capsule route torch->torch, 1 MiB [{dev}] (md's capsule handoff against "
                   "torch.from_dlpack(t))", functools.partial(_capsule_route, torch, t),
                   functools.partial(torch.from_dlpack, t), settle)
        except Exception as e:  # noqa: BLE001 - the row is left out, and said so
            yield f"cexchange: {type(e).__name__}: {e}"
    if "asarray" in which and kind == "gpu":
        try:
            torch = _torch(kind)
            d = torch.device("cuda:0")
            for mib in (1, 4):
                a = np.ones(mib << 18, np.float32)
                yield (f"asarray numpy->torch {mib} MiB [{dev}]",
                       functools.partial(md.asarray, a, device=dev, backend="torch"),
                       functools.partial(_upload, torch, a, d), torch.cuda.synchronize)
        except Exception as e:  # noqa: BLE001
            yield f"asarray: {type(e).__name__}: {e}"
    if "sync" in which:
        if kind == "gpu":
            try:
                torch = _torch(kind)
                yield ("torch synchronize(device, backend=)", functools.partial(md.synchronize, dev, backend="torch"),
                       functools.partial(torch.cuda.synchronize, 0), lambda: None)
            except Exception as e:  # noqa: BLE001
                yield f"torch sync: {type(e).__name__}: {e}"
        try:
            import jax

            g = [d for d in jax.devices() if d.platform == kind]
            if not g:
                raise RuntimeError(f"JAX sees no {kind}")
            x = jax.device_put(np.ones(4, np.float32), g[0])
            md.synchronize(x)
            yield (f"jax synchronize(x) [{dev}]", functools.partial(md.synchronize, x), x.block_until_ready,
                   lambda: None)
        except Exception as e:  # noqa: BLE001
            yield f"jax sync: {type(e).__name__}: {e}"
        if kind == "gpu":
            try:
                import cupy

                y = cupy.ones(4)
                cd = cupy.cuda.Device(0)
                md.synchronize(y)
                yield ("cupy synchronize(x)", functools.partial(md.synchronize, y), y.device.synchronize,
                       lambda: None)
                yield ("cupy synchronize(device, backend=)", functools.partial(md.synchronize, dev, backend="cupy"),
                       cd.synchronize, lambda: None)
            except Exception as e:  # noqa: BLE001
                yield f"cupy sync: {type(e).__name__}: {e}"


def _convert_steps(n: int = 2000) -> list[dict[str, Any]]:
    """Each step of md.convert(torch CUDA tensor, "jax") and of md.convert(JAX GPU array, "torch")
    timed alone (median of 7 batches of ``n``)."""
    import jax
    import torch

    t = torch.ones(1 << 18, device="cuda:0")
    src: Any = md.backend_of(t)
    dst: Any = md.backend("jax")
    here = src.device_of(t)
    obj = src.dlpack.export_dlpack(t)
    steps: dict[str, Callable[[], Any]] = {
        "md.convert(t, 'jax')": lambda: md.convert(t, "jax"),
        "jax.dlpack.from_dlpack(t)": lambda: jax.dlpack.from_dlpack(t),
        "jax.dlpack.from_dlpack(t.detach())": lambda: jax.dlpack.from_dlpack(t.detach()),
        "dst.dlpack.import_dlpack(obj, dev)": lambda: dst.dlpack.import_dlpack(obj, here),
        "dst.dlpack._import_accelerator(obj, dev)": lambda: getattr(dst.dlpack, "_import_accelerator")(obj, here),  # noqa: B009
        "backend_of(t)": lambda: md.backend_of(t),
        "src.device_of(t)": lambda: src.device_of(t),
        "src.dlpack.export_dlpack(t)": lambda: src.dlpack.export_dlpack(t),
        "dst.capabilities.dtypes_on(dev)": lambda: dst.capabilities.dtypes_on(here),
        "here in dst.devices()": lambda: here in dst.devices(),
        "torch.cuda.current_device()": torch.cuda.current_device,
        "t.__dlpack__(stream=None)": lambda: t.__dlpack__(),
    }
    j = jax.device_put(jax.numpy.ones(1 << 18), jax.devices("gpu")[0])
    jb: Any = md.backend_of(j)
    jobj = jb.dlpack.export_dlpack(j)
    steps.update({
        "md.convert(j, 'torch')": lambda: md.convert(j, "torch"),
        "torch.from_dlpack(j)": lambda: torch.from_dlpack(j),
        "jb.dlpack.export_dlpack(j)": lambda: jb.dlpack.export_dlpack(j),
        "src.dlpack.import_dlpack(jax obj, dev)": lambda: src.dlpack.import_dlpack(jobj, here),
        "jb.device_of(j)": lambda: jb.device_of(j),
        "jb.dtype_of(j)": lambda: jb.dtype_of(j),
        "j.__dlpack__()": lambda: j.__dlpack__(),
    })
    return _time_steps(steps, n, torch.cuda.synchronize, each=False)


def _asarray_steps(n: int = 300) -> list[dict[str, Any]]:
    """Each layer of md.asarray(1 MiB NumPy array, "gpu:0", backend="torch") timed alone, every call
    followed by a synchronize (median of 7 batches of ``n``)."""
    import torch

    b = md.backend("torch")
    a = np.ones(1 << 18, np.float32)
    d = torch.device("cuda:0")
    nd = b.to_native_device(md.Device("gpu", 0))
    host = torch.from_numpy(a)
    steps: dict[str, Callable[[], Any]] = {
        "md.asarray(a, device, backend)": lambda: md.asarray(a, device="gpu:0", backend="torch"),
        "adapter asarray(a, 'float32', gpu:0)": lambda: b.asarray(a, "float32", md.Device("gpu", 0)),
        "torch.from_numpy(a).to(cuda:0)": lambda: torch.from_numpy(a).to(d),
        "torch.from_numpy(a).to(adapter's device)": lambda: torch.from_numpy(a).to(nd),
        "host.to(cuda:0) (tensor made once)": lambda: host.to(d),
        "torch.as_tensor(a, device=cuda:0)": lambda: torch.as_tensor(a, device=d),
        "torch.from_numpy(a)": lambda: torch.from_numpy(a),
    }
    return _time_steps(steps, n, torch.cuda.synchronize, each=True)


def _time_steps(steps: dict[str, Callable[[], Any]], n: int, sync: Callable[[], Any],
                each: bool) -> list[dict[str, Any]]:
    """Each step's median time per call over 7 batches of ``n`` (``sync`` after the batch, or after
    every call with ``each``), printed and returned."""
    out = []
    for name, fn in steps.items():
        fn()
        times = []
        for _ in range(7):
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
                if each:
                    sync()
            sync()
            times.append((time.perf_counter() - t0) / n)
        med = statistics.median(times)
        print(f"  {name:44s} {med * 1e6:8.2f} us")
        out.append({"step": name, "median_s": med, "samples": times})
    return out


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
    ap.add_argument("--rows", default="thin,convert,asarray,sync,cexchange")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--cpu", action="store_true", help="the rows on cpu:0 (a dry run without a GPU)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    results = []
    for row in _rows(set(args.rows.split(",")), "cpu" if args.cpu else "gpu"):
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
                         "samples": samples, "profile": prof,
                        "native_profile": _profile(nat, max(200, n * 4))})
    steps: list[dict[str, Any]] = []
    if "convert" in args.rows.split(",") and not args.cpu:
        try:
            print("\n== md.convert(torch CUDA tensor, 'jax'), 1 MiB, step by step")
            steps = _convert_steps()
        except Exception as e:  # noqa: BLE001 - left out, and said so
            print(f"left out: convert steps: {type(e).__name__}: {e}")
    if "asarray" in args.rows.split(",") and not args.cpu:
        try:
            print("\n== md.asarray(NumPy 1 MiB, 'gpu:0', backend='torch'), layer by layer")
            steps += _asarray_steps()
        except Exception as e:  # noqa: BLE001 - left out, and said so
            print(f"left out: asarray steps: {type(e).__name__}: {e}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"rows": results, "convert_steps": steps, "versions": {"multidev": md.__version__}}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
