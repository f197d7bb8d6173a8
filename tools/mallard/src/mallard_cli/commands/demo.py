"""`mallard demo`: the quick start: profile first (which sizes reach malloc, and why the allocator barely matters
for a pymalloc program), then compare allocators on the same reader with every object going to malloc."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from .. import allocators as al
from .. import profile as pf
from ..common import EXIT_OK, EXIT_USAGE, CliError, out, shown
from .bench import bench_and_report

NAME = "demo"
NEEDS_COMMAND = False


def register(sub) -> None:
    s = sub.add_parser("demo", help="the quick start: profile a threaded Python reader, then compare every allocator "
                                    "on it with PYTHONMALLOC=malloc")
    s.add_argument("-n", type=int, default=5, help="recorded rounds of the comparison (default 5)")
    s.add_argument("--warmup", type=int, default=1, metavar="W")
    s.add_argument("--size-mb", type=float, default=50.0, help="size of the file the workload reads (default 50)")
    s.add_argument("--plot", metavar="FILE", default="results/demo.png", help="(default results/demo.png)")
    s.add_argument("--json", metavar="FILE")


def workload_path() -> Path:
    return Path(__file__).resolve().parent.parent / "workloads" / "threaded_reader.py"


def _profile_step(cmd: list[str], env: dict, label: str) -> dict | None:
    """One traced run; prints the few figures that decide whether the allocator matters; None without the tracer."""
    try:
        prun = pf.run_traced(cmd, None, capture=True, base_env=env)
    except pf.TracerMissing:
        out.print("  (the tracer libmallard-tracer.so is not built or installed: profile step skipped)")
        return None
    if not prun.records:
        out.print(f"  (the tracer wrote no record for {label}: profile step skipped)")
        return None
    s = pf.summarise(prun.records)
    ac = max(1, s["allocation_calls"])
    small = sum(r["calls"] for r in s["size_ranges"] if r["high"] < 512)
    top = ", ".join(f"{e['size']:,} B ({e['share']:.0%})" for e in s["top_sizes"][:3])
    out.print(f"  {label}: {s['allocation_calls']:,} allocation calls, {s['calls_per_s']:,.0f} calls/s; "
              f"{small / ac:.0%} of them under 512 bytes; most frequent sizes: {top}")
    for line in pf.verdict(s, prun.wall_s)[:2]:
        out.print(f"    • {shown(line)}")
    return s


def run(args) -> int:
    if args.n < 1 or args.warmup < 0 or not 0 < args.size_mb <= 4096:
        raise CliError("-n must be at least 1, --warmup at least 0 and --size-mb in (0, 4096]", EXIT_USAGE)
    allocs = al.discover()
    size = f"{args.size_mb:g}"
    cmd = [sys.executable, str(workload_path()), "--size-mb", size]
    plain = dict(os.environ)
    plain.pop("PYTHONMALLOC", None)
    direct = dict(plain, PYTHONMALLOC="malloc")
    out.print(f"[bold]mallard demo[/]: a Python program that reads a {size} MB file line by line in 10 threads "
              "(2 threads each starting 5), as in the distribution malloc guides.")
    out.print("[bold]Step 1[/]: profile before switching: which allocations reach malloc at all? (mallard profile)")
    s1 = _profile_step(cmd, plain, "as Python runs it (pymalloc serves objects up to 512 bytes)")
    s2 = _profile_step(cmd, direct, "with PYTHONMALLOC=malloc (every object goes to malloc)")
    if s1 and s2:
        out.print(f"  With pymalloc, malloc sees {s1['allocation_calls']:,} calls; without it, "
                  f"{s2['allocation_calls']:,}: pymalloc keeps the small objects away from the allocator, so "
                  "switching allocators can only change this program when they reach it.")
    out.print(f"[bold]Step 2[/]: compare every allocator where it is called: the same reader with PYTHONMALLOC=malloc "
              f"({', '.join(a.name for a in allocs)}; interleaved rounds)")
    rc = bench_and_report(cmd, allocs, args.n, args.warmup, re.compile(r"elapsed: ([0-9.]+) s"),
                          "reader time (s)", False, args.plot, args.json, None, None,
                          title=f"PYTHONMALLOC=malloc python3 threaded_reader.py --size-mb {size}", base_env=direct)
    v = getattr(bench_and_report, "last_verdict", {}) or {}
    out.print("[bold]Reading it[/]:")
    if v.get("fastest"):
        out.print(f"  {shown(v['fastest'])} read fastest, beyond the spread of the runs. This is one program on one "
                  "machine: measure yours with `mallard bench -- CMD` before switching.")
    else:
        out.print("  No allocator is measurably faster here: the differences are within the spread of the runs "
                  "(see the ranges in the table), so this run cannot name a winner; more rounds (-n) narrow the "
                  "ranges.")
    if v.get("leanest"):
        out.print(f"  Peak memory does differ beyond noise: {shown(v['leanest'])} used the least.")
    out.print("  An allocator pays off when a program makes millions of malloc calls per second from several threads; "
              "find out with `mallard profile -- CMD` first.")
    return rc if rc != EXIT_OK else EXIT_OK
