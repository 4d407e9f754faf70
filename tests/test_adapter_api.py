"""The adapter API's stability promise (docs/writing-an-adapter.md, "Stability: the adapter API"):
``multidev.adapter`` exports exactly the list below for API 0.3; nothing 0.2 exported is gone; a
deprecated name keeps working with a DeprecationWarning naming its replacement; and the 0.2
template adapter, unchanged, loads with one DeprecationWarning and passes the conformance suite."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import multidev as md
import multidev.adapter as api
from multidev.adapters.numpy import NumpyBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workers import child_suite

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "tests" / "legacy"

#: multidev.adapter.__all__ at 0.2 (commit dc9e509): every name must still be exported.
API_0_2 = {
    "COMPLEX_DTYPES", "DTYPES", "FLOAT_DTYPES", "HOST_ALIGNMENT", "INT_DTYPES", "ITEMSIZE", "KINDS",
    "OPTIONAL_METHODS", "PROTOCOL_METHODS", "REDUCE_OPS", "AdapterError", "Backend", "BackendError",
    "BackendNotAvailableError", "BaseBackend", "Capabilities", "CapabilityError", "CollectiveInputError",
    "DLPackCapsule", "DLPackInfo", "Device", "DeviceMismatchError", "DeviceNotFoundError", "InvalidArgumentError",
    "InvalidDeviceError", "InvalidDtypeError", "MultidevError", "StagingPlan", "UnsupportedTensorError",
    "aligned_empty", "canonical_dtype", "check_adapter", "dlpack_info", "host_aligned", "is_complex", "is_floating",
    "is_integer", "numpy_dtype", "parallel_put", "same_device", "staged_upload", "start_to_numpy",
}
#: What 0.3 adds.
ADDED_0_3 = {
    "API_VERSION", "CAPABILITY_PROTOCOLS", "ArrayApiDLPack", "NonBlockingMoves", "SupportsCompile", "SupportsDLPack",
    "SupportsNativeCollectives", "SupportsNonBlocking", "SupportsTraining", "TrainingDefaults", "protocol_methods",
    "SupportsModels", "SupportsDeviceScope", "SupportsDataParallel", "Replica", "Ready",
    "start_move",
    "SupportsMesh", "SupportsSharding", "Mesh", "Layout",  # the device mesh and layouts (issue 34)
    "SupportsShardedTraining",  # training over a mesh, parameters sharded (issue 34)
}


def test_the_exported_names_are_the_documented_api() -> None:
    assert api.API_VERSION == (0, 3)
    assert set(api.__all__) == API_0_2 | ADDED_0_3, (
        f"multidev.adapter.__all__ changed: added {sorted(set(api.__all__) - API_0_2 - ADDED_0_3)}, removed "
        f"{sorted((API_0_2 | ADDED_0_3) - set(api.__all__))}. Update this list deliberately, and deprecate a "
        "removed name for one minor release first (docs/writing-an-adapter.md)")
    for name in api.__all__:
        assert hasattr(api, name), name
    assert len(api.__all__) == len(set(api.__all__))


def test_protocol_same_device_is_deprecated_and_still_works() -> None:
    """An adapter written against 0.1 imports ``multidev.protocol.same_device`` (0.2 removed it)."""
    import multidev.protocol as protocol

    with pytest.warns(DeprecationWarning, match=r"multidev\.protocol\.same_device is deprecated.*multidev\.adapter"):
        fn = protocol.same_device
    cpu0 = md.Device("cpu", 0)
    assert fn("x", "concat", [cpu0, cpu0]) == cpu0
    with pytest.raises(md.DeviceMismatchError, match="cpu:0, cpu:1"):
        fn("x", "concat", [cpu0, md.Device("cpu", 1)])
    with pytest.raises(AttributeError):
        protocol.no_such_name  # noqa: B018


def test_a_0_2_adapter_relying_on_basebackend_defaults_loads_with_a_deprecation_warning() -> None:
    """0.2's BaseBackend gave every adapter export_dlpack/import_dlpack, start_move/start_to_numpy and
    the training defaults; an adapter that relied on them (here: dlpack=True with no export_dlpack of
    its own, and a value_and_grad without the other training methods) gets them filled in at load,
    with one DeprecationWarning saying what to inherit."""
    class Old(NumpyBackend):
        name: ClassVar[str] = "old_0_2"
        export_dlpack = None  # type: ignore[assignment]  # 0.2: BaseBackend's default

        def value_and_grad(self, fn: Any, params: Any, args: tuple) -> tuple[Any, list[Any]]:
            return fn(list(params), *args), [np.zeros_like(p) for p in params]

    old = Old()
    del Old.export_dlpack  # the class relies on the base for it, as a 0.2 adapter did on BaseBackend
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        api.validate_adapter(old, "old_0_2")
    msgs = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert len(msgs) == 1, msgs
    assert "SupportsTraining" in msgs[0] and "multidev.adapter.TrainingDefaults" in msgs[0], msgs[0]
    assert isinstance(old, api.SupportsTraining) and old.sgd_update([np.ones(2)], [np.ones(2)], 0.5)[0][0] == 0.5
    assert old.parameter_like(None, "y") == "y"


def test_a_declared_protocol_left_incomplete_is_refused_at_load() -> None:
    class Half(NumpyBackend, api.TrainingDefaults):
        name: ClassVar[str] = "half_training"

    problems = api.check_adapter(Half())
    assert problems == ["it declares SupportsTraining but leaves value_and_grad() unimplemented"], problems
    md.register_backend("half_training", Half, replace=True)
    with pytest.raises(md.AdapterError, match="declares SupportsTraining but leaves value_and_grad"):
        md.backend("half_training")


def test_a_dlpack_flag_without_its_protocol_is_refused_at_load() -> None:
    class NoDLPack(api.BaseBackend):
        name: ClassVar[str] = "no_dlpack"
        framework: ClassVar[str] = "numpy"

        @property
        def capabilities(self) -> api.Capabilities:
            return api.Capabilities(mutable=True, async_execution=False, pinned_memory=False, dlpack=True,
                                    dtypes=frozenset({"float32"}), native_collectives=frozenset({"allreduce"}))

    problems = api.check_adapter(NoDLPack())
    assert any(p.startswith("capabilities.dlpack is True but it does not implement SupportsDLPack") for p in problems)
    assert any(p.startswith("capabilities.native_collectives is not empty but it does not implement "
                            "SupportsNativeCollectives") for p in problems), problems
    # a declared protocol whose stub is left in place is named too
    class Declared(NumpyBackend):
        name: ClassVar[str] = "declared_dlpack"

    for m in ("export_dlpack", "import_dlpack"):
        setattr(Declared, m, api.SupportsDLPack.__dict__[m])
    assert api.check_adapter(Declared()) == [
        "it declares SupportsDLPack but leaves export_dlpack(), import_dlpack() unimplemented"]


@pytest.mark.slow
def test_the_0_2_template_adapter_loads_with_one_warning_and_passes_the_suite(tmp_path: Path) -> None:
    pytest.importorskip("array_api_strict", reason="the 0.2 template adapts array-api-strict")
    if int(np.__version__.split(".")[0]) < 2:
        pytest.skip("the template needs NumPy 2 (array-api-strict's DLPack there)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(LEGACY), os.environ.get("PYTHONPATH", "")]),
               PYTHONWARNINGS="always::DeprecationWarning")
    probe = subprocess.run([sys.executable, "-c", (
        "import warnings, multidev as md\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    b = md.backend('template_adapter_0_2:TemplateBackend')\n"
        "print([str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)])\n")],
        capture_output=True, text=True, env=env, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    msgs = eval(probe.stdout.strip().splitlines()[-1])  # a printed list of strings
    assert len(msgs) == 1 and "SupportsDLPack" in msgs[0] and "ArrayApiDLPack" in msgs[0], msgs
    out = tmp_path / "m.json"
    scope, least = child_suite()
    r = subprocess.run([sys.executable, "-m", "multidev.cli", "conformance", "--backend",
                        "template_adapter_0_2:TemplateBackend", "--json", str(out), "--", "-q", "-p", "no:warnings",
                        *scope],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    m = json.loads(out.read_text())["matrix"]["template"]
    assert all(f["failed"] == 0 for f in m.values()) and sum(f["passed"] for f in m.values()) > least
