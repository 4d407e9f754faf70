"""Conversion between any backend's tensor and the engine's transport tensor, and back.

The engine says how a tensor of a given device travels (:meth:`Engine.transport_for`: a backend
and a device). A tensor of that backend on that device is used as it is; a tensor of another
backend becomes one through :func:`multidev.convert` (zero-copy through DLPack where both sides
allow it, else a copy); a tensor on another kind of device moves first (a GPU tensor staged
through host memory, by its own framework's device-to-host path, for an engine that moves host
buffers only). The result comes back the same way: a tensor of the input's backend, on the
input's device, of the input's array type, with its dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._device import Device
from ..errors import CapabilityError
from ..exchange import convert
from ..protocol import Backend
from ..registry import backend_of, get_backend
from .group import Group, current

__all__ = ["Origin", "Placement", "from_transport", "to_transport", "transport_backend", "transport_path"]

_HOST = Device("cpu", 0)


@dataclass
class Origin:
    backend: Backend
    device: Device
    dtype: str
    is_transport: bool
    like: Any = None  # the input tensor: results take its array type (mx.np in, mx.np out)


def transport_backend(g: Group, device: Device, b: Backend | None = None) -> tuple[Backend, Device]:
    """The transport backend and device a tensor of backend ``b`` on ``device`` travels as in group
    ``g`` (an engine with ``native_tensors``, the 1-process group's, keeps tensors as they are)."""
    if b is not None and getattr(g.engine, "native_tensors", False):
        return b, device
    name, dev = g.engine.transport_for(device)
    return get_backend(name), dev


#: Where a tensor travels: ``(its backend, its device, the transport backend, the transport device)``.
Placement = tuple[Backend, Device, Backend, Device]


def to_transport(x: Any, g: Group, placed: Placement | None = None) -> tuple[Any, Origin, bool, str]:
    """``(t, origin, shared, path)``: x's values as a transport tensor the engine's primitives take;
    ``shared`` when it aliases x's memory; ``path`` is ``"native"`` (x is a transport tensor on
    the transport's device), ``"dlpack"`` (shared through DLPack), ``"staged"`` (through host
    memory) or ``"copy"``. ``placed``: x's placement, where this call's checks found it already."""
    if placed is None:
        b = backend_of(x)
        dev = b.device_of(x)
        tb, tdev = transport_backend(g, dev, b)
    else:
        b, dev, tb, tdev = placed
    origin = Origin(b, dev, b.dtype_of(x), b is tb, x)
    if origin.is_transport and dev == tdev:
        t, shared, path = x, True, "native"
    elif origin.is_transport and dev.kind != "cpu":
        t, shared, path = tb.move(x, tdev), False, "staged" if tdev.kind != dev.kind else "copy"
    elif dev.kind == tdev.kind:
        at = tdev if tdev.kind == "cpu" else None  # host memory of any (virtual) CPU device: relabelled
        try:
            t, shared, path = convert(x, tb.name, copy=False, device=at), True, "dlpack"
        except CapabilityError:
            t, shared, path = convert(x, tb.name, copy=True, device=at), False, "copy"
        if tb.device_of(t) != tdev:
            t, shared, path = tb.move(t, tdev), False, "copy"
    elif tdev.kind == "cpu":  # an engine that moves host buffers: through the framework's own D2H path
        t = convert(b.move(x, _HOST), tb.name, device=tdev)
        shared, path = False, "staged"
    else:  # a host tensor in a group that moves device buffers only
        t = tb.move(convert(x, tb.name, device=_HOST), tdev)
        shared, path = False, "copy"
    t, still = g.engine.prepare(t)
    if shared and not still:
        shared, path = False, "copy"
    return t, origin, shared, path


def from_transport(t: Any, origin: Origin) -> Any:
    """``t`` as a tensor of the input's backend, on its device, with its dtype (through convert)."""
    tb = backend_of(t)
    here = tb.device_of(t)
    if origin.is_transport:
        return t if here == origin.device else tb.move(t, origin.device)
    if origin.device.kind == "cpu":
        if here.kind != "cpu":
            t = tb.move(t, _HOST)
        y = convert(t, origin.backend.name, device=origin.device)  # a view on the input's (virtual) CPU device
    elif here.kind == origin.device.kind:
        y = convert(t, origin.backend.name)
    else:  # staged through host memory: back up by the input's own framework
        y = convert(t, origin.backend.name, device=_HOST)
    b = origin.backend
    y = y if b.device_of(y) == origin.device else b.move(y, origin.device)
    return _as_type_of(b, y, origin.like)


def _as_type_of(b: Backend, y: Any, like: Any) -> Any:
    """``y`` as a tensor of ``like``'s array type, for backends with several (MXNet's ``mx.nd`` and
    ``mx.np``: DLPack imports give the first), through the protocol: adapter operations return
    their first operand's type, so ``y`` is joined onto an empty piece of ``like`` (one copy, and
    only when the types differ); ``y`` itself for an array type that keeps a rank of its own
    (NumPy's matrix), as the engines whose transport it is give it."""
    if like is None or type(y) is type(like):
        return y
    shape = b.shape_of(y)
    n = 1
    for d in shape:
        n *= d
    m = 1
    for d in b.shape_of(like):
        m *= d
    flat = b.reshape(like, (m,))
    if len(b.shape_of(flat)) != 1:  # an array type that keeps a rank of its own (NumPy's matrix): the backend's plain
        return y  # type, as a transport tensor of it comes back
    empty = b.split(flat, [0, m], 0)[0]
    if b.device_of(empty) != b.device_of(y):
        empty = b.move(empty, b.device_of(y))
    return b.reshape(b.concat([empty, b.reshape(y, (n,))], 0), shape)


def transport_path(x: Any) -> str:
    """How ``x`` would travel in a collective of the current group: ``"native"`` (a transport
    tensor), ``"dlpack"`` (shared zero-copy), ``"staged"`` (through host memory) or ``"copy"``."""
    return to_transport(x, current())[3]
