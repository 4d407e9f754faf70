"""The house rules, checked on the source: the core is layered (no import circle), holds no benchmark
code, no module imports another's private name, adapters use only the public adapter API, and no
backend is named outside its adapter (docs and tests aside)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = sorted(p for p in (ROOT / "multidev").glob("*.py"))  # the symbolic links are subpackages, not core
OUTSIDE = {"adapters": ROOT / "backends", "conformance": ROOT / "conformance_tests",
           "benchmarks": ROOT / "benchmarks", "examples": ROOT / "examples"}
BACKEND_NAMES = {"torch", "jax", "tensorflow", "mxnet", "cupy", "array_api"}
#: The only places in the core that name a backend, each for a stated reason.
ALLOWED_NAMES = {("distributed.py", "torch"): "TRANSPORT: multidev.distributed is built on torch.distributed"}


def _module(path: Path) -> str:
    if path.parent == ROOT / "multidev":
        return "multidev" if path.stem == "__init__" else f"multidev.{path.stem}"
    for sub, folder in OUTSIDE.items():
        if folder in path.parents or path.parent == folder:
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            return ".".join(["multidev", sub, *parts])
    raise AssertionError(path)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import in the file, relative ones
    resolved; function-level imports included."""
    mod = _module(path)
    pkg = mod if path.stem == "__init__" else mod.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend((a.name, [], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                up = parts[: len(parts) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            names = [a.name for a in node.names]
            out.append((base, names, node.lineno))
            # "from . import x" imports the submodule x
            if node.level and not node.module:
                out.extend((f"{base}.{n}", [], node.lineno) for n in names)
    return out


def test_no_core_module_imports_benchmarks() -> None:
    for p in CORE:
        for target, _, line in _imports(p):
            assert not target.startswith("multidev.benchmarks"), f"{p.name}:{line} imports {target}"


def test_core_has_no_import_circle() -> None:
    core = {_module(p) for p in CORE}
    graph = {m: set() for m in core}
    for p in CORE:
        m = _module(p)
        for target, names, _ in _imports(p):
            if target in core and target != m:
                graph[m].add(target)
            for n in names:  # from . import api
                if f"{target}.{n}" in core and f"{target}.{n}" != m:
                    graph[m].add(f"{target}.{n}")
    # the package __init__ is the public face: it imports everything and nothing imports it back
    # except through "import multidev" in functions of modules above it (the CLI)
    graph.pop("multidev")
    for deps in graph.values():
        deps.discard("multidev")
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                raise AssertionError("import circle: " + " -> ".join([*stack, m, d]))
            if d not in state:
                visit(d, [*stack, m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def _all_sources() -> list[Path]:
    files = list(CORE)
    for folder in OUTSIDE.values():
        files += sorted(folder.rglob("*.py"))
    return files


def test_no_module_imports_another_modules_private_name() -> None:
    bad = []
    for p in _all_sources():
        for target, names, line in _imports(p):
            if not target.startswith("multidev"):
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    bad.append(f"{p.relative_to(ROOT)}:{line}: from {target} import {n}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", sorted((ROOT / "backends").rglob("*.py")), ids=lambda p: p.name)
def test_adapters_import_only_public_api(path: Path) -> None:
    public = {"multidev", "multidev.adapter", "multidev.errors", "multidev.benchmarks.baseline"}
    for target, _, line in _imports(path):
        if target.startswith("multidev") and not target.startswith("multidev.adapters"):
            assert target in public, f"{path.name}:{line} imports {target}; adapters import multidev.adapter"
        assert ".multidev._" not in f".{target}", f"{path.name}:{line} imports private module {target}"


def _names_in(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in BACKEND_NAMES:
            found.append((node.value, node.lineno))
    return found


@pytest.mark.parametrize("path", [p for p in _all_sources() if ROOT / "backends" not in p.parents
                                  and ROOT / "examples" not in p.parents], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_backend_name_outside_adapters(path: Path) -> None:
    """String literals naming a backend outside backends/ (docstrings and comments are prose, and
    examples are documentation)."""
    docs = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                docs.add(body[0].value.lineno)
    bad = [(n, line) for n, line in _names_in(path) if line not in docs
           and (path.name, n) not in ALLOWED_NAMES]
    assert not bad, f"{path.relative_to(ROOT)} names backends {bad}"
