"""Every section of the book's programs (or those of ``--sections``) on every backend asked for, in
one process: ``python -m multidev.examples.d2l [--backend B] [--devices 2,4] [--json FILE]``."""
from __future__ import annotations

import importlib
import sys
from typing import Any

from . import SECTIONS
from .common import backends, device_counts, finish, parser, run_one, start


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__ or "")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    args = p.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    counts = device_counts(args.devices)
    md = start(counts)
    results: dict[str, dict[str, Any]] = {}
    names = backends(md, args.backend)
    for section in sections:
        module = importlib.import_module(f"{__package__}.{section}")
        results[section] = {name: run_one(md, section, module.run, name, counts, args) for name in names}
    return finish(results, args)


if __name__ == "__main__":
    sys.exit(main())
