"""Suite ``startup`` (opt-in: ``--suite startup``): what multidev adds to a program's start, each
sample a fresh interpreter that times itself (``Variant.self_timed``).

- ``import multidev`` with NumPy imported already, against NumPy's own import (for scale); goal:
  under 50 ms. The row's check: ``import multidev`` imports no framework.
- The first call naming a backend (``md.zeros(1, backend=NAME)`` after ``import multidev``: the
  adapter's entry point, its module, the framework's import, the adapter's set-up, the creation),
  against the framework's import and its own first call (the baseline's ``startup_code``); goal:
  that is all it costs (within 1.1x, or 50 ms above).
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

from . import Case, Context, Goal, Variant, benchmark

STARTUP_GOALS = (
    Goal("import multidev under 50 ms above numpy", "import multidev", 0.05, metric="seconds",
         note="multidev's own import, NumPy imported already"),
    Goal("the first call naming a backend costs the framework's start-up", "first call", 1.1, slack_s=0.05,
         note="md.zeros(1, backend=NAME) after import multidev, against the framework's import and first call"),
)

_IMPORT = ("import time\nt0 = time.perf_counter()\nimport numpy\nt1 = time.perf_counter()\nimport multidev\n"
           "t2 = time.perf_counter()\nprint({out})")
_FIRST = ("import time\nimport numpy\nimport multidev as md\nt0 = time.perf_counter()\n"
          "md.zeros(1, backend={name!r})\nprint(time.perf_counter() - t0)")
_NATIVE = "import time\nimport numpy\nt0 = time.perf_counter()\n{code}\nprint(time.perf_counter() - t0)"
#: Prints the top-level packages ``import multidev`` brings in beyond the standard library and NumPy
#: (none: every framework is imported by its adapter, on first use).
_NEW_PACKAGES = ("import sys\nimport numpy\nbefore = set(sys.modules)\nimport multidev\n"
                 "print(sorted({m.split('.')[0] for m in set(sys.modules) - before}"
                 " - set(sys.stdlib_module_names) - {'multidev', 'numpy'}))")


def _run(code: str) -> str:
    """``code`` in a fresh interpreter; its last line. Bytecode is cached as after ``pip install``
    (``PYTHONDONTWRITEBYTECODE`` is dropped: with it set, every sample would time compiling
    multidev's sources, which an installed package never does; the warm-up writes the cache)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return p.stdout.strip().splitlines()[-1]


def _seconds(code: str) -> float:
    return float(_run(code))


@benchmark("startup", goals=STARTUP_GOALS)
def startup(ctx: Context) -> Iterator[Case]:
    """import multidev above numpy, and the first call naming a backend, in fresh interpreters."""

    def no_framework() -> tuple[bool, str]:
        got = _run(_NEW_PACKAGES)
        return got == "[]", f"packages (beyond the standard library and NumPy) imported by import multidev: {got}"

    yield Case("import multidev (numpy imported first)",
               {"md": Variant(_seconds, (_IMPORT.format(out="t2 - t1"),), self_timed=True,
                              label="import multidev (NumPy imported already), in a fresh interpreter"),
                "native": Variant(_seconds, (_IMPORT.format(out="t1 - t0"),), self_timed=True,
                                  label="import numpy, in a fresh interpreter")},
               check=no_framework, params={"note": "one interpreter per sample, bytecode cached"},
               group="import multidev",
               key="import multidev, NumPy imported first")
    code = getattr(ctx.native, "startup_code", "") if ctx.native is not None else ""
    native = (Variant(_seconds, (_NATIVE.format(code=code),), self_timed=True,
                      label=f"{code} (after import numpy), in a fresh interpreter") if code else None)

    def works() -> tuple[bool, str]:
        got = _run(f"import multidev as md\nx = md.zeros(1, backend={ctx.backend!r})\nprint(md.dtype_of(x))")
        return got == "float32", f"md.zeros(1, backend={ctx.backend!r}) -> {got}"

    yield Case(f"first call naming {ctx.backend}",
               {"md": Variant(_seconds, (_FIRST.format(name=ctx.backend),), self_timed=True,
                              label=f"md.zeros(1, backend={ctx.backend!r}) after import multidev, in a fresh "
                                    "interpreter"),
                "native": native},
               check=works, params={"note": "one interpreter per sample"}, group="first call",
               key="first call naming the backend")
