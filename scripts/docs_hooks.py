"""mkdocs hook (mkdocs.yml: ``hooks``): the API reference covers the public API exactly.

Before the build, every name a public module exports (``__all__`` of ``multidev``,
``multidev.adapter``, ``multidev.errors``, ``multidev.distributed``, ``multidev.benchmarks``) must
be on a reference page (``::: module.name``, or a module directive that renders it) and, where it is
a function or a class, have a docstring of its own; every name a page shows must exist. Any problem
fails the build (``mkdocs build --strict`` is what CI runs), so a renamed or undocumented public
name cannot land unnoticed. Also runnable alone: ``python scripts/docs_hooks.py`` prints the problems.
"""
from __future__ import annotations

import importlib
import inspect
import re
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
PUBLIC = ("multidev", "multidev.adapter", "multidev.errors", "multidev.distributed", "multidev.benchmarks")
_DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$")


def directives(text: str) -> list[tuple[str, list[str] | None]]:
    """(dotted path, the ``members:`` list of its options or None) for every ``:::`` directive."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = _DIRECTIVE.match(line)
        if not m:
            continue
        members: list[str] | None = None
        j = i + 1
        while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
            if lines[j].strip() == "members:":
                members = []
            elif members is not None and lines[j].strip().startswith("- "):
                members.append(lines[j].strip()[2:].strip())
            if not lines[j].strip() and j + 1 < len(lines) and not lines[j + 1].startswith(" "):
                break
            j += 1
        out.append((m.group(1), members))
    return out


def _resolve(path: str) -> Any:
    parts = path.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for p in parts[k:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


def _own_doc(obj: Any) -> str:
    if inspect.isclass(obj):
        return (obj.__dict__.get("__doc__") or "").strip()
    return (getattr(obj, "__doc__", None) or "").strip()


def problems() -> list[str]:
    """Every way the reference and the public API disagree, one line each (empty: they agree)."""
    out: list[str] = []
    shown: set[int] = set()  # id() of every object a page renders
    for page in sorted(REFERENCE.glob("*.md")):
        for path, members in directives(page.read_text()):
            try:
                obj = _resolve(path)
            except (ImportError, AttributeError):
                out.append(f"{page.relative_to(ROOT)}: `::: {path}` names nothing that exists")
                continue
            shown.add(id(obj))
            if isinstance(obj, types.ModuleType):
                names = members if members is not None else list(getattr(obj, "__all__", []))
                for n in names:
                    if not hasattr(obj, n):
                        out.append(f"{page.relative_to(ROOT)}: {path} has no member {n!r}")
                    else:
                        shown.add(id(getattr(obj, n)))
    for modname in PUBLIC:
        mod = importlib.import_module(modname)
        for n in getattr(mod, "__all__", []):
            obj = getattr(mod, n, None)
            if obj is None:
                out.append(f"{modname}.__all__ names {n!r}, which the module does not define")
                continue
            if id(obj) not in shown:
                out.append(f"{modname}.{n} is public but on no page of docs/reference/")
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and not _own_doc(obj):
                out.append(f"{modname}.{n} has no docstring of its own")
    return out


#: Where the docstrings are read from: the package as installed, one path per module (pyproject's
#: package-dir mapping laid out as links under build/, which griffe, reading sources, can follow).
SOURCES = ROOT / "build" / "docs-src"


def package_tree() -> Path:
    """Lay out ``build/docs-src/multidev`` as the installed package (links to the checkout's files and
    mapped folders, from pyproject's ``package-dir``) and return ``build/docs-src``."""
    import shutil

    import tomllib

    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(SOURCES, ignore_errors=True)
    pkg = SOURCES / "multidev"
    pkg.mkdir(parents=True)
    for entry in (ROOT / mapping["multidev"]).iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        if name.count(".") == 1:
            (pkg / name.split(".")[1]).symlink_to(ROOT / folder)
    return SOURCES


def on_startup(**kwargs: Any) -> None:
    """mkdocs event, before the config is read: lay out the sources the reference is read from."""
    package_tree()


def on_config(config: Any, **kwargs: Any) -> Any:
    """mkdocs event: fail the build on any problem."""
    from mkdocs.exceptions import PluginError

    found = problems()
    if found:
        raise PluginError("the API reference does not match the public API:\n  - " + "\n  - ".join(found))
    return config


if __name__ == "__main__":
    found = problems()
    print("\n".join(found) or "the reference covers the public API")
    sys.exit(1 if found else 0)
