"""MNIST-shaped data for the three MNIST programs (``mnist_torch``, ``mnist_flax``, ``mnist_keras``),
without a download: the real MNIST from a ``.npz`` file where one is given (Keras's ``mnist.npz``
layout: ``x_train``, ``y_train``, ``x_test``, ``y_test``), otherwise scikit-learn's 8x8 digits
scaled up to 28x28 (each pixel 3x3, a 2-pixel border, as MNIST centres its digits in a 20x20 box),
otherwise synthetic digits (a fixed random template per class plus noise). All three are learnable
10-class tasks with MNIST's shapes, so the programs run unchanged on the real thing.

:func:`global_batches` gives the index of every global batch of an epoch, the same on every rank
and in every launch (a permutation seeded by the epoch), so one process and N processes train on
the same batches and learn the same.
"""
from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np

SIZE, CLASSES = 28, 10


def load(path: str | None = None, *, limit: int | None = None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """``(x_train, y_train, x_test, y_test, source)``: float32 images ``(N, 28, 28)`` in [0, 1] and
    int64 labels; ``limit`` keeps the first rows of each split (quick runs). A new copy each call."""
    if path is not None:
        with np.load(path) as f:
            xtr, ytr, xte, yte = (f[k] for k in ("x_train", "y_train", "x_test", "y_test"))
        scale = 255.0 if xtr.dtype == np.uint8 else 1.0
        out = (xtr / scale, ytr, xte / scale, yte)
        source = f"MNIST ({path})"
    else:
        data, target, source = _digits()
        img = np.pad(np.kron(data.reshape(-1, 8, 8), np.ones((3, 3))), ((0, 0), (2, 2), (2, 2)))
        order = np.random.default_rng(0).permutation(len(img))
        cut = int(0.8 * len(img))
        out = (img[order[:cut]], target[order[:cut]], img[order[cut:]], target[order[cut:]])
        source += " upscaled to 28x28"
    xtr, ytr, xte, yte = (a[:limit] for a in out)
    return (xtr.astype(np.float32), ytr.astype(np.int64), xte.astype(np.float32), yte.astype(np.int64), source)


def _digits() -> tuple[np.ndarray, np.ndarray, str]:
    """scikit-learn's digits in [0, 1] (its file read directly, scikit-learn not imported: its
    OpenMP runtime beside torch's slows torch's CPU kernels), or synthetic ones where it is absent."""
    spec = importlib.util.find_spec("sklearn")
    where = None if spec is None or not spec.submodule_search_locations else \
        Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if where is not None and where.exists():
        with gzip.open(where, "rt") as f:
            raw = np.loadtxt(f, delimiter=",")
        return raw[:, :-1] / 16.0, raw[:, -1].astype(np.int64), "scikit-learn digits"
    rng = np.random.default_rng(1234)
    templates = rng.uniform(0, 1, size=(CLASSES, 64))
    target = rng.integers(0, CLASSES, size=1797)
    data = np.clip(templates[target] + rng.normal(0, 0.35, size=(1797, 64)), 0, 1)
    return data, target, "synthetic digits (scikit-learn not installed)"


def global_batches(n: int, batch_size: int, epoch: int, steps: int | None = None) -> Iterator[np.ndarray]:
    """The row indices of each whole global batch of epoch ``epoch`` (at most ``steps`` of them)."""
    order = np.random.default_rng(1000 + epoch).permutation(n)
    count = n // batch_size if steps is None else min(steps, n // batch_size)
    for i in range(count):
        yield order[i * batch_size:(i + 1) * batch_size]


def mean_over_ranks(values: list[float]) -> list[float]:
    """Per-step losses averaged over the ranks of the process group (each rank's loss is the mean
    of its equal share of the global batch, so this is the global batch's loss); as given alone."""
    from multidev import distributed as dist

    if not values or not dist.is_initialized() or dist.world_size() == 1:
        return values
    return [float(v) for v in dist.allreduce(np.asarray(values, np.float32), "mean")]
