"""The third-party author's path, as an author meets it: the docs page's snippets run, the template
adapter passes the suite, an adapter installed only through its own entry point passes
``--multiprocess``, and each wall of issue 15 is gone (help order, load-time validation, per-device
dtypes, the virtual-device hook, factories and run-time registrations on the command line,
duplicate claims, install hints)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import multidev as md
from multidev import registry
from multidev.adapter import PROTOCOL_METHODS, Backend, BaseBackend, Capabilities
from multidev.adapters.numpy import NumpyBackend, VirtualDeviceArray

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workers import child_suite

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "writing-an-adapter.md"
TEMPLATE = "multidev.examples.template_adapter:TemplateBackend"
needs_strict = pytest.mark.skipif(
    __import__("importlib").util.find_spec("array_api_strict") is None,
    reason="the template adapts array-api-strict: pip install 'multidev[test]'")
#: array-api-strict's DLPack needs NumPy 2 (on 1.x its __dlpack__ refuses max_version and its
#: from_dlpack takes no keywords); the generic adapter works around both, the short template does not.
needs_numpy2 = pytest.mark.skipif(int(np.__version__.split(".")[0]) < 2,
                                  reason="the template's DLPack calls need array-api-strict on NumPy 2")


def _cli(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "multidev.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), cwd=cwd, timeout=timeout)


def _pythonpath(*dirs: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([*map(str, dirs), os.environ.get("PYTHONPATH", "")])}


# -- the page ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("i", range(len(re.findall(r"```python\n", DOC.read_text()))))
def test_doc_snippets_run_as_written(i: int) -> None:
    code = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[i]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"snippet {i} of {DOC.name}:\n{code}\n{r.stderr[-2000:]}"


def test_doc_explains_every_capability_field_and_names_the_template() -> None:
    text = DOC.read_text()
    for f in Capabilities.__dataclass_fields__:
        assert f"| `{f}` |" in text, f"Capabilities.{f} is not in the table of {DOC.name}"
    assert "examples/template_adapter.py" in text and (ROOT / "examples" / "template_adapter.py").exists()


# -- wall 1: the protocol in order, documented -------------------------------------------------------
def test_help_lists_the_protocol_in_order() -> None:
    doc = Backend.__doc__ or ""
    positions = [doc.index(f". {m}") for m in PROTOCOL_METHODS]
    assert positions == sorted(positions), "help(Backend) must list the methods in protocol order"
    src = (ROOT / "examples" / "template_adapter.py").read_text()
    # each method defined, or named in a comment saying where BaseBackend's comes from
    shown = {m: re.search(rf"def {m}\(|#[^\n]*\b{m}\(\)", src) for m in PROTOCOL_METHODS}
    assert [m for m in PROTOCOL_METHODS if shown[m]] == list(PROTOCOL_METHODS), "the template shows every method"
    order = [shown[m].start() for m in PROTOCOL_METHODS]  # type: ignore[union-attr]
    assert order == sorted(order)
    sd = BaseBackend.same_device.__doc__ or ""
    assert "``what``" in sd and "``note``" in sd and "``xs``" in sd


# -- the template passes the suite as it stands --------------------------------------------------------
@needs_strict
@needs_numpy2
@pytest.mark.slow
def test_template_adapter_passes_the_suite(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    scope, least = child_suite()
    r = _cli(["conformance", "--backend", TEMPLATE, "--json", str(out), "--", "-q", "-p", "no:warnings", *scope])
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    m = doc["matrix"]["template"]
    assert all(f["failed"] == 0 for f in m.values()) and sum(f["passed"] for f in m.values()) > least
    caps = doc["backends"]["template"]["capabilities"]
    assert caps["device_dtypes"]["cpu:3"] and "float64" not in caps["device_dtypes"]["cpu:3"]


# -- an adapter installed only through its own entry point, over processes ----------------------------
def _entry_point_package(root: Path) -> Path:
    """A package ``mdtoy`` installed only as a dist-info with a ``multidev.backends`` entry point."""
    site = root / "site"
    (site / "mdtoy").mkdir(parents=True)
    (site / "mdtoy" / "__init__.py").write_text(textwrap.dedent("""
        from multidev.examples.template_adapter import TemplateBackend


        class ToyBackend(TemplateBackend):
            name = "toy"
    """))
    info = site / "mdtoy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mdtoy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[multidev.backends]\ntoy = mdtoy:ToyBackend\n")
    return site


@needs_strict
@needs_numpy2
@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="multidev.distributed runs on torch.distributed: needs torch")
@pytest.mark.slow
@pytest.mark.multiprocess
def test_entry_point_adapter_passes_multiprocess(tmp_path: Path) -> None:
    site = _entry_point_package(tmp_path)
    out = tmp_path / "m.json"
    # What an entry-point adapter adds here: every child rank of every engine finds it through its
    # entry point and runs every collective on its tensors (2, 3 and 4 ranks). The fault checks
    # (a killed, hung or absent rank) are engine-level: the suite's own multi-process job runs them.
    r = _cli(["conformance", "--backend", "toy", "--multiprocess", "--json", str(out), "--", "-q",
              "-p", "no:warnings", "-k", "test_collectives_across_processes or test_calls_before_init"],
             env=_pythonpath(site), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    m = json.loads(out.read_text())["matrix"]["toy"]["distributed"]
    assert m["failed"] == 0 and m["passed"] >= 4, m


# -- wall 2: load-time validation, one line per problem ---------------------------------------------------
def test_a_broken_adapter_is_refused_with_every_problem(tmp_path: Path) -> None:
    (tmp_path / "halfdone.py").write_text(textwrap.dedent("""
        from multidev.adapter import BaseBackend, Capabilities


        class Half(BaseBackend):
            name = "half"

            @property
            def capabilities(self):
                return Capabilities(mutable=True, async_execution=False, pinned_memory=False)

            def devices(self):
                return []
    """))
    r = _cli(["conformance", "--backend", "halfdone:Half"], env=_pythonpath(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert any("'framework' must be a non-empty string" in x for x in lines)
    assert any("capabilities.dtypes is empty" in x for x in lines)
    assert any("method combine() is missing" in x for x in lines)
    missing = [m for m in PROTOCOL_METHODS if m not in ("capabilities", "devices") and not hasattr(BaseBackend, m)]
    for m in missing:  # every core method BaseBackend does not derive, each on its own line
        assert any(f"method {m}() is missing" in x for x in lines), m
    assert sum(x.lstrip().startswith("- ") for x in lines) == len(missing) + 2, "one line per problem"


# -- wall 5: a virtual-device hook third parties get ---------------------------------------------------------
def test_the_cli_asks_module_attr_adapters_for_virtual_devices(tmp_path: Path) -> None:
    (tmp_path / "vdev.py").write_text(textwrap.dedent("""
        import os
        from multidev.adapters.numpy import NumpyBackend


        class Vdev(NumpyBackend):
            name = "vdev"
            asked = []

            @classmethod
            def configure_devices(cls, count):
                cls.asked.append(count)
                os.environ["VDEV_ASKED"] = str(count)
                return True
    """))
    code = ("import os, sys; from multidev.cli import main;"
            "rc = main(['conformance', '--backend', 'vdev:Vdev', '--', '-q', '-k', 'test_devices_listed']);"
            "print('ASKED', os.environ.get('VDEV_ASKED')); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **_pythonpath(tmp_path)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "ASKED 4" in r.stdout


# -- wall 6: factories, run-time registrations, full specs ------------------------------------------------------
def test_backend_flag_takes_a_factory_and_a_runtime_registration(tmp_path: Path) -> None:
    (tmp_path / "facmod.py").write_text(textwrap.dedent("""
        import multidev as md
        from multidev.adapters.numpy import NumpyBackend


        class Renamed(NumpyBackend):
            name = "renamed"


        def make():
            return Renamed()


        class Registered(NumpyBackend):
            name = "registered"


        md.register_backend("registered", Registered)
    """))
    env = _pythonpath(tmp_path)
    quick = ["--", "-q", "-p", "no:warnings", "-k", "test_devices_listed or test_to_numpy"]
    r = _cli(["conformance", "--backend", "facmod:make", *quick], env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "renamed" in r.stdout
    r = _cli(["conformance", "--backend", "registered", *quick], env=env)
    assert r.returncode == 2 and "no backend named 'registered'" in r.stderr
    r = _cli(["conformance", "--import", "facmod", "--backend", "registered", *quick], env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_the_suite_hands_workers_the_spec_it_was_given() -> None:
    from multidev.conformance import plugin

    saved = dict(plugin._state)
    try:
        plugin._state.update(specs={"renamed": "facmod:make"}, imports=["facmod"])
        assert plugin.spec_of("renamed") == "facmod:make" and plugin.imports_of() == ["facmod"]
        assert plugin.spec_of("numpy") == "numpy"
    finally:
        plugin._state.clear()
        plugin._state.update(saved)


# -- wall 7: two adapters claiming one tensor class --------------------------------------------------------------
class _Copy(NumpyBackend):
    name: ClassVar[str] = "numpy_copy_for_test"


@pytest.fixture
def _copy_registered() -> Any:
    md.register_backend("numpy_copy_for_test", _Copy, replace=True)
    yield
    registry.unregister_backend("numpy_copy_for_test")  # later tests see the registry as it was


def test_a_second_claim_warns_and_prefer_routes(_copy_registered: Any) -> None:
    md.backend("numpy")
    with pytest.warns(RuntimeWarning, match="claims numpy.ndarray, which .numpy. claims already"):
        md.backend("numpy_copy_for_test")
    x = md.ones(3, backend="numpy", device="cpu:1")
    assert isinstance(x, VirtualDeviceArray)
    assert md.backend_of(x).name == "numpy", "the adapter loaded first keeps the class"
    with registry.prefer("numpy_copy_for_test"):
        assert md.backend_of(x).name == "numpy_copy_for_test"
    assert md.backend_of(x).name == "numpy"


# -- wall 8: install hints only for real extras ----------------------------------------------------------------------
def test_install_hints_name_only_extras_that_exist() -> None:
    from importlib import metadata

    # Provides-Extra is normalized (PEP 685: array_api -> array-api); pip accepts either spelling
    extras = {e.replace("-", "_") for e in metadata.metadata("multidev").get_all("Provides-Extra") or []}
    for name in ("torch", "jax", "tensorflow", "mxnet", "cupy", "array_api"):
        assert name in extras, f"pyproject has no extra {name!r}"
        if name != "cupy":  # CuPy's hint names the CUDA wheel to match the driver (its adapter's install_hint)
            assert f'multidev[{name}]' in registry._install_hint(name)
    assert "cupy-cuda13x" in registry._install_hint("cupy")
    hint = registry._install_hint("someones_adapter")
    assert "multidev[" not in hint and "someones_adapter" in hint


def test_registry_and_cli_reach_family_members() -> None:
    """array_api:LIB through get_backend, the CLI's `devices`, and a clear error for a bad library."""
    r = _cli(["devices", "--backend", "array_api:no_such_library_xyz"])
    assert r.returncode == 1 and "not installed" in r.stdout and "Traceback" not in r.stderr
    with pytest.raises(md.BackendNotAvailableError, match="not a module name"):
        md.backend("array_api:not a module")


def test_capabilities_json_has_string_keys() -> None:
    from multidev.conformance.plugin import _caps_json

    class B:
        capabilities = Capabilities(mutable=True, async_execution=False, pinned_memory=False,
                                    dtypes=frozenset({"float32", "float64"}),
                                    device_dtypes={md.Device("cpu", 1): frozenset({"float32"})})

    doc: Any = _caps_json(B())
    assert json.loads(json.dumps(doc))["device_dtypes"] == {"cpu:1": ["float32"]}


def test_aligned_host_buffers_reach_xla_partners_without_copy() -> None:
    """The alignment helpers give buffers JAX shares (where JAX is installed)."""
    jax = pytest.importorskip("jax")
    from multidev.adapter import host_aligned

    a = host_aligned(np.arange(10, dtype=np.float32)[1:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        j = jax.dlpack.from_dlpack(a)
    assert j.unsafe_buffer_pointer() == a.ctypes.data


# -- a partner that aborts the interpreter fails its tests, and the run goes on ---------------------------------------
@needs_strict
@pytest.mark.slow
def test_a_partner_that_aborts_fails_its_tests_and_the_matrix_survives(tmp_path: Path) -> None:
    (tmp_path / "abortmod.py").write_text(textwrap.dedent("""
        import os

        import multidev as md
        from multidev.examples.template_adapter import TemplateBackend


        class Aborter(TemplateBackend):
            name = "aborter"

            def import_dlpack(self, obj, device):
                os.abort()  # what TensorFlow does on an unaligned host buffer


        md.register_backend("aborter", Aborter)
    """))
    out = tmp_path / "m.json"
    r = _cli(["conformance", "--backend", "numpy", "--import", "abortmod", "--json", str(out), "--", "-q",
              "-p", "no:warnings", "-rf", "-k", "interop and (aborter or jax or torch)"],
             env=_pythonpath(tmp_path), cwd=tmp_path)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())  # the parent lived to write it
    interop = doc["matrix"]["numpy"]["interop"]
    assert interop["failed"] >= 1, interop
    assert interop["passed"] >= 1, "the other partners' tests ran and passed in the same run"
    failed = [ln for ln in r.stdout.splitlines() if ln.startswith("FAILED")]
    assert failed and all("aborter" in ln for ln in failed), failed  # only the aborting partner's tests
    assert "signal SIGABRT" in r.stdout
