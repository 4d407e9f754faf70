"""The base of native baselines: each framework's own calls, written directly against the framework.

``multidev bench`` times every row through multidev and through a baseline, in the same process.
Baselines live beside the adapters (``benchmarks/baselines/``, installed as
``multidev.benchmarks.baselines``), one class per framework, registered under the framework's module
name in the ``multidev.baselines`` entry-point group; a third-party package may add its own. Each
class imports its framework in ``__init__``; :func:`native_for` returns ``None`` for a backend whose
framework has no baseline (multidev-only rows) or fails to import.

``call(op, *args)`` returns ``(fn, args, label)`` so the runner times ``fn(*args)`` with no wrapper
frame where the framework offers a bound call (``x.to``, ``jax.device_put``), keeping the
comparison fair. Ops:

- ``to(x, dev)``: the idiomatic "put x on dev" (a no-op when x is there: torch ``x.to``,
  ``jax.device_put``, MXNet ``as_in_context``, ``tf.identity`` under ``tf.device``);
- ``move_async(x, dev)``: the same with the framework's non-blocking flag where it has one;
- ``copy(x, dev)``: always a new buffer on ``dev``;
- ``device_of(x)``, ``dtype_of(x)`` (``x.dtype`` by default), ``sync(dev, x)`` (idle device), ``wait(x)``
  (one tensor), ``zeros(shape, dev)``,
  ``h2d(ndarray, dev)``, ``d2h(x)``;
- ``from_dlpack(x)``: the framework as a DLPack consumer of another framework's tensor;
  ``export_dlpack(x)``: the producer's own export, for a framework whose tensors do not speak the
  ``__dlpack__`` protocol (a fresh capsule per call).
"""
from __future__ import annotations

import operator
import platform
from collections.abc import Callable
from importlib import metadata
from typing import Any

from multidev import Device

__all__ = ["BASELINE_GROUP", "Call", "Native", "cpu_name", "native_for", "nothing"]

Call = tuple[Callable[..., Any], tuple, str]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nothing() -> None:
    return None


class Native:
    """Base: every op missing (returns None)."""

    framework = ""
    #: Environment variables of this framework that change what is measured (recorded in the JSON).
    env_vars: tuple[str, ...] = ()
    #: Goals whose target differs for this framework (a number), or that do not apply to it (None),
    #: by goal name, with the reason in a comment.
    goal_targets: dict[str, float | None] = {}  # noqa: RUF012 - read-only class data
    #: Whether ``op_sync(dev)`` also waits for copies off the device (a CUDA device barrier does;
    #: JAX's marker computation waits for its compute queue only): where not, the native side of
    #: the asynchronous rows waits for each result instead (``autoparallel.native_waiter``).
    sync_waits_for_copies = True
    #: Whether native results carry a device multidev can read back (NumPy's do not: its devices
    #: are multidev's virtual ones, so checks skip the device of NumPy's native results).
    tracks_devices = True
    #: The framework's import and first call as code for a fresh interpreter (suite ``startup``;
    #: empty: no such row).
    startup_code = ""

    def __init__(self, b: Any) -> None:
        self.b = b

    def call(self, op: str, *args: Any) -> Call | None:
        m = getattr(self, "op_" + op, None)
        return None if m is None else m(*args)

    def op_dtype_of(self, x: Any) -> Call:
        """The framework's own dtype attribute (every framework's tensors have ``.dtype``)."""
        return operator.attrgetter("dtype"), (x,), "x.dtype"

    def mm(self, dev: Device) -> Callable[[Any, Any], Any]:
        """The framework's matmul for operands on ``dev``."""
        raise NotImplementedError

    def mover(self, dev: Device, non_blocking: bool = False) -> Callable[[Any], Any]:
        """A one-argument function putting a tensor on ``dev`` the framework's way (for loops)."""
        op = "move_async" if non_blocking else "to"

        def move(x: Any) -> Any:
            c = self.call(op, x, dev)
            if c is None:
                raise NotImplementedError(f"{type(self).__name__} has no {op}")
            fn, a, _ = c
            return fn(*a)
        return move

    def set_precision(self, mode: str) -> dict[str, Any]:
        """Set f32 matmul precision: ``fp32`` (full), ``tf32``, or ``default`` (leave as is).
        Returns the flags as they now read."""
        return {}

    def save_precision(self) -> Any:
        """The precision state, for :meth:`restore_precision` once the run is over."""
        return None

    def restore_precision(self, state: Any) -> None:
        return None

    def device_name(self, dev: Device) -> str:
        return cpu_name() if not dev.is_gpu else str(dev)



BASELINE_GROUP = "multidev.baselines"


def native_for(b: Any) -> Native | None:
    """The native baseline for adapter ``b`` (by its framework module), or None."""
    fw = getattr(b, "framework", "")
    for ep in metadata.entry_points(group=BASELINE_GROUP):
        if ep.name != fw:
            continue
        try:
            cls = ep.load()
            nat: Native = cls(b)
            return nat
        except ImportError:
            return None
    return None
