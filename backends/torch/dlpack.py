"""DLPack interchange for PyTorch (:class:`~multidev.adapter.SupportsDLPack`).

torch exports a CUDA tensor only while its device is torch's current device (its ``__dlpack__``
records the consumer's stream handshake on the current device's stream). On a machine with several
CUDA devices a CUDA tensor therefore goes out behind :class:`OwnDeviceProducer`, which exports it
under ``torch.cuda.device(t.device)``: this rule lives here, for every consumer. With one CUDA
device (or none) the tensor itself goes out.
"""
from __future__ import annotations

from typing import Any

from multidev.adapter import CapabilityError, Concern, Device, SupportsDLPack

from .core import TorchCore


class OwnDeviceProducer:
    """A DLPack producer for a CUDA tensor ``t`` that exports it with ``t``'s device as torch's
    current device; ``dtype``, ``shape`` and ``device`` read as ``t``'s. No copy."""

    __slots__ = ("_cuda", "_t")

    def __init__(self, t: Any, cuda: Any) -> None:
        self._t = t
        self._cuda = cuda  # the torch.cuda module

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        t = self._t
        if t.device.index == self._cuda.current_device():
            return t.__dlpack__(*args, **kwargs)
        with self._cuda.device(t.device):
            return t.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._t.__dlpack_device__()

    @property
    def dtype(self) -> Any:
        return self._t.dtype

    @property
    def shape(self) -> Any:
        return self._t.shape

    @property
    def device(self) -> Any:
        return self._t.device


class HostProducer:
    """A DLPack producer for a dense host tensor ``t``: ``__dlpack__`` is torch's public C export
    (``torch.utils.dlpack.to_dlpack``, a legacy capsule; torch tensors are never read-only, so the
    versioned capsule's flag would say nothing more) and ``__dlpack_device__`` is ``(kDLCPU, 0)``,
    without the Python-level checks of ``Tensor.__dlpack__`` that the adapter made already; a
    request for a copy or another device goes to ``Tensor.__dlpack__``. ``dtype``, ``shape`` and
    ``device`` read as ``t``'s. No copy."""

    __slots__ = ("_t", "_to")

    def __init__(self, t: Any, to: Any) -> None:
        self._t = t
        self._to = to  # torch.utils.dlpack.to_dlpack

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        # A consumer that takes versioned capsules (NumPy 2) reads their read-only flag: the legacy
        # capsule would make it import torch's writable memory read-only, so it gets torch's own.
        if stream is not None or copy or max_version is not None or (
                dl_device is not None and tuple(dl_device) != (1, 0)):
            kw: dict[str, Any] = {"dl_device": dl_device, "copy": copy}
            if max_version is not None:
                kw["max_version"] = max_version
            return self._t.__dlpack__(stream=stream, **kw)  # torch's own rules (it refuses a stream on CPU)
        return self._to(self._t)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    @property
    def dtype(self) -> Any:
        return self._t.dtype

    @property
    def shape(self) -> Any:
        return self._t.shape

    @property
    def device(self) -> Any:
        return self._t.device


class TorchDLPack(Concern, SupportsDLPack):
    """Exports dense tensors without copying (see the module docstring for CUDA tensors on a
    machine with several GPUs); imports through ``torch.from_dlpack``, checked to land on the
    producer's device."""

    core: TorchCore

    #: import_dlpack of a host buffer is torch.from_dlpack and nothing more (it takes bare capsules too), so
    #: multidev's convert may hand host buffers to torch as capsules, or through the DLPack C
    #: exchange API of torch.Tensor (DLPack 1.3), instead of through ``__dlpack__`` in Python.
    dlpack_c_exchange = True

    def export_dlpack(self, x: Any) -> Any:
        t = x.detach() if x.requires_grad else x  # __dlpack__ refuses tensors that require grad
        if t.layout is not self.core.torch.strided:
            raise CapabilityError(f"torch backend: DLPack takes dense tensors only, not {t.layout}; "
                                  "convert with x.to_dense()")
        if t.is_conj() or t.is_neg():
            raise CapabilityError("torch backend: a lazily conjugated/negated view cannot be exported "
                                  "without a copy; call x.resolve_conj().resolve_neg() first")
        kind = t.device.type
        if kind == "cpu":
            return HostProducer(t, self.core.torch.utils.dlpack.to_dlpack)
        if self.core._n_cuda > 1 and kind == "cuda":
            return OwnDeviceProducer(t, self.core.torch.cuda)
        return t  # torch.Tensor has __dlpack__/__dlpack_device__, strided layouts included

    def __init__(self, core: TorchCore) -> None:
        super().__init__(core)
        torch = core.torch
        #: the current CUDA stream's raw handle of a device (what ``torch.cuda.current_stream`` wraps
        #: in a Stream object); None without CUDA
        self._raw_stream = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None) if core._n_cuda \
            else None
        self._hip = bool(getattr(getattr(torch, "version", None), "hip", None))

    def _import_gpu(self, obj: Any, device: Device) -> Any:
        """``torch.from_dlpack(obj)`` for a producer on the GPU ``device`` (the caller's: convert
        keeps the device), asking for the same capsule with the same stream handshake, without
        ``__dlpack_device__`` (microseconds of Python on some producers) or a Stream object; None
        where the producer takes no versioned request (torch's own call then tries the older forms)."""
        torch = self.core.torch
        torch.cuda._lazy_init()  # (as torch.cuda.current_stream does first: a clean error where CUDA cannot start)
        ptr = self._raw_stream(device.index)  # type: ignore[misc]
        if ptr == 0 and not self._hip:
            ptr = 1  # DLPack's name for CUDA's legacy default stream
        try:
            cap = obj.__dlpack__(max_version=(1, 0), stream=ptr)
        except TypeError:
            return None
        return torch._C._from_dlpack(cap)

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        """``torch.from_dlpack(obj)``, checked to land on ``device``; a producer on a GPU is asked
        for its capsule directly, with the stream handshake ``torch.from_dlpack`` makes."""
        try:
            y = None
            if type(obj).__name__ == "PyCapsule":
                y = self.core.torch._C._from_dlpack(obj)  # (what torch.from_dlpack does with a capsule)
            elif device.kind == "gpu" and self._raw_stream is not None and hasattr(obj, "__dlpack__"):
                y = self._import_gpu(obj, device)
            if y is None:
                y = self.core.torch.from_dlpack(obj)
        except (RuntimeError, TypeError, BufferError, ValueError, AttributeError) as e:
            raise CapabilityError(
                f"torch backend cannot import {type(obj).__name__} through DLPack: {e}") from e
        if (y.is_cuda and device.kind == "gpu" and y.get_device() == device.index) or (
                y.is_cpu and device.index == 0 and device.kind == "cpu"):
            return y  # (the check below, without making a Device)
        if self.core.device_of(y) != device:
            raise CapabilityError(f"torch backend: a DLPack buffer of {device} arrived on "
                                  f"{self.core.device_of(y)}; torch has no {device} to share it on")
        return y
