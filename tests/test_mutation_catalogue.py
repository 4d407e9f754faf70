"""The conformance suite catches real adapter bugs: every mutant of ``tests/mutants/`` (a package,
one module per adapter, imported as ``mutants``) must fail it, and every unmutated control must pass
the same checks.

One ``multidev conformance`` run per framework tests all of its mutants and controls at once (each
mutant only against the checks its entry selects, stopping at its first failure). Mutants whose
defect needs GPUs are listed as such and run where the GPUs are: ``scripts/gpu/mutants.sh`` (the
same test with ``MULTIDEV_CATALOGUE_DEVICE=cpu:0,gpu:0``).

Environment: ``MULTIDEV_CATALOGUE_DEVICE`` (``--device`` for the runs), ``MULTIDEV_CATALOGUE_OUT``
(a folder for the per-mutant results as JSON), ``MULTIDEV_CATALOGUE_ONLY`` (frameworks to run,
comma-separated), ``MULTIDEV_CATALOGUE_MUTANTS`` (mutant classes to run, comma-separated: the
framework runs and their controls are limited to them and their checks; the engine tests select
with ``-k`` as usual).
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import mutants  # noqa: E402

#: Partners per framework: enough for the interop checks, without starting every framework.
PARTNERS = {"numpy": "torch", "torch": "numpy", "jax": "numpy", "cupy": "numpy"}
#: On a GPU machine, partners with GPU devices too (the stream hand-off between GPU frameworks).
GPU_PARTNERS = {"torch": ("numpy", "jax"), "jax": ("numpy", "torch"), "cupy": ("numpy", "torch")}
FRAMEWORKS = [f for f in ("numpy", "torch", "jax", "cupy")
              if f in (os.environ.get("MULTIDEV_CATALOGUE_ONLY") or "numpy,torch,jax,cupy").split(",")]


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _fake_cupy() -> bool:
    """Whether the CuPy catalogue runs on ``tests/fake_cupy.py`` (no CuPy here; its checks that
    need a GPU say so and run on the GPU machine)."""
    return not _installed("cupy")


#: multidev.distributed runs on torch.distributed, and these checks' partner is torch.
needs_torch = pytest.mark.skipif(not _installed("torch"), reason="needs torch (the interop partner of these "
                                 "checks; multidev.distributed runs on torch.distributed)")


def _gpus() -> int:
    if not os.environ.get("MULTIDEV_CATALOGUE_DEVICE"):
        return 0
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "COLUMNS": "200", "PYTHONWARNINGS": "ignore::RuntimeWarning", **extra}


def _conformance(specs: list[str], json_path: Path, *pytest_args: str, timeout: float = 900,
                 env: dict[str, str] | None = None, cli: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "multidev.cli", "conformance", "--backend", ",".join(specs),
           "--json", str(json_path), *cli]
    device = os.environ.get("MULTIDEV_CATALOGUE_DEVICE")
    if device:
        cmd += ["--device", device]
    return subprocess.run([*cmd, "--", "-rfE", *pytest_args], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout)


@pytest.fixture(scope="module", params=FRAMEWORKS)
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One conformance run over every runnable mutant and control of a framework."""
    fw = request.param
    for module in (fw, PARTNERS[fw]):
        if not _installed(module) and not (module == "cupy" and _fake_cupy()):
            pytest.skip(f"the {fw} catalogue needs {module} installed (the framework, or the partner of "
                        "its interop checks); the modern CI lane runs it")
    gpus = _gpus()
    partners = [PARTNERS[fw]]
    if gpus:
        partners = [p for p in GPU_PARTNERS.get(fw, partners) if _installed(p)]
    entries = [m for m in mutants.chosen(mutants.CATALOGUE) if m.cls.framework == fw]
    runnable = [m for m in entries if m.gpus <= gpus]
    controls = [c for c in mutants.CONTROLS if c.framework == fw
                and (c in {mutants.control_of(m.cls) for m in entries} or not os.environ.get(mutants.ONLY_ENV))]
    if not entries:
        pytest.skip(f"${mutants.ONLY_ENV}={os.environ.get(mutants.ONLY_ENV)} names no mutant of the {fw} catalogue")
    out = tmp_path_factory.mktemp(f"catalogue-{fw}") / "matrix.json"
    specs = [f"mutants:{c.__name__}" for c in controls] + [m.spec for m in runnable]
    cli: tuple[str, ...] = ("--import", "fake_cupy") if fw == "cupy" and _fake_cupy() else ()
    if any(m.multiprocess for m in runnable):  # their checks launch ranks (the selection keeps only theirs)
        cli += ("--multiprocess",)
    p = _conformance(specs, out, "-p", "mutants", f"--multidev-partner={','.join(partners)}", "-q",
                     env=_env(MULTIDEV_CATALOGUE_SELECT="1"), cli=cli)
    assert out.exists(), f"the {fw} catalogue run wrote no matrix:\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    doc = json.loads(out.read_text())
    first: dict[str, str] = {}
    for line in p.stdout.splitlines():
        m = re.match(r"(?:FAILED|ERROR) (\S+?)\[([^\]-]+)[-\]]", line)
        if m:
            first.setdefault(m.group(2), f"{m.group(1).split('/')[-1]}[...]")
    # A mutant the run let pass runs once more alone: the checks that catch some mutants (a synchronize
    # that returns early) observe by time, and a loaded machine (CI's jobs side by side on two cores)
    # can hide it in one run. Caught there, it counts as caught, and the test says so.
    again = [m for m in runnable if not _failed(doc, m.name) and not m.known]
    if again:
        out2 = out.with_name("matrix-again.json")
        p2 = _conformance([m.spec for m in again], out2, "-p", "mutants",
                          f"--multidev-partner={','.join(partners)}", "-q",
                          env=_env(MULTIDEV_CATALOGUE_SELECT="1"), cli=cli)
        if out2.exists():
            doc2 = json.loads(out2.read_text())
            for m in again:
                if _failed(doc2, m.name):
                    doc["matrix"][m.name] = doc2["matrix"][m.name]
                    first.setdefault(m.name, "(caught on a second run alone)")
            print(f"[catalogue] {fw}: ran again alone: {', '.join(m.name for m in again)}; caught then: "
                  f"{', '.join(m.name for m in again if _failed(doc, m.name)) or 'none'}")
        stdout = f"{p.stdout}\n[the second run, alone]\n{p2.stdout}"
    else:
        stdout = p.stdout
    result = {"framework": fw, "doc": doc, "stdout": stdout, "first": first, "runnable": runnable,
              "entries": entries, "controls": controls, "gpus": gpus}
    _write_results(result)
    return result


def _failure_texts(stdout: str, name: str) -> list[str]:
    """The FAILURES sections of pytest's output for the checks of backend ``name`` (whole
    tracebacks: what a GPU run must bring back for a control that fails there)."""
    parts = re.split(r"^_{3,} (.+?) _{3,}$", stdout, flags=re.M)
    bodies = [re.split(r"^={3,}", b, maxsplit=1, flags=re.M)[0].strip()[-3000:] for b in parts[2::2]]
    return [f"{head}\n{body}" for head, body in zip(parts[1::2], bodies)
            if f"[{name}-" in head or f"[{name}]" in head]


def _failed(doc: dict[str, Any], name: str) -> int:
    return sum(c["failed"] for c in doc["matrix"].get(name, {}).values())


def _write_results(r: dict[str, Any]) -> None:
    folder = os.environ.get("MULTIDEV_CATALOGUE_OUT")
    if not folder:
        return
    rows = []
    for m in r["entries"]:
        ran = m in r["runnable"]
        rows.append({"mutant": m.name, "class": m.cls.__name__, "base": m.base, "defect": m.defect,
                     "gpus": m.gpus, "why_gpu": m.why_gpu,
                     "method": m.method, "known": m.known,
                     "outcome": ("caught" if _failed(r["doc"], m.name) else "MISSED") if ran else
                                f"not run (needs {m.gpus} GPU(s), {r['gpus']} here)",
                     "caught_by": r["first"].get(m.name, "")})
    for c in r["controls"]:
        rows.append({"control": c.name, "failed": _failed(r["doc"], c.name),
                     "passed": sum(x["passed"] for x in r["doc"]["matrix"].get(c.name, {}).values()),
                     "failures": _failure_texts(r["stdout"], c.name)})
    caught, total, _, _ = kill_rate(r)
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"mutants-{r['framework']}.json").write_text(json.dumps(
        {"device": os.environ.get("MULTIDEV_CATALOGUE_DEVICE", "cpu"), "gpus": r["gpus"], "caught": caught,
         "run": total, "kill_rate": round(caught / max(total, 1), 4), "rows": rows}, indent=2))


def kill_rate(run: dict[str, Any]) -> tuple[int, int, list[Any], list[Any]]:
    """``(caught, runnable, missed, known_caught)``: how many of the mutants run here the suite
    caught, the survivors not marked ``known``, and the marked ones it caught after all."""
    caught = [m for m in run["runnable"] if _failed(run["doc"], m.name) > 0]
    missed = [m for m in run["runnable"] if m not in caught and not m.known]
    return len(caught), len(run["runnable"]), missed, [m for m in caught if m.known]


def test_every_runnable_mutant_fails_the_suite(run: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """Every mutant run here fails the suite, except the known survivors (marked with the reason no
    check can catch them yet); the kill rate is printed (and written with the results)."""
    caught, total, missed, known_caught = kill_rate(run)
    known = [m for m in run["runnable"] if m.known and m not in known_caught]
    with capsys.disabled():
        print(f"\n[catalogue] {run['framework']}: the suite caught {caught} of {total} mutants run here "
              f"({100.0 * caught / max(total, 1):.1f}%); {len(known)} known survivor(s): "
              + (", ".join(f"{m.name} ({m.known})" for m in known) or "none"))
    assert not missed, "the conformance suite let these defects pass (fix the suite, or mark the mutant " \
        "known=REASON):\n  " + "\n  ".join(f"{m.name} ({m.defect})" for m in missed) + "\n" + run["stdout"][-3000:]
    assert not known_caught, "caught now, but marked as known survivors (drop their known=): " + \
        ", ".join(m.name for m in known_caught)


def test_controls_pass_the_same_checks(run: dict[str, Any]) -> None:
    """A renamed, unmutated copy of each base passes every check its mutants are caught by."""
    for c in run["controls"]:
        cells = run["doc"]["matrix"].get(c.name, {})
        assert sum(x["passed"] for x in cells.values()) > 0, f"control {c.name} ran no check"
        assert _failed(run["doc"], c.name) == 0, f"control {c.name} failed:\n" + "\n\n".join(
            _failure_texts(run["stdout"], c.name) or [run["stdout"][-4000:]])


def test_catalogue_is_complete_and_documented() -> None:
    cat = mutants.CATALOGUE
    assert len(cat) >= 40, f"{len(cat)} mutants"
    assert len({m.name for m in cat}) == len(cat) and len({m.cls for m in cat}) == len(cat)
    assert {m.base for m in cat} == {"numpy", "torch", "jax", "cupy", "generic"}
    for m in cat:
        assert m.select and m.defect, m
        assert (m.gpus > 0) == bool(m.why_gpu), f"{m.name}: a GPU-only mutant says why and where it is caught"
        assert mutants.control_of(m.cls) in mutants.CONTROLS
        # (typing.Protocol gives every class deriving from a capability protocol its own __subclasshook__)
        assert mutants.broken_method(m.cls) == m.method  # exactly one method (ValueError otherwise)
        if m.replica is not None:  # the adapter hands back a replica that breaks exactly one method
            assert m.method == "data_parallel_replica", m
            mutants.broken_method(m.replica)


def _live(cls: type, method: str) -> tuple[type, Any]:
    """The class the mutant ``cls`` derives ``method`` from (the next definition in its MRO: the live
    adapter's, a control's, or a shared default's) and that definition."""
    for k in cls.__mro__[1:]:
        if method in vars(k):
            return k, vars(k)[method]
    raise AssertionError(f"{cls.__name__}.{method}: no base defines it any more (the method was renamed or removed)")


def _shape(fn: Any) -> list[tuple[str, Any, Any]]:
    """A signature's parameters as (name, kind, default): what a caller depends on (a class or static
    method's, of the function it wraps)."""
    sig = inspect.signature(fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize("entry", [*mutants.CATALOGUE, *mutants.ENGINE_CATALOGUE],
                         ids=lambda m: m.cls.__name__)
def test_every_mutant_breaks_a_live_method_with_its_signature(entry: Any) -> None:
    """Each mutant names the method it breaks (the one it defines); the adapter, engine or default it
    derives from still has that method, of the same kind and with the same parameters (names, kinds,
    defaults): a renamed or re-signed method fails here instead of leaving a mutant that tests
    nothing the code still has (issue 31)."""
    method = mutants.broken_method(entry.cls)
    holder = mutants.broken_class(entry.cls)  # the mutant, or the concern class it installs
    owner, live = _live(holder, method)
    mine = vars(holder)[method]
    assert isinstance(mine, property) == isinstance(live, property), (
        f"{entry.cls.__name__}.{method}: a {type(mine).__name__} over {owner.__name__}'s {type(live).__name__}")
    if not isinstance(live, property):
        assert _shape(mine) == _shape(live), (
            f"{entry.cls.__name__}.{method}{inspect.signature(mine)} no longer matches "
            f"{owner.__module__}.{owner.__qualname__}.{method}{inspect.signature(live)}")
    replica = getattr(entry, "replica", None)
    if replica is not None:  # a data-parallel mutant: its replica breaks one live method of the adapter's replica
        r_method = mutants.broken_method(replica)
        r_owner, r_live = _live(replica, r_method)
        assert r_owner.__module__.startswith("multidev."), f"{replica.__name__} derives {r_method} from {r_owner}"
        assert _shape(vars(replica)[r_method]) == _shape(r_live), (
            f"{replica.__name__}.{r_method} no longer matches {r_owner.__qualname__}.{r_method}"
            f"{inspect.signature(r_live)}")


def test_the_live_method_check_finds_drift() -> None:
    """A mutant whose method no longer matches the live one (a parameter renamed, one added), or
    whose method the bases no longer have, is found."""
    class Renamed(mutants.NumpyControl):
        def copy(self, x: Any, dev: Any) -> Any:
            return x

    class Gone(mutants.NumpyControl):
        def copy_to_device(self, x: Any) -> Any:
            return x

    assert _shape(vars(Renamed)["copy"]) != _shape(_live(Renamed, "copy")[1])
    with pytest.raises(AssertionError, match="no base defines it"):
        _live(Gone, mutants.broken_method(Gone))


def test_engine_catalogue_is_complete_and_documented() -> None:
    cat = mutants.ENGINE_CATALOGUE
    assert len({m.cls for m in cat}) == len(cat) >= 2
    for m in cat:
        assert m.select and m.defect, m
        assert m.engine in {c.name for c in mutants.ENGINE_CONTROLS}, f"{m.cls.__name__}: no control of its engine"
        mutants.broken_method(m.cls)  # exactly one method (ValueError otherwise)


def _engine_run(cls: type, select: tuple[str, ...], tmp_path: Path) -> tuple[dict[str, Any], str]:
    """The suite's distributed checks ``select`` on NumPy's tensors, over the engine class ``cls``
    installed in place of its engine in the suite and its workers (``$MULTIDEV_ENGINE_MUTANT``)."""
    out = tmp_path / f"{cls.__name__}.json"
    p = _conformance(["numpy"], out, "-q", "-rfEp", "-k", " or ".join(select), timeout=600,
                     cli=("--multiprocess", "--import", "mutants"),
                     env=_env(MULTIDEV_ENGINE_MUTANT=cls.__name__, MULTIDEV_DISTRIBUTED_ENGINES=cls.name,
                              MULTIDEV_NUMPY_DEVICES="1"))
    assert out.exists(), f"the run over {cls.__name__} wrote no matrix:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(out.read_text())["matrix"]["numpy"]["distributed"], p.stdout


@needs_torch
@pytest.mark.parametrize("entry", mutants.ENGINE_CATALOGUE, ids=lambda m: m.cls.__name__)
def test_engine_mutants_fail_the_distributed_checks(entry: Any, tmp_path: Path) -> None:
    """Each engine mutant fails the distributed check its entry names (the engine's fault cases,
    once per engine: a few processes for a few seconds)."""
    cells, stdout = _engine_run(entry.cls, entry.select, tmp_path)
    failed = [line for line in stdout.splitlines() if line.startswith("FAILED")]
    # (a selection may narrow a check with -k's "and": its first word is the check's name)
    assert cells["failed"] >= 1 and any(s.split()[0] in line for s in entry.select for line in failed), (
        f"the distributed checks let {entry.cls.__name__} pass ({entry.defect}): {cells}\n{stdout[-3000:]}")


@needs_torch
@pytest.mark.parametrize("control", mutants.ENGINE_CONTROLS, ids=lambda c: c.__name__)
def test_engine_controls_pass_the_distributed_checks(control: type, tmp_path: Path) -> None:
    select = tuple(sorted({s for m in mutants.ENGINE_CATALOGUE if m.engine == control.name for s in m.select}))
    cells, stdout = _engine_run(control, select, tmp_path)
    passed = [line for line in stdout.splitlines() if line.startswith("PASSED")]
    unrun = [s for s in select if not any(s.split()[0] in line for line in passed)]
    assert cells["failed"] == 0 and not unrun, f"{control.__name__}: {cells}, not passed: {unrun}\n{stdout[-3000:]}"


@needs_torch
def test_an_aborting_framework_fails_its_checks_and_leaves_the_matrix(tmp_path: Path) -> None:
    """A framework that aborts the interpreter when given a buffer (as TensorFlow does on an
    unaligned one) fails the checks that gave it one; the others run, the matrix and JSON are
    written."""
    out = tmp_path / "m.json"
    p = _conformance(["mutants:NumpyImportAborts"], out, "-k", "convert_shares_memory or transposed_view or "
                     "import_dlpack_from_partner or creation_defaults", "--multidev-partner=torch", "-q", timeout=600)
    assert p.returncode != 0
    assert "died (signal SIGABRT)" in p.stdout, p.stdout[-3000:]
    doc = json.loads(out.read_text())
    cells = doc["matrix"]["numpy_import_aborts"]
    assert cells["interop"]["failed"] >= 2, cells  # each abort is one check; the next one gets a new child
    assert cells["interop"]["passed"] >= 1 and cells["creation"]["passed"] >= 1, cells
    assert doc["exit_status"] != 0


@needs_torch
def test_multiprocess_workers_load_the_selected_adapter(tmp_path: Path) -> None:
    """--multiprocess hands its workers the adapter as selected (module:attr), not just its name.
    (One NumPy device: each worker's tensors live on cpu:0, the transport's CPU device.)"""
    out = tmp_path / "m.json"
    p = _conformance(["mutants:NumpyControl"], out, "-k", "collectives_across and 2procs and torch", "-q",
                     timeout=600, cli=("--multiprocess",), env=_env(MULTIDEV_NUMPY_DEVICES="1"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    cells = json.loads(out.read_text())["matrix"]["numpy_control"]
    assert cells["distributed"]["passed"] == 1, cells


def test_a_module_attr_adapter_keeps_its_spec_with_device(tmp_path: Path) -> None:
    """``--device`` (as the GPU run of this catalogue passes) hands the suite the adapter as
    selected (module:attr), so the checks run in the child interpreter load it too (they failed
    with "no backend named 'numpy_control'" when only its name was passed on)."""
    out = tmp_path / "m.json"
    env = {k: v for k, v in _env().items() if k != "MULTIDEV_CATALOGUE_DEVICE"}
    p = subprocess.run([sys.executable, "-m", "multidev.cli", "conformance", "--backend", "mutants:NumpyControl",
                        "--device", "cpu:0,cpu:1", "--json", str(out), "--", "-p", "mutants", "-q",
                        "-k", "dlpack_concern_matches_behaviour"], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    cells = json.loads(out.read_text())["matrix"]["numpy_control"]
    assert cells["capabilities"]["passed"] == 1 and cells["capabilities"]["failed"] == 0, cells


def test_gpu_script_runs_this_catalogue() -> None:
    text = (HERE.parent / "scripts" / "gpu" / "mutants.sh").read_text()
    assert "MULTIDEV_CATALOGUE_DEVICE" in text and "test_mutation_catalogue.py" in text



def test_the_documented_counts_are_the_catalogues() -> None:
    """README.md and docs/conformance.md state how many mutants there are and, in the docs, how many
    of each adapter: the numbers must be the catalogue's (a mutant added without its count fails)."""
    total = len(mutants.CATALOGUE) + len(mutants.ENGINE_CATALOGUE)
    root = HERE.parent
    readme = (root / "README.md").read_text()
    docs = (root / "docs" / "conformance.md").read_text()
    assert f"against {total} one-method" in readme
    assert f"holds {total} one-method" in docs
    per = {b: sum(1 for m in mutants.CATALOGUE if m.base == b) for b in ("numpy", "torch", "jax", "cupy")}
    words = " ".join(docs.split())
    for base, label in (("numpy", "NumPy"), ("torch", "torch"), ("jax", "JAX"), ("cupy", "CuPy")):
        assert f"{per[base]} of the {label} adapter" in words, (base, per[base])
    gpu = sum(1 for m in mutants.CATALOGUE if m.gpus)
    assert f"the {gpu} mutants of those run on a GPU machine" in " ".join(readme.split())
