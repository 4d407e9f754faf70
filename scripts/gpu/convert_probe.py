"""Where md.convert spends its time against the native DLPack call (issue 36's convert rows): JAX ->
torch (``torch.from_dlpack``) and torch -> JAX (``jax.dlpack.from_dlpack``), on the GPU and on the
host, at 1 and 256 MiB: the route convert took, alternating rounds against the native call
(medians), then a cProfile of the md loop of JAX -> torch on the GPU (top 25 by own time).
``--cpu`` measures the host rows alone (no GPU needed)."""
from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import torch

import multidev as md
from multidev import exchange

ROUNDS, PER = 60, 20


def measure(label: str, x: object, to: str, native: object, sync: object) -> None:
    exchange._ROUTES.clear()
    md.convert(x, to)
    route = next(iter(exchange._ROUTES.values()))
    print(f"{label}: route wait={route.wait} handshake={route.handshake} host={route.host} why={route.why!r}")
    rows: dict[str, list[float]] = {"md": [], "native": [], "md-full": []}

    def full() -> None:  # the route's full path on every call (the steady shortcut off): the A/B
        route.steady = False
        md.convert(x, to)

    for _ in range(ROUNDS):
        for name, f in (("md", lambda: md.convert(x, to)), ("native", native), ("md-full", full)):
            t = time.perf_counter()
            for _ in range(PER):
                f()  # type: ignore[operator]
            sync()  # type: ignore[operator]
            rows[name].append((time.perf_counter() - t) / PER)
    m, n, f = (statistics.median(rows[k]) for k in ("md", "native", "md-full"))
    print(f"  md median {m * 1e6:8.1f} us   native median {n * 1e6:8.1f} us   ratio {m / n:5.2f}"
          f"   (+{(m - n) * 1e6:.1f} us);   without the steady route {f * 1e6:8.1f} us ({f / n:5.2f})")


def main() -> None:
    cpu_only = "--cpu" in sys.argv
    places = [("cpu", jax.devices("cpu")[0], torch.device("cpu"))]
    if not cpu_only:
        places.insert(0, ("gpu", jax.devices("gpu")[0], torch.device("cuda", 0)))
    for kind, jdev, tdev in places:
        sync = torch.cuda.synchronize if kind == "gpu" else (lambda: None)
        for mib in (1, 256):
            j = jax.device_put(jnp.ones(mib << 18, jnp.float32), jdev)
            j.block_until_ready()
            t = torch.ones(mib << 18, dtype=torch.float32, device=tdev)
            sync()
            measure(f"jax -> torch {kind} {mib} MiB", j, "torch", lambda j=j: torch.from_dlpack(j), sync)
            measure(f"torch -> jax {kind} {mib} MiB", t, "jax", lambda t=t: jax.dlpack.from_dlpack(t), sync)
    if cpu_only:
        return
    j = jax.device_put(jnp.ones(1 << 18, jnp.float32), jax.devices("gpu")[0])
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(500):
        md.convert(j, "torch")
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())


if __name__ == "__main__":
    main()
