"""multidev's check that an optax transformation steps a piece of a parameter as it steps the whole
(``multidev.adapters.jax._common``, for sharding its state over processes under the MPI and torch
engines): the transformations it accepts step two halves exactly as the whole, and the ones it
refuses (a norm, a factored moment, noise, a position-dependent constant) do not."""
from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from multidev.adapters.jax._common import elementwise_refusal  # noqa: E402

ACCEPTED = {
    "sgd": lambda: optax.sgd(0.1),
    "sgd nesterov": lambda: optax.sgd(0.1, momentum=0.9, nesterov=True),
    "adam": lambda: optax.adam(1e-2),
    "adamw cosine": lambda: optax.adamw(optax.cosine_decay_schedule(1e-2, 5), weight_decay=0.1),
    "rmsprop": lambda: optax.rmsprop(1e-2, momentum=0.5),
    "adagrad": lambda: optax.adagrad(0.1),
    "lion": lambda: optax.lion(1e-2),
    "adabelief": lambda: optax.adabelief(1e-2),
    "nadam": lambda: optax.nadam(1e-2),
    "adamax": lambda: optax.adamax(1e-2),
    "warmup cosine": lambda: optax.adam(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 2, 10)),
    "joined schedules": lambda: optax.sgd(optax.join_schedules(
        [optax.constant_schedule(0.1), optax.constant_schedule(0.01)], [2])),
    "clip by value": lambda: optax.chain(optax.clip(0.05), optax.adam(1e-2)),
    "inject_hyperparams": lambda: optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
    "masked": lambda: optax.masked(optax.adam(1e-2), {"w": True, "b": False}),
}

REFUSED = {
    "clip_by_global_norm": lambda: optax.chain(optax.clip_by_global_norm(0.1), optax.adam(1e-2)),
    "lamb": lambda: optax.lamb(1e-2),
    "lars": lambda: optax.lars(1e-2),
    "adafactor": lambda: optax.adafactor(1e-2),
    "novograd": lambda: optax.novograd(1e-2),
    "added noise": lambda: optax.chain(optax.add_noise(0.1, 0.5, 0), optax.sgd(0.1)),
    "a position-dependent scale": lambda: optax.stateless(
        lambda g, p: jax.tree_util.tree_map(lambda x: x * jnp.arange(x.shape[0]).reshape(
            (-1,) + (1,) * (x.ndim - 1)), g)),
    "a cumulative sum": lambda: optax.stateless(lambda g, p: jax.tree_util.tree_map(lambda x: jnp.cumsum(x, 0), g)),
    # (a reviewer's false accepts: decided or scaled by a shape, a loop, a branch to positions)
    "factored only where large (Adafactor's rule)": lambda: optax.chain(
        optax.scale_by_factored_rms(min_dim_size_to_factor=5), optax.sgd(0.1)),
    "a scale by the first dimension": lambda: optax.stateless(
        lambda g, p: jax.tree_util.tree_map(lambda x: x / x.shape[0], g)),
    "a scale by a count of elements": lambda: optax.stateless(
        lambda g, p: jax.tree_util.tree_map(lambda x: x / jnp.ones_like(x).sum(), g)),
    "a scan over rows": lambda: optax.stateless(lambda g, p: jax.tree_util.tree_map(
        lambda x: jax.lax.scan(lambda c, r: (c + r, c + r), jnp.zeros_like(x[0]), x)[1], g)),
    "a branch to positions at the first step": lambda: optax.GradientTransformation(
        lambda p: jnp.zeros([], jnp.int32),
        lambda g, s, p=None: (jax.tree_util.tree_map(lambda x: jax.lax.cond(
            s == 0, lambda y: jnp.arange(y.size, dtype=y.dtype).reshape(y.shape), lambda y: y, x), g), s + 1)),
}


def _tree(rows: int, seed: int = 0) -> dict[str, jax.Array]:
    g = np.random.default_rng(seed)
    return {"w": jnp.asarray(g.normal(size=(rows, 6)), jnp.float32), "b": jnp.asarray(g.normal(size=rows),
                                                                                         jnp.float32)}


def _steps(tx: optax.GradientTransformation, params: dict, grads: list[dict]) -> dict:
    state = tx.init(params)
    for g in grads:
        u, state = tx.update(g, state, params)
        params = optax.apply_updates(params, u)
    return params


def _halves(t: dict, k: int) -> dict:
    return {n: x[4 * k:4 * k + 4] for n, x in t.items()}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_transformations_step_each_half_as_the_whole(name: str) -> None:
    tx = ACCEPTED[name]()
    params = _tree(8)
    grads = [{n: x * (i + 1) * 0.3 for n, x in _tree(8, 1 + i).items()} for i in range(3)]
    assert elementwise_refusal(jax, tx, _halves(params, 0), params) is None
    whole = _steps(tx, params, grads)
    for k in (0, 1):
        half = _steps(tx, _halves(params, k), [_halves(g, k) for g in grads])
        for n in whole:
            np.testing.assert_allclose(np.asarray(half[n]), np.asarray(whole[n][4 * k:4 * k + 4]), rtol=1e-6,
                                       atol=1e-7)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_transformations_would_step_a_piece_otherwise(name: str) -> None:
    tx = REFUSED[name]()
    why = elementwise_refusal(jax, tx, _halves(_tree(8), 0), _tree(8))
    assert why is not None and ("acts across elements" in why or "position-dependent" in why or "shape" in why), why
    # and the refusal is right: a half stepped alone differs from that half of the whole's step
    params = _tree(8)
    grads = [{n: x * (i + 1) * 3.0 for n, x in _tree(8, 1 + i).items()} for i in range(3)]
    whole = _steps(tx, params, grads)
    half = _steps(tx, _halves(params, 1), [_halves(g, 1) for g in grads])
    assert any(not np.allclose(np.asarray(half[n]), np.asarray(whole[n][4:8]), rtol=1e-6, atol=1e-7) for n in whole)
