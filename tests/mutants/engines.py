"""Mutants of the engines of multidev.distributed."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from multidev.adapter import (
    Device,
)
from multidev.adapters.numpy import NumpyBackend
from multidev.adapters.torch.engine import TorchEngine
from multidev.distributed.engine import Done, peer_errors, register_engine
from multidev.errors import DistributedTimeoutError


# == engines (multidev.distributed): the distributed checks' mutants ===============================
@dataclass(frozen=True)
class EngineMutant:
    """A one-method defect of an engine class, installed in place of the engine it subclasses (in
    the suite's process and in every worker) when ``$MULTIDEV_ENGINE_MUTANT`` names its class; the
    distributed checks of ``select`` must fail with it (``multidev conformance --multiprocess``)."""

    cls: type
    defect: str
    select: tuple[str, ...]

    @property
    def engine(self) -> str:
        return str(self.cls.name)


ENGINE_CATALOGUE: list[EngineMutant] = []
ENGINE_MUTANT_ENV = "MULTIDEV_ENGINE_MUTANT"


def engine_mutant(defect: str, select: Sequence[str]) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        ENGINE_CATALOGUE.append(EngineMutant(cls, defect, tuple(select)))
        return cls
    return deco


class TorchEngineControl(TorchEngine):
    """The torch engine, unmutated: installed the same way, it passes what its mutants fail."""


ENGINE_CONTROLS = (TorchEngineControl,)


@engine_mutant("exchange gives every rank's slot this rank's own row (the received rows never copied out): the "
               "consistency check passes a shape mismatch", ["test_mismatched_and_refused_calls_raise_on_every_rank"])
class TorchEngineOwnRows(TorchEngine):
    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        return [None if r is None else list(row) for r in super().exchange(seq, row, timeout)]


@engine_mutant("exchange raises a bare timeout at its deadline instead of returning None for the ranks that did not "
               "arrive: the timeout error does not name them", ["test_hung_rank_gives_the_others_a_timeout_error"])
class TorchEngineTimeoutUnnamed(TorchEngine):
    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        rows = super().exchange(seq, row, timeout)
        if any(r is None for r in rows):
            raise DistributedTimeoutError(f"the consistency exchange (call #{seq}) timed out after {timeout:g} s")
        return rows


@engine_mutant("exchange never reports a missing rank: at its deadline it fills the absent ranks' slots with this "
               "rank's own row, so the call goes on into a collective with a dead peer and its error cannot name it",
               ["test_killed_rank_gives_the_others_a_timeout_error"])
class TorchEngineHidesMissingRanks(TorchEngine):
    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        return [list(row) if r is None else r for r in super().exchange(seq, row, timeout)]


@engine_mutant("the group's timeout is not honoured: the consistency exchange waits five times as long for an absent "
               "rank, so a survivor's error comes long after the timeout it asked for (25 s for 5: past the check's "
               "20 s bound, timeout plus slack)",
               ["test_killed_rank_gives_the_others_a_timeout_error"])
class TorchEngineTimeoutIgnored(TorchEngine):
    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        return super().exchange(seq, row, timeout * 5)


@engine_mutant("exchange misnames a missing rank: the absent rank's slot is reported one rank lower (and the absent "
               "rank's own slot filled with this rank's row), so the survivors' timeout error blames a rank that is alive",
               ["test_killed_rank_gives_the_others_a_timeout_error"])
class TorchEngineMisnamesRank(TorchEngine):
    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        rows = super().exchange(seq, row, timeout)
        n = len(rows)
        return [None if rows[(i + 1) % n] is None else (list(row) if r is None else r) for i, r in enumerate(rows)]


@engine_mutant("gloo's RuntimeError for a lost peer is not taken for one (lost() catches only TimeoutError and "
               "ConnectionError): it escapes the engine as the framework's own error (a BackendError after "
               "translation), so with the checks off a survivor of a killed rank gets no DistributedTimeoutError and "
               "its group stays 'usable'", ["test_peer_killed_with_checks_off_gives_a_timeout_error"])
class TorchEngineRuntimeErrorEscapes(TorchEngine):
    def lost(self, what: str | Callable[[], str], timeout: float | None = None) -> Any:
        return peer_errors(what, (TimeoutError, ConnectionError), self.timeout if timeout is None else timeout)


@engine_mutant("split ignores the partition and hands back the whole group's engine: the collectives along a "
               "process-mesh axis reduce and gather over every rank instead of the subgroup",
               ["test_collectives_across_processes and 4procs"])
class TorchEngineSubgroupsIgnored(TorchEngine):
    def split(self, groups: tuple[tuple[int, ...], ...]) -> Any:
        return self


@engine_mutant("recv hands back the buffer it was given as soon as the receive is posted, not the message once it "
               "arrived: a point-to-point receive reads whatever the buffer held (the header check refuses it)",
               ["test_collectives_across_processes and 2procs"])
class TorchEngineRecvEarly(TorchEngine):
    def recv(self, like: Any, src: int) -> Any:
        super().recv(self.torch.empty_like(like), src)
        return Done(like)


@engine_mutant("all_to_all hands each rank its own blocks back instead of the block every rank sent it: the "
               "all-to-all along a process-mesh axis returns this rank's pieces", ["test_collectives_across_processes and 4procs"])
class TorchEngineAllToAllOwnBlocks(TorchEngine):
    def all_to_all(self, blocks: Any) -> Any:
        return Done(list(blocks.clone().unbind(0)))


def _install_engine_mutant() -> None:
    """Put the engine class ``$MULTIDEV_ENGINE_MUTANT`` names in place of its engine (this module
    is imported by the suite run and, through ``--import mutants``, by every worker)."""
    wanted = os.environ.get(ENGINE_MUTANT_ENV)
    if not wanted:
        return
    found = [c for c in [m.cls for m in ENGINE_CATALOGUE] + list(ENGINE_CONTROLS) if c.__name__ == wanted]
    if not found:
        raise RuntimeError(f"${ENGINE_MUTANT_ENV}={wanted}: no such engine mutant or control in tests/mutants/")
    register_engine(found[0].name, found[0], replace=True)


_install_engine_mutant()




# == not a catalogue entry: a framework that aborts the interpreter =============================
class NumpyImportAborts(NumpyBackend):
    """Aborts the interpreter when given a buffer, as TensorFlow does on an unaligned one (``Check
    failed: IsAligned()``): the suite must fail those checks and still write its matrix."""

    name = "numpy_import_aborts"

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        os.abort()


