"""The numpy baseline for ``multidev bench``: numpy's own calls for every row."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from multidev import Device

from ..baseline import Call, Native, nothing


class NumpyNative(Native):
    framework = "numpy"
    #: suite ``startup``: the framework's import and first call, in a fresh interpreter
    startup_code = "import numpy; numpy.zeros(1)"
    tracks_devices = False
    # np.asarray(x) of an ndarray is a 60 ns C call that does nothing: no ratio to it is a goal.
    goal_targets = {"P1 no-op to": None, "P1 no-op to (str spec)": None}  # noqa: RUF012

    def op_sync(self, dev: Device, x: Any = None) -> Call:
        return nothing, (), "nothing (NumPy is synchronous)"

    def op_wait(self, x: Any) -> Call:
        return nothing, (), "nothing (NumPy is synchronous)"

    def mm(self, dev: Device) -> Callable[[Any, Any], Any]:
        return np.matmul

    def op_to(self, x: Any, dev: Device) -> Call:
        if self.b.device_of(x) != dev:  # another (virtual) device: NumPy's equivalent is a copy
            return np.array, (x,), "np.array(x)"
        return np.asarray, (x,), "np.asarray(x)"

    def op_copy(self, x: Any, dev: Device) -> Call:
        return np.array, (x,), "np.array(x)"

    def op_move_async(self, x: Any, dev: Device) -> Call:
        return self.op_to(x, dev)

    def op_zeros(self, shape: tuple, dev: Device) -> Call:
        return np.zeros, (shape, np.float32), "np.zeros(shape, float32)"

    def op_h2d(self, a: np.ndarray, dev: Device) -> Call:
        return np.array, (a,), "np.array(a)"

    def op_d2h(self, x: Any) -> Call:
        return np.asarray, (x,), "np.asarray(x)"

    def op_dist_allreduce_mpi(self, x: Any) -> Call:
        """The mpi engine's own call (suite ``distributed``): mpi4py's buffer-API ``Allreduce`` in place
        on a contiguous NumPy buffer of the world communicator."""
        import functools

        from mpi4py import MPI

        buf = np.ascontiguousarray(np.asarray(x))
        return (functools.partial(MPI.COMM_WORLD.Allreduce, MPI.IN_PLACE, buf), (),
                "mpi4py: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buf) on a NumPy buffer")

    def op_dist_allreduce_floor_mpi(self, x: Any) -> Call:
        """The least an allreduce that honours a timeout does on MPI (suite ``distributed``'s floor row):
        mpi4py's nonblocking ``Iallreduce`` in place, then ``Test()`` in a loop (a blocking call cannot
        give up on a lost peer)."""
        from mpi4py import MPI

        buf = np.ascontiguousarray(np.asarray(x))
        comm = MPI.COMM_WORLD

        def floor() -> None:
            req = comm.Iallreduce(MPI.IN_PLACE, buf)
            while not req.Test():
                pass
        return floor, (), "mpi4py: Iallreduce(MPI.IN_PLACE, buf), then req.Test() until done"

    def op_dist_allreduce_group_mpi(self, x: Any, groups: Any) -> Call:
        """mpi4py's ``Allreduce`` in place within this rank's subgroup of ``groups`` (a communicator made
        here by ``Split``, every rank calling it): the engine's own subgroup call."""
        import functools

        from mpi4py import MPI

        me = MPI.COMM_WORLD.Get_rank()
        color = next(i for i, g in enumerate(groups) if me in g)
        comm = MPI.COMM_WORLD.Split(color, list(groups[color]).index(me))
        buf = np.ascontiguousarray(np.asarray(x))
        return (functools.partial(comm.Allreduce, MPI.IN_PLACE, buf), (),
                "mpi4py: COMM_WORLD.Split(...).Allreduce(MPI.IN_PLACE, buf) on a NumPy buffer")

    def set_precision(self, mode: str) -> dict[str, Any]:
        return {"matmul": "float32 (BLAS)"}

    # -- D2L 12.1 (suite "compile"): the MLP; NumPy has no compiler ------------------------------
    def mlp_d2l(self, weights: list[np.ndarray], dev: Device) -> Callable[[], Any]:
        """Fresh MLP functions (``np.maximum(h, 0)`` between layers) closing over ``weights``."""
        ps = [self.b.asarray(w, None, dev) for w in weights]

        def make() -> Callable[[Any], Any]:
            def mlp(x: Any) -> Any:
                for i in range(0, len(ps) - 2, 2):
                    x = np.maximum(x @ ps[i] + ps[i + 1], 0)
                return x @ ps[-2] + ps[-1]
            return mlp
        return make

    def compiled_d2l(self, make: Callable[[], Any], x: Any, dev: Device, quick: bool) -> dict[str, Any]:
        return {}
