"""The generic array-API adapter: ``array_api:LIB`` through the registry, the CLI and by tensor type;
array-api-strict's five devices with their per-device dtype sets; the suite on it and on NumPy's
own namespace (any array-API library, not one)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import multidev as md
from multidev.adapter import HOST_ALIGNMENT, dlpack_info
from multidev.errors import BackendNotAvailableError, CapabilityError, DeviceMismatchError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _workers import child_suite

xp = pytest.importorskip("array_api_strict", reason="the array-API tests need array-api-strict "
                         "(pip install 'multidev[test]')")
NAME = "array_api:array_api_strict"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_names_select_the_library() -> None:
    b = md.backend(NAME)
    assert b.name == NAME and md.backend("array_api") is b, "plain array_api is array-api-strict"
    assert md.backends().count(NAME) == 1 and "array_api" not in md.backends()
    with pytest.raises(BackendNotAvailableError, match="not installed"):
        md.backend("array_api:no_such_library_xyz")
    with pytest.raises(BackendNotAvailableError, match="not an array-API namespace"):
        md.backend("array_api:json")


def test_found_by_tensor_type_without_naming_a_backend() -> None:
    r = _run("import multidev as md, array_api_strict as xp\n"
             "x = xp.asarray([1.0, 2.0], device=xp.Device('device2'))\n"
             "print(md.device_of(x), md.backend_of(x).name, md.device(xp.Device('no_x64')))\n"
             "print(md.to_numpy(md.to(x, 'cpu:0')).tolist())")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cpu:2", NAME, "cpu:4", "[1.0,", "2.0]"]


def test_devices_and_per_device_dtypes() -> None:
    b = md.backend(NAME)
    assert b.devices() == [md.cpu(i) for i in range(5)]
    assert b.to_native_device(md.cpu(0)) == xp.Device("CPU_DEVICE")
    assert b.to_native_device(md.cpu(3)) == xp.Device("no_float64")
    caps = b.capabilities
    assert {"float64", "complex128", "int64"} <= caps.dtypes
    assert "float64" not in caps.dtypes_on(md.cpu(3)) and "complex128" not in caps.dtypes_on(md.cpu(3))
    assert "int64" in caps.dtypes_on(md.cpu(3)) and "int64" not in caps.dtypes_on(md.cpu(4))
    assert set(caps.device_dtypes) == {md.cpu(3), md.cpu(4)}
    with pytest.raises(CapabilityError, match="cpu:3"):
        md.zeros(3, dtype="float64", device="cpu:3", backend=NAME)
    assert md.dtype_of(md.arange(3, device="cpu:4", backend=NAME)) == "int32", "int64 is missing there"
    assert md.dtype_of(md.arange(3, device="cpu:3", backend=NAME)) == "int64"
    x = md.ones(2, dtype="float64", device="cpu:1", backend=NAME)
    with pytest.raises(CapabilityError):
        md.to(x, "cpu:3")  # float64 cannot move to a device without it


def test_moves_copies_and_mixed_devices() -> None:
    b = md.backend(NAME)
    x = md.asarray(np.arange(6, dtype=np.float32).reshape(2, 3), device="cpu:1", backend=NAME)
    assert isinstance(x, xp._array_object.Array) and x.device == xp.Device("device1")
    assert md.to(x, "cpu:1") is x
    y = md.to(x, "cpu:2")
    assert y.device == xp.Device("device2") and md.to_numpy(y).tolist() == [[0, 1, 2], [3, 4, 5]]
    c = md.copy(y)
    b.assign(c, md.zeros((2, 3), device="cpu:2", backend=NAME))
    assert md.to_numpy(y).sum() == 15, "copy is independent"
    with pytest.raises(DeviceMismatchError, match="cpu:1.*cpu:2"):
        b.combine("sum", x, y)
    assert b.capabilities.raises_on_mixed_devices and b.capabilities.mutable
    parts = b.split(md.asarray(np.arange(12).reshape(3, 4), device="cpu:0", backend=NAME), [1, 3], 1)
    assert [md.to_numpy(p).shape for p in parts] == [(3, 1), (3, 3)]


def test_host_buffers_are_aligned_for_xla_partners() -> None:
    for dev in ("cpu:0", "cpu:3"):
        for make in (lambda d: md.ones((3, 5), device=d, backend=NAME),
                     lambda d: md.asarray(np.arange(7, dtype=np.int32), device=d, backend=NAME),
                     lambda d: md.arange(0.0, 1.0, 0.1, device=d, backend=NAME)):
            x = make(dev)
            assert dlpack_info(x.__dlpack__()).aligned(HOST_ALIGNMENT), dev
    if "jax" in md.backends():
        x = md.ones(9, device="cpu:0", backend=NAME)
        j = md.convert(x, "jax", copy=False)
        assert j.unsafe_buffer_pointer() == dlpack_info(x.__dlpack__()).address


def test_cli_devices_lists_the_member() -> None:
    r = subprocess.run([sys.executable, "-m", "multidev.cli", "devices", "--backend", NAME],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="200"))
    assert r.returncode == 0, r.stderr
    assert "cpu:0 cpu:1 cpu:2 cpu:3 cpu:4" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("lib", ["array_api_strict", "numpy"])
def test_suite_passes(tmp_path: Path, lib: str) -> None:
    """The whole suite with every installed partner: array-api-strict on its five devices (three
    with every dtype), and NumPy's own namespace through the same adapter (NumPy 2; NumPy 1.26 has
    none, and the CLI refuses it in one line)."""
    out = tmp_path / "m.json"
    scope, least = child_suite()
    r = subprocess.run([sys.executable, "-m", "multidev.cli", "conformance", "--backend", f"array_api:{lib}",
                        "--json", str(out), "--", "-q", "-p", "no:warnings", *scope],
                       capture_output=True, text=True, timeout=900)
    if lib == "numpy" and not hasattr(np, "__array_namespace_info__"):
        # NumPy < 2 is no array-API namespace: the CLI refuses it in one line, before any check runs.
        assert r.returncode == 2 and not out.exists(), r.stdout[-2000:] + r.stderr[-2000:]
        assert "numpy is not an array-API namespace" in r.stdout + r.stderr
        assert "Traceback" not in r.stdout + r.stderr
        return
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
    doc = json.loads(out.read_text())
    m = doc["matrix"][f"array_api:{lib}"]
    assert all(f["failed"] == 0 for f in m.values()) and sum(f["passed"] for f in m.values()) > least
    if lib == "array_api_strict":
        assert len(doc["backends"][NAME]["devices"]) == 5
