"""The suite's shared state in one place: what the plugin selected (backends, devices, partners),
the matrix's outcomes, what checks found out, and the child interpreter's restart request. The
plugin (parent side) and the isolation child both read and write it here, so neither imports the
other."""
from __future__ import annotations

from typing import Any

__all__ = ["STATE", "record_found", "request_child_restart"]

STATE: dict[str, Any] = {}


def record_found(backend: str, key: str, value: Any) -> None:
    """Note what a check found out about a backend (shown under the matrix and in the JSON)."""
    STATE.setdefault("found", {}).setdefault(backend, {})[key] = value


def request_child_restart() -> None:
    """Called by a check running in the child interpreter that left its framework unusable (a
    sticky device error): the child ends after answering, and the next check gets a fresh one."""
    STATE["restart"] = True
