"""What the book's programs share: the command line (``--backend``, ``--devices``, ``--json``), the
devices a run uses, the checks each program makes and reports, and the data and initial weights of
the training sections (scikit-learn's digits, or a synthetic stand-in where scikit-learn is absent).

A program is ``run(md, name, counts, args, report)`` for one backend; :func:`main` runs it on every
backend asked for and exits non-zero when a check fails, so a program that runs is a program whose
claims held.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The backends the programs are written for, in the order they run.
BACKENDS = ("numpy", "torch", "jax", "tensorflow", "mxnet", "cupy")
CLASSES = 10


@dataclass
class Report:
    """One program on one backend: named checks (each passed or failed, with its detail) and figures."""

    program: str
    backend: str
    verbose: bool = True
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def check(self, name: str, ok: Any, detail: Any = "") -> bool:
        """Record check ``name``; ``ok`` is anything true or false."""
        passed = bool(ok)
        self.checks[name] = {"ok": passed, "detail": str(detail)}
        if self.verbose or not passed:
            print(f"  {'ok  ' if passed else 'FAIL'} {name}" + (f": {detail}" if detail != "" else ""), flush=True)
        return passed

    def figure(self, name: str, value: Any) -> Any:
        self.figures[name] = value
        return value

    def note(self, text: str) -> None:
        self.notes.append(text)
        if self.verbose:
            print(f"  note {text}", flush=True)

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks.values())

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": self.checks, "figures": self.figures, "notes": self.notes}


Run = Callable[[Any, str, list[int], argparse.Namespace, Report], None]


def parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", help=f"comma-separated; default: every installed one of {', '.join(BACKENDS)}")
    p.add_argument("--devices", default="2", help="N for the N-device runs, comma-separated (e.g. 2,4): "
                   "virtual CPU devices on a CPU, GPUs first where there are GPUs (default 2)")
    p.add_argument("--epochs", type=int, default=None, help="training sections: epochs (default: the section's)")
    p.add_argument("--quick", action="store_true", help="smaller sizes (CI)")
    p.add_argument("--json", metavar="FILE", help="write every check and figure to FILE")
    p.add_argument("--quiet", action="store_true", help="print failed checks and the summary only")
    return p


def device_counts(spec: str) -> list[int]:
    try:
        counts = sorted({int(s) for s in str(spec).split(",") if s.strip()})
    except ValueError:
        raise SystemExit(f"--devices takes comma-separated counts such as 2,4, got {spec!r}") from None
    if not counts or counts[0] < 1:
        raise SystemExit(f"--devices takes counts of at least 1, got {spec!r}")
    return counts


def start(counts: Sequence[int]) -> Any:
    """Ask for ``max(counts)`` virtual CPU devices before any framework starts (a value set in the
    environment wins), then import multidev."""
    from multidev.registry import configure_virtual_devices

    configure_virtual_devices(max(2, *counts))
    import multidev as md

    return md


def backends(md: Any, spec: str | None) -> list[str]:
    """The backends named (each must be installed: a one-line error otherwise), or every installed one
    (CuPy only where it has a GPU)."""
    if spec:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        for n in names:
            md.backend(n)  # BackendNotAvailableError, with the install line
        return names
    have = set(md.backends())
    return [n for n in BACKENDS if n in have]


def pick_devices(md: Any, name: str, n: int) -> list[Any]:
    """The first ``n`` devices of the backend, GPUs first (the book's ``try_all_gpus``, with CPU
    devices after them), fewer where it has fewer."""
    devs = md.devices(backend=name)
    return ([d for d in devs if d.is_gpu] + [d for d in devs if not d.is_gpu])[:n]


def mixed(devices: Sequence[Any]) -> bool:
    """Whether ``devices`` mix kinds (a GPU beside a CPU): their float arithmetic differs in rounding."""
    return len({d.kind for d in devices}) > 1


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_of(fn: Callable[[], Any], reps: int = 3) -> float:
    """The fastest of ``reps`` runs of ``fn`` (seconds): the figure least disturbed by other load."""
    return min(timed(fn) for _ in range(reps))


@contextlib.contextmanager
def full_float32(name: str) -> Iterator[None]:
    """float32 products in full float32 within the block, TF32 off where a GPU would use it (JAX's
    default matmul precision, torch's cuDNN and matmul flags), restored after: the programs compare
    runs on different devices, and TF32's 10-bit mantissa makes each product's rounding about a
    thousand times larger, which SGD grows from step to step."""
    if name == "jax":
        import jax

        with jax.default_matmul_precision("highest"):
            yield
    elif name == "torch":
        import torch

        flags = torch.backends.cuda.matmul, torch.backends.cudnn
        saved = [f.allow_tf32 for f in flags]
        for f in flags:
            f.allow_tf32 = False
        try:
            yield
        finally:
            for f, v in zip(flags, saved):
                f.allow_tf32 = v
    else:
        yield


def main(program: str, doc: str, run: Run, argv: list[str] | None = None) -> int:
    """The command line of one program: run it on every backend asked for, print each check, write
    ``--json``; 0 when every check held."""
    args = parser(doc).parse_args(argv)
    counts = device_counts(args.devices)
    md = start(counts)
    results = {name: run_one(md, program, run, name, counts, args) for name in backends(md, args.backend)}
    return finish({program: results}, args)


def run_one(md: Any, program: str, run: Run, name: str, counts: list[int], args: argparse.Namespace
            ) -> dict[str, Any]:
    """``run`` on backend ``name``; an exception is a failed check ``ran`` with its traceback."""
    rep = Report(program, name, verbose=not args.quiet)
    print(f"{program} on {name} {md.backend(name).version()} "
          f"(devices here: {', '.join(map(str, pick_devices(md, name, 64)))})", flush=True)
    try:
        with full_float32(name):
            run(md, name, counts, args, rep)
        rep.check("ran", True)
    except Exception as e:  # noqa: BLE001 - reported as a failed check, the next backend still runs
        rep.check("ran", False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}")
    out = rep.as_dict()
    out["devices_here"] = [str(d) for d in pick_devices(md, name, 64)]
    out["version"] = md.backend(name).version()
    return out


def finish(results: dict[str, dict[str, dict[str, Any]]], args: argparse.Namespace) -> int:
    """Print the summary, write ``--json``; the exit status."""
    bad = [(p, b, c) for p, per in results.items() for b, r in per.items()
           for c, v in r["checks"].items() if not v["ok"]]
    total = sum(len(r["checks"]) for per in results.values() for r in per.values())
    for p, per in results.items():
        print(f"{p}: " + ", ".join(f"{b} {'ok' if r['ok'] else 'FAILED'}" for b, r in per.items()))
    print(f"{total - len(bad)}/{total} checks held" + (": failed " + ", ".join(f"{p}/{b}/{c}" for p, b, c in bad)
                                                        if bad else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": {k: v for k, v in vars(args).items() if k != "json"}, "argv": sys.argv,
                       "results": results, "ok": not bad}, f, indent=1, default=str)
    return 1 if bad else 0


# -- the training sections' data and weights --------------------------------------------------------
def digits(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """scikit-learn's 1797 8x8 digits as float32 images ``(N, 1, 8, 8)`` and int64 labels, split
    80/20 by a seeded permutation, the pixels standardized by the training set's mean and spread;
    where scikit-learn is not installed, as many synthetic digits (a fixed random template per class
    plus noise: learnable, never downloaded). The last value says which.

    The file scikit-learn ships is read directly, without importing scikit-learn: its OpenMP
    runtime, loaded beside torch's, slows torch's CPU kernels a hundredfold on a small machine."""
    import gzip
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    path = None if spec is None or not spec.submodule_search_locations else \
        Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if path is not None and path.exists():
        with gzip.open(path, "rt") as f:
            raw = np.loadtxt(f, delimiter=",")
        data, target = raw[:, :-1], raw[:, -1].astype(np.int64)
        source = "scikit-learn digits"
    else:
        rng = np.random.default_rng(1234)
        templates = rng.uniform(0, 1, size=(CLASSES, 64))
        target = rng.integers(0, CLASSES, size=1797)
        data = np.clip(templates[target] + rng.normal(0, 0.35, size=(1797, 64)), 0, 1) * 16
        source = "synthetic (scikit-learn not installed)"
    X = (data / 16.0).reshape(-1, 1, 8, 8)
    y = target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(X))
    cut = int(0.8 * len(X))
    mean, std = X[order[:cut]].mean(), X[order[:cut]].std()
    X = ((X - mean) / std).astype(np.float32)
    return X[order[:cut]], y[order[:cut]], X[order[cut:]], y[order[cut:]], source


#: LeNet for 8x8 digits (D2L 12.5's LeNet, sized down): conv 3x3 1->6 (same), ReLU, 2x2 average
#: pool, conv 3x3 6->16 (same), ReLU, 2x2 average pool, dense 64->32, ReLU, dense 32->10.
LENET_SHAPES = ((6, 1, 3, 3), (6,), (16, 6, 3, 3), (16,), (64, 32), (32,), (32, CLASSES), (CLASSES,))


def lenet_weights(seed: int = 0) -> list[np.ndarray]:
    """LeNet's initial parameters on the host (conv kernels OIHW, dense weights in x out), He-scaled:
    every backend starts from these."""
    rng = np.random.default_rng(seed)
    out = []
    for s in LENET_SHAPES:
        if len(s) == 1:
            out.append(np.zeros(s, np.float32))
        else:
            fan_in = int(np.prod(s[1:])) if len(s) == 4 else s[0]
            out.append((rng.normal(size=s) * np.sqrt(2.0 / fan_in)).astype(np.float32))
    return out


def mlp_weights(sizes: Sequence[int] = (64, 64, CLASSES), seed: int = 0) -> list[np.ndarray]:
    """An MLP's initial parameters on the host (NumPy has no convolution: its programs train this)."""
    rng = np.random.default_rng(seed)
    out = []
    for a, b in itertools.pairwise(sizes):
        out += [(rng.normal(size=(a, b)) * np.sqrt(2.0 / a)).astype(np.float32), np.zeros(b, np.float32)]
    return out


def numpy_mlp_grad(ps: list[Any], X: Any, Y: Any) -> tuple[Any, list[Any]]:
    """The summed softmax cross-entropy of a ReLU MLP and its gradients, by hand (``Y`` one-hot,
    ``X`` flattened). Works on multidev's tagged NumPy arrays: every result keeps X's device."""
    hs = [X]
    for i in range(0, len(ps) - 2, 2):
        hs.append(np.maximum(hs[-1] @ ps[i] + ps[i + 1], 0))
    o = hs[-1] @ ps[-2] + ps[-1]
    o = o - o.max(axis=1, keepdims=True)
    logp = o - np.log(np.exp(o).sum(axis=1, keepdims=True))
    loss = -(Y * logp).sum(keepdims=True)  # keepdims: a full reduction would drop the device tag
    d = np.exp(logp) - Y
    grads: list[Any] = []
    for i in range(len(ps) - 2, -1, -2):
        h = hs[i // 2]
        grads = [h.T @ d, d.sum(axis=0)] + grads
        if i:
            d = (d @ ps[i].T) * (h > 0)
    return loss, grads


def numpy_mlp_forward(ps: list[Any], X: Any) -> Any:
    h = X
    for i in range(0, len(ps) - 2, 2):
        h = np.maximum(h @ ps[i] + ps[i + 1], 0)
    return h @ ps[-2] + ps[-1]


def accuracy(logits: np.ndarray, y: np.ndarray) -> float:
    return float((np.asarray(logits).argmax(axis=1) == y).mean())


def batches(n: int, batch: int, epoch: int, seed: int = 1) -> list[np.ndarray]:
    """The minibatches of one epoch (the ragged last one dropped), the same for every backend and
    device count."""
    order = np.random.default_rng(seed + epoch).permutation(n)
    return [order[i:i + batch] for i in range(0, n - batch + 1, batch)]
