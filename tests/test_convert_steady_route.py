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


# -- host routes of producers declaring plain host exports (JAX, TensorFlow) ------------------------
def test_a_plain_producers_host_route_reads_one_header_then_hands_capsules_over() -> None:
    """JAX declares ``plain_host_exports``: the first JAX -> torch convert on the host reads the
    export's header (the core's sharing rules) and finds it plain; later ones hand the capsule to
    torch unread (no ``_host_share``), still zero-copy and with the finished values."""
    jnp = pytest.importorskip("jax.numpy", reason="JAX is the producer that declares plain host exports")
    import jax

    with jax.default_device(jax.devices("cpu")[0]):  # (a GPU is JAX's default where there is one)
        x = jnp.arange(6, dtype=jnp.float32) * 2
    exchange._ROUTES.clear()
    first = md.convert(x, "torch")
    route = _route()
    assert route.plain and route.steady, "a plain producer's host route is steady after one checked call"
    reads: list[Any] = []
    share = exchange._host_share
    try:
        exchange._host_share = lambda *a: reads.append(a) or share(*a)  # type: ignore[assignment]
        with jax.default_device(jax.devices("cpu")[0]):
            z = jnp.arange(6, dtype=jnp.float32) * 3  # pending work: the export waits for it
        second = md.convert(z, "torch")
        copied = md.convert(z, "torch", copy=True)
    finally:
        exchange._host_share = share  # type: ignore[assignment]
    assert len(reads) == 1, "only copy=True goes the checked way again"
    np.testing.assert_array_equal(second.numpy(), np.arange(6, dtype=np.float32) * 3)
    assert second.data_ptr() == z.unsafe_buffer_pointer(), "the steady host route shares memory"
    assert first.data_ptr() == x.unsafe_buffer_pointer()
    assert copied.data_ptr() != z.unsafe_buffer_pointer()


def test_a_refused_first_export_leaves_a_plain_route_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A route is made steady only by a first export the core read and found shareable: a producer
    declaring plain exports whose first export is refused (a reversed view) keeps being checked, so the
    next refused view is copied too."""
    monkeypatch.setattr(type(md.backend("numpy").dlpack), "plain_host_exports", True, raising=False)
    exchange._ROUTES.clear()
    a = np.arange(8, dtype=np.float32)
    y = md.convert(a[::-1], "torch")  # negative strides: refused, copied
    route = _route()
    assert route.plain and not route.steady
    np.testing.assert_array_equal(y.numpy(), a[::-1])
    again = md.convert(a[::-1], "torch")
    np.testing.assert_array_equal(again.numpy(), a[::-1])
    a[0] = 5.0
    assert again[-1] == 0.0, "still a copy"
