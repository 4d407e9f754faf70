"""What the tests of reference cycles share (test_trees, test_mesh): how much cyclic garbage a call
leaves for the garbage collector once its result is dropped."""
from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any


def cyclic_garbage(make: Callable[[], Any], dropped: Callable[[Any], Callable[[], None]] | None = None) -> list[int]:
    """The objects a collection finds after ``make()``'s result is dropped, with the collector off, per
    try: up to 3 tries, stopping at the first that finds none (a cycle the call makes shows on every
    call; garbage another thread happened to leave during one, once 29,648 objects on a loaded CI
    machine, does not). ``dropped(out)``, where given, returns a check run once ``out`` is dropped
    (say, that a weak reference to it is dead). The collector's state is restored."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        found: list[int] = []
        for _ in range(3):
            out = make()
            after = dropped(out) if dropped is not None else None
            del out
            if after is not None:
                after()
            found.append(gc.collect())
            if not found[-1]:
                break
        return found
    finally:
        if enabled:
            gc.enable()
