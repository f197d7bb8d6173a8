"""`mallard bench`: a program under several allocators, interleaved; time, CPU and peak RSS with their spread."""
from __future__ import annotations

import re
import statistics
from pathlib import Path

from rich import box

from .. import allocators as al
from .. import bench as bn
from ..common import (EXIT_ERROR, EXIT_OK, EXIT_PROGRAM_FAILED, EXIT_UNKNOWN_ALLOCATOR, EXIT_USAGE, CliError, Table,
                      allocator_for, err, out, parse_conf, printable, progress, shown, start_error, static_refusal,
                      target_of, write_json)
from ..spread import clear_winner, compare
from ..stdin import replay_source

NAME = "bench"
NEEDS_COMMAND = True


def register(sub) -> None:
    s = sub.add_parser("bench", help="compare allocators on a program: time, CPU, peak RSS",
                       usage="mallard bench [-a LIST] [-n N] [--warmup W] [--metric-from-output REGEX] [--plot FILE] "
                             "[--json FILE] [--timeout S] [--stdin FILE] -- CMD [ARGS...]")
    s.add_argument("-a", "--allocators", metavar="LIST", help="comma-separated names or paths (default: all found)")
    s.add_argument("-n", type=int, default=5, help="recorded rounds (default 5)")
    s.add_argument("--warmup", type=int, default=1, metavar="W", help="unrecorded warm-up rounds (default 1)")
    s.add_argument("--metric-from-output", metavar="REGEX",
                   help="a figure the program prints (first group of the first match in stdout, then stderr)")
    s.add_argument("--metric-name", default="metric", help="column name of that figure (default 'metric')")
    s.add_argument("--higher-is-better", action="store_true", help="the figure is a throughput, not a time")
    s.add_argument("--plot", metavar="FILE", help="draw the comparison (PNG, SVG or PDF by extension)")
    s.add_argument("--json", metavar="FILE", help="keep the raw results")
    s.add_argument("--timeout", type=float, help="seconds before a run is killed and counted as failed")
    s.add_argument("--conf", metavar="K:V,...", help="MALLARD_CONF for every run of Mallard's variants")
    s.add_argument("--stdin", metavar="FILE", help="the input of every run (default: this command's redirected "
                                                   "standard input, read once and replayed to each run)")


def run(args) -> int:
    t = target_of(args.command)
    if args.allocators:
        chosen = [allocator_for(t, n.strip()) for n in args.allocators.split(",") if n.strip()]
    elif t.program.musl and t.program.static:
        raise CliError(static_refusal(t, "so there is nothing to compare"), EXIT_UNKNOWN_ALLOCATOR)
    else:
        chosen = t.available()
        if t.program.musl and not any(al.is_mallard(a) for a in chosen):
            allocator_for(t, "mallard")  # no musl build of Mallard: says how to build one
    if not chosen:
        raise CliError("-a names no allocator", EXIT_USAGE)
    if args.n < 1 or args.warmup < 0:
        raise CliError("-n must be at least 1 and --warmup at least 0", EXIT_USAGE)
    if args.timeout is not None and args.timeout <= 0:
        raise CliError("--timeout must be a positive number of seconds", EXIT_USAGE)
    conf = parse_conf(args.conf)
    if conf is not None and not any(a.name.startswith("mallard") for a in chosen):
        raise CliError("--conf sets MALLARD_CONF, which only Mallard reads, and -a names no Mallard variant",
                       EXIT_USAGE)
    metric = None
    if args.metric_from_output:
        try:
            metric = re.compile(args.metric_from_output, re.M)
        except re.error as e:
            raise CliError(f"--metric-from-output is not a valid regular expression: {e}", EXIT_USAGE) from None
    notes, guide = [], None
    if t.program.musl and t.program.static:
        notes.append(f"{shown(t.name)} is {t.program.describe()}: only its own malloc can be timed (LD_PRELOAD does "
                     "not reach a static program)")
    elif t.program.musl:
        notes.append(f"{shown(t.name)} is a musl program: musl's own malloc (mallocng) is the baseline, and Mallard "
                     "runs as its musl build")
        left = [] if args.allocators else [a.name for a in t.left_out]
        if left:
            notes.append("Left out: " + ", ".join(shown(n) for n in left) + " (built for glibc: they cannot be "
                         "preloaded into a musl program)")
        guide = ["glibc"] + left
    with replay_source(args.stdin) as stdin_path:
        return bench_and_report(args.command, chosen, args.n, args.warmup, metric, args.metric_name,
                                args.higher_is_better, args.plot, args.json, args.timeout, conf,
                                title=" ".join(args.command), stdin_path=stdin_path, notes=notes,
                                libc=t.program.libc, guide_dashes=guide)


def _cell(vals: list[float], fmt: str) -> str:
    m = statistics.median(vals)
    return f"{m:{fmt}} ({min(vals):{fmt}}–{max(vals):{fmt}})"


def _ratio(vals: list[float], base: list[float]) -> str:
    """The median ratio and the range the runs allow (min/max .. max/min)."""
    c = compare(vals, base)
    return f"{c.ratio:.2f}x ({c.low:.2f}–{c.high:.2f})"


def guide_table(results, dashes: list[str], libc: str):
    """The timing table of the distribution guides (Alpaquita, Axiom): one row for the program's C library, a column
    per allocator with its median wall time (its own malloc first, then glibc's), "-" where one cannot serve it."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    t.add_column("", style="bold", no_wrap=True)
    cols = [(r.alloc.name, f"{statistics.median(r.values('wall_s')):.3f}" if r.runs else "FAILED") for r in results]
    cols += [(name, "-") for name in dashes]
    cols.sort(key=lambda c: (c[0] != libc, c[0] != "glibc"))  # stable: the rest keep their order
    for name, _ in cols:
        t.add_column(shown(name), justify="right", no_wrap=True)
    t.add_row(libc, *(cell for _, cell in cols))
    return t


def bench_and_report(cmd, chosen, n, warmup, metric, metric_name, higher, plot_path, json_path, timeout, conf,
                     title: str, stdin_path: str | None = None, base_env: dict | None = None,
                     notes: list[str] | None = None, libc: str | None = None,
                     guide_dashes: list[str] | None = None) -> int:
    """Runs the comparison and prints it; returns the exit code (results in the attribute last_verdict). notes: lines
    (markup) printed under the table; libc: the program's C library, kept in the JSON report; guide_dashes: for a musl
    program, the allocators that cannot serve it, shown as "-" in the distribution guides' one-row table."""
    for p in (plot_path, json_path):
        if p:
            try:
                Path(p).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise CliError(f"cannot create the folder of {p}: {e.strerror}", EXIT_ERROR) from None
    try:
        with progress() as prog:
            task = prog.add_task("bench", total=(n + warmup) * len(chosen))
            results = bn.run_bench(cmd, chosen, n, warmup, metric, timeout, conf, prog, task, base_env=base_env,
                                   stdin_path=stdin_path)
    except OSError as e:
        raise start_error(cmd, e) from None
    base = bn.baseline(results)
    ok = [r for r in results if r.failure is None and r.runs]
    title = printable(title)
    t = Table(title=f"mallard bench: {shown(title)}  ({n} interleaved round{'s' if n != 1 else ''}, {warmup} warm-up; "
                    "median (min–max); ratio: median (range the runs allow))", title_justify="left")
    t.add_column("allocator", style="bold", no_wrap=True)
    t.add_column("version", no_wrap=True)
    if metric is not None:
        t.add_column(shown(metric_name), justify="right")
        t.add_column("ratio", justify="right")
    t.add_column("wall (s)", justify="right")
    t.add_column("ratio", justify="right")
    t.add_column("CPU user+sys (s)", justify="right")
    t.add_column("peak RSS (MiB)", justify="right")
    t.add_column("ratio", justify="right")
    for r in results:
        if not r.runs:
            cols = ["—"] * (2 if metric is not None else 0) + ["—"] * 5
            t.add_row(shown(r.alloc.name), shown(r.alloc.version), *cols[:-1], "[red]FAILED[/]")
            continue
        row = [shown(r.alloc.name), shown(r.alloc.version)]
        if metric is not None:
            row += [_cell(r.metrics, ".3f"), _ratio(r.metrics, base.metrics)]
        rss = [x / 1024 for x in r.values("max_rss_kib")]
        row += [_cell(r.values("wall_s"), ".3f"), _ratio(r.values("wall_s"), base.values("wall_s")),
                _cell(r.values("cpu_s"), ".3f"), _cell(rss, ".1f"),
                _ratio(r.values("max_rss_kib"), base.values("max_rss_kib"))]
        if r.failure:
            row[0] += " [red](failed)[/]"
        t.add_row(*row)
    out.print(t)
    if base is not None:
        out.print(f"Ratios are to {shown(base.alloc.name)} (lower is better" +
                  (f"; for {shown(metric_name)} higher is better)" if metric is not None and higher else ")"))
    if guide_dashes is not None and ok:
        out.print("As in the distribution guides' table (median wall time in s; -: cannot serve this program):")
        out.print(guide_table(results, guide_dashes, libc or "musl"))
    for line in notes or []:
        out.print(line, soft_wrap=True)
    verdict = {}
    if len(ok) >= 1:
        what = metric_name if metric is not None else "wall time"
        key = "metric" if metric is not None else "wall_s"
        fast, why_f = clear_winner([(r.alloc.name, r.values(key)) for r in ok], higher and metric is not None)
        lean, why_l = clear_winner([(r.alloc.name, r.values("max_rss_kib")) for r in ok])
        if len(ok) == 1:
            pass
        elif fast:
            out.print(f"Fastest: [bold]{shown(fast)}[/] ({shown(what)}: {why_f})")
        else:
            out.print(f"Fastest: no measurable difference in {shown(what)} ({shown(why_f)}; more rounds with -n "
                      "may separate them)")
        if len(ok) > 1:
            if lean:
                m = statistics.median(next(r for r in ok if r.alloc.name == lean).values("max_rss_kib")) / 1024
                out.print(f"Leanest: [bold]{shown(lean)}[/] (peak RSS {m:.1f} MiB: {why_l})")
            else:
                out.print(f"Leanest: no measurable difference in peak RSS ({shown(why_l)})")
        verdict = {"fastest": fast, "fastest_why": why_f, "leanest": lean, "leanest_why": why_l}
    bench_and_report.last_verdict = verdict
    if json_path:
        data = bn.to_json([printable(c) for c in cmd], results, n, warmup, metric.pattern if metric else None)
        data["verdict"] = verdict
        if libc is not None:
            data["libc"] = libc
        write_json(json_path, data)
        out.print(f"Raw results: {shown(json_path)}")
    if plot_path and any(r.runs for r in results):
        try:
            bn.plot(results, plot_path, f"mallard bench: {title[:80]}", metric_name if metric is not None else None)
        except (OSError, ValueError) as e:
            raise CliError(f"cannot draw {plot_path}: {e}", EXIT_ERROR) from None
        out.print(f"Plot: {shown(plot_path)}")
    failed = [r for r in results if r.failure]
    for r in failed:
        err.print(f"[bold red]mallard:[/] the program failed under {shown(r.alloc.name)}: {shown(r.failure)}",
                  soft_wrap=True)
    return EXIT_PROGRAM_FAILED if failed else EXIT_OK
