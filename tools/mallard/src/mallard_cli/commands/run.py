"""`mallard run`: runs a program with an allocator preloaded; the program replaces the command."""
from __future__ import annotations

import os
import sys

from .. import allocators as al
from ..common import (EXIT_ERROR, alloc_opt, allocator_for, check_conf, default_allocator, err, parse_conf, shown,
                      start_error, target_of)

NAME = "run"
NEEDS_COMMAND = True


def register(sub) -> None:
    s = sub.add_parser("run", help="run a program with an allocator (LD_PRELOAD)",
                       usage="mallard run [-a NAME|PATH] [--conf K:V,...] [-v] -- CMD [ARGS...]")
    alloc_opt(s, default_text="mallard when found, else glibc")
    s.add_argument("-v", "--verbose", action="store_true", help="say which allocator is used (on stderr)")


def run(args) -> int:
    t = target_of(args.command)  # a musl program gets musl builds only, and Mallard's without -a
    if not t.program.musl:
        default_allocator(args, t.available())
    a = allocator_for(t, args.allocator)
    conf = parse_conf(args.conf)
    check_conf(a, conf)
    env = al.preload_env(a, conf=conf)
    if args.verbose:
        err.print(f"mallard: running with {a.name} ({shown(a.path or a.name + ' built-in')})")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(args.command[0], args.command, env)  # the program replaces us: its exit status is ours
    except OSError as e:
        raise start_error(args.command, e) from None
    return EXIT_ERROR  # not reached
