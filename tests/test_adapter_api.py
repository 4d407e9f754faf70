"""The adapter API's stability promise (docs/writing-an-adapter.md, "Stability: the adapter API"):
``multidev.adapter`` exports exactly the list below for API 0.4; nothing 0.2 or 0.3 exported is gone;
the 0.3 template adapter (capability methods on the adapter class), unchanged, loads with one
DeprecationWarning and passes the conformance suite; what 0.3 deprecated (0.2's undeclared
capabilities and BaseBackend defaults, ``wait_fn``, ``multidev.protocol.same_device``) is gone."""
from __future__ import annotations

import dataclasses
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
#: What 0.4 adds: capabilities as concern objects (issue 31).
ADDED_0_4 = {"CONCERNS", "Concern", "concern",
             "ProcessMesh",  # layouts across processes: the process-sharding hooks of a mesh concern (issue 34)
             "param_spec",  # the core's parameter layout rule, for sharding over processes (issue 34)
             "run_parts", "host_threads",  # host loops over the one thread pool (issue 36)
             "split_pieces"}  # a large upload's pieces, as one list put takes them (issue 36, round 27)


def test_the_exported_names_are_the_documented_api() -> None:
    assert api.API_VERSION == (0, 4)
    every = API_0_2 | ADDED_0_3 | ADDED_0_4
    assert set(api.__all__) == every, (
        f"multidev.adapter.__all__ changed: added {sorted(set(api.__all__) - every)}, removed "
        f"{sorted(every - set(api.__all__))}. Update this list deliberately, and deprecate a "
        "removed name for one minor release first (docs/writing-an-adapter.md)")
    for name in api.__all__:
        assert hasattr(api, name), name
    assert len(api.__all__) == len(set(api.__all__))


def test_what_0_3_deprecated_is_gone_in_0_4() -> None:
    """0.2's spellings were deprecated in 0.3 "and ignored in 0.4": ``multidev.protocol.same_device``
    (use ``multidev.adapter.same_device``), the ``wait_fn`` attribute (``tensor_wait_fn()``), and
    capability methods an adapter neither declared nor had whole (BaseBackend's 0.2 defaults)."""
    import multidev.protocol as protocol

    with pytest.raises(AttributeError):
        protocol.same_device  # noqa: B018

    class Old(NumpyBackend):
        name: ClassVar[str] = "old_wait_fn"
        wait_fn = staticmethod(print)

    assert Old().tensor_wait_fn() is not print  # the 0.2 attribute is not consulted

    class Undeclared(NumpyBackend):  # 0.2: value_and_grad alone, relying on BaseBackend's other two
        name: ClassVar[str] = "old_0_2"

        def value_and_grad(self, fn: Any, params: Any, args: tuple) -> tuple[Any, list[Any]]:
            return fn(list(params), *args), [np.zeros_like(p) for p in params]

    old = Undeclared()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        api.validate_adapter(old, "old_0_2")  # loads without a warning: nothing is filled in
    assert old.training is None


def test_a_0_3_adapter_with_capability_methods_on_its_class_loads_with_one_warning() -> None:
    """An adapter written against 0.3 declares a capability by inheriting its protocol and has its
    methods on the adapter class: at load each becomes a concern object calling them, with one
    DeprecationWarning naming the adapter and what to write instead."""
    class Old(NumpyBackend, api.TrainingDefaults):
        name: ClassVar[str] = "old_0_3"

        def value_and_grad(self, fn: Any, params: Any, args: tuple) -> tuple[Any, list[Any]]:
            return fn(list(params), *args), [np.zeros_like(p) for p in params]

    old = Old()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        api.validate_adapter(old, "old_0_3")
    msgs = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert len(msgs) == 1, msgs
    assert "'old_0_3'" in msgs[0] and "SupportsTraining" in msgs[0] and "training = concern(" in msgs[0], msgs[0]
    assert old.training is not None and old.collectives is None
    assert old.training.sgd_update([np.ones(2)], [np.ones(2)], 0.5)[0][0] == 0.5
    assert old.training.parameter_like(None, "y") == "y"
    loss, grads = old.training.value_and_grad(lambda ps, k: ps[0].sum() * k, [np.ones(3)], (2,))
    assert loss == 6 and grads[0].shape == (3,)


def test_a_declared_protocol_left_incomplete_is_refused_at_load() -> None:
    class Half(NumpyBackend):
        name: ClassVar[str] = "half_training"
        training = api.concern(api.TrainingDefaults)

    problems = api.check_adapter(Half())
    assert problems == ["its training concern (TrainingDefaults) declares SupportsTraining but leaves "
                        "value_and_grad() unimplemented"], problems
    md.register_backend("half_training", Half, replace=True)
    try:
        with pytest.raises(md.AdapterError, match="declares SupportsTraining but leaves value_and_grad"):
            md.backend("half_training")
    finally:  # (a refused adapter left registered is asked again by every later search of the adapters)
        from multidev.registry import unregister_backend

        unregister_backend("half_training")

    class Flat(NumpyBackend, api.TrainingDefaults):  # the 0.3 way, incomplete
        name: ClassVar[str] = "half_training_0_3"

    assert api.check_adapter(Flat()) == ["it declares SupportsTraining but leaves value_and_grad() unimplemented"]

    class Undeclared(NumpyBackend):
        name: ClassVar[str] = "undeclared_concern"
        dlpack = api.concern(api.Concern)

    assert api.check_adapter(Undeclared()) == [
        "its dlpack concern (Concern) does not declare SupportsDLPack: inherit it (or a shared implementation of it)",
        "its dlpack concern (Concern) declares SupportsDLPack but leaves export_dlpack(), import_dlpack() "
        "unimplemented"]


def test_a_dlpack_flag_without_its_protocol_is_refused_at_load() -> None:
    class NoDLPack(api.BaseBackend):
        name: ClassVar[str] = "no_dlpack"
        framework: ClassVar[str] = "numpy"

        @property
        def capabilities(self) -> api.Capabilities:
            return api.Capabilities(mutable=True, async_execution=False, pinned_memory=False, dlpack=True,
                                    dtypes=frozenset({"float32"}), native_collectives=frozenset({"allreduce"}))

    problems = api.check_adapter(NoDLPack())
    assert any(p.startswith("capabilities.dlpack is True but it has no dlpack concern") for p in problems)
    assert any(p.startswith("capabilities.native_collectives is not empty but it has no collectives concern")
               for p in problems), problems
    # a concern whose stubs are left in place is named too
    class Stubbed(api.Concern, api.SupportsDLPack):
        pass

    class Declared(NumpyBackend):
        name: ClassVar[str] = "declared_dlpack"
        dlpack = api.concern(Stubbed)

    assert api.check_adapter(Declared()) == [
        "its dlpack concern (Stubbed) declares SupportsDLPack but leaves export_dlpack(), import_dlpack() "
        "unimplemented"]


def test_the_0_2_template_adapter_is_refused_saying_what_to_write() -> None:
    """0.2's template relied on BaseBackend's DLPack (dlpack=True, no export_dlpack): deprecated in 0.3,
    ignored in 0.4, so it no longer loads, and the error says what to write."""
    pytest.importorskip("array_api_strict", reason="the 0.2 template adapts array-api-strict")
    import importlib.util

    spec = importlib.util.spec_from_file_location("template_adapter_0_2", LEGACY / "template_adapter_0_2.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(md.AdapterError, match=r"capabilities\.dlpack is True but it has no dlpack concern"):
        api.validate_adapter(mod.TemplateBackend(), "template_adapter_0_2")


@pytest.mark.slow
def test_the_0_3_template_adapter_loads_with_one_warning_and_passes_the_suite(tmp_path: Path) -> None:
    pytest.importorskip("array_api_strict", reason="the 0.3 template adapts array-api-strict")
    if int(np.__version__.split(".")[0]) < 2:
        pytest.skip("the template needs NumPy 2 (array-api-strict's DLPack there)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(LEGACY), os.environ.get("PYTHONPATH", "")]),
               PYTHONWARNINGS="always::DeprecationWarning")
    probe = subprocess.run([sys.executable, "-c", (
        "import warnings, multidev as md\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    b = md.backend('template_adapter_0_3:TemplateBackend')\n"
        "print([str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)])\n")],
        capture_output=True, text=True, env=env, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    msgs = eval(probe.stdout.strip().splitlines()[-1])  # a printed list of strings
    assert len(msgs) == 1 and "SupportsDLPack" in msgs[0] and "dlpack = concern(" in msgs[0], msgs
    out = tmp_path / "m.json"
    scope, least = child_suite()
    r = subprocess.run([sys.executable, "-m", "multidev.cli", "conformance", "--backend",
                        "template_adapter_0_3:TemplateBackend", "--json", str(out), "--", "-q", "-p", "no:warnings",
                        *scope],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    m = json.loads(out.read_text())["matrix"]["template"]
    assert all(f["failed"] == 0 for f in m.values()) and sum(f["passed"] for f in m.values()) > least


def test_a_capability_method_overridden_on_a_04_adapters_subclass_is_honoured_with_a_warning() -> None:
    """The 0.3 way of changing one capability method: subclass an adapter and override the method on
    the class. Under 0.4 the core calls the concern object, so the override would be silently lost;
    it is honoured (the concern forwards that method to the adapter) with one DeprecationWarning."""
    from multidev.examples.template_adapter import TemplateBackend
    from multidev.protocol import SupportsDLPack
    from multidev.registry import unregister_backend

    calls: list[int] = []

    class Spy(TemplateBackend):
        name = "spy_override"

        def import_dlpack(self, obj: Any, device: Any) -> Any:
            calls.append(1)
            return self.dlpack._inner.import_dlpack(obj, device)

    md.register_backend(Spy.name, Spy, replace=True)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            b = md.backend(Spy.name)
        msgs = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
        assert len(msgs) == 1 and "import_dlpack" in msgs[0] and "0.3" in msgs[0], msgs
        assert isinstance(b.dlpack, SupportsDLPack)
        y = md.convert(np.arange(4, dtype=np.float32), Spy.name)
        assert calls == [1] and np.array_equal(md.to_numpy(y), np.arange(4, dtype=np.float32))
        assert callable(b.dlpack.export_dlpack)  # the methods not overridden are the concern's
    finally:
        unregister_backend(Spy.name)


def test_0_3_ways_that_reach_through_the_adapter_class_keep_working() -> None:
    """Review findings on the 0.4 composition, each a 0.3 habit: an override that calls ``super()``,
    a concern's method called on the adapter, ``isinstance(b, SupportsDLPack)``, a 0.3 adapter that
    inherits a shared concern before BaseBackend and calls ``super().__init__()``, and an adapter
    validated twice (wrapped once)."""
    from multidev.adapter import ArrayApiDLPack, BaseBackend, validate_adapter
    from multidev.protocol import SupportsDLPack
    from multidev.registry import unregister_backend

    calls: list[int] = []

    class Sub(NumpyBackend):
        name = "numpy_super_override"

        def export_dlpack(self, x: Any) -> Any:
            calls.append(1)
            return super().export_dlpack(x)  # the 0.4 NumpyBackend forwards it to its concern

    md.register_backend(Sub.name, Sub, replace=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            b = md.backend(Sub.name)
        x = np.arange(3.0)
        assert np.shares_memory(np.from_dlpack(b.dlpack.export_dlpack(x)), x) and calls == [1]
        wrapped = type(b.dlpack)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            validate_adapter(b, "again")
        assert type(b.dlpack) is wrapped and not seen, "a second validation wraps again or warns again"
    finally:
        unregister_backend(Sub.name)
    n = md.backend("numpy")
    assert isinstance(n, SupportsDLPack) and n.export_dlpack(x) is not None

    class Flat(ArrayApiDLPack, BaseBackend):  # the 0.3 way, the shared class first
        def __init__(self) -> None:
            super().__init__()

    f = Flat()
    assert f.core is f


def test_a_04_adapter_giving_the_deprecated_flags_warns_once_and_keeps_their_meaning() -> None:
    """``Capabilities.dlpack`` and ``native_collectives`` restate the concern attributes: deprecated
    in 0.4 (None, "not given", by default). An adapter still giving them loads with one
    DeprecationWarning (not again for its class), a flag saying no hides that concern on the
    instance, as it meant; a 0.4 adapter's own record gives neither."""
    from multidev.registry import unregister_backend

    assert api.Capabilities(mutable=True, async_execution=False, pinned_memory=False).dlpack is None
    assert api.Capabilities(mutable=True, async_execution=False, pinned_memory=False).native_collectives is None
    caps = md.backend("numpy").capabilities
    assert caps.dlpack is None and caps.native_collectives is None

    class Flagged(NumpyBackend):
        name: ClassVar[str] = "flagged_0_4"

        @property
        def capabilities(self) -> api.Capabilities:
            return dataclasses.replace(super().capabilities, dlpack=False, native_collectives=frozenset())

    md.register_backend(Flagged.name, Flagged, replace=True)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            b = md.backend(Flagged.name)
            api.validate_adapter(Flagged(), "again")  # the same class: not again
        msgs = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
        assert len(msgs) == 1, msgs
        assert "'flagged_0_4'" in msgs[0] and "capabilities.dlpack and capabilities.native_collectives" in msgs[0]
        assert b.dlpack is None and b.collectives is None  # dlpack=False hides NumpyDLPack here
        with pytest.raises(AttributeError, match="no dlpack concern"):
            b.export_dlpack(np.ones(2))  # the deprecated forwarder says why
        y = md.convert(np.arange(3.0), Flagged.name)  # through the host, as without DLPack
        assert np.array_equal(md.to_numpy(y), np.arange(3.0))
    finally:
        unregister_backend(Flagged.name)

    class Agrees(NumpyBackend):  # a flag that agrees with the concern: warned about, nothing hidden
        name: ClassVar[str] = "agrees_0_4"

        @property
        def capabilities(self) -> api.Capabilities:
            return dataclasses.replace(super().capabilities, dlpack=True)

    a = Agrees()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        api.validate_adapter(a, "agrees_0_4")
    assert [w.category for w in seen] == [DeprecationWarning] and a.dlpack is not None


def test_a_flag_contradicting_the_instances_concern_is_refused_at_load() -> None:
    """A flag saying yes where the instance has no concern is a problem, also where the class has
    one that ``available_on`` hides on this instance."""
    class NoNative(api.Concern, api.SupportsNativeCollectives):
        @classmethod
        def available_on(cls, core: Any) -> bool:
            return False

        def native_allreduce(self, xs: Any, op: str) -> list[Any]:
            raise AssertionError("never made")

    class Claims(NumpyBackend):
        name: ClassVar[str] = "claims_native"
        collectives = api.concern(NoNative)

        @property
        def capabilities(self) -> api.Capabilities:
            return dataclasses.replace(super().capabilities, native_collectives=frozenset({"allreduce"}))

    problems = api.check_adapter(Claims())
    assert [p for p in problems if "native_collectives" in p] == [
        "capabilities.native_collectives is not empty but it has no collectives concern (a "
        "SupportsNativeCollectives: native_allreduce; the flag is deprecated since 0.4: leave it out)"], problems
    with pytest.raises(md.AdapterError, match="no collectives concern"):
        api.validate_adapter(Claims(), "claims_native")

    class Unknown(NumpyBackend):
        name: ClassVar[str] = "unknown_native"

        @property
        def capabilities(self) -> api.Capabilities:
            return dataclasses.replace(super().capabilities, native_collectives=frozenset({"allgather"}))

    assert "capabilities.native_collectives names unknown collectives ['allgather']" in api.check_adapter(Unknown())


def test_available_on_makes_a_concern_none_per_instance_asked_once() -> None:
    """``Concern.available_on(core)`` decides, on the attribute's first read, whether this instance
    has the concern: None where it says no. Asked once, whichever thread reads first; every thread
    gets the same answer (one concern object, or None)."""
    import threading

    asked: list[int] = []

    class PerInstance(api.Concern, api.SupportsNativeCollectives):
        @classmethod
        def available_on(cls, core: Any) -> bool:
            asked.append(1)
            return bool(core.wants)

        def native_allreduce(self, xs: Any, op: str) -> list[Any]:
            return list(xs)

    class Some(NumpyBackend):
        name: ClassVar[str] = "some_native"
        collectives = api.concern(PerInstance)

        def __init__(self, wants: bool) -> None:
            super().__init__()
            self.wants = wants

    no, yes = Some(False), Some(True)
    assert no.collectives is None and no.collectives is None and len(asked) == 1
    assert isinstance(yes.collectives, PerInstance) and yes.collectives.core is yes
    assert api.check_adapter(no) == [] and api.check_adapter(yes) == []
    with pytest.raises(AttributeError, match="Some has no collectives concern, so no native_allreduce"):
        no.native_allreduce([], "sum")
    assert yes.native_allreduce([1], "sum") == [1]  # the forwarder where it exists
    assert api.Concern.available_on(no) is True  # the default
    for wants in (False, True):
        b = Some(wants)
        got: list[Any] = []
        start = threading.Barrier(8)

        def read(b: Any = b, start: Any = start, got: list[Any] = got) -> None:
            start.wait()
            got.append(b.collectives)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(c) for c in got}) == 1 and (got[0] is None) == (not wants)


def test_a_0_3_adapters_flags_still_decide_what_is_wrapped() -> None:
    """The 0.3 template (capability methods on its class, ArrayApiDLPack inherited) saying
    ``dlpack=False`` gets no dlpack concern, and its own ``export_dlpack`` refuses, as in 0.3; a
    native allreduce on its class is wrapped only where ``native_collectives`` names it. One
    DeprecationWarning each: the 0.3 one (naming the flags too) where something is wrapped, else
    the flags' own."""
    pytest.importorskip("array_api_strict", reason="the 0.3 template adapts array-api-strict")
    import importlib.util

    spec = importlib.util.spec_from_file_location("template_adapter_0_3", LEGACY / "template_adapter_0_3.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    class NoDLPack(mod.TemplateBackend):  # type: ignore[misc,name-defined]
        name: ClassVar[str] = "template_no_dlpack_0_3"

        @property
        def capabilities(self) -> api.Capabilities:
            return dataclasses.replace(self._caps, dlpack=False)

    old = NoDLPack()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        api.validate_adapter(old, NoDLPack.name)
    msgs = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert len(msgs) == 1 and "capabilities.dlpack and capabilities.native_collectives" in msgs[0], msgs
    assert old.dlpack is None and old.collectives is None
    x = old.asarray(np.ones(2), "float64", md.Device("cpu", 0))
    with pytest.raises(md.CapabilityError, match="capabilities.dlpack"):
        old.export_dlpack(x)  # called on the adapter: refused, as in 0.3

    class Native(mod.TemplateBackend, api.SupportsNativeCollectives):  # type: ignore[misc,name-defined]
        name: ClassVar[str] = "template_native_0_3"
        native: frozenset[str] = frozenset()

        @property
        def capabilities(self) -> api.Capabilities:
            return dataclasses.replace(self._caps, native_collectives=self.native)

        def native_allreduce(self, xs: Any, op: str) -> list[Any]:
            return [sum(xs)] * len(xs)

    class Named(Native):
        name: ClassVar[str] = "template_named_0_3"
        native = frozenset({"allreduce"})

    for cls, wrapped in ((Native, False), (Named, True)):
        b = cls()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            api.validate_adapter(b, cls.name)
        msgs = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
        assert len(msgs) == 1 and "adapter API 0.3" in msgs[0] and "native_collectives" in msgs[0], msgs
        assert ("SupportsNativeCollectives" in msgs[0]) == wrapped and b.dlpack is not None
        assert (b.collectives is not None) == wrapped
        if wrapped:
            assert b.collectives.native_allreduce([1, 2], "sum") == [3, 3]
