"""`mallard which PID | -- PROG`: which allocator serves a running process's malloc, or would serve a program's."""
from __future__ import annotations

import json

from .. import libc as lc
from .. import procinfo as pi
from ..common import (wants_command, EXIT_BAD_PID, EXIT_NOT_FOUND, EXIT_OK, CliError, Target, allocator_for, out,
                      printable, shown, target_of)

NAME = "which"
NEEDS_COMMAND = False


def register(sub) -> None:
    s = sub.add_parser("which", help="which allocator a running process (or a program) uses",
                       usage="mallard which [--json] PID  |  mallard which [--json] -- PROG")
    s.add_argument("pid", metavar="PID", nargs="?")
    s.add_argument("--json", action="store_true")


def run(args) -> int:
    if wants_command(args, "which", "program", " (mallard which -- /bin/busybox)"):
        return of_program(args)
    try:
        pid = pi.check_pid(args.pid)
        w = pi.which(pid)
    except pi.ProcessError as e:
        raise CliError(str(e), EXIT_BAD_PID) from None
    if w.allocator is None and not w.libraries and w.unreadable:
        raise CliError(w.reason, EXIT_BAD_PID)
    if args.json:
        print(json.dumps(w.__dict__, indent=2))
        return EXIT_OK
    who = f"PID {pid}" + (f" ({shown(w.exe)})" if w.exe else "")
    if w.allocator is None:
        out.print(f"{who}: {shown(w.reason)}")
    else:
        out.print(f"{who}: [bold]{w.allocator}[/]" + (" (traced by mallard-tracer)" if w.traced else ""))
        out.print(f"  {shown(w.reason)}")
    if w.ld_preload:
        out.print(f"  LD_PRELOAD={shown(w.ld_preload)}")
    return EXIT_OK


def mallard_hint(name: str) -> str | None:
    """How Mallard reaches a musl program (the musl build `mallard run` would preload, or why it cannot)."""
    t: Target = target_of([name])
    if not t.program.musl:
        return None
    if t.program.static:
        if t.program.linked == "mallard":
            return "linked in already (LD_PRELOAD cannot reach a static program)"
        return f"LD_PRELOAD cannot reach a static program; {lc.STATIC_HINT}"
    try:
        a = allocator_for(t, "mallard")
    except CliError as e:
        return str(e).split(": ", 1)[1] if ": " in str(e) else str(e)
    return f"`mallard run -- {printable(name)}` preloads Mallard's musl build {printable(a.path or '')}"


def of_program(args) -> int:
    name = args.command[0]
    try:
        w = pi.which_program(name)
    except pi.ProcessError as e:
        raise CliError(str(e), EXIT_NOT_FOUND) from None
    hint = mallard_hint(name)
    if args.json:
        print(json.dumps(dict(w.__dict__, mallard=hint), indent=2))
        return EXIT_OK
    who = shown(w.program) + (f" ({w.libc} program{', static' if w.static else ''})" if w.libc else "")
    if w.allocator is None:
        out.print(f"{who}: {shown(w.reason)}")
    else:
        out.print(f"{who}: [bold]{w.allocator}[/]")
        out.print(f"  {shown(w.reason)}")
    if w.ld_preload:
        out.print(f"  LD_PRELOAD={shown(w.ld_preload)}")
    if hint:
        out.print(f"  Mallard: {shown(hint)}")
    return EXIT_OK
