"""D2L 12.2 "Asynchronous Computation", with multidev. The frontend (Python) hands each operation to
the framework's backend and returns at once; the backend computes in dependency order. So a loop
of matrix products returns long before the products are done, and only a barrier
(``md.synchronize``) makes the time of the work visible. The results need not be kept: D2L's
pattern is work whose results are dropped, then a barrier, and ``md.synchronize()`` and
``md.synchronize(device)`` wait for all of it.

The picture (the book's Figure 12.2.1, for ``z = x * y + 2``)::

    frontend (Python)             backend (the framework's engine, per device)
    x = ones(...)   --queue-->    [ones]---+
    y = ones(...)   --queue-->    [ones]---+--> [ * ] --> [ + 2 ] --> z
    z = x * y + 2   --queue-->
    md.synchronize() <--------------------- returns when the queue is empty

Which frameworks queue: JAX (every device), MXNet (its engine), torch and CuPy on a GPU. NumPy,
torch on the CPU and TensorFlow's eager CPU ops compute before the call returns (there the queue
time is the work's time).

How "waited for dropped work" is observed without keeping the work's results (a kept result is
live, and easy to find): on MXNet the last operation of the dropped chain is a custom operator that
sets a flag on the host when it runs; on torch and CuPy GPUs the device's stream reports whether it
is idle; on JAX, whose devices run their computations in order, a tiny marker computation queued
right after the barrier completes at once when the dropped work is done, and only after the rest of
that work otherwise (a host callback inside the work would make JAX's CPU dispatch synchronous).
Each run first observes the work without a barrier, to show the observation can tell pending work
from none.

    python -m multidev.examples.d2l.async_computation --backend jax,mxnet
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .common import Report
from .common import main as common_main

PICTURE = __doc__.split("::")[1].split("\n\n")[1] if __doc__ else ""


def matmul(name: str) -> Callable[[Any, Any], Any]:
    if name == "mxnet":
        from mxnet import nd

        return nd.dot  # MXNet's legacy NDArray has no @
    return lambda a, b: a @ b


#: The MXNet operator that sets a flag when it runs, registered once per process.
_MX_FLAG: list[int] = []


def _register_mx_flag() -> None:
    import mxnet as mx

    if getattr(_register_mx_flag, "done", False):
        return

    class Flag(mx.operator.CustomOp):  # runs on MXNet's engine once its input is computed
        def forward(self, is_train: Any, req: Any, in_data: Any, out_data: Any, aux: Any) -> None:
            _MX_FLAG.append(1)
            self.assign(out_data[0], req[0], in_data[0])

        def backward(self, req: Any, out_grad: Any, in_data: Any, out_data: Any, in_grad: Any, aux: Any) -> None:
            self.assign(in_grad[0], req[0], out_grad[0])

    @mx.operator.register("d2l_done_flag")
    class FlagProp(mx.operator.CustomOpProp):
        def list_arguments(self) -> list[str]:
            return ["data"]

        def infer_shape(self, in_shape: Any) -> Any:
            return in_shape, in_shape, []

        def create_operator(self, ctx: Any, shapes: Any, dtypes: Any) -> Any:
            return Flag()

    _register_mx_flag.done = True  # type: ignore[attr-defined]


Observe = Callable[[], tuple[bool, str]]


def dropped_work(md: Any, name: str, dev: Any, n: int, k: int) -> tuple[Callable[[], None], Observe | None, float]:
    """``(queue, observe, work_s)``: ``queue()`` queues ``k`` products of n x n matrices on ``dev``
    and drops every result (the book's ``for _ in range(k): run(x)``); ``observe()``, called right
    after a barrier, says whether that work had run by then, and how that was seen; ``work_s`` is
    the work's own time (waited for on its last result). ``observe`` is None where the framework
    computes before each call returns (nothing can be pending)."""
    x = md.rand((n, n), device=dev, backend=name, seed=3)
    if name == "jax":
        import jax

        calls = 3  # a few calls, each a chain of k // 3 products: queued in microseconds, long to run
        chain = jax.jit(lambda a: jax.lax.fori_loop(0, max(1, k // calls), lambda i, acc: (acc @ a) / n, a))
        marker = jax.jit(lambda a: a[0, 0] + 1)
        chain(x).block_until_ready()
        marker(x).block_until_ready()
        t0 = time.perf_counter()
        [chain(x) for _ in range(calls)][-1].block_until_ready()
        work = time.perf_counter() - t0

        def queue_jax() -> None:
            for _ in range(calls):
                chain(x)  # dropped

        def observe_jax() -> tuple[bool, str]:
            # A device runs its computations in order: a marker queued now completes at once when the
            # dropped work is done, and only after it otherwise. (A host callback inside the work would
            # make JAX's CPU dispatch synchronous, and a kept result would be live: neither is the case.)
            t0 = time.perf_counter()
            marker(x).block_until_ready()
            residual = time.perf_counter() - t0
            return residual <= 0.25 * work, f"a marker queued at that point took {residual * 1e3:.1f} ms " \
                                             f"(the dropped work alone takes {work * 1e3:.0f} ms)"

        return queue_jax, observe_jax, work
    if name == "mxnet":
        import mxnet as mx

        _register_mx_flag()

        def queue_mx() -> None:
            _MX_FLAG.clear()
            y = x
            for _ in range(k):
                y = mx.nd.dot(y, x) / n
            mx.nd.Custom(y, op_type="d2l_done_flag")  # dropped; sets the flag when it runs

        t0 = time.perf_counter()
        queue_mx()
        mx.nd.waitall()
        work = time.perf_counter() - t0
        return queue_mx, lambda: (bool(_MX_FLAG), "the last operator set its flag" if _MX_FLAG else
                                  "the last operator had not run"), work
    mm2 = matmul(name)

    def queue_any() -> None:
        y = x
        for _ in range(k):
            y = mm2(y, x) / n  # dropped at the end

    t0 = time.perf_counter()
    queue_any()
    md.synchronize(dev)
    work = time.perf_counter() - t0
    if name in ("torch", "cupy") and dev.is_gpu:
        if name == "torch":
            import torch

            stream = torch.cuda.current_stream(md.native_device(dev, "torch"))
            return queue_any, lambda: (bool(stream.query()), f"the stream {'is' if stream.query() else 'is not'} "
                                                             "idle"), work
        import cupy

        with md.native_device(dev, "cupy"):
            cstream = cupy.cuda.get_current_stream()
        return queue_any, lambda: (bool(cstream.done), f"the stream {'is' if cstream.done else 'is not'} idle"), work
    return queue_any, None, work


def run(md: Any, name: str, counts: list[int], args: argparse.Namespace, rep: Report) -> None:
    dev = md.try_gpu(backend=name)
    gpu = dev.is_gpu
    n, k = (4096, 50) if gpu else ((128, 20) if args.quick else (256, 50))
    mm = matmul(name)
    # The frontend/backend picture: z = x * y + 2, computed by the backend in dependency order.
    x = md.ones((1, 2), device=dev, backend=name)
    y = md.ones((1, 2), device=dev, backend=name)
    z = x * y + 2
    if not args.quiet:
        print(PICTURE)
    rep.check("z = x * y + 2 is 3 once computed, on x's device",
              np.allclose(md.to_numpy(z), 3.0) and md.device_of(z) == dev, md.device_of(z))
    # Queue time against work time (D2L: the loop returns at once; the barrier waits).
    a = md.rand((n, n), device=dev, backend=name, seed=0)
    md.synchronize(mm(a, a))  # warm-up: kernels and allocations ready
    t0 = time.perf_counter()
    for _ in range(k):
        mm(a, a)  # results dropped
    queued = time.perf_counter() - t0
    md.synchronize(dev)
    total = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(k):
        md.synchronize(mm(a, a))  # a barrier after every product
    each = time.perf_counter() - t1
    rep.figure("matmuls", {"n": n, "k": k, "device": str(dev)})
    rep.figure("queue_s", queued)
    rep.figure("queue_then_synchronize_s", total)
    rep.figure("synchronize_each_s", each)
    rep.note(f"{k} products of {n}x{n} on {dev}: the loop returned after {queued * 1e3:.1f} ms, "
             f"md.synchronize({dev}) after {total * 1e3:.1f} ms; a barrier after each: {each * 1e3:.1f} ms")
    rep.check("the barrier's time includes the queue's", total >= queued)
    # Work whose results are dropped, then a barrier: every form waits for it.
    qn, qk = (4096, 60) if gpu else (((128, 30) if args.quick else (256, 40)) if name == "mxnet" else
                                     ((256, 60) if args.quick else (512, 60)) if name == "jax" else (64, 5))
    queue, observe, work = dropped_work(md, name, dev, qn, qk)
    rep.figure("asynchronous", observe is not None)
    rep.figure("dropped work", {"n": qn, "k": qk, "work_s": work})
    forms: list[tuple[str, Callable[[], None]]] = [
        (f"synchronize({dev})", lambda: md.synchronize(dev)),
        ("synchronize()", lambda: md.synchronize()),
        (f"synchronize({dev}, backend={name!r})", lambda: md.synchronize(dev, backend=name)),
        (f"synchronize(backend={name!r})", lambda: md.synchronize(backend=name)),
    ]
    if observe is None:
        rep.note(f"{name} on {dev} computes before each call returns: no work can be pending")
        return
    queue()
    seen, how = observe()  # the control: no barrier at all
    rep.figure("dropped: no barrier", {"done": seen, "how": how})
    rep.note(f"without a barrier: {how} (the observation can tell pending work from none)" if not seen else
             f"without a barrier the work was done before it could be observed ({how}): the checks below "
             "cannot fail on this machine")
    md.synchronize(dev)
    for label, barrier in forms:
        t0 = time.perf_counter()
        queue()
        returned = time.perf_counter() - t0
        barrier()
        waited = time.perf_counter() - t0
        ok, how = observe()
        rep.figure(f"dropped: {label}", {"queue_s": returned, "barrier_s": waited, "how": how})
        rep.check(f"{label} waited for work whose results were dropped", ok,
                  f"queued in {returned * 1e3:.1f} ms, barrier returned at {waited * 1e3:.1f} ms; {how}")
        md.synchronize()


def main(argv: list[str] | None = None) -> int:
    return common_main("async_computation", __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
