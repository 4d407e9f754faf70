"""JAX's default device (:class:`~multidev.adapter.SupportsDeviceScope`): ``jax.default_device``,
so ``jnp.ones(2)`` inside ``md.device_scope(dev, backend="jax")`` lands on ``dev``. A JAX
configuration context: per thread, nested as JAX nests it."""
from __future__ import annotations

from typing import Any

from multidev.adapter import Concern, Device, SupportsDeviceScope

from .core import JaxCore


class JaxScope(Concern, SupportsDeviceScope):
    """``with jax.default_device(d):``."""

    core: JaxCore

    def device_scope(self, device: Device) -> Any:
        return self.core.jax.default_device(self.core.to_native_device(device))

    def current_device(self) -> Device:
        jax = self.core.jax
        native = jax.config.jax_default_device
        if native is None:
            native = jax.devices()[0]  # JAX's own default: the first device of the default platform
        elif isinstance(native, str):
            native = jax.devices(native)[0]
        dev = self.core.from_native_device(native)
        return dev if dev is not None else Device("cpu", 0)
