"""Single-process collectives over many devices, written once over the adapter protocol.

Lists in, lists out: result ``i`` lives on input ``i``'s device and keeps the inputs' dtype.
Inputs are validated completely before anything is computed or written, so a failing call,
in place or not, leaves its inputs bit-identical.
"""
from __future__ import annotations

from typing import Any, Sequence

from ._dtypes import is_floating
from .errors import CapabilityError, CollectiveInputError
from .protocol import REDUCE_OPS, Backend
from .registry import backend_of

__all__ = ["allreduce", "OPS", "ALGORITHMS"]

#: Reductions accepted by allreduce/reduce/reduce_scatter.
OPS = REDUCE_OPS + ("mean",)
#: Algorithm names accepted by allreduce.
ALGORITHMS = ("auto", "naive", "native")


def _validate(tensors: Sequence[Any], what: str) -> tuple[Backend, list[Any]]:
    """Check a collective's tensor list: non-empty, one backend, one shape, one dtype, distinct devices."""
    if isinstance(tensors, (str, bytes)) or not isinstance(tensors, Sequence):
        raise CollectiveInputError(f"{what} takes a list of tensors, one per device; got {type(tensors).__name__}")
    xs = list(tensors)
    if not xs:
        raise CollectiveInputError(f"{what} needs at least one tensor; got an empty list")
    backs = [backend_of(x) for x in xs]
    names = sorted({b.name for b in backs})
    if len(names) > 1:
        raise CollectiveInputError(
            f"{what} got tensors of several backends ({', '.join(names)}); convert them to one backend first"
        )
    b = backs[0]
    shapes = [b.shape_of(x) for x in xs]
    if len(set(shapes)) > 1:
        raise CollectiveInputError(f"{what} needs one shape; got {shapes} on {b.name}")
    dtypes = [b.dtype_of(x) for x in xs]
    if len(set(dtypes)) > 1:
        raise CollectiveInputError(f"{what} needs one dtype; got {dtypes} on {b.name}")
    devs = [b.device_of(x) for x in xs]
    if len(set(devs)) != len(devs):
        dup = sorted({str(d) for d in devs if devs.count(d) > 1})
        raise CollectiveInputError(
            f"{what} needs one tensor per device; {', '.join(dup)} appear more than once on {b.name}. "
            "Sum same-device tensors first, or place each on its own device."
        )
    return b, xs


def _check_op(op: str, dtype: str, what: str) -> None:
    if op not in OPS:
        raise CollectiveInputError(f"{what}: unknown op {op!r}; expected one of {', '.join(OPS)}")
    if op == "mean" and not is_floating(dtype):
        raise CollectiveInputError(
            f"{what}: op='mean' on {dtype} tensors is refused (integer division would silently floor); "
            "cast to a floating dtype first, or use op='sum' and divide yourself"
        )


def _reduce_into(b: Backend, xs: list[Any], root: int, op: str) -> Any:
    """Reduce every tensor into device ``xs[root]``'s, in list order (deterministic)."""
    dev = b.device_of(xs[root])
    base = op if op != "mean" else "sum"
    acc = b.copy(xs[0], dev) if b.device_of(xs[0]) != dev else xs[0]
    for x in xs[1:]:
        other = x if b.device_of(x) == dev else b.move(x, dev)
        acc = b.combine(base, acc, other)
    if len(xs) == 1:
        acc = b.copy(acc, dev)  # a fresh buffer: results never alias inputs
    if op == "mean":
        acc = b.divide(acc, len(xs))
    return acc


def _naive_allreduce(b: Backend, xs: list[Any], op: str) -> list[Any]:
    """D2L's allreduce: reduce everything into the first device, then copy the result back out."""
    total = _reduce_into(b, xs, 0, op)
    return [total] + [b.copy(total, b.device_of(x)) for x in xs[1:]]


def allreduce(tensors: Sequence[Any], op: str = "sum", *, inplace: bool = False,
              algorithm: str = "auto") -> list[Any]:
    """Reduce ``tensors`` (one per device) elementwise and give every device the result.

    - ``op``: sum, mean, max, min or prod. ``mean`` of integer tensors raises CollectiveInputError.
    - ``inplace=False`` returns new tensors; ``inplace=True`` writes into the inputs and returns
      them (mutable backends only; CapabilityError elsewhere).
    - ``algorithm``: ``naive`` (D2L), ``native`` (the framework's own, CapabilityError where there is
      none) or ``auto``.
    Synchronous in API, asynchronous in execution where the framework is: call ``synchronize``
    before timing.
    """
    b, xs = _validate(tensors, "allreduce")
    _check_op(op, b.dtype_of(xs[0]), "allreduce")
    if algorithm not in ALGORITHMS:
        raise CollectiveInputError(f"allreduce: unknown algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    if inplace and not b.capabilities.mutable:
        raise CapabilityError(f"{b.name} tensors are immutable: allreduce(inplace=True) cannot write "
                              "into them; use inplace=False and rebind the results")
    if algorithm == "native":
        if "allreduce" not in b.capabilities.native_collectives:
            raise CapabilityError(f"{b.name} has no native allreduce; use algorithm='naive' or 'auto'")
        out = b.native_allreduce(xs, op)
    else:
        out = _naive_allreduce(b, xs, op)
    if inplace:
        for dst, src in zip(xs, out):
            b.assign(dst, src)
        return xs
    return out
