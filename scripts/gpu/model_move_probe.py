"""Where md.to(model) spends its time on a real move (issue 36's LeNet row: 1.16x module.to on the
H200): D2L's LeNet moved cpu:0 -> gpu:0 -> cpu:0, md.to against module.to in alternating rounds
(medians), then a cProfile of the md loop (top 25 by own time). torch (with JAX loaded, as in the
bench's process, where JAX is a partner)."""
from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time

import torch

import multidev as md

try:
    import jax  # noqa: F401  (loaded as in the bench)
    md.backend("jax")
except Exception:  # noqa: BLE001
    pass
md.backend("torch")
nn = torch.nn
net = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Conv2d(6, 16, 5),
                    nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Flatten(), nn.Linear(400, 120), nn.Sigmoid(),
                    nn.Linear(120, 84), nn.Sigmoid(), nn.Linear(84, 10))
g, c = torch.device("cuda", 0), torch.device("cpu")


def md_move() -> None:
    md.to(net, "gpu:0")
    md.to(net, "cpu:0")


def native_move() -> None:
    net.to(g)
    net.to(c)


def first_param() -> None:
    for dev in (g, c):
        for t in net.parameters():
            if t.device != dev:
                break
        net.to(dev)


for f in (md_move, native_move, first_param):
    for _ in range(20):
        f()
rows: dict[str, list[float]] = {"md": [], "native": [], "first_param+to": []}
for _ in range(40):
    for name, f in (("md", md_move), ("native", native_move), ("first_param+to", first_param)):
        t = time.perf_counter()
        for _ in range(10):
            f()
        rows[name].append((time.perf_counter() - t) / 10)
for k, v in rows.items():
    print(f"{k:16s} median {statistics.median(v) * 1e6:8.1f} us a round trip")
pr = cProfile.Profile()
pr.enable()
for _ in range(300):
    md_move()
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
print(s.getvalue())
