"""World size 1 without a launcher: ``dist.init()`` in a plain ``python`` process starts a
1-process group (one warning line says so), and every collective runs with world-size-1 results;
an engine named explicitly (argument or $MULTIDEV_ENGINE) but without its launcher still raises."""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import numpy as np
import pytest

from multidev import distributed as dist
from multidev.errors import CollectiveInputError, MultidevError, UnsupportedTensorError

_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
                "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                "JAX_PROCESS_ID", "MULTIDEV_ENGINE")


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for k in list(os.environ):
        if k in _LAUNCH_VARS or k.startswith(("OMPI_", "PMIX_", "SLURM_")):
            monkeypatch.delenv(k)
    dist.shutdown()
    yield
    dist.shutdown()


def test_init_without_a_launcher_is_one_process_and_says_so(plain: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="multidev.distributed"):
        info = dist.init()
    assert (info.engine, info.rank, info.world_size) == ("local", 0, 1)
    assert dist.rank() == 0 and dist.world_size() == 1 and dist.local_rank() == 0 and dist.is_initialized()
    assert "world size 1" in info.reason
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "one process" in r.getMessage()]
    assert len(warned) <= 1  # once a process (an earlier test may have said it already)


def test_every_collective_gives_world_size_one_results(plain: None) -> None:
    dist.init()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for op in ("sum", "mean", "max", "min", "prod"):
        y = dist.allreduce(x, op)
        assert y is not x and np.array_equal(y, x) and y.dtype == x.dtype
    b = dist.broadcast(x, 0)
    assert b is not x and np.array_equal(b, x)
    assert np.array_equal(dist.reduce(x, 0), x)
    assert np.array_equal(dist.allgather(x), x) and np.array_equal(dist.allgather(x, axis=1), x)
    assert np.array_equal(dist.gather(x, 0), x)
    assert np.array_equal(dist.scatter(x, 0), x) and np.array_equal(dist.scatter(x, 0, axis=1), x)
    assert np.array_equal(dist.reduce_scatter(x), x) and np.array_equal(dist.reduce_scatter(x, "max", axis=1), x)
    dist.barrier()
    w = dist.allreduce(x, async_op=True)
    assert np.array_equal(w.wait(), x)
    z = x.copy()
    assert dist.allreduce(z, "sum", inplace=True) is z and np.array_equal(z, x)


def test_the_checks_still_refuse_bad_input_typed(plain: None) -> None:
    dist.init()
    with pytest.raises(CollectiveInputError):
        dist.broadcast(np.zeros(3), src=1)
    with pytest.raises(Exception, match="mean"):
        dist.allreduce(np.arange(3), "mean")  # integers: no mean, as on every engine


def test_with_the_checks_off_bad_input_is_still_refused_typed_and_loses_nothing(plain: None) -> None:
    # (an unchecked allreduce or broadcast runs this rank's checks without the exchange's steps)
    dist.init()
    dist.set_checks(False)
    x = np.arange(4, dtype=np.float32)
    with pytest.raises(CollectiveInputError, match="unknown op"):
        dist.allreduce(x, "median")
    with pytest.raises(CollectiveInputError, match="mean"):
        dist.allreduce(np.arange(3), "mean")
    with pytest.raises(CollectiveInputError, match="src=1"):
        dist.broadcast(x, src=1)
    frozen = x.copy()
    frozen.flags.writeable = False
    with pytest.raises(MultidevError, match="inplace=True"):
        dist.allreduce(frozen, inplace=True)
    with pytest.raises(UnsupportedTensorError):
        dist.allreduce(object())
    with pytest.raises(MultidevError, match="unknown op"):
        dist.allreduce(x, "median", async_op=True)
    assert np.array_equal(x, np.arange(4, dtype=np.float32))  # nothing was written
    assert dist.allreduce(x, inplace=True) is x and np.array_equal(dist.allreduce(x, async_op=True).wait(), x)
    assert np.array_equal(dist.broadcast(x, 0), x) and not dist.checks_enabled()


def test_other_backends_travel_as_they_are(plain: None) -> None:
    torch = pytest.importorskip("torch")
    dist.init()
    t = torch.arange(4.0)
    y = dist.allreduce(t)
    assert isinstance(y, torch.Tensor) and torch.equal(y, t) and y.data_ptr() != t.data_ptr()
    assert dist.transport_path(t) == "native"


def test_a_named_engine_without_its_launcher_still_raises(plain: None, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    with pytest.raises(dist.DistributedError, match="torch"):
        dist.init(engine="torch", rendezvous_timeout=5)  # torchrun's variables absent: named, so not a solo group
    assert not dist.is_initialized()
    monkeypatch.setenv("MULTIDEV_ENGINE", "nope")
    with pytest.raises(dist.DistributedError, match="nope"):
        dist.init()
    assert not dist.is_initialized()


def test_explicit_ranks_of_a_larger_world_are_not_a_solo_group(plain: None) -> None:
    with pytest.raises(dist.DistributedError, match="no launcher"):
        dist.init(rank=1, world_size=2)
    assert not dist.is_initialized()
