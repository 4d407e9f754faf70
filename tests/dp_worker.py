"""One rank of tests/test_data_parallel_processes.py (or the whole job, run alone): the data-parallel
scenarios of ``FRAMEWORK`` (argv[1]), each rank writing its parameters to ``OUT`` (argv[2]) as
``SCENARIO-RANK.npz`` and what it saw to ``report-RANK.json``. Alone (no launcher), it is the
one-process reference on the whole batch."""
from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np

import multidev as md
from multidev import distributed as dist

FRAMEWORK, OUT = sys.argv[1], Path(sys.argv[2])
ONLY = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
B, K = 12, 3  # global batch (divisible by 2 and 3), steps
if FRAMEWORK == "jax":
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
LAUNCHED = bool(dist.detect_launch())
if LAUNCHED:
    dist.init()
RANK = dist.rank() if LAUNCHED else 0
report: dict[str, Any] = {"rank": RANK, "world": dist.world_size() if LAUNCHED else 1, "errors": {}}


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(100 + step)
    return g.standard_normal((B, 1, 8, 8)).astype(np.float32), g.integers(0, 4, B).astype(np.int64)


def save(name: str, arrays: dict[str, Any]) -> None:
    np.savez(OUT / f"{name}-{RANK}.npz", **{k: np.asarray(md.to_numpy(v)) for k, v in arrays.items()})


def scenario(fn: Any) -> Any:
    if ONLY is None or fn.__name__ in ONLY:
        try:
            fn()
        except Exception:  # noqa: BLE001 - reported to the test
            report["errors"][fn.__name__] = traceback.format_exc(limit=8)
    return fn


if FRAMEWORK == "torch":
    import torch
    import torch.nn.functional as F

    def cnn(seed: int, bn: bool = False, extra: bool = False) -> Any:
        torch.manual_seed(seed)
        layers = [torch.nn.Conv2d(1, 4, 3, padding=1), *([torch.nn.BatchNorm2d(4)] if bn else []), torch.nn.ReLU(),
                  torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.ReLU(),
                  torch.nn.Linear(16, 4)]
        return WithExtra(layers) if extra else torch.nn.Sequential(*layers)

    class WithExtra(torch.nn.Module):
        """A network with a layer it never calls: that layer gets no gradient."""

        def __init__(self, layers: list[Any]) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(*layers)
            self.extra = torch.nn.Linear(3, 3)

        def forward(self, x: Any) -> Any:
            return self.body(x)

    def tbatch(step: int) -> tuple[Any, Any]:
        X, y = batch(step)
        return torch.from_numpy(X), torch.from_numpy(y)

    def loss_fn(m: Any, b: Any) -> Any:
        return F.cross_entropy(m(b[0]), b[1])

    def params(net: Any) -> dict[str, Any]:
        return {k: v.detach() for k, v in net.state_dict().items()}

    def sgd(net: Any) -> tuple[Any, Any]:
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=K)

    @scenario
    def equal() -> None:
        """Each rank starts from its own seed; rank 0's state wins; K steps with momentum, weight
        decay and a cosine schedule, buckets of a few parameters, the replica check each step."""
        net = cnn(1 + RANK)
        opt, sched = sgd(net)
        dp = md.data_parallel(net, opt, bucket_mb=0.001, verify=True)
        for k in range(K):
            dp.step(dp.shard(tbatch(k)), loss_fn)
            sched.step()
        report["equal"] = {"collectives": dp.sync.collectives if dp.sync else 0,
                           "buckets": len(dp.sync.buckets) if dp.sync else 0}
        save("equal", params(net))

    @scenario
    def manual() -> None:
        """The user's own loop (forward, backward, optimizer step) on the wrapped model."""
        net = cnn(1 + RANK)
        opt, sched = sgd(net)
        dp = md.data_parallel(net, opt, bucket_mb=0.001)
        for k in range(K):
            X, y = dp.shard(tbatch(k))
            loss = F.cross_entropy(dp(X), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
        dp.verify()
        dp.close()
        save("manual", params(net))

    @scenario
    def no_sync() -> None:
        """Two micro-batches: the first inside no_sync (no collective), the second averages the sum."""
        net = cnn(1)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        dp = md.data_parallel(net, opt)
        before = dp.sync.collectives if dp.sync else 0
        with dp.no_sync():
            dp.step(dp.shard(tbatch(0)), lambda m, b: loss_fn(m, b) / 2)
        inside = (dp.sync.collectives if dp.sync else 0) - before
        dp.step(dp.shard(tbatch(1)), lambda m, b: loss_fn(m, b) / 2)
        dp.verify()
        dp.close()
        report["no_sync"] = {"inside": inside, "after": (dp.sync.collectives if dp.sync else 0) - before}
        save("no_sync", params(net))

    @scenario
    def bn_adam() -> None:
        """BatchNorm (rank 0's buffers before each forward) and Adam whose state exists on rank 0
        alone at the start (one local step there): the optimizer state is broadcast too."""
        net = cnn(1 + RANK, bn=True)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        if RANK == 0:
            loss_fn(net, tbatch(9)).backward()
            opt.step()
        dp = md.data_parallel(net, opt, verify=True)
        for k in range(K):
            dp.step(dp.shard(tbatch(k)), loss_fn)
        dp.close()
        report["bn_adam"] = {"adam_steps": int(opt.state_dict()["state"][0]["step"])}
        save("bn_adam", params(net))

    @scenario
    def unused() -> None:
        """A parameter without a gradient: refused naming it, or counted as zeros."""
        net = cnn(1, extra=True)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        dp = md.data_parallel(net, opt)
        try:
            dp.step(dp.shard(tbatch(0)), loss_fn)
            report["unused_error"] = None
        except md.InvalidArgumentError as e:
            report["unused_error"] = str(e)
        dp.close()
        net = cnn(1, extra=True)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        w0 = net.extra.weight.detach().clone()
        dp = md.data_parallel(net, opt, unused="zero", verify=True)
        dp.step(dp.shard(tbatch(0)), loss_fn)
        dp.close()
        report["unused_zero_kept"] = bool(torch.equal(w0, net.extra.weight))
        save("unused", params(net))

    @scenario
    def reload() -> None:
        """broadcast_state alone: rank 0 loads a checkpoint (other values, optimizer state with
        momentum), then every rank takes it."""
        net = cnn(1 + RANK)
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        if RANK == 0:
            ck = cnn(7)
            ck_opt = torch.optim.SGD(ck.parameters(), lr=0.1, momentum=0.9)
            loss_fn(ck, tbatch(5)).backward()
            ck_opt.step()
            net.load_state_dict(ck.state_dict())
            opt.load_state_dict(ck_opt.state_dict())
        assert md.broadcast_state(net, opt) is net
        momentum = opt.state_dict()["state"][0]["momentum_buffer"]
        save("reload", {**params(net), "momentum0": momentum})

    @scenario
    def checks() -> None:
        """One consistency exchange per step by default; none with checks="start"."""
        from multidev.distributed.group import current

        seen = {}
        for policy in ("step", "start"):
            net = cnn(1)
            dp = md.data_parallel(net, torch.optim.SGD(net.parameters(), lr=0.1), bucket_mb=0.001, checks=policy)
            before = current().seq if LAUNCHED else 0
            for k in range(K):
                dp.step(dp.shard(tbatch(k)), loss_fn)
            seen[policy] = (current().seq if LAUNCHED else 0) - before
            dp.close()
        report["checks"] = seen

    @scenario
    def drift() -> None:
        """A rank whose parameter drifted: the replica check names it on every rank."""
        net = cnn(1)
        dp = md.data_parallel(net, torch.optim.SGD(net.parameters(), lr=0.1))
        dp.step(dp.shard(tbatch(0)), loss_fn)
        if RANK == 1:
            with torch.no_grad():
                net[6].bias.add_(1e-6)
        try:
            dp.verify()
            report["drift"] = None
        except md.ReplicaMismatchError as e:
            report["drift"] = str(e)
        dp.close()

    @scenario
    def bf16() -> None:
        """As ``equal`` with the gradients exchanged in bfloat16."""
        net = cnn(1 + RANK)
        opt, sched = sgd(net)
        dp = md.data_parallel(net, opt, bucket_mb=0.001, grad_dtype="bfloat16", verify=True)
        for k in range(K):
            dp.step(dp.shard(tbatch(k)), loss_fn)
            sched.step()
        dp.close()
        save("bf16", params(net))

elif FRAMEWORK == "jax":
    import jax.numpy as jnp
    import optax

    def mlp(seed: int) -> dict[str, Any]:
        g = np.random.default_rng(seed)
        return {"l1": {"w": jnp.asarray(g.standard_normal((64, 16)).astype(np.float32) * 0.2),
                       "b": jnp.zeros(16, jnp.float32)},
                "l2": {"w": jnp.asarray(g.standard_normal((16, 4)).astype(np.float32) * 0.2),
                       "b": jnp.zeros(4, jnp.float32)}}

    def jbatch(step: int) -> tuple[Any, Any]:
        X, y = batch(step)
        return jnp.asarray(X.reshape(B, 64)), jnp.asarray(y.astype(np.int32))

    def jloss(p: Any, b: Any) -> Any:
        h = jax.nn.relu(b[0] @ p["l1"]["w"] + p["l1"]["b"])
        logits = h @ p["l2"]["w"] + p["l2"]["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, b[1]).mean()

    def tx() -> Any:
        return optax.chain(optax.add_decayed_weights(1e-3),
                           optax.sgd(optax.cosine_decay_schedule(0.1, K), momentum=0.9))

    @scenario
    def equal() -> None:
        dp = md.data_parallel(mlp(1 + RANK), tx(), bucket_mb=0.001, verify=True)
        for k in range(K):
            dp.step(dp.shard(jbatch(k)), jloss)
        report["equal"] = {"collectives": dp.sync.collectives if dp.sync else 0,
                           "buckets": len(dp.sync.buckets) if dp.sync else 0}
        p = dp.model
        save("equal", {"l1w": p["l1"]["w"], "l1b": p["l1"]["b"], "l2w": p["l2"]["w"], "l2b": p["l2"]["b"]})

    @scenario
    def no_sync() -> None:
        dp = md.data_parallel(mlp(1), optax.sgd(0.1))
        before = dp.sync.collectives if dp.sync else 0
        with dp.no_sync():
            dp.step(dp.shard(jbatch(0)), lambda p, b: jloss(p, b) / 2)
        inside = (dp.sync.collectives if dp.sync else 0) - before
        dp.step(dp.shard(jbatch(1)), lambda p, b: jloss(p, b) / 2)
        dp.verify()
        report["no_sync"] = {"inside": inside, "after": (dp.sync.collectives if dp.sync else 0) - before}
        p = dp.model
        save("no_sync", {"l1w": p["l1"]["w"], "l2w": p["l2"]["w"]})

    @scenario
    def train_state() -> None:
        from flax.training import train_state as ts

        state = ts.TrainState.create(apply_fn=None, params=mlp(1 + RANK), tx=optax.adam(1e-2))
        dp = md.data_parallel(state, verify=True)
        for k in range(K):
            dp.step(dp.shard(jbatch(k)), jloss)
        st = dp.model
        report["train_state"] = {"step": int(st.step)}
        save("train_state", {"l1w": st.params["l1"]["w"], "l2w": st.params["l2"]["w"]})

elif FRAMEWORK == "tensorflow":
    import keras
    import tensorflow as tf

    def kmodel(seed: int, bn: bool = False) -> Any:
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                                 *([keras.layers.BatchNormalization()] if bn else []), keras.layers.Dense(4)])

    def kbatch(step: int) -> tuple[Any, Any]:
        X, y = batch(step)
        return X.reshape(B, 64), y

    def kloss(m: Any, b: Any) -> Any:
        out = m(b[0], training=True)
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(b[1], out, from_logits=True))

    def weights(m: Any) -> dict[str, Any]:
        return {f"w{i}": np.asarray(v.value) for i, v in enumerate(m.weights)}

    @scenario
    def equal() -> None:
        m = kmodel(1 + RANK)
        dp = md.data_parallel(m, keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=1e-3), bucket_mb=0.001,
                              verify=True)
        for k in range(K):
            dp.step(dp.shard(kbatch(k)), kloss)
        report["equal"] = {"collectives": dp.sync.collectives if dp.sync else 0,
                           "buckets": len(dp.sync.buckets) if dp.sync else 0}
        save("equal", weights(m))

    @scenario
    def no_sync() -> None:
        m = kmodel(1)
        dp = md.data_parallel(m, keras.optimizers.SGD(0.1))
        before = dp.sync.collectives if dp.sync else 0
        with dp.no_sync():
            dp.step(dp.shard(kbatch(0)), lambda m, b: kloss(m, b) / 2)
        inside = (dp.sync.collectives if dp.sync else 0) - before
        dp.step(dp.shard(kbatch(1)), lambda m, b: kloss(m, b) / 2)
        dp.verify()
        report["no_sync"] = {"inside": inside, "after": (dp.sync.collectives if dp.sync else 0) - before}
        save("no_sync", weights(m))

    @scenario
    def bn_adam() -> None:
        m = kmodel(1 + RANK, bn=True)
        opt = keras.optimizers.Adam(1e-2)
        if RANK == 0:
            with tf.GradientTape() as tape:
                loss = kloss(m, kbatch(9))
            opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
        dp = md.data_parallel(m, opt, verify=True)
        for k in range(K):
            dp.step(dp.shard(kbatch(k)), kloss)
        report["bn_adam"] = {"adam_steps": int(opt.iterations.numpy())}
        save("bn_adam", weights(m))

elif FRAMEWORK == "mxnet":
    md.backend("mxnet")  # the adapter first: it prepares MXNet's import on NumPy 1.26
    import mxnet as mx
    from mxnet import autograd, gluon

    def gnet(seed: int, bn: bool = False) -> Any:
        mx.random.seed(seed)
        net = gluon.nn.Sequential()
        net.add(gluon.nn.Dense(16, activation="relu"), *([gluon.nn.BatchNorm()] if bn else []), gluon.nn.Dense(4))
        net.initialize(mx.init.Xavier())
        net(mx.nd.zeros((2, 64)))
        return net

    def gbatch(step: int) -> tuple[Any, Any]:
        X, y = batch(step)
        return mx.nd.array(X.reshape(B, 64)), mx.nd.array(y.astype(np.float32))

    CE = gluon.loss.SoftmaxCrossEntropyLoss()

    def gloss(net: Any, b: Any) -> Any:
        return CE(net(b[0]), b[1]).mean()

    def gparams(net: Any) -> dict[str, Any]:
        return {f"p{i}": p.data().asnumpy() for i, p in enumerate(net.collect_params().values())}

    @scenario
    def equal() -> None:
        net = gnet(1 + RANK)
        tr = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3})
        dp = md.data_parallel(net, tr, bucket_mb=0.001, verify=True)
        for k in range(K):
            dp.step(dp.shard(gbatch(k)), gloss)
        report["equal"] = {"collectives": dp.sync.collectives if dp.sync else 0,
                           "buckets": len(dp.sync.buckets) if dp.sync else 0}
        save("equal", gparams(net))

    @scenario
    def no_sync() -> None:
        net = gnet(1)
        dp = md.data_parallel(net, gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}))
        before = dp.sync.collectives if dp.sync else 0
        with dp.no_sync():
            dp.step(dp.shard(gbatch(0)), lambda m, b: gloss(m, b) / 2)
        inside = (dp.sync.collectives if dp.sync else 0) - before
        dp.step(dp.shard(gbatch(1)), lambda m, b: gloss(m, b) / 2)
        dp.verify()
        report["no_sync"] = {"inside": inside, "after": (dp.sync.collectives if dp.sync else 0) - before}
        save("no_sync", gparams(net))

    @scenario
    def bn_adam() -> None:
        net = gnet(1 + RANK, bn=True)
        tr = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 1e-2})
        if RANK == 0:
            with autograd.record():
                loss = gloss(net, gbatch(9))
            loss.backward()
            tr.step(1)
        dp = md.data_parallel(net, tr, verify=True)
        for k in range(K):
            dp.step(dp.shard(gbatch(k)), gloss)
        save("bn_adam", gparams(net))

(OUT / f"report-{RANK}.json").write_text(json.dumps(report))
if LAUNCHED:
    dist.shutdown()
