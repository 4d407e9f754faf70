"""Interop tests with a risky partner run in a child process, so a partner framework that aborts the
interpreter (TensorFlow's ``Check failed: IsAligned()`` on an unaligned host buffer) fails those
tests and leaves the parent run, its matrix and its JSON intact.

Which partners: ``--multidev-isolate NAME[,NAME]``, else the adapters that set the class attribute
``interop_in_child`` (those of frameworks known to abort); ``none`` turns it off. The first test of
a (backend, partner) pair starts one child pytest that runs every collected interop test of that
pair (``-v``, so each outcome is printed as it happens) and caches the outcomes; each test then
reports its own: passed, skipped with the child's reason, failed with the child's report, or
failed as the test the child died in (or never reached).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CHILD_ENV = "MULTIDEV_INTEROP_CHILD"
CHILD_TIMEOUT = 600.0
_results: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}


def isolated(partners_opt: list[str]) -> set[str] | None:
    """The partners named by ``--multidev-isolate`` (None: those whose adapter asks for it)."""
    names = [v.strip() for item in partners_opt for v in item.split(",") if v.strip()]
    if not names:
        return None
    return set() if names == ["none"] else set(names)


def wants_child(partner: str) -> bool:
    """Whether ``partner``'s adapter asks for its interop tests in a child process."""
    import multidev as md

    try:
        return bool(getattr(md.backend(partner), "interop_in_child", False))
    except Exception:  # noqa: BLE001 - an adapter that cannot load has no interop tests to isolate
        return False


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def run_isolated(request: pytest.FixtureRequest, backend: str, partner: str) -> bool:
    """True when this test ran in a child process and passed there (the caller returns: its checks
    ran); skips or fails with the child's outcome otherwise. False: run it here."""
    from .plugin import isolated_partners

    if in_child() or partner == backend or partner not in isolated_partners():
        return False
    key = (backend, partner)
    if key not in _results:
        _results[key] = _run_pair(request, backend, partner)
    outcome, detail = _results[key].get(request.node.name, ("missing", ""))
    if outcome == "PASSED":
        return True
    if outcome == "SKIPPED":
        pytest.skip(detail or f"skipped in the child process of the {partner} interop tests")
    if outcome == "missing":
        pytest.fail(detail or f"the child process of the {partner} interop tests did not report this test")
    pytest.fail(f"in the child process of the {partner} interop tests ({outcome}):\n{detail}")
    return False


def _run_pair(request: pytest.FixtureRequest, backend: str, partner: str) -> dict[str, tuple[str, str]]:
    from .plugin import backend_spec

    suite = Path(__file__).resolve().parent
    items = []
    for it in request.session.items:
        params = getattr(getattr(it, "callspec", None), "params", {})
        if params.get("partner") == partner and params.get("md_backend_name") == backend:
            items.append(it)
    spec, imports = backend_spec(backend)
    ids = [f"{suite / Path(str(it.fspath)).name}::{it.name}" for it in items]
    cmd = [sys.executable, "-m", "pytest", *ids, "-v", "--tb=short", "-p", "no:cacheprovider", f"--rootdir={suite}",
           "-o", "addopts=", f"--multidev-backend={spec}", *[f"--multidev-import={m}" for m in imports]]
    from importlib import metadata

    if "multidev.conformance.plugin" not in {ep.value for ep in metadata.entry_points(group="pytest11")}:
        cmd += ["-p", "multidev.conformance.plugin"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT,
                           env=dict(os.environ, **{CHILD_ENV: "1"}))
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, rc = "", None
    results: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        m = re.match(r"^\S*::(\S+) (PASSED|FAILED|SKIPPED|ERROR)(?: \((.*)\))?", line)
        if m:
            results.setdefault(m.group(1), (m.group(2), m.group(3) or ""))
    for name, (oc, _) in list(results.items()):
        if oc in ("FAILED", "ERROR"):
            block = re.search(rf"_{{3,}} {re.escape(name)} _{{3,}}\n(.*?)(?=\n_{{3,}} |\n={{3,}})", out, re.S)
            results[name] = (oc, (block.group(1) if block else out)[-4000:])
    if rc is None:
        why = f"the child process timed out after {CHILD_TIMEOUT:g} s"
    elif rc < 0:
        sig = signal.Signals(-rc).name if -rc in signal.Signals.__members__.values() else str(-rc)
        why = f"the child process died of signal {sig}: the {partner} framework aborted the interpreter"
    elif rc not in (0, 1):
        why = f"the child process exited with status {rc}"
    else:
        why = ""
    running = [m.group(1) for m in re.finditer(r"^\S*::(\S+) *$", out, re.M)]
    at = err.find("Fatal Python error")
    last = err[max(0, at - 1500):at + 400] if at >= 0 else (out + err)[-2500:]
    for it in items:
        if it.name not in results:
            where = "during this test" if it.name in running else "before this test was reached"
            results[it.name] = ("missing", f"{why or 'the child process did not run this test'}, {where}; "
                                           f"its last output:\n{last}")
    return results


def child_summary() -> dict[str, Any]:
    """Pairs run in child processes, for the JSON."""
    return {f"{b}|{p}": sorted({oc for oc, _ in r.values()}) for (b, p), r in _results.items()}
