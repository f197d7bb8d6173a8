"""`mallard stats PID`: the statistics report of a running process under Mallard, read from its memory."""
from __future__ import annotations

import sys

from .. import live
from .. import procinfo as pi
from ..common import EXIT_BAD_PID, EXIT_ERROR, EXIT_OK, CliError

NAME = "stats"
NEEDS_COMMAND = False


def register(sub) -> None:
    s = sub.add_parser("stats", help="statistics of a running process under Mallard (no restart)",
                       description="Print the report of mallard_stats_print for a process already running under "
                                   "Mallard, read from its memory without stopping it (a racy snapshot). Only the "
                                   "process's user or root can. See docs/STATS.md.")
    s.add_argument("pid", metavar="PID")
    s.add_argument("--json", action="store_true", help="the JSON report")
    s.add_argument("--no-arenas", action="store_true", help="leave out the per-arena lines")
    s.add_argument("--no-classes", action="store_true", help="leave out the per-class lines")


def target(pid_text: str) -> live.Target:
    """The process's Mallard root, or the one-line error (exit 4: the process; exit 1: not Mallard)."""
    try:
        pid = pi.check_pid(pid_text)
        live.check_access(pid)
        return live.locate(pid)
    except pi.ProcessError as e:
        raise CliError(str(e), EXIT_BAD_PID) from None
    except live.LiveError as e:
        raise error(e) from None


def error(e: live.LiveError) -> CliError:
    return CliError(str(e), EXIT_BAD_PID if e.kind == "pid" else EXIT_ERROR)


def run(args) -> int:
    t = target(args.pid)
    opts = ("a" if args.no_arenas else "") + ("b" if args.no_classes else "")
    try:
        text = live.report(t, as_json=args.json, opts=opts)
    except live.LiveError as e:
        raise error(e) from None
    sys.stdout.write(text)
    return EXIT_OK
