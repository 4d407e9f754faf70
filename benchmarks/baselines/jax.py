"""The jax baseline for ``multidev bench``: jax's own calls for every row."""
from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from multidev import Device

from ..baseline import Call, Native


class JaxNative(Native):
    framework = "jax"
    #: suite ``startup``: the framework's import and first call, in a fresh interpreter
    startup_code = "import jax, jax.numpy as jnp; jnp.zeros(1).block_until_ready()"
    env_vars = ("XLA_FLAGS", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "JAX_PLATFORMS",
                "JAX_ENABLE_X64")
    # jax.device_put(x, its own device) costs ~30 µs of dispatch: multidev's no-op is to be 20x faster.
    # JAX has no device barrier; its own way to wait for everything queued on a device is a marker
    # computation queued behind the work and waited for (jax-ml/jax#4335), which op_sync times.
    goal_targets = {"P1 no-op to": 0.05, "P1 no-op to (str spec)": 0.05}  # noqa: RUF012
    sync_waits_for_copies = False  # the marker waits for the compute queue, not a device-to-host copy

    def __init__(self, b: Any) -> None:
        super().__init__(b)
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp

    def dev(self, d: Device) -> Any:
        return self.b.to_native_device(d)

    def mm(self, dev: Device) -> Callable[[Any, Any], Any]:
        return self.jnp.matmul

    def op_to(self, x: Any, dev: Device) -> Call:
        return self.jax.device_put, (x, self.dev(dev)), "jax.device_put(x, device)"

    op_move_async = op_to  # device_put is asynchronous already

    def mover(self, dev: Device, non_blocking: bool = False) -> Callable[[Any], Any]:
        return functools.partial(self.jax.device_put, device=self.dev(dev))

    def op_copy(self, x: Any, dev: Device) -> Call:
        if self.b.device_of(x) == dev:
            return self.jnp.copy, (x,), "jnp.copy(x)"
        return self.jax.device_put, (x, self.dev(dev)), "jax.device_put(x, device)"

    def op_device_of(self, x: Any) -> Call:
        return operator.attrgetter("device"), (x,), "x.device"

    def op_sync(self, dev: Device, x: Any = None) -> Call:
        """A jitted scalar ``a + 1`` on ``dev``, waited for: queued behind all the device's work
        (JAX runs a device's computations in order), the wait for everything queued there."""
        markers = self.__dict__.setdefault("_markers", {})
        if dev not in markers:
            jax = self.jax
            s = jax.device_put(np.zeros((), np.int32), self.dev(dev))
            f = jax.jit(lambda a: a + 1)
            f(s).block_until_ready()  # compiled here, not in the timed call
            markers[dev] = lambda f=f, s=s: f(s).block_until_ready()
        return markers[dev], (), "jax.jit(lambda a: a + 1)(scalar on device).block_until_ready()"

    def op_wait(self, x: Any) -> Call:
        return x.block_until_ready, (), "x.block_until_ready()"

    def op_zeros(self, shape: tuple, dev: Device) -> Call:
        jnp = self.jnp
        return functools.partial(jnp.zeros, shape, jnp.float32, device=self.dev(dev)), (), \
            "jnp.zeros(shape, device=device)"

    def op_h2d(self, a: np.ndarray, dev: Device) -> Call:
        if dev.kind == "cpu":  # device_put shares an aligned host buffer, may_alias=False or not (a
            # write into the source reached 7 of 15 results at 4 KiB: scripts/bench/asarray_source.py):
            # device_put of a copy (twice as fast as jnp.array(copy=True) below 32 MiB), as md.asarray
            # copies, and wait for JAX's own copy of it (on CPU devices it runs after the call returns, on
            # a queue the device barrier between samples does not see: without the wait a row read 253 GB/s)
            d = self.dev(dev)
            return ((lambda a: self.jax.device_put(a.copy(), d).block_until_ready()), (a,),
                    "jax.device_put(a.copy(), device).block_until_ready()")
        return self.jax.device_put, (a, self.dev(dev)), "jax.device_put(a, device)"

    def op_d2h(self, x: Any) -> Call:
        if not self._gpu(x):
            return np.asarray, (x,), "np.asarray(x) (a view of a CPU array)"
        # np.asarray keeps the host copy on the array and returns it to every later call (a
        # baseline that reads it measures nothing): each call reads a fresh array, a device-side copy
        # of x (at device-memory speed, a small part of the transfer's time).
        jnp = self.jnp
        return (lambda x: np.asarray(jnp.copy(x))), (x,), \
            "np.asarray(jnp.copy(x)) (a fresh array per call: np.asarray caches the host copy on x)"

    def set_precision(self, mode: str) -> dict[str, Any]:
        if mode in ("fp32", "tf32"):
            self.jax.config.update("jax_default_matmul_precision", "highest" if mode == "fp32" else "tensorfloat32")
        return {"jax_default_matmul_precision": self.jax.config.jax_default_matmul_precision,
                "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                "jax_enable_x64": bool(self.jax.config.jax_enable_x64)}

    def save_precision(self) -> Any:
        return self.jax.config.jax_default_matmul_precision

    def restore_precision(self, state: Any) -> None:
        self.jax.config.update("jax_default_matmul_precision", state)

    def device_name(self, dev: Device) -> str:
        if dev.kind == "gpu":
            return str(self.dev(dev).device_kind)
        return super().device_name(dev)

    def op_dist_allreduce_jax(self, x: Any) -> Call:
        """The jax engine's own call (suite ``distributed``): a jitted sum over a global array made from
        each process's shard (one device per process, the first local one), the result replicated."""
        jax = self.jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        n, me = jax.process_count(), jax.process_index()
        devs = [sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)[0] for p in range(n)]
        mesh = Mesh(np.array(devs, dtype=object), ("p",))
        shard = jax.device_put(x.reshape((1, *x.shape)), devs[me])
        g = jax.make_array_from_single_device_arrays((n, *x.shape), NamedSharding(mesh, PartitionSpec("p")), [shard])
        f = jax.jit(lambda a: a.sum(0), out_shardings=NamedSharding(mesh, PartitionSpec()))
        return f, (g,), "jax.jit(lambda a: a.sum(0), out_shardings=replicated)(global array of the processes' shards)"

    def op_dist_allreduce_floor_jax(self, x: Any) -> Call:
        """The least a call that takes this process's array and hands back its own does on JAX (suite
        ``distributed``'s floor row): :meth:`op_dist_allreduce_jax`'s jitted sum, the global array made
        from ``x`` (the shard along a first axis of the processes: no copy) on every call, and this
        process's piece of the replicated result taken, as multidev's call must. The global array is
        JAX's array constructor given the abstract value of one made once by
        ``jax.make_array_from_single_device_arrays`` (which checks the shard's device and shape again
        on every call: 13-19 µs), as the jax engine makes it; that function where this JAX's
        constructor refuses the call."""
        jax = self.jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        n, me = jax.process_count(), jax.process_index()
        devs = [sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)[0] for p in range(n)]
        mesh = Mesh(np.array(devs, dtype=object), ("p",))
        sharded, dev = NamedSharding(mesh, PartitionSpec("p")), devs[me]
        shape = tuple(x.shape)
        whole = (n * shape[0], *shape[1:])
        f = jax.jit(lambda a: a.reshape((n, *shape)).sum(0), out_shardings=NamedSharding(mesh, PartitionSpec()))
        a = jax.device_put(x, dev)
        aval = jax.make_array_from_single_device_arrays(whole, sharded, [a]).aval
        try:
            from jax._src.array import ArrayImpl

            ArrayImpl(aval, sharded, [a], committed=True, _skip_checks=True)

            def made(a: Any) -> Any:
                return ArrayImpl(aval, sharded, [a], committed=True, _skip_checks=True)
            how = "JAX's array constructor given a kept abstract value"
        except Exception:  # noqa: BLE001 - a JAX without that constructor: the public function
            def made(a: Any) -> Any:
                return jax.make_array_from_single_device_arrays(whole, sharded, [a])
            how = "jax.make_array_from_single_device_arrays"

        def floor(a: Any) -> Any:
            return f(made(a)).addressable_data(0)
        return floor, (a,), (f"the global array of its shard ({how}) then the jitted sum, this process's piece "
                             "of the result taken, every call")

    def op_dist_allreduce_group_jax(self, x: Any, groups: Any) -> Call:
        """The jax engine's own subgroup call: a jitted sum over a global array of the shards of this
        process's subgroup of ``groups`` (a mesh of their devices; only they run it)."""
        jax = self.jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        me = jax.process_index()
        members = next(g for g in groups if me in g)
        devs = [sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)[0] for p in members]
        mesh = Mesh(np.array(devs, dtype=object), ("p",))
        shard = jax.device_put(x.reshape((1, *x.shape)), devs[list(members).index(me)])
        g = jax.make_array_from_single_device_arrays((len(members), *x.shape), NamedSharding(mesh, PartitionSpec("p")),
                                                      [shard])
        f = jax.jit(lambda a: a.sum(0), out_shardings=NamedSharding(mesh, PartitionSpec()))
        return f, (g,), "jax.jit(lambda a: a.sum(0), out_shardings=replicated)(the subgroup's global array)"

    def op_dist_place_jax(self, x: Any, pm: Any) -> Call:
        """Rank 0's ``x`` laid out as a global array over a mesh of each process's device, rows along the first
        axis and columns along the second: ``multihost_utils.broadcast_one_to_all`` then
        ``jax.make_array_from_callback`` (each process cuts its piece)."""
        jax = self.jax
        from jax.experimental import multihost_utils
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        firsts = [min((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)
                  for p in range(jax.process_count())]
        devs = np.empty(len(firsts), dtype=object)
        devs[:] = firsts
        sharding = NamedSharding(Mesh(devs.reshape(pm.shape), pm.axis_names), PartitionSpec(*pm.axis_names))
        def place() -> Any:
            whole = multihost_utils.broadcast_one_to_all(x)
            return jax.make_array_from_callback(x.shape, sharding, lambda idx: whole[idx])
        return place, (), ("multihost_utils.broadcast_one_to_all(x); jax.make_array_from_callback(shape, "
                           "NamedSharding(mesh, P('data', 'model')), lambda i: whole[i])")

    def op_dist_gather_jax(self, y: Any) -> Call:
        """A jitted replication of a global array (every process runs it), this process's copy, waited for."""
        jax = self.jax
        from jax.sharding import NamedSharding, PartitionSpec

        f = jax.jit(lambda a: a, out_shardings=NamedSharding(y.sharding.mesh, PartitionSpec()))
        return (lambda: jax.block_until_ready(f(y).addressable_shards[0].data)), (), \
            "jax.jit(lambda a: a, out_shardings=replicated)(y).addressable_shards[0].data"

    def op_from_dlpack(self, x: Any) -> Call:
        """JAX as a DLPack consumer (the native side of convert(x, 'jax'))."""
        return self.jax.dlpack.from_dlpack, (x,), "jax.dlpack.from_dlpack(x)"

    def op_allreduce_framework(self, bufs: list[Any]) -> Call | None:
        """JAX's own allreduce (suite ``collectives``): ``jax.lax.psum`` under ``jax.shard_map`` over a
        mesh of the buffers' devices, on the global array the per-device buffers make, compiled here;
        the result is the global array (each device's block the sum)."""
        jax = self.jax
        if len(bufs) < 2:
            return None
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        devs = [next(iter(b.devices())) for b in bufs]
        if len({d.platform for d in devs}) > 1:
            return None
        mesh = Mesh(np.array(devs, dtype=object), ("i",))
        sharding = NamedSharding(mesh, PartitionSpec("i"))
        shape = tuple(bufs[0].shape)
        gshape = (shape[0] * len(bufs),) + shape[1:]
        f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "i"), mesh=mesh, in_specs=PartitionSpec("i"),
                                  out_specs=PartitionSpec("i")))

        def allreduce(pieces: list[Any]) -> Any:
            return f(jax.make_array_from_single_device_arrays(gshape, sharding, pieces))
        allreduce(list(bufs)).block_until_ready()  # compiled before the clock
        return allreduce, (list(bufs),), \
            "jax.jit(shard_map(lambda a: lax.psum(a, 'i'), mesh))(make_array_from_single_device_arrays(bufs))"

    def _pinned(self, y: Any) -> Any:
        return self.jax.device_put(y, y.sharding.with_memory_kind("pinned_host"))

    def _gpu(self, x: Any) -> bool:
        return all(d.platform != "cpu" for d in x.devices())

    def op_d2h_pinned(self, x: Any) -> Call | None:
        """The best device-to-host copy JAX allows: device_put into pinned host memory."""
        if not self._gpu(x):
            return None
        return (lambda x: np.asarray(self._pinned(x))), (x,), \
            "np.asarray(jax.device_put(x, x.sharding.with_memory_kind('pinned_host')))"

    def op_h2d_pinned(self, a: np.ndarray, dev: Device) -> Call | None:
        """The best upload JAX allows: from an array already in pinned host memory."""
        if dev.kind != "gpu":
            return None
        d = self.dev(dev)
        src = self.jax.device_put(a, self.jax.sharding.SingleDeviceSharding(d, memory_kind="pinned_host"))
        src.block_until_ready()
        return (lambda s: self.jax.device_put(s, d)), (src,), "jax.device_put(pinned_host array, device)"

    def op_d2h_book(self, ys: list[Any]) -> Call:
        """JAX's own recipe: copy_to_host_async on every result, then np.asarray each."""
        def book(ys: list[Any]) -> list[np.ndarray]:
            for y in ys:
                y.copy_to_host_async()
            return [np.asarray(y) for y in ys]
        return book, (ys,), "[y.copy_to_host_async() for y in ys]; [np.asarray(y) for y in ys]"

    def op_copy_alone(self, ys: list[Any]) -> Call | None:
        """The copies alone: every (already computed) result into pinned host memory."""
        if not ys or not self._gpu(ys[0]):
            return None
        return (lambda ys: [np.asarray(z) for z in [self._pinned(y) for y in ys]]), (ys,), \
            "device_put to pinned_host for every result; np.asarray each"

    def op_overlap_bound(self, mm: Callable[[Any, Any], Any], x: Any, k: int) -> Call | None:
        """The best overlap JAX allows: each result's pinned_host copy dispatched right after it."""
        if not self._gpu(x):
            return None

        def bound(x: Any) -> list[np.ndarray]:
            zs = [self._pinned(mm(x, x)) for _ in range(k)]
            return [np.asarray(z) for z in zs]
        return bound, (x,), "per result: device_put(mm(x, x), pinned_host); np.asarray each"
    # -- D2L 12.1 (suite "compile"): the MLP and jax's own compiler -----------------------------
    def mlp_d2l(self, weights: list[np.ndarray], dev: Device) -> Callable[[], Any]:
        """Fresh MLP functions (``jax.nn.relu`` between layers) closing over ``weights`` on ``dev``."""
        jax = self.jax
        ps = [jax.device_put(w, self.dev(dev)) for w in weights]

        def make() -> Callable[[Any], Any]:
            def mlp(x: Any) -> Any:
                for i in range(0, len(ps) - 2, 2):
                    x = jax.nn.relu(x @ ps[i] + ps[i + 1])
                return x @ ps[-2] + ps[-1]
            return mlp
        return make

    def compiled_d2l(self, make: Callable[[], Any], x: Any, dev: Device, quick: bool) -> dict[str, Any]:
        return {"jax.jit": self.jax.jit(make())}

    # -- suite "models": the framework's own model, its move, and the one-device training step --
    def model_d2l(self, kind: str, dev: Device, seed: int = 0) -> Any:
        """D2L's LeNet (``"lenet"``) or an MLP (``"mlp:1024-4096-4096-10"``) as a pytree of arrays on
        ``dev`` (a dict per layer, as flax's params are), seeded."""
        rng = np.random.default_rng(seed)
        if kind == "lenet":
            shapes = {"conv1": (6, 1, 5, 5), "conv2": (16, 6, 5, 5), "fc1": (400, 120), "fc2": (120, 84),
                      "fc3": (84, 10)}
        else:
            sizes = [int(s) for s in kind.split(":")[1].split("-")]
            shapes = {f"fc{i + 1}": (sizes[i], sizes[i + 1]) for i in range(len(sizes) - 1)}
        out: dict[str, Any] = {}
        for name, s in shapes.items():
            fan_in = int(np.prod(s[1:])) if len(s) == 4 else s[0]
            bias = s[0] if len(s) == 4 else s[1]
            out[name] = {"w": (rng.normal(size=s) / np.sqrt(fan_in)).astype(np.float32),
                         "b": np.zeros(bias, np.float32)}
        return self.jax.device_put(out, self.dev(dev))

    def op_model_to(self, model: Any, dev: Device) -> Call:
        """``jax.device_put(tree, device)``: every leaf of the pytree on the device."""
        return self.jax.device_put, (model, self.dev(dev)), "jax.device_put(tree, device)"

    def _d2l_forward(self, kind: str) -> Callable[[Any, Any], Any]:
        jax = self.jax

        def conv(x: Any, w: Any, b: Any, pad: str) -> Any:
            y = jax.lax.conv_general_dilated(x, w, (1, 1), pad, dimension_numbers=("NCHW", "OIHW", "NCHW"))
            return y + b[None, :, None, None]

        def pool(x: Any) -> Any:
            n, c, h, w = x.shape
            return x.reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))

        def lenet(tree: Any, X: Any) -> Any:
            s = jax.nn.sigmoid
            h = pool(s(conv(X, tree["conv1"]["w"], tree["conv1"]["b"], "SAME")))
            h = pool(s(conv(h, tree["conv2"]["w"], tree["conv2"]["b"], "VALID")))
            h = h.reshape(h.shape[0], -1)
            h = s(h @ tree["fc1"]["w"] + tree["fc1"]["b"])
            h = s(h @ tree["fc2"]["w"] + tree["fc2"]["b"])
            return h @ tree["fc3"]["w"] + tree["fc3"]["b"]

        def mlp(tree: Any, X: Any) -> Any:
            layers = [tree[k] for k in sorted(tree, key=lambda k: int(k[2:]))]
            for layer in layers[:-1]:
                X = jax.nn.relu(X @ layer["w"] + layer["b"])
            return X @ layers[-1]["w"] + layers[-1]["b"]
        return lenet if kind == "lenet" else mlp

    def train_d2l(self, kind: str, dev: Device, seed: int = 0) -> tuple[list[Any], Callable[..., Any]]:
        """The model's leaves (on ``dev``) and its summed cross-entropy ``loss(params, X, y)``, the
        pytree rebuilt from the leaves (for md.train_batch and for the native step alike)."""
        jax, jnp = self.jax, self.jnp
        tree = self.model_d2l(kind, dev, seed)
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        forward = self._d2l_forward(kind)

        def loss(ps: list[Any], X: Any, y: Any) -> Any:
            logits = forward(jax.tree_util.tree_unflatten(treedef, ps), X)
            return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1).sum()
        return list(leaves), loss

    def op_train_step(self, params: list[Any], loss: Callable[..., Any], X: Any, y: Any, dev: Device,
                      lr: float) -> Call:
        """One SGD step written in JAX, the step md.train_batch takes on one device: the batch to the
        device, ``jax.jit(jax.value_and_grad(loss))``, ``p - lr / B * g`` per leaf (rebinding),
        ``float(loss)``."""
        jax = self.jax
        d = self.dev(dev)
        vg = jax.jit(jax.value_and_grad(loss))
        step = lr / X.shape[0]
        box = [list(params)]

        def train_step(X: Any, y: Any) -> float:
            X, y = jax.device_put(X, d), jax.device_put(y, d)
            value, grads = vg(box[0], X, y)
            box[0] = [p - step * g for p, g in zip(box[0], grads)]
            return float(value)
        return train_step, (X, y), "device_put(X); jit(value_and_grad(loss))(ps, X, y); [p - lr/B * g]; float()"

    def op_train_step_fused(self, params: list[Any], loss: Callable[..., Any], X: Any, y: Any, dev: Device,
                            lr: float) -> Call:
        """The idiomatic JAX step, for reference: gradients and update in one ``jax.jit`` (the
        parameters updated inside the compiled function)."""
        jax = self.jax
        d = self.dev(dev)
        step = lr / X.shape[0]

        @jax.jit
        def update(ps: list[Any], X: Any, y: Any) -> tuple[Any, list[Any]]:
            value, grads = jax.value_and_grad(loss)(ps, X, y)
            return value, [p - step * g for p, g in zip(ps, grads)]

        box = [list(params)]

        def train_step(X: Any, y: Any) -> float:
            X, y = jax.device_put(X, d), jax.device_put(y, d)
            value, box[0] = update(box[0], X, y)
            return float(value)
        return train_step, (X, y), "device_put(X); jit(value_and_grad + update)(ps, X, y); float()"

    def op_place_sharded(self, x: Any, layout: Any) -> Call:
        """``jax.device_put`` with the ``NamedSharding`` of a multidev layout (suite ``mesh``), the
        sharding built here, outside the timed call."""
        import numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        devs = np.empty(layout.mesh.size, dtype=object)
        devs[:] = [self.dev(d) for d in layout.mesh.devices]
        spec = PartitionSpec(*[None if not e else e[0] if len(e) == 1 else tuple(e) for e in layout.spec])
        sharding = NamedSharding(Mesh(devs.reshape(layout.mesh.shape), layout.mesh.axis_names), spec)
        return self.jax.device_put, (x, sharding), "jax.device_put(x, NamedSharding(mesh, P(...)))"
