"""D2L 12.3 "Automatic Parallelism", with multidev. Work queued on two devices runs on both at once
(the frameworks' backends do that by themselves: the program only queues and waits once), and
results copied to the host while later results are still being computed overlap the copies with
the computation (``md.to_host(generator, non_blocking=True)``, or ``md.to(y, "cpu",
non_blocking=True)`` per result).

``run(x)`` is the book's: ``k`` products ``x @ x``, queued inside ``md.device_scope(x's device,
backend=...)`` (eager TensorFlow computes on its default device whatever its inputs; the other
frameworks compute where the inputs are, scope or not). Checked: every result lives on the device its
input lives on, and the N devices computing at once give what one device gives (same-kind devices
run the same kernels: within ``SAME_KIND_RTOL``; a GPU beside a CPU sums in another order: within
``MIXED_RTOL`` of the largest value; TF32 is off, see ``common.full_float32``); the overlapped copies
give what the book's compute-then-copy gives, bit for bit, as host arrays (iterable form) or as the
framework's CPU tensors (per-result form). The times are reported, not judged: on virtual CPU
devices the "devices" share the machine's cores, so running at once gains what spare cores allow; a
GPU beside the CPU gains for real.

    python -m multidev.examples.d2l.auto_parallelism --backend jax --devices 2,4
"""
from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

import numpy as np

from .async_computation import matmul
from .common import Report, best_of, mixed, pick_devices
from .common import main as common_main

#: |result on device d - result on one device| <= RTOL * max|result|: same-kind devices (the same
#: kernels; a threaded BLAS may still sum in another order).
SAME_KIND_RTOL = 1e-5
#: The same, where a GPU computes beside the CPU: another summation order (TF32 is off in the
#: programs: common.full_float32).
MIXED_RTOL = 1e-4


def run(md: Any, name: str, counts: list[int], args: argparse.Namespace, rep: Report) -> None:
    mm = matmul(name)
    gpu = md.num_gpus(backend=name) > 0
    n, k = (2048, 20) if gpu else ((96, 10) if args.quick else (192, 20))
    host = np.random.default_rng(0).uniform(size=(n, n)).astype(np.float32)

    def run_on(x: Any) -> list[Any]:
        with md.device_scope(md.device_of(x), backend=name):  # TensorFlow computes on its default device
            return [mm(x, x) for _ in range(k)]                # otherwise; elsewhere the inputs decide

    one = pick_devices(md, name, 1)[0]
    x1 = md.asarray(host, device=one, backend=name)
    ref = np.asarray(md.to_numpy(run_on(x1)[-1]))  # what one device computes
    scale = float(np.abs(ref).max())
    rep.figure("run(x)", {"n": n, "k": k})
    for count in counts:
        devices = pick_devices(md, name, count)
        if len(devices) < 2 or len(devices) < count:
            rep.note(f"{name} has {len(devices)} device(s) here, so no {count}-device run "
                     + ("(torch has one CPU device: its multi-device runs need GPUs)" if name == "torch" else ""))
            continue
        xs = [md.asarray(host, device=d, backend=name) for d in devices]
        for x in xs:
            md.synchronize(run_on(x)[-1])  # warm-up on every device
        def alone_on(x: Any, d: Any) -> None:
            run_on(x)
            md.synchronize(d)

        alone = [best_of(functools.partial(alone_on, x, d)) for x, d in zip(xs, devices)]
        out: list[list[Any]] = []

        def together(out: list[list[Any]] = out, xs: list[Any] = xs) -> None:
            out.clear()
            out.extend(run_on(x) for x in xs)  # queued on every device, then one wait
            md.synchronize()

        both = best_of(together)
        rep.figure(f"{count} devices", {"devices": [str(d) for d in devices], "alone_s": alone, "together_s": both,
                                        "sum_alone_over_together": sum(alone) / both})
        rep.note(f"run(x) on {', '.join(map(str, devices))}: {', '.join(f'{t * 1e3:.0f}' for t in alone)} ms one "
                 f"at a time, {both * 1e3:.0f} ms all at once ({sum(alone) / both:.2f}x)")
        rep.check(f"{count} devices: every result lives on its input's device",
                  all(md.device_of(y) == d for ys, d in zip(out, devices) for y in ys))
        rtol = MIXED_RTOL if mixed(devices) else SAME_KIND_RTOL
        errs = [float(np.abs(np.asarray(md.to_numpy(ys[-1]), np.float64) - ref).max()) / scale for ys in out]
        rep.figure(f"{count} devices: max relative difference from one device", max(errs))
        rep.check(f"{count} devices at once give what one device gives (rtol {rtol:g})", max(errs) <= rtol,
                  f"max |difference| / max|result| = {max(errs):.2g}")
    # Computation and communication (12.3.3): results copied to the host as they are computed.
    x = x1
    book_out: list[Any] = []

    def book() -> None:  # the book: compute everything, then copy everything
        book_out[:] = md.to_host(run_on(x))

    iter_out: list[Any] = []

    def overlapped() -> None:  # each copy starts as soon as the generator yields its result
        iter_out[:] = md.to_host((mm(x, x) for _ in range(k)), non_blocking=True).wait()

    each_out: list[Any] = []

    def per_result() -> None:  # one Transfer per result, asked for right after the product
        handles = [md.to(mm(x, x), "cpu", non_blocking=True) for _ in range(k)]
        each_out[:] = [h.wait() for h in handles]

    times = {"book: compute, then md.to_host": best_of(book),
             "md.to_host(generator, non_blocking=True)": best_of(overlapped),
             "md.to(y, 'cpu', non_blocking=True) per result": best_of(per_result)}
    rep.figure("copies to the host", {"device": str(one), **times})
    rep.note("to the host from " + str(one) + ": " + "; ".join(f"{k_} {t * 1e3:.0f} ms" for k_, t in times.items()))
    rep.check("the iterable form gives the book's arrays, bit for bit, as NumPy arrays",
              len(iter_out) == k and all(type(a) is np.ndarray or isinstance(a, np.ndarray) for a in iter_out)
              and all(np.array_equal(a, b) for a, b in zip(iter_out, book_out)))
    cpu0 = md.Device("cpu", 0)
    rep.check("the per-result form gives the framework's tensors on cpu:0 holding the same values",
              len(each_out) == k and all(md.backend_of(t).name == md.backend(name).name and md.device_of(t) == cpu0
                                         for t in each_out)
              and all(np.array_equal(np.asarray(md.to_numpy(t)), b) for t, b in zip(each_out, book_out)))


def main(argv: list[str] | None = None) -> int:
    return common_main("auto_parallelism", __doc__ or "", run, argv)


if __name__ == "__main__":
    sys.exit(main())
