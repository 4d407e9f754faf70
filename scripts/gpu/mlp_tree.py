"""The JAX move probes' common set-up (``consecutive_move_probe.py``, ``staged_async_probe.py``): their
flags (``--device``, ``--rounds``, ``--k``) and D2L's MLP parameters (1024-4096-4096-10) on JAX's CPU
device. Imports JAX."""
from __future__ import annotations

import argparse
import itertools
from types import SimpleNamespace


def mlp_setup(rounds: int) -> SimpleNamespace:
    """``args`` (the flags, ``--rounds`` defaulting to ``rounds``), ``target`` and ``dst`` (the device,
    multidev's and JAX's), ``host`` (JAX's CPU device) and ``tree`` (the MLP's parameters there, computed)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="gpu:0")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--k", default="1,3", help="moves a sample, comma-separated")
    args = ap.parse_args()
    import jax
    import numpy as np

    import multidev as md

    b = md.backend("jax")
    target = md.device(args.device)
    host = b.to_native_device(md.device("cpu:0"))
    rng = np.random.default_rng(0)
    sizes = (1024, 4096, 4096, 10)
    tree = jax.device_put([{"w": rng.normal(size=(i, o)).astype(np.float32), "b": np.zeros(o, np.float32)}
                           for i, o in itertools.pairwise(sizes)], host)
    jax.block_until_ready(tree)
    return SimpleNamespace(args=args, target=target, dst=b.to_native_device(target), host=host, tree=tree)
