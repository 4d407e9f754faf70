"""The tensors of a structure as the collectives over structures take them (:func:`structure_leaves`),
with the signature the ranks of a distributed call compare, and the structure rebuilt around new
tensors (:func:`rebuild`); :mod:`multidev.trees` decides what a structure is.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._device import Device
from .errors import CollectiveInputError
from .protocol import Backend
from .registry import backend_of
from .trees import tree_map

__all__ = ["Leaves", "rebuild", "structure_leaves"]


@dataclass
class Leaves:
    """The tensors of a structure, each object once, in the structure's order, of one backend
    (``backend`` None for a structure without tensors)."""

    backend: Backend | None
    tensors: list[Any]
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)

    def signature(self, *extra: Any, shapes: Sequence[Any] | None = None) -> int:
        """A 62-bit digest of the leaf count and each leaf's dtype, shape (or ``shapes[i]`` where
        given: a gather's shapes without their joined axis), and which of this structure's devices
        it is on (first seen first), plus ``extra`` (one per leaf where given, say the kind of device
        each travels on): equal on every process whose structures bucket alike (a digest of the
        text, never Python's per-process ``hash``)."""
        order: dict[Device, int] = {}
        h = hashlib.blake2b(digest_size=8)
        h.update(f"{len(self.tensors)}:".encode())
        for i, (dt, shape, dev) in enumerate(zip(self.dtypes, self.shapes if shapes is None else shapes,
                                                 self.devices)):
            h.update(f"{dt}{shape}@{order.setdefault(dev, len(order))}".encode())
            for e in extra:
                h.update(f"/{e[i]}".encode())
            h.update(b";")
        return int.from_bytes(h.digest(), "little") >> 2


def structure_leaves(obj: Any, what: str) -> Leaves:
    """The tensors of structure ``obj`` by :func:`multidev.trees.tree_map`'s rule (lists, tuples,
    named tuples, dicts, framework trees; ``None`` an empty subtree; a framework tree's static parts
    kept; any other leaf, and a model, refused with UnsupportedTensorError naming its path);
    CollectiveInputError for tensors of several backends. Nothing is computed."""
    found: list[Any] = []

    def collect(x: Any) -> Any:
        found.append(x)
        return x

    tree_map(collect, obj, what)
    if not found:
        return Leaves(None, [])
    backs = [backend_of(x) for x in found]
    names = sorted({b.name for b in backs})
    if len(names) > 1:
        raise CollectiveInputError(f"{what}: the structure holds tensors of several backends ({', '.join(names)}); "
                                   "convert them to one backend first (nothing was sent)")
    b = backs[0]
    return Leaves(b, found, [b.shape_of(x) for x in found], [b.dtype_of(x) for x in found],
                  [b.device_of(x) for x in found])


def rebuild(obj: Any, leaves: Leaves, results: Sequence[Any], what: str) -> Any:
    """Structure ``obj`` rebuilt (same container types) with ``results[i]`` in place of
    ``leaves.tensors[i]`` (a tensor reached twice gets its one result twice)."""
    by_id = {id(x): r for x, r in zip(leaves.tensors, results)}
    return tree_map(lambda x: by_id[id(x)], obj, what)
