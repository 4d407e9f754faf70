"""The ``multidev`` command: ``devices``, ``demo``, ``conformance``, and the subcommands other packages
add through the ``multidev.commands`` entry-point group (``bench`` comes from ``multidev.benchmarks``).

Every bad flag (an unknown or uninstalled backend, a device no backend has, a spelling that is no
device) ends in one line on stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from . import __version__
from .errors import MultidevError

COMMANDS_GROUP = "multidev.commands"


class _UsageError(Exception):
    pass


def _console() -> Any:  # rich is a dependency; keep its import off `import multidev`
    from rich.console import Console

    return Console()


def _split(s: str | None) -> list[str]:
    return [v.strip() for v in (s or "").split(",") if v.strip()]


def _backends(spec: str | None, default: Any = list) -> list[Any]:
    """The adapters named in ``spec`` (else the names ``default`` gives: a list, or a callable called
    only then, so a bad ``spec`` loads no framework), or a usage error: one line, or for an adapter
    that breaks the protocol its list of problems, one line each."""
    from . import registry
    from .errors import AdapterError

    out = []
    for n in _split(spec) or (default() if callable(default) else list(default)):
        try:
            out.append(registry.get_backend(n))
        except AdapterError as e:
            raise _UsageError(f"--backend {n}: {e}") from None
        except MultidevError as e:
            raise _UsageError(f"--backend {n}: {str(e).splitlines()[0]}") from None
    return out


def cmd_devices(args: argparse.Namespace) -> int:
    """A table of every installed backend's devices, side by side. Each backend is probed in a
    process of its own, all at once (the wall time is the slowest framework's start, not their
    sum), with the frameworks' start-up logs left out; the rows are kept in a cache keyed by the
    installed packages, the devices' environment variables and the GPUs the OS shows, so a second
    run reads them back (``--refresh`` probes again)."""
    from rich.markup import escape
    from rich.table import Table

    from . import registry

    names = _split(args.backend) or registry.registered_backends()
    rows = _device_rows(names, refresh=args.refresh)
    table = Table(title="multidev devices")
    for col in ("backend", "version", "devices", "GPUs", "capabilities"):
        table.add_column(col, justify="right" if col == "GPUs" else "left")
    rc = 0
    for n in names:
        row = rows[n]
        if "error" in row:
            table.add_row(n, "-", f"[dim]{escape(row['error'])}[/dim]", "-", "-")
            if args.backend:
                rc = 1
            continue
        table.add_row(n, row["version"], " ".join(row["devices"]), str(row["gpus"]), row["capabilities"])
    _console().print(table)
    if rows.get("_cached"):
        print("(read from the cache of an earlier probe: multidev devices --refresh probes again)", file=sys.stderr)
    return rc


def _probe_row(name: str) -> dict[str, Any]:
    """One backend's row of ``multidev devices``, made in this process."""
    from . import registry

    try:
        b = registry.get_backend(name)
        devs = b.devices()
    except Exception as e:  # noqa: BLE001 - an adapter that fails to load is reported, not fatal
        return {"error": _short(name, e)}
    c = b.capabilities
    caps = ", ".join(k for k, v in (("mutable", c.mutable), ("async", c.async_execution),
                                    ("pinned", c.pinned_memory), ("dlpack", b.dlpack is not None)) if v)
    if b.collectives is not None:
        caps += ", native allreduce"
    return {"version": b.version(), "devices": [str(d) for d in devs], "gpus": sum(d.is_gpu for d in devs),
            "capabilities": caps}


def _probe_main(name: str) -> None:
    """``python -m multidev.cli --probe NAME``: print one backend's row as JSON (for cmd_devices)."""
    import json

    print(json.dumps(_probe_row(name)))


def _device_cache_key() -> str:
    """What the device rows depend on: the interpreter, the installed distributions, the variables
    that choose or count devices, and the GPUs the OS exposes."""
    import glob
    import hashlib

    env = sorted((k, v) for k, v in os.environ.items()
                 if k.startswith(("MULTIDEV_", "CUDA_", "HIP_", "ROCR_", "XLA_", "JAX_", "TF_"))
                 and k != "TF_CPP_MIN_LOG_LEVEL")
    dists = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    gpus = sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/dri/render*") + glob.glob("/proc/driver/nvidia/gpus/*"))
    text = repr((sys.executable, __version__, env, dists, gpus))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _cache_file() -> Any:
    from pathlib import Path

    root = os.environ.get("MULTIDEV_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "multidev")
    return Path(root) / "devices.json"


def _device_rows(names: list[str], refresh: bool = False) -> dict[str, Any]:
    """Every backend's row: from the cache where it holds this key's row, else probed (all at once,
    each in its own process, so one framework's start neither delays nor disturbs another's)."""
    import json
    import subprocess

    key = _device_cache_key()
    path = _cache_file()
    cached: dict[str, Any] = {}
    if not refresh and os.environ.get("MULTIDEV_NO_CACHE") != "1":
        try:
            doc = json.loads(path.read_text())
            if doc.get("key") == key:
                cached = doc.get("rows", {})
        except (OSError, ValueError, AttributeError):
            cached = {}
    rows = {n: cached[n] for n in names if n in cached}
    todo = [n for n in names if n not in rows]
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up log, once per process otherwise
    procs = {n: subprocess.Popen([sys.executable, "-m", "multidev.cli", "--probe", n], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env) for n in todo}
    for n, pr in procs.items():
        try:
            out, err = pr.communicate(timeout=300)
            rows[n] = json.loads(out.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            pr.kill()
            pr.communicate()
            rows[n] = {"error": "not available: its framework did not start within 300 s"}
        except (ValueError, IndexError):
            last = (err or "").strip().splitlines()[-1:] or [f"exit status {pr.returncode}"]
            rows[n] = {"error": f"not available: the probe failed ({last[0][:100]})"}
    if todo and os.environ.get("MULTIDEV_NO_CACHE") != "1":
        keep = {n: r for n, r in {**cached, **rows}.items() if not r.get("error", "").startswith("not available: the")}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"key": key, "rows": keep}))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home: the rows are just not kept
    if not todo and rows:
        rows["_cached"] = True
    return rows


def _short(name: str, e: BaseException) -> str:
    """One clean line for a backend that cannot load: ``not installed: pip install "multidev[torch]"``
    where the registry's message carries an install command, else the reason, shortened."""
    import re

    s = " ".join(str(e).split())
    if "CuPy needs an NVIDIA GPU" in s:
        return "not available: needs an NVIDIA GPU with its driver (none here)"
    cmds = re.findall(r"`(pip install [^`]+)`", s)
    if cmds:
        return f"not installed: {' && '.join(cmds[:2])}"
    if "Install the package that provides" in s:
        return "not installed: install the package that provides this adapter and its framework"
    s = "not available: " + s.split(". Install")[0]
    return s if len(s) < 120 else s[:117] + "..."


def cmd_demo(args: argparse.Namespace) -> int:
    """D2L's GPU chapter in a few calls, on every installed backend, each line saying what it shows."""
    import numpy as np

    import multidev as md
    from multidev.registry import configure_virtual_devices

    if args.devices < 1:
        raise _UsageError(f"--devices must be at least 1, got {args.devices}")
    configure_virtual_devices(args.devices)  # before an adapter starts its framework (counts are fixed then)
    backs = _backends(args.backend, md.backends)  # names checked before any framework starts
    con = _console()
    for b in backs:
        n = b.name
        dev = md.try_gpu(backend=n)
        devs = md.devices(backend=n)
        x = md.ones((2, 3), device=dev, backend=n)
        same = md.to(x, dev) is x
        y = md.copy(x)
        parts = [md.asarray(np.full((2, 3), i + 1.0, dtype=np.float32), device=d, backend=n)
                 for i, d in enumerate(devs[:4])]
        total = md.allreduce(parts, op="sum")
        md.synchronize()
        terms = " + ".join(str(i + 1) for i in range(len(parts)))
        value = float(md.to_numpy(total[0])[0, 0])
        con.print(f"[bold]{n}[/bold] {b.version()}: try_gpu() -> {dev}; devices {', '.join(map(str, devs))}",
                  highlight=False)
        con.print(f"  to(x, {dev}) is x: {same} (already there: no copy); copy(x) is x: {y is x} "
                  "(copy always makes a new buffer)", highlight=False)
        one = "" if len(parts) > 1 else " (this backend has one CPU device here; GPUs give it more)"
        con.print(f"  allreduce over {len(parts)} device(s) -> {value:g} = {terms} on "
                  f"{', '.join(str(md.device_of(t)) for t in total)}{one}", highlight=False)
        con.print(f"  {_demo_compile(md, n, parts[-1])}", highlight=False)
    return 0


def _demo_compile(md: Any, name: str, x: Any) -> str:
    """One line: md.compile of a plain function on ``name``, its measured route and where it ran."""
    try:
        c = md.compile(lambda t: t * 2 + 1, backend=name)
        out = c(x)
    except MultidevError as e:
        return f"compile(lambda t: t * 2 + 1): {type(e).__name__}: {str(e).splitlines()[0][:110]}"
    import numpy as np

    ok = bool(np.allclose(md.to_numpy(out), md.to_numpy(x) * 2 + 1))
    how = (", ".join(f"{r} {t * 1e6:.0f} µs" for r, t in c.timings.items()) + " a call, measured") \
        if c.timings else "its only route"
    return f"compile(lambda t: t * 2 + 1) -> {c.route} ({how}); same values: {ok}, on {md.device_of(out)}"


def cmd_conformance(args: argparse.Namespace) -> int:
    """Run the shared conformance suite against one or more adapters."""
    try:
        import pytest
    except ImportError:
        raise _UsageError('multidev conformance needs pytest and hypothesis: '
                          'pip install "multidev[conformance]"') from None
    import importlib
    from pathlib import Path

    import multidev as md

    # The suite is a subpackage mapped from conformance_tests/ (pyproject), loaded by name here.
    conformance = importlib.import_module("multidev.conformance")
    plugin = importlib.import_module("multidev.conformance.plugin")

    for mod in args.import_:
        try:
            __import__(mod)
        except ImportError as e:
            raise _UsageError(f"--import {mod}: {e}") from None
    wanted = []
    for spec in _split(args.device):
        try:
            wanted.append(md.device(spec))
        except MultidevError as e:
            raise _UsageError(f"--device {spec}: {str(e).splitlines()[0]}") from None
    backend_arg = args.backend
    explicit = bool(args.backend) and args.backend != "all"
    if explicit or wanted:
        from multidev.registry import configure_virtual_devices, registered_backends

        # before any framework starts, as the suite would (module:attr adapters' hooks included)
        dotted = [n for n in _split(args.backend) if ":" in n]
        configure_virtual_devices(plugin.VIRTUAL_DEVICES, registered_backends() + dotted)
        # load now: an unknown backend is a one-line error
        specs = _split(args.backend) if explicit else md.backends()
        backs = _backends(args.backend, []) if explicit else [md.backend(n) for n in specs]
        if wanted:  # the specs as given: a module:attr adapter must load under that spec again
            backend_arg = ",".join(_with_devices(list(zip(specs, backs)), wanted, explicit))
    suite = str(Path(str(conformance.__file__)).parent)
    argv = [suite, "-p", "no:cacheprovider", f"--rootdir={suite}", "-o", "addopts="]
    argv.append(f"--multidev-backend={backend_arg}")
    if args.device:
        argv.append(f"--multidev-device={args.device}")
    if args.json:
        argv.append(f"--multidev-json={os.path.abspath(args.json)}")
    for mod in args.import_:
        argv.append(f"--multidev-import={mod}")
    for path in args.xfails:
        if not os.path.isfile(path):
            raise _UsageError(f"--xfails {path}: no such file")
        argv.append(f"--multidev-xfails={os.path.abspath(path)}")
    if args.write_xfails:
        argv.append(f"--multidev-write-xfails={os.path.abspath(args.write_xfails)}")
    if not args.multiprocess:
        argv += ["-m", "not multiprocess"]
    argv += ["-q", *list(args.pytest_args)]
    if "multidev.conformance.plugin" not in _loaded_plugins():
        argv = ["-p", "multidev.conformance.plugin", *argv]
    return int(pytest.main(argv))


def _with_devices(backs: list[tuple[str, Any]], wanted: list[Any], explicit: bool) -> list[str]:
    """The specs of the (spec, backend) pairs ``backs`` whose backend has at least one of the
    ``wanted`` devices. A backend named on the command line without any is a usage error (its device
    tests would have nothing to run on); of all installed backends, those without any are left out,
    said in one line on stderr."""
    keep, left = [], []
    for spec, b in backs:
        devs = b.devices()
        if any(d in devs for d in wanted):
            keep.append(spec)
        elif explicit:
            raise _UsageError(f"--device {','.join(map(str, wanted))}: {b.name} has none of these devices (it has "
                              f"{', '.join(map(str, devs))})")
        else:
            left.append(b.name)
    if not keep:
        raise _UsageError(f"--device {','.join(map(str, wanted))}: no installed backend has any of these devices")
    if left:
        print(f"multidev conformance: --device {','.join(map(str, wanted))}: leaving out {', '.join(left)} "
              "(none of these devices)", file=sys.stderr)
    return keep


def _loaded_plugins() -> set[str]:
    return {ep.value for ep in metadata.entry_points(group="pytest11")}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="multidev", description="One device layer for PyTorch, TensorFlow, JAX, "
                                "MXNet, CuPy, NumPy and any array-API library.")
    p.add_argument("--version", action="version", version=f"multidev {__version__}")
    sub = p.add_subparsers(dest="command")
    d = sub.add_parser("devices", help="list every installed backend's devices side by side")
    d.add_argument("--backend", help="comma-separated backends (default: all registered)")
    d.add_argument("--refresh", action="store_true", help="probe every backend again (not the cached rows)")
    d.set_defaults(fn=cmd_devices)
    m = sub.add_parser("demo", help="place, move, copy and allreduce on every installed backend")
    m.add_argument("--backend", help="comma-separated backends (default: all installed)")
    m.add_argument("--devices", type=int, default=2,
                   help="virtual CPU devices per backend where it can have them (default 2)")
    m.set_defaults(fn=cmd_demo)
    c = sub.add_parser("conformance", help="run the shared conformance suite against adapters")
    c.add_argument("--backend", default="all",
                   help="names, FAMILY:ARG (array_api:LIB: any array-API library), module:attr (an adapter "
                   "class or factory), comma-separated (default: all installed)")
    c.add_argument("--device", help="only these devices, e.g. cpu:0,gpu:0")
    c.add_argument("--json", help="write the pass/fail/skip matrix to this JSON file")
    c.add_argument("--import", dest="import_", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (for adapters it registers with multidev.register_backend)")
    c.add_argument("--multiprocess", action="store_true", help="include the multi-process (gloo) tests")
    c.add_argument("--xfails", action="append", default=[], metavar="FILE",
                   help="expected failures: one check id per line, # comments (array-api-tests' format); listed "
                   "checks that fail are reported as expected, those that pass as unexpected passes")
    c.add_argument("--write-xfails", metavar="FILE",
                   help="write the checks that failed in this run to FILE, in the --xfails format")
    c.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    c.set_defaults(fn=cmd_conformance)
    for ep in metadata.entry_points(group=COMMANDS_GROUP):
        try:
            ep.load()(sub)
        except Exception as e:  # noqa: BLE001 - a broken plug-in must not break the other commands
            broken = sub.add_parser(ep.name, help=f"(unavailable: {type(e).__name__})")
            broken.set_defaults(fn=_unavailable(ep.name, e))
    return p


def _unavailable(name: str, e: BaseException) -> Any:
    def fn(args: argparse.Namespace) -> int:
        raise _UsageError(f"{name} is unavailable: {type(e).__name__}: {e}")
    return fn


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if getattr(args, "fn", None) is None:
        args = p.parse_args(["devices"])
    try:
        return int(args.fn(args) or 0)
    except _UsageError as e:
        print(f"multidev {args.command or 'devices'}: {e}", file=sys.stderr)
        return 2
    except MultidevError as e:
        print(f"multidev {args.command or 'devices'}: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--probe":
        _probe_main(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
