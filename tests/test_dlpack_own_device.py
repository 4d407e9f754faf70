"""torch's current-device rule for DLPack lives in torch's adapter alone (backends/torch/dlpack.py).

torch exports a CUDA tensor only while its device is torch's current device. On a machine with
several CUDA devices the adapter's ``export_dlpack`` therefore hands out a thin producer that
exports under the tensor's own device, for every consumer (JAX, CuPy, TensorFlow, ...); with one
CUDA device, or none, the tensor itself. Checked with stand-ins for torch: no torch, no GPU needed.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from multidev.adapters.torch.dlpack import HostProducer, OwnDeviceProducer, TorchDLPack


class _Device:
    def __init__(self, type_: str, index: int | None) -> None:
        self.type, self.index = type_, index


class _Cuda:
    """torch.cuda's current device, and a log of what was current when a tensor was exported."""

    def __init__(self) -> None:
        self.current = 0
        self.switches = 0

    def current_device(self) -> int:
        return self.current

    @contextlib.contextmanager
    def device(self, dev: Any) -> Iterator[None]:
        self.switches += 1
        prev, self.current = self.current, dev.index
        try:
            yield
        finally:
            self.current = prev


class _Tensor:
    layout = "strided"
    requires_grad = False
    dtype = "torch.float32"
    shape = (2, 3)

    def __init__(self, cuda: _Cuda, device: _Device) -> None:
        self._cuda, self.device = cuda, device
        self.exported: list[tuple[int, dict]] = []

    def detach(self) -> _Tensor:
        return self

    def is_conj(self) -> bool:
        return False

    def is_neg(self) -> bool:
        return False

    def __dlpack__(self, **kwargs: Any) -> str:
        self.exported.append((self._cuda.current, kwargs))
        return "capsule"

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device.index or 0) if self.device.type == "cuda" else (1, 0)


def _adapter(n_cuda: int) -> tuple[Any, _Cuda]:
    cuda = _Cuda()

    class Torch:  # the parts of the torch module export_dlpack reads
        strided = "strided"

    class _DLPackModule:
        @staticmethod
        def to_dlpack(t: Any) -> str:
            return "c-capsule"

    class _Utils:
        dlpack = _DLPackModule

    Torch.cuda = cuda  # type: ignore[attr-defined]
    Torch.utils = _Utils  # type: ignore[attr-defined]

    class Core:  # the parts of the core the dlpack concern reads
        torch, _n_cuda = Torch, n_cuda

    class Adapter:
        dlpack = TorchDLPack(Core())

    return Adapter(), cuda


def test_one_gpu_exports_the_tensor_itself() -> None:
    b, cuda = _adapter(1)
    t = _Tensor(cuda, _Device("cuda", 0))
    assert b.dlpack.export_dlpack(t) is t  # zero cost: with one device it is always torch's current one


def test_host_tensors_go_out_through_torchs_c_export() -> None:
    b, cuda = _adapter(2)
    t = _Tensor(cuda, _Device("cpu", None))
    out = b.dlpack.export_dlpack(t)
    assert isinstance(out, HostProducer)
    assert out.dtype == t.dtype and out.shape == t.shape and out.device is t.device
    assert out.__dlpack_device__() == (1, 0)
    assert out.__dlpack__() == "c-capsule" and out.__dlpack__(dl_device=(1, 0)) == "c-capsule"
    assert t.exported == [], "no Python-level export where torch's C export does"
    # a copy, another device, a stream or a versioned request (its read-only flag matters to NumPy)
    # goes to the tensor's own __dlpack__ (torch's rules)
    assert out.__dlpack__(copy=True) == "capsule" and out.__dlpack__(stream=5) == "capsule"
    assert out.__dlpack__(max_version=(1, 0)) == "capsule"
    assert [k for _, k in t.exported][:2] == [{"stream": None, "dl_device": None, "copy": True},
                                              {"stream": 5, "dl_device": None, "copy": None}]
    assert len(t.exported) == 3


def test_torch_host_memory_reaches_numpy_writable_and_shared() -> None:
    """NumPy 2 asks for a versioned capsule and honours its read-only flag: torch's writable host
    memory must arrive writable (the MPI engine's zero-copy path depends on it)."""
    torch = pytest.importorskip("torch")
    import numpy as np

    import multidev as md

    if np.lib.NumpyVersion(np.__version__) < "2.1.0":
        pytest.skip("NumPy before 2.1 imports every DLPack capsule read-only (no versioned capsules, no flag)")
    x = torch.ones(5)
    y = md.convert(x, "numpy", copy=False)
    y[0] = 7
    assert x[0].item() == 7.0


def test_several_gpus_export_under_the_tensors_own_device() -> None:
    b, cuda = _adapter(2)
    t = _Tensor(cuda, _Device("cuda", 1))
    out = b.dlpack.export_dlpack(t)
    assert isinstance(out, OwnDeviceProducer)
    assert out.dtype == t.dtype and out.shape == t.shape and out.device is t.device  # read as the tensor's
    assert out.__dlpack_device__() == (2, 1)
    assert out.__dlpack__(stream=7, max_version=(1, 0)) == "capsule"
    assert t.exported == [(1, {"stream": 7, "max_version": (1, 0)})], "exported while cuda:1 was current"
    assert cuda.current == 0, "the consumer's current device is restored"
    t0 = _Tensor(cuda, _Device("cuda", 0))
    b.dlpack.export_dlpack(t0).__dlpack__(stream=3)
    assert t0.exported == [(0, {"stream": 3})] and cuda.switches == 1, "no switch where it is current already"
