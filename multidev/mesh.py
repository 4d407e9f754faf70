"""The neutral device mesh and tensor layouts: pure values, no framework, no registry.

A :class:`Mesh` is an n-dimensional grid of :class:`~multidev.Device` values with named axes (JAX's
``Mesh``, torch's ``DeviceMesh``, Keras's ``DeviceMesh``). A :class:`Layout` says how one tensor lies
on a mesh: each tensor dimension whole or cut along some mesh axes, the other axes holding replicas,
or partial sums (JAX's ``NamedSharding`` with a ``PartitionSpec``, DTensor's ``Shard``/``Replicate``/
``Partial``, Keras's ``TensorLayout``). Both are frozen, hashable and comparable by value, and
independent of any framework: the same mesh serves every backend that has its devices.

Shard sizes follow ``numpy.array_split``: a dimension of length ``L`` cut into ``n`` pieces gives
the first ``L % n`` pieces ``L // n + 1`` elements, the rest ``L // n`` (as :func:`multidev.scatter`
cuts). A framework whose own sharded type needs even pieces (JAX) refuses uneven ones.

Building a mesh from a backend's devices (:func:`multidev.make_mesh`), placing tensors
(``multidev.to(x, layout)``) and the framework conversions live in :mod:`multidev.sharding`.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from ._device import Device
from .errors import InvalidArgumentError

__all__ = ["AxisNames", "Layout", "Mesh", "ProcessMesh", "SpecEntry", "block_bounds", "check_axis_names",
           "mesh_shape"]

#: One entry of a layout's spec: None (the dimension is whole), an axis name, or several names.
SpecEntry = Union[None, str, Sequence[str]]  # noqa: UP007 - a runtime alias, valid on Python 3.10
#: One mesh axis or several, by name.
AxisNames = Union[str, Sequence[str]]  # noqa: UP007


def _names(names: Any, what: str) -> tuple[str, ...]:
    if isinstance(names, str):
        return (names,)
    if not isinstance(names, Iterable) or isinstance(names, (bytes, dict)):
        raise InvalidArgumentError(f"{what} takes a name or a sequence of names, got {names!r:.60}")
    out = tuple(names)
    bad = [n for n in out if not isinstance(n, str) or not n]
    if bad:
        raise InvalidArgumentError(f"{what}: axis names are non-empty strings, got {bad[0]!r:.40}")
    return out


def mesh_shape(shape: Any) -> tuple[int, ...]:
    """A mesh shape as a tuple of ints >= 1 (an int is one axis); InvalidArgumentError otherwise."""
    shp = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
    if isinstance(shp, (str, bytes)) or not isinstance(shp, Iterable):
        raise InvalidArgumentError(f"mesh shape must be an int or a sequence of ints, got {shape!r:.60}")
    shp = tuple(shp)
    if not shp or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shp):
        raise InvalidArgumentError(f"mesh shape must be one or more ints >= 1, got {shape!r:.60}")
    return tuple(int(s) for s in shp)


def check_axis_names(names: Any) -> tuple[str, ...]:
    """Axis names as a tuple of non-empty strings (one string is one name)."""
    return _names(names, "axis names")


class _Grid:
    """What a mesh of devices and a mesh of processes share: named axes of given sizes."""

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]

    def axis(self, name: str) -> int:  # (each kind of mesh names itself in its error)
        raise NotImplementedError

    @property
    def ndim(self) -> int:
        """The number of axes."""
        return len(self.shape)

    @property
    def sizes(self) -> dict[str, int]:
        """Axis name -> size, in axis order (JAX's ``Mesh.shape``)."""
        return dict(zip(self.axis_names, self.shape))

    def axis_size(self, names: AxisNames) -> int:
        """The size of an axis, or the product of several."""
        return math.prod(self.shape[self.axis(n)] for n in _names(names, "axis_size"))


@dataclass(frozen=True, init=False)
class Mesh(_Grid):
    """An n-dimensional grid of devices with named axes (row-major: the last axis varies fastest).

    ``Mesh((2, 2), ("data", "model"), devices)`` puts ``devices[0], devices[1]`` on the first row.
    Frozen, hashable, equal when shape, names and devices are. Built from a backend's devices in the
    order its hardware suits by :func:`multidev.make_mesh`; converted to a framework's own mesh by
    :func:`multidev.to_native_mesh`."""

    shape: tuple[int, ...]
    """The size of each axis."""
    axis_names: tuple[str, ...]
    """The name of each axis, distinct."""
    devices: tuple[Device, ...]
    """Every device, distinct, in row-major order (``len(devices) == prod(shape)``)."""

    def __init__(self, shape: int | Sequence[int], axis_names: AxisNames, devices: Sequence[Device]) -> None:
        """Validate and freeze (InvalidArgumentError for sizes, names or devices that do not fit)."""
        shp = mesh_shape(shape)
        names = _names(axis_names, "mesh axis_names")
        if len(names) != len(shp):
            raise InvalidArgumentError(f"mesh: {len(shp)} axis sizes {shp} but {len(names)} names {names}")
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"mesh axis names must be distinct, got {names}")
        if isinstance(devices, (str, bytes)) or not isinstance(devices, Iterable):
            raise InvalidArgumentError(f"mesh devices must be a sequence of Devices, got {devices!r:.60}")
        devs = tuple(devices)
        bad = [d for d in devs if not isinstance(d, Device)]
        if bad:
            raise InvalidArgumentError(f"mesh devices must be multidev.Device values (multidev.make_mesh parses "
                                       f"spellings), got {bad[0]!r:.40}")
        if len(devs) != math.prod(shp):
            raise InvalidArgumentError(f"a mesh of shape {shp} needs {math.prod(shp)} devices, got {len(devs)}")
        if len(set(devs)) != len(devs):
            raise InvalidArgumentError(f"mesh devices must be distinct, got {', '.join(map(str, devs))}")
        object.__setattr__(self, "shape", shp)
        object.__setattr__(self, "axis_names", names)
        object.__setattr__(self, "devices", devs)
        object.__setattr__(self, "_hash", hash((shp, names, devs)))  # (placements key caches by meshes)

    def __reduce__(self) -> tuple:
        return (Mesh, (self.shape, self.axis_names, self.devices))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not Mesh:
            return NotImplemented
        o: Any = other
        return bool(self._hash == o._hash and self.shape == o.shape and self.axis_names == o.axis_names  # type: ignore[attr-defined]
                    and self.devices == o.devices)

    @property
    def size(self) -> int:
        """The number of devices."""
        return len(self.devices)


    def axis(self, name: str) -> int:
        """The position of axis ``name``; InvalidArgumentError naming the axes where there is none."""
        try:
            return self.axis_names.index(name)
        except ValueError:
            raise InvalidArgumentError(f"mesh has no axis {name!r:.40}; its axes: {', '.join(self.axis_names)}") \
                from None


    def coords(self, device: Device) -> tuple[int, ...]:
        """The position of ``device`` on the grid; InvalidArgumentError where it is not on the mesh."""
        try:
            flat = self.devices.index(device)
        except ValueError:
            raise InvalidArgumentError(f"{device} is not on this mesh ({', '.join(map(str, self.devices))})") \
                from None
        out = []
        for s in reversed(self.shape):
            flat, r = divmod(flat, s)
            out.append(r)
        return tuple(reversed(out))

    def device_at(self, coords: Sequence[int]) -> Device:
        """The device at grid position ``coords`` (one index per axis)."""
        c = tuple(coords)
        if len(c) != self.ndim or any(not isinstance(i, int) or not 0 <= i < s for i, s in zip(c, self.shape)):
            raise InvalidArgumentError(f"mesh position {c!r:.60} is not on a grid of shape {self.shape}")
        flat = 0
        for i, s in zip(c, self.shape):
            flat = flat * s + i
        return self.devices[flat]

    def index_along(self, device: Device, axes: AxisNames) -> int:
        """The rank of ``device`` within its group along ``axes`` (row-major over them, in the order
        given): JAX's ``lax.axis_index(axes)``."""
        c = self.coords(device)
        idx = 0
        for n in _names(axes, "index_along"):
            a = self.axis(n)
            idx = idx * self.shape[a] + c[a]
        return idx

    def groups(self, axes: AxisNames) -> tuple[tuple[Device, ...], ...]:
        """The subgroups along ``axes``: the devices that differ only in their positions on those axes,
        each group ordered row-major over ``axes`` in the order given (a collective's ranks), the
        groups in row-major order of the other axes. Axes are distinct; ``()`` gives one group per
        device."""
        names = _names(axes, "groups")
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"groups: an axis is named twice in {names}")
        along = [self.axis(n) for n in names]
        rest = [a for a in range(self.ndim) if a not in along]
        out = []
        for fixed in itertools.product(*(range(self.shape[a]) for a in rest)):
            group = []
            for moving in itertools.product(*(range(self.shape[a]) for a in along)):
                c = [0] * self.ndim
                for a, i in zip(rest, fixed):
                    c[a] = i
                for a, i in zip(along, moving):
                    c[a] = i
                group.append(self.device_at(c))
            out.append(tuple(group))
        return tuple(out)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{n!r}: {s}" for n, s in zip(self.axis_names, self.shape))
        return f"Mesh({{{sizes}}}, devices=[{', '.join(map(str, self.devices))}])"

    def __str__(self) -> str:
        """The grid, one line per row of the last axis."""
        head = "Mesh " + " x ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape))
        last = self.shape[-1]
        rows = [" ".join(f"{d!s:>6}" for d in self.devices[i:i + last]) for i in range(0, self.size, last)]
        return head + "\n" + "\n".join("  " + r for r in rows)


@dataclass(frozen=True)
class ProcessMesh(_Grid):
    """The ranks of a ``multidev.distributed`` group on a grid with named axes, row-major (rank ``r``
    at the ``r``-th place): made by :func:`multidev.distributed.process_mesh`. A :class:`Layout` over
    it lays a tensor out across processes, each rank holding its piece. Frozen, hashable, equal by
    value. Its members are ranks where a :class:`Mesh`'s are devices."""

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]

    def __post_init__(self) -> None:
        shp = mesh_shape(self.shape)
        names = _names(self.axis_names, "process mesh axis_names")
        if len(names) != len(shp) or len(set(names)) != len(names):
            raise InvalidArgumentError(f"process mesh: {len(shp)} axis sizes {shp} need as many distinct names, "
                                       f"got {names}")
        object.__setattr__(self, "shape", shp)
        object.__setattr__(self, "axis_names", names)

    @property
    def size(self) -> int:
        """The number of ranks."""
        return math.prod(self.shape)


    def axis(self, name: str) -> int:
        """The position of axis ``name``; InvalidArgumentError naming the axes where there is none."""
        if name not in self.axis_names:
            raise InvalidArgumentError(f"process mesh has no axis {name!r:.40}; its axes: {', '.join(self.axis_names)}")
        return self.axis_names.index(name)

    _axis = axis


    def coords(self, rank: int) -> tuple[int, ...]:
        """The grid position of ``rank``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.size:
            raise InvalidArgumentError(f"rank {rank!r:.40} is not on a process mesh of {self.size} ranks")
        out = []
        for s in reversed(self.shape):
            rank, r = divmod(rank, s)
            out.append(r)
        return tuple(reversed(out))

    def index_along(self, rank: int, axes: AxisNames) -> int:
        """The position of ``rank`` within its subgroup along ``axes`` (row-major over them, in the
        order given)."""
        c = self.coords(rank)
        idx = 0
        for n in _names(axes, "index_along"):
            a = self.axis(n)
            idx = idx * self.shape[a] + c[a]
        return idx

    def groups(self, axes: AxisNames) -> tuple[tuple[int, ...], ...]:
        """The subgroups along ``axes``: ranks that differ only there, each ordered row-major over
        ``axes`` in the order given, the groups row-major over the other axes."""
        names = _names(axes, "groups")
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"groups: an axis is named twice in {names}")
        along = [self.axis(n) for n in names]
        rest = [a for a in range(len(self.shape)) if a not in along]
        out = []
        for fixed in itertools.product(*(range(self.shape[a]) for a in rest)):
            group = []
            for moving in itertools.product(*(range(self.shape[a]) for a in along)):
                c = [0] * len(self.shape)
                for a, i in zip(rest, fixed):
                    c[a] = i
                for a, i in zip(along, moving):
                    c[a] = i
                flat = 0
                for i, s in zip(c, self.shape):
                    flat = flat * s + i
                group.append(flat)
            out.append(tuple(group))
        return tuple(out)

    def group_of(self, rank: int, axes: AxisNames) -> tuple[int, ...]:
        """The subgroup along ``axes`` that ``rank`` belongs to."""
        return next(g for g in self.groups(axes) if rank in g)


def _entry(e: Any, i: int) -> tuple[str, ...]:
    if e is None:
        return ()
    return _names(e, f"layout spec entry {i}")


def block_bounds(length: int, n: int, i: int) -> tuple[int, int]:
    """``(start, stop)`` of piece ``i`` of ``numpy.array_split(range(length), n)``."""
    q, r = divmod(length, n)
    start = i * q + min(i, r)
    return start, start + q + (1 if i < r else 0)


@dataclass(frozen=True, init=False)
class Layout:
    """How one tensor lies on a mesh: ``Layout(mesh, ("data", None))`` cuts dimension 0 along mesh
    axis ``data`` and keeps dimension 1 whole (JAX's ``PartitionSpec("data", None)``); a spec entry
    may name several axes (``("data", "model")``: cut into ``4`` on a 2x2 mesh, ``data`` major).
    Mesh axes named nowhere hold replicas; ``partial`` names axes along which the devices hold
    partial sums whose total is the tensor (DTensor's ``Partial()``). Each axis is named at most once.
    Trailing whole dimensions are dropped, so ``("data", None)`` and ``("data",)`` are one layout.
    Frozen, hashable, equal by value."""

    mesh: Any  # (a Mesh or a ProcessMesh: typed loosely, since each code path knows which it holds)
    """The mesh the tensor lies on (a :class:`Mesh` or a :class:`ProcessMesh`): devices of one
    process, or the ranks of a group (each holding its piece)."""
    spec: tuple[tuple[str, ...], ...]
    """Per tensor dimension, the mesh axes it is cut along (``()``: whole)."""
    partial: tuple[str, ...]
    """The mesh axes holding partial sums."""

    def __init__(self, mesh: Mesh | ProcessMesh, spec: Sequence[SpecEntry] = (), partial: AxisNames = ()) -> None:
        """Validate and freeze (InvalidArgumentError for unknown or repeated axes)."""
        if not isinstance(mesh, (Mesh, ProcessMesh)):
            raise InvalidArgumentError(f"Layout takes a multidev Mesh or a distributed ProcessMesh first, got "
                                       f"{type(mesh).__name__}")
        if isinstance(spec, (str, bytes)) or not isinstance(spec, Iterable):
            raise InvalidArgumentError(f"layout spec is a sequence with one entry per tensor dimension (None, an "
                                       f"axis name or a tuple of names), got {spec!r:.60}")
        entries = [_entry(e, i) for i, e in enumerate(spec)]
        while entries and not entries[-1]:
            entries.pop()
        part = _names(partial, "layout partial")
        used = [n for e in entries for n in e] + list(part)
        for n in used:
            mesh.axis(n)
        if len(set(used)) != len(used):
            twice = sorted({n for n in used if used.count(n) > 1})
            raise InvalidArgumentError(f"layout: mesh axis {', '.join(map(repr, twice))} is named more than once "
                                       f"(spec {tuple(entries)}, partial {part})")
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "spec", tuple(entries))
        object.__setattr__(self, "partial", part)
        object.__setattr__(self, "_pieces", tuple(mesh.axis_size(e) if e else 1 for e in entries))
        object.__setattr__(self, "_hash", hash((mesh, self.spec, part)))

    def __reduce__(self) -> tuple:
        return (Layout, (self.mesh, self.spec, self.partial))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not Layout:
            return NotImplemented
        o: Any = other
        return bool(self._hash == o._hash and self.spec == o.spec and self.partial == o.partial  # type: ignore[attr-defined]
                    and self.mesh == o.mesh)

    @property
    def across_processes(self) -> bool:
        """Whether the mesh is a :class:`ProcessMesh` (each rank holds its piece)."""
        return self.mesh.__class__ is ProcessMesh

    @property
    def replicated(self) -> tuple[str, ...]:
        """The mesh axes along which the tensor is replicated (named neither in spec nor partial)."""
        used = {n for e in self.spec for n in e} | set(self.partial)
        return tuple(n for n in self.mesh.axis_names if n not in used)

    def pieces(self, dim: int) -> int:
        """Into how many pieces tensor dimension ``dim`` is cut (1 where it is whole)."""
        p: tuple[int, ...] = self._pieces  # type: ignore[attr-defined]
        return p[dim] if dim < len(p) else 1

    def check_rank(self, ndim: int, what: str = "layout") -> None:
        """InvalidArgumentError where the spec has more entries than a tensor of ``ndim`` dimensions."""
        if len(self.spec) > ndim:
            raise InvalidArgumentError(f"{what}: the layout cuts {len(self.spec)} dimensions {self.spec_text()} but "
                                       f"the tensor has {ndim}")

    def block(self, device: Any, shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """The ``(start, stop)`` of each dimension of the piece ``device`` (a rank, on a process mesh)
        holds of a tensor of ``shape`` (numpy.array_split's sizes)."""
        out = []
        for d, length in enumerate(shape):
            if d < len(self.spec) and self.spec[d]:
                n = self.mesh.axis_size(self.spec[d])
                out.append(block_bounds(length, n, self.mesh.index_along(device, self.spec[d])))
            else:
                out.append((0, length))
        return tuple(out)

    def shard_shape(self, device: Any, shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of the piece ``device`` holds."""
        return tuple(b - a for a, b in self.block(device, shape))

    def uneven(self, shape: Sequence[int]) -> list[tuple[int, int, int]]:
        """``(dim, length, pieces)`` for each dimension of ``shape`` that its pieces do not divide."""
        p: tuple[int, ...] = self._pieces  # type: ignore[attr-defined]
        return [(d, shape[d], p[d]) for d in range(min(len(shape), len(p))) if shape[d] % p[d]]

    def spec_text(self) -> str:
        """The spec as a PartitionSpec reads: ``('data', None, ('x', 'y'))``."""
        items = [repr(None) if not e else repr(e[0]) if len(e) == 1 else repr(e) for e in self.spec]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"

    def __repr__(self) -> str:
        part = f", partial={self.partial!r}" if self.partial else ""
        return f"Layout({self.mesh!r}, {self.spec_text()}{part})"
