"""What the per-backend worker tests share (test_compile, test_training): the backends installed
here, and one child interpreter per backend with 2 virtual devices (device counts are fixed when a
framework starts) whose checks are each reported separately."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

#: The frameworks a child conformance run exchanges tensors with (the suite's partners).
PARTNERS = ("torch", "jax", "tensorflow", "mxnet")


def child_suite() -> tuple[list[str], int]:
    """What a test that re-runs the whole conformance suite in a child passes after ``--``, and the
    fewest passed checks it must see. CI's modern lane sets ``MULTIDEV_CHILD_SUITES=partners``: there
    such a test runs only the checks that exchange with another framework (the fast lane, NumPy 2
    with no framework installed, runs the same adapters' whole suite; running it twice adds nothing)."""
    if os.environ.get("MULTIDEV_CHILD_SUITES") == "partners":
        return ["-k", " or ".join(PARTNERS)], 20
    return [], 250


#: The top of every worker: ``NAME`` (argv[1]) with its adapter loaded, ``check`` (a decorator that
#: runs a check and records "OK" or its traceback) and ``host`` (a tensor as a NumPy array).
PRELUDE = """
import json, os, sys, traceback
import numpy as np
import multidev as md
NAME = sys.argv[1]
md.backend(NAME)  # the adapter first: it prepares the framework's import (MXNet on NumPy 1.26)
results = {}

def check(fn):
    try:
        fn()
        results[fn.__name__] = "OK"
    except Exception:
        results[fn.__name__] = traceback.format_exc(limit=6)
    return fn

def host(x):
    return np.asarray(md.to_numpy(x))
"""

#: The worker's last line: the results, for :func:`run_worker`.
REPORT = '\nprint("MDRESULT " + json.dumps(results))\n'


def installed() -> list[str]:
    """numpy plus every framework installed here (MXNet only beside numpy<2)."""
    out = ["numpy"]
    for name in ("torch", "jax", "tensorflow", "mxnet"):
        if importlib.util.find_spec(name) is not None and not (
                name == "mxnet" and int(np.__version__.split(".")[0]) >= 2):
            out.append(name)
    return out


def run_worker(code: str, name: str, path: Path | None = None) -> dict[str, str]:
    """Run ``PRELUDE + code + REPORT`` for backend ``name`` (from the file ``path`` when given:
    TorchScript needs the functions' source) and return each check's outcome."""
    script = PRELUDE + code + REPORT
    env = dict(os.environ, MULTIDEV_JAX_CPU_DEVICES="2", MULTIDEV_TF_CPU_DEVICES="2", MULTIDEV_NUMPY_DEVICES="2",
               MULTIDEV_MXNET_CPU_DEVICES="2", TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    if path is not None:
        path.write_text(script)
        argv = [sys.executable, str(path), name]
    else:
        argv = [sys.executable, "-c", script, name]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    line = [x for x in p.stdout.splitlines() if x.startswith("MDRESULT ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-4000:]
    return dict(json.loads(line[0][len("MDRESULT "):]))
