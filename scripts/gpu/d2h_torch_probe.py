"""torch device->host at 1-256 MiB: where md.to_numpy's time goes against a preallocated pinned copy
(the H200 row read 0.855x pinned at 64 MiB, 0.977x at 256 MiB). Each route is timed in interleaved
rounds (median of ROUNDS, GB/s), so the routes differ only in what they do:

- ``md.to_numpy``: the adapter's blocking read (a pinned buffer from torch's caching host allocator, the
  copy on the tensor's current stream, a wait on an event); ``md.to_host``: the asynchronous route's
  (the copy on the GPU's copy stream after an event, a wait on an event);
- ``pinned prealloc, current stream``: the bench's ``native_pinned`` (the bound);
- ``pinned prealloc, copy stream + events``: the adapter's stream and events, the buffer kept;
- ``pinned cached, current stream``: a fresh ``torch.empty(pin_memory=True)`` each call, no events;
- ``pinned cached, current stream + event``: the same, waiting on an event recorded after the copy;
- ``pinned cached, copy stream + events``: the adapter's asynchronous route (``transfers.start_download``);
- ``adapter download``: the adapter's blocking route (``transfers.download``: ``to_numpy``, ``to(x, host)``);
- ``pageable x.cpu()``: torch's own pageable download.

    python3 scripts/gpu/d2h_torch_probe.py [--rounds 9] [--sizes-mib 1,4,16,64,256] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import multidev as md


def routes(x: Any) -> dict[str, Callable[[], Any]]:
    dev = x.device
    b = md.backend("torch")
    cs = torch.cuda.Stream(dev)
    pre = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    pre2 = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)

    def pre_current() -> Any:
        pre.copy_(x, non_blocking=True)
        torch.cuda.current_stream(dev).synchronize()
        return pre

    def on_copy_stream(host: Any) -> Any:
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(dev))
        cs.wait_event(ready)
        with torch.cuda.stream(cs):
            host.copy_(x, non_blocking=True)
        done = torch.cuda.Event()
        done.record(cs)
        done.synchronize()
        return host

    def cached_current() -> Any:
        host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        host.copy_(x, non_blocking=True)
        torch.cuda.current_stream(dev).synchronize()
        return host

    def cached_current_event() -> Any:
        host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
        host.copy_(x, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(dev))
        done.synchronize()
        return host

    def adapter_download() -> Any:
        return b.transfers.download(x)  # the blocking reads' route (to_numpy, to(x, host))

    def adapter_route() -> Any:
        host, waiter = b.transfers.start_download(x)  # the adapter's own download (backends/torch/transfers.py)
        waiter()
        return host

    return {"md.to_numpy": lambda: md.to_numpy(x), "md.to_host": lambda: md.to_host([x])[0],
            "pinned prealloc, current stream": pre_current,
            "pinned prealloc, copy stream + events": lambda: on_copy_stream(pre2),
            "pinned cached, current stream": cached_current,
            "pinned cached, current stream + event": cached_current_event,
            "pinned cached, copy stream + events (adapter)": adapter_route,
            "adapter download (to_numpy's route)": adapter_download,
            "pageable x.cpu()": lambda: x.cpu()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--sizes-mib", default="1,4,16,64,256")
    p.add_argument("--json")
    a = p.parse_args()
    out: dict[str, Any] = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "rows": []}
    for mib in (int(s) for s in a.sizes_mib.split(",")):
        x = torch.ones(mib * 2**18, dtype=torch.float32, device="cuda:0")
        fns = routes(x)
        for f in fns.values():  # warm-up: allocator blocks, streams, events
            f()
            f()
        ts: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(a.rounds):
            for k, f in fns.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                r = f()
                ts[k].append(time.perf_counter() - t0)
                del r
        bound = statistics.median(ts["pinned prealloc, current stream"])
        for k, v in ts.items():
            m = statistics.median(v)
            row = {"MiB": mib, "route": k, "median_s": m, "GBps": x.nbytes / m / 1e9, "x_pinned": bound / m,
                   "samples_s": v}
            out["rows"].append(row)
            print(f"{mib:4d} MiB {k:46s} {m * 1e3:8.3f} ms {row['GBps']:7.2f} GB/s {row['x_pinned']:6.3f}x pinned",
                  flush=True)
        del x, fns
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
