"""Suite ``models`` (issue #21): whole models through multidev against the framework's own calls,
in the same run.

- ``to(tensors)``: ``md.to`` of a dict of LeNet's tensors on their device against the framework's
  own placement call on each (every backend).
- ``to(model)``: ``md.to(net, dev)`` against the framework's way to put a model on a device
  (torch ``module.to(device)``, Gluon ``net.collect_params().reset_ctx(ctx)``, JAX
  ``jax.device_put(tree, device)``), for D2L's LeNet and an MLP, where the model is resident
  already (multidev's no-op) and for a real move (between the host and the GPU, or two CPU
  devices). A model moved in place (torch, MXNet) is moved there and back in each call, through
  multidev and natively alike.
- ``train step``: the data-parallel step through ``md.train_batch`` on one device against the same
  step written in the framework (the baseline's ``op_train_step``: the batch to the device, the
  framework's gradients, the same SGD update, the loss read back), for D2L's LeNet at batch 256
  and an MLP 1024-4096-4096-10 at batch 2048 (batch 64 on a CPU), the data on the host and already
  on the device. JAX's rows also time the idiomatic fully jitted step (``native:fused``: gradients
  and update in one compiled function), for reference; the goal is judged against ``native``.

Both variants of a row start from the same parameters; the check takes one step of each from
fresh copies and compares the losses of a second step (equal parameters give equal losses).
"""
from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

import multidev as md

from . import Case, Context, Goal, Variant, all_ok, benchmark, close

TO_GOALS = (Goal("md.to(model) resident within 1.1x native", "to(model) resident", 1.1,
                 note="md.to(net, its device) against module.to / reset_ctx / device_put"),
            Goal("md.to(model) move within 1.1x native", "to(model) move", 1.1,
                 note="a real move: md.to(net, other) against the framework's own move"))
STEP_GOALS = (Goal("md.train_batch on one device within 1.05x the native step", "train step", 1.05,
                   note="the same step written in the framework (baseline op_train_step)"),)
LR = 1e-3  # small: the timed steps keep training the same parameters


def _kinds(ctx: Context) -> list[str]:
    return ["lenet", ctx.pick("mlp:64-256-256-10", "mlp:1024-4096-4096-10", "mlp:1024-4096-4096-10")]


def _resident_devices(ctx: Context) -> list[md.Device]:
    devs = [ctx.dev]
    if ctx.dev != ctx.host and ctx.host in ctx.devices:
        devs.append(ctx.host)
    return devs


def _pair(ctx: Context) -> tuple[md.Device, md.Device] | None:
    """Two devices for a real move: the host and the GPU, else two CPU devices, else None."""
    if ctx.gpus and ctx.host in ctx.devices:
        return ctx.host, ctx.gpus[0]
    cpus = ctx.cpus
    return (cpus[0], cpus[1]) if len(cpus) > 1 else None


def _host_values(model: Any) -> list[np.ndarray]:
    """Every tensor of a model or tree as host arrays, in order (for the untimed checks)."""
    params = getattr(model, "parameters", None)
    if callable(params):  # a torch module
        return [np.asarray(md.to_numpy(p.detach())) for p in params()]
    collect = getattr(model, "collect_params", None)
    if callable(collect):  # a Gluon block
        return [np.asarray(md.to_numpy(p.data())) for p in collect().values()]
    out: list[np.ndarray] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k in sorted(x):
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            out.append(np.asarray(md.to_numpy(x)))
    walk(md.to_host(model))
    return out


def _same_values(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[bool, str]:
    ok = len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    return ok, f"{len(a)} tensors {'equal' if ok else 'DIFFER'}"


#: LeNet's parameter shapes (D2L's, 1x28x28 input): the dict of tensors every backend's row moves.
LENET_SHAPES = {"conv1.w": (6, 1, 5, 5), "conv1.b": (6,), "conv2.w": (16, 6, 5, 5), "conv2.b": (16,),
                "fc1.w": (400, 120), "fc1.b": (120,), "fc2.w": (120, 84), "fc2.b": (84,), "fc3.w": (84, 10),
                "fc3.b": (10,)}


@benchmark("models")
def tensors_to(ctx: Context) -> Iterator[Case]:
    """md.to of a dict of tensors (LeNet's parameters) on its device, against the framework's own
    placement call on every leaf (every backend: the structure path of md.to)."""
    for d in _resident_devices(ctx):
        tree = {k: md.ones(s, device=d, backend=ctx.backend) for k, s in LENET_SHAPES.items()}
        native: Variant | None = None
        if ctx.native is not None:
            try:
                move = ctx.native.mover(d)
            except NotImplementedError:
                move = None
            if move is not None:
                def each(tree: dict[str, Any], move: Any = move) -> dict[str, Any]:
                    return {k: move(v) for k, v in tree.items()}
                native = Variant(each, (tree,), label="{k: <the framework's to>(v, device) for k, v in tree.items()}")

        def check(tree: dict[str, Any] = tree, d: md.Device = d) -> tuple[bool, str]:
            got = md.to(tree, d)
            same = type(got) is dict and list(got) == list(tree) and all(got[k] is tree[k] for k in tree)
            return same, "a new dict holding the same (resident) tensors" if same else f"got {type(got).__name__}"

        yield Case(f"to(dict of LeNet's tensors, its device) [{d}]",
                   {"md": Variant(md.to, (tree, d), label="md.to(dict of tensors, device)"), "native": native},
                   devices=[d], check=check, params={"device": str(d), "tensors": len(tree)},
                   group="to(tensors) resident", key="to(dict of tensors) resident")


@benchmark("models", goals=TO_GOALS)
def model_to(ctx: Context) -> Iterator[Case]:
    """md.to(model, device) against the framework's own way: resident, and a real move."""
    nat = ctx.native
    if nat is None or not hasattr(nat, "model_d2l"):
        return
    for kind in _kinds(ctx):
        for d in _resident_devices(ctx):
            m = nat.model_d2l(kind, d)
            before = _host_values(m)
            native = ctx.native_call("model_to", m, d)

            def check(m: Any = m, d: md.Device = d, before: list[np.ndarray] = before,
                      native: Variant | None = native) -> tuple[bool, str]:
                got = md.to(m, d)
                checks = [(md.device_of(got) == d, f"on {md.device_of(got)}"), _same_values(_host_values(got), before)]
                if native is not None:
                    checks.append(_same_values(_host_values(native.fn(*native.args) or m), before))
                return all_ok(*checks)

            yield Case(f"to({kind}, its device) resident [{d}]",
                       {"md": Variant(md.to, (m, d), label="md.to(model, device)"), "native": native},
                       devices=[d], check=check, params={"model": kind, "device": str(d)},
                       group="to(model) resident", key=f"to({kind}) resident")
        pair = _pair(ctx)
        if pair is None:
            continue
        a, b = pair
        m = nat.model_d2l(kind, a)
        before = _host_values(m)
        in_place = md.to(m, b) is m  # torch, MXNet: the same model, moved; JAX: a new tree
        if in_place:
            md.to(m, a)
            there, back = ctx.native_call("model_to", m, b), ctx.native_call("model_to", m, a)

            def md_move(m: Any = m, a: md.Device = a, b: md.Device = b) -> None:
                md.to(m, b)
                md.to(m, a)

            variants: dict[str, Variant | None] = {
                "md": Variant(md_move, label=f"md.to(model, {b}); md.to(model, {a})")}
            if there is not None and back is not None:
                def native_move(there: Variant = there, back: Variant = back) -> None:
                    there.fn(*there.args)
                    back.fn(*back.args)
                variants["native"] = Variant(native_move, label=f"{there.label} to {b}, then to {a}")
            else:
                variants["native"] = None
        else:
            variants = {"md": Variant(md.to, (m, b), label=f"md.to(tree, {b})"),
                        "native": ctx.native_call("model_to", m, b)}

        def check_move(m: Any = m, before: list[np.ndarray] = before, in_place: bool = in_place,
                       a: md.Device = a, b: md.Device = b) -> tuple[bool, str]:
            got = md.to(m, b)
            checks = [(md.device_of(got) == b, f"on {md.device_of(got)}"), _same_values(_host_values(got), before)]
            if in_place:
                md.to(m, a)
                checks.append((md.device_of(m) == a, f"back on {md.device_of(m)}"))
            return all_ok(*checks)

        yield Case(f"to({kind}) {a} -> {b}" + (f" -> {a}" if in_place else ""), variants, devices=[a, b],
                   check=check_move, params={"model": kind, "from": str(a), "to": str(b), "in_place": in_place,
                                             "moves_per_call": 2 if in_place else 1},
                   group="to(model) move", key=f"to({kind}) move")


@benchmark("models", goals=STEP_GOALS)
def train_step(ctx: Context) -> Iterator[Case]:
    """md.train_batch on one device against the same SGD step written in the framework."""
    nat = ctx.native
    if nat is None or not hasattr(nat, "train_d2l"):
        return
    d = ctx.dev
    mlp = ctx.pick("mlp:64-256-256-10", "mlp:1024-4096-4096-10", "mlp:1024-4096-4096-10")
    configs = [("lenet", ctx.pick(16, 256, 256), (1, 28, 28)),
               (mlp, ctx.pick(32, 64, 2048), (int(mlp.split(":")[1].split("-")[0]),))]
    rng = np.random.default_rng(0)
    for kind, batch, shape in configs:
        Xh = rng.normal(size=(batch, *shape)).astype(np.float32)
        yh = rng.integers(0, 10, size=batch)
        for where in (("device", "host") if d != ctx.host else ("device",)):
            src = d if where == "device" else ctx.host
            label_dtype = "int64" if "int64" in ctx.b.capabilities.dtypes_on(src) else "int32"
            X = md.asarray(Xh, device=src, backend=ctx.backend)
            y = md.asarray(yh, dtype=label_dtype, device=src, backend=ctx.backend)
            params, loss = nat.train_d2l(kind, d)
            devs = [d]
            replicas = md.replicate(params, devs)
            step = functools.partial(md.train_batch, replicas=replicas, devices=devs, lr=LR, loss=loss)
            variants: dict[str, Variant | None] = {
                "md": Variant(step, (X, y), label="md.train_batch(X, y, replicas, [device], lr, loss=loss)"),
                "native": ctx.native_call("train_step", md.replicate(params, devs)[0], loss, X, y, d, LR)}
            fused = ctx.native_call("train_step_fused", md.replicate(params, devs)[0], loss, X, y, d, LR)
            if fused is not None:
                variants["native:fused"] = fused

            def check(params: list[Any] = params, loss: Any = loss, X: Any = X, y: Any = y,
                      devs: list[md.Device] = devs) -> tuple[bool, str]:
                mine = md.replicate(params, devs)
                theirs = ctx.native_call("train_step", md.replicate(params, devs)[0], loss, X, y, d, LR)
                if theirs is None:
                    return True, "no native step"
                a = [md.train_batch(X, y, mine, devs, LR, loss=loss) for _ in range(2)]
                b = [theirs.fn(*theirs.args) for _ in range(2)]
                return all_ok(close(np.array(a), np.array(b), rtol=1e-4),
                              (all(np.isfinite(a)), f"losses {a[0]:.4g}, {a[1]:.4g} (md), "
                                                    f"{b[0]:.4g}, {b[1]:.4g} (native)"))

            yield Case(f"train step {kind}, batch {batch}, data on the {where} [{d}]", variants,
                       devices=[d] if src == d else [src, d], check=check,
                       params={"model": kind, "batch": batch, "data_on": where, "device": str(d), "lr": LR},
                       group="train step", key=f"train step {kind} b{batch} ({where})")
