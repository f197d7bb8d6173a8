"""`mallard list`: the allocators available on this machine, with version and path."""
from __future__ import annotations

import json

from .. import allocators as al
from ..common import EXIT_OK, Table, out, shown

NAME = "list"
NEEDS_COMMAND = False


def register(sub) -> None:
    s = sub.add_parser("list", help="allocators available on this machine")
    s.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    allocs = al.discover()
    if args.json:
        print(json.dumps({"allocators": [a.__dict__ for a in allocs], "missing": al.missing_common(allocs)}, indent=2))
        return EXIT_OK
    t = Table(title="Allocators on this machine", title_justify="left")
    t.add_column("name", style="bold")
    t.add_column("version")
    t.add_column("path (LD_PRELOAD)")
    for a in allocs:
        t.add_row(a.name, a.version, shown(a.path) if a.path else "(built into libc: nothing to preload)")
    out.print(t)
    if not any(a.name.startswith("mallard") for a in allocs):
        out.print(f"mallard: not found (looked in {shown(', '.join(str(d) for d in al.mallard_lib_dirs()[:3]))}); "
                  "build with: cmake -S . -B build -G Ninja && cmake --build build, or set MALLARD_LIBDIR")
    for name, hint in al.missing_common(allocs).items():
        out.print(f"{name}: not found; install with: {hint}")
    return EXIT_OK
