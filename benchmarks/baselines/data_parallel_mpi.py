"""``md.data_parallel``'s step on the MPI engine against a Horovod-style hand-written loop in the same
job: torch's forward and backward, then one allreduce of all the gradients flattened into a single
buffer (mpi4py's ``Allreduce`` in place on it), divided by the world size and copied back, then
``optimizer.step``. A CNN (LeNet-style with BatchNorm) and an MLP, SGD with momentum and weight
decay, the same seed and batches. Median step time of each (their steps interleaved, a barrier before
each), the ratio, and whether the parameters after the same steps are equal. Run under MPI::

    mpiexec -n 2 python -m multidev.benchmarks.baselines.data_parallel_mpi [--steps 60] [--json out.json]

Rank 0 prints one line per model and variant: ``md`` is ``dp.step(batch, loss_fn)``; ``md (checks
at start)`` the same with ``checks="start"`` (no consistency exchange per step, as the hand-written
loop has none); ``native`` the flattened-allreduce loop. BatchNorm's buffers are rank 0's in md's
steps (its default) and each rank's own in the native loop: the parameters are compared, not the
buffers.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from .data_parallel_ddp import torch_models


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="timed steps per variant (after 10 warm-up steps)")
    p.add_argument("--batch", type=int, default=64, help="rows per process and step")
    p.add_argument("--json", help="write the rows here (rank 0)")
    args = p.parse_args(argv)

    import numpy as np
    import torch
    import torch.nn.functional as F

    import multidev as md
    from multidev import distributed as dist

    info = dist.init(engine="mpi", timeout=120)
    from mpi4py import MPI  # after init: MPI starts there with the engine's Open MPI settings, for both loops
    torch.set_num_threads(1)
    rank, world = dist.rank(), dist.world_size()
    comm = MPI.COMM_WORLD.Dup()  # the native loop's own communicator

    def loss_fn(m: Any, b: Any) -> Any:
        return F.cross_entropy(m(b[0]), b[1])

    def native_step(v: dict[str, Any], b: Any) -> None:
        """Horovod's recipe by hand: one flattened gradient buffer, one allreduce, averaged."""
        v["opt"].zero_grad()
        loss_fn(v["net"], b).backward()
        grads = [q.grad for q in v["net"].parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        comm.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
        flat /= world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        v["opt"].step()

    rows = []
    for name, make in torch_models(torch).items():
        variants: dict[str, dict[str, Any]] = {}
        for label in ("md", "md (checks at start)", "native"):
            torch.manual_seed(0)
            net = make()
            opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
            run = None if label == "native" else md.data_parallel(net, opt, checks="start" if "start" in label
                                                                  else "step")
            variants[label] = {"net": net, "opt": opt, "run": run, "times": []}
        g = torch.Generator().manual_seed(1 + rank)
        for i in range(10 + args.steps):
            b = (torch.randn(args.batch, 1, 28, 28, generator=g), torch.randint(0, 10, (args.batch,), generator=g))
            for v in variants.values():
                comm.Barrier()
                t0 = time.perf_counter()
                if v["run"] is None:
                    native_step(v, b)
                else:
                    v["run"].step(b, loss_fn)
                if i >= 10:
                    v["times"].append(time.perf_counter() - t0)
        ref = dict(variants["native"]["net"].named_parameters())
        base = statistics.median(variants["native"]["times"])
        for label in ("md", "md (checks at start)"):
            mine = dict(variants[label]["net"].named_parameters())
            diff = max(float((mine[k] - ref[k]).detach().abs().max()) for k in ref)
            med = statistics.median(variants[label]["times"])
            rows.append({"model": name, "variant": label, "median_ms": med * 1e3, "native_median_ms": base * 1e3,
                         "ratio": med / base, "max_param_diff": diff,
                         "params_equal": all(torch.equal(mine[k], ref[k]) for k in ref)})
            variants[label]["run"].close()
    worst_diff = comm.allreduce(np.float64(sum(r["max_param_diff"] for r in rows)), op=MPI.MAX)
    comm.Free()
    dist.shutdown()
    if rank == 0:
        print(f"{world} processes, {info.engine} engine ({info.transport}), {args.batch} rows per process, "
              f"{args.steps} timed steps, torch {torch.__version__}, MPI {MPI.Get_library_version().split(',')[0]}")
        for r in rows:
            print(f"{r['model']:4s} {r['variant']:20s} {r['median_ms']:8.2f} ms  "
                  f"native {r['native_median_ms']:8.2f} ms  "
                  f"ratio {r['ratio']:.3f}  parameters equal to the native loop's: {r['params_equal']} "
                  f"(max |diff| {r['max_param_diff']:.1e}; largest over ranks {float(worst_diff):.1e})")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"world_size": world, "batch": args.batch, "steps": args.steps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
