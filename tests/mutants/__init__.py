"""The mutation catalogue (a package, one module per adapter: ``of_numpy``, ``of_torch``, ``of_jax``,
``of_cupy``, ``generic``, ``engines``, and ``of_mesh`` for JAX's mesh and sharded arrays; every
class re-exported here, so ``mutants:ClassName`` names any of them): one-method defects of the NumPy, torch and JAX adapters and of the
generic pieces every adapter relies on (BaseBackend's defaults), each the kind of bug an adapter
author writes. ``tests/test_mutation_catalogue.py`` runs the conformance suite against each one
(``multidev conformance --backend mutants:ClassName``) and requires it to fail.

Every mutant is a subclass that overrides exactly one method (or the ``capabilities`` property) of
its base and has its own registry ``name``, so several are tested in one pytest session. Each entry
says what the defect is and which checks are run against it (``select``: substrings of the test
ids; the catalogue run keeps only those, and stops testing a mutant at its first failure). A
renamed, unmutated copy of each base (the ``*Control`` classes) runs the union of the selections and
must pass: the failures come from the defects, not from the renaming.

Mutants that cannot fail on a machine without a GPU say why and where they are caught instead
(``gpus`` > 0: the GPU run, ``scripts/gpu/mutants.sh``).

Loaded as a pytest plugin (``-p mutants``), this module also applies the selections and the
stop-at-first-failure rule to the suite run.
"""
from __future__ import annotations

import os
from typing import Any

import pytest

from multidev.adapter import DTYPES

from ._base import *  # noqa: F403
from ._base import CATALOGUE, CONTROLS, control_of
from .engines import *  # noqa: F403
from .generic import *  # noqa: F403
from .of_cupy import *  # noqa: F403
from .of_jax import *  # noqa: F403
from .of_mesh import *  # noqa: F403
from .of_numpy import *  # noqa: F403
from .of_torch import *  # noqa: F403

# == the catalogue run: selections and stop-at-first-failure (this module as a pytest plugin) =====
#: ``$MULTIDEV_CATALOGUE_MUTANTS``: class names (comma-separated) to run alone (with their controls
#: on their checks only); unset: every mutant.
ONLY_ENV = "MULTIDEV_CATALOGUE_MUTANTS"


def chosen(entries: list[Any]) -> list[Any]:
    """The entries ``$MULTIDEV_CATALOGUE_MUTANTS`` keeps (all where it is unset)."""
    names = {n.strip() for n in os.environ.get(ONLY_ENV, "").split(",") if n.strip()}
    return [m for m in entries if not names or m.cls.__name__ in names]


_BY_NAME = {m.name: m for m in chosen(CATALOGUE)}
#: Each control runs every check any of its (chosen) mutants is selected for.
_UNIONS = {c.name: tuple(sorted({s for m in chosen(CATALOGUE) if control_of(m.cls) is c for s in m.select}))
           for c in CONTROLS}
_failed: set[str] = set()


def _backend_of(item: pytest.Item) -> str | None:
    cs = getattr(item, "callspec", None)
    return None if cs is None else cs.params.get("md_backend_name")


def _selects(s: str, nodeid: str) -> bool:
    """Whether selection ``s`` takes the check ``nodeid``: each of its words joined by `` and `` is part
    of the id (``"test_collectives_across_processes and 2procs-torch]"``: that check over 2 processes of
    the torch engine alone, for the mutant and its control)."""
    return all(w in nodeid for w in s.split(" and "))


def _wanted(item: pytest.Item) -> bool:
    name = _backend_of(item)
    if name in _BY_NAME:
        return any(_selects(s, item.nodeid) for s in _BY_NAME[name].select)
    if name in _UNIONS:
        return any(_selects(s, item.nodeid) for s in _UNIONS[name]) and not _other_dtype(item.nodeid)
    return True


#: The dtypes a control runs the dtype-parametrized checks in (a renaming artifact does not depend
#: on the dtype; the full conformance run covers every dtype of the real adapters).
_CONTROL_DTYPES = ("bool", "int8", "float16", "float32")


def _other_dtype(nodeid: str) -> bool:
    params = nodeid.rsplit("[", 1)[-1].rstrip("]").split("-")
    return any(p in DTYPES and p not in _CONTROL_DTYPES for p in params)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("MULTIDEV_CATALOGUE_SELECT") != "1":
        return
    drop = [it for it in items if not _wanted(it)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [it for it in items if _wanted(it)]


def pytest_runtest_setup(item: pytest.Item) -> None:
    name = _backend_of(item)
    if os.environ.get("MULTIDEV_CATALOGUE_SELECT") == "1" and name in _failed:
        pytest.skip(f"mutant {name} already failed a check (the catalogue stops at the first failure)")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        for name in _BY_NAME:
            if f"[{name}-" in report.nodeid or f"[{name}]" in report.nodeid:
                _failed.add(name)


