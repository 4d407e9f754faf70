"""Mutants of the NumPy adapter."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from multidev.adapter import (
    CapabilityError,
    Concern,
    Device,
    SupportsNativeCollectives,
    concern,
)
from multidev.adapters.numpy import NumpyBackend, NumpyDLPack

from ._base import _HOST, _plain, _tag, mutant


# == NumPy ===========================================================================================
@mutant("numpy", "copy casts every float to float32", ["test_copy_keeps_every_dtype"])
class NumpyCopyCastsFloats(NumpyBackend):
    name = "numpy_copy_casts_floats"

    def copy(self, x: Any, device: Device) -> Any:
        a = np.array(_plain(x), copy=True)
        return _tag(a.astype(np.float32) if a.dtype.kind == "f" else a, device)


@mutant("numpy", "copy on the same device returns a view of x", ["test_copy_is_a_new_buffer"])
class NumpyCopySharesBuffer(NumpyBackend):
    name = "numpy_copy_shares"

    def copy(self, x: Any, device: Device) -> Any:
        return _tag(_plain(x), device)


@mutant("numpy", "asarray wraps the caller's array instead of copying it", ["test_asarray_never_shares"])
class NumpyAsarrayShares(NumpyBackend):
    name = "numpy_asarray_shares"

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        nd = None if dtype is None else self.to_native_dtype(dtype)
        return _tag(np.asarray(_plain(obj), dtype=nd), device)


@mutant("numpy", "asarray of a Python scalar takes NumPy's inference (2.5 becomes float64), not the dtype asked for",
        ["test_default_dtypes_are_the_documented_ones"])
class NumpyAsarrayScalarInfers(NumpyBackend):
    name = "numpy_asarray_scalar_infers"

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        if isinstance(obj, (int, float, complex)):
            return _tag(np.array(obj), device)
        return super().asarray(obj, dtype, device)


@mutant("numpy", "move turns float64 into float32", ["test_move_keeps_every_dtype"])
class NumpyMoveDowncasts(NumpyBackend):
    name = "numpy_move_downcasts"

    def move(self, x: Any, device: Device) -> Any:
        a = np.array(_plain(x), copy=True)
        return _tag(a.astype(np.float32) if a.dtype == np.float64 else a, device)


@mutant("numpy", "move keeps the source's device tag", ["test_move_keeps_values"])
class NumpyMoveStays(NumpyBackend):
    name = "numpy_move_stays"

    def move(self, x: Any, device: Device) -> Any:
        return _tag(np.array(_plain(x), copy=True), self.device_of(x))


@mutant("numpy", "to_numpy gives a NumPy scalar for a 0-d tensor", ["test_to_numpy_gives_an_exact_ndarray"])
class NumpyToNumpyScalar(NumpyBackend):
    name = "numpy_to_numpy_scalar"

    def to_numpy(self, x: Any) -> Any:
        a = np.asarray(_plain(x))
        return a[()] if a.ndim == 0 else a


@mutant("numpy", "to_numpy hands back the device-tagged subclass", ["test_to_numpy_gives_an_exact_ndarray"])
class NumpyToNumpySubclass(NumpyBackend):
    name = "numpy_to_numpy_subclass"

    def to_numpy(self, x: Any) -> Any:
        return x if isinstance(x, np.ndarray) else np.asarray(x)


@mutant("numpy", "dtype_of names float16 tensors float32", ["test_creation_honours_device_and_dtype"])
class NumpyDtypeOfHalf(NumpyBackend):
    name = "numpy_dtype_of_half"

    def dtype_of(self, x: Any) -> str:
        d = super().dtype_of(x)
        return "float32" if d == "float16" else d


@mutant("numpy", "combine's table maps min to maximum", ["test_combine_matches_numpy"])
class NumpyCombineMinIsMax(NumpyBackend):
    name = "numpy_combine_min_max"

    def combine(self, op: str, a: Any, b: Any) -> Any:
        return super().combine("max" if op == "min" else op, a, b)


@mutant("numpy", "combine accumulates integers in int64 and never casts back",
        ["test_allreduce_keeps_every_dtype", "test_combine_matches_numpy"])
class NumpyCombineWidensInts(NumpyBackend):
    name = "numpy_combine_widens"

    def combine(self, op: str, a: Any, b: Any) -> Any:
        y = super().combine(op, a, b)
        return _tag(_plain(y).astype(np.int64), self.device_of(y)) if y.dtype.kind in "iu" else y


@mutant("numpy", "divide floors (x // n), as for integers", ["test_divide_keeps_the_floating_dtype"])
class NumpyDivideFloors(NumpyBackend):
    name = "numpy_divide_floors"

    def divide(self, x: Any, n: int) -> Any:
        return _tag(_plain(x) // n, self.device_of(x))


@mutant("numpy", "divide by a float64 scalar promotes float32 and float16 to float64",
        ["test_divide_keeps_the_floating_dtype"])
class NumpyDividePromotes(NumpyBackend):
    name = "numpy_divide_promotes"

    def divide(self, x: Any, n: int) -> Any:
        return _tag(_plain(x) / np.float64(n), self.device_of(x))


@mutant("numpy", "split returns its pieces in reverse order", ["test_reshape_concat_split"])
class NumpySplitReversed(NumpyBackend):
    name = "numpy_split_reversed"

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        return super().split(x, sizes, axis)[::-1]


@mutant("numpy", "split cuts along axis 0 for a negative axis (an adapter that slices by a prefix of axis slices)",
        ["test_reshape_concat_split"])
class NumpySplitNegativeAxis(NumpyBackend):
    name = "numpy_split_negative_axis"

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        return super().split(x, sizes, max(axis, 0))


@mutant("numpy", "concat does not check that its operands share a device", ["test_device_mismatch_raises"])
class NumpyConcatNoDeviceCheck(NumpyBackend):
    name = "numpy_concat_any_device"

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        return _tag(np.concatenate([_plain(x) for x in xs], axis=axis), self.device_of(xs[0]))


@mutant("numpy", "assign writes across devices", ["test_device_mismatch_raises"])
class NumpyAssignNoDeviceCheck(NumpyBackend):
    name = "numpy_assign_any_device"

    def assign(self, dst: Any, src: Any) -> None:
        np.copyto(_plain(dst), _plain(src))


class _NumpyImportOnHostDlpack(NumpyDLPack):
    def import_dlpack(self, obj: Any, device: Device) -> Any:
        return _tag(np.from_dlpack(obj), _HOST)


@mutant("numpy", "import_dlpack tags every buffer cpu:0, whatever device was asked for",
        ["test_import_dlpack_lands_on_the_requested_device"])
class NumpyImportOnHost(NumpyBackend):
    name = "numpy_import_on_host"
    dlpack = concern(_NumpyImportOnHostDlpack)


class _NumpyExportCopiesDlpack(NumpyDLPack):
    def export_dlpack(self, x: Any) -> Any:
        return np.array(_plain(x), copy=True)


@mutant("numpy", "export_dlpack exports a copy, so nothing is shared",
        ["test_convert_shares_memory_wherever_both_sides_can"])
class NumpyExportCopies(NumpyBackend):
    name = "numpy_export_copies"
    dlpack = concern(_NumpyExportCopiesDlpack)


class _NumpyClaimsNoDlpackDlpack(NumpyDLPack):
    @classmethod
    def available_on(cls, core: Any) -> bool:
        return False


@mutant("numpy", "its dlpack concern says it is unavailable, so b.dlpack is None (its arrays still export)",
        ["test_dlpack_concern_matches_behaviour"])
class NumpyClaimsNoDlpack(NumpyBackend):
    name = "numpy_claims_no_dlpack"
    dlpack = concern(_NumpyClaimsNoDlpackDlpack)


@mutant("numpy", "capabilities claim mutable=False (assign still writes)", ["test_mutable_flag_matches_behaviour"])
class NumpyClaimsImmutable(NumpyBackend):
    name = "numpy_claims_immutable"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, mutable=False)


@mutant("numpy", "capabilities claim raises_on_mixed_devices=False (NumPy devices do raise)",
        ["test_raises_on_mixed_devices_flag"])
class NumpyClaimsSilentMixing(NumpyBackend):
    name = "numpy_claims_silent_mixing"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, raises_on_mixed_devices=False)


@mutant("numpy", "capabilities leave out float16, which it holds", ["test_dtypes_flag_matches_behaviour"])
class NumpyHidesFloat16(NumpyBackend):
    name = "numpy_hides_float16"

    @property
    def capabilities(self) -> Any:
        c = super().capabilities
        return dataclasses.replace(c, dtypes=c.dtypes - {"float16"})


class _NumpyClaimsNativeCollectives(Concern, SupportsNativeCollectives):
    """A collectives concern on an adapter whose framework has no native allreduce: it refuses."""

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        raise CapabilityError("numpy backend has no native allreduce")


@mutant("numpy", "a collectives concern set where NumPy has no native allreduce (its native_allreduce refuses)",
        ["test_native_allreduce_concern_matches_behaviour"])
class NumpyClaimsNative(NumpyBackend):
    name = "numpy_claims_native"
    collectives = concern(_NumpyClaimsNativeCollectives)


@mutant("numpy", "capabilities give per-device dtypes for a device it does not have",
        ["test_capability_record_is_well_formed"])
class NumpyDeviceDtypesForeign(NumpyBackend):
    name = "numpy_device_dtypes_foreign"

    @property
    def capabilities(self) -> Any:
        c = super().capabilities
        return dataclasses.replace(c, device_dtypes={Device("gpu", 0): c.dtypes - {"float64"}})


@mutant("numpy", "concat preallocates its result with np.empty's default dtype (float64)",
        ["test_other_collectives_keep_every_dtype"])
class NumpyConcatPreallocates(NumpyBackend):
    name = "numpy_concat_preallocates"

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        dev = self.same_device("concat", xs)
        parts = [_plain(x) for x in xs]
        shape = list(parts[0].shape)
        shape[axis] = sum(p.shape[axis] for p in parts)
        out = np.empty(shape)
        np.concatenate(parts, axis=axis, out=out, casting="unsafe")
        return _tag(out, dev)


@mutant("numpy", "devices lists the virtual devices in reverse order", ["test_devices_listed_cpu_first"])
class NumpyDevicesReversed(NumpyBackend):
    name = "numpy_devices_reversed"

    def devices(self) -> list[Device]:
        return super().devices()[::-1]


@mutant("numpy", "rand ignores its seed", ["test_rand_uniform_and_seeded"])
class NumpyRandUnseeded(NumpyBackend):
    name = "numpy_rand_unseeded"

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        return super().rand(shape, dtype, device, None)


@mutant("numpy", "full leaves the dtype to NumPy's inference from the value",
        ["test_creation_honours_device_and_dtype"])
class NumpyFullInfersDtype(NumpyBackend):
    name = "numpy_full_infers"

    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        return _tag(np.full(shape, value), device)


@mutant("numpy", "from_native_device takes any object for cpu:0", ["test_from_native_device_rejects"])
class NumpyNativeDeviceAnything(NumpyBackend):
    name = "numpy_native_device_any"

    def from_native_device(self, obj: Any) -> Device | None:
        return obj if isinstance(obj, Device) else _HOST




# == arguments away from the defaults: issue 35 ========================================================
@mutant("numpy", "asarray converts integer data through float64 (exact only up to 2**53: int64's extremes change)",
        ["test_placement_calls_away_from_their_defaults"])
class NumpyAsarrayViaFloat(NumpyBackend):
    name = "numpy_asarray_via_float"

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        src = np.asarray(_plain(obj))
        if src.dtype.kind in "iu" and dtype is not None:
            return _tag(src.astype(np.float64).astype(self.to_native_dtype(dtype)), device)
        return super().asarray(obj, dtype, device)


@mutant("numpy", "combine computes integers in float64 and casts back (int64 sums and extremes beyond 2**53 change)",
        ["test_allreduce_and_reduce_away_from_their_defaults"])
class NumpyCombineIntsViaFloat(NumpyBackend):
    name = "numpy_combine_ints_via_float"

    def combine(self, op: str, a: Any, b: Any) -> Any:
        pa, pb = _plain(a), _plain(b)
        if pa.dtype.kind not in "iu":
            return super().combine(op, a, b)
        fn = {"sum": np.add, "max": np.maximum, "min": np.minimum, "prod": np.multiply}[op]
        out = fn(pa.astype(np.float64), pb.astype(np.float64)).astype(pa.dtype)
        return _tag(out, self.same_device(op, (a, b)))


@mutant("numpy", "writable() answers True for a read-only array (the in-place collectives then skip their probe)",
        ["test_writable_answer_matches_behaviour"])
class NumpyWritableAlwaysTrue(NumpyBackend):
    name = "numpy_writable_always_true"

    def writable(self, x: Any) -> bool | None:
        return True


@mutant("numpy", "the one-pass allreduce leaves its results in a reference cycle (a recursive closure over them): "
        "their memory lives until a garbage collection", ["test_allreduce_results_are_freed_when_dropped"])
class NumpyAllreduceResultsInACycle(NumpyBackend):
    name = "numpy_allreduce_results_in_a_cycle"

    def shared_memory_allreduce(self, xs: Sequence[Any], op: str, orders: Sequence[tuple[int, int, Any]],
                                divide_by: int | None, inplace: bool) -> list[Any] | None:
        out = super().shared_memory_allreduce(xs, op, orders, divide_by, inplace)

        def keep() -> Any:  # (refers to itself: a function-cell cycle that holds ``out``)
            return keep, out
        return out


@mutant("numpy", "copy leaves its result in a reference cycle (a recursive closure over it): its memory lives "
        "until a garbage collection", ["test_other_collectives_results_are_freed_when_dropped"])
class NumpyCopyResultInACycle(NumpyBackend):
    name = "numpy_copy_result_in_a_cycle"

    def copy(self, x: Any, device: Device) -> Any:
        out = super().copy(x, device)

        def keep() -> Any:  # (refers to itself: a function-cell cycle that holds ``out``)
            return keep, out
        return out
