"""The README's distributed snippet, unchanged, where only one engine's framework is installed:

- ``pip install "multidev[mpi]"`` (NumPy, mpi4py, Open MPI; no torch, no JAX) under ``mpiexec -n 2``;
- a JAX-only environment (no torch, no mpi4py) as two JAX processes, with JAX arrays
  (``MULTIDEV_BACKEND=jax``).

The other frameworks are hidden from the processes by a ``sitecustomize`` that makes importing them
fail as in an environment without them (``import torch`` raises ModuleNotFoundError,
``importlib.util.find_spec("torch")`` is None); at exit each process prints which frameworks it had
imported, so the test sees the snippet ran on the one framework (tests/test_docs.py runs it under
torchrun, mpiexec and JAX processes in the full environment).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from multidev.conformance.test_distributed import engine_unavailable, worker_env

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("torch", "jax", "jaxlib", "tensorflow", "mxnet", "cupy", "mpi4py")

_HIDER = '''
import atexit, importlib.abc, importlib.util, os, sys
HIDDEN = set(filter(None, os.environ.get("MD_HIDE", "").split(",")))
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden: this environment lacks it)", name=name)
        return None
sys.meta_path.insert(0, _Hide())
_find = importlib.util.find_spec
def _find_spec(name, package=None):
    return None if name.split(".")[0] in HIDDEN else _find(name, package)
importlib.util.find_spec = _find_spec
atexit.register(lambda: print("MDMODULES", sorted(m for m in FRAMEWORKS if m in sys.modules), flush=True))
'''.replace("FRAMEWORKS", repr(FRAMEWORKS))


def readme_snippet() -> str:
    """The README's distributed snippet: the ``# train.py`` fence under a torchrun run marker (which
    tests/test_docs.py runs under torchrun; here it runs under mpiexec and as JAX processes)."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- run: torchrun [^>]*-->\n```python\n(# train\.py\n.*?)\n```", text, re.S)
    assert m, "README.md has no '# train.py' snippet under a '<!-- run: torchrun ... -->' marker"
    return m.group(1) + "\n"


def _run(tmp_path: Path, engine: str, hide: tuple[str, ...], **env: str) -> list[str]:
    why = engine_unavailable(engine)
    if why:
        pytest.skip(why)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(_HIDER)
    script = tmp_path / "train.py"
    script.write_text(readme_snippet())
    e = worker_env(MD_HIDE=",".join(hide), MULTIDEV_JAX_CPU_DEVICES="2", **env)
    e["PYTHONPATH"] = f"{shim}:{e.get('PYTHONPATH', '')}"
    cmd = [sys.executable, "-m", "multidev.distributed.launch", "-n", "2", "--engine", engine, "--grace", "10",
           str(script)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=e, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-4000:]
    return p.stdout.splitlines()


def test_the_readme_snippet_runs_with_mpi_alone(tmp_path: Path) -> None:
    """NumPy, mpi4py and Open MPI: the mpi engine, NumPy arrays, no torch and no JAX anywhere."""
    out = _run(tmp_path, "mpi", ("torch", "jax", "jaxlib", "tensorflow", "mxnet", "cupy"))
    text = "\n".join(out)  # (the ranks share one stdout: lines may interleave)
    assert text.count("on the mpi engine") == 2 and text.count("OMPI_COMM_WORLD_SIZE=2 is set") == 2, text
    assert text.count("MDMODULES ['mpi4py']") == 2, text  # each rank: mpi4py alone (the launcher: [])
    assert text.count("MDMODULES [") == 3, text


def test_the_readme_snippet_runs_in_a_jax_only_environment(tmp_path: Path) -> None:
    """JAX and NumPy only: the jax engine, JAX arrays (MULTIDEV_BACKEND=jax), no torch, no mpi4py."""
    out = _run(tmp_path, "jax", ("torch", "tensorflow", "mxnet", "cupy", "mpi4py"), MULTIDEV_BACKEND="jax")
    text = "\n".join(out)  # (the ranks share one stdout: lines may interleave)
    assert text.count("on the jax engine") == 2 and text.count("JAX_COORDINATOR_ADDRESS=") == 2, text
    assert text.count("MDMODULES ['jax', 'jaxlib']") == 2, text  # each rank: JAX alone (the launcher: [])
    assert text.count("MDMODULES [") == 3, text
