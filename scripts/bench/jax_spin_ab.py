"""The JAX engine's wait with and without its 1 ms spin (``JaxEngine.spin``: 1e-3 against 0.0, the
poll yielding at once), alternated in one process: a 2-process ``dist.allreduce`` of ``ELEMS``
float32 values (default 1024), checks off, 100 calls one by one a block, ``ROUNDS`` blocks each way
(default 12, the order swapped every round); rank 0 prints the median of the block medians and
the engine's own choice on this machine::

    ELEMS=262144 python -m multidev.distributed.launch -n 2 --engine jax scripts/bench/jax_spin_ab.py
"""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

from multidev import distributed as dist
from multidev.distributed.group import current

sys.path.insert(0, str(Path(__file__).resolve().parent))
from jax_inline_ab import alternated


def main() -> None:
    dist.init()
    import jax.numpy as jnp  # (after init: JAX's rule for jax.distributed)

    dist.set_checks(False)
    eng = current().engine
    chosen = eng.spin
    n = int(os.environ.get("ELEMS", "1024"))
    x = jnp.ones(n, jnp.float32)
    for _ in range(20):
        dist.allreduce(x)
    res = alternated({"spin 1 ms": lambda: setattr(eng, "spin", 1e-3), "no spin": lambda: setattr(eng, "spin", 0.0)},
                     lambda: dist.allreduce(x))
    eng.spin = chosen
    if dist.rank() == 0:
        a, b = (statistics.median(v) for v in res.values())
        print(f"{n * 4} B dist.allreduce, jax engine, 2 processes, one by one (us, median of {len(res['no spin'])} "
              f"block medians of 100; the engine chose spin={chosen}): "
              + "; ".join(f"{w} {statistics.median(v):.0f} {[round(u) for u in v]}" for w, v in res.items())
              + f"; spin/no spin {a / b:.2f}", flush=True)
    dist.shutdown()


if __name__ == "__main__":
    main()
