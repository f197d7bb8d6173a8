"""`mallard profile`: a program's allocator calls counted by the interposing tracer, or the tracer's own overhead."""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile

from .. import allocators as al
from .. import procinfo as pi
from .. import profile as pf
from ..common import (EXIT_ERROR, EXIT_OK, EXIT_PROGRAM_FAILED, CliError, Table, alloc_opt, allocator_for,
                      check_conf, out, parse_conf, printable, progress, shown, start_error, target_of, tracer_for,
                      write_json)
from ..measure import exit_text, run_measured
from ..spread import compare

NAME = "profile"
NEEDS_COMMAND = True


def register(sub) -> None:
    s = sub.add_parser("profile", help="count a program's allocator calls with the interposing tracer",
                       usage="mallard profile [-a NAME|PATH] [-o FILE.json] [--top N] [--overhead [-n N]] -- CMD [ARGS...]")
    alloc_opt(s, default_text="whatever the program would use")
    s.add_argument("-o", "--output", metavar="FILE.json", help="write the full report (every process record) as JSON")
    s.add_argument("--top", type=int, default=10, help="rows in the size and thread tables (default 10)")
    s.add_argument("--overhead", action="store_true",
                   help="measure the tracer's overhead instead: runs with and without it, interleaved")
    s.add_argument("-n", type=int, default=5, help="rounds for --overhead (default 5)")
    s.add_argument("--stdin", metavar="FILE", help="with --overhead: the input of every run (default: this command's "
                                                   "redirected standard input, read once and replayed)")


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def fmt_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:g} KiB" if n % 1024 == 0 else f"{n / 1024:.1f} KiB"
    return f"{n / (1 << 20):g} MiB" if n % (1 << 20) == 0 else f"{n / (1 << 20):.1f} MiB"


def run(args) -> int:
    if args.top < 1 or args.n < 1:
        raise CliError("--top and -n must be at least 1", 2)
    t = target_of(args.command)  # a musl program: the tracer's and Mallard's musl builds
    a = allocator_for(t, args.allocator) if args.allocator else None
    conf = parse_conf(args.conf)
    if a is not None:
        check_conf(a, conf)
    elif conf is not None:
        raise CliError("--conf needs -a mallard (or another Mallard variant): it sets MALLARD_CONF", 2)
    tracer = tracer_for(t)
    if args.overhead:
        return overhead(args, a, conf, tracer)
    try:
        prun = pf.run_traced(args.command, a, conf, tracer=tracer)
    except OSError as e:
        raise start_error(args.command, e) from None
    if not prun.records:
        raise CliError("the tracer wrote no record: the program may be statically linked, setuid, or "
                       f"{exit_text(prun.returncode)}", EXIT_ERROR)
    s = pf.summarise(prun.records)
    v = pf.verdict(s, prun.wall_s)
    report = {"command": [printable(c) for c in args.command], "allocator": (a.name if a else "default"),
              "exit_status": prun.returncode, "wall_s": prun.wall_s, "summary": s, "verdict": v,
              "processes": prun.records}
    if args.output:
        write_json(args.output, report)
    print_profile(s, v, prun, args)
    if args.output:
        out.print(f"Full report: {shown(args.output)}")
    rc = prun.returncode
    return rc if rc >= 0 else 128 - rc


def print_profile(s: dict, v: list[str], prun: pf.ProfileRun, args) -> None:
    w = out.print
    w(f"[bold]mallard profile[/]: {shown(' '.join(args.command))}  ({exit_text(prun.returncode)}, {prun.wall_s:.3f} s)")
    if s["processes"] > 1:
        procs = sorted(s["per_process"], key=lambda p: -p["calls"])
        shown_procs = procs[: args.top]
        t = Table(title=f"{s['processes']} process records (one per process image), busiest first",
                  title_justify="left")
        for c in ("pid", "ppid", "ended by", "calls", "calls/s", "threads", "peak live"):
            t.add_column(c, justify="left" if c == "ended by" else "right", no_wrap=True)
        t.add_column("command", no_wrap=True, overflow="ellipsis", max_width=48)
        for p in shown_procs:
            t.add_row(str(p["pid"]), str(p["ppid"]), shown(str(p["ended_by"])), f"{p['calls']:,}",
                      fmt_rate(p["calls_per_s"]), str(p["threads"]), pi.fmt_bytes(p["peak_live_bytes"]),
                      shown(p["cmdline"]))
        if len(procs) > len(shown_procs):
            rest = procs[len(shown_procs):]
            t.add_row("…", "", "", f"{sum(p['calls'] for p in rest):,}", "", "", "", f"{len(rest)} more processes")
        w(t)
    total = max(1, s["total_calls"])
    t = Table(title="Calls per function (all processes)", title_justify="left")
    t.add_column("function")
    t.add_column("calls", justify="right")
    t.add_column("share", justify="right")
    for f in pf.FUNCTIONS:
        n = s["calls"].get(f, 0)
        if n:
            t.add_row(f, f"{n:,}", f"{n / total:.1%}")
    t.add_row("[bold]total[/]", f"[bold]{s['total_calls']:,}[/]", "100%")
    w(t)
    t = Table(title=f"Most frequent exact sizes ({s['distinct_sizes']} distinct sizes)", title_justify="left")
    t.add_column("size (bytes)", justify="right")
    t.add_column("calls", justify="right")
    t.add_column("share of allocation calls", justify="right")
    t.add_column("by function")
    for e in s["top_sizes"][: args.top]:
        t.add_row(f"{e['size']:,}", f"{e['calls']:,}", f"{e['share']:.1%}",
                  ", ".join(f"{fn} {n:,}" for fn, n in sorted(e["by_function"].items(), key=lambda x: -x[1])))
    w(t)
    t = Table(title="Size histogram (allocation calls by size range)", title_justify="left")
    t.add_column("size range [low, high)", justify="right")
    t.add_column("calls", justify="right")
    t.add_column("share", justify="right")
    t.add_column("")
    ac = max(1, s["allocation_calls"])
    for r in s["size_ranges"]:
        rng = "0" if r["high"] == 0 else f"{fmt_size(r['low'])} – {fmt_size(r['high'] + 1)}"
        share = r["calls"] / ac
        t.add_row(rng, f"{r['calls']:,}", f"{share:.1%}", "█" * max(1, round(share * 40)))
    w(t)
    threads = s["busiest_threads"]
    nt = len(threads)
    t = Table(title=f"Per-thread calls (PID {s['busiest_pid']}, {nt} thread{'s' if nt != 1 else ''})",
              title_justify="left")
    t.add_column("tid", justify="right")
    t.add_column("calls", justify="right")
    t.add_column("by function")
    t.add_column("state")
    for th in threads[: args.top]:
        t.add_row(str(th["tid"]), f"{th['calls']:,}",
                  ", ".join(f"{k} {n:,}" for k, n in th.get("by_function", {}).items()),
                  "exited" if th.get("exited") else "running at exit")
    if len(threads) > args.top:
        t.add_row("…", f"{sum(x['calls'] for x in threads[args.top:]):,}", f"{len(threads) - args.top} more threads", "")
    w(t)
    w(f"Peak live: {pi.fmt_bytes(s['peak_live_bytes'])} in {s['peak_live_objects']:,} objects (usable sizes);  "
      f"rate: {fmt_rate(s['calls_per_s'])} calls/s over the busiest process's lifetime")
    w("[bold]Verdict[/]:")
    for line in v:
        w(f"  • {shown(line)}")


def overhead(args, a: al.Allocator | None, conf: str | None, tracer: str) -> int:
    """Runs the program with and without the tracer, interleaved, and reports the medians and their spread."""
    from ..stdin import replay_source

    base = al.preload_env(a, conf=conf) if a else dict(os.environ)
    plain, traced = [], []
    with replay_source(args.stdin) as stdin_path, progress() as prog:
        task = prog.add_task("overhead", total=2 * (args.n + 1))
        for rnd in range(args.n + 1):  # round 0 warms the caches and is not recorded
            for label, sink in (("without tracer", plain), ("with tracer", traced)):
                prog.update(task, description=f"round {rnd}: {label}")
                tmp = tempfile.mkdtemp(prefix="mallard-overhead-")
                try:
                    env = pf.tracer_env(str(tracer), None, tmp, base) if sink is traced else base
                    r = run_measured(args.command, env, stdin_path=stdin_path)
                except OSError as e:
                    raise start_error(args.command, e) from None
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                if r.returncode != 0:
                    raise CliError(f"the program failed {label} ({exit_text(r.returncode)})", EXIT_PROGRAM_FAILED)
                if rnd > 0:
                    sink.append(r.wall_s)
                prog.advance(task)
    mp, mt = statistics.median(plain), statistics.median(traced)
    t = Table(title=f"Tracer overhead: {shown(' '.join(args.command))} ({args.n} interleaved rounds)",
              title_justify="left")
    for c in ("run", "median wall (s)", "min – max (s)", "spread"):
        t.add_column(c, justify="right" if c != "run" else "left")
    for name, vals in (("without tracer", plain), ("with tracer", traced)):
        m = statistics.median(vals)
        t.add_row(name, f"{m:.3f}", f"{min(vals):.3f} – {max(vals):.3f}", f"±{(max(vals) - min(vals)) / 2 / m:.1%}")
    out.print(t)
    c = compare(traced, plain)
    if c.beyond_noise:
        out.print(f"Overhead: {mt / mp:.2f}x the untraced median ({(mt / mp - 1):+.1%}; ratio range "
                  f"{c.low:.2f}x–{c.high:.2f}x): the ranges of the runs do not overlap")
    else:
        out.print(f"Overhead: no measurable difference: the ranges of the runs overlap or the medians differ by less "
                  f"than 1% (median ratio {mt / mp:.2f}x, ratio range {c.low:.2f}x–{c.high:.2f}x)")
    if args.output:
        write_json(args.output, {"command": [printable(x) for x in args.command], "without": plain, "with": traced,
                                 "ratio": mt / mp, "ratio_range": [c.low, c.high], "beyond_noise": c.beyond_noise})
    return EXIT_OK
