"""DLPack interchange for TensorFlow (:class:`~multidev.adapter.SupportsDLPack`): eager tensors out,
compact row-major and aligned buffers in."""
from __future__ import annotations

from typing import Any

from multidev.adapter import CapabilityError, Concern, Device, SupportsDLPack, dlpack_info

from .core import TensorflowCore

# Eigen's alignment (EIGEN_MAX_ALIGN_BYTES): TF checks every buffer it computes on against it, and
# aborts the interpreter on a host buffer that misses it (Check failed: IsAligned()).
_ALIGN = 64


class TensorflowDLPack(Concern, SupportsDLPack):
    """Eager tensors export themselves (Variables are refused); imports are checked for TF's layout
    and alignment rules before TF sees the buffer."""

    core: TensorflowCore

    #: every host export is a compact row-major tensor of its own, never flagged read-only, so
    #: convert need not read each one's header (checked by the conformance suite)
    plain_host_exports = True

    def export_dlpack(self, x: Any) -> Any:
        """The eager tensor itself (it has ``__dlpack__``/``__dlpack_device__``). Every TF dtype
        exports, bool and bfloat16 included (NumPy cannot import bfloat16; torch can). A tf.Variable
        is refused: its buffer is replaced on assign, so no export can share memory with it."""
        tf = self.core.tf
        if isinstance(x, tf.Variable):
            raise CapabilityError(
                "tensorflow backend: a tf.Variable cannot be exported through DLPack (TF swaps its "
                "buffer on assign). Export a snapshot: multidev.copy(tf.convert_to_tensor(v)).")
        if hasattr(x, "__dlpack__"):
            return x
        return tf.experimental.dlpack.to_dlpack(x)  # TF releases without EagerTensor.__dlpack__

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        """A tf.Tensor sharing memory with ``obj`` (an object with ``__dlpack__``, or a legacy
        ``"dltensor"`` capsule). TF takes only compact row-major tensors and unversioned capsules;
        anything else raises CapabilityError."""
        tf = self.core.tf
        cap = obj.__dlpack__() if hasattr(obj, "__dlpack__") else obj
        info = dlpack_info(cap)  # reads the header only; the capsule stays unconsumed
        if not info.aligned(_ALIGN) or not info.row_major:
            # TF takes any buffer here but aborts the process later (Check failed: IsAligned())
            # when an op reads one that is not 64-byte aligned: refuse it before TF sees it.
            raise CapabilityError(
                f"tensorflow backend cannot share this DLPack buffer: TF needs contiguous (row-major) data at a "
                f"{_ALIGN}-byte aligned address (this one is at {info.address:#x}, strides {info.strides}). "
                "Copy it instead (multidev.convert does so when copy is not False).")
        try:
            y = tf.experimental.dlpack.from_dlpack(cap)
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError, TypeError) as e:
            raise CapabilityError(
                f"tensorflow backend cannot import this DLPack tensor: {str(e).splitlines()[0]}. TF "
                "takes compact row-major tensors through legacy 'dltensor' capsules; make the source "
                "contiguous first (np.ascontiguousarray, tensor.contiguous()).") from e
        got = self.core.device_of(y)
        if got == device:
            return y
        if got.kind == device.kind == "cpu":
            with tf.device(self.core.to_native_device(device)):
                return tf.identity(y)  # between logical CPUs identity relabels, it does not copy
        raise CapabilityError(f"tensorflow backend: a DLPack buffer of {device} arrived on {got}")
