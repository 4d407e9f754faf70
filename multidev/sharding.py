"""Meshes of a backend's devices, tensors placed by a :class:`~multidev.Layout`, and their way back.

- :func:`make_mesh` builds a :class:`~multidev.Mesh` from a backend's devices, in the order the
  framework's own mesh factory would choose (``jax.make_mesh``'s topology-aware order on JAX; the
  backend's device order elsewhere: the last axis over neighbouring devices).
- :func:`place` (``multidev.to(x, layout)``) lays a tensor out on a mesh. Where the framework has
  a sharded type that expresses the layout (:class:`~multidev.protocol.SupportsSharding`: JAX's
  ``NamedSharding``) the result is that native tensor; elsewhere (NumPy, torch in one process,
  TensorFlow, MXNet, array-API libraries, and layouts with partial sums on JAX) a
  :class:`ShardedTensor`: a frozen record of the layout and one native tensor per mesh device.
- :func:`unshard` (``multidev.to(x, device)``), ``multidev.to_host``, :func:`layout_of`,
  :func:`shards_of` and :func:`from_shards` bring a sharded tensor back whole, report it, or build
  one from per-device pieces; ``multidev.convert`` converts it shard by shard (its layout kept, no
  gather).

Placement copies: every shard is a new buffer (pieces of ``x`` on their devices), never a view of
the source; placing a tensor by the layout it already has returns it unchanged (as ``to`` does).
Changing a layout (``multidev.to(sharded, other_layout)``) moves only the pieces each device lacks,
sums partial pieces along the axes the new layout does not keep partial, and needs no gather.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ._device import Device, DeviceLike
from .errors import (
    CapabilityError,
    DeviceMismatchError,
    DeviceNotFoundError,
    DistributedError,
    InvalidArgumentError,
    UnsupportedTensorError,
    translate_errors,
)
from .mesh import AxisNames, Layout, Mesh, ProcessMesh, check_axis_names, mesh_shape
from .placement import resolve, scope_backend
from .protocol import Backend, SupportsSharding
from .registry import backend_of, get_backend, loaded_backends, require, tie_cache

__all__ = [
    "ShardedTensor",
    "across_processes",
    "cut_piece",
    "from_native_mesh",
    "from_shards",
    "is_sharded",
    "layout_of",
    "make_mesh",
    "map_shards",
    "place",
    "sharded_device",
    "sharded_to_host",
    "shards_of",
    "to_native_mesh",
    "unshard",
]


# -- meshes ----------------------------------------------------------------------------------------
@translate_errors()
def make_mesh(shape: int | Sequence[int], axis_names: AxisNames, devices: Sequence[DeviceLike] | None = None,
         backend: str | None = None) -> Mesh:
    """A :class:`~multidev.Mesh` of ``shape`` with ``axis_names`` over devices of ``backend`` (the
    default backend when None).

    ``devices=None`` takes the first ``prod(shape)`` accelerators of the backend (its CPUs where it
    has none); DeviceNotFoundError, saying how to get more, where it has fewer. Given ``devices`` (any
    spelling) must be distinct devices of the backend, exactly as many as the mesh has. The order is
    the framework's own mesh factory's where it has one (:class:`~multidev.protocol.SupportsMesh`;
    ``jax.make_mesh`` reorders devices for the hardware's topology), else the order given (by
    default the backend's: the last axis varies fastest, over neighbouring devices)."""
    shp = mesh_shape(shape)
    names = check_axis_names(axis_names)
    n = math.prod(shp)
    b = _mesh_backend(backend)
    if devices is None:
        avail = b.devices()
        pool = [d for d in avail if d.is_gpu] or avail
        if len(pool) < n:
            env = getattr(b, "virtual_devices_env", None)
            kind = "accelerators" if pool[0].is_gpu else "CPU devices"
            hint = (f"set ${env}={n} before the framework starts" if env and not pool[0].is_gpu else
                    "run one process per device under multidev.distributed, or make a smaller mesh")
            raise DeviceNotFoundError(f"mesh of shape {shp} needs {n} devices; {b.name} has {len(pool)} {kind} "
                                      f"({', '.join(map(str, pool))}). Hint: {hint}.")
        devs = list(pool[:n])
    else:
        if isinstance(devices, (str, bytes, Device)) or not hasattr(devices, "__iter__"):
            raise InvalidArgumentError(f"mesh devices must be a sequence of devices, got {devices!r:.60}")
        devs = [resolve(b, d) for d in devices]
        if len(devs) != n:
            raise InvalidArgumentError(f"a mesh of shape {shp} needs {n} devices, got {len(devs)}")
        if len(set(devs)) != n:
            raise InvalidArgumentError(f"mesh devices must be distinct, got {', '.join(map(str, devs))}")
    if b.mesh is not None:
        ordered = list(b.mesh.mesh_device_order(shp, devs))
        if sorted(ordered) != sorted(devs):
            raise CapabilityError(f"{b.name}'s mesh_device_order changed the devices ({ordered} from {devs})")
        devs = ordered
    return Mesh(shp, names, devs)


def _mesh_backend(backend: str | None) -> Backend:
    return get_backend(backend if backend is not None else scope_backend.get())


@translate_errors()
def to_native_mesh(mesh: Mesh, backend: str | None = None, kind: str | None = None) -> Any:
    """The framework's own mesh for ``mesh`` (same shape, axis names and devices, in order):
    ``jax.sharding.Mesh`` on JAX; on TensorFlow a ``tf.experimental.dtensor`` mesh (``kind="dtensor"``,
    the default) or a Keras ``keras.distribution.DeviceMesh`` (``kind="keras"``); on torch a
    ``DeviceMesh`` where torch.distributed runs with one rank per device (CapabilityError in one
    process of several devices, saying so). CapabilityError for a backend without meshes."""
    if not isinstance(mesh, Mesh):
        raise InvalidArgumentError(f"to_native_mesh takes a multidev Mesh, got {type(mesh).__name__}")
    b = _mesh_backend(backend)
    native = b.mesh
    if native is None:
        raise CapabilityError(f"{b.name} has no mesh type of its own (SupportsMesh); its sharded tensors are "
                              "multidev's managed shards (multidev.to(x, layout))")
    kinds = tuple(native.native_mesh_kinds())
    k = kinds[0] if kind is None else kind
    if k not in kinds:
        raise InvalidArgumentError(f"to_native_mesh: {b.name} makes meshes of kind {', '.join(kinds)}, "
                                   f"not {kind!r:.40}")
    for d in mesh.devices:
        resolve(b, d)
    return native.to_native_mesh(mesh, k)


@translate_errors()
def from_native_mesh(obj: Any, backend: str | None = None) -> Mesh:
    """The :class:`~multidev.Mesh` of a framework's own mesh (``jax.sharding.Mesh``, torch's
    ``DeviceMesh``, a ``tf.dtensor`` mesh, a Keras ``DeviceMesh``), asking ``backend`` or else every
    loaded backend with meshes. A :class:`~multidev.Mesh` is returned as it is. An object with
    ``shape``, ``axis_names`` and ``devices`` of device strings (a Keras ``DeviceMesh``) is read
    without a framework. InvalidArgumentError for anything else."""
    if isinstance(obj, Mesh):
        return obj
    cands = [get_backend(backend)] if backend is not None else list(loaded_backends())
    for b in cands:
        if b.mesh is not None:
            m = b.mesh.from_native_mesh(obj)
            if m is not None:
                return m
    found = _duck_mesh(obj)
    if found is not None:
        return found
    raise InvalidArgumentError(f"from_native_mesh: {type(obj).__name__} is no mesh that "
                               f"{', '.join(b.name for b in cands) or 'a loaded backend'} knows")


def _duck_mesh(obj: Any) -> Mesh | None:
    """A mesh read from ``shape``, ``axis_names`` and ``devices`` holding device spellings."""
    try:
        shape, names, devs = obj.shape, obj.axis_names, obj.devices
        flat = [str(d) for d in np.asarray(devs, dtype=object).reshape(-1)]
    except (AttributeError, TypeError, ValueError):
        return None
    if not isinstance(names, (list, tuple)) or not all(isinstance(d, str) for d in np.asarray(devs).reshape(-1)):
        return None
    return Mesh(tuple(int(s) for s in shape), tuple(names), [Device.parse(d) for d in flat])


# -- the managed container -------------------------------------------------------------------------
class ShardedTensor:
    """A tensor laid out on a mesh by multidev where the framework has no sharded type of its own:
    the :class:`~multidev.Layout`, the global ``shape`` and ``dtype``, the ``backend`` name, and
    ``shards``, one native tensor per device of the layout's mesh, in mesh order (``shards[i]`` on
    ``layout.mesh.devices[i]``, with its piece's shape); over a process mesh
    (:class:`~multidev.distributed.ProcessMesh`), this rank's one piece. Frozen: the record cannot be changed (the
    shards are the framework's tensors, writable where the framework's are). Made by
    ``multidev.to(x, layout)`` and :func:`from_shards`; read back with ``multidev.to_host``,
    ``multidev.to(x, device)``, :func:`layout_of` and :func:`shards_of`. Not a tensor: no
    arithmetic (compute on the shards, or gather)."""

    __slots__ = ("backend", "dtype", "layout", "shape", "shards")
    backend: str
    dtype: str
    layout: Layout
    shape: tuple[int, ...]
    shards: tuple[Any, ...]

    def __init__(self, layout: Layout, shape: tuple[int, ...], dtype: str, backend: str, shards: Sequence[Any]) -> None:
        """Internal: use ``multidev.to(x, layout)`` or :func:`from_shards` (they check the pieces)."""
        for k, v in (("layout", layout), ("shape", tuple(shape)), ("dtype", dtype), ("backend", backend),
                     ("shards", tuple(shards))):
            object.__setattr__(self, k, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ShardedTensor is frozen: cannot set {name!r}; make a new one with "
                             "multidev.to(x, layout)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"ShardedTensor is frozen: cannot delete {name!r}")

    @property
    def ndim(self) -> int:
        """The number of dimensions of the whole tensor."""
        return len(self.shape)

    @property
    def devices(self) -> tuple[Device, ...]:
        """The mesh's devices, in mesh order (``shards[i]`` lives on ``devices[i]``); over a process
        mesh, the device of this rank's one piece."""
        m = self.layout.mesh
        if m.__class__ is ProcessMesh:
            b = get_backend(self.backend)
            return tuple(b.device_of(s) for s in self.shards)
        return m.devices

    def shard(self, device: DeviceLike) -> Any:
        """The native piece on ``device`` (InvalidArgumentError where it is not on the mesh, or not
        this rank's over a process mesh)."""
        dev = Device.parse(device)
        try:
            return self.shards[self.devices.index(dev)]
        except ValueError:
            raise InvalidArgumentError(f"{dev} is not on this tensor's mesh {self.layout.mesh!r}") from None

    def __repr__(self) -> str:
        return f"ShardedTensor({self.backend} {self.dtype}{list(self.shape)}, {self.layout!r})"

    def __reduce__(self) -> Any:
        raise TypeError("a ShardedTensor holds framework tensors on devices; pickle multidev.to_host(x) instead")


# -- sources: what a placement reads -----------------------------------------------------------------
class _Source:
    """What a placement reads: the backend, the whole shape and dtype, the layout (None: one tensor
    on one device), and the pieces, one per device (read from the framework only when needed)."""

    __slots__ = ("_shards", "b", "devices", "dtype", "layout", "native", "shape", "x")

    def __init__(self, b: Backend, x: Any, shape: tuple[int, ...], dtype: str, layout: Layout | None,
                 shards: list[Any] | None, devices: list[Device], native: bool) -> None:
        self.b, self.x, self.shape, self.dtype, self.layout = b, x, shape, dtype, layout
        self._shards, self.devices, self.native = shards, devices, native

    @property
    def shards(self) -> list[Any]:
        if self._shards is None:
            self._shards = list(require(self.b, SupportsSharding, "shards_of").shards_of(self.x))
        return self._shards


def _native_layout(b: Backend, x: Any) -> Layout | None:
    """The layout of a framework's own sharded tensor: over one process's devices
    (:class:`~multidev.protocol.SupportsSharding`), or across processes (the mesh concern's
    ``process_layout_of``: a DTensor, a global ``jax.Array``); None for a tensor on one device."""
    lay = None if b.sharding is None else b.sharding.layout_of(x)
    if lay is None and b.mesh is not None:
        read = getattr(b.mesh, "process_layout_of", None)
        if read is not None:
            lay = read(x)
    return lay


def _across(layout: Any) -> bool:
    return layout is not None and layout.mesh.__class__ is ProcessMesh


def _layouts() -> Any:
    """:mod:`multidev.distributed.layouts`, loaded with :mod:`multidev.distributed` (a process mesh's
    layouts need its group; looked up, not imported: the distributed layer builds on this module)."""
    mod = sys.modules.get(f"{__package__}.distributed.layouts")
    if mod is None:
        raise DistributedError("multidev.distributed is not initialised: a layout over a process mesh needs its "
                               "group (import multidev.distributed and call init() in every process)")
    return mod


def across_processes(x: Any) -> bool:
    """Whether ``x`` is a tensor sharded across processes (a ShardedTensor over a process mesh, a
    DTensor, a global ``jax.Array``). Never copies or waits."""
    if x.__class__ is ShardedTensor:
        return x.layout.mesh.__class__ is ProcessMesh
    try:
        b = backend_of(x)
    except UnsupportedTensorError:
        return False
    return _across(_native_layout(b, x))


def _source(x: Any, what: str) -> _Source:
    if x.__class__ is ShardedTensor:
        return _Source(get_backend(x.backend), x, x.shape, x.dtype, x.layout, list(x.shards), list(x.devices), False)
    try:
        b = backend_of(x)
    except UnsupportedTensorError as e:
        raise UnsupportedTensorError(f"{what} takes a tensor or a sharded tensor: {e}") from None
    lay = _native_layout(b, x)
    shape, dtype = b.shape_of(x), b.dtype_of(x)
    if lay is not None and lay.mesh.__class__ is ProcessMesh:  # this rank's pieces (a DTensor's local tensor)
        pieces = list(b.mesh.local_pieces(x))  # type: ignore[union-attr]
        return _Source(b, x, shape, dtype, lay, pieces, [b.device_of(p) for p in pieces], True)
    if lay is not None:
        return _Source(b, x, shape, dtype, lay, None, list(lay.mesh.devices), True)
    return _Source(b, x, shape, dtype, None, [x], [b.device_of(x)], False)


def is_sharded(x: Any) -> bool:
    """Whether ``x`` is a sharded tensor: a :class:`ShardedTensor`, or a framework's own sharded
    tensor (a ``jax.Array`` with a ``NamedSharding``). Never copies or waits."""
    if x.__class__ is ShardedTensor:
        return True
    try:
        b = backend_of(x)
    except UnsupportedTensorError:
        return False
    return _native_layout(b, x) is not None


@translate_errors()
def layout_of(x: Any) -> Layout | None:
    """The :class:`~multidev.Layout` of a sharded tensor (a :class:`ShardedTensor`, or a framework's
    own: JAX's ``NamedSharding`` read back as a layout), None for a tensor on one device.
    UnsupportedTensorError for what is no tensor. Never copies or waits."""
    return _source(x, "layout_of").layout


@translate_errors()
def shards_of(x: Any) -> list[Any]:
    """The native pieces of ``x``, one per device of its layout's mesh, in mesh order (JAX: its
    ``addressable_shards``' data; no copy); ``[x]`` for a tensor on one device. Sharded across
    processes: this rank's piece (a DTensor's ``to_local()``)."""
    return list(_source(x, "shards_of").shards)


def sharded_device(x: ShardedTensor) -> Device:
    """``multidev.device_of`` of a ShardedTensor: its one device where its mesh has one, else
    DeviceMismatchError naming the devices (its layout says where each piece is)."""
    devs = x.devices
    if len(devs) == 1 and x.layout.mesh.size == 1:
        return devs[0]
    if x.layout.mesh.__class__ is ProcessMesh:
        raise DeviceMismatchError(f"device_of: this ShardedTensor lies across the {x.layout.mesh.size} processes of a "
                                  f"process mesh (this rank's piece is on {devs[0]}), so it has no single device; "
                                  "multidev.layout_of(x) says where each piece is, multidev.to_host(x) or "
                                  "multidev.to(x, device) gathers it (on every rank)")
    raise DeviceMismatchError(f"device_of: this ShardedTensor lies on {len(devs)} devices "
                              f"({', '.join(map(str, devs))}) and so has no single device; multidev.layout_of(x) "
                              "says where each piece is, multidev.to(x, device) gathers it onto one")


# -- placement ---------------------------------------------------------------------------------------
class _Block(NamedTuple):
    dev: Device
    tensor: Any
    box: tuple[tuple[int, int], ...]
    key: tuple[int, ...]  # positions along the partial axes kept (which summand the piece belongs to)
    fresh: bool  # made here (not one of the caller's tensors): may be handed out without a copy


def _full_box(shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((0, s) for s in shape)


def _slice(b: Backend, x: Any, rel: tuple[tuple[int, int], ...], shape: tuple[int, ...]) -> Any:
    """``x[rel]`` (a view where the framework's split gives one)."""
    for d, ((s, e), n) in enumerate(zip(rel, shape)):
        if (s, e) != (0, n):
            x = b.split(x, [s, e - s, n - e], d)[1]
    return x


def cut_piece(b: Backend, whole: Any, box: tuple[tuple[int, int], ...], shape: tuple[int, ...], dev: Device,
              fresh: bool) -> Any:
    """The piece ``box`` of ``whole`` (of ``shape``, on ``dev``) as a new buffer; ``whole`` itself
    where the box is all of it and ``fresh`` (made by multidev, not the caller's)."""
    x = _slice(b, whole, box, shape)
    return x if fresh and x is whole else b.copy(x, dev)


def _blocks(src: _Source, target: Layout) -> tuple[list[_Block], tuple[str, ...]]:
    """The source's pieces, with partial sums along the axes the target does not keep partial added
    up (onto the first device of each group); and the partial axes kept."""
    b, lay = src.b, src.layout
    if lay is None:
        return [_Block(src.devices[0], src.shards[0], _full_box(src.shape), (), False)], ()
    m = lay.mesh
    kept = tuple(a for a in lay.partial if m == target.mesh and a in target.partial)
    summed = tuple(a for a in lay.partial if a not in kept)
    by_dev = dict(zip(src.devices, src.shards))

    def key(dev: Device) -> tuple[int, ...]:
        c = m.coords(dev)
        return tuple(c[m.axis(a)] for a in kept)

    if not summed:
        return [_Block(d, t, lay.block(d, src.shape), key(d), False) for d, t in by_dev.items()], kept
    out = []
    for group in m.groups(summed):
        first = group[0]
        acc = by_dev[first]
        for d in group[1:]:
            acc = b.combine("sum", acc, b.move(by_dev[d], first))
        out.append(_Block(first, acc, lay.block(first, src.shape), key(first), len(group) > 1))
    return out, kept


def _piece(b: Backend, blocks: list[_Block], box: tuple[tuple[int, int], ...], dev: Device, dtype: str) -> Any:
    """The tensor of global ``box`` on ``dev``, stitched from the blocks that cover it: pieces already
    on ``dev`` are cut there, the others moved; a new buffer, never one of the caller's tensors."""
    shape = tuple(e - s for s, e in box)
    if any(n == 0 for n in shape):
        return b.empty(shape, dtype, dev)
    per_dim: list[list[tuple[int, int, tuple[int, int]]]] = []
    for d, (lo, hi) in enumerate(box):
        ivs = sorted({blk.box[d] for blk in blocks})
        per_dim.append([(max(a, lo), min(c, hi), (a, c)) for a, c in ivs if a < hi and c > lo and a < c])
        if sum(e - s for s, e, _ in per_dim[-1]) != hi - lo:
            raise CapabilityError(f"placement: the source pieces do not cover {box} (a broken layout or adapter)")
    index: dict[tuple[tuple[int, int], ...], list[_Block]] = {}
    for blk in blocks:
        index.setdefault(blk.box, []).append(blk)
    single = math.prod(len(p) for p in per_dim) == 1

    def cut(combo: tuple[tuple[int, int, tuple[int, int]], ...]) -> Any:
        cands = index[tuple(iv for _, _, iv in combo)]
        blk = next((c for c in cands if c.dev == dev), cands[0])
        rel = tuple((s - iv[0], e - iv[0]) for s, e, iv in combo)
        bshape = tuple(iv[1] - iv[0] for _, _, iv in combo)
        x = _slice(b, blk.tensor, rel, bshape)
        if blk.dev != dev:
            return b.move(x, dev)
        return b.copy(x, dev) if single and not (blk.fresh and x is blk.tensor) else x

    return _stitch(b, cut, per_dim, 0, ())


def _stitch(b: Backend, cut: Callable[[tuple[Any, ...]], Any], per_dim: list[list[tuple[int, int, tuple[int, int]]]],
            d: int, prefix: tuple[tuple[int, int, tuple[int, int]], ...]) -> Any:
    """The block of :func:`_piece` from dimension ``d`` on, ``prefix`` chosen before it: each interval's
    cut, concatenated along ``d``. (A module function, not a closure: a recursive closure is a
    reference cycle, which held the source pieces until a garbage collection.)"""
    if d == len(per_dim):
        return cut(prefix)
    parts = [_stitch(b, cut, per_dim, d + 1, (*prefix, iv)) for iv in per_dim[d]]
    return parts[0] if len(parts) == 1 else b.concat(parts, d)


def _relayout(src: _Source, target: Layout) -> list[Any]:
    """One new native piece per device of the target's mesh, in mesh order."""
    b = src.b
    blocks, kept = _blocks(src, target)
    m = target.mesh
    fresh_partial = [m.axis(a) for a in target.partial if a not in kept]
    zero: Any = False if src.dtype == "bool" else 0
    out = []
    for dev in m.devices:
        box = target.block(dev, src.shape)
        c = m.coords(dev)
        if any(c[a] != 0 for a in fresh_partial):  # a new partial axis: the first device holds the value
            out.append(b.full(tuple(e - s for s, e in box), zero, src.dtype, dev))
            continue
        k = tuple(c[m.axis(a)] for a in kept)
        out.append(_piece(b, [blk for blk in blocks if blk.key == k], box, dev, src.dtype))
    return out


#: (adapter, mesh, dtype, id(capabilities)) -> the capability record the mesh was checked against.
_CHECKED: dict[tuple[Any, ...], Any] = tie_cache({})


def _check_target(b: Backend, layout: Layout, shape: tuple[int, ...], dtype: str, what: str) -> Any:
    """Validate ``layout`` for a ``b`` tensor of ``shape`` and ``dtype``; the native sharding or None."""
    if not isinstance(layout, Layout):
        raise InvalidArgumentError(f"{what} takes a multidev Layout, got {type(layout).__name__}")
    layout.check_rank(len(shape), what)
    caps = b.capabilities
    key = (b, layout.mesh, dtype, id(caps))
    if _CHECKED.get(key) is not caps:  # (the device set and dtypes checked once per capability record)
        for d in layout.mesh.devices:
            resolve(b, d)
            if dtype not in caps.dtypes_on(d):
                raise CapabilityError(f"{what}: {b.name} cannot hold {dtype} on {d}")
        if len(_CHECKED) < 1024:
            _CHECKED[key] = caps
    if layout.partial and dtype == "bool":
        raise InvalidArgumentError(f"{what}: partial sums of bool tensors are undefined; lay it out without partial")
    if b.sharding is not None:
        return b.sharding.sharding_for(layout, shape)
    return None


@translate_errors("to(layout)")
def place(x: Any, layout: Layout) -> Any:
    """``multidev.to(x, layout)``: ``x`` (a tensor on one device, or a sharded tensor) laid out by
    ``layout``. Where the framework's sharded type expresses the layout, its native tensor (JAX:
    ``jax.device_put`` with a ``NamedSharding``, asynchronous); else a :class:`ShardedTensor` of new
    native pieces, each on its device. A tensor that already has this layout is returned as it is.
    Placing a whole tensor into a layout with partial sums puts it on the first device along the
    partial axes and zeros on the others. Everything is validated before anything moves.

    A layout over a :class:`~multidev.distributed.ProcessMesh`: collective, rank 0's tensor laid
    out across the group's processes (:func:`multidev.distributed.distribute`; a DTensor under the
    torch engine, a global ``jax.Array`` under jax, else a ShardedTensor of this rank's piece)."""
    if layout.__class__ is Layout and layout.mesh.__class__ is ProcessMesh:
        return _layouts().distribute(x, layout, 0)
    src = _source(x, "to(layout)")
    if _across(src.layout):  # sharded across processes: gathered on every rank (collective), then laid out
        return place(_layouts().whole_of(x), layout)
    b = src.b
    sharding = _check_target(b, layout, src.shape, src.dtype, "to(layout)")
    if src.layout == layout:
        return x
    if sharding is not None and (src.layout is None or src.native):  # (a native layout has no partial sums)
        return require(b, SupportsSharding, "to(layout)").place_sharded(x, sharding)
    shards = _relayout(src, layout)
    if sharding is not None:
        return require(b, SupportsSharding, "to(layout)").assemble(shards, sharding, src.shape)
    return ShardedTensor(layout, src.shape, src.dtype, b.name, shards)


@translate_errors("to(device)")
def unshard(x: Any, device: DeviceLike) -> Any:
    """``multidev.to(sharded, device)``: the whole tensor (partial sums added up) as one new native
    tensor on ``device``, built from the pieces (those already on ``device`` are not moved)."""
    src = _source(x, "to(device)")
    dev = resolve(src.b, device)
    if _across(src.layout):  # gathered on every rank (collective), then moved
        whole = _layouts().whole_of(x)
        return whole if src.b.device_of(whole) == dev else src.b.move(whole, dev)
    if src.native:  # the framework's own gather (jax.device_put(x, device))
        return require(src.b, SupportsSharding, "to(device)").unshard(x, dev)
    one = Layout(Mesh((1,), ("_",), (dev,)))
    return _relayout(src, one)[0]


@translate_errors("to_host")
def sharded_to_host(x: Any) -> np.ndarray:
    """``multidev.to_host`` of a sharded tensor: one host NumPy array of the whole tensor, assembled
    from one host copy of each distinct piece (partial sums added in mesh order)."""
    src = _source(x, "to_host")
    b, lay = src.b, src.layout
    if lay is None:
        return b.to_numpy(src.shards[0])
    if _across(lay):  # gathered on every rank (collective)
        return b.to_numpy(_layouts().whole_of(x))
    hosts = {d: b.to_numpy(t) for d, t in zip(src.devices, src.shards)}
    m = lay.mesh
    seen: set[tuple[Any, ...]] = set()
    out: np.ndarray | None = None
    for d in m.devices:
        box = lay.block(d, src.shape)
        c = m.coords(d)
        summand = tuple(c[m.axis(a)] for a in lay.partial)
        if (box, summand) in seen:
            continue
        seen.add((box, summand))
        h = hosts[d]
        if out is None:
            out = np.zeros(src.shape, dtype=h.dtype)
        sl = tuple(slice(s, e) for s, e in box)
        if lay.partial:
            out[sl] = out[sl] + h
        else:
            out[sl] = h
    assert out is not None
    return out


# -- building from pieces ----------------------------------------------------------------------------
@translate_errors()
def from_shards(shards: Sequence[Any], layout: Layout, shape: Sequence[int] | None = None) -> Any:
    """The sharded tensor whose pieces are ``shards`` (one native tensor per device of the layout's
    mesh, in mesh order, each on its device with the shape its piece has): the framework's own
    sharded tensor where it expresses the layout (no copy where it allows), else a
    :class:`ShardedTensor` holding ``shards`` themselves (no copy). ``shape``, the whole tensor's,
    is worked out from the pieces when None. Replicas are taken as given (not compared).
    InvalidArgumentError for pieces on the wrong device or of the wrong shape, naming them. Over
    a process mesh: ``[this rank's piece]`` (:func:`multidev.distributed.from_local`)."""
    if not isinstance(layout, Layout):
        raise InvalidArgumentError(f"from_shards takes a multidev Layout, got {type(layout).__name__}")
    if isinstance(shards, (str, bytes)) or not isinstance(shards, Sequence):
        raise InvalidArgumentError(f"from_shards takes a list of tensors, one per mesh device, "
                                   f"got {type(shards).__name__}")
    xs = list(shards)
    if layout.mesh.__class__ is ProcessMesh:  # this rank's one piece (distributed.from_local)
        if len(xs) != 1:
            raise InvalidArgumentError(f"from_shards over a process mesh takes this rank's one piece, got {len(xs)}")
        return _layouts().from_local(xs[0], layout, shape)
    m = layout.mesh
    if len(xs) != m.size:
        raise InvalidArgumentError(f"from_shards: the mesh has {m.size} devices, got {len(xs)} pieces")
    backs = [backend_of(x) for x in xs]
    if len({bk.name for bk in backs}) > 1:
        raise InvalidArgumentError(f"from_shards: pieces of several backends ({sorted({bk.name for bk in backs})})")
    b = backs[0]
    dtypes = {b.dtype_of(x) for x in xs}
    if len(dtypes) > 1:
        raise InvalidArgumentError(f"from_shards: pieces of several dtypes ({sorted(dtypes)})")
    dtype = dtypes.pop()
    wrong = [f"piece {i} on {b.device_of(x)}, not {d}" for i, (x, d) in enumerate(zip(xs, m.devices))
             if b.device_of(x) != d]
    if wrong:
        raise InvalidArgumentError(f"from_shards: {'; '.join(wrong[:4])}")
    shapes = [b.shape_of(x) for x in xs]
    if len({len(s) for s in shapes}) > 1:
        raise InvalidArgumentError(f"from_shards: pieces of several ranks ({shapes})")
    layout.check_rank(len(shapes[0]), "from_shards")
    if shape is None:
        total = list(shapes[0])
        for d in range(len(layout.spec)):
            if layout.spec[d]:
                firsts: dict[int, int] = {}
                for dev, s in zip(m.devices, shapes):
                    firsts.setdefault(m.index_along(dev, layout.spec[d]), s[d])
                total[d] = sum(firsts.values())
        shp = tuple(total)
    else:
        shp = tuple(int(s) for s in shape)
    bad = [f"piece {i} on {dev} has shape {s}, its piece of {shp} is {layout.shard_shape(dev, shp)}"
           for i, (dev, s) in enumerate(zip(m.devices, shapes)) if s != layout.shard_shape(dev, shp)]
    if bad:
        raise InvalidArgumentError(f"from_shards: {'; '.join(bad[:4])}")
    sharding = _check_target(b, layout, shp, dtype, "from_shards")
    if sharding is not None:
        return require(b, SupportsSharding, "from_shards").assemble(xs, sharding, shp)
    return ShardedTensor(layout, shp, dtype, b.name, xs)


def map_shards(x: Any, fn: Callable[[Any], Any]) -> Any:
    """``x``'s pieces through ``fn`` (each to a tensor on the same device with the same shape, e.g.
    of another framework: ``multidev.convert``), rebuilt with x's layout by :func:`from_shards`."""
    src = _source(x, "convert")
    if src.layout is None:
        raise InvalidArgumentError("map_shards takes a sharded tensor")
    return from_shards([fn(t) for t in src.shards], src.layout, src.shape)
