"""Mutants of the JAX adapter."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from multidev.adapter import (
    CapabilityError,
    Device,
    Ready,
    canonical_dtype,
    concern,
)
from multidev.adapters.jax import JaxBackend
from multidev.adapters.jax._common import X64_DTYPES, x64_hint
from multidev.adapters.jax.collectives import JaxCollectives
from multidev.adapters.jax.compile import JaxCompile
from multidev.adapters.jax.dlpack import _DL_X64, JaxDLPack, _Producer
from multidev.adapters.jax.models import JaxModels
from multidev.adapters.jax.parallel import JaxParallel, JaxReplica
from multidev.adapters.jax.scope import JaxScope
from multidev.adapters.jax.training import JaxTraining

from ._base import mutant, swap_replica


# == JAX =============================================================================================
@mutant("jax", "copy turns float16 and bfloat16 into float32", ["test_copy_keeps_every_dtype"])
class JaxCopyUpcasts(JaxBackend):
    name = "jax_copy_upcasts"

    def copy(self, x: Any, device: Device) -> Any:
        if x.dtype.name in ("float16", "bfloat16"):
            x = x.astype(self.jnp.float32)
        return super().copy(x, device)


@mutant("jax", "copy uses device_put, which returns x itself on x's device", ["test_copy_is_a_new_buffer"])
class JaxCopyAliases(JaxBackend):
    name = "jax_copy_aliases"

    def copy(self, x: Any, device: Device) -> Any:
        return self.jax.device_put(x, self.to_native_device(device))


@mutant("jax", "move_all (a structure's tensors in one device_put) turns float16 and bfloat16 into float32",
        ["test_move_keeps_every_dtype"])
class JaxMoveAllUpcasts(JaxBackend):
    name = "jax_move_all_upcasts"

    def move_all(self, xs: list[Any], device: Device) -> list[Any]:
        return super().move_all([x.astype(self.jnp.float32) if x.dtype.name in ("float16", "bfloat16") else x
                                 for x in xs], device)


@mutant("jax", "asarray device_puts the caller's NumPy array (XLA aliases aligned host buffers)",
        ["test_asarray_never_shares"])
class JaxAsarrayShares(JaxBackend):
    name = "jax_asarray_shares"

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        if isinstance(obj, np.ndarray) and (dtype is None or dtype == obj.dtype.name):
            return self.jax.device_put(obj, self.to_native_device(device))
        return super().asarray(obj, dtype, device)


@mutant("jax", "asarray copies with jnp.array(copy=True), which reads the caller's array after it returns "
        "(round 27's asarray to a CPU device)", ["test_asarray_is_done_with_the_callers_array"])
class JaxAsarrayReadsLate(JaxBackend):
    name = "jax_asarray_reads_late"

    def asarray(self, obj: Any, dtype: str | None, device: Device) -> Any:
        if isinstance(obj, np.ndarray):
            nd = None if dtype is None else self.to_native_dtype(dtype)
            return self.jnp.array(obj, dtype=nd, copy=True, device=self.to_native_device(device))
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


class _JaxNativeSortedCollectives(JaxCollectives):
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return sorted(super().native_allreduce(xs, op), key=lambda y: self.core.device_of(y))


@mutant("jax", "native_allreduce returns the results in ascending device order, not input order",
        ["test_allreduce_device_order", "test_native_allreduce_every_op_and_dtype"])
class JaxNativeSorted(JaxBackend):
    name = "jax_native_sorted"
    collectives = concern(_JaxNativeSortedCollectives)


class _JaxNativeProdSumsCollectives(JaxCollectives):
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return super().native_allreduce(xs, "sum" if op == "prod" else op)


@mutant("jax", "native_allreduce computes prod with psum", ["test_native_allreduce_every_op_and_dtype"])
class JaxNativeProdSums(JaxBackend):
    name = "jax_native_prod_sums"
    collectives = concern(_JaxNativeProdSumsCollectives)


class _JaxNativeMeanSumsCollectives(JaxCollectives):
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        return super().native_allreduce(xs, "sum" if op == "mean" else op)


@mutant("jax", "native_allreduce takes mean and returns the sum", ["test_native_allreduce_mean_is_the_mean"])
class JaxNativeMeanSums(JaxBackend):
    name = "jax_native_mean_sums"
    collectives = concern(_JaxNativeMeanSumsCollectives)


class _JaxImportOnHostDlpack(JaxDLPack):
    def import_dlpack(self, obj: Any, device: Device) -> Any:
        return self.core.jax.dlpack.from_dlpack(obj)


@mutant("jax", "import_dlpack leaves a host buffer on cpu:0 (no relabelling, no placement check)",
        ["test_import_dlpack_lands_on_the_requested_device"])
class JaxImportOnHost(JaxBackend):
    name = "jax_import_on_host"
    dlpack = concern(_JaxImportOnHostDlpack)


class _JaxImportForeignOnHostDlpack(JaxDLPack):
    def import_dlpack(self, obj: Any, device: Device) -> Any:
        if isinstance(obj, self.core.jax.Array):
            return super().import_dlpack(obj, device)
        return self.core.jax.dlpack.from_dlpack(obj)


@mutant("jax", "import_dlpack places its own arrays but leaves other frameworks' host buffers on cpu:0",
        ["test_import_dlpack_from_partner_lands_on_the_requested_device"])
class JaxImportForeignOnHost(JaxBackend):
    name = "jax_import_foreign_on_host"
    dlpack = concern(_JaxImportForeignOnHostDlpack)


class _JaxExportsNumpyViewDlpack(JaxDLPack):
    def export_dlpack(self, x: Any) -> Any:
        return np.asarray(super().export_dlpack(x))  # zero-copy on the host, but NumPy flags it read-only


@mutant("jax", "export_dlpack hands out NumPy's read-only view of the buffer while declaring plain host exports",
        ["test_plain_host_exports_match_behaviour"])
class JaxExportsNumpyView(JaxBackend):
    name = "jax_exports_numpy_view"
    dlpack = concern(_JaxExportsNumpyViewDlpack)


class _JaxImportCopiesDlpack(JaxDLPack):
    def import_dlpack(self, obj: Any, device: Device) -> Any:
        if device.kind != "cpu":
            return super().import_dlpack(obj, device)
        return self.core.jax.device_put(np.array(np.from_dlpack(obj)), self.core.to_native_device(device))


@mutant("jax", "import_dlpack copies through NumPy", ["test_convert_shares_memory_wherever_both_sides_can"])
class JaxImportCopies(JaxBackend):
    name = "jax_import_copies"
    dlpack = concern(_JaxImportCopiesDlpack)


@mutant("jax", "capabilities claim async_execution=False", ["test_async_execution_flag_matches_behaviour"])
class JaxClaimsSynchronous(JaxBackend):
    name = "jax_claims_sync"

    @property
    def capabilities(self) -> Any:
        return dataclasses.replace(super().capabilities, async_execution=False)


class _JaxHidesNativeCollectives(JaxCollectives):
    @classmethod
    def available_on(cls, core: Any) -> bool:
        return False


@mutant("jax", "its collectives concern says it is unavailable, so b.collectives is None (psum works)",
        ["test_native_allreduce_concern_matches_behaviour"])
class JaxHidesNative(JaxBackend):
    name = "jax_hides_native"
    collectives = concern(_JaxHidesNativeCollectives)


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
        return self.jnp.full(shape, value, dtype=self.to_native_dtype(dtype))


@mutant("jax", "split cuts equal pieces (jnp.array_split), ignoring the sizes", ["test_reshape_concat_split"])
class JaxSplitEqual(JaxBackend):
    name = "jax_split_equal"

    def split(self, x: Any, sizes: Sequence[int], axis: int) -> list[Any]:
        return list(self.jnp.array_split(x, len(sizes), axis=axis))


@mutant("jax", "combine raises CapabilityError for 8-bit integers", ["test_combine_matches_numpy"])
class JaxCombineRefusesInt8(JaxBackend):
    name = "jax_combine_refuses_int8"

    def combine(self, op: str, a: Any, b: Any) -> Any:
        if a.dtype.itemsize == 1 and a.dtype.kind in "iu":
            raise CapabilityError("jax backend: no 8-bit combine")
        return super().combine(op, a, b)


class _JaxGradCachedByNameTraining(JaxTraining):
    def value_and_grad(self, fn: Callable[..., Any], params: Sequence[Any], args: tuple) -> tuple[Any, list[Any]]:
        jax, jnp = self.core.jax, self.core.jnp
        cache = self.__dict__.setdefault("_by_name", {})
        key = getattr(fn, "__name__", None)
        vg = cache.get(key)
        if vg is None:
            vg = cache[key] = jax.jit(jax.value_and_grad(lambda ps, *a: jnp.sum(fn(list(ps), *a))))
        value, grads = vg(list(params), *args)
        return value, list(grads)


@mutant("jax", "value_and_grad caches its jitted gradient by the loss function's __name__ (every lambda shares one)",
        ["test_two_losses_give_their_own_gradients"])
class JaxGradCachedByName(JaxBackend):
    name = "jax_grad_cached_by_name"
    training = concern(_JaxGradCachedByNameTraining)


class _JaxCompileDonatesCompiler(JaxCompile):
    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        if route == "eager":
            return fn
        jitted = self.core.jax.jit(fn, donate_argnums=0)
        try:
            jitted.lower(*args)
        except TypeError as e:
            raise CapabilityError(f"jax backend: jax.jit cannot trace this function: {e}") from e
        return jitted


@mutant("jax", "compile's jax.jit donates its first argument (donate_argnums=0): the caller's input is deleted",
        ["test_compiled_function_leaves_its_inputs_readable_and_unchanged"])
class JaxCompileDonates(JaxBackend):
    name = "jax_compile_donates"
    compiler = concern(_JaxCompileDonatesCompiler)


class _JaxImportAcceptsCopyDlpack(JaxDLPack):
    def import_dlpack(self, obj: Any, device: Device) -> Any:
        jax = self.core.jax
        x64 = bool(jax.config.jax_enable_x64)
        if not x64 and type(obj).__name__ != "PyCapsule":
            try:
                src = canonical_dtype(obj.dtype)
            except Exception:  # noqa: BLE001
                src = None
            if src in X64_DTYPES:
                raise CapabilityError(f"jax backend: cannot import a {src} tensor without x64; {x64_hint(src)}")
        native = self.core.to_native_device(device)
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
        if self.core.device_of(y) != device:
            raise CapabilityError(f"jax backend: a DLPack buffer of {device} arrived on {self.core.device_of(y)}")
        return y


@mutant("jax", "import_dlpack accepts JAX's silent copy of a host buffer that is not 64-byte aligned "
        "(no check of the imported address)", ["test_convert_copy_false_never_copies"])
class JaxImportAcceptsCopy(JaxBackend):
    name = "jax_import_accepts_copy"
    dlpack = concern(_JaxImportAcceptsCopyDlpack)


@mutant("jax", "synchronize waits for the live arrays only (as before issue 21): work whose results were dropped is "
        "still queued when it returns",
        ["test_synchronize_waits_for_work_whose_results_were_dropped and -synchronize(device)]"])
class JaxSynchronizeLiveOnly(JaxBackend):
    name = "jax_synchronize_live_only"

    def synchronize(self, device: Device | None) -> None:
        jax = self.jax
        platforms = sorted({self.to_native_device(d).platform for d in self.devices()})
        target = None if device is None else self.to_native_device(device)
        if device is None:
            jax.effects_barrier()
        arrays = [a for p in platforms for a in jax.live_arrays(p)
                  if target is None or target in a.sharding.device_set]
        jax.block_until_ready(arrays)




# == models and scopes (SupportsModels, SupportsDeviceScope) ======================================
class _JaxModelKindClaimsContainersModels(JaxModels):
    def model_kind(self, obj: Any) -> str | None:
        tu = self.core.jax.tree_util
        children, treedef = tu.tree_flatten(obj, is_leaf=lambda x: x is not obj)
        leaf = treedef.num_nodes == 1 and treedef.num_leaves == 1 and len(children) == 1 and children[0] is obj
        return None if leaf else "tree"


@mutant("jax", "model_kind claims every pytree node, Python's named tuples and None included, as a JAX tree",
        ["test_model_kind_claims_no_tensor_and_no_plain_container"])
class JaxModelKindClaimsContainers(JaxBackend):
    name = "jax_model_kind_greedy"
    models = concern(_JaxModelKindClaimsContainersModels)


class _JaxDeviceScopeInertScope(JaxScope):
    def device_scope(self, device: Device) -> Any:
        import contextlib

        return contextlib.nullcontext()


@mutant("jax", "device_scope gives a scope that changes nothing (JAX's default device stays where it was)",
        ["test_the_framework_default_device_follows_the_scope"])
class JaxDeviceScopeInert(JaxBackend):
    name = "jax_device_scope_inert"
    scope = concern(_JaxDeviceScopeInertScope)


# == trees, native collectives at size, compile caches: issue 35 ======================================
class _JaxTreeRebuiltFromOldChildrenModels(JaxModels):
    def flatten_tree(self, obj: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
        tu = self.core.jax.tree_util
        children, treedef = tu.tree_flatten(obj, is_leaf=lambda x: x is not obj)
        return list(children), lambda new: tu.tree_unflatten(treedef, children)


@mutant("jax", "flatten_tree's rebuild unflattens the node's OLD children (the new ones ignored): a moved node keeps "
        "its leaves where they were", ["test_registered_tree_nodes_are_rebuilt_from_their_new_children"])
class JaxTreeRebuiltFromOldChildren(JaxBackend):
    name = "jax_tree_old_children"
    models = concern(_JaxTreeRebuiltFromOldChildrenModels)


#: The chunk of the mutant below: 2**18 elements (1 MiB of float32).
_CHUNK = 2 ** 18


class _JaxNativeDropsTailCollectives(JaxCollectives):
    def native_allreduce(self, xs: Sequence[Any], op: str) -> list[Any]:
        shape = tuple(xs[0].shape)
        numel = int(np.prod(shape))
        if numel <= _CHUNK or numel % _CHUNK == 0:
            return super().native_allreduce(xs, op)
        k = numel // _CHUNK * _CHUNK
        flat = [x.reshape(-1) for x in xs]
        head = super().native_allreduce([f[:k] for f in flat], op)
        return [self.core.jnp.concatenate([h, f[k:]]).reshape(shape) for h, f in zip(head, flat)]


@mutant("jax", "native_allreduce reduces whole chunks of 2**18 elements and drops the tail of a larger array (its "
        "last numel % 2**18 elements keep each device's own values)",
        ["test_allreduce_at_sizes_around_every_boundary and -native]"])
class JaxNativeDropsTail(JaxBackend):
    name = "jax_native_drops_tail"
    collectives = concern(_JaxNativeDropsTailCollectives)


class _JaxCompileCachedByNameCompiler(JaxCompile):
    def compile(self, fn: Any, route: str, args: tuple) -> Callable[..., Any]:
        if route == "eager":
            return fn
        cache = self.__dict__.setdefault("_jit_by_name", {})
        key = getattr(fn, "__name__", None)
        if key not in cache:
            cache[key] = super().compile(fn, route, args)
        return cache[key]


@mutant("jax", "compile caches its jax.jit by the function's __name__: two functions of one name share the first "
        "one's executable", ["test_functions_of_one_name_get_their_own_executables"])
class JaxCompileCachedByName(JaxBackend):
    name = "jax_compile_cached_by_name"
    compiler = concern(_JaxCompileCachedByNameCompiler)


# == JAX data parallelism (the replica of data_parallel_replica) ====================================
class _JaxReplicaLocalRows(JaxReplica):
    """Each step's gradient is the first device's rows' only: the other devices' never averaged in."""

    def _place_batch(self, batch: Any) -> Any:
        if self._sharded is None:
            return super()._place_batch(batch)
        n = len(self.devices)
        local = self.jax.tree_util.tree_map(lambda x: x[:x.shape[0] // n], batch)
        return self.jax.device_put(local, self._replicated)


class _JaxDataParallelLocalGradientParallel(JaxParallel):
    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        return swap_replica(super().data_parallel_replica(model, optimizer, devices), _JaxReplicaLocalRows)


@mutant("jax", "data parallelism over several devices steps with the first device's gradient only (its share of "
        "the batch; the others' gradients are never averaged in)",
        ["test_data_parallel_over_devices_matches_one_device"], replica=_JaxReplicaLocalRows)
class JaxDataParallelLocalGradient(JaxBackend):
    name = "jax_dp_local_gradient"
    parallel = concern(_JaxDataParallelLocalGradientParallel)


class _JaxReplicaDrifts(JaxReplica):
    """The training step (``local_step``: the gradient and the optimizer's update in one jitted
    call) leaves the last device's copy of every parameter one ulp off."""

    def local_step(self, batch: Any, loss_fn: Callable[..., Any]) -> Any:
        loss = super().local_step(batch, loss_fn)
        if self._replicated is None:
            return loss
        jax, jnp = self.jax, self.jnp
        last = self.backend.to_native_device(self.devices[-1])

        def drift(x: Any) -> Any:
            shards = [jnp.nextafter(s.data, jnp.inf) if s.device == last else s.data for s in x.addressable_shards]
            return jax.make_array_from_single_device_arrays(x.shape, x.sharding, shards)

        self._set_params(jax.tree_util.tree_map(drift, self._params))
        return loss


class _JaxDataParallelDriftParallel(JaxParallel):
    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        return swap_replica(super().data_parallel_replica(model, optimizer, devices), _JaxReplicaDrifts)


@mutant("jax", "data parallelism over several devices lets the replicas drift: after each step the last device's "
        "parameters are one ulp off the others' (numerically the same model, bitwise not)",
        ["test_data_parallel_replicas_stay_bitwise_equal"], replica=_JaxReplicaDrifts)
class JaxDataParallelDrift(JaxBackend):
    name = "jax_dp_drift"
    parallel = concern(_JaxDataParallelDriftParallel)


class _JaxReplicaLoadNoop(JaxReplica):
    """``load`` (what the broadcast of rank 0's state writes) does nothing."""

    def load(self, params: Sequence[Any] | None, buffers: Sequence[Any] | None) -> None:
        return None


class _JaxDataParallelLoadNoopParallel(JaxParallel):
    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        return swap_replica(super().data_parallel_replica(model, optimizer, devices), _JaxReplicaLoadNoop)


@mutant("jax", "the data-parallel replica's load (the initial broadcast of rank 0's parameters, broadcast_state) "
        "is a no-op: every rank keeps its own start", ["test_data_parallel_load_reaches_every_device"],
        replica=_JaxReplicaLoadNoop)
class JaxDataParallelLoadNoop(JaxBackend):
    name = "jax_dp_load_noop"
    parallel = concern(_JaxDataParallelLoadNoopParallel)


class _JaxReplicaAccumulationOverwrites(JaxReplica):
    """``backward`` keeps the latest micro-batch's gradient instead of adding it to those
    accumulated (inside ``no_sync()`` the earlier micro-batches are lost)."""

    def backward(self, batch: Any, loss_fn: Callable[..., Any], ready: Ready | None) -> Any:
        loss, grads = self._grad_fn(loss_fn)(self._params, self._place_batch(batch))
        self._acc = grads
        if self._cpu_collectives:
            self.jax.block_until_ready(self._acc)
        if ready is not None:
            gs = self.jax.tree_util.tree_leaves(self._acc)
            for i in range(len(gs) - 1, -1, -1):
                ready(i, gs[i])
        return loss


class _JaxDataParallelAccumulationOverwritesParallel(JaxParallel):
    def data_parallel_replica(self, model: Any, optimizer: Any, devices: Sequence[Device]) -> Any:
        return swap_replica(super().data_parallel_replica(model, optimizer, devices),
                            _JaxReplicaAccumulationOverwrites)

@mutant("jax", "gradient accumulation keeps only the last micro-batch's gradient (backward overwrites the accumulated "
        "gradients instead of adding to them): the step after no_sync() steps with a third of the batch",
        ["test_data_parallel_accumulation_matches_one_step_on_the_concatenated_batch"],
        replica=_JaxReplicaAccumulationOverwrites)
class JaxDataParallelAccumulationOverwrites(JaxBackend):
    name = "jax_dp_accumulation_overwrites"
    parallel = concern(_JaxDataParallelAccumulationOverwritesParallel)
