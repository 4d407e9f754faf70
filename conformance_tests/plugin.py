"""pytest plugin that parametrizes the conformance suite by backend and device.

Fixtures for suite authors:
- ``md_backend``: the adapter under test (parametrized over the selected backends);
- ``md_device``: one of its devices (parametrized over backend x device);
- ``md_devices``: all devices of the backend under test.

Options: ``--multidev-backend NAME[,NAME]`` (registered names or ``module:attr``; default: every
installed backend), ``--multidev-device SPEC[,SPEC]`` (keep only these devices),
``--multidev-json FILE`` (the per-backend, per-feature matrix as JSON). Skips come only from
capability flags and device counts, each with its reason.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

SUITE_DIR = Path(__file__).resolve().parent

#: Virtual CPU devices the suite asks every adapter for (its ``configure_devices`` hook), when the
#: user has not configured their own. Only frameworks not started yet can take them.
VIRTUAL_DEVICES = 4

_state: dict[str, Any] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("multidev", "multidev conformance suite")
    g.addoption("--multidev-backend", action="append", default=[],
                help="backend(s) to test: registered names or module:attr (comma-separated, repeatable)")
    g.addoption("--multidev-device", action="append", default=[],
                help="only these devices, e.g. cpu:0,gpu:0 (comma-separated, repeatable)")
    g.addoption("--multidev-json", default=None, help="write the pass/fail/skip matrix to this JSON file")
    g.addoption("--multidev-import", action="append", default=[],
                help="import this module first (adapters registered with multidev.register_backend)")
    g.addoption("--multidev-isolate", action="append", default=[],
                help="interop partners whose tests run in a child process, so a framework that aborts "
                     "the interpreter fails them without ending the run (default: the adapters that set "
                     "interop_in_child; 'none')")


def _split(values: list[str]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _in_suite(config: pytest.Config) -> bool:
    if _split(config.getoption("multidev_backend")) or config.getoption("multidev_json"):
        return True
    return any(str(SUITE_DIR) in str(Path(a).resolve()) or "multidev.conformance" in a
               for a in config.args)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "md_feature(name): feature row of the conformance matrix")
    config.addinivalue_line("markers", "multiprocess: spawns several processes")
    if not _in_suite(config):
        return
    import importlib

    import multidev as md
    from multidev.errors import BackendNotAvailableError
    from multidev.registry import configure_virtual_devices, registered_backends

    from ._isolate import isolated

    imports = list(config.getoption("multidev_import"))
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
        specs.setdefault(b.name, n)
    wanted = [md.device(s) for s in _split(config.getoption("multidev_device"))]
    pairs: list[tuple[str, Any]] = []
    for b in backends:
        devs = b.devices()
        if wanted:
            devs = [d for d in devs if d in wanted]
        pairs.extend((b.name, d) for d in devs)
    _state.update(backends={b.name: b for b in backends}, pairs=pairs, items={}, outcomes={},
                  started=time.time(), specs=specs, imports=imports,
                  isolate=isolated(config.getoption("multidev_isolate")))


def selected_backends() -> list[str]:
    """The names of the backends this suite run tests, in the order given."""
    return list(_state.get("backends", {}))


def isolated_partners() -> set[str]:
    """Interop partners whose tests run in a child process: ``--multidev-isolate``, else the
    adapters that set ``interop_in_child``."""
    chosen = _state.get("isolate")
    if chosen is not None:
        return set(chosen)
    from ._isolate import wants_child

    return {n for n in _partners() if wants_child(n)}


def _partners() -> list[str]:
    if "partners" not in _state:
        import multidev as md

        _state["partners"] = md.backends()
    return list(_state["partners"])


def backend_spec(name: str) -> tuple[str, list[str]]:
    """How a child process gets adapter ``name`` as this run has it: the spec given on the command
    line (a registered name, ``module:attr`` or ``FAMILY:ARG``) and the modules to import first."""
    return _state.get("specs", {}).get(name, name), list(_state.get("imports", []))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "md_device" in metafunc.fixturenames:
        pairs = _state.get("pairs", [])
        metafunc.parametrize(("md_backend_name", "md_device"), pairs,
                             ids=[f"{n}-{d}" for n, d in pairs], scope="session")
    elif "md_backend_name" in metafunc.fixturenames:
        names = list(_state.get("backends", {}))
        metafunc.parametrize("md_backend_name", names, ids=names, scope="session")


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


@pytest.fixture(scope="session")
def md_devices(md_backend: Any) -> list:
    """Every device of the backend under test (after --multidev-device filtering)."""
    return [d for n, d in _state["pairs"] if n == md_backend.name]


def _feature(item: pytest.Item) -> str:
    m = item.get_closest_marker("md_feature")
    if m is not None:
        return str(m.args[0])
    stem = Path(str(item.fspath)).stem
    return stem[5:] if stem.startswith("test_") else stem


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "items" not in _state:
        return
    for it in items:
        cs = getattr(it, "callspec", None)
        if cs is not None and "md_backend_name" in cs.params:
            _state["items"][it.nodeid] = (cs.params["md_backend_name"], _feature(it))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    key = _state.get("items", {}).get(report.nodeid)
    if key is None:
        return
    prev = _state["outcomes"].get(report.nodeid)
    if report.failed:
        outcome = "failed"
    elif report.skipped:
        outcome = "skipped"
    elif report.when == "call":
        outcome = "passed"
    else:
        return
    if prev != "failed":
        _state["outcomes"][report.nodeid] = outcome
        if report.skipped and report.longrepr:
            rep: Any = report.longrepr
            _state.setdefault("reasons", {})[report.nodeid] = str(rep[-1] if isinstance(rep, tuple) else rep)


def matrix() -> dict[str, dict[str, dict[str, int]]]:
    """backend -> feature -> {passed, failed, skipped} counts of the run so far."""
    out: dict[str, dict[str, dict[str, int]]] = defaultdict(
        lambda: defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0}))
    for nodeid, (backend, feature) in _state.get("items", {}).items():
        oc = _state["outcomes"].get(nodeid)
        if oc:
            out[backend][feature][oc] += 1
    return {b: dict(f) for b, f in out.items()}


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
    reasons: dict[str, int] = defaultdict(int)
    for nodeid, r in _state.get("reasons", {}).items():
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
                             "capabilities": _caps_json(b)} for n, b in _state["backends"].items()},
            "matrix": m,
            "skip_reasons": dict(reasons),
            "isolated_partners": sorted(isolated_partners()),
            "env": {k: os.environ[k] for k in sorted(os.environ)
                    if k.startswith(("MULTIDEV_", "XLA_FLAGS", "CUDA_VISIBLE", "NCCL_"))},
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(doc, indent=2, sort_keys=True))
        tr.write_line(f"matrix written to {path}")


def _caps_json(b: Any) -> dict[str, Any]:
    def plain(v: Any) -> Any:
        if isinstance(v, (frozenset, set)):
            return sorted(v)
        if isinstance(v, dict):  # device_dtypes: Device keys
            return {str(k): plain(x) for k, x in v.items()}
        return v

    return {k: plain(v) for k, v in vars(b.capabilities).items()}
