"""Mutants of the torch adapter."""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from multidev.adapter import (
    CapabilityError,
    Device,
    concern,
)
from multidev.adapters.torch import TorchBackend
from multidev.adapters.torch.collectives import TorchCollectives
from multidev.adapters.torch.compile import TorchCompile
from multidev.adapters.torch.dlpack import TorchDLPack
from multidev.adapters.torch.mesh import TorchMesh
from multidev.adapters.torch.models import TorchModels
from multidev.adapters.torch.parallel import TorchParallel, TorchReplica
from multidev.adapters.torch.training import TorchTraining
from multidev.adapters.torch.transfers import TorchTransfers

from ._base import _HOST, mutant, swap_replica


# == torch ===========================================================================================
@mutant("torch", "copy turns float64 into float32", ["test_copy_keeps_every_dtype"])
class TorchCopyDowncasts(TorchBackend):
    name = "torch_copy_downcasts"

    def copy(self, x: Any, device: Device) -> Any:
        dt = self.torch.float32 if x.dtype == self.torch.float64 else x.dtype
        return x.to(self.to_native_device(device), dtype=dt, copy=True)


@mutant("torch", "asarray shares a NumPy array's memory (torch.from_numpy)", ["test_asarray_never_shares"])
class TorchAsarrayShares(TorchBackend):
    name = "torch_asarray_shares"

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        if isinstance(obj, np.ndarray) and obj.dtype.name != "bfloat16" and device == _HOST:
            t = self.torch.from_numpy(obj)
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
        return "float16" if x.dtype == self.torch.bfloat16 else super().dtype_of(x)


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
        if x.dtype in (self.torch.float16, self.torch.bfloat16):
            return x.float() / n
        return super().divide(x, n)


class _TorchExportClonesDlpack(TorchDLPack):
    def export_dlpack(self, x: Any) -> Any:
        return super().export_dlpack(x).clone()


@mutant("torch", "export_dlpack exports a clone", ["test_convert_shares_memory_wherever_both_sides_can"])
class TorchExportClones(TorchBackend):
    name = "torch_export_clones"
    dlpack = concern(_TorchExportClonesDlpack)


class _TorchClaimsNoDlpackDlpack(TorchDLPack):
    @classmethod
    def available_on(cls, core: Any) -> bool:
        return False


@mutant("torch", "its dlpack concern says it is unavailable, so b.dlpack is None (tensors still export)",
        ["test_dlpack_concern_matches_behaviour"])
class TorchClaimsNoDlpack(TorchBackend):
    name = "torch_claims_no_dlpack"
    dlpack = concern(_TorchClaimsNoDlpackDlpack)


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
        return list(self.torch.chunk(x, len(sizes), dim=axis))


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


class _TorchParameterLikeDefaultTraining(TorchTraining):
    def parameter_like(self, src: Any, y: Any) -> Any:
        return y


@mutant("torch", "parameter_like left at the default: a replica of a leaf that requires grad is a copy in its graph "
        "(a non-leaf whose .grad stays None)", ["test_replicas_are_trainable_in_the_frameworks_idiom"])
class TorchParameterLikeDefault(TorchBackend):
    name = "torch_parameter_like_default"
    training = concern(_TorchParameterLikeDefaultTraining)


class _TorchGradOfMeanTraining(TorchTraining):
    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        torch = self.core.torch
        ps = [p.detach().requires_grad_(True) for p in params]
        with torch.enable_grad():
            out = fn(ps, *args)
            total = out if out.ndim == 0 else out.mean()
            gs = torch.autograd.grad(total, ps, allow_unused=True)
        return total.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(ps, gs)]


@mutant("torch", "value_and_grad reduces a tensor loss with mean(): the value and gradients of the mean, not the sum",
        ["test_value_and_grad_of_a_known_function"])
class TorchGradOfMean(TorchBackend):
    name = "torch_grad_of_mean"
    training = concern(_TorchGradOfMeanTraining)


class _TorchTraceIgnoresWarningCompiler(TorchCompile):
    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        import warnings

        torch = self.core.torch
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


@mutant("torch", "torch.jit.trace accepted although tracing froze a data-dependent branch (its TracerWarning ignored)",
        ["test_compiled_function_follows_a_data_dependent_branch"])
class TorchTraceIgnoresWarning(TorchBackend):
    name = "torch_trace_ignores_warning"
    compiler = concern(_TorchTraceIgnoresWarningCompiler)


class _StreamlessProducer:
    """A CUDA tensor's DLPack producer that drops the consumer's stream (``stream=-1``: no ordering)."""

    def __init__(self, t: Any) -> None:
        self._t = t

    def __dlpack__(self, *args: Any, stream: Any = None, **kwargs: Any) -> Any:
        return self._t.__dlpack__(stream=-1, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._t.__dlpack_device__()


class _TorchDLPackDropsStreamDlpack(TorchDLPack):
    def export_dlpack(self, x: Any) -> Any:
        t = super().export_dlpack(x)
        return _StreamlessProducer(x.detach()) if x.device.type == "cuda" else t


@mutant("torch", "export_dlpack drops the consumer's stream (the DLPack stream hand-off), while dlpack_streams lets "
        "convert skip its host wait", ["test_convert_on_a_gpu_is_ordered_after_the_producers_kernels"], gpus=1,
        why_gpu="the stream hand-off orders CUDA streams: a CPU buffer has none; on a GPU the consumer's next "
        "kernel (JAX's stream) reads the tensor before torch's kernels wrote it "
        "(test_convert_on_a_gpu_is_ordered_after_the_producers_kernels[torch-jax-to partner])")
class TorchDLPackDropsStream(TorchBackend):
    name = "torch_dlpack_drops_stream"
    dlpack = concern(_TorchDLPackDropsStreamDlpack)


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


class _TorchStartMoveNoWaiterTransfers(TorchTransfers):
    def start_move(self, x: Any, device: Device) -> tuple[Any, Callable[[], None] | None]:
        y, _ = super().start_move(x, device)
        return y, None


@mutant("torch", "start_move gives no waiter for CUDA copies", ["test_reads_and_transfers_wait_for_queued_work"],
        gpus=1, why_gpu="no CUDA copy exists on a CPU; on a GPU the pinned host buffer is read before the "
        "device-to-host copy lands (test_reads_and_transfers_wait_for_queued_work)")
class TorchStartMoveNoWaiter(TorchBackend):
    name = "torch_start_move_no_wait"
    transfers = concern(_TorchStartMoveNoWaiterTransfers)


@mutant("torch", "to_numpy of a CUDA tensor copies non-blocking and does not wait",
        ["test_reads_and_transfers_wait_for_queued_work"], gpus=1,
        why_gpu="a CPU tensor's to_numpy is synchronous; on a GPU the host array is read before the copy lands "
        "(test_reads_and_transfers_wait_for_queued_work)")
class TorchToNumpyNoWait(TorchBackend):
    name = "torch_to_numpy_no_wait"

    def to_numpy(self, x: Any) -> Any:
        if x.device.type == "cuda" and x.dtype != self.torch.bfloat16:
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


class _TorchNativeSortedCollectives(TorchCollectives):
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return sorted(super().native_allreduce(xs, op), key=lambda y: y.device.index)


@mutant("torch", "native_allreduce returns the results in ascending device order, not input order",
        ["test_allreduce_device_order", "test_native_allreduce_every_op_and_dtype"], gpus=2,
        why_gpu="torch declares its NCCL allreduce only with 2 or more GPUs (test_allreduce_device_order[native], "
        "test_native_allreduce_every_op_and_dtype: inputs in reversed order)")
class TorchNativeSorted(TorchBackend):
    name = "torch_native_sorted"
    collectives = concern(_TorchNativeSortedCollectives)


class _TorchNativeOpTableCollectives(TorchCollectives):
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return super().native_allreduce(xs, {"prod": "max", "max": "prod"}.get(op, op))


@mutant("torch", "native_allreduce's NCCL op table swaps prod and max", ["test_native_allreduce_every_op_and_dtype"],
        gpus=2, why_gpu="needs the NCCL path, which takes 2 or more GPUs (test_native_allreduce_every_op_and_dtype)")
class TorchNativeOpTable(TorchBackend):
    name = "torch_native_op_table"
    collectives = concern(_TorchNativeOpTableCollectives)


@mutant("torch", "device_of reports gpu:0 for every CUDA tensor", ["test_move_keeps_values", "test_allreduce_matches"],
        gpus=2, why_gpu="needs a second GPU to tell gpu:0 from gpu:1 (test_move_keeps_values)")
class TorchDeviceOfFirstGpu(TorchBackend):
    name = "torch_device_of_gpu0"

    def device_of(self, x: Any) -> Device:
        d = super().device_of(x)
        return Device("gpu", 0) if d.kind == "gpu" else d




# == models (SupportsModels), compile modes: issue 35 ==================================================
class _TorchMoveModuleCopiesModels(TorchModels):
    def move_module(self, obj: Any, device: Device) -> Any:
        return copy.deepcopy(obj).to(self.core.to_native_device(device))


@mutant("torch", "move_module returns a deep copy moved there, not the same module moved in place (an optimizer built "
        "before the move updates dead tensors)", ["test_a_model_moves_in_place_and_its_optimizer_follows"])
class TorchMoveModuleCopies(TorchBackend):
    name = "torch_move_module_copies"
    models = concern(_TorchMoveModuleCopiesModels)


class _TorchCopyModuleSharesModels(TorchModels):
    def copy_module(self, obj: Any, device: Device) -> Any:
        return copy.copy(obj)


@mutant("torch", "copy_module makes a shallow copy: a new module sharing the original's Parameters and buffers",
        ["test_a_model_copy_shares_nothing_with_the_original"])
class TorchCopyModuleShares(TorchBackend):
    name = "torch_copy_module_shares"
    models = concern(_TorchCopyModuleSharesModels)


class _TorchModuleTensorsParamsOnlyModels(TorchModels):
    def module_tensors(self, obj: Any) -> list[Any]:
        return list(obj.parameters())


@mutant("torch", "module_tensors lists the parameters only: device_of a buffer-only model fails, and buffers are "
        "left out of to_host and synchronize", ["test_a_models_buffers_are_among_its_tensors"])
class TorchModuleTensorsParamsOnly(TorchBackend):
    name = "torch_module_tensors_params_only"
    models = concern(_TorchModuleTensorsParamsOnlyModels)


class _TorchModuleTensorsStateDictModels(TorchModels):
    def module_tensors(self, obj: Any) -> list[Any]:
        return list({id(t): t for t in obj.state_dict(keep_vars=True).values()}.values())


@mutant("torch", "module_tensors reads the state_dict, which leaves non-persistent buffers out",
        ["test_a_models_buffers_are_among_its_tensors"])
class TorchModuleTensorsStateDict(TorchBackend):
    name = "torch_module_tensors_state_dict"
    models = concern(_TorchModuleTensorsStateDictModels)


class _TorchModelKindBuiltinOnlyModels(TorchModels):
    def model_kind(self, obj: Any) -> str | None:
        nn = self.core.torch.nn
        return "module" if isinstance(obj, nn.Module) and type(obj).__module__.startswith("torch.nn") else None


@mutant("torch", "model_kind claims the built-in layers only (classes defined in torch.nn): a user's subclass and "
        "a scripted module are refused as 'not a tensor'", ["test_user_subclasses_and_scripted_modules_are_models"])
class TorchModelKindBuiltinOnly(TorchBackend):
    name = "torch_model_kind_builtin_only"
    models = concern(_TorchModelKindBuiltinOnlyModels)


class _TorchScriptRouteTracesCompiler(TorchCompile):
    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        return super().compile(fn, "torch.jit.trace" if route == "torch.jit.script" else route, args)


@mutant("torch", "compile's torch.jit.script route traces instead (refusing, past its TracerWarning, every function "
        "with a data-dependent branch that scripting compiles)", ["test_each_route_compiles_what_its_compiler_does"])
class TorchScriptRouteTraces(TorchBackend):
    name = "torch_script_route_traces"
    compiler = concern(_TorchScriptRouteTracesCompiler)


@mutant("torch", "copy reads a view's storage from its start, ignoring the view's offset and strides (x[::2], x.T "
        "copy other elements)", ["test_placement_calls_away_from_their_defaults"])
class TorchCopyFromStorage(TorchBackend):
    name = "torch_copy_from_storage"

    def copy(self, x: Any, device: Device) -> Any:
        torch = self.torch
        if x.is_contiguous() and x.storage_offset() == 0:
            return super().copy(x, device)
        flat = torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage(), 0, (x.numel(),))
        return super().copy(flat.reshape(x.shape), device)


# == torch data parallelism (the replica of data_parallel_replica) ==================================
class _TorchReplicaLoadNoop(TorchReplica):
    """``load`` (what the broadcast of rank 0's state writes) does nothing."""

    def load(self, params: Sequence[Any] | None, buffers: Sequence[Any] | None) -> None:
        return None


class _TorchDataParallelLoadNoopParallel(TorchParallel):
    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        return swap_replica(super().data_parallel_replica(model, optimizer, devices), _TorchReplicaLoadNoop)


@mutant("torch", "the data-parallel replica's load (the initial broadcast of rank 0's parameters, broadcast_state) "
        "is a no-op: every rank keeps its own start",
        ["test_data_parallel_load_reaches_every_device", "test_data_parallel_across_processes_starts_from_rank_0"],
        replica=_TorchReplicaLoadNoop, multiprocess=True)
class TorchDataParallelLoadNoop(TorchBackend):
    name = "torch_dp_load_noop"
    parallel = concern(_TorchDataParallelLoadNoopParallel)


class _TorchReplicaUnscaled(TorchReplica):
    """The averaged buckets come back unscaled: the gradients are the ranks' sum, not their mean."""

    def unflatten(self, flat: Any, like: Sequence[Any], scale: float | None) -> list[Any]:
        return super().unflatten(flat, like, None)


class _TorchDataParallelUnscaledParallel(TorchParallel):
    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        return swap_replica(super().data_parallel_replica(model, optimizer, devices), _TorchReplicaUnscaled)


@mutant("torch", "data parallelism across processes forgets the 1/world_size of the gradient average (the bucket's "
        "unflatten ignores its scale): every step takes the ranks' summed gradient",
        ["test_data_parallel_across_processes_averages_gradients"], replica=_TorchReplicaUnscaled, multiprocess=True)
class TorchDataParallelUnscaled(TorchBackend):
    name = "torch_dp_unscaled"
    parallel = concern(_TorchDataParallelUnscaledParallel)


class _TorchReplicaKeepsOptimizerState(TorchReplica):
    """Rank 0's optimizer state is received but never loaded: each rank keeps its own momentum."""

    def load_optimizer_state(self, state: Any) -> None:
        return None


class _TorchDataParallelOptimizerStateKeptParallel(TorchParallel):
    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        return swap_replica(super().data_parallel_replica(model, optimizer, devices),
                            _TorchReplicaKeepsOptimizerState)


@mutant("torch", "data parallelism across processes broadcasts rank 0's optimizer state but never loads it: a rank "
        "that stepped before keeps its own momentum, and the ranks' parameters drift apart",
        ["test_data_parallel_across_processes_keeps_ranks_bitwise_equal"], replica=_TorchReplicaKeepsOptimizerState,
        multiprocess=True)
class TorchDataParallelOptimizerStateKept(TorchBackend):
    name = "torch_dp_opt_state_kept"
    parallel = concern(_TorchDataParallelOptimizerStateKeptParallel)


class _TorchReplicaDropsLastBucket(TorchReplica):
    """The last bucket of several (the one holding the first parameter: buckets are planned last
    layer first) is left out when unflattening: its gradients stay this rank's own."""

    def unflatten(self, flat: Any, like: Sequence[Any], scale: float | None) -> list[Any]:
        if len(like) < len(self._params) and any(t is self._params[0] for t in like):
            return [t.grad for t in like]
        return super().unflatten(flat, like, scale)


class _TorchDataParallelDropsLastBucketParallel(TorchParallel):
    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        return swap_replica(super().data_parallel_replica(model, optimizer, devices), _TorchReplicaDropsLastBucket)

@mutant("torch", "data parallelism across processes leaves the last of several gradient buckets out when unflattening: "
        "its parameters step with this rank's own gradient (one bucket, the default for a small model, is right)",
        ["test_data_parallel_across_processes_averages_every_bucket"], replica=_TorchReplicaDropsLastBucket,
        multiprocess=True)
class TorchDataParallelDropsLastBucket(TorchBackend):
    name = "torch_dp_drops_last_bucket"
    parallel = concern(_TorchDataParallelDropsLastBucketParallel)


class _TorchReplicaHooksIgnoreNoSync(TorchReplica):
    """The gradient hooks do not look at ``sync.active``: inside ``no_sync()`` every backward pass
    starts the buckets' collectives and averages the gradients anyway."""

    def attach(self, sync: Any) -> bool:
        torch = self.torch
        queued = [False]

        def finish() -> None:
            queued[0] = False
            for p, g in zip(self._params, sync.finish()):
                p.grad = g

        def hook_for(i: int) -> Callable[[Any], None]:
            def hook(p: Any) -> None:
                if not queued[0]:
                    queued[0] = True
                    torch.autograd.Variable._execution_engine.queue_callback(finish)
                sync.ready(i, p.grad)
            return hook

        def before(module: Any, args: Any) -> None:
            if module.training and torch.is_grad_enabled():
                sync.before_forward()

        self._handles = [p.register_post_accumulate_grad_hook(hook_for(i)) for i, p in enumerate(self._params)]
        self._handles.append(self.model.register_forward_pre_hook(before))
        return True


class _TorchDataParallelNoSyncCommunicatesParallel(TorchParallel):
    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        return swap_replica(super().data_parallel_replica(model, optimizer, devices), _TorchReplicaHooksIgnoreNoSync)

@mutant("torch", "gradient accumulation communicates anyway: the gradient hooks ignore no_sync(), so every micro-batch's "
        "backward pass starts the buckets' collectives (the averaged sum comes out the same for a linear model: only "
        "the collective count shows it)",
        ["test_data_parallel_across_processes_no_sync_does_not_communicate"], replica=_TorchReplicaHooksIgnoreNoSync,
        multiprocess=True)
class TorchDataParallelNoSyncCommunicates(TorchBackend):
    name = "torch_dp_no_sync_communicates"
    parallel = concern(_TorchDataParallelNoSyncCommunicatesParallel)


class _TorchDTensorAxesReversedMesh(TorchMesh):
    def process_sharding(self, layout: Any, shape: tuple[int, ...], engine: str, rank: int) -> Any:
        found = TorchMesh.process_sharding(self, layout, shape, engine, rank)
        return None if found is None else (found[0], tuple(reversed(found[1])))


@mutant("torch", "a layout across the torch engine's processes becomes a DTensor whose placements run over the "
        "DeviceMesh's dimensions in reverse: each rank holds the piece of another mesh axis's cut",
        ["test_collectives_across_processes and 2procs-torch]"], multiprocess=True)
class TorchDTensorAxesReversed(TorchBackend):
    name = "torch_dtensor_axes_reversed"
    mesh = concern(_TorchDTensorAxesReversedMesh)
