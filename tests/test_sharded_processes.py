"""Parameters sharded over processes: ``md.data_parallel(model, optimizer, mesh=process_mesh,
param_axis=...)`` with torch's FSDP2 under the torch engine, 4 processes on a 2x2 process mesh
(launched by ``multidev.distributed.launch``). Each case against one process training the same model
on the whole batch: AdamW with weight decay and a cosine schedule built before wrapping, the batch cut
along ``data`` (ranks along ``model`` given the same rows) and along both axes (ZeRO-3's layout);
rank 0's state taken at the start (the others start elsewhere); ``verify=True`` every step;
``no_sync`` accumulation; BatchNorm buffers rank 0's after each step; gradients reduced in bfloat16
(the error it costs, bounded); a parameter without a gradient named; typed refusals
(``broadcast_state`` after sharding, bad axes, no parameter axis, a one-process mesh under a group).
Under the MPI engine (FSDP2 needs torch.distributed's group) a torch model gets multidev's own sharding
of its optimizer's state, as Keras and Gluon do, matching one process; an optimizer whose update is
not element by element is refused there (torch's LBFGS, an optax chain with a global norm clip), and so is a
framework without sharded training over processes. A JAX tree under the MPI engine gets the same (JAX's global
arrays are the jax engine's), its optax transformation checked element by element on its traced update.

JAX under the jax engine, 4 processes on the 2x2 mesh, one launch: global arrays over the processes'
devices against one process with plain optax on the whole batch (adamw with a schedule, both batch
layouts, rank 0's parameters winning, ``verify=True``: parameters within 1e-5, the loss each step
the batch's mean, each parameter cut by the core's rule and read back whole on every rank);
``no_sync``; a flax ``TrainState`` (its batch statistics rank 0's); ranks whose batches differ
raise CollectiveMismatchError on every rank and the group trains on; typed refusals; and
``examples/mesh_training.py``'s training, whose losses match one process's. The example itself
(it launches its 4 processes and checks them against one process) runs with torch."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
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
lin = torch.nn.Linear(2, 2)
try:  # (FSDP2 needs torch.distributed's group: under MPI multidev shards the state, element by element)
    md.data_parallel(lin, torch.optim.LBFGS(lin.parameters()), mesh=pm)
except md.CapabilityError as e:
    out.append("torch-elementwise" if "element by element" in str(e) else str(e))
import importlib.util
if importlib.util.find_spec("jax") and importlib.util.find_spec("optax"):
    import jax.numpy as jnp
    import optax
    try:  # (JAX's global arrays are the jax engine's: under MPI multidev shards the state, element by element)
        md.data_parallel({"w": jnp.ones(4)}, optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1)), mesh=pm)
    except md.CapabilityError as e:
        out.append("jax-elementwise" if "element by element" in str(e) and "reduce_sum" in str(e) else str(e))
else:
    out.append("jax-elementwise")  # (not installed here: nothing to refuse)
import numpy as np
try:
    md.data_parallel({"w": np.ones(2)}, None, mesh=pm)
except (md.CapabilityError, md.InvalidArgumentError) as e:
    out.append(type(e).__name__)
print("MDFSDP refused", dist.rank(), " ".join(out), flush=True)
dist.shutdown()
'''


#: What the JAX workers share: the group, the 2x2 process mesh, the batch, the model, its loss, and one
#: process's plain optax on the whole batch.
_JAX_TREES = '''
import numpy as np
import multidev as md
from multidev import distributed as dist

dist.init()
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

r, n = dist.rank(), dist.world_size()
pm = dist.process_mesh((2, 2), ("data", "model"))
rng = np.random.default_rng(1)
X, Y = rng.normal(size=(16, 6)).astype(np.float32), rng.normal(size=(16, 3)).astype(np.float32)


def make(shift=0.0):
    g = np.random.default_rng(0)
    return {"w1": jnp.asarray(g.normal(size=(6, 8)) + shift, jnp.float32), "b1": jnp.zeros(8) + shift,
            "w2": jnp.asarray(g.normal(size=(8, 3)) + shift, jnp.float32), "b2": jnp.zeros(3) + shift}


def loss_fn(p, b):
    return jnp.mean((jnp.tanh(b[0] @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"] - b[1]) ** 2)


def err(a, b):
    return max(float(np.abs(np.asarray(a[k]) - np.asarray(b[k])).max()) for k in b)


def reference(tx, steps):  # one process, plain optax, the whole batch
    p, s, losses = make(), tx.init(make()), []
    for _ in range(steps):
        lo, g = jax.value_and_grad(loss_fn)(p, (X, Y))
        u, s = tx.update(g, s, p)
        p = optax.apply_updates(p, u)
        losses.append(float(lo))
    return p, s, losses


'''

JAX_WORKER = '''
import json
from typing import Any

''' + _JAX_TREES + '''tx = optax.adamw(optax.cosine_decay_schedule(1e-2, 5), weight_decay=0.1)
ref, ref_opt, ref_losses = reference(tx, 4)
for data_axis in ("data", ("data", "model")):
    dp = md.data_parallel(make(0.0 if r == 0 else 1.0), tx, mesh=pm, data_axis=data_axis, param_axis="model",
                          verify=True)
    losses = [dp.step(dp.shard((X, Y)), loss_fn) for _ in range(4)]
    assert all(lo.is_fully_addressable and lo.shape == () for lo in losses)  # this process's own scalar
    assert np.allclose([float(lo) for lo in losses], ref_losses, rtol=1e-5), (losses, ref_losses)  # the batch's
    assert err(dp.model, ref) < 1e-5, (data_axis, err(dp.model, ref))
    glob = dict(dp.replica.parameters())
    assert not glob["['w1']"].is_fully_addressable and glob["['w1']"].addressable_data(0).shape == (3, 8)
    assert glob["['b2']"].addressable_data(0).shape == (3,)  # 3 does not divide by 2: whole everywhere
    assert all(v.is_fully_addressable and v.shape == ref[k].shape for k, v in dp.model.items())  # a checkpoint
    assert err(dp.replica.opt_state[0].mu, ref_opt[0].mu) < 1e-5
# rows that differ along "model" (each rank its own quarter, not dp.shard's halves): every row counts in
# the mean, as in FSDP2's average (never one replica's rows mixed with another's)
dp = md.data_parallel(make(), tx, mesh=pm, data_axis="data", param_axis="model")
losses = [dp.step((X[4 * r:4 * r + 4], Y[4 * r:4 * r + 4]), loss_fn) for _ in range(4)]
assert np.allclose([float(lo) for lo in losses], ref_losses, rtol=1e-5), (losses, ref_losses)
assert err(dp.model, ref) < 1e-5, err(dp.model, ref)

# no_sync: two halves accumulated, then one step = one step on the whole batch
tx = optax.sgd(0.1, momentum=0.9)
ref = reference(tx, 1)[0]
dp = md.data_parallel(make(), tx, mesh=pm, param_axis="model")
rows = dp.shard((X, Y))
with dp.no_sync():
    dp.step((rows[0][:4], rows[1][:4]), lambda p, b: loss_fn(p, b) / 2)
dp.step((rows[0][4:], rows[1][4:]), lambda p, b: loss_fn(p, b) / 2)
assert err(dp.model, ref) < 1e-5, err(dp.model, ref)


class State(train_state.TrainState):
    batch_stats: Any = None


# a TrainState carries its optimizer; its batch statistics are rank 0's
tx = optax.adam(1e-2)
ref = reference(tx, 3)[0]
st = State.create(apply_fn=None, params=make(), tx=tx, batch_stats={"mean": jnp.full(8, float(r))})
dp = md.data_parallel(st, mesh=pm, param_axis="model", verify=True)
for _ in range(3):
    dp.step(dp.shard((X, Y)), loss_fn)
assert int(dp.model.step) == 3 and err(dp.model.params, ref) < 1e-5, err(dp.model.params, ref)
assert (np.asarray(dp.model.batch_stats["mean"]) == 0).all()

# ranks whose batches differ: CollectiveMismatchError on every rank before any computes; then it trains on
dp = md.data_parallel(make(), optax.sgd(0.1), mesh=pm, param_axis="model")
outcome = []
try:
    dp.step((X[:4], Y[:4]) if r != 3 else (X[:2], Y[:2]), loss_fn)
    outcome.append("ran")
except md.CollectiveMismatchError:
    outcome.append("mismatch")
dp.step(dp.shard((X, Y)), loss_fn)
try:  # a rank reading the model (a gather) alone while the others meet at a barrier: no hang
    if r == 0:
        dp.model
    else:
        dist.barrier()
    outcome.append("ran")
except md.CollectiveMismatchError:
    outcome.append("mismatch")
dp.step(dp.shard((X, Y)), loss_fn)  # still usable
for bad in (lambda: dp.broadcast_state(),
            lambda: md.data_parallel(make(), optax.sgd(0.1), mesh=pm, grad_dtype="bfloat16"),
            lambda: md.data_parallel(st, optax.sgd(0.1), mesh=pm),
            lambda: md.data_parallel(make(), optax.sgd(0.1), mesh=pm, param_axis="nope"),
            lambda: md.data_parallel(make(), None, mesh=pm),
            lambda: md.data_parallel(make(), optax.sgd(0.1), mesh=md.make_mesh((1,), ("x",), backend="jax"))):
    try:
        bad()
        outcome.append("ran")
    except (md.CapabilityError, md.InvalidArgumentError) as e:
        outcome.append(type(e).__name__)
from multidev.examples.mesh_training import train

example = train("jax", 30, pm)
print(f"MDJAXSH rank {r}: {' '.join(outcome)} LOSSES {json.dumps(example)}", flush=True)
dist.shutdown()
'''


#: What the Keras and Gluon workers share: the group, the 2x2 process mesh and the batches.
_MESH_BATCHES = '''dist.init()
r = dist.rank()
pm = dist.process_mesh((2, 2), ("data", "model"))
rng = np.random.default_rng(1)
X, Y = rng.normal(size=(16, 6)).astype(np.float32), rng.normal(size=(16, 3)).astype(np.float32)
X2 = rng.normal(size=(16, 6)).astype(np.float32)
'''

KERAS_WORKER = '''
import os
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np
import keras
import tensorflow as tf
import multidev as md
from multidev import distributed as dist

''' + _MESH_BATCHES + '''

def make(shift=0.0):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(10, activation="tanh"), keras.layers.Dense(3)])
    for v in m.trainable_variables:
        v.assign(v + shift)
    return m


def opt(**kw):
    return keras.optimizers.AdamW(learning_rate=keras.optimizers.schedules.CosineDecay(1e-2, 6), weight_decay=0.1,
                                  **kw)


def loss_fn(m, b):
    return tf.reduce_mean(tf.square(m(b[0]) - b[1]))


def ref_step(ref, ropt, *batches):
    total = None
    for b in batches:
        with tf.GradientTape() as t:
            loss = loss_fn(ref, b)
        g = t.gradient(loss, ref.trainable_variables)
        total = g if total is None else [a + c for a, c in zip(total, g)]
    ropt.apply_gradients(zip(total, ref.trainable_variables))


def err(net, ref):
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(net.trainable_variables, ref.trainable_variables))


out = []
for data_axis in ("data", ("data", "model")):
    ref, ropt = make(), opt()
    net, o = make(1.0 if r else 0.0), opt()  # rank 0's state must win at the start
    dp = md.data_parallel(net, o, mesh=pm, data_axis=data_axis, param_axis="model", verify=True)
    pieces = [tuple(v.shape) for v in dp.replica._pieces.variables]
    assert pieces == [(3, 10), (5,), (5, 3), (3,)], pieces  # the core's rule: the first dimension 2 divides
    for step in range(3):
        loss = dp.step(dp.shard((X, Y)), loss_fn)
        ref_step(ref, ropt, (X, Y))
        assert np.isfinite(float(loss))
    with dp.no_sync():
        dp.step(dp.shard((X2, Y)), loss_fn)
    dp.step(dp.shard((X, Y)), loss_fn)
    ref_step(ref, ropt, (X2, Y), (X, Y))
    assert err(net, ref) < 1e-5, (data_axis, err(net, ref))
    assert int(dp.replica._pieces.optimizer.iterations.numpy()) == 4 and int(o.iterations.numpy()) == 4
    out.append("match")
# the optimizer given stays the handle: a learning rate set between steps is the pieces' next step's
net, o = make(), keras.optimizers.Adam(1e-2)
dp = md.data_parallel(net, o, mesh=pm, param_axis="model")
dp.step(dp.shard((X, Y)), loss_fn)
before = [np.asarray(v) for v in net.trainable_variables]
o.learning_rate = 0.0
dp.step(dp.shard((X, Y)), loss_fn)
assert all(np.array_equal(a, np.asarray(v)) for a, v in zip(before, net.trainable_variables)), "lr 0 moved weights"
o.learning_rate = 1e-2
dp.step(dp.shard((X, Y)), loss_fn)
assert not all(np.array_equal(a, np.asarray(v)) for a, v in zip(before, net.trainable_variables))
out.append("lr")
# a parameter without a gradient on one rank only: every rank refuses the step at once, nothing moved


def partial(m, b):  # rank 1's loss leaves the second layer out
    return tf.reduce_mean(tf.square(m.layers[0](b[0]))) if r == 1 else loss_fn(m, b)


before = [np.asarray(v) for v in net.trainable_variables]
steps = int(dp.replica._pieces.optimizer.iterations.numpy())
try:
    dp.step(dp.shard((X, Y)), partial)
except (md.InvalidArgumentError, md.CollectiveMismatchError) as e:
    out.append("InvalidArgumentError" if r == 1 else type(e).__name__)
assert all(np.array_equal(a, np.asarray(v)) for a, v in zip(before, net.trainable_variables))
assert int(dp.replica._pieces.optimizer.iterations.numpy()) == steps
dp.step(dp.shard((X, Y)), loss_fn)  # the group and the optimizer go on
for bad in (lambda: keras.optimizers.Lamb(1e-2), lambda: keras.optimizers.Adam(1e-2, clipnorm=1.0),
            lambda: keras.optimizers.Adam(1e-2, use_ema=True)):
    net = make(1.0 if r else 0.0)
    try:
        md.data_parallel(net, bad(), mesh=pm, param_axis="model")
    except md.CapabilityError:
        out.append("CapabilityError")
    # refused before anything moved: this rank's weights are its own, not rank 0's
    assert err(net, make(1.0 if r else 0.0)) == 0.0
stepped, net = opt(), make()
stepped.apply_gradients(zip([tf.zeros_like(v) for v in net.trainable_variables], net.trainable_variables))
try:
    md.data_parallel(net, stepped, mesh=pm, param_axis="model")
except md.CapabilityError:
    out.append("CapabilityError")
dp = md.data_parallel(make(), opt(), mesh=pm, param_axis="model")
try:
    dp.broadcast_state()
except md.CapabilityError:
    out.append("CapabilityError")
print(f"MDKERAS rank {r}: {' '.join(out)}", flush=True)
dist.shutdown()
'''


TORCH_MPI_WORKER = '''
import numpy as np
import torch
import multidev as md
from multidev import distributed as dist

''' + _MESH_BATCHES + '''

def make(shift=0.0):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(shift)
    return m


def opt(m):  # two groups of their own settings, and a schedule stepped by the user
    o = torch.optim.AdamW([{"params": m[0].parameters(), "lr": 1e-2}, {"params": m[2].parameters(), "lr": 5e-3}],
                          weight_decay=0.1)
    return o, torch.optim.lr_scheduler.StepLR(o, 2, 0.5)


loss_fn = lambda m, b: ((m(b[0]) - b[1]) ** 2).mean()
out = []
for data_axis in ("data", ("data", "model")):
    ref, net = make(), make(1.0 if r else 0.0)  # rank 0's state must win at the start
    (ro, rs), (o, s) = opt(ref), opt(net)
    dp = md.data_parallel(net, o, mesh=pm, data_axis=data_axis, param_axis="model", verify=True)
    assert type(dp.replica).__name__ == "ManagedShardedReplica", type(dp.replica)
    assert [tuple(p.shape) for p in dp.replica._pieces.params] == [(5, 6), (5,), (3, 5), (3,)]
    for xs in (X, X2, X, X2):
        x, y = torch.from_numpy(xs), torch.from_numpy(Y)
        loss = loss_fn(ref, (x, y))
        ro.zero_grad()
        loss.backward()
        ro.step()
        rs.step()
        dp.step(dp.shard((x, y)), loss_fn)
        s.step()
    err = max(float((a - b).abs().max()) for a, b in zip(ref.parameters(), net.parameters()))
    out.append("match" if err < 1e-5 and [g["lr"] for g in o.param_groups] == [2.5e-3, 1.25e-3] else f"err {err}")
print(f"MDTORCHMPI rank {r}: {' '.join(out)}", flush=True)
dist.shutdown()
'''

JAX_MPI_WORKER = _JAX_TREES + '''
out = []
tx = optax.adamw(optax.cosine_decay_schedule(1e-2, 5), weight_decay=0.1)
ref = reference(tx, 4)[0]
for data_axis in ("data", ("data", "model")):
    dp = md.data_parallel(make(0.0 if r == 0 else 1.0), tx, mesh=pm, data_axis=data_axis, param_axis="model",
                          verify=True)
    assert type(dp.replica).__name__ == "ManagedShardedReplica", type(dp.replica)
    for _ in range(4):
        dp.step(dp.shard((X, Y)), loss_fn)  # (the loss of this rank's rows, as DDP's)
    mu = dp.replica._pieces.state[0].mu  # this rank's pieces of Adam's first moment only
    shapes = [tuple(mu[k].shape) for k in ("w1", "b1", "w2", "b2")]
    ok = err(dp.model, ref) < 1e-5
    out.append("match" if ok and shapes == [(3, 8), (4,), (4, 3), (3,)] else f"{err(dp.model, ref)} {shapes}")
# a TrainState: its step count follows; its whole optimizer state is the pieces' now
tx = optax.adam(1e-2)
ref = reference(tx, 3)[0]
st = train_state.TrainState.create(apply_fn=None, params=make(), tx=tx)
dp = md.data_parallel(st, mesh=pm, param_axis="model")
for _ in range(3):
    dp.step(dp.shard((X, Y)), loss_fn)
out.append("state" if int(dp.model.step) == 3 and dp.model.opt_state is None and err(dp.model.params, ref) < 1e-5
           else f"state {int(dp.model.step)} {err(dp.model.params, ref)}")
# no_sync: two halves accumulated, then one step = one step on the whole batch
tx = optax.sgd(0.1, momentum=0.9)
ref = reference(tx, 1)[0]
dp = md.data_parallel(make(), tx, mesh=pm, param_axis="model")
rows = dp.shard((X, Y))
with dp.no_sync():
    dp.step((rows[0][:4], rows[1][:4]), lambda p, b: loss_fn(p, b) / 2)
dp.step((rows[0][4:], rows[1][4:]), lambda p, b: loss_fn(p, b) / 2)
out.append("no_sync" if err(dp.model, ref) < 1e-5 else f"no_sync {err(dp.model, ref)}")
for bad in (lambda: md.data_parallel(make(), optax.lamb(1e-2), mesh=pm, param_axis="model"),
            lambda: md.data_parallel(make(), optax.chain(optax.add_noise(0.1, 0.5, 0), optax.sgd(0.1)), mesh=pm),
            lambda: dp.replica.optimizer_state()):
    try:
        bad()
        out.append("ran")
    except md.CapabilityError as e:
        out.append("refused" if "element by element" in str(e) or "piece of the optimizer" in str(e) else str(e))
print(f"MDJAXMPI rank {r}: {' '.join(out)}", flush=True)
dist.shutdown()
'''

MXNET_WORKER = '''
import numpy as np
import multidev as md
md.backend("mxnet")  # the adapter first: it prepares MXNet's import on NumPy 1.26
import mxnet as mx
from mxnet import autograd, gluon
from multidev import distributed as dist

''' + _MESH_BATCHES + '''

def make(shift=0.0):
    mx.random.seed(0)
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(10, in_units=6, activation="tanh"), gluon.nn.Dense(3, in_units=10))
    net.initialize(mx.init.Xavier())
    for p in net.collect_params().values():
        p.set_data(p.data() + shift)
    return net


def trainer(net, kind="adam", **kw):
    return gluon.Trainer(net.collect_params(), kind, {"learning_rate": 1e-2, "wd": 0.01, **kw})


def loss_fn(m, b):
    return ((m(b[0]) - b[1]) ** 2).mean()


def ref_step(ref, rt, *batches):
    for b in batches:
        with autograd.record():
            loss = loss_fn(ref, (mx.nd.array(b[0]), mx.nd.array(b[1])))
        loss.backward()  # (grad_req "write": the second batch would overwrite the first)
        if len(batches) > 1:
            acc = [p.grad().copy() for p in ref.collect_params().values()] if b is batches[0] else \
                [a + p.grad() for a, p in zip(acc, ref.collect_params().values())]
    if len(batches) > 1:
        for p, a in zip(ref.collect_params().values(), acc):
            p.grad()[:] = a
    rt.step(1)


def err(net, ref):
    return max(float(np.abs(a.data().asnumpy() - b.data().asnumpy()).max())
               for a, b in zip(net.collect_params().values(), ref.collect_params().values()))


out = []
for data_axis in ("data", ("data", "model")):
    ref, net = make(), make(1.0 if r else 0.0)  # rank 0's state must win at the start
    rt, t = trainer(ref), trainer(net)
    dp = md.data_parallel(net, t, mesh=pm, data_axis=data_axis, param_axis="model", verify=True)
    pieces = [tuple(p.shape) for p in dp.replica._pieces.params]
    assert pieces == [(5, 6), (5,), (3, 5), (3,)], pieces  # the core's rule: the first dimension 2 divides
    for step in range(3):
        loss = dp.step(dp.shard((mx.nd.array(X), mx.nd.array(Y))), loss_fn)
        ref_step(ref, rt, (X, Y))
        assert np.isfinite(float(loss.asnumpy()[0]))
    with dp.no_sync():
        dp.step(dp.shard((mx.nd.array(X2), mx.nd.array(Y))), loss_fn)
    dp.step(dp.shard((mx.nd.array(X), mx.nd.array(Y))), loss_fn)
    ref_step(ref, rt, (X2, Y), (X, Y))
    assert err(net, ref) < 1e-5, (data_axis, err(net, ref))
    assert not any(u.states for u in t._updaters), "the Trainer given keeps no state: the pieces' Trainer does"
    assert t._optimizer.num_update == 4, t._optimizer.num_update  # the Trainer given follows the steps
    out.append("match")
# the Trainer given stays the handle: set_learning_rate between steps is the pieces' next step's
net = make()
t = trainer(net, wd=0.0)
dp = md.data_parallel(net, t, mesh=pm, param_axis="model")
batch = dp.shard((mx.nd.array(X), mx.nd.array(Y)))
dp.step(batch, loss_fn)
before = [p.data().asnumpy() for p in net.collect_params().values()]
t.set_learning_rate(0.0)
dp.step(batch, loss_fn)
assert all(np.array_equal(a, p.data().asnumpy()) for a, p in zip(before, net.collect_params().values()))
out.append("lr")
net = make(1.0 if r else 0.0)
try:
    md.data_parallel(net, trainer(net, "lamb"), mesh=pm, param_axis="model")
except md.CapabilityError:
    out.append("CapabilityError")
assert err(net, make(1.0 if r else 0.0)) == 0.0  # refused before anything moved: not rank 0's weights
print(f"MDGLUON rank {r}: {' '.join(out)}", flush=True)
dist.shutdown()
'''


def _run(tmp_path: Path, source: str, n: int, engine: str) -> subprocess.CompletedProcess:
    script = tmp_path / "worker.py"
    script.write_text(source)
    env = dict(os.environ, PYTHONWARNINGS="ignore", MULTIDEV_JAX_CPU_DEVICES="1", TF_CPP_MIN_LOG_LEVEL="3")
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
    found = sorted(re.findall(r"MDFSDP refused (\d) (torch-elementwise jax-elementwise CapabilityError)", p.stdout))
    assert found == [(str(r), "torch-elementwise jax-elementwise CapabilityError") for r in range(2)], p.stdout[-3000:]


@pytest.mark.multiprocess
def test_jax_global_arrays_over_a_process_mesh_match_one_process(tmp_path: Path) -> None:
    for mod in ("jax", "optax", "flax"):
        pytest.importorskip(mod)
    from multidev.distributed.engine import engine_class
    from multidev.examples.mesh_training import train

    if engine_class("jax").missing():
        pytest.skip("the jax engine is not available here")
    p = _run(tmp_path, JAX_WORKER, 4, "jax")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    want = ("mismatch mismatch CapabilityError CapabilityError InvalidArgumentError InvalidArgumentError "
            "InvalidArgumentError CapabilityError")
    found = {}
    for m in re.finditer(r"MDJAXSH rank (\d): ([A-Za-z ]+?) LOSSES ", p.stdout):  # (lines may interleave)
        found[int(m.group(1))] = (m.group(2), json.JSONDecoder().raw_decode(p.stdout, m.end())[0])
    assert sorted(found) == [0, 1, 2, 3] and all(w == want for w, _ in found.values()), p.stdout[-3000:]
    one = train("jax", 30)  # the example's training in this one process, on the whole batches
    assert one[-1] < one[0] / 2, one
    for _, losses in found.values():
        np.testing.assert_allclose(losses, one, rtol=1e-5)


@pytest.mark.multiprocess
def test_the_mesh_training_example_matches_one_process() -> None:
    """``python -m multidev.examples.mesh_training --backend torch`` starts its 4 processes (FSDP2
    under the torch engine), trains one process meanwhile, and exits 0 only where the losses fell
    and match (the JAX side of the example runs in the JAX test above, in its launch)."""
    pytest.importorskip("torch")
    from multidev.distributed.engine import engine_class

    if engine_class("torch").missing():
        pytest.skip("the torch engine is not available here")
    p = subprocess.run([sys.executable, "-m", "multidev.examples.mesh_training", "--backend", "torch"],
                       capture_output=True, text=True, timeout=400, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    assert "the same losses" in p.stdout and "2x2 process mesh" in p.stdout, p.stdout


@pytest.mark.multiprocess
def test_keras_with_its_optimizer_state_sharded_by_multidev_matches_one_process(tmp_path: Path) -> None:
    """Keras has no sharded data parallelism of its own: multidev shards the optimizer's state
    (:mod:`multidev.managed_sharding`). 4 processes on the 2x2 mesh under the torch engine: AdamW with
    weight decay and a schedule, both batch layouts, rank 0's state winning, ``verify=True``,
    ``no_sync``: the weights within 1e-5 of one process's, each rank's optimizer over its pieces only;
    the optimizer given followed (its learning rate set between steps, its step count); a parameter
    without a gradient on one rank refused on every rank at once, nothing stepped; typed refusals
    before anything moves (LAMB, clipnorm, use_ema, an optimizer that has stepped, ``broadcast_state``)."""
    for mod in ("tensorflow", "keras", "torch"):
        pytest.importorskip(mod, reason=f"{mod}: Keras on TensorFlow, under the torch engine")
    from multidev.distributed.engine import engine_class

    if engine_class("torch").missing():
        pytest.skip("the torch engine is not available here")
    p = _run(tmp_path, KERAS_WORKER, 4, "torch")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    found = sorted(re.findall(r"MDKERAS rank (\d): (match match lr (?:[A-Za-z]+Error ?)+)", p.stdout))
    refused = "CapabilityError " * 5
    want = [(str(r), f"match match lr {'InvalidArgumentError' if r == 1 else 'CollectiveMismatchError'} {refused}"
             .strip()) for r in range(4)]
    assert found == want, p.stdout[-3000:]


@pytest.mark.multiprocess
def test_torch_under_mpi_with_its_optimizer_state_sharded_by_multidev_matches_one_process(tmp_path: Path) -> None:
    """FSDP2 runs on torch.distributed's group only: under the MPI engine multidev shards a torch
    optimizer's state itself (4 processes on the 2x2 mesh): AdamW in two parameter groups of their
    own learning rates with a StepLR schedule stepped by the user, both batch layouts, rank 0's state
    winning, ``verify=True``: the weights within 1e-5 of one process's, each rank's optimizer over its
    pieces only, the user's groups followed."""
    pytest.importorskip("torch")
    from multidev.distributed.engine import engine_class

    if engine_class("mpi").missing():
        pytest.skip(f"the mpi engine is not available here: {engine_class('mpi').missing()}")
    p = _run(tmp_path, TORCH_MPI_WORKER, 4, "mpi")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    found = sorted(re.findall(r"MDTORCHMPI rank (\d): (.*)", p.stdout))
    assert found == [(str(r), "match match") for r in range(4)], p.stdout[-3000:]


@pytest.mark.multiprocess
def test_jax_under_mpi_with_its_optimizer_state_sharded_by_multidev_matches_one_process(tmp_path: Path) -> None:
    """JAX's global arrays are the jax engine's: under MPI multidev shards an optax transformation's
    state itself, once its traced update reads element by element (4 processes on the 2x2 mesh): AdamW
    with a schedule in both batch layouts, rank 0's state winning, ``verify=True``, a TrainState's
    step count, ``no_sync``; LAMB and added noise refused on every rank."""
    pytest.importorskip("optax")
    pytest.importorskip("flax")
    from multidev.distributed.engine import engine_class

    if engine_class("mpi").missing():
        pytest.skip(f"the mpi engine is not available here: {engine_class('mpi').missing()}")
    p = _run(tmp_path, JAX_MPI_WORKER, 4, "mpi")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    found = sorted(re.findall(r"MDJAXMPI rank (\d): (.*)", p.stdout))
    assert found == [(str(r), "match match state no_sync refused refused refused") for r in range(4)], p.stdout[-3000:]


@pytest.mark.multiprocess
def test_gluon_with_its_optimizer_state_sharded_by_multidev_matches_one_process_mxnet(tmp_path: Path) -> None:
    """Gluon, as Keras: multidev shards the Trainer's optimizer state (4 processes on the 2x2 mesh,
    torch engine): Adam with weight decay, both batch layouts, rank 0's state winning, ``verify=True``,
    ``no_sync``: the parameters within 1e-5 of one process's; the Trainer given followed (its update
    count, ``set_learning_rate`` between steps); LAMB (a per-layer trust ratio) refused before rank
    0's state moved."""
    import importlib.util

    for mod in ("mxnet", "torch"):  # (found, not imported: MXNet's import is the adapter's to prepare)
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed: Gluon, under the torch engine (the MXNet lane has both)")
    from multidev.distributed.engine import engine_class

    if engine_class("torch").missing():
        pytest.skip("the torch engine is not available here")
    p = _run(tmp_path, MXNET_WORKER, 4, "torch")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    found = sorted(re.findall(r"MDGLUON rank (\d): (match match lr CapabilityError)", p.stdout))
    assert found == [(str(r), "match match lr CapabilityError") for r in range(4)], p.stdout[-3000:]
