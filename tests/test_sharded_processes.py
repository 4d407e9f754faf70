"""Parameters sharded over processes: ``md.data_parallel(model, optimizer, mesh=process_mesh,
param_axis=...)`` with torch's FSDP2 under the torch engine, 4 processes on a 2x2 process mesh
(launched by ``multidev.distributed.launch``). Each case against one process training the same model
on the whole batch: AdamW with weight decay and a cosine schedule built before wrapping, the batch cut
along ``data`` (ranks along ``model`` given the same rows) and along both axes (ZeRO-3's layout);
rank 0's state taken at the start (the others start elsewhere); ``verify=True`` every step;
``no_sync`` accumulation; BatchNorm buffers rank 0's after each step; gradients reduced in bfloat16
(the error it costs, bounded); a parameter without a gradient named; typed refusals
(``broadcast_state`` after sharding, bad axes, no parameter axis, a one-process mesh under a group).
Under the MPI engine a torch model is refused (FSDP2 needs torch.distributed's group), and so is a
framework without sharded training over processes."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = '''
import numpy as np
import torch
import multidev as md
from multidev import distributed as dist

dist.init()
r, n = dist.rank(), dist.world_size()
pm = dist.process_mesh((2, 2), ("data", "model"))
g = torch.Generator().manual_seed(1)
X, Y = torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)
loss_fn = lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1])


def make(bn=False):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3)]
    return torch.nn.Sequential(*(layers[:1] + [torch.nn.BatchNorm1d(10)] + layers[1:] if bn else layers))


def pair(opt_cls=torch.optim.AdamW, bn=False, **kw):
    ref, net = make(bn), make(bn)
    if r != 0:
        with torch.no_grad():
            for p in net.parameters():
                p.add_(1.0)  # rank 0's state must win at the start
    return ref, opt_cls(ref.parameters(), lr=1e-2, **kw), net, opt_cls(net.parameters(), lr=1e-2, **kw)


def err(net, ref):
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in net.state_dict().items()}
    return max((full[k].float() - v.float()).abs().max().item() for k, v in ref.state_dict().items())


for data_axis in ("data", ("data", "model")):
    ref, ropt, net, opt = pair(weight_decay=0.1)
    rs, sched = (torch.optim.lr_scheduler.CosineAnnealingLR(o, 5) for o in (ropt, opt))
    dp = md.data_parallel(net, opt, mesh=pm, data_axis=data_axis, param_axis="model", verify=True)
    assert type(net[0].weight).__name__ == "DTensor" and dp.model is net
    for step in range(4):
        dp.step(dp.shard((X, Y)), loss_fn)
        sched.step()
        loss_fn(ref, (X, Y)).backward(); ropt.step(); ropt.zero_grad(); rs.step()
    assert err(net, ref) < 1e-5, (data_axis, err(net, ref))
    plain = make()
    plain.load_state_dict({k: v.full_tensor() for k, v in net.state_dict().items()})  # a checkpoint, no prefix
    assert err(plain, ref) < 1e-5

# no_sync: two halves accumulated, then one step = one step on the whole batch
ref, ropt, net, opt = pair(torch.optim.SGD, momentum=0.9)
dp = md.data_parallel(net, opt, mesh=pm, param_axis="model")
rows = dp.shard((X, Y))
with dp.no_sync():
    dp.step((rows[0][:4], rows[1][:4]), lambda m, b: loss_fn(m, b) / 2)
dp.step((rows[0][4:], rows[1][4:]), lambda m, b: loss_fn(m, b) / 2)
loss_fn(ref, (X, Y)).backward(); ropt.step(); ropt.zero_grad()
assert err(net, ref) < 1e-5, err(net, ref)

# BatchNorm: each rank normalises with its rows, buffers are rank 0's after each step
ref, ropt, net, opt = pair(bn=True)
dp = md.data_parallel(net, opt, mesh=pm, param_axis="model", verify=True)
for step in range(2):
    dp.step(dp.shard((X, Y)), loss_fn)
mean = dist.allgather(net[1].running_mean.reshape(1, -1))
assert all(torch.equal(mean[0], mean[k]) for k in range(n))

# gradients reduced in bfloat16: close to float32's, not equal
ref, ropt, net, opt = pair(torch.optim.SGD)
dp = md.data_parallel(net, opt, mesh=pm, param_axis="model", grad_dtype="bfloat16")
dp.step(dp.shard((X, Y)), loss_fn)
loss_fn(ref, (X, Y)).backward(); ropt.step(); ropt.zero_grad()
assert 0 < err(net, ref) < 1e-3, err(net, ref)

# a parameter without a gradient is named; unused="zero" steps on
class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.a(x)

for unused in ("error", "zero"):
    m = Two()
    dp = md.data_parallel(m, torch.optim.SGD(m.parameters(), lr=0.1), mesh=pm, param_axis="model", unused=unused)
    try:
        dp.step(dp.shard((X, Y)), loss_fn)
        assert unused == "zero"
    except md.InvalidArgumentError as e:
        assert unused == "error" and "b.weight" in str(e), e

outcome = []
for bad in (lambda: dp.broadcast_state(),
            lambda: md.data_parallel(make(), None, mesh=pm, param_axis="nope"),
            lambda: md.data_parallel(make(), None, mesh=pm, data_axis=("data", "model"), param_axis=()),
            lambda: md.data_parallel(make(), None, mesh=md.make_mesh((1,), ("x",), backend="torch"))):
    try:
        bad()
        outcome.append("ran")
    except (md.CapabilityError, md.InvalidArgumentError) as e:
        outcome.append(type(e).__name__)
print(f"MDFSDP rank {r}: {' '.join(outcome)}", flush=True)
dist.shutdown()
'''

REFUSED = '''
import torch
import multidev as md
from multidev import distributed as dist

dist.init()
pm = dist.process_mesh((1, dist.world_size()), ("data", "model"))
out = []
try:
    md.data_parallel(torch.nn.Linear(2, 2), None, mesh=pm)
except md.CapabilityError as e:
    out.append("torch-engine" if "torch engine" in str(e) else str(e))
import numpy as np
try:
    md.data_parallel({"w": np.ones(2)}, None, mesh=pm)
except (md.CapabilityError, md.InvalidArgumentError) as e:
    out.append(type(e).__name__)
print("MDFSDP refused", dist.rank(), " ".join(out), flush=True)
dist.shutdown()
'''


def _run(tmp_path: Path, source: str, n: int, engine: str) -> subprocess.CompletedProcess:
    script = tmp_path / "worker.py"
    script.write_text(source)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "multidev.distributed.launch", "-n", str(n), "--engine", engine,
                           str(script)], capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)


@pytest.mark.multiprocess
def test_fsdp_over_a_process_mesh_matches_one_process(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from multidev.distributed.engine import engine_class

    if engine_class("torch").missing():
        pytest.skip("the torch engine is not available here")
    p = _run(tmp_path, WORKER, 4, "torch")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    found = sorted(re.findall(r"MDFSDP rank (\d): ((?:[A-Za-z]+Error ?)+)", p.stdout))  # (lines may interleave)
    want = "CapabilityError InvalidArgumentError InvalidArgumentError CapabilityError"
    assert [(r, w.strip()) for r, w in found] == [(str(r), want) for r in range(4)], p.stdout[-3000:]


@pytest.mark.multiprocess
def test_sharding_over_processes_is_refused_where_it_cannot_run(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from multidev.distributed.engine import engine_class

    if engine_class("mpi").missing():
        pytest.skip(f"the mpi engine is not available here: {engine_class('mpi').missing()}")
    p = _run(tmp_path, REFUSED, 2, "mpi")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    found = sorted(re.findall(r"MDFSDP refused (\d) (torch-engine CapabilityError)", p.stdout))
    assert found == [(str(r), "torch-engine CapabilityError") for r in range(2)], p.stdout[-3000:]
