"""The catalogue's shared pieces: the entry record, the decorator that files a mutant, the helpers
mutants of the NumPy adapter share, and the controls (renamed, unmutated copies of each base)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multidev.adapter import (
    ArrayApiDLPack,
    BaseBackend,
    Device,
    concern,
)
from multidev.adapters.cupy import CupyBackend
from multidev.adapters.jax import JaxBackend
from multidev.adapters.numpy import NumpyBackend, VirtualDeviceArray
from multidev.adapters.torch import TorchBackend

_HOST = Device("cpu", 0)


@dataclass(frozen=True)
class Mutant:
    cls: type
    base: str
    """``numpy``, ``torch``, ``jax``, ``cupy`` or ``generic`` (a BaseBackend default or a shared
    implementation, on the adapter named in the class's base)."""
    defect: str
    select: tuple[str, ...]
    """Substrings of the suite's test ids that must catch it (the run is limited to them)."""
    gpus: int = 0
    """GPUs needed for the defect to show (0: it fails on any machine)."""
    why_gpu: str = ""
    """For ``gpus`` > 0: why a CPU-only machine cannot show it, and which check catches it there."""
    replica: type | None = None
    """For a mutant of the data-parallel replica (the adapter's ``data_parallel_replica`` hands one
    back): the :class:`~multidev.adapter.Replica` subclass that breaks exactly one of its methods."""
    multiprocess: bool = False
    """Its checks launch processes (``@pytest.mark.multiprocess``): the catalogue run of its
    framework passes ``--multiprocess``."""
    known: str = ""
    """Non-empty for a known survivor: why no check of the suite can catch it yet. The catalogue run
    fails on a survivor not marked so, and on a marked one that is caught (the mark must go)."""

    @property
    def name(self) -> str:
        return str(self.cls.name)

    @property
    def method(self) -> str:
        """The one method (or property) this mutant breaks: the one its class defines itself."""
        return broken_method(self.cls)

    @property
    def spec(self) -> str:
        return f"mutants:{self.cls.__name__}"


CATALOGUE: list[Mutant] = []


def mutant(base: str, defect: str, select: Sequence[str], gpus: int = 0,
           why_gpu: str = "", known: str = "", replica: type | None = None,
           multiprocess: bool = False) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        CATALOGUE.append(Mutant(cls, base, defect, tuple(select), gpus, why_gpu, replica, multiprocess, known))
        return cls
    return deco


def swap_replica(rep: Any, broken: type) -> Any:
    """``rep`` (a replica of the adapter's, or None) as an instance of its one-method broken
    subclass ``broken``, where ``rep`` is of ``broken``'s base class exactly."""
    if rep is not None and type(rep) is broken.__mro__[1]:
        rep.__class__ = broken
    return rep


def broken_class(cls: type) -> type:
    """The class holding the one method mutant ``cls`` breaks: ``cls`` itself (a core method), or the
    concern class it installs (``dlpack = concern(BrokenDLPack)``: a capability's method)."""
    installed = [v.cls for v in vars(cls).values() if isinstance(v, concern)]
    if installed:
        if len(installed) != 1:
            raise ValueError(f"{cls.__name__} installs {len(installed)} concerns: a mutant changes exactly one method")
        return installed[0]
    return cls


def broken_method(cls: type) -> str:
    """The name of the one method (or property) ``cls`` defines itself (not ``name``, not dunders), or
    for a mutant that installs a concern the one method of that concern class (the adapter API's forwarders of
    a concern's methods, added to a class that sets one, are not its own); ValueError unless there
    is exactly one."""
    holder = broken_class(cls)
    if holder is not cls and [k for k, v in vars(cls).items() if callable(v) and not k.startswith("__")
                              and not isinstance(v, concern) and not getattr(v, "_md_forwarder", False)]:
        raise ValueError(f"{cls.__name__} installs a concern and defines a method: a mutant changes exactly one")
    own = sorted(k for k, v in vars(holder).items()
                 if (callable(v) or isinstance(v, (property, classmethod, staticmethod))) and not k.startswith("__")
                 and k != "name" and not isinstance(v, concern) and not getattr(v, "_md_forwarder", False))
    if len(own) != 1:
        raise ValueError(f"{holder.__name__} defines {own}: a mutant changes exactly one method")
    return own[0]


def _plain(x: Any) -> Any:
    return x.view(np.ndarray) if isinstance(x, VirtualDeviceArray) else x


def _tag(a: Any, device: Device) -> Any:
    v = np.asarray(a).view(VirtualDeviceArray)
    v._md_device = device
    return v


# == controls: renamed, unmutated copies of each base ==============================================
class NumpyControl(NumpyBackend):
    name = "numpy_control"


class GenericControl(NumpyBackend):
    """The NumPy adapter on the shared defaults (BaseBackend's wait and shape_of, ArrayApiDLPack's
    export/import through ``numpy.from_dlpack``, the core's start_move, no native allreduce): the
    base of the generic mutants."""

    name = "generic_control"
    wait = BaseBackend.wait
    shape_of = BaseBackend.shape_of
    dlpack = concern(ArrayApiDLPack)


class TorchControl(TorchBackend):
    name = "torch_control"


class JaxControl(JaxBackend):
    name = "jax_control"


class CupyControl(CupyBackend):
    """The CuPy adapter, renamed: on a machine without a GPU it runs on ``tests/fake_cupy.py``."""

    name = "cupy_control"


def control_of(cls: type) -> type:
    """The control a mutant class is compared with (the unmutated copy of its base)."""
    for base, control in ((GenericControl, GenericControl), (NumpyBackend, NumpyControl),
                          (TorchBackend, TorchControl), (JaxBackend, JaxControl), (CupyBackend, CupyControl)):
        if issubclass(cls, base):
            return control
    raise TypeError(f"{cls.__name__} has no control")


CONTROLS = (NumpyControl, GenericControl, TorchControl, JaxControl, CupyControl)


