"""The ``mpi`` engine: MPI through mpi4py, the HPC standard, launched by ``mpiexec``/``mpirun``/``srun``.

- Buffers: NumPy arrays, passed to MPI's buffer API directly (``Iallreduce`` and friends on
  contiguous host memory, no pickling). GPU tensors (CuPy, torch, JAX) are handed to MPI as device
  buffers only where the MPI build is CUDA-aware, and staged through host memory otherwise (the
  tensor's own framework copies it to the host, through pinned memory where it has it): a
  non-CUDA-aware MPI given a device pointer crashes the process. CUDA-awareness is read from
  ``$MULTIDEV_MPI_CUDA_AWARE`` (``1``/``0``) when set, else from the library
  (``MPIX_Query_cuda_support``: Open MPI; ``MPIX_GPU_query_support``: MPICH), else taken as absent.
- Nothing blocks in a call that cannot time out: ``MPI_Init`` runs in a helper thread waited for
  with the rendezvous timeout; communicators are duplicated with ``Idup``; every collective is the
  nonblocking one (``Iallreduce``, ``Ibcast``, ...) polled with the group's deadline; the
  consistency exchange is point-to-point ``Isend``/``Irecv`` of one small row to every rank, so the
  ranks whose rows did not arrive are known by name. Errors are returned, not fatal
  (``MPI.ERRORS_RETURN``). Open MPI's nonblocking allreduce runs its ring algorithm
  (``OMPI_MCA_coll_libnbc_iallreduce_algorithm=ring`` unless set): its default was 1.5x slower than
  the blocking ``Allreduce`` from 16 MiB on.
- Dtypes MPI lacks: ``bfloat16`` is reduced in float32 and rounded back; ``bool`` reductions are
  logical or/and on bytes. Moves (broadcast, the gathers, scatter) send raw bytes.
- Exit: mpi4py's automatic ``MPI_Finalize`` is replaced by this engine's (when mpi4py was not
  imported before ``init``): launchers count a process that exits without it as a failed job; in a
  healthy job it waits as MPI's own does, and after a lost rank (which it may wait for forever:
  ULFM's does) it is given 10 s, called through ctypes so the wait can end (mpi4py's call holds the
  GIL), then the process exits with status 1.
- A killed rank: Open MPI's launcher kills the whole job when one process dies unless started
  with ``mpiexec --enable-recovery`` (or ``--with-ft ulfm``); then the others raise
  DistributedTimeoutError naming it. MPICH's Hydra: ``mpiexec -disable-auto-cleanup``.
"""
from __future__ import annotations

import atexit
import contextlib
import copy
import ctypes
import functools
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

import multidev as md
from multidev import Device
from multidev.adapter import aligned_empty
from multidev.distributed.engine import (
    Engine,
    Handle,
    Launch,
    Membership,
    Settings,
    check_rank,
    env_int,
    peer_errors,
    poll_until,
    run_with_deadline,
)
from multidev.errors import CapabilityError, DistributedError, DistributedSetupError, DistributedTimeoutError

#: Set to 1 or 0 to say whether the MPI build is CUDA-aware (overrides what the library reports).
CUDA_AWARE_ENV = "MULTIDEV_MPI_CUDA_AWARE"
_TAGS = 30000  # consistency-exchange tags cycle through 1..30000 (MPI guarantees 32767)
_P2P_TAG = 7  # point-to-point messages, on the data communicator (the user's tag travels in the header)

#: The predefined MPI datatype of each dtype (reductions take predefined types only).
_MPI_TYPES = {"int8": "INT8_T", "int16": "INT16_T", "int32": "INT32_T", "int64": "INT64_T", "uint8": "UINT8_T",
              "uint16": "UINT16_T", "uint32": "UINT32_T", "uint64": "UINT64_T", "float16": "FLOAT16_T",
              "bfloat16": None, "float32": "FLOAT", "float64": "DOUBLE", "complex64": "C_FLOAT_COMPLEX",
              "complex128": "C_DOUBLE_COMPLEX"}

#: (op, on bools) -> the name of MPI's reduction (bools as bytes: max is logical or, min logical and).
_OPS = {("sum", False): "SUM", ("prod", False): "PROD", ("max", False): "MAX", ("min", False): "MIN",
        ("max", True): "LOR", ("min", True): "LAND"}


#: Seconds a request's wait polls MPI_Test without sleeping (then it naps up to 1 ms between tests).
_BUSY = 10.0

#: Tests a request's wait makes back to back first, reading the clock once every _BLOCK of them, for at most
#: _TIGHT tests or _TIGHT_SPAN seconds, where its timeout is at least _TIGHT_SPAN: the wait keeps its deadline
#: within one block of tests (a test of a request in flight may copy a fragment of the message).
_TIGHT = 4000
_BLOCK = 50
_TIGHT_SPAN = 0.005

#: Results under this many bytes are plain ``np.empty`` memory (aligned_empty's alignment costs 2 us a call).
_SMALL = 4096


def _same(r: Any) -> Any:
    return r


def _bools(r: Any) -> Any:
    return r.view(np.bool_)


_exit: dict[str, Any] = {"registered": False, "own_finalize": False, "broken": False, "deadline": 30.0}


def _env_int(env: Mapping[str, str], *names: str) -> int | None:
    for n in names:
        v = env.get(n)
        if v not in (None, ""):
            try:
                return int(str(v))
            except ValueError:
                return None
    return None


def mpiexec() -> str:
    """The ``mpiexec`` beside this Python (a venv with Open MPI from PyPI), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise CapabilityError('the mpi engine: no mpiexec found (pip install "multidev[mpi]" brings Open MPI)')
    return found


@functools.cache
def open_mpi(exe: str) -> bool:
    """Whether ``exe`` is Open MPI's launcher (it takes --oversubscribe, --enable-recovery)."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "open mpi" in (out.stdout + out.stderr).lower() or "open-mpi" in (out.stdout + out.stderr).lower()


def _finalize_at_exit() -> None:
    """MPI_Finalize at exit (in place of mpi4py's own): launchers treat a process that exits without
    it as a failed job (and kill the others). In a healthy job it waits as MPI's does (for ranks
    still working); after a lost rank, which it may wait for forever (Open MPI with ULFM does), at
    most 10 s, then the process exits with status 1."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not _exit["own_finalize"]:
        return
    limit = min(float(_exit["deadline"]), 10.0)
    try:
        if not MPI.Is_initialized() or MPI.Is_finalized():
            return
        if not _exit["broken"]:
            _finalize_call(MPI)()  # a healthy job: MPI_Finalize waits for the ranks still working
            return
        run_with_deadline(_finalize_call(MPI), limit, "MPI_Finalize")
    except DistributedTimeoutError:
        # After a lost rank, MPI_Finalize may wait for it forever: the process must end all the same,
        # and the interpreter's own shutdown beside a thread still inside MPI may wait in MPI's exit
        # handlers. The job has failed already (a rank was lost): exit status 1, output flushed.
        with contextlib.suppress(Exception):
            print(f"multidev: MPI_Finalize did not return within {limit:g} s after a lost rank; this "
                  "process exits with status 1", file=sys.stderr, flush=True)
            sys.stdout.flush()
        os._exit(1)
    except Exception:  # noqa: BLE001 - an MPI error at exit changes nothing the program did
        pass


def _finalize_call(MPI: Any) -> Callable[[], Any]:
    """MPI_Finalize as a call that lets go of the GIL while it waits (through ctypes, as
    :func:`_init`'s): mpi4py's own holds it, so a deadline on it could never fire."""
    libs = _mpi_libraries(MPI)
    if not libs:
        return MPI.Finalize
    fn = ctypes.CDLL(libs[0]).MPI_Finalize
    return lambda: int(fn())


def _init(MPI: Any, timeout: float) -> None:
    """MPI_Init_thread, bounded by ``timeout``: it waits for every rank of the job, and mpi4py's own
    call holds the GIL while it waits, so it is called through ctypes (which lets go of it) in a
    helper thread; DistributedTimeoutError when not every rank arrived in time."""
    libs = _mpi_libraries(MPI)
    if not libs:  # no library to call directly: mpi4py's own call, which cannot time out
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
        return
    lib = ctypes.CDLL(libs[0])
    provided = ctypes.c_int(-1)

    def call() -> int:
        return int(lib.MPI_Init_thread(None, None, ctypes.c_int(MPI.THREAD_MULTIPLE), ctypes.byref(provided)))
    rc = run_with_deadline(call, timeout, "MPI_Init (every rank of the job must start it)")
    if rc != 0:
        raise DistributedError(f"the mpi engine: MPI_Init_thread failed with error code {rc}")


def cuda_aware(MPI: Any) -> tuple[bool, str]:
    """Whether the MPI library takes device pointers, and how that was found out."""
    v = os.environ.get(CUDA_AWARE_ENV, "").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True, f"${CUDA_AWARE_ENV}={v}"
    if v in ("0", "false", "no", "off"):
        return False, f"${CUDA_AWARE_ENV}={v}"
    for lib in _mpi_libraries(MPI):
        try:
            dll = ctypes.CDLL(lib)
        except OSError:
            continue
        fn = getattr(dll, "MPIX_Query_cuda_support", None)
        if fn is not None:
            fn.restype = ctypes.c_int
            return bool(fn()), "MPIX_Query_cuda_support()"
        fn = getattr(dll, "MPIX_GPU_query_support", None)
        if fn is not None:
            out = ctypes.c_int(0)
            if fn(ctypes.c_int(1), ctypes.byref(out)) == 0:  # MPIX_GPU_SUPPORT_CUDA
                return bool(out.value), "MPIX_GPU_query_support(CUDA)"
    return False, "the library does not say (taken as not CUDA-aware)"


def _mpi_libraries(MPI: Any) -> list[str]:
    """Paths of the MPI shared libraries this process loaded (from /proc/self/maps)."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                name = os.path.basename(path)
                if name.startswith(("libmpi.so", "libmpich.so", "libmpi_")) and path not in found:
                    found.append(path)
    except OSError:
        pass
    return sorted(found, key=lambda p: not os.path.basename(p).startswith(("libmpi.so", "libmpich.so")))


def _parent_is_a_rank() -> bool:
    """Whether this process's parent has an MPI library loaded (it is an MPI process): launchers'
    daemons (prted, hydra_pmi_proxy, slurmstepd) and shells never load one, so a process whose parent
    did was started by a rank, not by the launcher, and the launcher's variables it sees are stale."""
    try:
        with open(f"/proc/{os.getppid()}/maps") as f:
            return any(os.path.basename(line.split()[-1]).startswith(("libmpi.so", "libmpich.so"))
                       for line in f if line.strip())
    except (OSError, IndexError):
        return False


def _finished(req: Any) -> bool:
    try:
        return bool(req.Test())
    except Exception:  # noqa: BLE001 - a send to a lost rank: done with, as far as this rank cares
        return True


class _Request(Handle):
    """A nonblocking MPI request, polled; ``finish`` gives the result once it completed."""

    def __init__(self, engine: MpiEngine, req: Any, finish: Callable[[], Any], what: str) -> None:
        self.engine, self.req, self.finish, self.what = engine, req, finish, what
        self.done = False

    def test(self) -> bool:
        if not self.done:
            try:
                self.done = bool(self.req.Test())
            except self.engine.MPI.Exception:  # classified (the fast path above is the polling loop's)
                with self.engine.errors(self.what):
                    raise
        return self.done

    def wait(self, timeout: float) -> bool:
        if self.done:
            return True
        if timeout >= _TIGHT_SPAN:
            # MPI moves a message's fragments only inside MPI_Test, and a medium message's protocol steps each
            # wait for the peer's next test: a first stretch of tests back to back, the clock read once a block
            req, start = self.req, time.perf_counter()
            try:
                for _ in range(_TIGHT // _BLOCK):
                    for _ in range(_BLOCK):
                        if req.Test():
                            self.done = True
                            return True
                    if time.perf_counter() - start >= _TIGHT_SPAN:
                        break
            except self.engine.MPI.Exception:  # classified as test() does
                with self.engine.errors(self.what):
                    raise
            timeout -= time.perf_counter() - start
        # (not asleep for _BUSY seconds: MPI moves a large message's fragments only inside MPI_Test, so a
        # poll that sleeps after 50 ms starves it (256 MiB took 11x mpi4py's call on the H200 host's Open
        # MPI 4.1); MPI's own blocking calls poll without sleeping, yielding here where others wait for
        # the core; past _BUSY (a peer late or lost) it naps as other waits do, not burning a core)
        return poll_until(self.test, timeout, busy=min(timeout, _BUSY))

    def result(self) -> Any:
        return self.finish()

    def __del__(self) -> None:
        # A handle dropped while MPI still reads or writes its buffers (a wait that timed out, an
        # async Work never waited for): the engine keeps the request and the buffers its finish holds
        # until MPI is done with them, so their memory is not reused (multidev.hostpool) under it.
        # (mpi4py's request holds its buffers for some calls only: Isend, Irecv, Iallgather, Ibcast,
        # Iscatter do; Iallreduce, Ireduce, Ireduce_scatter_block do not, measured with mpi4py 4.1, so
        # every finish here holds what its reduction reads and writes itself)
        # (no MPI call here: a handle may die after MPI_Finalize, where any call aborts the process)
        try:
            if not self.done:
                self.engine.__dict__.setdefault("orphans", []).append((self.req, self.finish))
        except Exception:  # noqa: BLE001 - the interpreter is shutting down
            pass


class MpiEngine(Engine):
    name = "mpi"
    conformance_worlds = (3,)
    tensors = "numpy"
    writes_inputs = True
    overlaps = False  # MPI_Iallreduce progresses inside MPI_Test/MPI_Wait calls only

    # -- launch ------------------------------------------------------------------------------
    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> Launch | None:
        e = environ
        if "OMPI_COMM_WORLD_SIZE" in e:
            return Launch("mpi", "Open MPI's mpiexec/mpirun",
                          f"OMPI_COMM_WORLD_SIZE={e['OMPI_COMM_WORLD_SIZE']} is set",
                          _env_int(e, "OMPI_COMM_WORLD_RANK"), _env_int(e, "OMPI_COMM_WORLD_SIZE"),
                          _env_int(e, "OMPI_COMM_WORLD_LOCAL_RANK"), _env_int(e, "OMPI_COMM_WORLD_LOCAL_SIZE"))
        if "PMI_SIZE" in e or "PMI_RANK" in e:
            return Launch("mpi", "MPICH/Intel MPI's mpiexec (PMI)",
                          f"PMI_RANK={e.get('PMI_RANK')} and PMI_SIZE={e.get('PMI_SIZE')} are set",
                          _env_int(e, "PMI_RANK"), _env_int(e, "PMI_SIZE"), _env_int(e, "MPI_LOCALRANKID"),
                          _env_int(e, "MPI_LOCALNRANKS"))
        if "MV2_COMM_WORLD_SIZE" in e:
            return Launch("mpi", "MVAPICH's mpirun", f"MV2_COMM_WORLD_SIZE={e['MV2_COMM_WORLD_SIZE']} is set",
                          _env_int(e, "MV2_COMM_WORLD_RANK"), _env_int(e, "MV2_COMM_WORLD_SIZE"),
                          _env_int(e, "MV2_COMM_WORLD_LOCAL_RANK"), _env_int(e, "MV2_COMM_WORLD_LOCAL_SIZE"))
        if "PMIX_RANK" in e:
            return Launch("mpi", "a PMIx launcher (prterun, srun --mpi=pmix)", f"PMIX_RANK={e['PMIX_RANK']} is set",
                          _env_int(e, "PMIX_RANK"), _env_int(e, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
                          _env_int(e, "SLURM_LOCALID"), None)
        if "SLURM_STEP_ID" in e and "SLURM_PROCID" in e:
            return Launch("mpi", "Slurm's srun", f"SLURM_PROCID={e['SLURM_PROCID']} and SLURM_STEP_ID are set",
                          _env_int(e, "SLURM_PROCID"), _env_int(e, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
                          _env_int(e, "SLURM_LOCALID"), _env_int(e, "SLURM_STEP_TASKS_PER_NODE"), weak=True)
        return None

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("mpi4py") is None:
            return ('mpi4py is not installed: pip install "multidev[mpi]" (mpi4py and Open MPI from PyPI), or '
                    "mpi4py built against your site's MPI")
        return None

    @classmethod
    def launch_command(cls, n: int, argv: Sequence[str], options: Sequence[str] = ()) -> list[str] | None:
        exe = mpiexec()
        flags = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else []) if open_mpi(exe) else []
        return [exe, *flags, *options, "-n", str(n), *argv]

    @classmethod
    def check_launch(cls, environ: Mapping[str, str], settings: Settings) -> None:
        for rank_var, size_var in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                                   ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE")):
            size = env_int(environ, size_var, low=1)
            check_rank(env_int(environ, rank_var), size, f"${rank_var}", f"${size_var}")
        for name in ("OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK", "MPI_LOCALRANKID"):
            env_int(environ, name)
        given = next((n for n in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK")
                      if environ.get(n)), None)
        if given is not None and environ is os.environ and _parent_is_a_rank():
            raise DistributedSetupError(
                f"the mpi engine: ${given}={environ[given]} is inherited: this process's parent (pid "
                f"{os.getppid()}) is itself an MPI process, so this one was not started by mpiexec and MPI_Init "
                "would wait for a launch that never comes. Unset the launcher's variables (OMPI_*, PMIX_*, PMI_*) "
                "in the child's environment to run it alone, or start it with mpiexec (MPI_Comm_spawn)")

    def _check_world(self, settings: Settings, rank: int, size: int) -> None:
        """Refuse launcher variables that MPI's own world contradicts: a process that inherited a
        rank's ``OMPI_COMM_WORLD_*`` (a child of a rank, a script run from a job's shell) starts as a
        singleton, and its collectives would "succeed" alone."""
        launch = settings.launch
        if launch is None or launch.engine != "mpi":
            return
        said = [(what, v, real) for what, v, real in (("size", launch.world_size, size), ("rank", launch.rank, rank))
                if v is not None and v != real]
        if said:
            self.stop(False)
            raise DistributedSetupError(
                f"the mpi engine: {launch.evidence}, but MPI's own world "
                + " and ".join(f"{what} is {real} (the variables say {v})" for what, v, real in said)
                + f": this process was not started by that launch ({launch.launcher}); its variables are stale, "
                "inherited from a rank (a child process, a shell of the job). Start it with mpiexec, or unset the "
                "launcher's variables (OMPI_COMM_WORLD_*, PMI_*, PMIX_*) to run it alone")

    def start(self, settings: Settings) -> Membership:
        import mpi4py

        self.timeout = settings.timeout
        rdv = settings.rendezvous_timeout
        if "mpi4py.MPI" not in sys.modules:
            mpi4py.rc.initialize = False  # MPI_Init below, with a deadline
            mpi4py.rc.finalize = False  # finalized at exit by this module
            _exit["own_finalize"] = True
        import mpi4py.MPI as MPI

        _exit["deadline"] = min(max(settings.timeout, 5.0), 60.0)
        if not _exit["registered"]:
            atexit.register(_finalize_at_exit)
            _exit["registered"] = True
        if _exit["broken"]:
            raise CapabilityError("the mpi engine cannot form a new group after a lost rank: MPI's world still "
                                  "holds the dead process and every communicator made from it waits for it (ULFM's "
                                  "MPI_Comm_shrink is not used here); restart the job with the ranks that remain")
        if MPI.Is_finalized():
            raise DistributedError("the mpi engine: MPI was finalized in this process; MPI cannot start twice")
        if not MPI.Is_initialized():
            # Open MPI's nonblocking allreduce (libnbc) picks an algorithm 1.5x slower than its blocking
            # one from 16 MiB on; its ring matches the blocking call (measured on 2 and 4 local ranks)
            os.environ.setdefault("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "ring")
            _init(MPI, rdv)
        self.MPI = MPI
        self._ops = {key: getattr(MPI, name) for key, name in _OPS.items()}
        self._kinds: dict[Any, tuple[str, Any]] = {}  # a buffer's NumPy dtype -> (its dtype name, MPI's type or None)
        self._arg_classes = {getattr(MPI, n) for n in ("ERR_TYPE", "ERR_OP", "ERR_COUNT", "ERR_BUFFER", "ERR_ARG",
                                                        "ERR_ROOT", "ERR_TRUNCATE") if hasattr(MPI, n)}
        world = MPI.COMM_WORLD
        world.Set_errhandler(MPI.ERRORS_RETURN)
        self.comm = self._idup(world, rdv)
        self.xcomm = self._idup(world, rdv)
        r, ws = self.comm.Get_rank(), self.comm.Get_size()
        self._check_world(settings, r, ws)
        if settings.rank is not None and settings.rank != r:
            raise DistributedError(f"the mpi engine: rank={settings.rank} was given, but MPI says this is rank {r}")
        if settings.world_size is not None and settings.world_size != ws:
            raise DistributedError(f"the mpi engine: world_size={settings.world_size} was given, but MPI's world has "
                                   f"{ws} processes")
        if settings.transport is not None:
            raise DistributedError(f"the mpi engine has no transport choice (got transport={settings.transport!r}); "
                                   "MPI picks its own")
        self.rank, self.world = r, ws
        self.aware, how = cuda_aware(MPI)
        self.host_tb = md.backend("numpy")
        self._sends: list[tuple[Any, Any]] = []  # exchange sends in flight, with their buffers
        self._early: tuple[int, Any] | None = None  # the call whose row post() sent ahead, and its receives
        lr = settings.local_rank
        if lr is None:
            lr = _env_int(os.environ, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
                          "SLURM_LOCALID", "PMI_LOCAL_RANK")
        lib = MPI.Get_library_version().strip().splitlines()[0].split(",")[0].strip()
        gpus = "GPU tensors passed to MPI directly" if self.aware else "GPU tensors staged through host memory"
        return Membership(r, ws, lr, f"{lib}, {'CUDA-aware' if self.aware else 'not CUDA-aware'} ({how}): {gpus}")

    def _idup(self, comm: Any, timeout: float) -> Any:
        with self.errors("MPI_Comm_idup"):
            new, req = comm.Idup()
            if not poll_until(req.Test, timeout):
                raise DistributedError(f"the mpi engine: MPI_Comm_idup did not complete within {timeout:g} s")
        new.Set_errhandler(self.MPI.ERRORS_RETURN)
        return new

    def stop(self, healthy: bool) -> None:
        if not healthy:
            _exit["broken"] = True
        self._drop_early()
        for req, _ in getattr(self, "_sends", []):
            with contextlib.suppress(Exception):
                if not req.Test():
                    req.Cancel()
        self._sends = []
        self.comm = self.xcomm = None  # not freed: MPI_Comm_free may wait on a dead rank

    @contextlib.contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """MPI's argument errors as CapabilityError naming the engine; every other MPI error during
        a checked call is a lost peer (DistributedTimeoutError)."""
        MPI = self.MPI
        with peer_errors(f"the mpi engine: {what}", (MPI.Exception,), self.timeout):
            try:
                yield
            except MPI.Exception as e:
                if e.Get_error_class() in self._arg_classes:
                    raise CapabilityError(f"the mpi engine: {what}: MPI refused it: {e}") from e
                raise

    # -- placement -----------------------------------------------------------------------------
    def transport_for(self, device: Device) -> tuple[str, Device]:
        if device.kind != "cpu" and self.aware and "cupy" in md.backends():
            return "cupy", device
        return "numpy", Device("cpu", 0)

    def prepare(self, t: Any) -> tuple[Any, bool]:
        if isinstance(t, np.ndarray):
            if t.flags.c_contiguous and t.flags.writeable and t.dtype.isnative:
                return t, True
            # (MPI reduces in the machine's byte order: a big-endian array is copied into it)
            return np.array(t, dtype=t.dtype.newbyteorder("="), order="C", copy=True), False
        md.synchronize(t)  # a device buffer: MPI reads it from the host's side of the stream
        return t, True

    def admit(self, t: Any) -> bool:
        return type(t) is np.ndarray  # (prepare copies what MPI cannot read as it is; a device buffer waits)

    # -- the consistency channel -----------------------------------------------------------------
    def post(self, seq: int, row: Sequence[int]) -> None:
        if seq >= 0 and self.xcomm is not None:
            self._drop_early()
            self._early = (seq, self._send_row(seq, row))

    def _drop_early(self) -> None:
        """Cancel the receives of a posted call that no exchange took (none in the core's order of
        calls): left posted, they would take a later call's rows of the same tag."""
        early, self._early = getattr(self, "_early", None), None
        if early is not None:
            for req, _ in early[1][1].values():
                with contextlib.suppress(Exception):
                    req.Cancel()

    def _send_row(self, seq: int, row: Sequence[int]) -> tuple[list[list[int] | None], dict[int, tuple[Any, Any]]]:
        """Post the receives of call ``seq``'s rows and send this rank's (nonblocking): ``(rows so
        far, the receives by rank)``."""
        MPI, comm = self.MPI, self.xcomm
        tag = 1 + (seq % _TAGS) if seq >= 0 else _TAGS + 1 + min(-seq, 100)
        mine = np.asarray(row, dtype=np.int64)
        out: list[list[int] | None] = [None] * self.world
        out[self.rank] = mine.tolist()
        recvs: dict[int, tuple[Any, np.ndarray]] = {}
        with self.errors(f"the consistency exchange (call #{seq})"):
            for p in range(self.world):
                if p != self.rank:
                    buf = np.empty_like(mine)
                    recvs[p] = (comm.Irecv([buf, MPI.INT64_T], source=p, tag=tag), buf)
            self._sends = [(q, b) for q, b in self._sends if not _finished(q)]
            for p in range(self.world):
                if p != self.rank:
                    self._sends.append((comm.Isend([mine, MPI.INT64_T], dest=p, tag=tag), mine))
        return out, recvs

    def exchange(self, seq: int, row: Sequence[int], timeout: float) -> list[list[int] | None]:
        MPI = self.MPI
        if self.xcomm is None:
            raise DistributedError("the mpi engine's communicator is gone (the group was stopped)")
        early = getattr(self, "_early", None)
        if early is not None and early[0] == seq:  # sent ahead by post()
            self._early = None
            out, recvs = early[1]
        else:
            self._drop_early()
            out, recvs = self._send_row(seq, row)
        pending = dict(recvs)

        def arrived() -> bool:
            for p, (req, buf) in list(pending.items()):
                try:
                    done = req.Test()
                except MPI.Exception:  # that rank's connection failed: it stays None
                    del pending[p]
                    continue
                if done:
                    out[p] = buf.tolist()
                    del pending[p]
            return not pending

        poll_until(arrived, timeout)
        for req, _ in pending.values():
            with contextlib.suppress(Exception):
                req.Cancel()
        return out

    # -- primitives ------------------------------------------------------------------------------
    def _op(self, op: str, dtype: str) -> Any:
        return self._ops[(op, dtype == "bool")]

    def _kind(self, t: Any) -> tuple[str, Any]:
        """``(t's dtype name, MPI's predefined datatype for it or None)``, kept per NumPy dtype (host
        and CuPy buffers both have one)."""
        hit = self._kinds.get(t.dtype)
        if hit is None:
            dtype = md.dtype_of(t)
            hit = self._kinds[t.dtype] = (dtype, self._type(dtype))
        return hit

    def _bytes(self, a: Any) -> list[Any]:
        return [a.reshape(-1).view(np.uint8), self.MPI.BYTE]

    def _numeric(self, t: Any) -> tuple[Any, Any, Callable[[Any], Any], str]:
        """A buffer MPI can reduce for ``t``, its predefined MPI datatype, how to give the result
        t's dtype (bool as bytes, bfloat16 and float16 where MPI lacks it as float32, rounded back;
        the rest as they are), and t's dtype name."""
        dtype, mt = self._kind(t)
        if dtype == "bool":
            return t.view(np.uint8), mt, _bools, dtype
        if mt is None:  # bfloat16; float16 on an MPI without it
            return t.astype(np.float32), self.MPI.FLOAT, lambda r: r.astype(t.dtype), dtype
        return t, mt, _same, dtype

    def _type(self, dtype: str) -> Any:
        """MPI's predefined datatype for ``dtype`` (bool: bytes), or None where it has none."""
        MPI, name = self.MPI, _MPI_TYPES.get(dtype)
        if dtype == "bool":
            return MPI.UINT8_T
        mt = getattr(MPI, name, MPI.DATATYPE_NULL) if name else MPI.DATATYPE_NULL
        return None if mt == MPI.DATATYPE_NULL else mt

    #: Requests whose handle was dropped before MPI finished with them, with their buffers (_Request.__del__).
    orphans: list[tuple[Any, Any]]

    def _req(self, what: str, start: Callable[[], Any], finish: Callable[[], Any]) -> Handle:
        held = self.__dict__.setdefault("orphans", [])
        if held:
            held[:] = [o for o in held if not _finished(o[0])]
        try:
            req = start()
        except Exception:  # classified by errors() (its context manager costs 2 us a call on the way in)
            with self.errors(what):
                raise
        return _Request(self, req, finish, what)

    def _alloc(self, like: Any, shape: tuple[int, ...]) -> Any:
        if type(like) is np.ndarray:  # the host transport (the NumPy backend's empty on cpu:0, in fewer steps)
            if like.nbytes * self.world < _SMALL:  # (XLA shares aligned buffers only: JAX copies these few bytes)
                return np.empty(shape, like.dtype)
            return aligned_empty(shape, like.dtype)
        tb = md.backend_of(like)
        return tb.empty(shape, md.dtype_of(like), tb.device_of(like))

    def allreduce(self, t: Any, op: str) -> Handle:
        buf, mt, back, dtype = self._numeric(t)

        def finish() -> Any:
            if buf.dtype != t.dtype:
                t[...] = back(buf)  # reduced in float32, rounded back into t
            return t
        return self._req("MPI_Iallreduce", lambda: self.comm.Iallreduce(
            self.MPI.IN_PLACE, [buf, mt], self._op(op, dtype)), finish)

    def allreduce_new(self, t: Any, op: str) -> Handle | None:
        dtype, mt = self._kind(t)
        if mt is None:
            return None  # reduced through a float32 copy (bfloat16; float16 where MPI lacks it): the core's copy
        out = self._alloc(t, t.shape)
        buf, dst = (t.view(np.uint8), out.view(np.uint8)) if dtype == "bool" else (t, out)
        mop = self._op(op, dtype)
        return self._req("MPI_Iallreduce", lambda: self.comm.Iallreduce([buf, mt], [dst, mt], mop),
                         lambda: (buf, out)[1])  # (buf held until done)

    def broadcast(self, t: Any, src: int) -> Handle:
        return self._req("MPI_Ibcast", lambda: self.comm.Ibcast(self._bytes(t), root=src), lambda: t)

    def reduce(self, t: Any, dst: int, op: str) -> Handle:
        buf, mt, back, dtype = self._numeric(t)
        MPI = self.MPI
        spec = [buf, mt]
        if self.rank == dst:
            start = lambda: self.comm.Ireduce(MPI.IN_PLACE, spec, self._op(op, dtype), root=dst)
        else:
            start = lambda: self.comm.Ireduce(spec, None, self._op(op, dtype), root=dst)
        return self._req("MPI_Ireduce", start, lambda: back(buf))

    def allgather(self, t: Any) -> Handle:
        out = self._alloc(t, (self.world, *t.shape))
        return self._req("MPI_Iallgather", lambda: self.comm.Iallgather(self._bytes(t), self._bytes(out)),
                         lambda: [out[i] for i in range(self.world)])

    def gather(self, t: Any, dst: int) -> Handle:
        out = self._alloc(t, (self.world, *t.shape)) if self.rank == dst else None
        return self._req("MPI_Igather", lambda: self.comm.Igather(
            self._bytes(t), self._bytes(out) if out is not None else None, root=dst),
            lambda: None if out is None else [out[i] for i in range(self.world)])

    def reduce_scatter(self, blocks: Any, op: str) -> Handle:
        buf, mt, back, dtype = self._numeric(blocks)
        out = self._alloc(buf, tuple(buf.shape[1:]))
        return self._req("MPI_Ireduce_scatter_block", lambda: self.comm.Ireduce_scatter_block(
            [buf, mt], [out, mt], self._op(op, dtype)), lambda: (buf, back(out))[1])  # (buf held until done)

    def scatter(self, blocks: Any | None, like: Any, src: int) -> Handle:
        return self._req("MPI_Iscatter", lambda: self.comm.Iscatter(
            self._bytes(blocks) if blocks is not None else None, self._bytes(like), root=src), lambda: like)

    # -- subgroups and point-to-point --------------------------------------------------------------
    def split(self, groups: tuple[tuple[int, ...], ...]) -> Engine:
        color = next(i for i, g in enumerate(groups) if self.rank in g)
        mine = groups[color]
        with self.errors("MPI_Comm_split"):
            comm = self.comm.Split(color, mine.index(self.rank))  # every rank has agreed the call: it comes
        comm.Set_errhandler(self.MPI.ERRORS_RETURN)
        v = copy.copy(self)
        v.comm, v.rank, v.world = comm, comm.Get_rank(), comm.Get_size()
        return v

    def all_to_all(self, blocks: Any) -> Handle:
        out = self._alloc(blocks, tuple(blocks.shape))
        return self._req("MPI_Ialltoall", lambda: self.comm.Ialltoall(self._bytes(blocks), self._bytes(out)),
                         lambda: [out[i] for i in range(self.world)])

    def send(self, t: Any, dst: int) -> Handle:
        return self._req("MPI_Isend", lambda: self.comm.Isend(self._bytes(t), dest=dst, tag=_P2P_TAG), lambda: None)

    def recv(self, like: Any, src: int) -> Handle:
        return self._req("MPI_Irecv", lambda: self.comm.Irecv(self._bytes(like), source=src, tag=_P2P_TAG),
                         lambda: like)


__all__ = ["CUDA_AWARE_ENV", "MpiEngine", "cuda_aware", "mpiexec", "open_mpi"]
