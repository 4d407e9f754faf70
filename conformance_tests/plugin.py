"""pytest plugin that parametrizes the conformance suite by backend and device.

Fixtures for suite authors:
- ``md_backend``: the adapter under test (parametrized over the selected backends);
- ``md_device``: one of its devices (parametrized over backend x device);
- ``md_devices``: all devices of the backend under test;
- ``md_partner_name``: another installed backend of a different framework to exchange tensors with
  (parametrized over backend x partner);
- ``md_algorithm``: an allreduce algorithm the backend under test has (the portable ones, and
  ``native`` where it has a collectives concern, ``b.collectives``).

Markers: ``md_feature(name)`` (the matrix row), ``md_requires(capability)`` (parametrize only the
backends that have it: a capability protocol's name such as ``"SupportsTraining"`` (its concern
attribute is not None), a boolean field of Capabilities, or ``"native_allreduce"`` (a collectives
concern)).

Options: ``--multidev-backend NAME[,NAME]`` (registered names or ``module:attr``; default: every
installed backend), ``--multidev-device SPEC[,SPEC]`` (keep only these devices),
``--multidev-partner NAME[,NAME]`` (exchange partners; default: every installed backend),
``--multidev-json FILE`` (the per-backend, per-feature matrix as JSON, and every check's outcome),
``--multidev-xfails FILE`` (expected failures: see :func:`read_xfails`), ``--multidev-write-xfails
FILE`` (write the checks that failed as such a file). Skips come only from
capability flags and device counts, each with its reason. Checks that hand buffers to another
framework run in a child interpreter (:mod:`._isolation`), so a framework that aborts fails its
checks instead of ending the run.
"""
from __future__ import annotations

import importlib
import json
import os
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ._isolation import Child, encode
from ._state import STATE as _state
from ._state import record_found, request_child_restart

SUITE_DIR = Path(__file__).resolve().parent

#: Virtual CPU devices the suite asks every adapter for (its ``configure_devices`` hook), when the
#: user has not configured their own. Only frameworks not started yet can take them.
VIRTUAL_DEVICES = 4

#: The allreduce algorithms every backend has (``native`` is added where declared).
PORTABLE_ALGORITHMS = ("naive", "ring", "tree", "auto")

#: Phrases in the skip reasons of cases that need more devices than the backend has here.
DEVICE_COUNT_PHRASES = ("needs a second device", "needs 2 devices", "needs 3 devices", "runs on 4 or more devices")


__all__ = ["PORTABLE_ALGORITHMS", "VIRTUAL_DEVICES", "algorithms_of", "imports_of", "partner_backend", "partners_of",
           "record_found", "request_child_restart", "run_isolated", "selected_backends", "spec_of"]


class _SuiteModule(pytest.Module):
    """A file of the suite, imported under its one name (``multidev.conformance.test_x``): pytest's
    own import modes would load it a second time as ``conformance_tests.test_x``."""

    def _getobj(self) -> Any:
        return importlib.import_module(f"{__package__}.{self.path.stem}")


def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """The suite's folder as a plain directory: a pytest Package would import its ``__init__``
    under the folder's name (a second copy of the package)."""
    if path == SUITE_DIR:
        return pytest.Dir.from_parent(parent, path=path)
    return None


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if module_path.parent == SUITE_DIR:
        return _SuiteModule.from_parent(parent, path=module_path)
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("multidev", "multidev conformance suite")
    g.addoption("--multidev-backend", action="append", default=[],
                help="backend(s) to test: registered names or module:attr (comma-separated, repeatable)")
    g.addoption("--multidev-device", action="append", default=[],
                help="only these devices, e.g. cpu:0,gpu:0 (comma-separated, repeatable)")
    g.addoption("--multidev-partner", action="append", default=[],
                help="exchange partners for the interop cases (default: every installed backend)")
    g.addoption("--multidev-json", default=None, help="write the pass/fail/skip matrix to this JSON file")
    g.addoption("--multidev-import", action="append", default=[],
                help="import this module first (adapters registered with multidev.register_backend)")
    g.addoption("--multidev-xfails", action="append", default=[],
                help="a file of expected failures: one check id per line, # comments (repeatable)")
    g.addoption("--multidev-write-xfails", default=None,
                help="write the checks that failed in this run to this file, in the --multidev-xfails format")


def _split(values: list[str]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _in_suite(config: pytest.Config) -> bool:
    if _split(config.getoption("multidev_backend")) or config.getoption("multidev_json"):
        return True
    return any(str(SUITE_DIR) in str(Path(a).resolve()) or "multidev.conformance" in a
               for a in config.args)


@dataclass(frozen=True)
class XFail:
    """One line of an expected-failures file: ``pattern`` and where it was read (``FILE:LINE``)."""

    pattern: str
    where: str

    def matches(self, cid: str) -> bool:
        """Whether check ``cid`` (see :func:`check_id`) is listed: the whole id
        (``test_models.py::test_x[mylib-cpu:0]``), the id without parameters (every parametrization),
        or the test's name alone, with or without its parameters (``test_x``, ``test_x[mylib-cpu:0]``)."""
        p = self.pattern
        name = cid.partition("::")[2]
        return p in (cid, cid.partition("[")[0], name, name.partition("[")[0])


def read_xfails(path: str) -> list[XFail]:
    """The expected failures listed in ``path``, the format of array-api-tests' xfails files: one
    check id per line (see :meth:`XFail.matches`), ``#`` starting a comment (whole line or after the
    id), blank lines ignored. An adapter's author keeps it in their repository beside the adapter."""
    out = []
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise pytest.UsageError(f"multidev conformance: --xfails {path}: {e.strerror or e}") from e
    for i, line in enumerate(text.splitlines(), 1):
        pattern = line.split("#", 1)[0].strip()
        if pattern:
            out.append(XFail(pattern, f"{path}:{i}"))
    return out


def check_id(nodeid: str) -> str:
    """A check's id as expected-failures files name it: ``test_file.py::test_name[params]`` (the
    node id without the folders in front of the file)."""
    path, sep, rest = nodeid.partition("::")
    return f"{path.rsplit('/', 1)[-1]}{sep}{rest}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "md_feature(name): feature row of the conformance matrix")
    config.addinivalue_line("markers", "md_requires(capability): only backends that declare it")
    config.addinivalue_line("markers", "multiprocess: spawns several processes")
    config.addinivalue_line("markers", "timing: asserts how soon a fault surfaces (a time-out measured): CI "
                            "runs these on a quiet machine")
    if not _in_suite(config):
        return
    import importlib

    import multidev as md
    from multidev.errors import BackendNotAvailableError
    from multidev.registry import configure_virtual_devices, installed_backends, registered_backends

    imports = config.getoption("multidev_import")
    for mod in imports:
        importlib.import_module(mod)
    names = _split(config.getoption("multidev_backend"))
    # every registered adapter's hook, and those of the module:attr adapters named on the command line
    configure_virtual_devices(VIRTUAL_DEVICES, registered_backends() + [n for n in names if ":" in n])

    if not names or names == ["all"]:
        names = md.backends()
    backends = []
    specs: dict[str, str] = {}
    for n in names:
        try:
            b = md.backend(n)
        except BackendNotAvailableError as e:
            raise pytest.UsageError(f"multidev conformance: {e}") from e
        backends.append(b)
        specs[b.name] = n
    wanted = [md.device(s) for s in _split(config.getoption("multidev_device"))]
    pairs: list[tuple[str, Any]] = []
    for b in backends:
        devs = b.devices()
        if wanted:
            devs = [d for d in devs if d in wanted]
        pairs.extend((b.name, d) for d in devs)
    # The default partners are every installed backend, found without importing their frameworks:
    # a partner's framework loads with the first check that exchanges with it (a run that selects
    # none, such as one check with -k, imports none).
    named = _split(config.getoption("multidev_partner"))
    frameworks = {} if named else installed_backends()
    for p in named:
        try:
            pb = md.backend(p)
        except BackendNotAvailableError as e:
            raise pytest.UsageError(f"multidev conformance: --multidev-partner {p}: {e}") from e
        frameworks[pb.name] = pb.framework
    dotted = {b.name for b in backends if ":" in specs[b.name]}
    partners: dict[str, list[str]] = {}
    for b in backends:
        # Two adapters of one framework claim the same tensors: they cannot be told apart.
        partners[b.name] = [p for p, fw in frameworks.items() if p != b.name and p not in dotted and fw != b.framework]
    xfails = [x for path in config.getoption("multidev_xfails") for x in read_xfails(path)]
    _state.update(backends={b.name: b for b in backends}, specs=specs, pairs=pairs, items={}, outcomes={},
                  partners=partners, imports=list(imports), found={}, started=time.time(), xfails=xfails,
                  xfail_hits={})


def pytest_unconfigure(config: pytest.Config) -> None:
    child = _state.pop("child", None)
    if child is not None:
        child.close()


def selected_backends() -> list[str]:
    """The names of the backends this suite run tests, in the order given."""
    return list(_state.get("backends", {}))


def spec_of(name: str) -> str:
    """How the backend ``name`` was selected (a registered name or ``module:attr``): what another
    process needs to load the same adapter."""
    return str(_state.get("specs", {}).get(name, name))


def imports_of() -> list[str]:
    """The modules this run imported first (``--import``): what another process imports too."""
    return list(_state.get("imports", []))


def partners_of(name: str) -> list[str]:
    """The exchange partners of backend ``name`` (installed backends of other frameworks)."""
    return list(_state.get("partners", {}).get(name, []))


def algorithms_of(b: Any) -> list[str]:
    """The allreduce algorithms ``b`` has: the portable ones, and native where it has a collectives
    concern."""
    algs = list(PORTABLE_ALGORITHMS)
    if b.collectives is not None:
        algs.append("native")
    return algs


def _requires(b: Any, what: str) -> bool:
    """Whether backend ``b`` has ``what``: a capability protocol's name (``"SupportsTraining"``), a
    boolean field of its Capabilities, or ``"native_allreduce"`` (its collectives concern)."""
    from multidev.adapter import CAPABILITY_PROTOCOLS
    from multidev.registry import supports

    protocols = {p.__name__: p for p in CAPABILITY_PROTOCOLS}
    if what in protocols:
        return supports(b, protocols[what])
    if what in ("native_allreduce", "native_collectives"):  # (the deprecated flags: their concerns)
        return b.collectives is not None
    if what == "dlpack":
        return b.dlpack is not None
    return bool(getattr(b.capabilities, what))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "md_backend_name" not in metafunc.fixturenames:
        return
    backends = _state.get("backends", {})
    names = list(backends)
    for m in metafunc.definition.iter_markers("md_requires"):
        names = [n for n in names if _requires(backends[n], str(m.args[0]))]
    dims = [d for d in ("md_device", "md_partner_name", "md_algorithm") if d in metafunc.fixturenames]
    rows: list[tuple[Any, ...]] = []
    for n in names:
        combos: list[tuple[Any, ...]] = [(n,)]
        for d in dims:
            if d == "md_device":
                values: list[Any] = [dev for n2, dev in _state["pairs"] if n2 == n]
            elif d == "md_partner_name":
                values = partners_of(n)
            else:
                values = algorithms_of(backends[n])
            combos = [c + (v,) for c in combos for v in values]
        rows.extend(combos)
    argnames = ["md_backend_name", *dims]
    ids = ["-".join(str(v) for v in r) for r in rows]
    if len(argnames) == 1:
        metafunc.parametrize("md_backend_name", [r[0] for r in rows], ids=ids, scope="session")
    else:
        metafunc.parametrize(argnames, rows, ids=ids, scope="session")


@pytest.fixture(scope="session")
def md_backend(md_backend_name: str) -> Any:
    """The adapter under test."""
    return _state["backends"][md_backend_name]


@pytest.fixture(autouse=True)
def _md_prefer_backend_under_test(request: pytest.FixtureRequest) -> Any:
    """Tensors of a class several adapters claim go to the adapter under test (a renamed or
    mutated copy of another adapter is tested as itself)."""
    name = request.node.callspec.params.get("md_backend_name") if hasattr(request.node, "callspec") else None
    if name is None or "backends" not in _state:
        yield
        return
    from multidev.registry import prefer

    with prefer(_state["backends"][name].name):
        yield


def partner_backend(name: str) -> Any:
    """Partner ``name``'s adapter, loaded now (a partner's framework is imported with the first
    check that needs it); a partner installed but not importable skips the calling check, saying why."""
    import multidev as md
    from multidev.errors import BackendNotAvailableError

    try:
        return md.backend(name)
    except BackendNotAvailableError as e:
        pytest.skip(f"partner {name} is installed but does not load here: {e}")


@pytest.fixture(autouse=True)
def _md_partner_loads(request: pytest.FixtureRequest) -> None:
    """The partner of a check parametrized over partners, loaded before it runs (partner_backend)."""
    name = request.node.callspec.params.get("md_partner_name") if hasattr(request.node, "callspec") else None
    if name is not None:
        partner_backend(name)


@pytest.fixture(scope="session")
def md_devices(md_backend: Any) -> list:
    """Every device of the backend under test (after --multidev-device filtering)."""
    return [d for n, d in _state["pairs"] if n == md_backend.name]


# -- checks in a child interpreter ---------------------------------------------------------------
def run_isolated(fn: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Run test function ``fn`` (its undecorated body) with ``kwargs`` in the suite's child
    interpreter and report its outcome here: pass, fail with the child's traceback, skip with its
    reason; a child that dies (a framework aborted it) or hangs fails the check."""
    child = _state.get("child")
    if child is None:
        child = Child({"imports": _state.get("imports", []), "specs": _state.get("specs", {}),
                       "virtual_devices": VIRTUAL_DEVICES, "counts": _cpu_counts()})
        _state["child"] = child
    res = child.call({"module": fn.__module__, "function": fn.__qualname__, "kwargs": encode(kwargs)})
    for backend, found in res.get("found", {}).items():
        for k, v in found.items():
            record_found(backend, k, v)
    if res["outcome"] == "skipped":
        pytest.skip(res["reason"])
    if res["outcome"] == "failed":
        pytest.fail(res["longrepr"], pytrace=False)


def _cpu_counts() -> dict[str, int]:
    """Environment variable -> CPU device count of every loaded adapter with virtual devices, so
    the child interpreter gets the same devices."""
    from multidev.registry import loaded_backends

    out = {}
    for b in loaded_backends():
        env = getattr(type(b), "virtual_devices_env", None)
        if env:
            out[env] = sum(1 for d in b.devices() if d.kind == "cpu")
    return out


# -- the matrix ----------------------------------------------------------------------------------
def _feature(item: pytest.Item) -> str:
    m = item.get_closest_marker("md_feature")
    if m is not None:
        return str(m.args[0])
    stem = Path(str(item.fspath)).stem
    return stem[5:] if stem.startswith("test_") else stem


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "items" not in _state:
        return
    # A case marked md_requires that no selected backend declares has no parameters: not a test.
    names = _state["backends"]
    unparametrized = [it for it in items if "md_backend_name" in getattr(it, "fixturenames", ())
                      and getattr(getattr(it, "callspec", None), "params", {}).get("md_backend_name") not in names]
    if unparametrized:
        config.hook.pytest_deselected(items=unparametrized)
        items[:] = [it for it in items if it not in unparametrized]
    for it in items:
        cs = getattr(it, "callspec", None)
        if cs is not None and "md_backend_name" in cs.params:
            _state["items"][it.nodeid] = (cs.params["md_backend_name"], _feature(it))
            for x in _state.get("xfails", []):
                if x.matches(check_id(it.nodeid)):
                    it.add_marker(pytest.mark.xfail(reason=f"expected failure ({x.where}: {x.pattern})", strict=False))
                    _state["xfail_hits"].setdefault(x.where, []).append(it.nodeid)
                    break


def pytest_collection_finish(session: pytest.Session) -> None:
    if "items" not in _state:
        return
    kept = {it.nodeid for it in session.items}
    for nodeid in [n for n in _state["items"] if n not in kept]:  # deselected (-k, -m)
        del _state["items"][nodeid]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    key = _state.get("items", {}).get(report.nodeid)
    if key is None:
        return
    prev = _state["outcomes"].get(report.nodeid)
    if hasattr(report, "wasxfail"):  # listed in an expected-failures file
        outcome = "xfailed" if report.skipped else ("xpassed" if report.passed else "failed")
    elif report.failed:
        outcome = "failed"
    elif report.skipped:
        outcome = "skipped"
    elif report.when == "call":
        outcome = "passed"
    else:
        return
    if prev != "failed":
        _state["outcomes"][report.nodeid] = outcome
        if outcome == "skipped" and report.longrepr:
            rep: Any = report.longrepr
            _state.setdefault("reasons", {})[report.nodeid] = str(rep[-1] if isinstance(rep, tuple) else rep)


def matrix() -> dict[str, dict[str, dict[str, int]]]:
    """backend -> feature -> {passed, failed, skipped, xfailed, xpassed} counts of the run so far
    (``xfailed``: failed as the expected-failures file said; ``xpassed``: listed there, but passed)."""
    out: dict[str, dict[str, dict[str, int]]] = defaultdict(
        lambda: defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0, "xpassed": 0}))
    for nodeid, (backend, feature) in _state.get("items", {}).items():
        oc = _state["outcomes"].get(nodeid)
        if oc:
            out[backend][feature][oc] += 1
    return {b: dict(f) for b, f in out.items()}


def device_warnings() -> list[str]:
    """One line per backend tested on fewer than 2 devices: what was not exercised, and how to get
    more devices."""
    lines = []
    for name, b in _state.get("backends", {}).items():
        devs = [d for n, d in _state["pairs"] if n == name]
        if len(devs) >= 2:
            continue
        missed: dict[str, int] = defaultdict(int)
        for nodeid, r in _state.get("reasons", {}).items():
            backend, feature = _state["items"].get(nodeid, (None, None))
            if backend == name and any(p in r for p in DEVICE_COUNT_PHRASES):
                missed[feature] += 1
        what = (", ".join(f"{f} ({k} case{'s' if k > 1 else ''})" for f, k in sorted(missed.items()))
                or "every multi-device case")
        env = getattr(type(b), "virtual_devices_env", None)
        if _split_devices_filtered(name):
            how = "drop --device (or name more devices) to test the others"
        elif env:
            how = f"set ${env}=4 before the framework starts (the suite asks for {VIRTUAL_DEVICES} when unset)"
        else:
            how = ("this backend has one CPU device: run on a machine with GPUs, e.g. "
                   "--device cpu:0,gpu:0 or more GPUs")
        lines.append(f"WARNING {name}: only {len(devs)} device(s) here ({', '.join(map(str, devs)) or 'none'}); "
                     f"not exercised: moves between devices, multi-device collectives, device-mismatch "
                     f"errors: {what}. To get more devices: {how}.")
    return lines


def _split_devices_filtered(name: str) -> bool:
    b = _state["backends"][name]
    return len([d for n, d in _state["pairs"] if n == name]) < len(b.devices())


def _found_lines() -> list[str]:
    lines = []
    for name, b in _state.get("backends", {}).items():
        found = _state.get("found", {}).get(name, {})
        if not found:
            continue
        c = b.capabilities
        declared: dict[str, Any] = {
            "mutable": c.mutable, "async_execution": c.async_execution, "dlpack": b.dlpack is not None,
            "pinned_memory": c.pinned_memory, "native_allreduce": b.collectives is not None,
            "raises_on_mixed_devices": c.raises_on_mixed_devices, "dtypes": len(c.dtypes)}
        cells = []
        for k in sorted(found):
            d = declared.get(k, found[k])
            cells.append(f"{k}={_fmt(found[k])}" + (f" (declared {_fmt(d)})" if d != found[k] else ""))
        lines.append(f"  {name}: " + ", ".join(cells))
    return lines


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if "items" not in _state or not _state["items"]:
        return
    m = matrix()
    tr = terminalreporter
    tr.section("multidev conformance matrix (passed/failed/skipped)")
    features = sorted({f for b in m.values() for f in b})
    names = list(_state["backends"])
    width = max([len(f) for f in features] + [8])
    tr.write_line(f"{'feature':<{width}}  " + "  ".join(f"{n:>14}" for n in names))
    for f in features:
        cells = []
        for n in names:
            c = m.get(n, {}).get(f)
            cells.append(f"{c['passed']}/{c['failed']}/{c['skipped']:<4}" if c else "-")
        tr.write_line(f"{f:<{width}}  " + "  ".join(f"{c:>14}" for c in cells))
    found = _found_lines()
    if found:
        tr.write_line("capabilities found by the checks (the declared value in parentheses where it differs):")
        for line in found:
            tr.write_line(line)
    warns = device_warnings()
    for w in warns:
        tr.write_line(w, yellow=True, bold=True)
    cert = certification()
    tr.write_line("certification (ran = passed + failed + expected failures + unexpected passes):")
    for n, c in cert["backends"].items():
        tr.write_line(f"  {n}: ran {c['ran']}, passed {c['passed']}, failed {c['failed']}, expected failures "
                      f"{c['xfailed']}, unexpected passes {c['xpassed']}, skipped {c['skipped']}")
    for nodeid in cert["unexpected_passes"]:
        tr.write_line(f"  UNEXPECTED PASS {check_id(nodeid)}: listed as an expected failure; remove its line",
                      yellow=True)
    for x in cert["unmatched_xfails"]:
        tr.write_line(f"  expected-failures line {x} matched no check of this run (stale, or deselected)")
    out = config.getoption("multidev_write_xfails")
    if out:
        write_xfails(out)
        tr.write_line(f"expected failures written to {out}")
    reasons: dict[str, int] = defaultdict(int)
    for nodeid, r in _state.get("reasons", {}).items():
        if nodeid not in _state["items"]:
            continue
        backend = _state["items"][nodeid][0]
        reasons[f"{backend}: {r}"] += 1
    if reasons:
        tr.write_line("skip reasons:")
        for r, k in sorted(reasons.items()):
            tr.write_line(f"  {k:4d} x {r}")
    path = config.getoption("multidev_json")
    if path:
        import multidev as md

        doc = {
            "schema": "multidev.conformance/1",
            "command": " ".join(sys.argv),
            "exit_status": int(exitstatus),
            "duration_s": round(time.time() - _state["started"], 2),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "multidev": md.__version__,
            "backends": {n: {"version": b.version(), "devices": [str(d) for n2, d in _state["pairs"] if n2 == n],
                             "spec": spec_of(n), "partners": partners_of(n),
                             "capabilities": _caps_json(b),
                             "capabilities_found": _state.get("found", {}).get(n, {})}
                         for n, b in _state["backends"].items()},
            "matrix": m,
            "checks": {check_id(nodeid): {"backend": backend, "feature": feature,
                                          "outcome": _state["outcomes"].get(nodeid, "not run"),
                                          **({"reason": _state["reasons"][nodeid]}
                                             if nodeid in _state.get("reasons", {}) else {})}
                       for nodeid, (backend, feature) in _state["items"].items()},
            "certification": cert,
            "warnings": warns,
            "skip_reasons": dict(reasons),
            "env": {k: os.environ[k] for k in sorted(os.environ)
                    if k.startswith(("MULTIDEV_", "XLA_FLAGS", "CUDA_VISIBLE", "NCCL_"))},
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
        tr.write_line(f"matrix written to {path}")


def certification() -> dict[str, Any]:
    """The run's certification record: per backend how many checks ran and how each ended
    (``skipped`` ones by capability flags or device counts, their reasons under the matrix), the
    checks listed as expected failures that passed (``unexpected_passes``: their lines can go), and
    the lines of the expected-failures files that matched no check of this run."""
    per: dict[str, dict[str, int]] = {n: {"ran": 0, "passed": 0, "failed": 0, "xfailed": 0, "xpassed": 0,
                                          "skipped": 0} for n in _state.get("backends", {})}
    for nodeid, (backend, _feature) in _state.get("items", {}).items():
        oc = _state["outcomes"].get(nodeid)
        if oc is None or backend not in per:
            continue
        per[backend][oc] += 1
        if oc != "skipped":
            per[backend]["ran"] += 1
    hits = _state.get("xfail_hits", {})
    return {"backends": per,
            "unexpected_passes": sorted(n for n, oc in _state.get("outcomes", {}).items() if oc == "xpassed"),
            "unmatched_xfails": [f"{x.where} ({x.pattern})" for x in _state.get("xfails", []) if x.where not in hits]}


def write_xfails(path: str) -> None:
    """The checks that failed in this run (expected or not) as an expected-failures file: a
    starting point for an adapter's ``--xfails`` file, each line to be kept only with a reason."""
    failed = sorted(check_id(n) for n, oc in _state.get("outcomes", {}).items() if oc in ("failed", "xfailed"))
    names = ", ".join(_state.get("backends", {}))
    lines = [f"# Expected failures of the multidev conformance suite for {names}.",
             "# One check id per line (test_file.py::test_name[params], or test_name for every parametrization);",
             "# '#' starts a comment: say why each one fails. Use: multidev conformance --xfails THIS_FILE",
             *failed]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")


def _caps_json(b: Any) -> dict[str, Any]:
    c = b.capabilities
    out: dict[str, Any] = {}
    for k, v in vars(c).items():
        if isinstance(v, frozenset):
            out[k] = sorted(v)
        elif isinstance(v, dict):
            out[k] = {str(d): sorted(s) for d, s in v.items()}
        else:
            out[k] = v
    # the deprecated flags' keys (as before 0.4), from the concern attributes
    out["dlpack"] = getattr(b, "dlpack", None) is not None
    out["native_collectives"] = ["allreduce"] if getattr(b, "collectives", None) is not None else []
    return out
