"""Mutants of the generic pieces every adapter relies on (BaseBackend's defaults, shared implementations)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from multidev.adapter import (
    ArrayApiDLPack,
    Concern,
    Device,
    SupportsNativeCollectives,
    concern,
)
from multidev.adapters.jax import JaxBackend
from multidev.adapters.jax.training import JaxTraining
from multidev.adapters.jax.transfers import JaxTransfers

from ._base import GenericControl, mutant


# == generic pieces (BaseBackend's defaults) ======================================================
@mutant("generic", "BaseBackend.shape_of gives a list", ["test_shape_of_gives_a_tuple_of_ints"])
class GenericShapeOfList(GenericControl):
    name = "generic_shape_of_list"

    def shape_of(self, x: Any) -> tuple[int, ...]:
        return list(x.shape)  # type: ignore[return-value]


class _GenericImportNoPlacementCheckDlpack(ArrayApiDLPack):
    def import_dlpack(self, obj: Any, device: Device) -> Any:
        return np.from_dlpack(obj)


@mutant("generic", "ArrayApiDLPack.import_dlpack without its placement check (a view of cpu:0 for any device)",
        ["test_import_dlpack_lands_on_the_requested_device"])
class GenericImportNoPlacementCheck(GenericControl):
    name = "generic_import_unchecked"
    dlpack = concern(_GenericImportNoPlacementCheckDlpack)


class _GenericNativeReturnsInputsCollectives(Concern, SupportsNativeCollectives):
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return list(xs)


@mutant("generic", "a collectives concern whose native_allreduce hands back its inputs",
        ["test_native_allreduce_concern_matches_behaviour"])
class GenericNativeReturnsInputs(GenericControl):
    name = "generic_native_inputs"
    collectives = concern(_GenericNativeReturnsInputsCollectives)


class _GenericStartMoveNoWaiterTransfers(JaxTransfers):
    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        return self.core.move(x, device), None


@mutant("generic", "start_move gives no waiter, even on an asynchronous backend (JAX)",
        ["test_reads_and_transfers_wait_for_queued_work"])
class GenericStartMoveNoWaiter(JaxBackend):
    name = "generic_start_move_no_wait"
    transfers = concern(_GenericStartMoveNoWaiterTransfers)


@mutant("generic", "BaseBackend.wait does not wait (on JAX, which is asynchronous)",
        ["test_synchronize_waits_for_queued_work", "test_synchronize_raises_asynchronous_errors"])
class GenericWaitNoop(JaxBackend):
    name = "generic_wait_noop"

    def wait(self, x: Any) -> None:
        return None


@mutant("generic", "BaseBackend.same_device returns the first device without comparing (on JAX)",
        ["test_device_mismatch_raises"])
class GenericSameDeviceUnchecked(JaxBackend):
    name = "generic_same_device_first"

    def same_device(self, what: str, xs: Sequence[Any], note: str = "") -> Device:
        return self.device_of(xs[0])


class _GenericSgdPromotesTraining(JaxTraining):
    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        return [p - g * np.float64(lr) for p, g in zip(params, grads)]


@mutant("generic", "TrainingDefaults.sgd_update multiplies by a NumPy float64 learning rate, promoting float16 and "
        "float32 parameters (to float32 on JAX without x64, to float64 with it)",
        ["test_sgd_update_keeps_every_parameters_dtype_and_device"])
class GenericSgdPromotes(JaxBackend):
    name = "generic_sgd_promotes"
    training = concern(_GenericSgdPromotesTraining)


