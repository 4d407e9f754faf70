"""The shared-memory consistency exchange (multidev.distributed.mailbox) between ``WORLD`` forked
processes over one anonymous mapping, every rank exchanging a 44-integer row ``CALLS`` times (rank
``seq % WORLD`` late by ``WORK`` empty loop turns at call ``seq``); rank 0 prints the microseconds a
call. Pin it to fewer cores than ranks to see the ranks share cores::

    taskset -c 0 python scripts/bench/mailbox_ranks.py 2 2000 0
"""
from __future__ import annotations

import mmap
import os
import sys
import time

from multidev.distributed.mailbox import Mailbox


def main() -> None:
    world, calls, work = (int(v) for v in sys.argv[1:4])
    mapped = mmap.mmap(-1, Mailbox.size(world))
    kids: list[int] = []
    me = 0
    for r in range(1, world):
        pid = os.fork()
        if pid == 0:
            me, kids = r, []
            break
        kids.append(pid)
    box = Mailbox(mapped, me, world, [os.getpid()] * world)
    row = [0, 1, 2, 3, *range(40)]
    t0 = time.perf_counter()
    for seq in range(calls):
        if me == seq % world:
            for _ in range(work):
                pass
        row[0] = seq
        box.exchange(seq, row, 20.0)
    if me == 0:
        print(f"{world} ranks, late by {work} turns, affinity {sorted(os.sched_getaffinity(0))}: "
              f"{1e6 * (time.perf_counter() - t0) / calls:.1f} us a call", flush=True)
    for k in kids:
        os.waitpid(k, 0)
    os._exit(0)


if __name__ == "__main__":
    main()
