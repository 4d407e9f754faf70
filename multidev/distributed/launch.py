"""Start N processes of a script on this machine, as an engine's launcher would::

    python -m multidev.distributed.launch -n 2 --engine jax train.py ARGS    # JAX's variables
    python -m multidev.distributed.launch -n 4 --engine torch train.py       # torchrun's
    python -m multidev.distributed.launch -n 3 --engine mpi train.py         # mpiexec -n 3

Each process gets the environment the engine's own launcher gives (:meth:`Engine.launch_env`: for
``jax``, ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``; for ``torch``,
torchrun's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``), with a free
port on 127.0.0.1; ``--engine mpi`` runs ``mpiexec -n N`` (:meth:`Engine.launch_command`). The
launcher waits for every process and exits with the first non-zero status (128 + N for a rank
killed by signal N, killing the rest after ``--grace`` seconds), so a failed rank fails the job;
it says on stderr which rank ended and how (its status, or the signal and what it usually means). Several
machines: set the variables on each, or use the engine's own launcher.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import time

from .engine import engine_class, engine_names

__all__ = ["free_port", "main", "start"]


#: The lowest port :func:`free_port` picks from below the system's ephemeral range.
_LOWEST = 20000


def _ephemeral_low() -> int | None:
    """The first port of the range the system hands to outgoing connections (Linux), or None."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago: one picked at random below the system's
    ephemeral range where that range is known and leaves room (the system hands ports of that range
    to every outgoing connection, so on a busy machine one free a moment ago may be taken before the
    rank that serves the rendezvous binds it), else one the system picks."""
    low = _ephemeral_low()
    if low is not None and low - _LOWEST >= 1000:
        pick = random.Random()
        for _ in range(32):
            port = pick.randrange(_LOWEST, low)
            with socket.socket() as s:
                try:
                    s.bind(("0.0.0.0", port))  # (free on every interface: so on 127.0.0.1, whatever a runtime binds)
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(engine: str, n: int, argv: list[str], *, env: dict[str, str] | None = None,
          options: list[str] | None = None, **popen: object) -> list[subprocess.Popen]:
    """Start ``n`` processes running ``argv`` with engine ``engine``'s launch environment (on top of
    ``env``, default this process's); returns them, rank order. An engine with its own launcher
    (MPI) gets one process: its launcher (``options`` are the launcher's own flags)."""
    cls = engine_class(engine)
    base = dict(os.environ if env is None else env)
    cmd = cls.launch_command(n, argv, options or [])
    if cmd is not None:
        return [subprocess.Popen(cmd, env=base, **popen)]  # type: ignore[call-overload]
    address = f"127.0.0.1:{free_port()}"
    procs = []
    for r in range(n):
        e = dict(base, **cls.launch_env(r, n, address))
        procs.append(subprocess.Popen(argv, env=e, **popen))  # type: ignore[call-overload]
    return procs


_VALUED = ("-n", "--nproc", "--engine", "--grace", "--launcher-option")


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The launcher's own arguments, and the command: from ``-m MODULE`` or the script on."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-m" or not a.startswith("-"):
            return argv[:i], argv[i:]
        i += 2 if a in _VALUED else 1
    return argv, []


def main(argv: list[str] | None = None) -> int:
    own, rest = _split(list(sys.argv[1:] if argv is None else argv))
    p = argparse.ArgumentParser(prog="python -m multidev.distributed.launch",
                                usage="%(prog)s -n N --engine ENGINE [options] (SCRIPT | -m MODULE) [ARGS...]",
                                description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("-n", "--nproc", type=int, required=True, help="number of processes")
    p.add_argument("--engine", required=True, help=f"whose launch environment ({', '.join(engine_names())})")
    p.add_argument("--grace", type=float, default=30.0, help="seconds the others get after one fails (default 30)")
    p.add_argument("--launcher-option", action="append", default=[], dest="options",
                   help="an option for the engine's own launcher (mpiexec), repeatable")
    a = p.parse_args(own)
    if a.nproc < 1:
        p.error("-n must be at least 1")
    if not rest or rest == ["-m"]:
        p.error("name the script to run (or -m MODULE)")
    cmd = [sys.executable, *rest]
    procs = start(a.engine, a.nproc, cmd, options=a.options)
    delegated = len(procs) == 1 and a.nproc > 1  # the engine's own launcher (mpiexec) runs the ranks
    names = (["the engine's launcher (its own message names the rank)"] if delegated
             else [f"rank {r}" for r in range(len(procs))])
    status = 0
    failed_at: float | None = None
    reported: set[int] = set()
    killed: list[int] = []
    while any(q.poll() is None for q in procs):
        for i, q in enumerate(procs):
            rc = q.poll()
            if rc not in (None, 0) and i not in reported:
                reported.add(i)
                if i not in killed:
                    _report(names[i], q, rc, a.grace if status == 0 else None)
                if status == 0:
                    status, failed_at = rc, time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > a.grace:
            for i, q in enumerate(procs):
                if q.poll() is None:
                    killed.append(i)
                    q.send_signal(signal.SIGKILL)
        time.sleep(0.05)
    for i, q in enumerate(procs):
        if q.returncode not in (None, 0) and i not in reported and i not in killed:
            _report(names[i], q, q.returncode, None)
        if q.returncode not in (None, 0) and status == 0:
            status = q.returncode
    if killed:
        print(f"multidev.distributed.launch: {', '.join(names[i] for i in killed)} still ran {a.grace:g} s after the "
              "first failure and were killed (SIGKILL)", file=sys.stderr, flush=True)
    return 0 if status == 0 else (status if status > 0 else 128 - status)


def _report(name: str, q: subprocess.Popen, rc: int, grace: float | None) -> None:
    """One line on stderr: which rank ended, how (its status or the signal, with what the signal
    usually means), and what happens to the others."""
    if rc < 0:
        try:
            sig = signal.Signals(-rc).name
        except ValueError:
            sig = f"signal {-rc}"
        hint = {"SIGKILL": " (killed from outside: the kernel's out-of-memory killer, a scheduler or a user)",
                "SIGSEGV": " (a crash in native code)", "SIGABRT": " (a runtime aborted it)",
                "SIGTERM": " (asked to stop from outside)"}.get(sig, "")
        how = f"was killed by {sig}{hint}"
    else:
        how = f"exited with status {rc}"
    then = (f"; the others get {grace:g} s (--grace) to finish, then are killed" if grace is not None else "")
    print(f"multidev.distributed.launch: {name} (pid {q.pid}) {how}{then}", file=sys.stderr, flush=True)

if __name__ == "__main__":
    sys.exit(main())
