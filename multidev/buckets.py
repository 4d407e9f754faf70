"""Buckets: many tensors grouped by dtype and device, each group flattened into one 1-D tensor, so
that one collective moves a whole group instead of one call per tensor (data parallelism's
gradients and replicas, the collectives over structures: :mod:`multidev.structured`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._device import Device
from .dtypes import ITEMSIZE

if TYPE_CHECKING:
    from .protocol import Backend

__all__ = ["DEFAULT_BUCKET_MB", "FIRST_BUCKET_MB", "flatten", "nbytes", "numel", "plan_buckets", "unflatten"]

#: Bytes per bucket (one collective each), in MiB: DistributedDataParallel's default.
DEFAULT_BUCKET_MB = 25.0
#: The first gradient bucket of a data-parallel step closes at this many megabytes (DDP's first bucket).
FIRST_BUCKET_MB = 1.0


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def nbytes(b: Backend, x: Any) -> int:
    """The bytes of tensor ``x``'s values."""
    return numel(b.shape_of(x)) * ITEMSIZE.get(b.dtype_of(x), 8)


def plan_buckets(b: Backend, tensors: Sequence[Any], cap_bytes: float, reverse: bool = False,
                 sizes: Sequence[int] | None = None, first_bytes: float | None = None) -> list[list[int]]:
    """Indices of ``tensors`` (of backend ``b``) grouped into buckets of one dtype and device, each up
    to ``cap_bytes`` (a larger tensor alone), in the tensors' order, or reversed (gradients come
    last layer first). The plan depends only on the tensors' dtypes, devices and sizes (``sizes``:
    the bytes to count for each instead of its own, say the largest of every rank's).

    ``first_bytes`` (below ``cap_bytes``; else ignored, so a small cap keeps its rule): the first bucket
    of each dtype and device closes as soon as it holds that many bytes, the tensor that crosses it
    included, as DistributedDataParallel's first bucket does: a small first collective starts while
    the backward pass still computes the earlier layers."""
    order = range(len(tensors) - 1, -1, -1) if reverse else range(len(tensors))
    buckets: list[list[int]] = []
    open_: dict[tuple[str, Device], tuple[int, float]] = {}  # (dtype, device) -> (its open bucket, bytes)
    firsts: set[tuple[str, Device]] = set()  # keys whose first bucket is still open
    if first_bytes is not None and not first_bytes < cap_bytes:
        first_bytes = None
    for i in order:
        t = tensors[i]
        key = (b.dtype_of(t), b.device_of(t))
        size = nbytes(b, t) if sizes is None else sizes[i]
        at = open_.get(key)
        if at is None or (at[1] + size > cap_bytes and at[1] > 0 and key not in firsts):
            if at is None and first_bytes is not None:
                firsts.add(key)
            buckets.append([])
            at = (len(buckets) - 1, 0.0)
        buckets[at[0]].append(i)
        open_[key] = at = (at[0], at[1] + size)
        if key in firsts and at[1] >= (first_bytes or 0.0):
            firsts.discard(key)
            open_[key] = (at[0], float("inf"))  # closed: the next tensor of this key opens a bucket
    return buckets


def flatten(b: Backend, tensors: Sequence[Any]) -> Any:
    """One new 1-D tensor holding ``tensors`` (one dtype, one device) one after another."""
    return b.concat([b.reshape(t, (numel(b.shape_of(t)),)) for t in tensors], 0)


def unflatten(b: Backend, flat: Any, shapes: Sequence[tuple[int, ...]]) -> list[Any]:
    """``flat`` cut back into tensors of ``shapes`` (views where the framework has them); one shape:
    ``flat`` reshaped (it may be a lone tensor of any shape, never flattened)."""
    if len(shapes) == 1:
        return [b.reshape(flat, tuple(shapes[0]))]
    sizes = [numel(s) for s in shapes]
    return [b.reshape(p, tuple(s)) for p, s in zip(b.split(flat, sizes, 0), shapes)]
