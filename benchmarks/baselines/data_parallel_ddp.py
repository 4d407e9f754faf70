"""``md.data_parallel``'s step against torch's ``DistributedDataParallel`` in the same job: a CNN
(LeNet-style with BatchNorm) and an MLP, SGD with momentum and weight decay, the same seed, the same
batches. Median step time of each (their steps interleaved, so both see the same machine), the
ratio, and whether the parameters after the same steps are equal. Run under the torch engine::

    torchrun --nproc_per_node=2 -m multidev.benchmarks.baselines.data_parallel_ddp [--steps 60] [--json out.json]
    python -m multidev.distributed.launch -n 2 --engine torch -m multidev.benchmarks.baselines.data_parallel_ddp

Rank 0 prints one line per model. Each step is ``zero_grad`` (DDP), forward, backward (the
collectives, overlapped with it by both), ``optimizer.step``; ``md`` is ``dp.step(batch, loss_fn)``
, ``md (own loop)`` the same hand-written loop as DDP's on the wrapped model, and ``md (checks at
start)`` the step with ``checks="start"`` (no consistency exchange per step, as DDP).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


def torch_models(torch: Any) -> dict[str, Any]:
    """The benchmarked models by name (constructors): a CNN with BatchNorm and an MLP, 28x28 inputs."""
    nn = torch.nn

    def cnn() -> Any:
        return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 5, padding=2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

    def mlp() -> Any:
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                             nn.Linear(512, 10))
    return {"cnn": cnn, "mlp": mlp}


def parse_args(doc: str | None, argv: list[str] | None, steps: int, warmup: int) -> argparse.Namespace:
    """The options of the torch data-parallel benches: --steps, --batch, --json."""
    p = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    p.add_argument("--steps", type=int, default=steps, help=f"timed steps per variant (after {warmup} warm-up steps)")
    p.add_argument("--batch", type=int, default=64, help="rows per process and step")
    p.add_argument("--json", help="write the rows here (rank 0)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__, argv, 60, 10)

    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    import multidev as md
    from multidev import distributed as dist

    info = dist.init(engine="torch", transport="gloo", timeout=120)
    torch.set_num_threads(1)
    rank, world = dist.rank(), dist.world_size()
    rows = []
    for name, make in torch_models(torch).items():
        variants: dict[str, dict[str, Any]] = {}
        for label in ("md", "md (own loop)", "md (checks at start)", "DDP"):
            torch.manual_seed(0)
            net = make()
            opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
            if label == "DDP":
                run = DistributedDataParallel(net)
            else:
                run = md.data_parallel(net, opt, checks="start" if "start" in label else "step")
            variants[label] = {"net": net, "opt": opt, "run": run, "times": []}

        def loss_fn(m: Any, b: Any) -> Any:
            return F.cross_entropy(m(b[0]), b[1])

        def step(v: dict[str, Any], label: str, b: Any) -> None:
            if label in ("md", "md (checks at start)"):
                v["run"].step(b, loss_fn)
            else:
                v["opt"].zero_grad()
                loss_fn(v["run"], b).backward()
                v["opt"].step()

        g = torch.Generator().manual_seed(1 + rank)
        for i in range(10 + args.steps):
            b = (torch.randn(args.batch, 1, 28, 28, generator=g), torch.randint(0, 10, (args.batch,), generator=g))
            for label, v in variants.items():
                dist.barrier()
                t0 = time.perf_counter()
                step(v, label, b)
                if i >= 10:
                    v["times"].append(time.perf_counter() - t0)
        ddp = dict(variants["DDP"]["net"].named_parameters())
        for label in ("md", "md (own loop)", "md (checks at start)"):
            mine = dict(variants[label]["net"].named_parameters())
            diff = max(float((mine[k] - ddp[k]).detach().abs().max()) for k in ddp)
            med, base = statistics.median(variants[label]["times"]), statistics.median(variants["DDP"]["times"])
            rows.append({"model": name, "variant": label, "median_ms": med * 1e3, "ddp_median_ms": base * 1e3,
                         "ratio": med / base, "max_param_diff": diff,
                         "params_equal": all(torch.equal(mine[k], ddp[k]) for k in ddp)})
        for v in variants.values():
            if hasattr(v["run"], "close"):
                v["run"].close()
    dist.shutdown()
    if rank == 0:
        print(f"{world} processes, {info.engine} engine ({info.transport}), {args.batch} rows per process, "
              f"{args.steps} timed steps, torch {torch.__version__}")
        for r in rows:
            print(f"{r['model']:4s} {r['variant']:20s} {r['median_ms']:8.2f} ms  DDP {r['ddp_median_ms']:8.2f} ms  "
                  f"ratio {r['ratio']:.3f}  parameters equal to DDP's: {r['params_equal']} "
                  f"(max |diff| {r['max_param_diff']:.1e})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world_size": world, "batch": args.batch, "steps": args.steps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
