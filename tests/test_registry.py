"""The lazy, thread-safe registry: no framework on import, entry points, run-time registration."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import threading
from typing import Any, ClassVar

import numpy as np
import pytest

import multidev as md
from multidev import registry
from multidev.adapters.numpy import NumpyBackend
from multidev.errors import BackendNotAvailableError, UnsupportedTensorError

FRAMEWORKS = ("torch", "jax", "jaxlib", "tensorflow", "mxnet")


def test_import_multidev_imports_no_framework() -> None:
    code = ("import sys, multidev as md; md.device('cuda:1'); md.Device('cpu', 0);"
            "x = md.ones(3, backend='numpy'); md.to(x, 'cpu:1'); md.synchronize();"
            f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("name,cls", [("numpy", "NumpyBackend"), ("torch", "TorchBackend"), ("jax", "JaxBackend"),
                                      ("tensorflow", "TensorflowBackend"), ("mxnet", "MxnetBackend")])
def test_adapter_module_imports_no_framework(name: str, cls: str) -> None:
    """Loading an adapter's module (what the registry does to read ``framework``) imports nothing heavy."""
    code = (f"import sys, multidev.adapters.{name} as m; b = m.{cls};"
            f"assert b.name == {name!r} and b.framework == {name!r};"
            f"print(sorted(f for f in {FRAMEWORKS!r} if f in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_installed_backends_imports_no_framework() -> None:
    """installed_backends lists each backend whose framework is on the path, by name with its
    framework, importing none of them (the conformance suite's default partners)."""
    code = ("import importlib.util, json, sys; from multidev.registry import installed_backends;"
            "d = installed_backends();"
            f"print(json.dumps([d, sorted(m for m in {FRAMEWORKS!r} if m in sys.modules),"
            " [m for m in ('torch', 'jax', 'tensorflow', 'mxnet') if importlib.util.find_spec(m)]]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    found, imported, on_path = json.loads(out.stdout.strip().splitlines()[-1])
    assert imported == [], imported
    assert found["numpy"] == "numpy"
    for fw in on_path:  # torch, jax, tensorflow, mxnet where installed: listed, not imported
        assert found.get(fw) == fw, (fw, found)
    assert all(fw in on_path or fw in ("numpy", "array_api_strict", "cupy") or fw not in FRAMEWORKS
               for fw in found.values()), found


def test_builtin_adapters_come_from_entry_points() -> None:
    from importlib import metadata

    names = {ep.name for ep in metadata.entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert {"numpy", "torch", "jax", "tensorflow", "mxnet"} <= names
    assert set(registry.registered_backends()) >= names
    assert "numpy" in md.backends()


def test_unknown_backend_message_lists_registered() -> None:
    with pytest.raises(BackendNotAvailableError) as ei:
        md.backend("nope")
    assert "numpy" in str(ei.value) and "entry-point" in str(ei.value)


def test_default_backend_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MULTIDEV_BACKEND", raising=False)
    assert md.get_default_backend() == "numpy"
    monkeypatch.setenv("MULTIDEV_BACKEND", "numpy")
    assert md.get_default_backend() == "numpy"
    with pytest.raises(BackendNotAvailableError):
        md.set_default_backend("no-such")
    md.set_default_backend("numpy")
    try:
        assert md.get_default_backend() == "numpy"
    finally:
        md.set_default_backend(None)


class FakeArray:
    """A third-party 'framework' tensor for registry tests."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data


class FakeBackend(NumpyBackend):
    """A complete adapter (the NumPy reference's methods) that claims FakeArray."""

    name: ClassVar[str] = "fake"
    framework: ClassVar[str] = "tests"  # a module that is surely imported during the tests
    created = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).created += 1

    def tensor_types(self) -> tuple[type, ...]:
        return (FakeArray,)

    def device_of(self, x: Any) -> md.Device:
        return md.Device("cpu", 0)


def test_register_backend_is_lazy_and_found_by_type() -> None:
    FakeBackend.created = 0
    md.register_backend("fake", FakeBackend, replace=True)
    assert FakeBackend.created == 0, "registration must not instantiate"
    assert "fake" in registry.registered_backends()
    sys.modules.setdefault("tests", sys.modules[__name__])
    assert registry.backend_of(FakeArray(np.zeros(1))).name == "fake"
    assert md.device_of(FakeArray(np.zeros(1))) == md.Device("cpu", 0)
    assert FakeBackend.created == 1
    with pytest.raises(md.AdapterError, match="already registered"):
        md.register_backend("fake", FakeBackend)


def test_synchronize_device_waits_on_backends_loaded_after_its_first_call() -> None:
    """synchronize(device) caches its waits per spelling; a backend loaded later joins them, each
    spelling (str, Device) reaches the same waits, and backend= keeps to that backend."""
    calls: list[tuple[str, Any]] = []

    class Waiting(FakeBackend):
        name: ClassVar[str] = "waitfake"

        @property
        def capabilities(self) -> md.Capabilities:
            return dataclasses.replace(super().capabilities, async_execution=True)

        def synchronize(self, device: Any) -> None:
            calls.append((self.name, device))

        def tensor_types(self) -> tuple[type, ...]:
            return (own[self.name],)  # its own class: no shared claim (made once: later searches ask again)

    class Later(Waiting):
        name: ClassVar[str] = "waitfake2"

    own = {n: type(f"{n}Array", (), {}) for n in ("waitfake", "waitfake2")}
    md.register_backend("waitfake", Waiting, replace=True)
    md.register_backend("waitfake2", Later, replace=True)
    try:
        _synchronize_waits_on_later_backends(calls)
    finally:
        registry.unregister_backend("waitfake")
        registry.unregister_backend("waitfake2")


def _synchronize_waits_on_later_backends(calls: list[tuple[str, Any]]) -> None:
    md.backend("waitfake")
    cpu0 = md.Device("cpu", 0)
    for spelling in ("cpu:0", cpu0, "cpu:0"):
        md.synchronize(spelling)
    assert calls.count(("waitfake", cpu0)) == 3 and not [c for c in calls if c[0] == "waitfake2"]
    calls.clear()
    md.backend("waitfake2")  # loaded now: the cached waits of "cpu:0" must include it
    md.synchronize("cpu:0")
    md.synchronize(cpu0)
    assert calls.count(("waitfake2", cpu0)) == 2 and calls.count(("waitfake", cpu0)) == 2, calls
    calls.clear()
    md.synchronize("cpu:0", backend="waitfake2")
    md.synchronize("cpu:0", backend="waitfake2")
    assert calls == [("waitfake2", cpu0)] * 2
    with pytest.raises(md.DeviceNotFoundError):
        md.synchronize("cpu:7", backend="waitfake2")


def test_unknown_tensor_type() -> None:
    with pytest.raises(UnsupportedTensorError, match="FakeUnknown"):
        md.device_of(type("FakeUnknown", (), {})())


def test_concurrent_first_use_creates_one_instance() -> None:
    class Slow(FakeBackend):
        name: ClassVar[str] = "slowfake"
        made: ClassVar[list] = []

        def __init__(self) -> None:
            import time

            time.sleep(0.05)
            super().__init__()
            Slow.made.append(self)

    md.register_backend("slowfake", Slow, replace=True)
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(md.backend("slowfake"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(Slow.made) == 1 and all(g is Slow.made[0] for g in got)


def test_dotted_backend_name() -> None:
    b = registry.get_backend("multidev.adapters.numpy:NumpyBackend")
    assert b.name == "numpy"
    with pytest.raises(BackendNotAvailableError, match="cannot import"):
        registry.get_backend("no_such_module_xyz:Thing")


def test_the_wait_hooks_are_protocol_methods_and_default_to_wait_and_synchronize() -> None:
    """``tensor_wait_fn()`` and ``device_wait_fn(device)`` are declared in the core protocol (no MRO
    inspection): BaseBackend's defaults are the adapter's own ``wait`` and ``synchronize`` bound, so a
    subclass that overrides those is called by ``md.synchronize``; an adapter's own hooks are used as
    they are; the 0.2 spelling (a ``wait_fn`` attribute, deprecated in 0.3) is ignored since 0.4."""
    calls: list[str] = []

    class Waits(FakeBackend):
        name: ClassVar[str] = "waits"

        def wait(self, x: Any) -> None:
            calls.append("wait")

        def synchronize(self, device: Any) -> None:
            calls.append(f"synchronize {device}")

    class Hooked(Waits):
        name: ClassVar[str] = "hooked"

        def tensor_wait_fn(self) -> Any:
            return lambda x: calls.append("hook")

        def device_wait_fn(self, device: Any) -> Any:
            return lambda: calls.append("device hook")

    class Legacy(Waits):
        name: ClassVar[str] = "legacy"

        @property
        def wait_fn(self) -> Any:
            return lambda x: calls.append("legacy hook")

    class SyncOnly(FakeBackend):  # the inherited wait calls synchronize: the hook must too
        name: ClassVar[str] = "synconly"

        def synchronize(self, device: Any) -> None:
            calls.append(f"only synchronize {device}")

    SyncOnly().tensor_wait_fn()(FakeArray(np.zeros(1)))
    assert calls == ["only synchronize cpu:0"], calls
    calls.clear()
    w = Waits()
    w.tensor_wait_fn()(None)
    w.device_wait_fn(md.Device("cpu", 0))()
    assert calls == ["wait", "synchronize cpu:0"]
    calls.clear()
    h = Hooked()
    h.tensor_wait_fn()(None)
    h.device_wait_fn(md.Device("cpu", 0))()
    assert calls == ["hook", "device hook"]
    calls.clear()
    Legacy().tensor_wait_fn()(None)
    assert calls == ["wait"]  # the adapter's own wait: the 0.2 attribute is not consulted
    import multidev.adapter

    assert "device_wait_fn" in multidev.adapter.PROTOCOL_METHODS and "tensor_wait_fn" in multidev.adapter.PROTOCOL_METHODS
    assert not hasattr(registry, "adapter_hook")


def test_synchronize_with_a_bad_backend_argument_gets_a_typed_error() -> None:
    md.synchronize("cpu:0", backend="numpy")  # cached now
    with pytest.raises(md.MultidevError):
        md.synchronize("cpu:0", backend=["numpy"])  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["name", "module:attr"])
def test_a_factory_that_raises_gives_a_typed_adapter_error_with_the_cause(how: str) -> None:
    """``register_backend(name, factory)`` with a factory that raises (ZeroDivisionError): the caller
    gets AdapterError naming the adapter and the exception, the original chained as its cause."""
    def broken() -> Any:
        return 1 / 0

    if how == "name":
        md.register_backend("broken_factory", broken, replace=True)
        spec = "broken_factory"
    else:
        import types
        mod = types.ModuleType("md_broken_factory_mod")
        mod.make = broken  # type: ignore[attr-defined]
        sys.modules["md_broken_factory_mod"] = mod
        spec = "md_broken_factory_mod:make"
    with pytest.raises(md.AdapterError, match="could not be created: its factory raised ZeroDivisionError") as ei:
        md.backend(spec)
    assert isinstance(ei.value.__cause__, ZeroDivisionError)
    with pytest.raises(md.AdapterError):  # the same again: nothing half-registered
        md.backend(spec)


def test_an_adapter_subclass_defined_elsewhere_keeps_its_host_array_class(tmp_path: Any) -> None:
    """Ownership by class, not by module: an adapter whose host arrays are its own ndarray subclass
    (as CuPy's cpu:0 arrays are) keeps them when a subclass of the adapter is defined in another
    module; the NumPy reference, which claims every ndarray, does not take them."""
    import types

    lib = types.ModuleType("md_hostlib")
    exec(textwrap.dedent('''
        import numpy as np
        from multidev.adapters.numpy import NumpyBackend

        class HostArray(np.ndarray):
            """The adapter's own host-array class."""

        class HostBackend(NumpyBackend):
            name = "hostlib"
            def tensor_types(self):
                return (HostArray,)
            def full(self, shape, value, dtype, device):
                return super().full(shape, value, dtype, device).view(np.ndarray).view(HostArray)
    '''), lib.__dict__)
    sys.modules["md_hostlib"] = lib
    user = types.ModuleType("md_hostlib_user")
    exec("from md_hostlib import HostBackend\nclass MyHost(HostBackend):\n    name = 'myhost'\n", user.__dict__)
    sys.modules["md_hostlib_user"] = user
    md.backend("numpy")
    md.register_backend("myhost", user.MyHost, replace=True)
    try:
        b = md.backend("myhost")
        x = b.full((2,), 1.0, "float32", md.Device("cpu", 0))
        assert type(x).__name__ == "HostArray"
        assert md.backend_of(x) is b, f"{md.backend_of(x).name} took the adapter's own host array"
        assert md.backend_of(np.ones(2)).name == "numpy"  # plain arrays stay NumPy's
    finally:
        registry.unregister_backend("myhost")


def test_a_family_member_can_be_wrapped_under_its_family_name() -> None:
    """``register_backend("array_api:LIB", Subclass)`` replaces that member (a subclass of the
    generic array-API adapter, a mutated copy in a catalogue); names with ':' that are no member of
    a registered family are still refused."""
    pytest.importorskip("array_api_strict")
    member = type(md.backend("array_api:array_api_strict"))

    class Wrapped(member):  # type: ignore[misc, valid-type]
        pass

    md.register_backend("array_api:array_api_strict", Wrapped, replace=True)
    try:
        b = md.backend("array_api:array_api_strict")
        assert type(b) is Wrapped and b.name == "array_api:array_api_strict"
        import array_api_strict as xp

        assert md.backend_of(xp.ones(2)) is b
    finally:
        md.register_backend("array_api:array_api_strict", member, replace=True)
    for bad in ("nofamily:x", "array_api:", "array_api:a:b"):
        with pytest.raises(md.AdapterError, match="FAMILY:ARG"):
            md.register_backend(bad, member)


def test_a_class_no_adapter_owns_is_remembered_until_an_adapter_claims_it() -> None:
    """backend_of remembers a class nobody owns (structures are walked per call), and forgets it when
    an adapter is registered or loaded that may claim it: the new adapter then owns its tensors."""
    class Orphan:
        pass

    x = Orphan()
    for _ in range(2):
        with pytest.raises(md.UnsupportedTensorError, match="Orphan"):
            md.backend_of(x)

    class Adopter(FakeBackend):
        name: ClassVar[str] = "adopter"

        def tensor_types(self) -> tuple[type, ...]:
            return (Orphan,)

    md.register_backend("adopter", Adopter, replace=True)
    try:
        md.backend("adopter")
        assert md.backend_of(x).name == "adopter"
    finally:
        registry.unregister_backend("adopter")
    with pytest.raises(md.UnsupportedTensorError, match="Orphan"):
        md.backend_of(x)


def test_a_refused_adapter_is_not_made_again_on_every_search() -> None:
    """An adapter refused at load (validate_adapter's AdapterError) is refused again from the record,
    not made anew: backend_of's search of the adapters asks it on every miss, and a new instance each
    time cost an adapter's construction per call and left its cycles for the garbage collector (a
    relayout of a sharded tensor made one per call once a test had registered a broken adapter).
    Registering the name again gives the new factory its chance."""
    from multidev import adapter as api

    made = []

    class Broken(NumpyBackend):
        name: ClassVar[str] = "refused_once"
        training = api.concern(api.TrainingDefaults)  # declares SupportsTraining, leaves value_and_grad

        def __init__(self) -> None:
            made.append(1)
            super().__init__()

    md.register_backend("refused_once", Broken, replace=True)
    try:
        for _ in range(2):
            with pytest.raises(md.AdapterError, match="value_and_grad"):
                md.backend("refused_once")

        class Nobody:
            pass

        for _ in range(3):
            with pytest.raises(md.UnsupportedTensorError, match="refused_once"):
                md.backend_of(Nobody())
        assert len(made) == 1, f"the refused adapter was made {len(made)} times"

        class Fixed(Broken):
            training = None

        md.register_backend("refused_once", Fixed, replace=True)
        assert md.backend("refused_once").name == "refused_once" and len(made) == 2
    finally:
        registry.unregister_backend("refused_once")
