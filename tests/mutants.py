"""The mutation catalogue: one-method defects of the NumPy, torch and JAX adapters and of the
generic pieces every adapter relies on (BaseBackend's defaults), each the kind of bug an adapter
author writes. ``tests/test_mutation_catalogue.py`` runs the conformance suite against each one
(``multidev conformance --backend mutants:ClassName``) and requires it to fail.

Every mutant is a subclass that overrides exactly one method (or the ``capabilities`` property) of
its base and has its own registry ``name``, so several are tested in one pytest session. Each entry
says what the defect is and which checks are run against it (``select``: substrings of the test
ids; the catalogue run keeps only those, and stops testing a mutant at its first failure). A
renamed, unmutated copy of each base (the ``*Control`` classes) runs the union of the selections and
must pass: the failures come from the defects, not from the renaming.

Mutants that cannot fail on a machine without a GPU say why and where they are caught instead
(``gpus`` > 0: the GPU run, ``scripts/gpu/mutants.sh``).

Loaded as a pytest plugin (``-p mutants``), this module also applies the selections and the
stop-at-first-failure rule to the suite run.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from multidev.adapter import (
    DTYPES,
    ArrayApiDLPack,
    BaseBackend,
    CapabilityError,
    Device,
    SupportsNativeCollectives,
    canonical_dtype,
    staged_upload,
)
from multidev.adapters.cupy import CupyBackend
from multidev.adapters.engines.torch import TorchEngine
from multidev.adapters.jax import JaxBackend
from multidev.adapters.jax._common import X64_DTYPES, x64_hint
from multidev.adapters.jax.dlpack import _DL_X64, _Producer
from multidev.adapters.numpy import NumpyBackend, VirtualDeviceArray
from multidev.adapters.torch import TorchBackend
from multidev.distributed.engine import register_engine
from multidev.errors import DistributedTimeoutError

_HOST = Device("cpu", 0)


@dataclass(frozen=True)
class Mutant:
    cls: type
    base: str
    """``numpy``, ``torch``, ``jax``, ``cupy`` or ``generic`` (a BaseBackend default or a shared
    implementation, on the adapter named in the class's base)."""
    defect: str
    select: tuple[str, ...]
    """Substrings of the suite's test ids that must catch it (the run is limited to them)."""
    gpus: int = 0
    """GPUs needed for the defect to show (0: it fails on any machine)."""
    why_gpu: str = ""
    """For ``gpus`` > 0: why a CPU-only machine cannot show it, and which check catches it there."""

    @property
    def name(self) -> str:
        return str(self.cls.name)

    @property
    def spec(self) -> str:
        return f"mutants:{self.cls.__name__}"


CATALOGUE: list[Mutant] = []


def mutant(base: str, defect: str, select: Sequence[str], gpus: int = 0,
           why_gpu: str = "") -> Callable[[type], type]:
    def deco(cls: type) -> type:
        CATALOGUE.append(Mutant(cls, base, defect, tuple(select), gpus, why_gpu))
        return cls
    return deco


def _plain(x: Any) -> Any:
    return x.view(np.ndarray) if isinstance(x, VirtualDeviceArray) else x


def _tag(a: Any, device: Device) -> Any:
    v = np.asarray(a).view(VirtualDeviceArray)
    v._md_device = device
    return v


# == controls: renamed, unmutated copies of each base ==============================================
class NumpyControl(NumpyBackend):
    name = "numpy_control"


class GenericControl(NumpyBackend):
    """The NumPy adapter on the shared defaults (BaseBackend's wait and shape_of, ArrayApiDLPack's
    export/import through ``numpy.from_dlpack``, the core's start_move, no native allreduce): the
    base of the generic mutants."""

    name = "generic_control"
    wait = BaseBackend.wait
    shape_of = BaseBackend.shape_of
    export_dlpack = ArrayApiDLPack.export_dlpack
    import_dlpack = ArrayApiDLPack.import_dlpack


class TorchControl(TorchBackend):
    name = "torch_control"


class JaxControl(JaxBackend):
    name = "jax_control"


class CupyControl(CupyBackend):
    """The CuPy adapter, renamed: on a machine without a GPU it runs on ``tests/fake_cupy.py``."""

    name = "cupy_control"


def control_of(cls: type) -> type:
    """The control a mutant class is compared with (the unmutated copy of its base)."""
    for base, control in ((GenericControl, GenericControl), (NumpyBackend, NumpyControl),
                          (TorchBackend, TorchControl), (JaxBackend, JaxControl), (CupyBackend, CupyControl)):
        if issubclass(cls, base):
            return control
    raise TypeError(f"{cls.__name__} has no control")


CONTROLS = (NumpyControl, GenericControl, TorchControl, JaxControl, CupyControl)


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


@mutant("numpy", "import_dlpack tags every buffer cpu:0, whatever device was asked for",
        ["test_import_dlpack_lands_on_the_requested_device"])
class NumpyImportOnHost(NumpyBackend):
    name = "numpy_import_on_host"

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        return _tag(np.from_dlpack(obj), _HOST)


@mutant("numpy", "export_dlpack exports a copy, so nothing is shared",
        ["test_convert_shares_memory_wherever_both_sides_can"])
class NumpyExportCopies(NumpyBackend):
    name = "numpy_export_copies"

    def export_dlpack(self, x: Any) -> Any:
        return np.array(_plain(x), copy=True)


@mutant("numpy", "capabilities claim dlpack=False (its arrays still export)", ["test_dlpack_flag_matches_behaviour"])
class NumpyClaimsNoDlpack(NumpyBackend):
    name = "numpy_claims_no_dlpack"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, dlpack=False)


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


class _NumpyNativeRefused(NumpyBackend, SupportsNativeCollectives):
    """The NumPy adapter declaring SupportsNativeCollectives with a native_allreduce that refuses, as
    an adapter does where its native path does not exist here (an empty native_collectives flag):
    the registry loads it, so a flag claimed wrongly on top of it reaches the suite."""

    name = "numpy_native_refused"

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        raise CapabilityError("numpy backend has no native allreduce")


@mutant("numpy", "capabilities claim a native allreduce it does not have (its native_allreduce refuses)",
        ["test_native_allreduce_flag_matches_behaviour"])
class NumpyClaimsNative(_NumpyNativeRefused):
    name = "numpy_claims_native"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, native_collectives=frozenset({"allreduce"}))


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


# == generic pieces (BaseBackend's defaults) ======================================================
@mutant("generic", "BaseBackend.shape_of gives a list", ["test_shape_of_gives_a_tuple_of_ints"])
class GenericShapeOfList(GenericControl):
    name = "generic_shape_of_list"

    def shape_of(self, x: Any) -> tuple[int, ...]:
        return list(x.shape)  # type: ignore[return-value]


@mutant("generic", "ArrayApiDLPack.import_dlpack without its placement check (a view of cpu:0 for any device)",
        ["test_import_dlpack_lands_on_the_requested_device"])
class GenericImportNoPlacementCheck(GenericControl):
    name = "generic_import_unchecked"

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        return np.from_dlpack(obj)


@mutant("generic", "a native_allreduce declared beside an empty native_collectives flag hands back its inputs",
        ["test_native_allreduce_flag_matches_behaviour"])
class GenericNativeReturnsInputs(GenericControl, SupportsNativeCollectives):
    name = "generic_native_inputs"

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return list(xs)


@mutant("generic", "start_move gives no waiter, even on an asynchronous backend (JAX)",
        ["test_reads_and_transfers_wait_for_queued_work"])
class GenericStartMoveNoWaiter(JaxBackend):
    name = "generic_start_move_no_wait"

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        return self.move(x, device), None


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


@mutant("generic", "TrainingDefaults.sgd_update multiplies by a NumPy float64 learning rate, promoting float16 and "
        "float32 parameters (to float32 on JAX without x64, to float64 with it)",
        ["test_sgd_update_keeps_every_parameters_dtype_and_device"])
class GenericSgdPromotes(JaxBackend):
    name = "generic_sgd_promotes"

    def sgd_update(self, params: Sequence[Any], grads: Sequence[Any], lr: float) -> list[Any]:
        return [p - g * np.float64(lr) for p, g in zip(params, grads)]


# == torch ===========================================================================================
@mutant("torch", "copy turns float64 into float32", ["test_copy_keeps_every_dtype"])
class TorchCopyDowncasts(TorchBackend):
    name = "torch_copy_downcasts"

    def copy(self, x: Any, device: Device) -> Any:
        dt = self._torch.float32 if x.dtype == self._torch.float64 else x.dtype
        return x.to(self.to_native_device(device), dtype=dt, copy=True)


@mutant("torch", "asarray shares a NumPy array's memory (torch.from_numpy)", ["test_asarray_never_shares"])
class TorchAsarrayShares(TorchBackend):
    name = "torch_asarray_shares"

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        if isinstance(obj, np.ndarray) and obj.dtype.name != "bfloat16" and device == _HOST:
            t = self._torch.from_numpy(obj)
            return t if dtype is None else t.to(self.to_native_dtype(dtype))
        return super().asarray(obj, dtype, device)


@mutant("torch", "to_numpy gives a Python scalar for a 0-d tensor (x.item())", ["test_to_numpy_gives_an_exact_ndarray"])
class TorchToNumpyItem(TorchBackend):
    name = "torch_to_numpy_item"

    def to_numpy(self, x: Any) -> Any:
        return x.item() if x.ndim == 0 else super().to_numpy(x)


@mutant("torch", "dtype_of maps bfloat16 to float16", ["test_creation_honours_device_and_dtype"])
class TorchDtypeOfBf16(TorchBackend):
    name = "torch_dtype_of_bf16"

    def dtype_of(self, x: Any) -> str:
        return "float16" if x.dtype == self._torch.bfloat16 else super().dtype_of(x)


@mutant("torch", "combine's table maps prod to torch.add", ["test_combine_matches_numpy"])
class TorchCombineProdAdds(TorchBackend):
    name = "torch_combine_prod_adds"

    def combine(self, op: str, a: Any, b: Any) -> Any:
        return super().combine("sum" if op == "prod" else op, a, b)


@mutant("torch", "divide computes half precision in float32 and returns float32",
        ["test_divide_keeps_the_floating_dtype"])
class TorchDivideUpcasts(TorchBackend):
    name = "torch_divide_upcasts"

    def divide(self, x: Any, n: int) -> Any:
        if x.dtype in (self._torch.float16, self._torch.bfloat16):
            return x.float() / n
        return super().divide(x, n)


@mutant("torch", "export_dlpack exports a clone", ["test_convert_shares_memory_wherever_both_sides_can"])
class TorchExportClones(TorchBackend):
    name = "torch_export_clones"

    def export_dlpack(self, x: Any) -> Any:
        return super().export_dlpack(x).clone()


@mutant("torch", "capabilities claim dlpack=False (tensors still export)", ["test_dlpack_flag_matches_behaviour"])
class TorchClaimsNoDlpack(TorchBackend):
    name = "torch_claims_no_dlpack"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, dlpack=False)


@mutant("torch", "capabilities leave out bfloat16, which it holds", ["test_dtypes_flag_matches_behaviour"])
class TorchHidesBf16(TorchBackend):
    name = "torch_hides_bf16"

    @property
    def capabilities(self) -> Any:
        c = super().capabilities
        return dataclasses.replace(c, dtypes=c.dtypes - {"bfloat16"})


@mutant("torch", "capabilities claim mutable=False (assign still writes)", ["test_mutable_flag_matches_behaviour"])
class TorchClaimsImmutable(TorchBackend):
    name = "torch_claims_immutable"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, mutable=False)


@mutant("torch", "split cuts equal chunks (torch.chunk), ignoring the sizes", ["test_reshape_concat_split"])
class TorchSplitChunks(TorchBackend):
    name = "torch_split_chunks"

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        return list(self._torch.chunk(x, len(sizes), dim=axis))


@mutant("torch", "concat always joins along axis 0", ["test_reshape_concat_split"])
class TorchConcatAxis0(TorchBackend):
    name = "torch_concat_axis0"

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        return super().concat(xs, 0)


@mutant("torch", "rand ignores its seed", ["test_rand_uniform_and_seeded"])
class TorchRandUnseeded(TorchBackend):
    name = "torch_rand_unseeded"

    def rand(self, shape: tuple[int, ...], dtype: str, device: Device, seed: int | None) -> Any:
        return super().rand(shape, dtype, device, None)


@mutant("torch", "parameter_like left at the default: a replica of a leaf that requires grad is a copy in its graph "
        "(a non-leaf whose .grad stays None)", ["test_replicas_are_trainable_in_the_frameworks_idiom"])
class TorchParameterLikeDefault(TorchBackend):
    name = "torch_parameter_like_default"

    def parameter_like(self, src: Any, y: Any) -> Any:
        return y


@mutant("torch", "value_and_grad reduces a tensor loss with mean(): the value and gradients of the mean, not the sum",
        ["test_value_and_grad_of_a_known_function"])
class TorchGradOfMean(TorchBackend):
    name = "torch_grad_of_mean"

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        torch = self._torch
        ps = [p.detach().requires_grad_(True) for p in params]
        with torch.enable_grad():
            out = fn(ps, *args)
            total = out if out.ndim == 0 else out.mean()
            gs = torch.autograd.grad(total, ps, allow_unused=True)
        return total.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(ps, gs)]


@mutant("torch", "torch.jit.trace accepted although tracing froze a data-dependent branch (its TracerWarning ignored)",
        ["test_compiled_function_follows_a_data_dependent_branch"])
class TorchTraceIgnoresWarning(TorchBackend):
    name = "torch_trace_ignores_warning"

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        import warnings

        torch = self._torch
        if route == "eager":
            return fn
        if route.startswith("torch.compile"):
            return torch.compile(fn, mode=route.partition(":")[2] or None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out = torch.jit.script(fn) if route == "torch.jit.script" else torch.jit.trace(fn, args)
            except Exception as e:
                raise CapabilityError(f"torch backend: {route} cannot compile this function: {e}") from e
        return out


class _StreamlessProducer:
    """A CUDA tensor's DLPack producer that drops the consumer's stream (``stream=-1``: no ordering)."""

    def __init__(self, t: Any) -> None:
        self._t = t

    def __dlpack__(self, *args: Any, stream: Any = None, **kwargs: Any) -> Any:
        return self._t.__dlpack__(stream=-1, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._t.__dlpack_device__()


@mutant("torch", "export_dlpack drops the consumer's stream (the DLPack stream hand-off), while dlpack_streams lets "
        "convert skip its host wait", ["test_convert_on_a_gpu_is_ordered_after_the_producers_kernels"], gpus=1,
        why_gpu="the stream hand-off orders CUDA streams: a CPU buffer has none; on a GPU the consumer's next "
        "kernel (JAX's stream) reads the tensor before torch's kernels wrote it "
        "(test_convert_on_a_gpu_is_ordered_after_the_producers_kernels[torch-jax-to partner])")
class TorchDLPackDropsStream(TorchBackend):
    name = "torch_dlpack_drops_stream"

    def export_dlpack(self, x: Any) -> Any:
        t = super().export_dlpack(x)
        return _StreamlessProducer(x.detach()) if x.device.type == "cuda" else t


_ONE_CPU = "torch has a single CPU device, so without a GPU "


@mutant("torch", "synchronize does nothing", ["test_synchronize_waits_for_queued_work"], gpus=1,
        why_gpu=_ONE_CPU + "nothing is asynchronous; on a GPU the CUDA stream is still busy after the call "
        "(test_synchronize_waits_for_queued_work)")
class TorchSynchronizeNoop(TorchBackend):
    name = "torch_synchronize_noop"

    def synchronize(self, device: Device | None) -> None:
        return None


@mutant("torch", "device_wait_fn (md.synchronize(device)'s shortcut) gives a function that does nothing",
        ["test_synchronize_waits_for_queued_work"], gpus=1,
        why_gpu=_ONE_CPU + "torch's device_wait_fn is None on a CPU (nothing to wait for); on a GPU "
        "md.synchronize(device, backend=) returns with the CUDA stream still busy "
        "(test_synchronize_waits_for_queued_work[md.synchronize(device)])")
class TorchDeviceWaitNoop(TorchBackend):
    name = "torch_device_wait_noop"

    def device_wait_fn(self, device: Device) -> Callable[[], Any] | None:
        return lambda: None


@mutant("torch", "start_move gives no waiter for CUDA copies", ["test_reads_and_transfers_wait_for_queued_work"],
        gpus=1, why_gpu="no CUDA copy exists on a CPU; on a GPU the pinned host buffer is read before the "
        "device-to-host copy lands (test_reads_and_transfers_wait_for_queued_work)")
class TorchStartMoveNoWaiter(TorchBackend):
    name = "torch_start_move_no_wait"

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        y, _ = super().start_move(x, device)
        return y, None


@mutant("torch", "to_numpy of a CUDA tensor copies non-blocking and does not wait",
        ["test_reads_and_transfers_wait_for_queued_work"], gpus=1,
        why_gpu="a CPU tensor's to_numpy is synchronous; on a GPU the host array is read before the copy lands "
        "(test_reads_and_transfers_wait_for_queued_work)")
class TorchToNumpyNoWait(TorchBackend):
    name = "torch_to_numpy_no_wait"

    def to_numpy(self, x: Any) -> Any:
        if x.device.type == "cuda" and x.dtype != self._torch.bfloat16:
            return x.detach().to("cpu", non_blocking=True).numpy()
        return super().to_numpy(x)


@mutant("torch", "capabilities claim pinned_memory=False (device-to-host moves are pinned)",
        ["test_pinned_memory_flag_matches_behaviour"], gpus=1,
        why_gpu="pinned memory exists only with a GPU (test_pinned_memory_flag_matches_behaviour)")
class TorchClaimsUnpinned(TorchBackend):
    name = "torch_claims_unpinned"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, pinned_memory=False)


@mutant("torch", "capabilities claim async_execution=False (CUDA work is queued)",
        ["test_async_execution_flag_matches_behaviour"], gpus=1,
        why_gpu="torch runs CPU work synchronously; on a GPU queued work is seen running after the call "
        "returns (test_async_execution_flag_matches_behaviour)")
class TorchClaimsSynchronous(TorchBackend):
    name = "torch_claims_sync"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, async_execution=False)


@mutant("torch", "native_allreduce returns the results in ascending device order, not input order",
        ["test_allreduce_device_order", "test_native_allreduce_every_op_and_dtype"], gpus=2,
        why_gpu="torch declares its NCCL allreduce only with 2 or more GPUs (test_allreduce_device_order[native], "
        "test_native_allreduce_every_op_and_dtype: inputs in reversed order)")
class TorchNativeSorted(TorchBackend):
    name = "torch_native_sorted"

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return sorted(super().native_allreduce(xs, op), key=lambda y: y.device.index)


@mutant("torch", "native_allreduce's NCCL op table swaps prod and max", ["test_native_allreduce_every_op_and_dtype"],
        gpus=2, why_gpu="needs the NCCL path, which takes 2 or more GPUs (test_native_allreduce_every_op_and_dtype)")
class TorchNativeOpTable(TorchBackend):
    name = "torch_native_op_table"

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return super().native_allreduce(xs, {"prod": "max", "max": "prod"}.get(op, op))


@mutant("torch", "device_of reports gpu:0 for every CUDA tensor", ["test_move_keeps_values", "test_allreduce_matches"],
        gpus=2, why_gpu="needs a second GPU to tell gpu:0 from gpu:1 (test_move_keeps_values)")
class TorchDeviceOfFirstGpu(TorchBackend):
    name = "torch_device_of_gpu0"

    def device_of(self, x: Any) -> Device:
        d = super().device_of(x)
        return Device("gpu", 0) if d.kind == "gpu" else d


# == JAX =============================================================================================
@mutant("jax", "copy turns float16 and bfloat16 into float32", ["test_copy_keeps_every_dtype"])
class JaxCopyUpcasts(JaxBackend):
    name = "jax_copy_upcasts"

    def copy(self, x: Any, device: Device) -> Any:
        if x.dtype.name in ("float16", "bfloat16"):
            x = x.astype(self._jnp.float32)
        return super().copy(x, device)


@mutant("jax", "copy uses device_put, which returns x itself on x's device", ["test_copy_is_a_new_buffer"])
class JaxCopyAliases(JaxBackend):
    name = "jax_copy_aliases"

    def copy(self, x: Any, device: Device) -> Any:
        return self._jax.device_put(x, self.to_native_device(device))


@mutant("jax", "asarray device_puts the caller's NumPy array (XLA aliases aligned host buffers)",
        ["test_asarray_never_shares"])
class JaxAsarrayShares(JaxBackend):
    name = "jax_asarray_shares"

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        if isinstance(obj, np.ndarray) and (dtype is None or dtype == obj.dtype.name):
            return self._jax.device_put(obj, self.to_native_device(device))
        return super().asarray(obj, dtype, device)


@mutant("jax", "to_numpy gives a Python scalar for a 0-d array (x.item())", ["test_to_numpy_gives_an_exact_ndarray"])
class JaxToNumpyItem(JaxBackend):
    name = "jax_to_numpy_item"

    def to_numpy(self, x: Any) -> Any:
        return x.item() if x.ndim == 0 else super().to_numpy(x)


@mutant("jax", "synchronize does nothing (JAX dispatches asynchronously, on CPUs too)",
        ["test_synchronize_waits_for_queued_work", "test_synchronize_raises_asynchronous_errors"])
class JaxSynchronizeNoop(JaxBackend):
    name = "jax_synchronize_noop"

    def synchronize(self, device: Device | None) -> None:
        return None


@mutant("jax", "synchronize waits but swallows the asynchronous error it meets",
        ["test_synchronize_raises_asynchronous_errors"])
class JaxSynchronizeSwallows(JaxBackend):
    name = "jax_synchronize_swallows"

    def synchronize(self, device: Device | None) -> None:
        try:
            super().synchronize(device)
        except Exception:  # noqa: BLE001 - the defect
            pass


@mutant("jax", "native_allreduce returns the results in ascending device order, not input order",
        ["test_allreduce_device_order", "test_native_allreduce_every_op_and_dtype"])
class JaxNativeSorted(JaxBackend):
    name = "jax_native_sorted"

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return sorted(super().native_allreduce(xs, op), key=lambda y: self.device_of(y))


@mutant("jax", "native_allreduce computes prod with psum", ["test_native_allreduce_every_op_and_dtype"])
class JaxNativeProdSums(JaxBackend):
    name = "jax_native_prod_sums"

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return super().native_allreduce(xs, "sum" if op == "prod" else op)


@mutant("jax", "native_allreduce takes mean and returns the sum", ["test_native_allreduce_mean_is_the_mean"])
class JaxNativeMeanSums(JaxBackend):
    name = "jax_native_mean_sums"

    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return super().native_allreduce(xs, "sum" if op == "mean" else op)


@mutant("jax", "import_dlpack leaves a host buffer on cpu:0 (no relabelling, no placement check)",
        ["test_import_dlpack_lands_on_the_requested_device"])
class JaxImportOnHost(JaxBackend):
    name = "jax_import_on_host"

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        return self._jax.dlpack.from_dlpack(obj)


@mutant("jax", "import_dlpack places its own arrays but leaves other frameworks' host buffers on cpu:0",
        ["test_import_dlpack_from_partner_lands_on_the_requested_device"])
class JaxImportForeignOnHost(JaxBackend):
    name = "jax_import_foreign_on_host"

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        if isinstance(obj, self._jax.Array):
            return super().import_dlpack(obj, device)
        return self._jax.dlpack.from_dlpack(obj)


@mutant("jax", "import_dlpack copies through NumPy", ["test_convert_shares_memory_wherever_both_sides_can"])
class JaxImportCopies(JaxBackend):
    name = "jax_import_copies"

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        if device.kind != "cpu":
            return super().import_dlpack(obj, device)
        return self._jax.device_put(np.array(np.from_dlpack(obj)), self.to_native_device(device))


@mutant("jax", "capabilities claim async_execution=False", ["test_async_execution_flag_matches_behaviour"])
class JaxClaimsSynchronous(JaxBackend):
    name = "jax_claims_sync"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, async_execution=False)


@mutant("jax", "capabilities list no native allreduce (it works)", ["test_native_allreduce_flag_matches_behaviour"])
class JaxHidesNative(JaxBackend):
    name = "jax_hides_native"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, native_collectives=frozenset())


@mutant("jax", "capabilities claim mutable=True", ["test_mutable_flag_matches_behaviour"])
class JaxClaimsMutable(JaxBackend):
    name = "jax_claims_mutable"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, mutable=True)


@mutant("jax", "divide by a float32 scalar turns float16 and bfloat16 into float32",
        ["test_divide_keeps_the_floating_dtype"])
class JaxDividePromotes(JaxBackend):
    name = "jax_divide_promotes"

    def divide(self, x: Any, n: int) -> Any:
        return x / np.float32(n)


@mutant("jax", "full leaves the array uncommitted on JAX's default device", ["test_creation_honours_device_and_dtype"])
class JaxFullDefaultDevice(JaxBackend):
    name = "jax_full_default_device"

    def full(self, shape: tuple[int, ...], value: Any, dtype: str, device: Device) -> Any:
        return self._jnp.full(shape, value, dtype=self.to_native_dtype(dtype))


@mutant("jax", "split cuts equal pieces (jnp.array_split), ignoring the sizes", ["test_reshape_concat_split"])
class JaxSplitEqual(JaxBackend):
    name = "jax_split_equal"

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        return list(self._jnp.array_split(x, len(sizes), axis=axis))


@mutant("jax", "combine raises CapabilityError for 8-bit integers", ["test_combine_matches_numpy"])
class JaxCombineRefusesInt8(JaxBackend):
    name = "jax_combine_refuses_int8"

    def combine(self, op: str, a: Any, b: Any) -> Any:
        if a.dtype.itemsize == 1 and a.dtype.kind in "iu":
            raise CapabilityError("jax backend: no 8-bit combine")
        return super().combine(op, a, b)


@mutant("jax", "value_and_grad caches its jitted gradient by the loss function's __name__ (every lambda shares one)",
        ["test_two_losses_give_their_own_gradients"])
class JaxGradCachedByName(JaxBackend):
    name = "jax_grad_cached_by_name"

    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        jax, jnp = self._jax, self._jnp
        cache = self.__dict__.setdefault("_by_name", {})
        key = getattr(fn, "__name__", None)
        vg = cache.get(key)
        if vg is None:
            vg = cache[key] = jax.jit(jax.value_and_grad(lambda ps, *a: jnp.sum(fn(list(ps), *a))))
        value, grads = vg(list(params), *args)
        return value, list(grads)


@mutant("jax", "compile's jax.jit donates its first argument (donate_argnums=0): the caller's input is deleted",
        ["test_compiled_function_leaves_its_inputs_readable_and_unchanged"])
class JaxCompileDonates(JaxBackend):
    name = "jax_compile_donates"

    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        if route == "eager":
            return fn
        jitted = self._jax.jit(fn, donate_argnums=0)
        try:
            jitted.lower(*args)
        except TypeError as e:
            raise CapabilityError(f"jax backend: jax.jit cannot trace this function: {e}") from e
        return jitted


@mutant("jax", "import_dlpack accepts JAX's silent copy of a host buffer that is not 64-byte aligned "
        "(no check of the imported address)", ["test_convert_copy_false_never_copies"])
class JaxImportAcceptsCopy(JaxBackend):
    name = "jax_import_accepts_copy"

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        jax = self._jax
        x64 = bool(jax.config.jax_enable_x64)
        if not x64 and type(obj).__name__ != "PyCapsule":
            try:
                src = canonical_dtype(obj.dtype)
            except Exception:  # noqa: BLE001
                src = None
            if src in X64_DTYPES:
                raise CapabilityError(f"jax backend: cannot import a {src} tensor without x64; {x64_hint(src)}")
        native = self.to_native_device(device)
        if device.kind != "cpu" and not self._strides_read_as_row_major and hasattr(obj, "__dlpack__"):
            return self._import_accelerator(obj, device)
        cpu_id = getattr(native, "local_hardware_id", None) if device.kind == "cpu" else None
        prod = _Producer(obj, cpu_id, inspect=device.kind == "cpu" or self._strides_read_as_row_major)
        if not x64 and prod.code_bits in _DL_X64:
            raise CapabilityError(f"jax backend: cannot import a 64-bit DLPack tensor without x64; {x64_hint()}")
        try:
            y = jax.dlpack.from_dlpack(prod)
        except (TypeError, ValueError, BufferError, RuntimeError) as e:
            raise CapabilityError(f"jax backend cannot import this DLPack tensor: {e}") from e
        if not prod.row_major:
            raise CapabilityError("jax backend: JAX shares only row-major DLPack buffers")
        if self.device_of(y) != device:
            raise CapabilityError(f"jax backend: a DLPack buffer of {device} arrived on {self.device_of(y)}")
        return y


@mutant("jax", "synchronize waits for the live arrays only (as before issue 21): work whose results were dropped is "
        "still queued when it returns", ["test_synchronize_waits_for_work_whose_results_were_dropped"])
class JaxSynchronizeLiveOnly(JaxBackend):
    name = "jax_synchronize_live_only"

    def synchronize(self, device: Device | None) -> None:
        jax = self._jax
        platforms = sorted({self.to_native_device(d).platform for d in self.devices()})
        target = None if device is None else self.to_native_device(device)
        if device is None:
            jax.effects_barrier()
        arrays = [a for p in platforms for a in jax.live_arrays(p)
                  if target is None or target in a.sharding.device_set]
        jax.block_until_ready(arrays)


# == CuPy (on tests/fake_cupy.py without a GPU) =======================================================
@mutant("cupy", "staged uploads write every chunk at offset 0 of the destination (shows from the staging threshold "
        "up, 32 MiB by default)", ["test_staged_transfers_are_exact"])
class CupyStagedAtOffsetZero(CupyBackend):
    name = "cupy_staged_at_offset_zero"

    def _upload(self, a: np.ndarray, device: Device) -> Any:
        cp = self._cp
        with self._gpu(device):
            if (a.nbytes < self.staging.threshold or not a.flags.c_contiguous or a.ndim == 0
                    or a.dtype.kind not in "biufc"):
                return cp.array(a if a.flags.c_contiguous else a.copy(order="C"), copy=True)
            out = cp.empty(a.shape, dtype=a.dtype)
            dst = out.reshape(-1).view(np.uint8)
            stream = cp.cuda.get_current_stream()

            def alloc(n: int) -> tuple[Any, np.ndarray]:
                buf = self._cpx.empty_pinned((n,), dtype=np.uint8)
                return buf, buf

            def submit(buf: Any, n: int, off: int) -> Any:
                dst[0:n].set(buf[:n], stream=stream)  # the defect: the offset is lost
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(stream)
                return ev

            staged_upload(a, alloc, submit, lambda ev: ev.synchronize(), self.staging)
            stream.synchronize()
        return out


@mutant("cupy", "start_move to a GPU does not keep its pinned snapshot alive until the copy lands (the pool hands "
        "it to the next upload)", ["test_nonblocking_moves_survive_their_dropped_sources"], gpus=1,
        why_gpu="the stand-in copies synchronously, so nothing is in flight without a GPU; on one, four uploads "
        "queued behind work land as [4, 4, 4, 4] (test_nonblocking_moves_survive_their_dropped_sources)")
class CupyUploadDropsSnapshot(CupyBackend):
    name = "cupy_upload_drops_snapshot"

    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        if self._is_gpu(x) or device.kind == "cpu" or x.size == 0:
            return super().start_move(x, device)
        a = np.asarray(x).view(np.ndarray)
        pin = self._cpx.empty_pinned(a.shape, dtype=x.dtype)
        np.copyto(pin, a)
        with self._gpu(device):
            y = self._cp.empty(a.shape, dtype=x.dtype)
            y.set(pin)
            done = self._cp.cuda.Event(disable_timing=True)
            done.record()
        return y, done.synchronize  # the defect: pin goes back to the pool while the copy is queued


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


def _install_engine_mutant() -> None:
    """Put the engine class ``$MULTIDEV_ENGINE_MUTANT`` names in place of its engine (this module
    is imported by the suite run and, through ``--import mutants``, by every worker)."""
    wanted = os.environ.get(ENGINE_MUTANT_ENV)
    if not wanted:
        return
    found = [c for c in [m.cls for m in ENGINE_CATALOGUE] + list(ENGINE_CONTROLS) if c.__name__ == wanted]
    if not found:
        raise RuntimeError(f"${ENGINE_MUTANT_ENV}={wanted}: no such engine mutant or control in tests/mutants.py")
    register_engine(found[0].name, found[0], replace=True)


_install_engine_mutant()


# == not a catalogue entry: a framework that aborts the interpreter =============================
class NumpyImportAborts(NumpyBackend):
    """Aborts the interpreter when given a buffer, as TensorFlow does on an unaligned one (``Check
    failed: IsAligned()``): the suite must fail those checks and still write its matrix."""

    name = "numpy_import_aborts"

    def import_dlpack(self, obj: Any, device: Device) -> Any:
        os.abort()


# == the catalogue run: selections and stop-at-first-failure (this module as a pytest plugin) =====
_BY_NAME = {m.name: m for m in CATALOGUE}
#: Each control runs every check any of its mutants is selected for.
_UNIONS = {c.name: tuple(sorted({s for m in CATALOGUE if control_of(m.cls) is c for s in m.select})) for c in CONTROLS}
_failed: set[str] = set()


def _backend_of(item: pytest.Item) -> str | None:
    cs = getattr(item, "callspec", None)
    return None if cs is None else cs.params.get("md_backend_name")


def _wanted(item: pytest.Item) -> bool:
    name = _backend_of(item)
    if name in _BY_NAME:
        return any(s in item.nodeid for s in _BY_NAME[name].select)
    if name in _UNIONS:
        return any(s in item.nodeid for s in _UNIONS[name]) and not _other_dtype(item.nodeid)
    return True


#: The dtypes a control runs the dtype-parametrized checks in (a renaming artifact does not depend
#: on the dtype; the full conformance run covers every dtype of the real adapters).
_CONTROL_DTYPES = ("bool", "int8", "float16", "float32")


def _other_dtype(nodeid: str) -> bool:
    params = nodeid.rsplit("[", 1)[-1].rstrip("]").split("-")
    return any(p in DTYPES and p not in _CONTROL_DTYPES for p in params)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("MULTIDEV_CATALOGUE_SELECT") != "1":
        return
    drop = [it for it in items if not _wanted(it)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [it for it in items if _wanted(it)]


def pytest_runtest_setup(item: pytest.Item) -> None:
    name = _backend_of(item)
    if os.environ.get("MULTIDEV_CATALOGUE_SELECT") == "1" and name in _failed:
        pytest.skip(f"mutant {name} already failed a check (the catalogue stops at the first failure)")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        for name in _BY_NAME:
            if f"[{name}-" in report.nodeid or f"[{name}]" in report.nodeid:
                _failed.add(name)


# == models and scopes (SupportsModels, SupportsDeviceScope) ======================================
@mutant("jax", "model_kind claims every pytree node, Python's named tuples and None included, as a JAX tree",
        ["test_model_kind_claims_no_tensor_and_no_plain_container"])
class JaxModelKindClaimsContainers(JaxBackend):
    name = "jax_model_kind_greedy"

    def model_kind(self, obj: Any) -> str | None:
        tu = self._jax.tree_util
        children, treedef = tu.tree_flatten(obj, is_leaf=lambda x: x is not obj)
        leaf = treedef.num_nodes == 1 and treedef.num_leaves == 1 and len(children) == 1 and children[0] is obj
        return None if leaf else "tree"


@mutant("jax", "device_scope gives a scope that changes nothing (JAX's default device stays where it was)",
        ["test_the_framework_default_device_follows_the_scope"])
class JaxDeviceScopeInert(JaxBackend):
    name = "jax_device_scope_inert"

    def device_scope(self, device: Device) -> Any:
        import contextlib

        return contextlib.nullcontext()
