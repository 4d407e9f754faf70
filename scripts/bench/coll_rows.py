"""Issue 36's rows on the one-process allreduce, measured by alternating repeats (each round runs
every variant once, in turn, so the machine's load hits them alike), reported as medians:

- in place / out of place, per algorithm;
- each algorithm's fraction of the memcpy bound where the devices share one memory: ``n`` copies of
  the size (read ``n`` inputs once, write ``n`` results once), timed as one preallocated copy of
  ``n x size`` bytes in the same rounds (same working set), the faster of that copy on one thread and
  cut over every core (multidev's host loops run on several threads);
- the fresh-memory floor beside it: the same ``n`` copies written into ``n`` new arrays (pages
  touched for the first time), the faster of one thread and every core: the least a call whose
  results are new memory does. multidev's results come from its host pool where they fit
  (:mod:`multidev.hostpool`: memory already faulted in), so there the call can beat this floor;
  beyond the pool it cannot;
- ``auto`` (and the algorithm it chose) against the best algorithm measured.

A row whose per-round ratios spread (IQR / median above ``--spread``) is marked UNSTABLE, the
bench's own rule (:data:`multidev.benchmarks.report.PAIR_SPREAD_MAX`).

    python scripts/bench/coll_rows.py --backend numpy --counts 2,4,8 --sizes 1MiB,4MiB,16MiB,64MiB \
        --rounds 21 --json rows.json --markdown rows.md
    python scripts/bench/coll_rows.py --backend torch --devices gpu:0,cpu:0 --sizes 4KiB,1MiB,64MiB

``--devices`` takes an explicit list (e.g. a GPU beside the host: the single-GPU case); else the first
``n`` of the backend's devices for each ``--counts`` (NumPy: that many virtual devices).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

ALGS = ("naive", "ring", "tree")


def _size(text: str) -> int:
    t = text.strip()
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if t.endswith(unit):
            return int(t[:-len(unit)]) * f
    return int(t)


def _fmt(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def _iqr(xs: list[float]) -> float:
    q1, med, q3 = np.percentile(xs, [25, 50, 75])
    return float((q3 - q1) / med) if med > 0 else float("inf")


_POOL: ThreadPoolExecutor | None = None


def _copy_on_every_core(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)`` cut into one contiguous part per CPU, on a pool of this script's own
    (not multidev's, so ``MULTIDEV_HOST_THREADS`` does not change the bound)."""
    global _POOL
    k = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if _POOL is None:
        _POOL = ThreadPoolExecutor(k)
    step = -(-src.size // k)
    list(_POOL.map(lambda lo: np.copyto(dst[lo:lo + step], src[lo:lo + step]), range(0, src.size, step)))


def _copy_into_new_arrays(parts: list[np.ndarray], cores: bool) -> list[np.ndarray]:
    """Each of ``parts`` copied into a new array (``np.empty``, then written once: its pages touched
    for the first time), on one thread or cut over every core: the least an out-of-place call
    writes, since its results are new memory; the arrays are dropped by the caller, as a sample drops
    an allreduce's results."""
    outs = [np.empty_like(p) for p in parts]
    for o, p in zip(outs, parts):
        if cores:
            _copy_on_every_core(o, p)
        else:
            np.copyto(o, p)
    return outs


def measure(md: Any, backend: str, devs: list[Any], size: int, rounds: int, spread_max: float) -> dict[str, Any]:
    b = md.backend(backend)
    n = len(devs)
    elems = max(1, size // 4)
    rng = np.random.default_rng(n)
    xs = [md.asarray(rng.random(elems, dtype=np.float32), device=d, backend=backend) for d in devs]
    shared = all(not d.is_gpu for d in devs)
    mutable = b.capabilities.mutable
    bufs = [md.copy(x) for x in xs] if mutable else None
    from multidev.collectives import choose_algorithm

    choice = choose_algorithm(b, (elems,), "float32", devs)

    def done(r: Any) -> None:
        for t in r:
            md.synchronize(t)

    algs = (*ALGS, *(("native",) if b.collectives is not None else ()))
    fns: dict[str, Any] = {}
    for a in algs:
        fns[f"alg:{a}"] = (lambda a=a: done(md.allreduce(xs, "sum", algorithm=a)))
        if bufs is not None and a != "native":
            fns[f"inplace:{a}"] = (lambda a=a: done(md.allreduce(bufs, "sum", algorithm=a, inplace=True)))
    fns["auto"] = lambda: done(md.allreduce(xs, "sum"))
    if shared:
        src = np.ones(max(1, n * size // 8), np.float64)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        fns["memcpy"] = lambda: np.copyto(dst, src)
        fns["memcpy-cores"] = lambda: _copy_on_every_core(dst, src)
        parts = np.array_split(src, n)
        fns["memcpy-fresh"] = lambda: _copy_into_new_arrays(parts, False)
        fns["memcpy-fresh-cores"] = lambda: _copy_into_new_arrays(parts, True)
    for f in fns.values():  # warm-up: allocator growth, first touch, compilation
        f()
        f()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for r in range(rounds):
        for k in (order if r % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            fns[k]()
            samples[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in samples.items()}
    row: dict[str, Any] = {"backend": backend, "n": n, "size": size, "devices": [str(d) for d in devs],
                           "auto_choice": choice, "median_s": med, "rounds": rounds, "unstable": []}
    best = min(algs, key=lambda a: med[f"alg:{a}"])
    row["best"] = best
    pairs = {"auto/best": [a / c for a, c in zip(samples["auto"], samples[f"alg:{best}"])]}
    row["auto_over_best"] = med["auto"] / med[f"alg:{best}"]
    row["choice_over_best"] = med[f"alg:{choice}"] / med[f"alg:{best}"] if f"alg:{choice}" in med else None
    if bufs is not None:
        row["inplace_over_outofplace"] = {a: med[f"inplace:{a}"] / med[f"alg:{a}"] for a in ALGS}
        for a in ALGS:
            pairs[f"inplace/alg ({a})"] = [x / y for x, y in zip(samples[f"inplace:{a}"], samples[f"alg:{a}"])]
    if shared:  # the bound: the faster of a copy on one thread and one cut over every core
        unit = min(("memcpy", "memcpy-cores"), key=lambda k: med[k])
        row["bound_s"], row["bound_copy"] = med[unit], unit
        row["fraction_of_bound"] = {k: med[unit] / med[k] for k in fns if not k.startswith("memcpy")}
        # the floor of any out-of-place call: its n results are new memory, each written once
        fresh = min(("memcpy-fresh", "memcpy-fresh-cores"), key=lambda k: med[k])
        row["fresh_floor_s"], row["fresh_floor_copy"] = med[fresh], fresh
        row["fraction_of_fresh_floor"] = {k: med[fresh] / med[k] for k in fns if k.startswith("alg:") or k == "auto"}
        for k in ("auto", *(f"inplace:{best}",) * (bufs is not None and best != "native")):
            pairs[f"{unit}/{k}"] = [m / x for m, x in zip(samples[unit], samples[k])]
    for name, ps in pairs.items():
        s = _iqr(ps)
        if s > spread_max:
            row["unstable"].append(f"{name} varies ±{50 * s:.0f}% between alternating rounds")
    return row


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    out = [header, "", "auto's choice / best: the chosen algorithm's median over the best one's; auto measured: "
           "the auto call's own median over the best (the same code where the choice is the best: noise).", "",
           "| backend | n | size | best | auto's choice / best | auto measured / best | in place / out of place "
           "(naive, ring, tree) | fraction of the bound: naive, ring, tree, auto | in place | the fresh-memory floor's "
           "fraction of the bound; auto's speed against the floor (above 1: faster) | stable |",
           "|---" * 11 + "|"]
    for r in rows:
        ip = r.get("inplace_over_outofplace")
        fb = r.get("fraction_of_bound")
        ipc = ", ".join(f"{ip[a]:.2f}" for a in ALGS) if ip else "-"
        fbc = ", ".join(f"{fb[k]:.2f}" for k in (*(f"alg:{a}" for a in ALGS), "auto")) if fb else "-"
        fbi = ", ".join(f"{fb[f'inplace:{a}']:.2f}" for a in ALGS) if fb and ip else "-"
        if fb:
            fbc += " (copy on every core)" if r.get("bound_copy") == "memcpy-cores" else " (copy on one thread)"
        ff = r.get("fraction_of_fresh_floor")
        fl = "-" if not ff else f"{r['bound_s'] / r['fresh_floor_s']:.2f}; {ff['auto']:.2f}"
        st = "UNSTABLE: " + "; ".join(r["unstable"]) if r["unstable"] else "yes"
        cb = r.get("choice_over_best")
        out.append(f"| {r['backend']} | {r['n']} | {_fmt(r['size'])} | {r['best']} | {r['auto_choice']}: "
                   f"{'-' if cb is None else f'{cb:.2f}'} | {r['auto_over_best']:.2f} | {ipc} | {fbc} | {fbi} | {fl} | "
                   f"{st} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="numpy")
    p.add_argument("--counts", default="2,4,8", help="device counts (ignored with --devices)")
    p.add_argument("--devices", help="an explicit device list, e.g. gpu:0,cpu:0")
    p.add_argument("--sizes", default="1MiB,4MiB,16MiB,64MiB", help="bytes per device")
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--spread", type=float, default=0.10, help="the largest IQR/median of a row's ratios")
    p.add_argument("--json")
    p.add_argument("--markdown")
    a = p.parse_args(argv)
    counts = [int(c) for c in a.counts.split(",")]
    import multidev as md
    from multidev.registry import configure_virtual_devices

    configure_virtual_devices(max(counts), [a.backend])  # (as `multidev bench --cpu-devices`; user values kept)

    if a.devices:
        sets = [[md.device(d) for d in a.devices.split(",")]]
    else:
        cpus = [d for d in md.devices(backend=a.backend) if not d.is_gpu]
        sets = [cpus[:c] for c in counts if c <= len(cpus)]
    rows = []
    t0 = time.time()
    load = os.getloadavg()
    for devs in sets:
        for s in (_size(x) for x in a.sizes.split(",")):
            r = measure(md, a.backend, devs, s, a.rounds, a.spread)
            rows.append(r)
            print(markdown([r], "").splitlines()[-1], flush=True)
            header = (f"python {' '.join(sys.argv)}  \n{platform.processor() or platform.machine()}, "
                      f"{os.cpu_count()} CPUs, load {tuple(round(x, 2) for x in load)} -> "
                      f"{tuple(round(x, 2) for x in os.getloadavg())}, {time.time() - t0:.0f} s, {a.rounds} "
                      "alternating rounds a row (medians)")
            if a.json:  # (after every row: a run cut by a time cap keeps what it measured)
                with open(a.json, "w") as f:
                    json.dump({"command": sys.argv, "rows": rows, "header": header}, f, indent=1)
            if a.markdown:
                with open(a.markdown, "w") as f:
                    f.write(markdown(rows, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
