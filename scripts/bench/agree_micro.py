"""One process's cost of a checked call's consistency step (:func:`multidev.distributed.consistency.agree`:
the record, this rank's row posted, the exchange, the comparison) between two ranks' mailboxes over one
anonymous mapping, rank 1's row posted just before each call. ``agree`` is the whole step, ``posts`` the
two rows' writes alone (rank 1's is inside the ``agree`` figure too); best of 5 repeats of 20,000, three
times. Compare checkouts, each imported whole, from a folder outside the repository:

    PYTHONPATH=$(bash scripts/bench/shadow_tree.sh TREE) python scripts/bench/agree_micro.py
"""
from __future__ import annotations

import mmap
import os
import timeit
import types
from typing import Any

from multidev.distributed import collectives, consistency
from multidev.distributed.mailbox import Mailbox


def main() -> None:
    m = mmap.mmap(-1, Mailbox.size(2))
    a, b = (Mailbox(m, r, 2, [os.getpid()] * 2) for r in range(2))
    g: Any = types.SimpleNamespace(ahead=None, check=True, seq=0, channel=a, engine=None, timeout=5.0, rank=0,
                                   world_size=2)

    def local() -> Any:
        return collectives._record(g, "allreduce", op="sum", dtype="float32", shape=(4,), tkind="cpu")
    tail = local().encode(0)[1:]

    def agree() -> object:
        b.post(g.seq, [g.seq, *tail])
        return consistency.agree(g, "allreduce", local, False)

    def posts() -> None:
        s = g.seq
        g.seq += 1
        b.post(s, [s, *tail])
        a.post(s, [s, *tail])
    best: dict[str, float] = {}
    for _ in range(3):
        for f in (agree, posts):
            t = min(timeit.repeat(f, number=20000, repeat=5)) / 20000 * 1e6
            best[f.__name__] = min(best.get(f.__name__, t), t)
    print(f"agree {best['agree']:.2f} us, posts {best['posts']:.2f} us")


if __name__ == "__main__":
    main()
