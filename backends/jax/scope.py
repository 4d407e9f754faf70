"""JAX's default device (:class:`~multidev.adapter.SupportsDeviceScope`): ``jax.default_device``,
so ``jnp.ones(2)`` inside ``md.device_scope(dev, backend="jax")`` lands on ``dev``. A JAX
configuration context: per thread, nested as JAX nests it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multidev.adapter import Device, SupportsDeviceScope


class JaxScope(SupportsDeviceScope):
    """``with jax.default_device(d):``."""

    _jax: Any

    if TYPE_CHECKING:  # the core's
        def to_native_device(self, device: Device) -> Any: ...

    def device_scope(self, device: Device) -> Any:
        return self._jax.default_device(self.to_native_device(device))
