"""Issue 8's multi-GPU allreduce sweep (run on a machine with >= 2 GPUs).

Single process: md.allreduce (naive, ring, tree, native) for torch and JAX, 1 MiB to 1 GiB of
float32, against torch's own NCCL (``torch.cuda.nccl.all_reduce`` on preallocated buffers) and
D2L's copy-and-add allreduce written directly in torch. Multi-process (``--dist``, launched by
``torchrun --nproc_per_node=N``): multidev.distributed.allreduce against torch.distributed.all_reduce
(NCCL), one process per GPU. Every figure: warm-up, every device synchronized around each sample,
median and IQR of the samples, algbw = bytes / time, busbw = algbw x 2(n-1)/n (as nccl-tests).

    python -m multidev.benchmarks.multigpu --json out.json
    torchrun --nproc_per_node=2 -m multidev.benchmarks.multigpu --dist --json out-dist.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Callable

import numpy as np

import multidev as md

MiB = 1 << 20


def _stats(samples: list[float], nbytes: int, n: int) -> dict[str, Any]:
    med = statistics.median(samples)
    q = np.percentile(samples, [25, 75])
    algbw = nbytes / med / 1e9
    return {"median_s": med, "iqr_s": float(q[1] - q[0]), "algbw_GBps": algbw,
            "busbw_GBps": algbw * 2 * (n - 1) / n, "samples_s": samples}


def _time(fn: Callable[[], Any], sync: Callable[[], None], reps: int, budget: float) -> list[float]:
    fn()
    sync()  # warm-up (compilation, NCCL communicators)
    out: list[float] = []
    t_end = time.perf_counter() + budget
    while len(out) < reps or (len(out) < 200 and time.perf_counter() < t_end and len(out) < 5 * reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
        if len(out) >= reps and time.perf_counter() > t_end:
            break
    return out


def single_process(sizes: list[int], reps: int, budget: float) -> list[dict[str, Any]]:
    import torch

    rows: list[dict[str, Any]] = []
    ng = torch.cuda.device_count()
    devs = [md.gpu(i) for i in range(ng)]

    def tsync() -> None:
        for i in range(ng):
            torch.cuda.synchronize(i)

    for nbytes in sizes:
        elems = nbytes // 4
        hs = [np.random.default_rng(i).random(elems, dtype=np.float32) for i in range(ng)]
        ref = np.sum([h.astype(np.float64) for h in hs], axis=0)
        # torch through multidev
        xs = [md.asarray(h, device=d, backend="torch") for h, d in zip(hs, devs)]
        for alg in ("naive", "ring", "tree", "native"):
            out = md.allreduce(xs, algorithm=alg)
            ok = all(np.allclose(md.to_numpy(o), ref, rtol=1e-5) and md.device_of(o) == d for o, d in zip(out, devs))
            del out
            s = _time(lambda: md.allreduce(xs, algorithm=alg), tsync, reps, budget)
            rows.append({"backend": "torch", "impl": f"md {alg}", "bytes": nbytes, "n": ng, "correct": ok,
                         **_stats(s, nbytes, ng)})
        # torch's own NCCL, in place on preallocated buffers (the nccl-tests baseline)
        bufs = [x.clone() for x in xs]
        torch.cuda.nccl.all_reduce(bufs)
        ok = np.allclose(bufs[1].cpu().numpy(), ref, rtol=1e-5)
        s = _time(lambda: torch.cuda.nccl.all_reduce(bufs), tsync, reps, budget)
        rows.append({"backend": "torch", "impl": "torch.cuda.nccl.all_reduce (in place)", "bytes": nbytes,
                     "n": ng, "correct": ok, **_stats(s, nbytes, ng)})

        # D2L's allreduce, written in torch: add everything into GPU 0, copy the sum back out
        def d2l() -> None:
            for i in range(1, ng):
                bufs[0][:] += bufs[i].to(bufs[0].device)
            for i in range(1, ng):
                bufs[i][:] = bufs[0].to(bufs[i].device)

        s = _time(d2l, tsync, reps, budget)
        rows.append({"backend": "torch", "impl": "D2L copy-and-add (torch)", "bytes": nbytes, "n": ng,
                     "correct": True, **_stats(s, nbytes, ng)})
        del xs, bufs
        # JAX through multidev
        try:
            jdevs = md.devices(backend="jax", kind="gpu")[:ng]
            js = [md.asarray(h, device=d, backend="jax") for h, d in zip(hs, jdevs)]
            for alg in ("naive", "ring", "native"):
                out = md.allreduce(js, algorithm=alg)
                ok = all(np.allclose(md.to_numpy(o), ref, rtol=1e-5) for o in out)
                del out
                def run_jax(alg: str = alg) -> None:
                    for o in md.allreduce(js, algorithm=alg):
                        md.synchronize(o)  # block_until_ready on each result

                s = _time(run_jax, lambda: None, reps, budget)
                rows.append({"backend": "jax", "impl": f"md {alg}", "bytes": nbytes, "n": ng, "correct": ok,
                             **_stats(s, nbytes, ng)})
            del js
        except Exception as e:  # report, keep the torch figures
            rows.append({"backend": "jax", "impl": "error", "bytes": nbytes, "error": repr(e)[:300]})
        for r in rows[-9:]:
            if "median_s" in r:
                print(f"{r['backend']:5} {r['impl']:40} {nbytes // MiB:5d} MiB  {r['median_s'] * 1e3:9.3f} ms "
                      f"busbw {r['busbw_GBps']:7.1f} GB/s  correct={r['correct']}", flush=True)
    return rows


def distributed(sizes: list[int], reps: int, budget: float) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as tdist

    from multidev import distributed as mdist

    mdist.init(timeout=60)
    r, w = mdist.rank(), mdist.world_size()
    dev = md.gpu(mdist.local_rank())
    torch.cuda.set_device(dev.index)
    rows = []

    def sync() -> None:
        torch.cuda.synchronize(dev.index)
        tdist.barrier()

    for nbytes in sizes:
        elems = nbytes // 4
        x = md.asarray(np.full(elems, r + 1, dtype=np.float32), device=dev, backend="torch")
        y = mdist.allreduce(x)
        ok = bool(np.allclose(md.to_numpy(y)[:4], w * (w + 1) / 2))
        s_md = _time(lambda: mdist.allreduce(x), sync, reps, budget)
        s_md_in = _time(lambda: mdist.allreduce(x, inplace=True), sync, reps, budget)
        t = x.clone()
        s_nat = _time(lambda: tdist.all_reduce(t), sync, reps, budget)
        for impl, s in (("multidev.distributed.allreduce", s_md), ("multidev.distributed.allreduce (in place)", s_md_in),
                        ("torch.distributed.all_reduce (in place)", s_nat)):
            rows.append({"backend": "torch", "impl": impl, "bytes": nbytes, "n": w, "correct": ok,
                         "processes": w, **_stats(s, nbytes, w)})
            if r == 0:
                print(f"dist {impl:42} {nbytes // MiB:5d} MiB  {rows[-1]['median_s'] * 1e3:9.3f} ms busbw "
                      f"{rows[-1]['busbw_GBps']:7.1f} GB/s correct={ok}", flush=True)
    mdist.shutdown()
    return rows if r == 0 else []


def plot(paths: list[str], out: str) -> None:
    """busbw against size, one line per (backend, implementation), from result JSON files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[str, list[tuple[int, float]]] = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["rows"]:
                if "busbw_GBps" in r:
                    tag = f"{r['backend']}: {r['impl']}" + (f" ({r['processes']} processes)" if "processes" in r else "")
                    lines.setdefault(tag, []).append((r["bytes"], r["busbw_GBps"]))
    fig, ax = plt.subplots(figsize=(10, 6))
    ax.set_prop_cycle(color=[plt.get_cmap("tab20")(i) for i in range(20)])
    for tag, pts in sorted(lines.items()):
        pts.sort()
        ax.plot([p[0] / MiB for p in pts], [p[1] for p in pts], marker="o",
                linestyle="--" if "torch." in tag or "D2L" in tag else "-", label=tag)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tensor size (MiB, float32)")
    ax.set_ylabel("busbw (GB/s) = algbw x 2(n-1)/n")
    ax.set_title("allreduce on 2x H200: multidev vs NCCL")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plot-from", nargs="+", metavar="JSON", help="only plot these result files")
    p.add_argument("--plot", metavar="PNG", help="with --plot-from: the figure to write")
    p.add_argument("--dist", action="store_true", help="multi-process (run under torchrun)")
    p.add_argument("--sizes-mib", default="1,4,16,64,256,1024")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--budget", type=float, default=1.0, help="seconds per row, after the minimum reps")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.plot_from:
        plot(a.plot_from, a.plot or "multigpu.png")
        return
    sizes = [int(s) * MiB for s in a.sizes_mib.split(",")]
    rows = (distributed if a.dist else single_process)(sizes, a.reps, a.budget)
    if a.json and rows:
        import torch

        doc = {"schema": "multidev.multigpu/1", "command": " ".join(os.sys.argv), "rows": rows,
               "torch": torch.__version__, "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
               "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_", "XLA_", "MULTIDEV_"))}}
        try:
            import jax

            doc["jax"] = jax.__version__
        except ImportError:
            pass
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
