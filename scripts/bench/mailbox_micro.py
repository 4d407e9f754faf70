"""One process's cost of the shared-memory consistency exchange (multidev.distributed.mailbox), two
ranks' mailboxes over one anonymous mapping: ``step`` is one call's whole exchange as two ranks with
equal records make it (the record encoded, both rows posted, rank 0's exchange), ``post`` one row
written again for the same call. Best of 5 repeats of 20,000. Compare checkouts, each imported whole:

    PYTHONPATH=$(bash scripts/bench/shadow_tree.sh TREE) python scripts/bench/mailbox_micro.py
"""
from __future__ import annotations

import mmap
import os
import timeit

from multidev.distributed.consistency import Call
from multidev.distributed.mailbox import Mailbox


def main() -> None:
    m = mmap.mmap(-1, Mailbox.size(2))
    a, b = (Mailbox(m, r, 2, [os.getpid()] * 2) for r in range(2))
    call = Call("allreduce", op="sum", dtype="float32", shape=(262144,), tkind="cpu")
    seq = [0]

    def step() -> object:
        s = seq[0]
        seq[0] += 1
        row = call.encode(s)
        b.post(s, row)
        a.post(s, row)
        return a.exchange(s, row, 1.0)
    row = call.encode(7)

    def post() -> None:
        a.post(7, row)
    for f in (post, step):
        t = min(timeit.repeat(f, number=20000, repeat=5)) / 20000
        print(f"{f.__name__:5s} {t * 1e6:.2f} us")


if __name__ == "__main__":
    main()
