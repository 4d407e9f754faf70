"""``convert``'s host hand-off exports a producer's buffer once and gives that capsule to the
consumer. A one-shot producer (MXNet's export is one: :class:`multidev.dlpack.DLPackCapsule`)
cannot export twice, so the capsule read by the core must suit whatever the consumer asks: a
legacy capsule suits a consumer asking without ``max_version`` (NumPy 1.26) and one asking with it;
a versioned capsule only one asking with ``max_version >= (1, 0)``. NumPy only."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import multidev as md
from multidev import exchange
from multidev.dlpack import DLPackCapsule


class _OldConsumer:
    """A consumer that asks as NumPy 1.26's from_dlpack does: ``__dlpack__(stream=None)``."""

    @staticmethod
    def take(producer: Any) -> Any:
        return producer.__dlpack__(stream=None)


def _one_shot(a: np.ndarray) -> DLPackCapsule:
    return DLPackCapsule(a.__dlpack__(), md.Device("cpu", 0))  # a legacy capsule, handed out once


@pytest.mark.parametrize("ask", [{"stream": None}, {"max_version": (1, 0)}, {"max_version": (1, 1), "stream": None}])
def test_a_one_shot_legacy_producer_reaches_every_consumer(ask: dict) -> None:
    a = np.arange(4.0)
    producer = _one_shot(a)
    y, handed = exchange._host_share(producer, md.backend("numpy"), "test")
    assert y is None
    cap = handed.__dlpack__(**ask)
    assert type(cap).__name__ == "PyCapsule", f"the consumer asking {ask} got {cap!r}"
    with pytest.raises(BufferError, match="consumed once"):
        handed.__dlpack__(**ask)  # the one capsule went to the first consumer


def test_a_versioned_capsule_goes_only_to_a_consumer_asking_for_one() -> None:
    a = np.arange(4.0)
    if not hasattr(np, "from_dlpack") or np.lib.NumpyVersion(np.__version__) < "2.1.0":
        pytest.skip(f"NumPy {np.__version__} exports no versioned capsule (2.1 and later do)")
    y, handed = exchange._host_share(a, md.backend("numpy"), "test")
    assert y is None
    read = handed._cap  # the capsule the core read
    assert exchange._capsule_name(read) == b"dltensor_versioned"
    first = handed.__dlpack__(stream=None)  # an old-style request: a fresh legacy export of a
    assert first is not read and exchange._capsule_name(first) == b"dltensor"
    assert handed.__dlpack__(max_version=(1, 0)) is read  # the read one, to a consumer that takes it
