"""Where md.convert(JAX GPU array, "torch") spends its time (issue 36's row: 1.7-2.2x torch.from_dlpack
on the H200): the route convert took (wait, handshake), alternating rounds against the native call
(medians) at 1 and 256 MiB, then a cProfile of the md loop (top 25 by own time)."""
from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time

import jax
import jax.numpy as jnp
import torch

import multidev as md
from multidev import exchange

gpu = jax.devices("gpu")[0]
for mib in (1, 256):
    j = jax.device_put(jnp.ones(mib << 18, jnp.float32), gpu)
    j.block_until_ready()
    md.convert(j, "torch")
    route = next(iter(exchange._ROUTES.values()))
    print(f"{mib} MiB route: wait={route.wait} handshake={route.handshake} host={route.host} why={route.why!r}")
    rows: dict[str, list[float]] = {"md": [], "native": []}
    for _ in range(30):
        for name, f in (("md", lambda j=j: md.convert(j, "torch")), ("native", lambda j=j: torch.from_dlpack(j))):
            t = time.perf_counter()
            for _ in range(20):
                f()
            torch.cuda.synchronize()
            rows[name].append((time.perf_counter() - t) / 20)
    for k, v in rows.items():
        print(f"  {k:8s} median {statistics.median(v) * 1e6:8.1f} us")
    exchange._ROUTES.clear()
pr = cProfile.Profile()
pr.enable()
for _ in range(500):
    md.convert(j, "torch")
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
print(s.getvalue())
