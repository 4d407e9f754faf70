"""Certifying a backend from outside (issue 35): ``multidev conformance --backend mod:Class`` gives a
report (which checks ran, which were skipped by capability and why) and takes an expected-failures
file the adapter's author keeps in their repository (array-api-tests' xfails format: one check id a
line, ``#`` comments): listed failures are expected, a listed check that passes is reported as an
unexpected pass, a line that matches nothing is reported as such. Shown on the adapter template and
on the out-of-tree example package ``tests/outoftree/halfnp_multidev`` (its own pyproject, its own
xfails file), as docs/writing-an-adapter.md's certification section does."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from multidev.conformance.plugin import XFail, check_id, read_xfails

ROOT = Path(__file__).resolve().parents[1]
OUTOFTREE = ROOT / "tests" / "outoftree"
XFAILS = OUTOFTREE / "halfnp_multidev" / "xfails.txt"
HALF = "halfnp_multidev:HalfBackend"
TEMPLATE = "multidev.examples.template_adapter:TemplateBackend"
#: A few checks of each kind: the rand checks (halfnp's expected failure), passing ones, skipped ones.
SELECT = "rand_uniform or test_to_numpy or creation_honours"

pytestmark = [
    pytest.mark.skipif(__import__("importlib").util.find_spec("array_api_strict") is None,
                       reason="the template (and the example built on it) adapts array-api-strict: "
                       "pip install 'multidev[test]'"),
    pytest.mark.skipif(int(np.__version__.split(".")[0]) < 2,
                       reason="the template's DLPack calls need array-api-strict on NumPy 2"),
]


def _certify(tmp_path: Path, backend: str, *cli: str, select: str = SELECT) -> tuple[subprocess.CompletedProcess,
                                                                                      dict[str, Any]]:
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(OUTOFTREE), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "multidev.cli", "conformance", "--backend", backend, "--json", str(out),
                        *cli, "--", "-k", select, "--multidev-partner=numpy", "-p", "no:warnings"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert out.exists(), p.stdout[-3000:] + p.stderr[-3000:]
    return p, json.loads(out.read_text())


def test_the_out_of_tree_adapter_is_certified_with_its_expected_failures(tmp_path: Path) -> None:
    p, doc = _certify(tmp_path, HALF, "--xfails", str(XFAILS))
    assert p.returncode == 0, p.stdout[-3000:]
    cert = doc["certification"]["backends"]["halfnp"]
    assert cert["failed"] == 0 and cert["xpassed"] == 0 and cert["xfailed"] >= 1 and cert["passed"] >= 1, cert
    assert cert["ran"] == cert["passed"] + cert["xfailed"]
    checks = doc["checks"]
    rand = {k: v for k, v in checks.items() if "test_rand_uniform_and_seeded" in k}
    assert rand and all(v["outcome"] in ("xfailed", "skipped") for v in rand.values()), rand
    skipped = [v for v in checks.values() if v["outcome"] == "skipped"]
    assert skipped and all("capabilities" in v["reason"] for v in skipped), skipped  # skipped by capability, why
    assert "expected failures" in p.stdout and "halfnp: ran" in p.stdout


def test_without_its_file_the_gap_fails_and_write_xfails_makes_the_file(tmp_path: Path) -> None:
    written = tmp_path / "xfails.txt"
    p, doc = _certify(tmp_path, HALF, "--write-xfails", str(written))
    assert p.returncode != 0
    cert = doc["certification"]["backends"]["halfnp"]
    assert cert["failed"] >= 1 and cert["xfailed"] == 0, cert
    ids = [x.pattern for x in read_xfails(str(written))]
    assert ids and all(i.startswith("test_placement.py::test_rand_uniform_and_seeded[halfnp-") for i in ids), ids
    p2, doc2 = _certify(tmp_path, HALF, "--xfails", str(written))
    assert p2.returncode == 0 and doc2["certification"]["backends"]["halfnp"]["xfailed"] == len(ids)


def test_an_unexpected_pass_and_a_stale_line_are_reported(tmp_path: Path) -> None:
    f = tmp_path / "xfails.txt"
    f.write_text("# passes on the template\ntest_to_numpy   # trailing comment\n\ntest_no_such_check\n")
    p, doc = _certify(tmp_path, TEMPLATE, "--xfails", str(f))
    assert p.returncode == 0, p.stdout[-3000:]
    c = doc["certification"]
    assert c["unexpected_passes"] and all("test_to_numpy" in n for n in c["unexpected_passes"]), c
    assert c["backends"]["template"]["xpassed"] == len(c["unexpected_passes"])
    assert c["unmatched_xfails"] == [f"{f}:4 (test_no_such_check)"], c
    assert "UNEXPECTED PASS test_placement.py::test_to_numpy[template-" in p.stdout
    assert "matched no check" in p.stdout


def test_the_template_is_certified_with_an_empty_file(tmp_path: Path) -> None:
    written = tmp_path / "xfails.txt"
    p, doc = _certify(tmp_path, TEMPLATE, "--write-xfails", str(written))
    assert p.returncode == 0, p.stdout[-3000:]
    assert read_xfails(str(written)) == [] and written.read_text().startswith("# Expected failures")
    assert doc["certification"]["backends"]["template"]["failed"] == 0


def test_a_missing_xfails_file_is_a_usage_error(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "multidev.cli", "conformance", "--backend", "numpy", "--xfails",
                        str(tmp_path / "nope.txt")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "--xfails" in p.stderr and "no such file" in p.stderr, p.stderr


def test_xfail_lines_match_as_documented(tmp_path: Path) -> None:
    cid = check_id("conformance_tests/test_placement.py::test_rand_uniform_and_seeded[lib-cpu:0-float32]")
    assert cid == "test_placement.py::test_rand_uniform_and_seeded[lib-cpu:0-float32]"
    for pattern, hit in (("test_placement.py::test_rand_uniform_and_seeded[lib-cpu:0-float32]", True),
                         ("test_placement.py::test_rand_uniform_and_seeded", True),
                         ("test_rand_uniform_and_seeded", True),
                         ("test_rand_uniform_and_seeded[lib-cpu:0-float32]", True),
                         ("test_rand_uniform_and_seeded[lib-cpu:1-float32]", False),
                         ("test_rand", False), ("test_models.py::test_rand_uniform_and_seeded", False)):
        assert XFail(pattern, "f:1").matches(cid) is hit, pattern
    f = tmp_path / "x.txt"
    f.write_text("# header\n\n  test_a  # why\ntest_b\n")
    assert read_xfails(str(f)) == [XFail("test_a", f"{f}:3"), XFail("test_b", f"{f}:4")]


def test_the_docs_show_these_commands() -> None:
    text = (ROOT / "docs" / "writing-an-adapter.md").read_text()
    assert f"--backend {TEMPLATE} --write-xfails" in text
    assert "--xfails" in text and "halfnp_multidev" in text
    assert XFAILS.read_text().count("test_rand_uniform_and_seeded") == 1
