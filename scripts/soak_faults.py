"""The fault-injection soak (issue 33), on demand: ``python scripts/soak_faults.py --minutes 10``.

Until the time is up, it repeats three kinds of round and counts, per fault, how often it was tried,
survived (a typed error, or the right result, and the caller's data unchanged), lost data (a wrong
value, or an input changed by a failed call) or broke (anything else: an untyped error, a hang):

- single-process faults (``tests/test_faults.py``'s cases): a bad leaf beside a model, a tuple
  subclass that cannot be rebuilt, scopes exited out of order or from another thread on every
  installed backend, bad ``convert`` arguments, a deep structure from a deep caller;
- concurrency: ``--threads`` threads of mixed NumPy/torch/JAX calls (create, move, convert, copy
  to the host, scopes), every result checked against NumPy;
- every ``--engines-every`` rounds, the multi-process scenarios (``tests/test_faults_engines.py``:
  start-up faults, ranks that never join, a killed rank, survivors), each test a fault.

Prints one summary line per fault and a total; exit status 1 when anything lost data or broke.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import random
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import multidev as md  # noqa: E402

Counts = collections.defaultdict(lambda: collections.Counter())  # fault -> {tried, survived, lost, broke}
_lock = threading.Lock()


def record(fault: str, outcome: str) -> None:
    with _lock:
        Counts[fault]["tried"] += 1
        Counts[fault][outcome] += 1


def have(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def guarded(fault: str, fn: Callable[[], bool]) -> None:
    """``fn()`` True: survived; False: lost data; an exception: broke (with its traceback once)."""
    try:
        record(fault, "survived" if fn() else "lost")
    except Exception:  # noqa: BLE001 - counted and shown
        record(fault, "broke")
        if Counts[fault]["broke"] == 1:
            traceback.print_exc()


# -- single-process faults ---------------------------------------------------------------------------------
def bad_leaf_beside_a_model() -> bool:
    import torch

    net = torch.nn.Linear(3, 3)
    before = [p.detach().clone() for p in net.parameters()]
    try:
        md.to([net, {"x": md.ones(2)}, "bad"], "cpu:0")
    except md.UnsupportedTensorError:
        return all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    return False


def stubborn_tuple() -> bool:
    import test_faults

    x = md.arange(4)
    try:
        md.to([x, test_faults.Stubborn("t", x, x)], "cpu:1")
    except md.UnsupportedTensorError:
        return md.device_of(x) == md.Device("cpu", 0) and md.to_numpy(x).tolist() == [0, 1, 2, 3]
    return False


def scopes(backend: str) -> Callable[[], bool]:
    def run() -> bool:
        import test_faults

        test_faults.scope_misuse(backend)  # asserts inside: an AssertionError is "broke"
        return True
    return run


def bad_convert_argument() -> bool:
    x = md.ones(3)
    try:
        md.convert(x, "numpy", copy="yes")  # type: ignore[arg-type]
    except ValueError:
        return md.to_numpy(x).tolist() == [1.0, 1.0, 1.0]
    return False


def deep_caller() -> bool:
    import test_faults

    s = test_faults._nested(200)
    out = test_faults._at_depth(600, lambda: md.to_host(s))
    depth = 0
    while isinstance(out, (list, dict)):
        out = out["k"] if isinstance(out, dict) else out[0]
        depth += 1
    return depth == 200 and np.array_equal(out, np.ones(1, np.float32))


# -- concurrency -------------------------------------------------------------------------------------------
def mixed_calls(n: int, seed: int, backends: list[str]) -> bool:
    rng = random.Random(seed)
    for _ in range(n):
        b = rng.choice(backends)
        k = rng.randint(1, 64)
        ref = np.arange(k, dtype=np.float32) * 0.5
        x = md.asarray(ref, backend=b)
        op = rng.randrange(5)
        if op == 0:
            y = md.to_host(x)
        elif op == 1:
            y = md.to_numpy(md.convert(x, rng.choice(backends)))
        elif op == 2:
            y = md.to_host({"a": [x, (x,)]})["a"][1][0]
        elif op == 3:
            with md.device_scope("cpu:0", backend=b):
                y = md.to_numpy(md.copy(x))
        else:
            y = md.to_host(md.to(x, "cpu:0", non_blocking=True).wait())
        if not np.array_equal(np.asarray(y), ref):
            return False
    return True


def concurrency(threads: int, calls: int, backends: list[str], seed: int) -> None:
    results: list[bool] = [False] * threads

    def work(i: int) -> None:
        try:
            results[i] = mixed_calls(calls, seed + i, backends)
        except Exception:  # noqa: BLE001 - counted as broke below
            traceback.print_exc()
            results[i] = False
    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    for ok, t in zip(results, ts):
        record(f"{threads} threads x {calls} mixed calls", "survived" if ok else ("broke" if t.is_alive() else "lost"))


# -- the engines ---------------------------------------------------------------------------------------------
def engines() -> None:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "test_faults_engines.py")], capture_output=True, text=True,
                       cwd=ROOT, timeout=900)
    for line in r.stdout.splitlines():
        for tag, outcome in (("PASSED ", "survived"), ("FAILED ", "broke"), ("ERROR ", "broke")):
            if line.startswith(tag):
                record("engine: " + line[len(tag):].split("::")[-1].split(" - ")[0], outcome)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--calls", type=int, default=300, help="mixed calls per thread per round")
    p.add_argument("--engines-every", type=int, default=5, help="run the multi-process scenarios every N rounds "
                   "(0: never)")
    a = p.parse_args(argv)
    backends = [b for b in ("numpy", "torch", "jax") if b == "numpy" or have(b)]
    single: dict[str, Callable[[], bool]] = {"a failed call changes nothing (stubborn tuple)": stubborn_tuple,
                                             "convert(copy='yes')": bad_convert_argument,
                                             "200 levels from 600 frames deep": deep_caller}
    if have("torch"):
        single["a bad leaf beside a torch model"] = bad_leaf_beside_a_model
    for b in ("numpy", "torch", "jax", "tensorflow", "mxnet"):
        if b == "numpy" or have(b):
            single[f"scopes misused on {b}"] = scopes(b)
    end = time.monotonic() + a.minutes * 60
    rounds = 0
    while time.monotonic() < end:
        for name, fn in single.items():
            guarded(name, fn)
        concurrency(a.threads, a.calls, backends, seed=rounds * 1000)
        rounds += 1
        if a.engines_every and rounds % a.engines_every == 1:
            engines()
    bad = 0
    print(f"soak: {rounds} rounds in {a.minutes:g} min")
    for fault, c in sorted(Counts.items()):
        bad += c["lost"] + c["broke"]
        print(f"  {fault}: tried {c['tried']}, survived {c['survived']}, lost data {c['lost']}, broke {c['broke']}")
    total = collections.Counter()
    for c in Counts.values():
        total.update(c)
    print(f"total: tried {total['tried']}, survived {total['survived']}, lost data {total['lost']}, "
          f"broke {total['broke']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
