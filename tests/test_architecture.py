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
ALLOWED_NAMES: dict[tuple[str, str], str] = {}


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
    """``pip wheel .``: the package's modules, py.typed and its data (the shipped cost model), no
    benchmark results, no shell scripts."""
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    if p.returncode != 0 and "No module named" in p.stderr and "setuptools" in p.stderr:
        pytest.skip("setuptools is not installed in this environment (the wheel cannot be built offline)")
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = tmp_path.glob("multidev-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    package = [n for n in names if not n.split("/")[0].endswith(".dist-info")]
    data = {"multidev/py.typed", "multidev/data/collective_model.json"}
    odd = [n for n in package if not (n.endswith(".py") or n in data)]
    assert not odd, f"the wheel ships files that are not the package's modules: {odd[:20]}"
    assert not [n for n in package if "/results/" in n], "benchmark results in the wheel"
    expected = {f"{_module(p).replace('.', '/')}{'/__init__' if p.stem == '__init__' else ''}.py"
                for p in _package_sources()}
    assert set(package) - data == expected
    assert data <= set(package), "the package data is missing from the wheel"


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
    public = {"multidev", "multidev.adapter", "multidev.errors", "multidev.distributed.engine"}
    for target, _, line in _imports(path):
        if target.startswith("multidev") and not target.startswith("multidev.adapters"):
            assert target in public, f"{path.name}:{line} imports {target}; adapters import multidev.adapter"
        assert ".multidev._" not in f".{target}", f"{path.name}:{line} imports private module {target}"


def _names_in(path: Path) -> list[tuple[str, int]]:
    """Backend names as string constants, except inside ``Literal[...]`` (a typed overload's key, for
    type checkers only: ``convert(x, "torch")``'s result type)."""
    tree = ast.parse(path.read_text())
    typed = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Subscript) and _is_name(node.value, "Literal")
             for c in ast.walk(node.slice)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typed:
            continue
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
    """``multidev.errors.translate_errors`` is the one error-translation helper: nowhere else does
    the package raise ``framework_error(...)`` or hand-write ``except MultidevError: raise`` followed
    by ``except Exception``."""
    bad = []
    for p in _package_sources():
        if p == ROOT / "multidev" / "errors.py":
            continue
        tree = ast.parse(p.read_text())
        lines = _translate_patterns(tree)
        if p == ROOT / "multidev" / "validate.py":  # the writability probe's own rule: a refused write is a
            probe = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "check_writable")
            lines = [ln for ln in lines if not probe.lineno <= ln <= (probe.end_lineno or 0)]  # CapabilityError
        bad += [f"{p.relative_to(ROOT)}:{line}" for line in lines]
    assert not bad, "hand-written error translation (use multidev.errors.translate_errors): " + ", ".join(bad)


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
              "SupportsDeviceScope": {"SupportsDeviceScope"},
              "SupportsMesh": {"SupportsMesh"},
              "SupportsSharding": {"SupportsSharding"},
              "SupportsDataParallel": {"SupportsDataParallel"},
              "SupportsShardedTraining": {"SupportsShardedTraining"}}


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
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            for item in node.body:
                if not (isinstance(item, ast.FunctionDef) and item.name in owner):
                    continue
                need = owner[item.name]
                if node.name.endswith("Backend") or "BaseBackend" in bases:
                    bad.append(f"{path.relative_to(ROOT)}:{item.lineno}: {node.name}.{item.name}: capability methods "
                               f"live on the adapter's {need} concern object, not the adapter class")
                elif not bases & _PROVIDERS[need] and not bases - {"Concern", "object"} - set().union(
                        *_PROVIDERS.values()):
                    bad.append(f"{path.relative_to(ROOT)}:{item.lineno}: {node.name}.{item.name} without {need}")
    assert not bad, "\n".join(bad)
    core_src = "".join(p.read_text() for p in CORE)
    assert "adapter_hook" not in core_src and "type(b).__mro__" not in core_src  # hooks are found by name


# -- the adapters' rooms ------------------------------------------------------------------------------
#: An adapter file of more lines than this is a folder per framework (backends/NAME/).
ADAPTER_FILE_LINES = 420
#: The files of an adapter folder, each one concern, the same name in every framework: the protocol
#: its class declares (a provider of it, see _PROVIDERS). A new capability protocol gets its file here.
CONCERN_FILES = {"core.py": None, "transfers.py": "SupportsNonBlocking", "dlpack.py": "SupportsDLPack",
                 "collectives.py": "SupportsNativeCollectives", "training.py": "SupportsTraining",
                 "compile.py": "SupportsCompile", "models.py": "SupportsModels", "scope.py": "SupportsDeviceScope",
                 "mesh.py": "SupportsMesh", "sharding.py": "SupportsSharding", "parallel.py": "SupportsDataParallel",
                 "sharded_training.py": "SupportsShardedTraining"}
#: Beside the concern files: the composed adapter (__init__.py) and what several files share.
ADAPTER_FOLDER_FILES = {"__init__.py", "_common.py", "engine.py", *CONCERN_FILES}
#: Folders of backends/ that are not adapters.
NOT_ADAPTERS = {"engines": "the engine of multidev.distributed of no framework (MPI); the others are engine.py "
                           "in their framework's folder",
                "__pycache__": "bytecode"}
#: The top-level modules of each framework an adapter serves (NumPy is every adapter's host array
#: library, and the array-API adapter serves whichever library it is given: they own no names).
FRAMEWORK_MODULES = {"torch": {"torch"}, "jax": {"jax", "jaxlib"}, "tensorflow": {"tensorflow"},
                     "mxnet": {"mxnet"}, "cupy": {"cupy", "cupyx"}, "numpy": set(), "array_api": set()}
#: Strings in one adapter that name another framework, each for a stated reason: (adapter, text) -> why.
CROSS_FRAMEWORK_NAMES = {
    ("mxnet", "pip install torch=="): "the install hint for the tested MXNet environment, where torch's CPU "
                                      "wheel is pinned first; an install command, not a code path",
}


def _adapter_folders() -> list[Path]:
    return sorted(p for p in (ROOT / "backends").iterdir() if p.is_dir() and p.name not in NOT_ADAPTERS)


def _adapter_files() -> list[tuple[str, Path]]:
    """(adapter name, file) for every adapter source: the single files and every file of the folders."""
    out = [(p.stem, p) for p in sorted((ROOT / "backends").glob("*.py")) if p.name != "__init__.py"]
    for folder in _adapter_folders():
        out += [(folder.name, p) for p in sorted(folder.rglob("*.py"))]
    return out


def _bases(node: ast.ClassDef) -> set[str]:
    return {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}


def _methods(node: ast.ClassDef) -> list[ast.FunctionDef]:
    """The methods a class defines at run time (not those under ``if TYPE_CHECKING:``)."""
    return [item for item in node.body if isinstance(item, ast.FunctionDef)]


def test_every_large_adapter_is_a_folder() -> None:
    """No adapter is a single file of more than ADAPTER_FILE_LINES lines: a larger one is split into
    backends/NAME/ with one file per concern."""
    big = {p.name: n for p in (ROOT / "backends").glob("*.py")
           if (n := len(p.read_text().splitlines())) > ADAPTER_FILE_LINES}
    assert not big, f"adapter files over {ADAPTER_FILE_LINES} lines (make each a folder per framework): {big}"


@pytest.mark.parametrize("folder", _adapter_folders(), ids=lambda p: p.name)
def test_adapter_folders_use_the_shared_file_names(folder: Path) -> None:
    """Each adapter folder has __init__.py (the composed adapter) and core.py, and otherwise only the
    shared concern files: the same name for the same concern in every framework, no subfolders."""
    names = {p.name for p in folder.iterdir() if p.name != "__pycache__"}
    assert {"__init__.py", "core.py"} <= names, f"{folder.name}/ lacks __init__.py or core.py"
    odd = sorted(names - ADAPTER_FOLDER_FILES)
    assert not odd, f"{folder.name}/ has files outside the shared names {sorted(ADAPTER_FOLDER_FILES)}: {odd}"


#: Each concern file's attribute on the adapter (multidev.protocol.CONCERNS).
CONCERN_ATTRS = {"transfers.py": "transfers", "dlpack.py": "dlpack", "collectives.py": "collectives",
                 "training.py": "training", "compile.py": "compiler", "models.py": "models", "scope.py": "scope",
                 "mesh.py": "mesh", "sharding.py": "sharding", "parallel.py": "parallel",
                 "sharded_training.py": "sharded_training"}


def _stub_blocks(tree: ast.AST) -> list[int]:
    """Lines of ``if TYPE_CHECKING:`` blocks inside classes (declarations of another class's methods)."""
    return [item.lineno for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for item in node.body
            if isinstance(item, ast.If) and "TYPE_CHECKING" in ast.unparse(item.test)]


@pytest.mark.parametrize("folder", _adapter_folders(), ids=lambda p: p.name)
def test_each_concern_file_declares_its_protocol(folder: Path) -> None:
    """core.py's class is a BaseBackend declaring no capability; the class of every other concern file
    is a Concern declaring that file's protocol (or its shared implementation) and no other, built from
    the core (no mixin of the adapter class, no stub declarations of the core's methods), and no file
    defines a method of another file's protocol. __init__.py's adapter class is the core class with
    its concern attributes, each ``concern(Class)`` of the file of that name, and nothing else."""
    from multidev import protocol

    owner = {m: p.__name__ for p in protocol.CAPABILITY_PROTOCOLS for m in protocol.protocol_methods(p)}
    concern_classes: dict[str, str] = {}  # class name -> its file
    core_class = ""
    bad = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        bad += [f"{folder.name}/{path.name}:{line}: a TYPE_CHECKING block in a class (a stub)"
                for line in _stub_blocks(tree)]
        if path.name not in CONCERN_FILES:
            continue
        want = CONCERN_FILES[path.name]
        for node in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
            declared = {p for p, names in _PROVIDERS.items() if _bases(node) & names}
            defined = {owner[f.name] for f in _methods(node) if f.name in owner}
            if not declared and not defined and "BaseBackend" not in _bases(node):
                continue  # a helper class (a DLPack producer, a context manager, a replica)
            where = f"{folder.name}/{path.name}:{node.lineno}: {node.name}"
            if path.name == "core.py":
                if "BaseBackend" not in _bases(node) or declared or defined:
                    bad.append(f"{where} must be a BaseBackend declaring no capability ({sorted(declared | defined)})")
                core_class = node.name
            elif declared != {want} or not defined <= {want}:
                bad.append(f"{where} declares {sorted(declared)} and defines methods of {sorted(defined)}; "
                           f"{path.name} holds {want} alone")
            else:
                concern_classes[node.name] = path.name
    if not core_class:
        bad.append(f"{folder.name}/core.py has no BaseBackend class")
    init = ast.parse((folder / "__init__.py").read_text())
    composed = [n for n in init.body if isinstance(n, ast.ClassDef) and n.name.endswith("Backend")]
    assert composed, f"{folder.name}/__init__.py defines no adapter class"
    for node in composed:
        if _bases(node) != {core_class} or _methods(node):
            bad.append(f"{folder.name}/__init__.py: {node.name} must be {core_class} with its concerns alone "
                       f"(bases: {sorted(_bases(node))}, methods: {[f.name for f in _methods(node)]})")
        for item in node.body:
            if not isinstance(item, ast.Assign):
                continue
            target = ast.unparse(item.targets[0])
            made = ast.unparse(item.value)
            cls = made.removeprefix("concern(").removesuffix(")")
            if not made.startswith("concern(") or CONCERN_ATTRS.get(concern_classes.get(cls, "")) != target:
                bad.append(f"{folder.name}/__init__.py: {node.name}.{target} = {made}: a concern attribute is "
                           "concern(C) with C the class of the concern file of that name")
    assert not bad, "\n".join(bad)


def test_composed_adapters_have_their_concerns_and_nothing_else() -> None:
    """Imported (no framework starts): each folder's adapter class is its core class with concern
    attributes, declares no capability protocol itself (no mixins), and each concern attribute is a
    ``concern`` of a Concern class declaring the attribute's protocol; the core module imports no
    concern file of its folder (no arrow back up: the concerns import the core)."""
    import importlib

    from multidev import protocol
    from multidev.adapter import BaseBackend, Concern, concern

    for folder in _adapter_folders():
        mod = importlib.import_module(f"multidev.adapters.{folder.name}")
        for cls in [v for v in vars(mod).values() if isinstance(v, type) and v.__module__ == mod.__name__
                    and issubclass(v, BaseBackend)]:
            assert len(cls.__bases__) == 1 and cls.__bases__[0].__module__ == f"{mod.__name__}.core", cls.__name__
            for p in protocol.CAPABILITY_PROTOCOLS:
                assert p not in cls.__mro__, f"{cls.__name__} declares {p.__name__} itself: a concern does"
                for m in protocol.protocol_methods(p):  # only the deprecated forwarders to its concern
                    fn = cls.__dict__.get(m)
                    assert fn is None or getattr(fn, "_md_forwarder", False), f"{cls.__name__}.{m} is code of its own"
            for attr, p in protocol.CONCERNS.items():
                made = cls.__dict__.get(attr)
                if made is None:
                    continue
                assert isinstance(made, concern), (cls.__name__, attr)
                assert issubclass(made.cls, Concern) and issubclass(made.cls, p), (cls.__name__, attr, made.cls)
                for m in protocol.protocol_methods(p):
                    impl = next(k for k in made.cls.__mro__ if m in vars(k))
                    assert impl is not p, f"{made.cls.__name__}.{m} resolves to the protocol's stub"
        core = ast.parse((folder / "core.py").read_text())
        for node in ast.walk(core):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                assert node.module == "_common", f"{folder.name}/core.py imports .{node.module}: an arrow back up"


def _prose(tree: ast.AST) -> set[int]:
    """The ids of docstring nodes (prose: they may name other frameworks, as examples)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _foreign_names(adapter: str, src: str, where: str) -> list[str]:
    """Where adapter ``adapter``'s source ``src`` names another framework's module: an import, or a
    string (docstrings aside) in which the module's name stands as a word (``"torch"``,
    ``"torch.cuda"``, ``sys.modules["torch"]``, ``__module__.startswith("torch")``), less the stated
    exceptions."""
    import re

    own = FRAMEWORK_MODULES.get(adapter, {adapter})
    others = set().union(*FRAMEWORK_MODULES.values()) - own
    word = re.compile(r"(?<![\w.])(" + "|".join(sorted(others)) + r")(?!\w)")
    tree = ast.parse(src)
    docs = _prose(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{where}:{node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in others]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in others:
            found.append(f"{where}:{node.lineno}: from {node.module} import")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
              and word.search(node.value)
              and not any(a == adapter and text in node.value for a, text in CROSS_FRAMEWORK_NAMES)):
            found.append(f"{where}:{node.lineno}: {node.value[:80]!r}")
    return sorted(found, key=lambda f: int(f.split(":")[1]))


@pytest.mark.parametrize("adapter,path", [pytest.param(a, p, id=str(p.relative_to(ROOT))) for a, p in _adapter_files()])
def test_no_adapter_names_another_framework(adapter: str, path: Path) -> None:
    """A rule that concerns two frameworks lives in one place, with the framework it is about (torch's
    current-device rule for CUDA exports is torch's export_dlpack, not every consumer's import): no
    adapter imports another framework or names its module in a string. Docstrings are prose and may
    name other frameworks as examples; duck-typed probes by attribute (the array-API adapter's
    ``block_until_ready``) name no module; CROSS_FRAMEWORK_NAMES lists the exceptions with reasons."""
    found = _foreign_names(adapter, path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "adapter code naming another framework (move the rule to that framework's adapter):\n" \
        + "\n".join(found)


def test_the_foreign_name_check_finds_them() -> None:
    src = ('"""jax mentions torch in prose."""\nimport sys\nfrom cupy import cuda\n'
           't = sys.modules["torch"]\nok = "torch backend"\nmsg = "pip install torch==2.13.0"\n'
           's = type(o).__module__.startswith("tensorflow")\nlocal = "jax.numpy"\nf"{t} on tensorflow.experimental"\n'
           'mine = "pytorch-free", "mxnet_pip install torch=="\n')
    found = [f.split(": ", 1)[1] for f in _foreign_names("jax", src, "x.py")]
    assert found == ["from cupy import", "'torch'", "'torch backend'", "'pip install torch==2.13.0'", "'tensorflow'",
                     "' on tensorflow.experimental'", "'mxnet_pip install torch=='"], found
    assert _foreign_names("mxnet", 'm = "pip install torch==2.13.0"', "y.py") == []  # a stated exception
