"""`mallard demo`: the quick start: profile a threaded Python reader, then compare allocators where they matter."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from .. import allocators as al
from ..common import EXIT_USAGE, CliError, out
from .bench import bench_and_report

NAME = "demo"
NEEDS_COMMAND = False


def register(sub) -> None:
    s = sub.add_parser("demo", help="compare every allocator on a threaded Python file reader (the quick start)")
    s.add_argument("-n", type=int, default=5, help="recorded rounds (default 5)")
    s.add_argument("--warmup", type=int, default=1, metavar="W")
    s.add_argument("--size-mb", type=float, default=50.0, help="size of the file the workload reads (default 50)")
    s.add_argument("--plot", metavar="FILE", default="results/demo.png", help="(default results/demo.png)")
    s.add_argument("--json", metavar="FILE")


def workload_path() -> Path:
    return Path(__file__).resolve().parent.parent / "workloads" / "threaded_reader.py"


def run(args) -> int:
    if args.n < 1 or args.warmup < 0 or not 0 < args.size_mb <= 4096:
        raise CliError("-n must be at least 1, --warmup at least 0 and --size-mb in (0, 4096]", EXIT_USAGE)
    allocs = al.discover()
    cmd = [sys.executable, str(workload_path()), "--size-mb", f"{args.size_mb:g}"]
    out.print(f"Comparing {', '.join(a.name for a in allocs)} on a Python program that reads a {args.size_mb:g} MB "
              "file line by line in 10 threads (2 threads each starting 5).")
    return bench_and_report(cmd, allocs, args.n, args.warmup, re.compile(r"elapsed: ([0-9.]+) s"),
                            "reader time (s)", False, args.plot, args.json, None, None,
                            title=f"python3 threaded_reader.py --size-mb {args.size_mb:g}")
