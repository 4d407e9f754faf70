"""Worker of the mismatched-rank scenarios (tests/adversarial/test_ranks.py): one process per rank,
started by an engine's launcher (torchrun's variables, mpiexec, JAX's variables: ``dist.init()``
picks the engine from them). ``python _ranks.py BACKEND SCENARIO TIMEOUT``.
``MD_ADV_DEVICE=gpu`` puts the tensors on ``gpu:LOCAL_RANK``; ``MD_ADV_PG`` names the engine's
transport (torch's process-group backend; default: init's own choice).

Each scenario makes the ranks disagree in one way and records what every call did, as one JSON
line ``MDREPORT {...}``: for each step the outcome (``ok`` or the error's class name) and, for
results, whether the values were right. The parent checks that every rank raised a typed error at
every mismatched step and that the group still worked after it.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

import numpy as np


def main(backend: str, scenario: str, timeout: float) -> int:
    import multidev as md
    from multidev import distributed as dist

    check = scenario != "unchecked"
    found = dist.detect_launch()
    if not found or found[0].engine != "jax":  # the framework before the rendezvous, so the ranks arrive
        md.backend(backend)  # together; JAX's runtime must start before JAX computes anything
    dist.init(transport=os.environ.get("MD_ADV_PG") or None, timeout=timeout, rendezvous_timeout=max(timeout, 60.0),
              check=check)
    r, w = dist.rank(), dist.world_size()
    steps: list[dict[str, Any]] = []
    on = md.gpu(dist.local_rank()) if os.environ.get("MD_ADV_DEVICE") == "gpu" else md.cpu(0)

    def arr(a: Any, dtype: str = "float32") -> Any:
        return md.asarray(np.asarray(a), dtype=dtype, device=on, backend=backend)

    def step(name: str, fn: Any, expect: Any = None, of: str = backend) -> None:
        """Run one call; record its outcome (the error class, or ok and whether it was right)."""
        t0 = time.monotonic()
        rec: dict[str, Any] = {"step": name}
        try:
            y = fn()
        except md.MultidevError as e:
            rec.update(outcome=type(e).__name__, typed=True, message=str(e)[:300],
                       mismatch=isinstance(e, md.CollectiveMismatchError))
        except Exception as e:  # noqa: BLE001 - an untyped error is a finding, reported
            rec.update(outcome=type(e).__name__, typed=False, message=traceback.format_exc()[-1500:])
        else:
            rec["outcome"] = "ok"
            if expect is not None:
                got = np.asarray(md.to_numpy(y), dtype=np.float64)
                rec["right"] = bool(got.shape == np.shape(expect) and np.allclose(got, expect))
                rec["device_ok"] = md.device_of(y) == (on if of == backend else md.cpu(0))
                rec["type_ok"] = isinstance(y, md.backend(of).tensor_types())
        rec["elapsed"] = time.monotonic() - t0
        steps.append(rec)

    ones = np.ones((2, 3), np.float32)
    total = np.full((2, 3), float(w))

    if scenario in ("mismatch", "unchecked"):
        # Every mismatch must raise on every rank; after each, a good call must still work.
        step("shape (2,3) vs (3,2)", lambda: dist.allreduce(arr(ones if r == 0 else ones.T)))
        step("after shape", lambda: dist.allreduce(arr(ones)), total)
        if scenario == "unchecked":
            dist.shutdown()
            print("MDREPORT " + json.dumps({"rank": r, "steps": steps}), flush=True)
            return 0
        # float64 where the group carries it (JAX's engine without x64 does not: int32 there)
        wide = "float64" if dist.carries("float64", on, backend=backend) else "int32"
        step("dtype float32 vs other", lambda: dist.allreduce(arr(ones, "float32" if r == 0 else wide)))
        step("numel 6 vs 7", lambda: dist.allreduce(arr(np.ones(6 + (r == w - 1), np.float32))))
        step("op sum vs max", lambda: dist.allreduce(arr(ones), op="sum" if r == 0 else "max"))
        step("after op", lambda: dist.allreduce(arr(ones)), total)
        step("broadcast length 4 vs 6", lambda: dist.broadcast(arr(np.ones(4 + 2 * (r > 0), np.float32))))
        step("broadcast src 0 vs 1", lambda: dist.broadcast(arr(ones), src=min(r, 1)))
        step("allreduce vs broadcast", lambda: dist.allreduce(arr(ones)) if r == 0 else dist.broadcast(arr(ones)))
        step("after kinds", lambda: dist.allreduce(arr(ones)), total)
        step("reduce dst 0 vs 1", lambda: dist.reduce(arr(ones), dst=min(r, 1)))
        step("reduce_scatter axis 0 vs 1", lambda: dist.reduce_scatter(arr(np.ones((4, 4), np.float32)),
                                                                         axis=0 if r == 0 else 1))
        step("allgather other dims", lambda: dist.allgather(arr(np.ones((2, 3 + r), np.float32))))
        step("gather ndim", lambda: dist.gather(arr(np.ones((2,) * (1 + (r > 0)), np.float32))))
        step("scatter axis", lambda: dist.scatter(arr(np.ones((4, 4), np.float32)) if r == 0 else None, src=0,
                                                  axis=0 if r == 0 else 1, backend=backend))
        step("mean of int on one rank", lambda: dist.allreduce(arr(np.ones(3), "int32" if r == 0 else "float32"),
                                                                op="mean"))
        step("after refusal", lambda: dist.allreduce(arr(ones)), total)
        step("bad src on one rank", lambda: dist.broadcast(arr(ones), src=0 if r == 0 else w + 5))
        # a NumPy view with a negative stride, on any backend's world (torch aborted on it)
        step("reversed view", lambda: dist.allreduce(np.arange(6, dtype=np.float32)[::-1]), np.arange(6)[::-1] * w,
             of="numpy")
        step("barrier vs allreduce", lambda: dist.barrier() if r == 0 else dist.allreduce(arr(ones)))
        step("final", lambda: dist.allreduce(arr(ones)), total)
    elif scenario == "no_shutdown":
        step("allreduce", lambda: dist.allreduce(arr(ones)), total)
        print("MDREPORT " + json.dumps({"rank": r, "steps": steps}), flush=True)
        print(f"MDDONE {r} 0", flush=True)
        return 0  # the script ends without dist.shutdown(): the exit hook must tear the group down
    dist.shutdown()
    print("MDREPORT " + json.dumps({"rank": r, "steps": steps}), flush=True)
    print(f"MDDONE {r} 0", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
