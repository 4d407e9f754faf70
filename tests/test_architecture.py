"""The house rules, checked on the source.

- One path per module: no committed symbolic link; the top-level folders are mapped into the package
  by pyproject (every folder with an ``__init__.py`` is listed there, and nothing else is); a folder
  imported under its own name refuses; a whole import loads each file once; the wheel holds the
  package alone (no benchmark results, no shell scripts).
- Layers: no import circle anywhere in the package (core, adapters, suite, benchmarks, examples); the
  core holds no benchmark code; no module imports another's private name; adapters use only the
  public adapter API; no backend is named outside its adapter or baseline (docs and tests aside).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: package name -> its folder, as pyproject maps them (``multidev.adapters`` -> ``backends/``).
PACKAGE_DIRS = {name: ROOT / folder for name, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}
LISTED = set(PYPROJECT["tool"]["setuptools"]["packages"])
CORE = sorted((ROOT / "multidev").rglob("*.py"))
BACKEND_NAMES = {"torch", "jax", "tensorflow", "mxnet", "cupy", "array_api"}
#: Where framework code lives: the adapters, and each framework's own calls for the bench.
FRAMEWORK_CODE = (ROOT / "backends", ROOT / "benchmarks" / "baselines")
#: The only places outside them that name a backend, each for a stated reason.
ALLOWED_NAMES: dict[tuple[str, str], str] = {
    ("distributed.py", "torch"): "TRANSPORT: multidev.distributed is built on torch.distributed"}


def _module(path: Path) -> str:
    """The one importable name of a source file, from pyproject's mapping (the deepest folder wins)."""
    best = max((folder for folder in PACKAGE_DIRS.values() if folder == path.parent or folder in path.parents),
               key=lambda f: len(f.parts))
    name = next(n for n, f in PACKAGE_DIRS.items() if f == best)
    rel = path.relative_to(best).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([name, *parts])


def _package_sources() -> list[Path]:
    files: list[Path] = []
    for folder in dict.fromkeys(PACKAGE_DIRS.values()):
        files += sorted(p for p in folder.rglob("*.py") if "results" not in p.relative_to(folder).parts)
    return sorted(set(files))


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
    return out


# -- one path per module ------------------------------------------------------------------------
def test_no_committed_file_is_a_symbolic_link() -> None:
    try:
        listing = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the committed modes cannot be read")
    links = [ln.split("\t")[-1] for ln in listing.stdout.splitlines() if ln.startswith("120000")]
    assert not links, f"committed symbolic links (one path per file): {links}"


def test_every_package_folder_is_listed_in_pyproject_and_nothing_else() -> None:
    found = set()
    for folder in dict.fromkeys(PACKAGE_DIRS.values()):
        for init in folder.rglob("__init__.py"):
            found.add(_module(init))
    assert found == LISTED, (f"folders with an __init__.py but not listed in pyproject: {sorted(found - LISTED)}; "
                             f"listed but missing: {sorted(LISTED - found)}")
    for name in PACKAGE_DIRS:
        assert name == "multidev" or name.startswith("multidev."), name


@pytest.mark.parametrize("folder", sorted({f.name for n, f in PACKAGE_DIRS.items() if n != "multidev"}))
def test_a_mapped_folder_refuses_its_own_name(folder: str) -> None:
    """From the repository root, ``import backends`` would load every adapter a second time beside
    ``multidev.adapters``: the folder refuses, naming the one import."""
    p = subprocess.run([sys.executable, "-c", f"import {folder}"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode != 0
    assert "ImportError" in p.stderr and "import it under that name" in p.stderr, p.stderr[-600:]


def test_importing_everything_loads_each_file_once() -> None:
    """Every module of the package imported (the suite and every benchmark too): no file appears
    under two module names."""
    code = (
        "import importlib, json, sys, pkgutil\n"
        "import multidev\n"
        f"names = {sorted(LISTED)!r}\n"
        "for pkg in names:\n"
        "    m = importlib.import_module(pkg)\n"
        "    for info in pkgutil.iter_modules(m.__path__, pkg + '.'):\n"
        "        if info.name.endswith(('__main__',)): continue\n"
        "        try: importlib.import_module(info.name)\n"
        "        except ImportError: pass  # a framework that is not installed here\n"
        "files = {}\n"
        "for n, m in list(sys.modules.items()):\n"
        "    f = getattr(m, '__file__', None)\n"
        f"    if f and f.startswith({str(ROOT)!r}) and '/site-packages/' not in f: files.setdefault(f, []).append(n)\n"
        "print(json.dumps({f: ns for f, ns in files.items() if len(ns) > 1}))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    twice = json.loads(p.stdout.strip().splitlines()[-1])
    assert not twice, f"files loaded under two names: {twice}"


def test_the_wheel_holds_the_package_alone(tmp_path: Path) -> None:
    """``pip wheel .``: the package's modules and py.typed, no benchmark results, no shell scripts."""
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    if p.returncode != 0 and "No module named" in p.stderr and "setuptools" in p.stderr:
        pytest.skip("setuptools is not installed in this environment (the wheel cannot be built offline)")
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = tmp_path.glob("multidev-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    package = [n for n in names if not n.split("/")[0].endswith(".dist-info")]
    odd = [n for n in package if not (n.endswith(".py") or n == "multidev/py.typed")]
    assert not odd, f"the wheel ships files that are not the package's modules: {odd[:20]}"
    assert not [n for n in package if "/results/" in n], "benchmark results in the wheel"
    expected = {f"{_module(p).replace('.', '/')}{'/__init__' if p.stem == '__init__' else ''}.py"
                for p in _package_sources()}
    assert set(package) - {"multidev/py.typed"} == expected


# -- layers -------------------------------------------------------------------------------------
def test_no_core_module_imports_benchmarks() -> None:
    for p in CORE:
        for target, _, line in _imports(p):
            assert not target.startswith("multidev.benchmarks"), f"{p.name}:{line} imports {target}"


def _graph(paths: list[Path]) -> dict[str, set[str]]:
    mods = {_module(p) for p in paths}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for p in paths:
        m = _module(p)
        for target, names, _ in _imports(p):
            if target in mods and target != m:
                graph[m].add(target)
            for n in names:  # from . import api
                if f"{target}.{n}" in mods and f"{target}.{n}" != m:
                    graph[m].add(f"{target}.{n}")
    # the package __init__ is the public face: it imports the core and nothing imports it back
    # except as ``import multidev`` (the public API) from modules above the core
    graph.pop("multidev", None)
    for deps in graph.values():
        deps.discard("multidev")
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> list[str] | None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return [*stack, m, d]
            if d not in state:
                found = visit(d, [*stack, m])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [])
            if found:
                return found
    return None


def test_no_import_circle_anywhere_in_the_package() -> None:
    circle = _circle(_graph(_package_sources()))
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_the_circle_check_finds_a_circle() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_another_modules_private_name() -> None:
    bad = []
    for p in _package_sources():
        for target, names, line in _imports(p):
            if not target.startswith("multidev"):
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    bad.append(f"{p.relative_to(ROOT)}:{line}: from {target} import {n}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", sorted((ROOT / "backends").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_adapters_import_only_public_api(path: Path) -> None:
    public = {"multidev", "multidev.adapter", "multidev.errors"}
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


@pytest.mark.parametrize("path", [p for p in _package_sources()
                                  if not any(f == p.parent or f in p.parents for f in FRAMEWORK_CODE)
                                  and ROOT / "examples" not in p.parents],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_backend_name_outside_adapters(path: Path) -> None:
    """String literals naming a backend outside backends/ and the baselines (docstrings and comments
    are prose, and examples are documentation)."""
    docs = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                docs.add(body[0].value.lineno)
    bad = [(n, line) for n, line in _names_in(path) if line not in docs
           and (path.name, n) not in ALLOWED_NAMES]
    assert not bad, f"{path.relative_to(ROOT)} names backends {bad}"


# -- one place per rule -----------------------------------------------------------------------------
def _is_name(node: ast.AST | None, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


def _translate_patterns(tree: ast.AST) -> list[int]:
    """Lines of hand-written error translation: ``raise framework_error(...)``, or a try whose handlers
    re-raise MultidevError and then catch Exception."""
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and _is_name(node.exc.func, "framework_error"):
            bad.append(node.lineno)
        if isinstance(node, ast.Try):
            names = [h.type for h in node.handlers]
            reraise = [i for i, h in enumerate(node.handlers) if _is_name(h.type, "MultidevError")
                       and len(h.body) == 1 and isinstance(h.body[0], ast.Raise) and h.body[0].exc is None]
            if reraise and any(_is_name(t, "Exception") for t in names[reraise[0] + 1:]):
                bad.append(node.lineno)
    return bad


def test_errors_are_translated_in_one_place() -> None:
    """``multidev.validate.translate_errors`` is the one error-translation helper: nowhere else does
    the package raise ``framework_error(...)`` or hand-write ``except MultidevError: raise`` followed
    by ``except Exception``."""
    bad = []
    for p in _package_sources():
        if p == ROOT / "multidev" / "validate.py":
            continue
        bad += [f"{p.relative_to(ROOT)}:{line}" for line in _translate_patterns(ast.parse(p.read_text()))]
    assert not bad, "hand-written error translation (use multidev.validate.translate_errors): " + ", ".join(bad)


def test_the_translation_check_finds_the_pattern() -> None:
    src = ("try:\n    f()\nexcept MultidevError:\n    raise\nexcept Exception as e:\n    raise X(e) from e\n"
           "def g():\n    raise framework_error(e, 'g') from e\n")
    assert _translate_patterns(ast.parse(src)) == [1, 8]


#: The capability protocols and the shared implementations that declare them.
_PROVIDERS = {"SupportsNonBlocking": {"SupportsNonBlocking", "NonBlockingMoves"},
              "SupportsDLPack": {"SupportsDLPack", "ArrayApiDLPack"},
              "SupportsNativeCollectives": {"SupportsNativeCollectives"},
              "SupportsTraining": {"SupportsTraining", "TrainingDefaults"},
              "SupportsCompile": {"SupportsCompile"},
              "SupportsModels": {"SupportsModels"},
              "SupportsDeviceScope": {"SupportsDeviceScope"}}


def test_the_protocol_is_split_and_every_adapter_declares_what_it_implements() -> None:
    """A core protocol plus capability protocols, disjoint, each declared; every adapter class that
    defines a capability method declares its protocol (no undeclared methods, no MRO inspection for
    hooks: the hooks are core protocol methods)."""
    from multidev import protocol

    core = set(protocol.PROTOCOL_METHODS)
    assert {"device_wait_fn", "tensor_wait_fn"} <= core
    seen: set[str] = set()
    for p in protocol.CAPABILITY_PROTOCOLS:
        methods = set(protocol.protocol_methods(p))
        assert methods and not methods & core and not methods & seen, p.__name__
        seen |= methods
    assert {p.__name__ for p in protocol.CAPABILITY_PROTOCOLS} == set(_PROVIDERS)
    owner = {m: p.__name__ for p in protocol.CAPABILITY_PROTOCOLS for m in protocol.protocol_methods(p)}
    bad = []
    for path in sorted((ROOT / "backends").rglob("*.py")) + [ROOT / "examples" / "template_adapter.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or not node.name.endswith("Backend"):
                continue
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in owner:
                    need = owner[item.name]
                    if not bases & _PROVIDERS[need] and not bases - {"BaseBackend", "object"} - set().union(
                            *_PROVIDERS.values()):
                        bad.append(f"{path.relative_to(ROOT)}:{item.lineno}: {node.name}.{item.name} without {need}")
    assert not bad, "\n".join(bad)
    core_src = "".join(p.read_text() for p in CORE)
    assert "adapter_hook" not in core_src and "type(b).__mro__" not in core_src  # hooks are found by name
