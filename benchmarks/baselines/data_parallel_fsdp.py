"""``md.data_parallel`` over a process mesh (torch: FSDP2 underneath) against FSDP2 applied by hand in
the same job: the models of :mod:`.data_parallel_ddp` (a CNN with BatchNorm and an MLP), AdamW, the
same seed and batches, the parameters sharded along ``model`` of a ``(n/2, 2)`` mesh (``(1, n)`` for
fewer than 4 processes) and replicated along ``data``. Median step time of each (their steps
interleaved, so both see the same machine), the ratio, and whether the parameters after the same
steps are equal. Run under the torch engine::

    python -m multidev.distributed.launch -n 4 --engine torch -m multidev.benchmarks.baselines.data_parallel_fsdp

Each step: ``md`` is ``dp.step(batch, loss_fn)`` (buffers each rank's own, ``buffers="local"``, as
FSDP2 leaves them); ``FSDP2`` is ``fully_shard`` on each child module with parameters and on the root
(the wrapping multidev uses), the optimizer built after it, then ``zero_grad``, forward, backward
(FSDP2's reduce-scatters and all-reduces), ``optimizer.step``. ``md (own loop)`` is that loop on
multidev's wrapped model (what ``dp.step`` adds, apart), ``FSDP2 (optimizer first)`` the optimizer built
before ``fully_shard`` and its groups moved onto the new parameters by hand (what multidev does to a
user's optimizer). Rank 0 prints one line per model and variant.
"""
from __future__ import annotations

import json
import statistics
import time
from typing import Any

from .data_parallel_ddp import parse_args, torch_models


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__, argv, 40, 5)

    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    import multidev as md
    from multidev import distributed as dist

    info = dist.init(engine="torch", transport="gloo", timeout=120)
    torch.set_num_threads(1)
    rank, world = dist.rank(), dist.world_size()
    shape = (world // 2, 2) if world >= 4 and world % 2 == 0 else (1, world)
    pm = dist.process_mesh(shape, ("data", "model"))
    ranks = torch.arange(world).reshape(shape)
    native_mesh = (DeviceMesh("cpu", ranks, mesh_dim_names=("replicate", "shard")) if shape[0] > 1 else
                   DeviceMesh("cpu", ranks[0], mesh_dim_names=("shard",)))
    rows = []
    for name, make in torch_models(torch).items():
        variants: dict[str, dict[str, Any]] = {}
        for label in ("md", "md (own loop)", "FSDP2", "FSDP2 (optimizer first)"):
            torch.manual_seed(0)
            net = make()
            first = label != "FSDP2"  # the optimizer built on the plain parameters, then moved (multidev's way)
            opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-2) if first else None
            if label.startswith("FSDP2"):
                for child in net.children():
                    if any(True for _ in child.parameters()):
                        fully_shard(child, mesh=native_mesh)
                fully_shard(net, mesh=native_mesh)
                if opt is not None:  # FSDP2 replaced the parameters: the optimizer's groups follow by name
                    new = dict(net.named_parameters())
                    names = [n for n, _ in make().named_parameters()]
                    opt.param_groups[0]["params"] = [new[n] for n in names]
            if opt is None:
                opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-2)
            run = (md.data_parallel(net, opt, mesh=pm, param_axis="model", buffers="local")
                   if label.startswith("md") else net)
            variants[label] = {"net": net, "opt": opt, "run": run, "times": []}

        def loss_fn(m: Any, b: Any) -> Any:
            return F.cross_entropy(m(b[0]), b[1])

        g = torch.Generator().manual_seed(1 + rank)
        for i in range(5 + args.steps):
            b = (torch.randn(args.batch, 1, 28, 28, generator=g), torch.randint(0, 10, (args.batch,), generator=g))
            for label, v in variants.items():
                dist.barrier()
                t0 = time.perf_counter()
                if label == "md":
                    v["run"].step(b, loss_fn)
                else:  # the hand-written loop (on md's wrapped model for "md (own loop)")
                    v["opt"].zero_grad()
                    loss_fn(v["net"], b).backward()
                    v["opt"].step()
                if i >= 5:
                    v["times"].append(time.perf_counter() - t0)
        def whole(net: Any) -> dict[str, Any]:  # parameters are DTensors, buffers plain tensors
            return {k: t.full_tensor() if hasattr(t, "full_tensor") else t for k, t in net.state_dict().items()}

        ref = whole(variants["FSDP2"]["net"])
        base = statistics.median(variants["FSDP2"]["times"])
        for label in ("md", "md (own loop)", "FSDP2 (optimizer first)"):
            mine = whole(variants[label]["net"])
            med = statistics.median(variants[label]["times"])
            rows.append({"model": name, "variant": label, "median_ms": med * 1e3, "fsdp_median_ms": base * 1e3,
                         "ratio": med / base, "params_equal": all(torch.equal(mine[k], ref[k]) for k in ref),
                         "max_param_diff": max(float((mine[k].float() - ref[k].float()).abs().max()) for k in ref)})
    dist.shutdown()
    if rank == 0:
        print(f"{world} processes on a {shape} process mesh, {info.engine} engine ({info.transport}), "
              f"{args.batch} rows per process, {args.steps} timed steps, torch {torch.__version__}")
        for r in rows:
            print(f"{r['model']:4s} {r['variant']:24s} {r['median_ms']:8.2f} ms  FSDP2 {r['fsdp_median_ms']:8.2f} ms  "
                  f"ratio {r['ratio']:.3f}  parameters equal: {r['params_equal']} (max |diff| "
                  f"{r['max_param_diff']:.1e})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world_size": world, "mesh": list(shape), "batch": args.batch, "steps": args.steps,
                           "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
