"""`mallard list`: the allocators available on this machine, with version and path; those for musl programs too."""
from __future__ import annotations

import json

from .. import allocators as al
from .. import libc as lc
from ..common import EXIT_OK, Table, out, shown

NAME = "list"
NEEDS_COMMAND = False


def register(sub) -> None:
    s = sub.add_parser("list", help="allocators available on this machine (and for its musl programs)")
    s.add_argument("--json", action="store_true", help="machine-readable output")


def musl_section() -> dict | None:
    """The allocators for musl programs, when musl is installed here or a musl build of Mallard is found."""
    loader = lc.musl_loader()
    m = lc.discover_musl(loader)
    if loader is None and len(m.allocs) == 1:
        return None
    tracer = lc.musl_tracer_path()
    return {"loader": loader, "allocators": [a.__dict__ for a in m.allocs],
            "left_out": [a.__dict__ for a in m.left_out], "tracer": str(tracer) if tracer else None,
            "looked_in": [str(d) for d in m.looked_in]}


def run(args) -> int:
    allocs = al.discover()
    musl = musl_section()
    if args.json:
        print(json.dumps({"allocators": [a.__dict__ for a in allocs], "missing": al.missing_common(allocs),
                          "musl": musl}, indent=2))
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
    if musl is not None:
        print_musl(musl)
    return EXIT_OK


def print_musl(musl: dict) -> None:
    where = f" ({shown(musl['loader'])})" if musl["loader"] else ""
    t = Table(title=f"For musl programs{where}: musl builds only", title_justify="left")
    t.add_column("name", style="bold")
    t.add_column("version")
    t.add_column("path (LD_PRELOAD)")
    for a in musl["allocators"]:
        t.add_row(a["name"], a["version"], shown(a["path"]) if a["path"]
                  else "(built into musl's libc: mallocng, nothing to preload)")
    out.print(t)
    if not any(a["name"].startswith("mallard") for a in musl["allocators"]):
        looked = ", ".join(musl["looked_in"][:3]) + (", ..." if len(musl["looked_in"]) > 3 else "")
        out.print(f"mallard for musl: not found (looked in {shown(looked)}); {shown(lc.BUILD_HINT)}")
    elif musl["tracer"] is None:
        out.print(f"mallard-tracer for musl (`mallard profile` of musl programs): not found; {shown(lc.BUILD_HINT)}")
    if musl["left_out"]:
        out.print("Not for musl programs: " + ", ".join(shown(a["name"]) for a in musl["left_out"]) +
                  " (built for glibc: a glibc library cannot be preloaded into a musl program)")
