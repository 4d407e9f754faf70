"""Every relative link in the repository's Markdown (README, CONTRIBUTING, docs/, benchmarks/results/)
points at a file or folder that exists: a moved or removed file cannot leave a dead link behind."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", "build", "site", "node_modules"}
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _markdown_files() -> list[Path]:
    found: list[Path] = []
    for folder, dirs, files in os.walk(ROOT):  # pruned as it goes: never into a venv that CI may be installing
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".venv")]
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    return sorted(found)


def _links(text: str) -> list[str]:
    text = FENCE.sub("", text)                      # links inside code blocks are code, not links
    text = re.sub(r"`[^`\n]*`", "", text)           # and so are inline code spans
    return [a or b for a, b in LINK.findall(text)]


def test_there_is_markdown_to_check() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _markdown_files()}
    assert {"README.md", "CONTRIBUTING.md", "benchmarks/results/README.md"} <= names


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path: Path) -> None:
    dead = []
    for target in _links(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        file_part = target.split("#", 1)[0]
        if not (path.parent / file_part).exists():
            dead.append(target)
    assert not dead, f"{path.relative_to(ROOT)} links to missing files: {dead}"


def test_the_checker_sees_a_dead_link(tmp_path: Path) -> None:
    assert _links("see [a](missing.md) and ![fig](x.png) but not `[b](c.md)` or http") == ["missing.md", "x.png"]
