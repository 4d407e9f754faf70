"""Single-process collectives over many devices, written once over the adapter protocol.

Lists in, lists out: result ``i`` lives on input ``i``'s device and keeps the inputs' dtype.
Every argument is validated before anything is computed, moved or written, so a failing call, in
place or not, leaves its inputs bit-identical.

Semantics (the same on every backend; docs/collectives.md has the table):

- ``op``: ``sum``, ``mean``, ``max``, ``min``, ``prod``. ``mean`` is a sum followed by one division
  by the number of tensors, in the inputs' dtype; ``mean`` of integer or bool tensors raises
  :class:`CollectiveInputError` (no silent flooring). ``bool`` tensors take ``max`` (logical or) and
  ``min`` (logical and) only. Integer sums and products wrap as the framework's own arithmetic does.
- One tensor per device: a device appearing twice raises :class:`CollectiveInputError`.
- Uneven splits (``scatter``, ``reduce_scatter``, ``split_batch``) follow ``numpy.array_split``: with
  ``L`` rows over ``n`` devices the first ``L % n`` pieces get ``L // n + 1`` rows, the rest
  ``L // n`` (pieces may be empty). ``allgather`` and ``gather`` accept pieces that differ along
  ``axis`` only, so they undo a split.
- Results never alias inputs (except ``allreduce(inplace=True)``, which returns the inputs).

Algorithms of :func:`allreduce` (all produce the same values within the dtype's tolerance):

- ``naive``: reduce every tensor into the first device in list order, then copy the result out (D2L).
- ``ring``: the bandwidth-optimal ring: the flattened tensors are cut into ``n`` chunks; a
  reduce-scatter passes partial sums from device ``i`` to ``i+1`` for ``n-1`` steps, after which
  device ``i`` owns the reduced chunk ``i``; an allgather passes the reduced chunks around the same
  ring for ``n-1`` more steps. Tensors with fewer elements than devices use ``tree``.
- ``tree``: the latency-optimal binary tree: pairwise reductions at strides 1, 2, 4, ... into the
  first device (``ceil(log2 n)`` rounds), then a broadcast down the same tree.
- ``native``: the adapter's framework path (NCCL, psum, kvstore, ...); CapabilityError where the
  backend advertises none.
- ``auto`` (:func:`choose_algorithm`): ``naive`` where the backend reduces shared memory in one pass
  (below); else the algorithm a measured cost model predicts fastest for
  the backend, the device kind, the device count and the bytes per device (``native`` only where
  ``deterministic`` is False); without a model for them, ``native`` when the backend has it, every
  device is an accelerator and ``deterministic`` is False, else ``tree`` for small tensors (at most
  :data:`AUTO_TREE_MAX_BYTES` bytes per device), else ``ring``. Tensors with fewer elements than
  devices always take ``tree``. The model: ``multidev/data/collective_model.json`` (package data, fitted
  from the bench's collectives suite; ``$MULTIDEV_COLLECTIVE_MODEL`` names a file to use instead,
  see :func:`cost_model`).

One pass over shared memory: a backend whose devices share one memory (NumPy's virtual devices) may
have ``shared_memory_allreduce(xs, op, orders, divide_by, inplace)``; where it has, ``naive``, ``ring``
and ``tree`` hand it their reduction order (:func:`_orders`) instead of running their steps: each
input is read once and each result written once (in place: into the inputs, allocating nothing), the
values bit for bit those of the steps. It may decline (None): the steps then run.

Determinism: ``naive``, ``ring`` and ``tree`` are deterministic by construction: every element is
reduced in a fixed order set by the algorithm and the list order (naive: ``x0, x1, ..., x(n-1)``;
ring: chunk ``c`` in ring order starting after device ``c``; tree: fixed pairs), and each step is an
elementwise binary operation, which frameworks compute the same way every run. Every device receives
a bitwise copy of one result. ``deterministic=True`` makes that a promise: ``native`` (whose order the
framework decides) is refused with CapabilityError, and ``auto`` only chooses among the portable
algorithms, by a rule that depends on shape, dtype and device count alone.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ._device import Device, DeviceLike
from .buckets import DEFAULT_BUCKET_MB, flatten, plan_buckets, unflatten
from .dtypes import ITEMSIZE
from .errors import CapabilityError, CollectiveInputError, MultidevError, UnsupportedTensorError, translate_errors
from .placement import check_distinct, device_list, resolve
from .protocol import Backend, SupportsNativeCollectives
from .registry import backend_of, require
from .structured import Leaves, rebuild, structure_leaves
from .trees import owner_or_structure
from .validate import OPS, check_axis, check_op, check_writable

__all__ = [
    "ALGORITHMS",
    "AUTO_TREE_MAX_BYTES",
    "OPS",
    "all_to_all",
    "allgather",
    "allreduce",
    "broadcast",
    "choose_algorithm",
    "cost_model",
    "gather",
    "measured_algorithms",
    "reduce",
    "reduce_scatter",
    "scatter",
    "sendrecv",
    "split_batch",
    "split_sizes",
]

#: Algorithm names accepted by allreduce.
ALGORITHMS = ("auto", "naive", "ring", "tree", "native")
#: ``auto`` uses ``tree`` up to this many bytes per device and ``ring`` above.
AUTO_TREE_MAX_BYTES = 64 * 1024




# -- validation ----------------------------------------------------------------------------------
def _tensor_list(tensors: Sequence[Any], what: str) -> tuple[Backend, list[Any], list[Device]]:
    """A non-empty list of tensors of one backend and one dtype, on distinct devices (returned)."""
    if isinstance(tensors, (str, bytes)) or not isinstance(tensors, Sequence):
        raise CollectiveInputError(f"{what} takes a list of tensors, one per device; got {type(tensors).__name__}")
    xs = list(tensors)
    if not xs:
        raise CollectiveInputError(f"{what} needs at least one tensor; got an empty list")
    backs = []
    for i, x in enumerate(xs):
        if x is None:
            raise CollectiveInputError(f"{what}: item {i} is None, not a tensor. {NONE_GRADIENT_HINT}")
        try:
            backs.append(backend_of(x))
        except UnsupportedTensorError as e:
            raise CollectiveInputError(f"{what}: item {i} is not a tensor ({e})") from None
    names = sorted({b.name for b in backs})
    if len(names) > 1:
        raise CollectiveInputError(
            f"{what} got tensors of several backends ({', '.join(names)}); convert them to one backend first"
        )
    b = backs[0]
    dtypes = [b.dtype_of(x) for x in xs]
    if len(set(dtypes)) > 1:
        raise CollectiveInputError(f"{what} needs one dtype; got {dtypes} on {b.name}")
    devs = [b.device_of(x) for x in xs]
    check_distinct(devs, b.name, what, tensors=True)
    return b, xs, devs


#: What a None among a collective's tensors usually means (gradients that were never computed).
NONE_GRADIENT_HINT = (
    "If these are gradients (p.grad), check that every parameter is a leaf that requires grad or has "
    "a gradient buffer (multidev.replicate and multidev.broadcast give such replicas; a plain copy or "
    "x.to(device) of a parameter does not), that backward() ran on every device's loss before the "
    "allreduce, and that the loss uses every parameter.")


def _validate(tensors: Sequence[Any], what: str) -> tuple[Backend, list[Any], list[Device]]:
    """:func:`_tensor_list` plus one shape for every tensor."""
    b, xs, devs = _tensor_list(tensors, what)
    shapes = [b.shape_of(x) for x in xs]
    if len(set(shapes)) > 1:
        raise CollectiveInputError(f"{what} needs one shape; got {shapes} on {b.name}")
    return b, xs, devs


def split_sizes(length: int, n: int) -> list[int]:
    """Piece sizes of ``numpy.array_split(range(length), n)``: the first ``length % n`` pieces get
    one element more."""
    q, r = divmod(int(length), int(n))
    return [q + 1] * r + [q] * (n - r)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# -- building blocks -----------------------------------------------------------------------------
def _on(b: Backend, x: Any, dev: Device) -> Any:
    """``x`` on ``dev`` (itself when already there)."""
    return x if b.device_of(x) == dev else b.move(x, dev)


def _fresh(b: Backend, y: Any, inputs: Sequence[Any], dev: Device) -> Any:
    """``y`` itself unless it is one of the inputs (a framework may return an operand), else a copy."""
    return b.copy(y, dev) if any(y is x for x in inputs) else y


def _finish(b: Backend, acc: Any, op: str, n: int) -> Any:
    return b.divide(acc, n) if op == "mean" else acc


def _base(op: str) -> str:
    return "sum" if op == "mean" else op


def _fold(b: Backend, xs: Sequence[Any], dev: Device, op: str) -> Any:
    """Reduce ``xs`` onto ``dev`` in list order (``((x0 op x1) op x2) ...``); mean divided once."""
    acc = _on(b, xs[0], dev)
    for x in xs[1:]:
        acc = b.combine(_base(op), acc, _on(b, x, dev))
    if len(xs) == 1:
        acc = _fresh(b, acc, xs, dev)
    return _finish(b, acc, op, len(xs))


def _ring_reduce_scatter(b: Backend, chunks: list[list[Any]], devs: list[Device], op: str) -> list[Any]:
    """``chunks[i][c]``: chunk ``c`` of device ``i``. After ``n-1`` steps in which device ``i`` sends a
    partial result to device ``i+1``, device ``c`` holds chunk ``c`` reduced over every device, in
    ring order starting at device ``c+1``. Returns those reduced chunks (mean divided once)."""
    n = len(devs)
    cur = [list(row) for row in chunks]
    for s in range(n - 1):
        for i in range(n):
            c = (i - 1 - s) % n
            dst = (i + 1) % n
            cur[dst][c] = b.combine(_base(op), b.move(cur[i][c], devs[dst]), cur[dst][c])
    return [_finish(b, cur[c][c], op, n) for c in range(n)]


def _ring_allgather(b: Backend, owned: list[Any], devs: list[Device]) -> list[list[Any]]:
    """Device ``i`` starts with ``owned[i]`` (chunk ``i``); after ``n-1`` steps sending i -> i+1, every
    device holds every chunk. Returns ``have[i][c]``."""
    n = len(devs)
    have: list[list[Any]] = [[None] * n for _ in range(n)]
    for i in range(n):
        have[i][i] = owned[i]
    for s in range(n - 1):
        for i in range(n):
            c = (i - s) % n
            dst = (i + 1) % n
            have[dst][c] = b.move(have[i][c], devs[dst])
    return have


def _naive_allreduce(b: Backend, xs: list[Any], devs: list[Device], op: str) -> list[Any]:
    """D2L's allreduce: reduce everything into the first device, then copy the result back out."""
    total = _fold(b, xs, devs[0], op)
    return [total] + [b.move(total, d) for d in devs[1:]]


def _tree_allreduce(b: Backend, xs: list[Any], devs: list[Device], op: str) -> list[Any]:
    """Binary tree: pairwise reduction at strides 1, 2, 4... into device 0, then broadcast back down."""
    n = len(xs)
    acc = list(xs)
    stride = 1
    while stride < n:
        for i in range(0, n, 2 * stride):
            j = i + stride
            if j < n:
                acc[i] = b.combine(_base(op), acc[i], b.move(acc[j], devs[i]))
        stride *= 2
    out: list[Any] = [None] * n
    out[0] = _finish(b, acc[0], op, n)
    while stride > 1:
        stride //= 2
        for i in range(0, n, 2 * stride):
            j = i + stride
            if j < n:
                out[j] = b.move(out[i], devs[j])
    return out


def _orders(alg: str, n: int, numel: int) -> list[tuple[int, int, Any]]:
    """``alg``'s reduction order over ``n`` tensors of ``numel`` elements, as ``(lo, hi, expr)`` for
    consecutive ranges of the flattened elements: ``expr`` is an input's index or a pair
    ``(left, right)``, computed as ``combine(op, left, right)``, exactly the operations (and operand
    order) :func:`_naive_allreduce`, :func:`_tree_allreduce` and :func:`_ring_allreduce` perform."""
    if alg == "ring" and numel >= n:
        out, lo = [], 0
        for c, size in enumerate(split_sizes(numel, n)):
            e: Any = (c + 1) % n  # chunk c: ring order starting after device c, partial sum first
            for k in range(2, n + 1):
                e = (e, (c + k) % n)
            out.append((lo, lo + size, e))
            lo += size
        return out
    if alg == "naive":
        e = 0
        for i in range(1, n):
            e = (e, i)
        return [(0, numel, e)]
    acc: list[Any] = list(range(n))  # tree (ring below n elements): pairs at strides 1, 2, 4, ...
    stride = 1
    while stride < n:
        for i in range(0, n - stride, 2 * stride):
            acc[i] = (acc[i], acc[i + stride])
        stride *= 2
    return [(0, numel, acc[0])]


def _shared_memory_allreduce(b: Backend, xs: list[Any], alg: str, op: str, inplace: bool) -> list[Any] | None:
    """The allreduce in one pass over memory where the backend's devices share it and it says how
    (its ``shared_memory_allreduce``, NumPy's virtual devices): each input read once, each result
    written once, in ``alg``'s reduction order (identical values); None where it has none or
    declines (the portable algorithms then run)."""
    fused = getattr(b, "shared_memory_allreduce", None)
    if fused is None or alg not in ("naive", "ring", "tree"):
        return None
    orders = _orders(alg, len(xs), _numel(b.shape_of(xs[0])))
    out = fused(xs, _base(op), orders, len(xs) if op == "mean" else None, inplace)
    return None if out is None else list(out)


def _ring_allreduce(b: Backend, xs: list[Any], devs: list[Device], op: str) -> list[Any]:
    """Reduce-scatter then allgather over ``n`` chunks of the flattened tensors (see module doc)."""
    n = len(xs)
    shape = b.shape_of(xs[0])
    numel = _numel(shape)
    if numel < n:
        return _tree_allreduce(b, xs, devs, op)
    sizes = split_sizes(numel, n)
    chunks = [b.split(b.reshape(x, (numel,)), sizes, 0) for x in xs]
    owned = _ring_reduce_scatter(b, chunks, devs, op)
    have = _ring_allgather(b, owned, devs)
    return [b.reshape(b.concat(have[i], 0), shape) for i in range(n)]


MODEL_RESOURCE = "data/collective_model.json"  # the shipped model, relative to the package
_MODEL: list[dict[str, Any]] = []  # the cost model, read on first use (cost_model)
_FITS: dict[tuple[str, str, int], dict[str, list[tuple[float, float, float]]] | None] = {}


def cost_model() -> dict[str, Any]:
    """The measured cost model ``auto`` chooses from: ``{"models": {backend: {device kind: {device
    count: {algorithm: [alpha_s, beta_s_per_byte, ...]}}}}, ...}``, the time of one allreduce being
    ``alpha + beta * bytes per device`` (each algorithm a list of such lines, one per size band:
    ``[up_to_bytes or None, alpha, beta, ...]``). Read once: the file ``$MULTIDEV_COLLECTIVE_MODEL`` names
    where it is set (a refit for your machine: ``python -m multidev.benchmarks.scaling fit
    RESULTS.json --out model.json``), else the package's ``data/collective_model.json`` (the one
    shipped, fitted on the machine its ``source`` names; read with :mod:`importlib.resources`)."""
    if not _MODEL:
        import json
        import os

        path = os.environ.get("MULTIDEV_COLLECTIVE_MODEL")
        if path:
            with open(path) as f:
                doc = json.load(f)
        else:
            doc = json.loads(shipped_model_text())
        _MODEL.append(doc if isinstance(doc, dict) else {})
    return _MODEL[0]


def shipped_model_text() -> str:
    """The text of the cost model that ships with multidev (package data, no code)."""
    from importlib import resources

    return resources.files(__package__).joinpath(MODEL_RESOURCE).read_text(encoding="utf-8")


def _fit_for(backend: str, kind: str, n: int) -> dict[str, list[tuple[float, float, float]]] | None:
    """The model's lines per algorithm for ``backend`` on ``n`` devices of ``kind`` (the measured
    device count nearest ``n``, by ratio), each ``(up to bytes, alpha, beta)``; None without one."""
    key = (backend, kind, n)
    if key in _FITS:
        return _FITS[key]
    per = ((cost_model().get("models") or {}).get(backend) or {}).get(kind) or {}
    fit = None
    if per:
        near = min(per, key=lambda c: abs(math.log(int(c) / n)))
        fit = {alg: [(math.inf if g[0] is None else float(g[0]), float(g[1]), float(g[2])) for g in segs]
               for alg, segs in per[near].items()}
    if len(_FITS) < 1024:
        _FITS[key] = fit
    return fit


def measured_algorithms(backend: str, devices: Sequence[Device]) -> tuple[str, ...]:
    """The algorithms the cost model (:func:`cost_model`) has lines for, for ``backend`` on
    ``devices`` (all of one kind; the measured count nearest theirs): those ``auto`` chooses among
    there (``native`` only where the backend has it). Empty where nothing was measured: ``auto``
    then follows its fixed rule (see :func:`choose_algorithm`)."""
    kinds = {d.kind for d in devices}
    fit = _fit_for(backend, kinds.pop(), len(devices)) if len(kinds) == 1 and len(devices) > 1 else None
    return tuple(a for a in ALGORITHMS[1:] if fit and a in fit)


def choose_algorithm(b: Backend, shape: tuple[int, ...], dtype: str, devices: Sequence[Device],
                     deterministic: bool = False) -> str:
    """The algorithm ``auto`` runs: the one the measured cost model (:func:`cost_model`) predicts
    fastest for this backend, device kind, device count and bytes per device, among ``naive``,
    ``ring``, ``tree`` and (unless ``deterministic``, where the backend has it) ``native``. Without a
    model for them: ``native`` when the backend has one, every device is an accelerator and
    ``deterministic`` is False; ``tree`` for at most :data:`AUTO_TREE_MAX_BYTES` bytes per device;
    ``ring`` otherwise. Fewer elements than devices: ``tree``. Before the model: ``naive`` where
    the backend reduces shared memory in one pass, and for devices of more than one kind."""
    n = len(devices)
    numel = _numel(shape)
    if numel < n:
        return "tree"
    if n > 1 and getattr(b, "shared_memory_allreduce", None) is not None:
        return "naive"  # one pass over shared memory: naive's order has the fewest steps
    if len({d.kind for d in devices}) > 1:
        # devices of two kinds (a GPU beside the host): every step crosses the bus one tensor at a
        # time, so the fewest steps win; naive was within 1.05x of the best at every size measured
        # on an H200 beside its host (ring and native up to 11x and 23x slower)
        return "naive"
    native = not deterministic and n > 1 and b.collectives is not None
    kinds = {d.kind for d in devices}
    fit = _fit_for(b.name, kinds.pop(), n) if len(kinds) == 1 and n > 1 else None
    if fit:
        nbytes = numel * ITEMSIZE.get(dtype, 8)
        best = None
        for alg in ALGORITHMS[1:]:
            if alg in fit and (alg != "native" or native):
                segs = fit[alg]
                _upto, alpha, beta = next((g for g in segs if nbytes <= g[0]), segs[-1])
                t = alpha + beta * nbytes
                if best is None or t < best[0]:
                    best = (t, alg)
        if best is not None:
            return best[1]
    if native and all(d.is_gpu for d in devices):
        return "native"
    if numel * ITEMSIZE.get(dtype, 8) <= AUTO_TREE_MAX_BYTES:
        return "tree"
    return "ring"


# -- public operations ---------------------------------------------------------------------------
@translate_errors()
def allreduce(tensors: Sequence[Any], op: str = "sum", *, inplace: bool = False,
              algorithm: str = "auto", deterministic: bool = False) -> list[Any]:
    """Reduce ``tensors`` (one per device) elementwise and give every device the result.

    - ``op``: sum, mean, max, min or prod (see the module doc for mean and bool rules).
    - ``inplace=False`` returns new tensors, result ``i`` on input ``i``'s device; ``inplace=True``
      writes into the inputs and returns them (mutable backends only; CapabilityError elsewhere).
    - ``algorithm``: ``auto``, ``naive``, ``ring``, ``tree`` or ``native`` (see the module doc).
    - ``deterministic=True``: a fixed reduction order with bitwise-identical results run to run;
      ``native`` is then refused with CapabilityError.
    Synchronous in API, asynchronous in execution where the framework is: call ``synchronize``
    before timing. Inputs are left bit-identical by any failure.

    Structures: ``tensors`` may be a list of structures, one per device, as :func:`multidev.to`
    takes them (lists, tuples, dicts, a ``state_dict``, a framework's tree), each holding the same
    tensors (count, dtypes, shapes, in order) on its own device. Their leaves are flattened into
    buckets (one dtype, up to 25 MiB), one allreduce per bucket (``algorithm`` chosen per bucket),
    and the result is a list of the structures rebuilt (same container types), or the input
    structures written in place. Leaves follow :func:`multidev.to`'s rule: ``None`` stays ``None``,
    a framework tree's static parts are kept, any other non-tensor or a model is refused
    (UnsupportedTensorError naming its path); structures that differ or hold several backends give
    CollectiveInputError; all before anything is computed. Structures without tensors: rebuilt
    copies (nothing to reduce).
    """
    if _structures(tensors):
        return _allreduce_structures(list(tensors), op, inplace, algorithm, deterministic)
    b, xs, devs = _validate(tensors, "allreduce")
    dtype = b.dtype_of(xs[0])
    _check_allreduce(b, dtype, op, inplace, algorithm, deterministic)
    if inplace:
        # Probe writability (read-only arrays, inference tensors) by rewriting each input with a copy
        # of itself: bitwise a no-op. The first input needs none: nothing is written before it.
        # (A self-assign is no probe: NumPy skips copyto(a, a) even for a read-only a.)
        for i, x in enumerate(xs[1:], 1):
            check_writable(b, x, f"allreduce(inplace=True): input {i}")
    out = _allreduce_checked(b, xs, devs, dtype, op, algorithm, deterministic, inplace)
    if inplace:
        if out is xs:  # written in place by the backend's one pass
            return xs
        for i, (dst, src) in enumerate(zip(xs, out)):
            check_writable(b, dst, f"allreduce(inplace=True): input {i}", src)
        return xs
    return out


def _check_allreduce(b: Backend, dtype: str, op: str, inplace: bool, algorithm: str, deterministic: bool) -> None:
    check_op(op, dtype, "allreduce")
    if not isinstance(algorithm, str) or algorithm not in ALGORITHMS:
        raise CollectiveInputError(f"allreduce: unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    if inplace and not b.capabilities.mutable:
        raise CapabilityError(f"{b.name} tensors are immutable: allreduce(inplace=True) cannot write "
                              "into them; use inplace=False and rebind the results")
    if algorithm == "native":
        if deterministic:
            raise CapabilityError(f"allreduce: {b.name}'s native allreduce does not promise a fixed "
                                  "reduction order; use deterministic=False, or algorithm='ring'/'tree'")
        if b.collectives is None:
            raise CapabilityError(f"{b.name} has no native allreduce (no collectives concern here); "
                                  "use algorithm='auto', 'ring', 'tree' or 'naive'")


def _allreduce_checked(b: Backend, xs: list[Any], devs: list[Device], dtype: str, op: str, algorithm: str,
                       deterministic: bool, inplace: bool = False) -> list[Any]:
    """The allreduce of checked inputs: new tensors, result ``i`` on ``devs[i]``; or, with
    ``inplace`` where the backend's one pass wrote the results into the inputs, ``xs`` itself."""
    n = len(xs)
    alg = algorithm
    if alg == "auto":
        alg = choose_algorithm(b, b.shape_of(xs[0]), dtype, devs, deterministic)
    fused = _shared_memory_allreduce(b, xs, alg, op, inplace) if n > 1 else None
    if fused is not None:
        return xs if inplace else fused
    if n == 1:
        out = [_fold(b, xs, devs[0], op)]
    elif alg == "native":
        try:
            out = list(require(b, SupportsNativeCollectives, "allreduce").native_allreduce(xs, _base(op)))
        except CapabilityError:
            if algorithm != "auto":
                raise
            # auto chose native by capability flags; this dtype/op has no native path here (out of
            # place, nothing was written): take the portable algorithm auto would pick otherwise.
            alg = choose_algorithm(b, b.shape_of(xs[0]), dtype, devs, deterministic=True)
            out = (_ring_allreduce if alg == "ring" else _tree_allreduce)(b, xs, devs, op)
        else:
            if op == "mean":
                out = [b.divide(y, n) for y in out]
    elif alg == "ring":
        out = _ring_allreduce(b, xs, devs, op)
    elif alg == "tree":
        out = _tree_allreduce(b, xs, devs, op)
    else:
        out = _naive_allreduce(b, xs, devs, op)
    return out


def _structures(tensors: Any) -> bool:
    """Whether ``tensors`` is a list of structures (one per device) rather than of tensors."""
    if isinstance(tensors, (str, bytes)) or not isinstance(tensors, Sequence) or not tensors:
        return False
    try:
        return owner_or_structure(tensors[0]) is None
    except MultidevError:
        return False


def _allreduce_structures(structs: list[Any], op: str, inplace: bool, algorithm: str,
                          deterministic: bool) -> list[Any]:
    """:func:`allreduce` of one structure per device (:func:`_per_device`'s checks), then one
    allreduce per bucket of the leaves flattened (one dtype, up to DEFAULT_BUCKET_MB), cut back."""
    what = "allreduce"
    b, lvs, devs, _ = _per_device(structs, what)
    if b is None:  # no tensors anywhere: nothing to reduce
        return structs if inplace else [rebuild(s, lv, [], what) for s, lv in zip(structs, lvs)]
    first = lvs[0]
    for dtype in dict.fromkeys(first.dtypes):
        _check_allreduce(b, dtype, op, inplace, algorithm, deterministic)
    if inplace:
        for i, lv in enumerate(lvs):
            for j, x in enumerate(lv.tensors):
                if i or j:  # the first needs no probe: nothing is written before it
                    check_writable(b, x, f"allreduce(inplace=True): tensor {j} of structure {i}")
    out: list[list[Any]] = [[None] * len(first.tensors) for _ in lvs]
    for idx in _plan(b, first):
        flats = [_bucket(b, lv.tensors, idx) for lv in lvs]
        reduced = _allreduce_checked(b, flats, devs, first.dtypes[idx[0]], op, algorithm, deterministic)
        for i, r in enumerate(reduced):
            for j, piece in zip(idx, unflatten(b, r, [first.shapes[j] for j in idx])):
                out[i][j] = piece
    if inplace:
        for i, lv in enumerate(lvs):
            for j, (dst, src) in enumerate(zip(lv.tensors, out[i])):
                check_writable(b, dst, f"allreduce(inplace=True): tensor {j} of structure {i}", src)
        return structs
    return [rebuild(s, lv, res, what) for s, lv, res in zip(structs, lvs, out)]


# -- structures: the other collectives -------------------------------------------------------------
# Every collective over structures is the tensor collective applied leaf by leaf (leaf j of every
# structure together), computed per bucket: the leaves of one dtype and device flattened into one
# tensor (up to DEFAULT_BUCKET_MB), so a bucket moves between devices once, not once per leaf.

def _per_device(structs: list[Any], what: str,
                axis: Any = None) -> tuple[Backend | None, list[Leaves], list[Device], list[int]]:
    """The leaves of one structure per device, checked before anything is computed: every structure
    holds the same number of tensors, of one backend, all on one device (the devices distinct),
    tensor ``j`` of every structure with one dtype and one shape (with ``axis``: shapes that differ
    along it only, ``axis`` normalised per leaf and returned). ``(None, leaves, [], [])`` where no
    structure holds a tensor."""
    lvs = [structure_leaves(s, f"{what}: structure {i}") for i, s in enumerate(structs)]
    first = lvs[0]
    for i, lv in enumerate(lvs):
        if len(lv.tensors) != len(first.tensors):
            raise CollectiveInputError(f"{what}: structure {i} holds {len(lv.tensors)} tensors and structure 0 "
                                       f"{len(first.tensors)}; every device's structure must hold the same tensors")
    if first.backend is None:
        return None, lvs, [], []
    names = sorted({lv.backend.name for lv in lvs if lv.backend is not None})
    if len(names) > 1:
        raise CollectiveInputError(f"{what} got structures of several backends ({', '.join(names)}); "
                                   "convert them to one backend first")
    b = first.backend
    axes = [] if axis is None else [check_axis(axis, len(s), f"{what}: tensor {j}") for j, s in enumerate(first.shapes)]
    devs: list[Device] = []
    for i, lv in enumerate(lvs):
        on = set(lv.devices)
        if len(on) > 1:
            raise CollectiveInputError(f"{what}: structure {i} holds tensors on several devices "
                                       f"({', '.join(sorted(map(str, on)))}); pass one structure per device")
        devs.append(lv.devices[0])
        for j, (shape, dtype) in enumerate(zip(lv.shapes, lv.dtypes)):
            want = first.shapes[j]
            if axis is not None and len(shape) == len(want):
                a = axes[j]
                shape, want = shape[:a] + shape[a + 1:], want[:a] + want[a + 1:]
            if shape != want or dtype != first.dtypes[j]:
                along = "" if axis is None else f" (they may differ along axis {axes[j]} only)"
                raise CollectiveInputError(f"{what}: tensor {j} of structure {i} is {dtype} {lv.shapes[j]} and of "
                                           f"structure 0 {first.dtypes[j]} {first.shapes[j]}; the structures must "
                                           f"match{along}")
    check_distinct(devs, b.name, what, tensors=True)
    return b, lvs, devs, axes


def _plan(b: Backend, lv: Leaves) -> list[list[int]]:
    return plan_buckets(b, lv.tensors, DEFAULT_BUCKET_MB * 2**20)


def _bucket(b: Backend, tensors: Sequence[Any], idx: list[int]) -> Any:
    """Bucket ``idx`` of ``tensors`` as one tensor: a lone tensor as it is, several flattened into a new one."""
    return tensors[idx[0]] if len(idx) == 1 else flatten(b, [tensors[j] for j in idx])


def _cut(b: Backend, x: Any, sizes: list[int], axis: int) -> list[Any]:
    return list(b.split(x, sizes, axis))


def _with(shape: tuple[int, ...], axis: int, n: int) -> tuple[int, ...]:
    return shape[:axis] + (n,) + shape[axis + 1:]


def _reduce_structures(structs: list[Any], device: DeviceLike, op: str) -> Any:
    what = "reduce"
    b, lvs, _devs, _ = _per_device(structs, what)
    if b is None:
        return rebuild(structs[0], lvs[0], [], what)
    first = lvs[0]
    for dtype in dict.fromkeys(first.dtypes):
        check_op(op, dtype, what)
    dev = resolve(b, device)
    out: list[Any] = [None] * len(first.tensors)
    for idx in _plan(b, first):
        total = _fold(b, [_bucket(b, lv.tensors, idx) for lv in lvs], dev, op)
        for j, piece in zip(idx, unflatten(b, total, [first.shapes[j] for j in idx])):
            out[j] = piece
    return rebuild(structs[0], first, out, what)


def _broadcast_structure(x: Any, devices: Sequence[DeviceLike]) -> list[Any]:
    what = "broadcast"
    lv = structure_leaves(x, what)
    if lv.backend is None:
        if isinstance(devices, (str, bytes, Device)) or not hasattr(devices, "__len__") or not len(devices):
            raise CollectiveInputError(f"{what} takes a non-empty list of devices; got {devices!r:.80}")
        return [rebuild(x, lv, [], what) for _ in devices]
    b = lv.backend
    devs = device_list(b, devices, what)
    out: list[list[Any]] = [[None] * len(lv.tensors) for _ in devs]
    for idx in _plan(b, lv):
        flat = _bucket(b, lv.tensors, idx)
        src = lv.devices[idx[0]]
        for k, d in enumerate(devs):
            y = (flat if len(idx) > 1 else b.copy(flat, d)) if d == src else b.move(flat, d)
            for j, piece in zip(idx, unflatten(b, y, [lv.shapes[j] for j in idx])):
                out[k][j] = piece
    training = b.training
    if training is not None:  # parameters give parameters, leaf by leaf
        out = [[training.parameter_like(x, y) for x, y in zip(lv.tensors, row)] for row in out]
    return [rebuild(x, lv, row, what) for row in out]


def _joined_structures(structs: list[Any], dests: list[Device] | None, device: DeviceLike | None, axis: Any,
                       what: str) -> list[Any]:
    """allgather (``dests`` None: every structure's device) or gather (onto ``device``) of one
    structure per device: leaf ``j`` of the results is leaf ``j`` of every structure joined along
    ``axis``, in list order; each structure's bucket moves to a destination as one tensor."""
    b, lvs, devs, axes = _per_device(structs, what, axis)
    if b is None:
        n = len(structs) if device is None else 1
        return [rebuild(structs[0], lvs[0], [], what) for _ in range(n)]
    targets = devs if device is None else [resolve(b, device)]
    first = lvs[0]
    out: list[list[Any]] = [[None] * len(first.tensors) for _ in targets]
    for idx in _plan(b, first):
        flats = [_bucket(b, lv.tensors, idx) for lv in lvs]
        for k, d in enumerate(targets):
            parts = [unflatten(b, _on(b, f, d), [lv.shapes[j] for j in idx]) for f, lv in zip(flats, lvs)]
            for p, j in enumerate(idx):
                mine = [part[p] for part in parts]
                out[k][j] = _fresh(b, b.concat(mine, axes[j]), [*mine, *(lv.tensors[j] for lv in lvs)], d)
    return [rebuild(structs[0], first, row, what) for row in out]


def _same_shapes(lvs: list[Any], what: str, why: str = "") -> Any:
    """The first device's leaves, once every device's structure holds tensors of the same shapes
    (CollectiveInputError otherwise, ``why`` appended)."""
    first = lvs[0]
    if any(lv.shapes != first.shapes for lv in lvs):
        raise CollectiveInputError(f"{what}: the structures' tensors must have one shape each "
                                   f"({first.shapes} and another){why}")
    return first


def _reduce_scatter_structures(structs: list[Any], op: str, axis: Any) -> list[Any]:
    what = "reduce_scatter"
    b, lvs, devs, axes = _per_device(structs, what, axis)
    if b is None:
        return [rebuild(s, lv, [], what) for s, lv in zip(structs, lvs)]
    first = _same_shapes(lvs, what, "; pieces are cut from their reduction")
    for dtype in dict.fromkeys(first.dtypes):
        check_op(op, dtype, what)
    n = len(lvs)
    out: list[list[Any]] = [[None] * len(first.tensors) for _ in lvs]
    sizes = [split_sizes(s[a], n) for s, a in zip(first.shapes, axes)]
    for idx in _plan(b, first):
        shapes = [[_with(first.shapes[j], axes[j], sizes[j][c]) for j in idx] for c in range(n)]
        if n == 1:
            chunks = [_fold(b, [_bucket(b, lvs[0].tensors, idx)], devs[0], op)]
        else:
            cuts = [[_cut(b, lv.tensors[j], sizes[j], axes[j]) for j in idx] for lv in lvs]
            chunks = _ring_reduce_scatter(
                b, [[flatten(b, [cut[p][c] for p in range(len(idx))]) for c in range(n)] for cut in cuts], devs, op)
        for c, chunk in enumerate(chunks):
            for j, piece in zip(idx, unflatten(b, chunk, shapes[c])):
                out[c][j] = piece
    return [rebuild(s, lv, row, what) for s, lv, row in zip(structs, lvs, out)]


def _scatter_structure(x: Any, devices: Sequence[DeviceLike], axis: Any) -> list[Any]:
    what = "scatter"
    lv = structure_leaves(x, what)
    if lv.backend is None:
        if isinstance(devices, (str, bytes, Device)) or not hasattr(devices, "__len__") or not len(devices):
            raise CollectiveInputError(f"{what} takes a non-empty list of devices; got {devices!r:.80}")
        return [rebuild(x, lv, [], what) for _ in devices]
    b = lv.backend
    axes = [check_axis(axis, len(s), f"{what}: tensor {j}") for j, s in enumerate(lv.shapes)]
    devs = device_list(b, devices, what)
    n = len(devs)
    sizes = [split_sizes(s[a], n) for s, a in zip(lv.shapes, axes)]
    out: list[list[Any]] = [[None] * len(lv.tensors) for _ in devs]
    for idx in _plan(b, lv):
        cuts = [_cut(b, lv.tensors[j], sizes[j], axes[j]) for j in idx]
        src = lv.devices[idx[0]]
        for k, d in enumerate(devs):
            flat = _bucket(b, [c[k] for c in cuts], list(range(len(idx))))
            y = (flat if len(idx) > 1 else b.copy(flat, d)) if d == src else b.move(flat, d)
            shapes = [_with(lv.shapes[j], axes[j], sizes[j][k]) for j in idx]
            for j, piece in zip(idx, unflatten(b, y, shapes)):
                out[k][j] = piece
    return [rebuild(x, lv, row, what) for row in out]


def _all_to_all_structures(structs: list[Any], split_axis: Any, concat_axis: Any) -> list[Any]:
    what = "all_to_all"
    b, lvs, devs, sa = _per_device(structs, what, split_axis)
    if b is None:
        return [rebuild(s, lv, [], what) for s, lv in zip(structs, lvs)]
    first = _same_shapes(lvs, what)
    ca = [check_axis(concat_axis, len(s), f"{what}: tensor {j}") for j, s in enumerate(first.shapes)]
    n = len(lvs)
    sizes = [split_sizes(s[a], n) for s, a in zip(first.shapes, sa)]
    out: list[list[Any]] = [[None] * len(first.tensors) for _ in lvs]
    for idx in _plan(b, first):
        cuts = [[_cut(b, lv.tensors[j], sizes[j], sa[j]) for j in idx] for lv in lvs]  # cuts[i][p][piece]
        for t, d in enumerate(devs):
            shapes = [_with(first.shapes[j], sa[j], sizes[j][t]) for j in idx]
            got = [unflatten(b, _on(b, _bucket(b, [c[t] for c in cuts[i]], list(range(len(idx)))), d), shapes)
                   for i in range(n)]
            for p, j in enumerate(idx):
                mine = [g[p] for g in got]
                out[t][j] = _fresh(b, b.concat(mine, ca[j]), [*mine, *(lv.tensors[j] for lv in lvs)], d)
    return [rebuild(s, lv, row, what) for s, lv, row in zip(structs, lvs, out)]


@translate_errors()
def broadcast(x: Any, devices: Sequence[DeviceLike]) -> list[Any]:
    """A new copy of ``x`` on each of ``devices`` (distinct; x's own device may be among them). A
    training parameter gives parameters: leaves that require grad where ``x`` requires grad, with a
    gradient buffer where ``x`` has one, Variables where ``x`` is one (the adapter's ``parameter_like``).

    ``x`` may be a structure (as :func:`multidev.to` takes one): a list of copies of it, one per
    device, each leaf's bucket moved once (the leaves may sit on several devices)."""
    if owner_or_structure(x) is None:
        return _broadcast_structure(x, devices)
    b = backend_of(x)
    devs = device_list(b, devices, "broadcast")
    src = b.device_of(x)
    out = [b.copy(x, d) if d == src else b.move(x, d) for d in devs]
    training = b.training
    if training is None:  # tensors without autograd state: the copies as they are
        return out
    return [training.parameter_like(x, y) for y in out]


@translate_errors()
def reduce(tensors: Sequence[Any], device: DeviceLike, op: str = "sum") -> Any:
    """The elementwise reduction of ``tensors`` (one per device) as one new tensor on ``device``
    (any device of the backend). Reduced in list order, so deterministic.

    Structures: one per device, as :func:`allreduce` takes them; one new structure on ``device``
    (the first's containers), reduced bucket by bucket."""
    if _structures(tensors):
        return _reduce_structures(list(tensors), device, op)
    b, xs, _devs = _validate(tensors, "reduce")
    check_op(op, b.dtype_of(xs[0]), "reduce")
    dev = resolve(b, device)
    return _fold(b, xs, dev, op)


@translate_errors()
def allgather(tensors: Sequence[Any], axis: int = 0) -> list[Any]:
    """Every device gets the concatenation of all tensors along ``axis``, in list order.

    The tensors may differ in size along ``axis`` (uneven pieces), nowhere else.

    Structures: one per device (tensor ``j`` of each with one dtype, shapes that differ along
    ``axis`` only; ``axis`` counted per leaf); a list of new structures, one per device (the first's
    containers), leaf ``j`` the join of every structure's leaf ``j``. Each bucket moves once per device.
    """
    if _structures(tensors):
        return _joined_structures(list(tensors), None, None, axis, "allgather")
    b, xs, devs = _tensor_list(tensors, "allgather")
    axis = _joinable(b, xs, axis, "allgather")
    return [_fresh(b, b.concat([_on(b, x, d) for x in xs], axis), xs, d) for d in devs]


@translate_errors()
def gather(tensors: Sequence[Any], device: DeviceLike, axis: int = 0) -> Any:
    """The concatenation of ``tensors`` (one per device) along ``axis`` as one new tensor on ``device``.
    Structures: as :func:`allgather`'s, one new structure on ``device``."""
    if _structures(tensors):
        return _joined_structures(list(tensors), None, device, axis, "gather")[0]
    b, xs, _devs = _tensor_list(tensors, "gather")
    axis = _joinable(b, xs, axis, "gather")
    dev = resolve(b, device)
    return _fresh(b, b.concat([_on(b, x, dev) for x in xs], axis), xs, dev)


def _joinable(b: Backend, xs: list[Any], axis: int, what: str) -> int:
    shapes = [b.shape_of(x) for x in xs]
    ndims = {len(s) for s in shapes}
    if len(ndims) > 1:
        raise CollectiveInputError(f"{what} needs tensors of one rank; got shapes {shapes} on {b.name}")
    ax = check_axis(axis, ndims.pop(), what)
    rest = {s[:ax] + s[ax + 1:] for s in shapes}
    if len(rest) > 1:
        raise CollectiveInputError(
            f"{what}: shapes may differ along axis {ax} only; got {shapes} on {b.name}"
        )
    return ax


@translate_errors()
def reduce_scatter(tensors: Sequence[Any], op: str = "sum", axis: int = 0) -> list[Any]:
    """Reduce ``tensors`` elementwise and give device ``i`` piece ``i`` of the result, cut along
    ``axis`` as ``numpy.array_split`` cuts (the first pieces one larger). A ring reduce-scatter:
    deterministic, piece ``i`` reduced in ring order starting after device ``i``.

    Structures: one per device, holding the same tensors (dtypes and shapes); device ``i`` gets a
    new structure whose leaf ``j`` is piece ``i`` of leaf ``j``'s reduction, one ring per bucket."""
    if _structures(tensors):
        return _reduce_scatter_structures(list(tensors), op, axis)
    b, xs, devs = _validate(tensors, "reduce_scatter")
    check_op(op, b.dtype_of(xs[0]), "reduce_scatter")
    shape = b.shape_of(xs[0])
    ax = check_axis(axis, len(shape), "reduce_scatter")
    n = len(xs)
    if n == 1:
        return [_fold(b, xs, devs[0], op)]
    sizes = split_sizes(shape[ax], n)
    chunks = [b.split(x, sizes, ax) for x in xs]
    return _ring_reduce_scatter(b, chunks, devs, op)


@translate_errors()
def scatter(x: Any, devices: Sequence[DeviceLike], axis: int = 0) -> list[Any]:
    """``x`` cut along ``axis`` into ``len(devices)`` pieces (``numpy.array_split``'s sizes: the first
    pieces one larger; pieces may be empty), piece ``i`` copied to ``devices[i]``.

    ``x`` may be a structure: a list of new structures, device ``i``'s leaf ``j`` piece ``i`` of
    leaf ``j`` (``axis`` counted per leaf), the pieces of a bucket moved to each device as one tensor."""
    if owner_or_structure(x) is None:
        return _scatter_structure(x, devices, axis)
    b = backend_of(x)
    shape = b.shape_of(x)
    ax = check_axis(axis, len(shape), "scatter")
    devs = device_list(b, devices, "scatter")
    src = b.device_of(x)
    pieces = b.split(x, split_sizes(shape[ax], len(devs)), ax)
    return [b.copy(p, d) if d == src else b.move(p, d) for p, d in zip(pieces, devs)]


@translate_errors()
def split_batch(X: Any, y: Any, devices: Sequence[DeviceLike]) -> tuple[list[Any], list[Any]]:
    """D2L's ``split_batch``: scatter a minibatch ``X`` and its labels ``y`` along their first axis
    over ``devices`` (``numpy.array_split`` sizes). Needs at least one example per device. ``X``
    and ``y`` may be structures (a dict of inputs, say): every leaf cut along its first axis, every
    leaf with the same number of examples."""
    lx, ly = structure_leaves(X, "split_batch: X"), structure_leaves(y, "split_batch: y")
    if lx.backend is None or ly.backend is None:
        raise CollectiveInputError("split_batch: X and y must hold tensors (got a structure without any)")
    bx, by = lx.backend, ly.backend
    if bx.name != by.name:
        raise CollectiveInputError(f"split_batch: X is a {bx.name} tensor and y a {by.name} tensor; "
                                   "use one backend for both")
    if not all(lx.shapes) or not all(ly.shapes):
        raise CollectiveInputError("split_batch needs X and y with a batch axis (got a 0-d tensor)")
    nx, ny = {s[0] for s in lx.shapes}, {s[0] for s in ly.shapes}
    if len(nx) > 1 or len(ny) > 1:
        raise CollectiveInputError(f"split_batch: every tensor needs the same number of examples; got X's "
                                   f"{[s[0] for s in lx.shapes]} and y's {[s[0] for s in ly.shapes]}")
    (n,), (m,) = nx, ny
    if n != m:
        raise CollectiveInputError(f"split_batch: X has {n} examples but y has {m}")
    devs = device_list(bx, devices, "split_batch")
    if n < len(devs):
        raise CollectiveInputError(f"split_batch: a batch of {n} cannot give each of {len(devs)} "
                                   "devices an example; use a larger batch or fewer devices")
    return scatter(X, devs), scatter(y, devs)



@translate_errors()
def sendrecv(tensors: Sequence[Any], shift: int = 1) -> list[Any]:
    """The ring exchange between devices (point-to-point, as ``multidev.distributed.sendrecv`` is
    between processes): device ``i`` sends its tensor to device ``(i + shift) % n`` and gets the one
    device ``(i - shift) % n`` sent. The tensors share one shape and dtype; new tensors, result ``i``
    on input ``i``'s device (a copy, never an input)."""
    b, xs, devs = _validate(tensors, "sendrecv")
    if isinstance(shift, bool) or not isinstance(shift, int):
        raise CollectiveInputError(f"sendrecv: shift must be an int, got {shift!r:.40}")
    n = len(xs)
    return [_fresh(b, _on(b, xs[(i - shift) % n], d), xs, d) for i, d in enumerate(devs)]


def all_to_all(tensors: Sequence[Any], split_axis: int = 0, concat_axis: int = 0) -> list[Any]:
    """Device ``i`` cuts its tensor along ``split_axis`` into ``len(tensors)`` pieces
    (``numpy.array_split``'s sizes) and sends piece ``j`` to device ``j``; device ``j`` gets the
    pieces it receives joined along ``concat_axis``, in list order (MPI's ``Alltoall``,
    ``jax.lax.all_to_all``, torch's ``all_to_all``). The tensors share one shape and dtype. New
    tensors, result ``j`` on input ``j``'s device; deterministic (no arithmetic).

    Structures: one per device, holding the same tensors; leaf by leaf, each bucket's pieces moved
    as one tensor per pair of devices."""
    if _structures(tensors):
        return _all_to_all_structures(list(tensors), split_axis, concat_axis)
    b, xs, devs = _validate(tensors, "all_to_all")
    shape = b.shape_of(xs[0])
    sa = check_axis(split_axis, len(shape), "all_to_all")
    ca = check_axis(concat_axis, len(shape), "all_to_all")
    n = len(xs)
    if n == 1:
        return [b.copy(xs[0], devs[0])]
    pieces = [b.split(x, split_sizes(shape[sa], n), sa) for x in xs]
    return [_fresh(b, b.concat([_on(b, pieces[i][j], d) for i in range(n)], ca), xs, d) for j, d in enumerate(devs)]
