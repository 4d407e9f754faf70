"""Every Python snippet in README.md and docs/*.md runs as written, each in a fresh interpreter.

A snippet runs the way the HTML comment right above its fence says:

- ``<!-- run: torchrun --nproc_per_node=2 -->``: under torchrun with those arguments (on
  localhost, a free port); every process must exit 0;
- ``<!-- run: mpiexec -n 2 -->``: under MPI's launcher (the mpi engine's ``mpiexec``, with the flags
  this machine needs); ``<!-- run: python -m multidev.distributed.launch -n 2 --engine jax -->``:
  under multidev's local launcher. Several ``run`` markers above one snippet run it under each;
- ``<!-- needs: gpu -->`` (or ``gpus=2``): skipped, with that reason, without so many GPUs;
- no comment, or ``<!-- run: python -->`` beside launcher markers (the same script alone too):
  ``python snippet.py``.

A snippet that names a framework (``import torch``, ``backend="jax"``) is skipped, with the reason,
where that framework is not installed (the fast lane has NumPy only). Virtual CPU devices: 2 per
backend, as ``multidev demo`` sets them.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRAMEWORKS = ("torch", "jax", "tensorflow", "mxnet", "cupy", "array_api_strict", "flax", "optax", "equinox")
_FENCE = re.compile(r"^```python\s*$")
_MARK = re.compile(r"^<!--\s*(run|needs)\s*:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    runs: tuple[str, ...]  # e.g. ("torchrun --nproc_per_node=2", "mpiexec -n 2"); () runs it plainly
    needs: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def snippets(path: Path) -> list[Snippet]:
    lines = path.read_text().splitlines()
    out = []
    i = 0
    while i < len(lines):
        if _FENCE.match(lines[i]):
            start = i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            runs: list[str] = []
            needs: tuple[str, ...] = ()
            k = start - 1
            while k >= 0 and (m := _MARK.match(lines[k].strip())):
                if m.group(1) == "run":
                    runs.insert(0, m.group(2))
                else:
                    needs = tuple(v.strip() for v in m.group(2).split(",") if v.strip())
                k -= 1
            out.append(Snippet(path, start + 1, "\n".join(lines[start + 1:j]) + "\n", tuple(runs), needs))
            i = j
        i += 1
    return out


ALL = [s for p in FILES for s in snippets(p)]
#: Every snippet under each of its launchers.
RUNS = [(s, run) for s in ALL for run in (s.runs or (None,))]


def frameworks_named(code: str) -> set[str]:
    """Frameworks a snippet imports or names as a backend."""
    names = set(re.findall(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", code, re.M))
    names |= set(re.findall(r"""backend\s*=\s*["']([A-Za-z_]\w*)["']""", code))
    names |= set(re.findall(r"""md\.convert\([^,]+,\s*["']([A-Za-z_]\w*)["']""", code))
    return {n for n in names if n in FRAMEWORKS}


def _installed(mod: str) -> bool:
    if mod == "mxnet" and int(np.__version__.split(".")[0]) >= 2:
        return False  # MXNet 1.9.1 needs numpy<2
    return importlib.util.find_spec(mod) is not None


@functools.cache
def gpu_count() -> int:
    code = "import multidev as md; print(max([md.num_gpus(backend=b) for b in md.backends()] or [0]))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return int(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 and p.stdout.strip() else 0


def _free_port() -> int:
    from multidev.distributed.launch import free_port

    return free_port()


def _need_engine(snip: Snippet, engine: str) -> None:
    from multidev.distributed.engine import engine_class

    why = engine_class(engine).missing()
    if why:
        pytest.skip(f"{snip.id} runs on the {engine} engine: {why}")


def test_every_file_has_its_snippets_found() -> None:
    assert any(s.path.name == "README.md" for s in ALL)
    for p in FILES:
        fences = sum(1 for line in p.read_text().splitlines() if _FENCE.match(line))
        assert fences == len(snippets(p)), p


@pytest.mark.slow
@pytest.mark.parametrize(("snip", "run"), RUNS, ids=[s.id + ("" if r is None else f"[{r}]") for s, r in RUNS])
def test_snippet_runs_as_written(snip: Snippet, run: str | None, tmp_path: Path) -> None:
    missing = sorted(f for f in frameworks_named(snip.code) if not _installed(f))
    if missing:
        pytest.skip(f"{snip.id} needs {', '.join(missing)}, not installed here")
    for need in snip.needs:
        want = 1 if need == "gpu" else int(need.split("=", 1)[1]) if need.startswith("gpus=") else None
        if want is None:
            pytest.fail(f"{snip.id}: unknown marker 'needs: {need}' (gpu, gpus=N)")
        if gpu_count() < want:
            pytest.skip(f"{snip.id} needs {need}: this machine has {gpu_count()} GPU(s)")
    script = tmp_path / "snippet.py"
    script.write_text(snip.code)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    for var in ("MULTIDEV_JAX_CPU_DEVICES", "MULTIDEV_TF_CPU_DEVICES", "MULTIDEV_NUMPY_DEVICES",
                "MULTIDEV_MXNET_CPU_DEVICES"):
        env.setdefault(var, "2")
    if run is None or run == "python":
        cmd = [sys.executable, str(script)]
    else:
        words = run.split()
        launch = [sys.executable, "-m", "multidev.distributed.launch"]
        if words[0] == "torchrun":
            if not _installed("torch"):
                pytest.skip(f"{snip.id} runs under torchrun, which needs torch")
            cmd = [sys.executable, "-m", "torch.distributed.run", *words[1:], "--master_addr=127.0.0.1",
                   f"--master_port={_free_port()}", str(script)]
        elif words[0] == "mpiexec" and words[1:2] == ["-n"] and len(words) == 3:
            _need_engine(snip, "mpi")
            cmd = [*launch, "-n", words[2], "--engine", "mpi", str(script)]
        elif words[:3] == ["python", "-m", "multidev.distributed.launch"] and "--engine" in words:
            _need_engine(snip, words[words.index("--engine") + 1])
            cmd = [*launch, *words[3:], str(script)]
        else:
            pytest.fail(f"{snip.id}: unknown marker 'run: {run}' (python, torchrun ARGS, mpiexec -n N, "
                        "python -m multidev.distributed.launch ARGS)")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)
    assert p.returncode == 0, f"{snip.id} failed ({' '.join(cmd[1:3])}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"


def _docs_hooks():  # the mkdocs hook module, loaded by path (scripts/ is no package)
    import importlib.util

    spec = importlib.util.spec_from_file_location("md_docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_reference_covers_the_public_api() -> None:
    """What `mkdocs build --strict` checks first (scripts/docs_hooks.py): every public name is on a
    page of docs/reference/ with a docstring, every name a page shows exists."""
    assert _docs_hooks().problems() == []


def test_the_reference_check_catches_a_renamed_or_undocumented_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import multidev as md

    hooks = _docs_hooks()

    def undocumented() -> None:
        pass

    monkeypatch.setattr(md, "brand_new", undocumented, raising=False)
    monkeypatch.setattr(md, "__all__", [*md.__all__, "brand_new"])
    found = hooks.problems()
    assert "multidev.brand_new is public but on no page of docs/reference/" in found
    assert "multidev.brand_new has no docstring of its own" in found
    monkeypatch.setattr(hooks, "REFERENCE", ROOT / "build" / "tmp-reference")
    page = hooks.REFERENCE / "x.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("::: multidev.renamed_away\n")
    assert "build/tmp-reference/x.md: `::: multidev.renamed_away` names nothing that exists" in hooks.problems()
