"""Mutants of the CuPy adapter (run on tests/fake_cupy.py without a GPU)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from multidev.adapter import (
    Device,
    concern,
    staged_upload,
)
from multidev.adapters.cupy import CupyBackend
from multidev.adapters.cupy.transfers import CupyTransfers

from ._base import mutant


# == CuPy (on tests/fake_cupy.py without a GPU) =======================================================
class _CupyStagedAtOffsetZeroTransfers(CupyTransfers):
    def upload(self, a: np.ndarray, device: Device) -> Any:
        cp = self.core.cp
        with self.core._gpu(device):
            if (a.nbytes < self.core.staging.threshold or not a.flags.c_contiguous or a.ndim == 0
                    or a.dtype.kind not in "biufc"):
                return cp.array(a if a.flags.c_contiguous else a.copy(order="C"), copy=True)
            out = cp.empty(a.shape, dtype=a.dtype)
            dst = out.reshape(-1).view(np.uint8)
            stream = cp.cuda.get_current_stream()

            def alloc(n: int) -> tuple[Any, np.ndarray]:
                buf = self.core.cpx.empty_pinned((n,), dtype=np.uint8)
                return buf, buf

            def submit(buf: Any, n: int, off: int) -> Any:
                dst[0:n].set(buf[:n], stream=stream)  # the defect: the offset is lost
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(stream)
                return ev

            staged_upload(a, alloc, submit, lambda ev: ev.synchronize(), self.core.staging)
            stream.synchronize()
        return out


@mutant("cupy", "staged uploads write every chunk at offset 0 of the destination (shows from the staging threshold "
        "up, 32 MiB by default)", ["test_staged_transfers_are_exact"])
class CupyStagedAtOffsetZero(CupyBackend):
    name = "cupy_staged_at_offset_zero"
    transfers = concern(_CupyStagedAtOffsetZeroTransfers)


class _CupyUploadDropsSnapshotTransfers(CupyTransfers):
    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        if self.core._is_gpu(x) or device.kind == "cpu" or x.size == 0:
            return super().start_move(x, device)
        a = np.asarray(x).view(np.ndarray)
        pin = self.core.cpx.empty_pinned(a.shape, dtype=x.dtype)
        np.copyto(pin, a)
        with self.core._gpu(device):
            y = self.core.cp.empty(a.shape, dtype=x.dtype)
            y.set(pin)
            done = self.core.cp.cuda.Event(disable_timing=True)
            done.record()
        return y, done.synchronize  # the defect: pin goes back to the pool while the copy is queued


@mutant("cupy", "start_move to a GPU does not keep its pinned snapshot alive until the copy lands (the pool hands "
        "it to the next upload)", ["test_nonblocking_moves_survive_their_dropped_sources"], gpus=1,
        why_gpu="the stand-in copies synchronously, so nothing is in flight without a GPU; on one, four uploads "
        "queued behind work land as [4, 4, 4, 4] (test_nonblocking_moves_survive_their_dropped_sources)")
class CupyUploadDropsSnapshot(CupyBackend):
    name = "cupy_upload_drops_snapshot"
    transfers = concern(_CupyUploadDropsSnapshotTransfers)


