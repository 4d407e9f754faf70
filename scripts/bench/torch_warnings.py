"""Which torch.distributed primitives warn, called as multidev's torch engine calls them (``async_op``,
a one-process gloo group): the engine starts ``all_reduce`` and ``broadcast`` without its warnings guard
(``backends/torch/engine.py``, ``_quiet``), so those two must stay silent on every torch it runs on.
Exits 1 if either warns.

    python scripts/bench/torch_warnings.py
"""
from __future__ import annotations

import os
import socket
import warnings

import torch
import torch.distributed as dist

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", rank=0, world_size=1)
x = torch.ones(4)
calls = {
    "all_reduce": lambda: dist.all_reduce(x, op=dist.ReduceOp.SUM, group=None, async_op=True),
    "broadcast": lambda: dist.broadcast(x, src=0, group=None, async_op=True),
    "reduce": lambda: dist.reduce(x, dst=0, op=dist.ReduceOp.SUM, group=None, async_op=True),
    "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(4), x, group=None, async_op=True),
    "gather": lambda: dist.gather(x, gather_list=[torch.empty(4)], dst=0, group=None, async_op=True),
    "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty(4), x, op=dist.ReduceOp.SUM, group=None,
                                                                async_op=True),
    "scatter": lambda: dist.scatter(torch.empty(4), scatter_list=[x], src=0, group=None, async_op=True),
    "all_to_all_single": lambda: dist.all_to_all_single(torch.empty(4), x, group=None, async_op=True),
}
print(f"torch {torch.__version__}")
loud = []
for name, call in calls.items():
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        try:
            w = call()
            if w is not None:
                w.wait()
            note = ""
        except Exception as e:  # noqa: BLE001 - a primitive gloo lacks here is reported, not a failure
            note = f" (raised {type(e).__name__}: {str(e)[:80]})"
    said = [f"{m.category.__name__}: {str(m.message)[:100]}" for m in got]
    print(f"  {name}: {'; '.join(said) if said else 'silent'}{note}")
    if said and name in ("all_reduce", "broadcast"):
        loud.append(name)
dist.destroy_process_group()
if loud:
    print(f"WARNS without the guard: {', '.join(loud)}")
    raise SystemExit(1)
print("all_reduce and broadcast are silent")
