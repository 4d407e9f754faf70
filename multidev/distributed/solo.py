"""The one-process group ``init()`` starts when no launcher started this process.

World size 1, rank 0: every collective keeps its contract (the consistency checks included, which
are trivially consistent) and its result is this rank's own contribution: allreduce, reduce and
broadcast return x's values (a new tensor, or x itself written in place), allgather and gather a
one-element list, scatter and reduce_scatter the one block. Tensors travel as they are (any backend,
any device: no conversion), so a script written for ``torchrun``/``mpiexec`` runs as plain
``python train.py``. Framework-free: it needs no engine installed.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from .._device import Device
from ..registry import backend_of
from .engine import Done, Engine, Handle, Membership, Settings

__all__ = ["SoloEngine"]


class SoloEngine(Engine):
    """The engine of a 1-process group (not registered: ``init()`` picks it when no launcher's
    environment is found and no engine was named)."""

    name: ClassVar[str] = "local"
    tensors: ClassVar[str] = ""
    conformance_worlds: ClassVar[tuple[int, ...]] = (1,)
    writes_inputs: ClassVar[bool] = True
    #: Tensors travel as themselves: the core skips the transport conversion.
    native_tensors: ClassVar[bool] = True

    def start(self, settings: Settings) -> Membership:
        return Membership(0, 1, 0, "none (one process, no launcher)")

    def stop(self, healthy: bool) -> None:
        return None

    def transport_for(self, device: Device) -> tuple[str, Device]:
        return "numpy", Device("cpu", 0)  # nominal: native_tensors makes the core keep tensors as they are

    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        return [list(row)]

    def allreduce(self, t: Any, op: str) -> Handle:
        return Done(t)

    def broadcast(self, t: Any, src: int) -> Handle:
        return Done(t)

    def reduce(self, t: Any, dst: int, op: str) -> Handle:
        return Done(t)

    def allgather(self, t: Any) -> Handle:
        return Done([t])

    def gather(self, t: Any, dst: int) -> Handle:
        return Done([t])

    def reduce_scatter(self, blocks: Any, op: str) -> Handle:
        b = backend_of(blocks)
        return Done(b.reshape(blocks, tuple(b.shape_of(blocks)[1:])))

    def scatter(self, blocks: Any | None, like: Any, src: int) -> Handle:
        b = backend_of(blocks)
        return Done(b.reshape(blocks, tuple(b.shape_of(blocks)[1:])))
