"""Issue 33, row 15: does JAX alone abort under threads? (``python scripts/repro_jax_threads.py``)

The with-MXNet lane (JAX 0.7.1) once aborted (SIGABRT in JAX's buffer tracking) under 8 threads x
2,500 mixed NumPy/torch/JAX calls through multidev. multidev holds no lock of its own around JAX
calls on this path; what its JAX adapter does per call is what this script does with JAX and NumPy
only, from ``--threads`` threads at once: zero-copy imports of NumPy buffers through DLPack
(``jax.dlpack.from_dlpack``), exports back (``np.from_dlpack`` of a JAX array), ``device_put``
between CPU devices, jitted arithmetic, host copies, and dropping every reference at once. Every
value is checked. It prints ``ok`` and the JAX version, or dies the way the lane did (run it a few
times: the lane saw one abort in three runs).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax
import jax.numpy as jnp
import numpy as np


def work(seed: int, calls: int, errors: list[str]) -> None:
    rng = np.random.default_rng(seed)
    devs = jax.devices("cpu")
    add = jax.jit(lambda a: a + 1)
    for i in range(calls):
        n = int(rng.integers(1, 256))
        ref = np.arange(n, dtype=np.float32)
        op = i % 5
        if op == 0:
            y = np.asarray(jax.dlpack.from_dlpack(ref))  # NumPy -> JAX zero-copy, back
        elif op == 1:
            a = jnp.asarray(ref)
            y = np.from_dlpack(a)  # JAX -> NumPy zero-copy (an external reference to the buffer)
            del a
        elif op == 2:
            a = jax.device_put(ref, devs[int(rng.integers(len(devs)))])
            y = np.asarray(jax.device_put(a, devs[0]))
        elif op == 3:
            y = np.asarray(add(jnp.asarray(ref))) - 1
        else:
            a = jnp.asarray(ref)
            a.copy_to_host_async()
            y = np.asarray(a)
            a.delete()
        if not np.array_equal(y, ref):
            errors.append(f"thread {seed}, call {i}: wrong values")
            return


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--calls", type=int, default=2500)
    a = p.parse_args()
    errors: list[str] = []
    ts = [threading.Thread(target=work, args=(s, a.calls, errors)) for s in range(a.threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("ok" if not errors else "\n".join(errors), f"(JAX {jax.__version__}, {a.threads} threads x {a.calls})")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
