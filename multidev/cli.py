"""The ``multidev`` command: ``devices``, ``demo``, ``conformance`` and ``bench``."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from . import __version__


def _console():  # rich is a dependency; keep its import off `import multidev`
    from rich.console import Console

    return Console()


def cmd_devices(args: argparse.Namespace) -> int:
    """A table of every installed backend's devices, side by side."""
    from rich.table import Table

    from . import registry

    names = args.backend.split(",") if args.backend else registry.registered_backends()
    table = Table(title="multidev devices")
    table.add_column("backend")
    table.add_column("version")
    table.add_column("devices")
    table.add_column("GPUs", justify="right")
    table.add_column("capabilities")
    rc = 0
    for n in names:
        try:
            b = registry.get_backend(n)
        except Exception as e:  # an adapter that fails to load is reported, not fatal
            from rich.markup import escape

            table.add_row(n, "-", f"[dim]{escape(_short(n, e))}[/dim]", "-", "-")
            if args.backend:
                rc = 1
            continue
        devs = b.devices()
        c = b.capabilities
        caps = ", ".join(k for k, v in (("mutable", c.mutable), ("async", c.async_execution),
                                        ("pinned", c.pinned_memory), ("dlpack", c.dlpack)) if v)
        if c.native_collectives:
            caps += ", native " + "/".join(sorted(c.native_collectives))
        table.add_row(n, b.version(), " ".join(map(str, devs)), str(sum(d.is_gpu for d in devs)), caps)
    _console().print(table)
    return rc


def _short(name: str, e: BaseException) -> str:
    s = str(e)
    if "No module named" in s:
        return f"not installed: pip install \"multidev[{name}]\""
    s = "not available: " + s.split(". Install")[0]
    return s if len(s) < 120 else s[:117] + "..."


def cmd_demo(args: argparse.Namespace) -> int:
    """D2L's GPU chapter in a few calls, on every installed backend."""
    import numpy as np

    import multidev as md

    con = _console()
    names = args.backend.split(",") if args.backend else md.backends()
    for n in names:
        dev = md.try_gpu(backend=n)
        devs = md.devices(backend=n)
        x = md.ones((2, 3), device=dev, backend=n)
        same = md.to(x, dev) is x
        y = md.copy(x)
        parts = [md.asarray(np.full((2, 3), i + 1.0, dtype=np.float32), device=d, backend=n) for i, d in enumerate(devs[:4])]
        total = md.allreduce(parts, op="sum")
        md.synchronize()
        con.print(f"[bold]{n}[/bold]: try_gpu() -> {dev}; devices {', '.join(map(str, devs))}")
        con.print(f"  to(x, {dev}) is x: {same}; copy(x) is x: {y is x}; "
                  f"allreduce over {len(parts)} device(s) -> {md.to_numpy(total[0])[0, 0]:g} "
                  f"on {', '.join(str(md.device_of(t)) for t in total)}")
    return 0


def cmd_conformance(args: argparse.Namespace) -> int:
    """Run the shared conformance suite against one or more adapters."""
    try:
        import pytest
    except ImportError:
        print("multidev conformance needs pytest and hypothesis: pip install \"multidev[conformance]\"",
              file=sys.stderr)
        return 2
    from pathlib import Path

    from . import conformance

    suite = str(Path(conformance.__file__).resolve().parent)
    argv = [suite, "-p", "no:cacheprovider", f"--rootdir={suite}", "-o", "addopts="]
    argv.append(f"--multidev-backend={args.backend}")
    if args.device:
        argv.append(f"--multidev-device={args.device}")
    if args.json:
        argv.append(f"--multidev-json={os.path.abspath(args.json)}")
    if not args.multiprocess:
        argv += ["-m", "not multiprocess"]
    argv += ["-q"] + list(args.pytest_args)
    if "multidev.conformance.plugin" not in _loaded_plugins():
        argv = ["-p", "multidev.conformance.plugin"] + argv
    return int(pytest.main(argv))


def _loaded_plugins() -> set[str]:
    from importlib import metadata

    return {ep.value for ep in metadata.entry_points(group="pytest11")}


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    return bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="multidev", description="One device layer for PyTorch, TensorFlow, JAX, MXNet and NumPy.")
    p.add_argument("--version", action="version", version=f"multidev {__version__}")
    sub = p.add_subparsers(dest="command")
    d = sub.add_parser("devices", help="list every installed backend's devices side by side")
    d.add_argument("--backend", help="comma-separated backends (default: all registered)")
    d.set_defaults(fn=cmd_devices)
    m = sub.add_parser("demo", help="place, move, copy and allreduce on every installed backend")
    m.add_argument("--backend", help="comma-separated backends (default: all installed)")
    m.set_defaults(fn=cmd_demo)
    c = sub.add_parser("conformance", help="run the shared conformance suite against adapters")
    c.add_argument("--backend", default="all", help="names or module:attr, comma-separated (default: all installed)")
    c.add_argument("--device", help="only these devices, e.g. cpu:0,gpu:0")
    c.add_argument("--json", help="write the pass/fail/skip matrix to this JSON file")
    c.add_argument("--multiprocess", action="store_true", help="include the multi-process (gloo) tests")
    c.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    c.set_defaults(fn=cmd_conformance)
    try:
        from . import bench
    except ImportError:
        bench = None  # type: ignore[assignment]
    if bench is not None:
        b = sub.add_parser("bench", help="compare frameworks side by side through multidev and natively")
        bench.add_arguments(b)
        b.set_defaults(fn=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if getattr(args, "fn", None) is None:
        args = p.parse_args(["devices"])
        rc = cmd_devices(args)
        return rc
    return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
