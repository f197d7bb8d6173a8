"""`mallard advise`: tuning advice from a Mallard statistics dump, with its numbers and the line to try."""
from __future__ import annotations

import json

from .. import advise as adv
from ..common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, CliError, err, shown

NAME = "advise"
NEEDS_COMMAND = False


def register(sub) -> None:
    s = sub.add_parser("advise", help="tuning advice from a Mallard statistics dump (JSON)",
                       usage="mallard advise [--json] [--dump N | --pid PID] STATS.json")
    s.add_argument("dump", metavar="STATS.json",
                   help="output of mallard_stats_print(..., \"J\") or MALLARD_CONF=stats_print:true,stats_print_opts:J; "
                        "other text around the dump is ignored")
    s.add_argument("--json", action="store_true", help="print the advice as JSON")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--dump", dest="dump_n", type=int, metavar="N", help="with several dumps in the file: use the N-th (from 1)")
    g.add_argument("--pid", type=int, metavar="PID", help="with several dumps in the file: use that process's")


def run(args) -> int:
    try:
        dumps = adv.load_all(args.dump)
        chosen, why = adv.choose(dumps, args.dump_n, args.pid)
    except adv.BadDump as e:
        raise CliError(str(e), EXIT_ERROR) from None
    except adv.BadChoice as e:
        raise CliError(str(e), EXIT_USAGE) from None
    if len(dumps) > 1 or args.pid is not None:
        err.print(f"mallard advise: {shown(why)}", soft_wrap=True)
    items = adv.advise(chosen.data)
    if args.json:
        print(json.dumps({"dump": chosen.describe(), "advice": [a.__dict__ for a in items]}, indent=2))
    else:
        print(adv.render(items))
    return EXIT_OK
