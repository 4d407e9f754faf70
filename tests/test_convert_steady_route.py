"""``convert``'s steady accelerator route: once a route between two accelerators that order the
exchange on their streams (no host wait, no host rules) has given the consumer's tensor of the
dtype on the device, later calls go straight from the producer's export to the consumer's import.
CI has no accelerator, so the route of a host conversion (torch -> NumPy) is made to look like one
(handshake, no wait, not host): what is checked is the core's logic around it (the shortcut taken,
the values shared, a failing import falling back to a copy, ``copy=False`` refused then,
``copy=True`` never shortcut). On GPUs the suite's interop checks cover the real routes."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import exchange
from multidev.errors import CapabilityError

torch = pytest.importorskip("torch", reason="a second framework to convert from (the modern lane has torch)")


@pytest.fixture
def accelerator_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    made = exchange._Route.__init__

    def init(self: Any, *args: Any) -> None:
        made(self, *args)
        self.handshake, self.wait, self.host = True, False, False  # as between two GPUs' streams

    monkeypatch.setattr(exchange._Route, "__init__", init)
    monkeypatch.setattr(exchange, "_ROUTES", {})


def _route() -> Any:
    (route,) = exchange._ROUTES.values()
    return route


@pytest.mark.usefixtures("accelerator_routes")
def test_the_second_call_takes_the_steady_route_and_shares_memory() -> None:
    t = torch.arange(6, dtype=torch.float32)
    first = md.convert(t, "numpy")
    route = _route()
    assert route.steady, "a route that gave the right tensor once is steady"
    calls: list[Any] = []
    imp = route.imp
    route.imp = lambda obj, dev: calls.append(obj) or imp(obj, dev)
    second = md.convert(t, "numpy")
    assert len(calls) == 1 and type(second) is np.ndarray
    np.testing.assert_array_equal(second, np.arange(6, dtype=np.float32))
    t[0] = 42.0  # zero-copy: the producer's write shows through both
    assert first[0] == 42.0 and second[0] == 42.0
    copied = md.convert(t, "numpy", copy=True)  # never the shortcut: a new buffer
    assert len(calls) == 2 and not np.shares_memory(copied, second)
    t[1] = -1.0
    assert copied[1] == 1.0


@pytest.mark.usefixtures("accelerator_routes")
def test_a_failing_import_on_the_steady_route_falls_back_to_a_copy() -> None:
    t = torch.arange(4, dtype=torch.float32)
    md.convert(t, "numpy")
    route = _route()
    assert route.steady

    def refuse(obj: Any, dev: Any) -> Any:
        raise CapabilityError("this consumer refuses the buffer now")

    route.imp = refuse
    y = md.convert(t, "numpy")
    np.testing.assert_array_equal(y, np.arange(4, dtype=np.float32))
    t[0] = 9.0
    assert y[0] == 0.0, "the fallback is a copy"
    with pytest.raises(CapabilityError, match="refuses the buffer now"):
        md.convert(t, "numpy", copy=False)
