"""Device resolution, shared by every layer above the registry: the ``device_scope`` defaults, turning
any device spelling or native device object into a :class:`Device`, and checking that a backend has it.
"""
from __future__ import annotations

import contextvars
from typing import Any

from ._device import Device, DeviceLike
from .errors import CollectiveInputError, DeviceNotFoundError
from .protocol import Backend
from .registry import native_device

__all__ = ["as_device", "check_distinct", "default_device", "device_list", "resolve", "scope_backend", "scope_device"]

#: The innermost ``device_scope``'s device and backend (context-local: threads and tasks each see theirs).
scope_device: contextvars.ContextVar[Device | None] = contextvars.ContextVar("md_device", default=None)
scope_backend: contextvars.ContextVar[str | None] = contextvars.ContextVar("md_backend", default=None)

_HOST = Device("cpu", 0)


#: Device spellings seen before -> their Device: every route that takes a spelling (``to``, its
#: non-blocking form, creation, ``synchronize``) reads this one cache, bounded in size.
_SPELLINGS: dict[str, Device] = {}
_SPELLINGS_MAX = 1024
#: The hot path of :func:`as_device` for a string seen before: a bound ``dict.get`` of its one
#: cache (never replaced), giving the Device or None.
cached_spelling = _SPELLINGS.get


def as_device(spec: DeviceLike) -> Device:
    """Any accepted spelling, DLPack pair, Device, or a native device object of a loaded framework
    (``torch.device``, a jax ``Device``, ``mx.Context``) as a :class:`Device`. Does not check that
    the device exists."""
    if spec.__class__ is Device:
        return spec
    if spec.__class__ is str:
        dev = _SPELLINGS.get(spec)
        if dev is None:
            dev = Device.parse(spec)
            if len(_SPELLINGS) < _SPELLINGS_MAX:
                _SPELLINGS[spec] = dev
        return dev
    if isinstance(spec, (str, Device)) or type(spec) is tuple:  # (a namedtuple may be a native device)
        return Device.parse(spec)
    found = native_device(spec)
    if found is not None:
        return found
    return Device.parse(spec)  # raises InvalidDeviceError naming the accepted forms


def default_device() -> Device:
    """The device creation calls use when given none: the innermost device_scope, else cpu:0."""
    return scope_device.get() or _HOST


def resolve(b: Backend, spec: Any) -> Device:
    """``spec`` (the scope's default, then cpu:0, when None) as a Device that backend ``b`` has;
    DeviceNotFoundError listing ``b``'s devices otherwise."""
    dev = default_device() if spec is None else as_device(spec)
    avail = b.devices()
    if dev not in avail:
        if dev.is_gpu:
            hint = "use multidev.try_gpu() to fall back to the CPU"
        elif env := getattr(b, "virtual_devices_env", None):
            hint = f"configure more virtual devices for this backend (${env}, see the README)"
        else:
            hint = (f"{b.name} has no virtual CPU devices, so only the devices listed exist; for several CPU "
                    "workers run one process per worker under multidev.distributed")
        raise DeviceNotFoundError(
            f"{b.name} has no device {dev}; available: {', '.join(map(str, avail))}. Hint: {hint}."
        )
    return dev


def device_list(b: Backend, devices: Any, what: str) -> list[Device]:
    """A non-empty list of distinct devices of ``b``: for broadcast, scatter, replicate, split_batch."""
    if isinstance(devices, (str, bytes, Device)) or not hasattr(devices, "__len__") or not hasattr(
            devices, "__iter__"):
        raise CollectiveInputError(f"{what} takes a list of devices; got {devices!r:.80}")
    devs_in = list(devices)
    if not devs_in:
        raise CollectiveInputError(f"{what} needs at least one device; got an empty list")
    devs = [resolve(b, d) for d in devs_in]
    check_distinct(devs, b.name, what, tensors=False)
    return devs


def check_distinct(devs: list[Device], backend: str, what: str, *, tensors: bool) -> None:
    """The one distinct-devices check: CollectiveInputError naming the call, each repeated device
    and how often, and the fix (for a device list: ``multidev.try_all_gpus()``, as a list of
    ``try_gpu(i)`` repeats ``cpu:0`` on a machine with fewer GPUs; for tensors: one per device)."""
    if len(set(devs)) == len(devs):
        return
    counts = {d: devs.count(d) for d in devs}
    repeated = [f"{d} ({n} times)" for d, n in sorted(counts.items()) if n > 1]
    dup = ", ".join(repeated) + (" appears" if len(repeated) == 1 else " appear") + " more than once"
    listed = ", ".join(map(str, devs))
    if tensors:
        raise CollectiveInputError(
            f"{what} takes one tensor per device, but {dup} among the {backend} tensors' devices [{listed}]. "
            "Place each tensor on its own device (multidev.to(x, device)), or combine "
            "the tensors of one device first.")
    hint = (" A list such as [md.try_gpu(i) for i in range(n)] repeats cpu:0 where the machine has fewer than n "
            "GPUs: use md.try_all_gpus() (every GPU, or [cpu:0]) instead.") if Device("cpu", 0) in counts else ""
    raise CollectiveInputError(
        f"{what} needs distinct devices, but {dup} in devices=[{listed}] on {backend}.{hint}")
