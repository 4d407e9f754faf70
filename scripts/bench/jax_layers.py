"""Where a small ``dist.allreduce`` of the jax engine spends its time: five ways alternated in one
process (run over 2 processes, ``ELEMS`` float32 values, default 1024 = 4 KiB; checks off), each a block of
100 calls timed one by one, each call's result waited for, ``ROUNDS`` blocks a way (default 12, the
order reversed every round); rank 0 prints the median of the block medians:

- ``native``: JAX's own call, the jitted sum over a global array made once (the bench's baseline);
- ``public``: the global array made from the caller's array on every call by
  ``jax.make_array_from_single_device_arrays``, the jitted sum, this process's piece taken;
- ``floor``: ``public`` with the global array made by JAX's array constructor given a kept
  abstract value (the bench's floor row, as the engine makes it);
- ``thread``: ``floor`` dispatched on a helper thread (a queue and a future, as the engine's), the
  caller waiting on the future and then polling ``is_ready``: the least a call that keeps a deadline
  while XLA's CPU client runs a cheap computation inside its dispatch does;
- ``md``: ``multidev.distributed.allreduce``.

    ELEMS=1024 python -m multidev.distributed.launch -n 2 --engine jax scripts/bench/jax_layers.py
"""
from __future__ import annotations

import os
import queue
import statistics
import threading
import time
from concurrent.futures import Future

from multidev import distributed as dist
from multidev.distributed.group import current


def main() -> None:
    dist.init()
    import jax
    import jax.numpy as jnp

    dist.set_checks(False)
    eng = current().engine
    n = int(os.environ.get("ELEMS", "1024"))
    x = jnp.ones(n, jnp.float32)
    world, mine = eng.world, eng.native
    f = jax.jit(lambda a: a.reshape((world, n)).sum(0), out_shardings=eng.whole)
    g0 = jax.make_array_from_single_device_arrays((world * n,), eng.sharded, [jax.device_put(x, mine)])

    from jax._src.array import ArrayImpl

    aval = g0.aval

    def public() -> object:
        g = jax.make_array_from_single_device_arrays((world * n,), eng.sharded, [x])
        return f(g).addressable_data(0)

    def floor() -> object:
        g = ArrayImpl(aval, eng.sharded, [x], committed=True, _skip_checks=True)
        return f(g).addressable_data(0)

    q: queue.SimpleQueue = queue.SimpleQueue()

    def loop() -> None:
        while True:
            fut = q.get()
            try:
                fut.set_result(floor())
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)
    threading.Thread(target=loop, daemon=True).start()

    def threaded() -> object:
        fut: Future = Future()
        q.put(fut)
        fut.exception(60.0)
        out = fut.result()
        while not out.is_ready():
            pass
        return out

    ways = {"native": lambda: f(g0).block_until_ready(), "public": lambda: public().block_until_ready(),
            "floor": lambda: floor().block_until_ready(),
            "thread": lambda: threaded(), "md": lambda: dist.allreduce(x).block_until_ready()}
    for w in ways.values():
        for _ in range(30):
            w()
    times: dict[str, list[float]] = {w: [] for w in ways}
    rounds = int(os.environ.get("ROUNDS", "12"))
    for r in range(rounds):
        for w in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            each = []
            call = ways[w]
            for _ in range(100):
                t = time.perf_counter()
                call()
                each.append(time.perf_counter() - t)
            times[w].append(statistics.median(each) * 1e6)
    if dist.rank() == 0:
        nat = statistics.median(times["native"])
        print(f"{n * 4} B allreduce, jax engine, {world} processes, one by one (µs, median of {rounds} block medians "
              f"of 100; x = the native call's time), JAX {jax.__version__}, {os.cpu_count()} CPUs; md dispatched by "
              f"{'the caller' if eng._costly_fns else 'the engine thread'}:")
        for w, v in times.items():
            m = statistics.median(v)
            print(f"  {w:7s} {m:8.1f}  {m / nat:5.2f}x  blocks {min(v):.0f}-{max(v):.0f}", flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
