"""`mallard which PID`: which allocator serves a running process's malloc."""
from __future__ import annotations

import json

from .. import procinfo as pi
from ..common import EXIT_BAD_PID, EXIT_OK, CliError, out, shown

NAME = "which"
NEEDS_COMMAND = False


def register(sub) -> None:
    s = sub.add_parser("which", help="which allocator a running process uses")
    s.add_argument("pid", metavar="PID")
    s.add_argument("--json", action="store_true")


def run(args) -> int:
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
