"""The JAX model-move scripts' common set-up (``scripts/bench/tree_move_python.py``,
``scripts/gpu/tree_move_gap.py``): the models suite's LeNet parameters on JAX's cpu:0, put on ``device``
once (the classes seen), and the floor walk of ``scripts/gpu/tree_move_probe.py`` (``floor_to``), taken
from that file as it is there. Imports JAX: set ``XLA_FLAGS`` first where virtual CPU devices are wanted."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any


def lenet_setup(device: str) -> SimpleNamespace:
    """``jax``, ``md``, ``b`` (the JAX adapter), ``target`` and ``dst`` (the device, multidev's and
    JAX's), ``tree`` and ``leaves`` (LeNet's parameters), ``floor_to`` (the probe's floor walk)."""
    import jax

    import multidev as md
    from multidev.benchmarks.baseline import native_for
    from multidev.registry import cached_owner

    b = md.backend("jax")
    target = md.device(device)
    dst = b.to_native_device(target)
    tree = native_for(b).model_d2l("lenet", md.device("cpu:0"))  # (the models suite's LeNet, as its move row has it)
    leaves = jax.tree_util.tree_leaves(tree)
    md.to(tree, target)  # (the classes seen once)
    probe = (Path(__file__).resolve().parents[1] / "gpu" / "tree_move_probe.py").read_text()
    ns: dict[str, Any] = {"cached_owner": cached_owner, "owner": cached_owner(type(leaves[0])), "jax": jax,
                          "dst": dst, "md": md, "Any": Any}
    exec(probe[probe.index("def floor_to"):probe.index("variants = {")], ns)  # the probe's floor, as it is there
    return SimpleNamespace(jax=jax, md=md, b=b, target=target, dst=dst, tree=tree, leaves=leaves,
                           floor_to=ns["floor_to"])
