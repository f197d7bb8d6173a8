"""Entry point of the `mallard` command: argument parsing and the output of every subcommand."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as _RichTable

from . import __version__
from . import allocators as al
from . import bench as bn
from . import procinfo as pi
from . import profile as pf
from .measure import run_measured

# Exit codes (documented in docs/CLI.md).
EXIT_OK = 0
EXIT_ERROR = 1  # something else went wrong (e.g. no trace record, file not writable)
EXIT_USAGE = 2  # bad options or no command after --
EXIT_UNKNOWN_ALLOCATOR = 3
EXIT_BAD_PID = 4  # no such process, or its /proc files cannot be read
EXIT_PROGRAM_FAILED = 5  # bench/demo/vmem: the program failed (under at least one allocator)
EXIT_NOT_BUILT = 6  # the tracer library is not built
EXIT_CANNOT_EXECUTE = 126  # the program exists but cannot be executed
EXIT_NOT_FOUND = 127  # the program does not exist

NEEDS_COMMAND = {"run", "profile", "bench"}


def _console(stderr: bool = False) -> Console:
    c = Console(stderr=stderr, highlight=False, soft_wrap=False)
    if not c.is_terminal:
        cols = os.environ.get("COLUMNS", "")
        c.width = int(cols) if cols.isdigit() and int(cols) >= 60 else 140
    return c


out = _console()
err = _console(stderr=True)


class CliError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def fail(message: str, code: int) -> int:
    err.print(f"[bold red]mallard:[/] {message}", markup=True)
    return code


def start_error(cmd: list[str], e: OSError) -> CliError:
    """The error of a program that cannot start, with the shell's exit codes (127 not found, 126 not executable)."""
    code = EXIT_NOT_FOUND if isinstance(e, FileNotFoundError) else EXIT_CANNOT_EXECUTE
    return CliError(f"cannot run '{cmd[0]}': {e.strerror or e}", code)


def get_allocator(name: str | None, allocs: list[al.Allocator] | None = None) -> al.Allocator:
    try:
        return al.resolve(name or "glibc", allocs)
    except al.UnknownAllocator as e:
        raise CliError(str(e), EXIT_UNKNOWN_ALLOCATOR) from None


def parse_conf(conf: str | None) -> str | None:
    """--conf K:V,K:V is passed to Mallard as MALLARD_CONF; checks only its shape here."""
    if conf is None:
        return None
    for item in conf.split(","):
        if item and ":" not in item:
            raise CliError(f"--conf expects key:value pairs separated by commas, got '{item}'", EXIT_USAGE)
    return conf


# ---------------------------------------------------------------- list

def cmd_list(args) -> int:
    allocs = al.discover()
    if args.json:
        print(json.dumps({"allocators": [a.__dict__ for a in allocs], "missing": al.missing_common(allocs)}, indent=2))
        return EXIT_OK
    t = Table(title="Allocators on this machine", title_justify="left")
    t.add_column("name", style="bold")
    t.add_column("version")
    t.add_column("path (LD_PRELOAD)")
    for a in allocs:
        t.add_row(a.name, a.version, a.path or "(built into libc: nothing to preload)")
    out.print(t)
    if not any(a.name.startswith("mallard") for a in allocs):
        out.print(f"mallard: not built yet (looked in {', '.join(str(d) for d in al.mallard_lib_dirs()[:2])}); "
                  "build with: cmake -S . -B build -G Ninja && cmake --build build")
    missing = al.missing_common(allocs)
    for name, hint in missing.items():
        out.print(f"{name}: not found; install with: {hint}")
    return EXIT_OK


# ---------------------------------------------------------------- run / env

def default_allocator(args) -> None:
    """Without -a: Mallard when it is built, else glibc's malloc."""
    if args.allocator is None:
        args.allocator = "mallard" if any(x.name == "mallard" for x in al.discover()) else "glibc"


def cmd_run(args) -> int:
    default_allocator(args)
    a = get_allocator(args.allocator)
    env = al.preload_env(a, conf=parse_conf(args.conf))
    if args.verbose:
        err.print(f"mallard: running with {a.name} ({a.path or 'glibc built-in'})")
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(args.command[0], args.command, env)  # the program replaces us: its exit status is ours
    except OSError as e:
        raise start_error(args.command, e) from None
    return EXIT_ERROR  # not reached


def cmd_env(args) -> int:
    default_allocator(args)
    a = get_allocator(args.allocator)
    conf = parse_conf(args.conf)
    fmt = args.format
    lines: list[str] = []

    def section(title: str, body: list[str]) -> None:
        if fmt == "all":
            lines.append(f"# --- {title}")
        lines.extend(body)
        if fmt == "all":
            lines.append("")

    q = "'"
    if a.path is None:
        shell = ["unset LD_PRELOAD  # glibc's malloc is the default: preload nothing"]
        docker = ["# glibc's malloc is the default: no ENV line (remove any ENV LD_PRELOAD)"]
        systemd = ["# glibc's malloc is the default: remove any Environment=LD_PRELOAD line"]
    else:
        shell = [f'export LD_PRELOAD="{a.path}${{LD_PRELOAD:+:$LD_PRELOAD}}"']
        docker = [f"ENV LD_PRELOAD={a.path}"]
        systemd = [f"Environment=LD_PRELOAD={a.path}"]
    if conf:
        shell.append(f"export MALLARD_CONF={q}{conf}{q}")
        docker.append(f'ENV MALLARD_CONF="{conf}"')
        systemd.append(f"Environment=MALLARD_CONF={conf}")
    if fmt in ("all", "shell"):
        section("shell: this session (or ~/.bashrc)", shell)
    if fmt in ("all", "profile.d"):
        section(f"/etc/profile.d/{a.name}-malloc.sh: every login shell",
                [f"# enable {a.name} {a.version} for every program started from a login shell"] + shell)
    if fmt in ("all", "dockerfile"):
        section("Dockerfile", docker)
    if fmt in ("all", "systemd"):
        section("systemd unit ([Service] section)", systemd)
    sys.stdout.write("\n".join(lines).rstrip("\n") + "\n")
    return EXIT_OK


# ---------------------------------------------------------------- which

def cmd_which(args) -> int:
    try:
        pid = pi.check_pid(args.pid)
        w = pi.which(pid)
    except pi.ProcessError as e:
        raise CliError(str(e), EXIT_BAD_PID) from None
    if args.json:
        print(json.dumps(w.__dict__, indent=2))
        return EXIT_OK
    who = f"PID {pid}" + (f" ({w.exe})" if w.exe else "")
    if w.allocator is None:
        out.print(f"{who}: {w.reason}")
    else:
        out.print(f"{who}: [bold]{w.allocator}[/]" + (" (traced by mallard-tracer)" if w.traced else ""))
        out.print(f"  {w.reason}")
    if w.ld_preload:
        out.print(f"  LD_PRELOAD={w.ld_preload}")
    return EXIT_OK


# ---------------------------------------------------------------- profile

def Table(*a, **kw):  # noqa: N802 - rich's Table whose title never wraps
    title = kw.get("title")
    if title and "min_width" not in kw:
        kw["min_width"] = len(str(title)) + 2
    return _RichTable(*a, **kw)


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def cmd_profile(args) -> int:
    a = get_allocator(args.allocator) if args.allocator else None
    conf = parse_conf(args.conf)
    if args.overhead:
        return profile_overhead(args, a, conf)
    try:
        run = pf.run_traced(args.command, a, conf)
    except pf.TracerMissing as e:
        raise CliError(str(e), EXIT_NOT_BUILT) from None
    except OSError as e:
        raise start_error(args.command, e) from None
    if not run.records:
        return fail("the tracer wrote no record: the program may be statically linked, setuid, or killed by a signal "
                    f"(exit status {run.returncode})", EXIT_ERROR)
    s = pf.summarise(run.records)
    v = pf.verdict(s, run.wall_s)
    report = {"command": args.command, "allocator": (a.name if a else "default"), "exit_status": run.returncode,
              "wall_s": run.wall_s, "summary": s, "verdict": v, "processes": run.records}
    if args.output:
        try:
            with open(args.output, "w") as f:
                json.dump(report, f, indent=2)
                f.write("\n")
        except OSError as e:
            raise CliError(f"cannot write {args.output}: {e.strerror}", EXIT_ERROR) from None
    print_profile(s, v, run, args)
    if args.output:
        out.print(f"Full report: {args.output}")
    rc = run.returncode
    return rc if rc >= 0 else 128 - rc


def print_profile(s: dict, v: list[str], run: pf.ProfileRun, args) -> None:
    w = out.print
    w(f"[bold]mallard profile[/]: {' '.join(args.command)}  (exit status {run.returncode}, {run.wall_s:.3f} s)")
    if s["processes"] > 1:
        procs = sorted(s["per_process"], key=lambda p: -p["calls"])
        shown = procs[: args.top]
        t = Table(title=f"{s['processes']} process records (one per process image), busiest first",
                  title_justify="left")
        for c in ("pid", "ppid", "ended by", "calls", "calls/s", "threads", "peak live"):
            t.add_column(c, justify="left" if c == "ended by" else "right", no_wrap=True)
        t.add_column("command", no_wrap=True, overflow="ellipsis", max_width=48)
        for p in shown:
            t.add_row(str(p["pid"]), str(p["ppid"]), p["ended_by"], f"{p['calls']:,}", fmt_rate(p["calls_per_s"]),
                      str(p["threads"]), pi.fmt_bytes(p["peak_live_bytes"]), escape(p["cmdline"]))
        if len(procs) > len(shown):
            rest = procs[len(shown):]
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
        w(f"  • {line}")


def fmt_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:g} KiB" if n % 1024 == 0 else f"{n / 1024:.1f} KiB"
    return f"{n / (1 << 20):g} MiB" if n % (1 << 20) == 0 else f"{n / (1 << 20):.1f} MiB"


def profile_overhead(args, a: al.Allocator | None, conf: str | None) -> int:
    """Runs the program with and without the tracer, interleaved, and reports the medians."""
    tracer = al.tracer_path()
    if tracer is None:
        raise CliError("the tracer library libmallard-tracer.so is not built", EXIT_NOT_BUILT)
    base = al.preload_env(a, conf=conf) if a else dict(os.environ)
    plain, traced = [], []
    with _progress() as prog:
        task = prog.add_task("overhead", total=2 * (args.n + 1))
        for rnd in range(args.n + 1):  # round 0 warms the caches and is not recorded
            for label, sink in (("without tracer", plain), ("with tracer", traced)):
                prog.update(task, description=f"round {rnd}: {label}")
                tmp = tempfile.mkdtemp(prefix="mallard-overhead-")
                try:
                    env = pf.tracer_env(str(tracer), None, tmp, base) if sink is traced else base
                    r = run_measured(args.command, env)
                except OSError as e:
                    raise start_error(args.command, e) from None
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                if r.returncode != 0:
                    raise CliError(f"the program failed {label} (exit status {r.returncode})", EXIT_PROGRAM_FAILED)
                if rnd > 0:
                    sink.append(r.wall_s)
                prog.advance(task)
    mp, mt = statistics.median(plain), statistics.median(traced)
    t = Table(title=f"Tracer overhead: {' '.join(args.command)} ({args.n} interleaved rounds)", title_justify="left")
    for c in ("run", "median wall (s)", "min – max (s)"):
        t.add_column(c, justify="right" if c != "run" else "left")
    t.add_row("without tracer", f"{mp:.3f}", f"{min(plain):.3f} – {max(plain):.3f}")
    t.add_row("with tracer", f"{mt:.3f}", f"{min(traced):.3f} – {max(traced):.3f}")
    out.print(t)
    out.print(f"Overhead: {mt / mp:.2f}x the untraced median ({(mt / mp - 1):+.1%})")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"command": args.command, "without": plain, "with": traced, "ratio": mt / mp}, f, indent=2)
    return EXIT_OK


# ---------------------------------------------------------------- bench / demo

def _progress() -> Progress:
    return Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, transient=True, disable=not err.is_terminal)


def cmd_bench(args) -> int:
    allocs = al.discover()
    if args.allocators:
        chosen = [get_allocator(n.strip(), allocs) for n in args.allocators.split(",") if n.strip()]
    else:
        chosen = allocs
    if not chosen:
        raise CliError("-a names no allocator", EXIT_USAGE)
    if args.n < 1 or args.warmup < 0:
        raise CliError("-n must be at least 1 and --warmup at least 0", EXIT_USAGE)
    metric = None
    if args.metric_from_output:
        try:
            metric = re.compile(args.metric_from_output, re.M)
        except re.error as e:
            raise CliError(f"--metric-from-output is not a valid regular expression: {e}", EXIT_USAGE) from None
    return bench_and_report(args.command, chosen, args.n, args.warmup, metric, args.metric_name, args.higher_is_better,
                            args.plot, args.json, args.timeout, parse_conf(args.conf), title=" ".join(args.command))


def bench_and_report(cmd, chosen, n, warmup, metric, metric_name, higher, plot_path, json_path, timeout, conf,
                     title: str) -> int:
    for p in (plot_path, json_path):
        if p:
            Path(p).parent.mkdir(parents=True, exist_ok=True)
    try:
        with _progress() as prog:
            task = prog.add_task("bench", total=(n + warmup) * len(chosen))
            results = bn.run_bench(cmd, chosen, n, warmup, metric, timeout, conf, prog, task)
    except OSError as e:
        raise start_error(cmd, e) from None
    base = bn.baseline(results)
    fastest, leanest = bn.choices(results, metric is not None, higher)
    t = Table(title=f"mallard bench: {title}  ({n} interleaved round{'s' if n != 1 else ''}, {warmup} warm-up; median and min–max)",
              title_justify="left")
    t.add_column("allocator", style="bold", no_wrap=True)
    t.add_column("version", no_wrap=True)
    if metric is not None:
        t.add_column(metric_name, justify="right")
        t.add_column("ratio", justify="right")
    t.add_column("wall (s)", justify="right")
    t.add_column("ratio", justify="right")
    t.add_column("CPU user+sys (s)", justify="right")
    t.add_column("peak RSS (MiB)", justify="right")
    t.add_column("ratio", justify="right")

    def cell(vals: list[float], fmt: str) -> str:
        m = statistics.median(vals)
        return f"{m:{fmt}} ({min(vals):{fmt}}–{max(vals):{fmt}})"

    for r in results:
        if not r.runs:
            cols = ["—"] * (2 if metric is not None else 0) + ["—"] * 5
            t.add_row(r.alloc.name, r.alloc.version, *cols[:-1], "[red]FAILED[/]")
            continue
        row = [r.alloc.name, r.alloc.version]
        if metric is not None:
            row += [cell(r.metrics, ".3f"), f"{statistics.median(r.metrics) / statistics.median(base.metrics):.2f}x"]
        rss = [x / 1024 for x in r.values("max_rss_kib")]
        row += [cell(r.values("wall_s"), ".3f"), f"{r.med('wall_s') / base.med('wall_s'):.2f}x",
                cell(r.values("cpu_s"), ".3f"), cell(rss, ".1f"),
                f"{r.med('max_rss_kib') / base.med('max_rss_kib'):.2f}x"]
        if r.failure:
            row[0] += " [red](failed)[/]"
        t.add_row(*row)
    out.print(t)
    if base is not None:
        out.print(f"Ratios are to {base.alloc.name} (lower is better" +
                  (f"; for {metric_name} higher is better)" if metric is not None and higher else ")"))
    if fastest is not None:
        what = metric_name if metric is not None else "wall time"
        out.print(f"Fastest: [bold]{fastest.alloc.name}[/] (median {what}); "
                  f"leanest: [bold]{leanest.alloc.name}[/] (median peak RSS {leanest.med('max_rss_kib') / 1024:.1f} MiB)")
    if json_path:
        bn.dump_json(json_path, bn.to_json(cmd, results, n, warmup, metric.pattern if metric else None))
        out.print(f"Raw results: {json_path}")
    if plot_path and any(r.runs for r in results):
        bn.plot(results, plot_path, f"mallard bench: {title[:80]}", metric_name if metric is not None else None)
        out.print(f"Plot: {plot_path}")
    failed = [r for r in results if r.failure]
    for r in failed:
        err.print(f"[bold red]mallard:[/] the program failed under {r.alloc.name}: {r.failure}")
    return EXIT_PROGRAM_FAILED if failed else EXIT_OK


def workload_path() -> Path:
    return Path(__file__).resolve().parent / "workloads" / "threaded_reader.py"


def cmd_demo(args) -> int:
    allocs = al.discover()
    cmd = [sys.executable, str(workload_path()), "--size-mb", f"{args.size_mb:g}"]
    out.print(f"Comparing {', '.join(a.name for a in allocs)} on a Python program that reads a {args.size_mb:g} MB "
              "file line by line in 10 threads (2 threads each starting 5).")
    return bench_and_report(cmd, allocs, args.n, args.warmup, re.compile(r"elapsed: ([0-9.]+) s"),
                            "reader time (s)", False, args.plot, args.json, None, None,
                            title=f"python3 threaded_reader.py --size-mb {args.size_mb:g}")


# ---------------------------------------------------------------- vmem

def cmd_vmem(args) -> int:
    if args.command:
        return vmem_of_command(args)
    if not args.pid:
        raise CliError("vmem needs a PID or a command after --", EXIT_USAGE)
    try:
        pid = pi.check_pid(args.pid)
        rep = pi.vmem(pid)
    except pi.ProcessError as e:
        raise CliError(str(e), EXIT_BAD_PID) from None
    print_vmem(rep, args)
    return EXIT_OK


def vmem_of_command(args) -> int:
    a = get_allocator(args.allocator)
    env = al.preload_env(a, conf=parse_conf(args.conf))
    ready = re.compile(args.ready) if args.ready else None
    try:
        proc = subprocess.Popen(args.command, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as e:
        raise start_error(args.command, e) from None
    seen = threading.Event()

    def watch() -> None:
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            if args.show_output:
                sys.stdout.write(line)
            if ready is not None and ready.search(line):
                seen.set()
        seen.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        if ready is not None:
            seen.wait(args.timeout)
        else:
            deadline = time.monotonic() + args.delay
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.02)
        if proc.poll() is not None:
            raise CliError(f"the program exited (status {proc.returncode}) before it could be sampled; "
                           "sample sooner (--delay) or make it wait", EXIT_PROGRAM_FAILED)
        if ready is not None and not seen.is_set():
            raise CliError(f"the program printed no line matching --ready {args.ready!r} within {args.timeout:g} s",
                           EXIT_PROGRAM_FAILED)
        try:
            rep = pi.vmem(proc.pid)
        except pi.ProcessError as e:
            raise CliError(str(e), EXIT_PROGRAM_FAILED) from None
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(3)
            except (OSError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
    print_vmem(rep, args, label=f"{' '.join(args.command)} under {a.name}")
    return EXIT_OK


def print_vmem(rep: pi.VmemReport, args, label: str | None = None) -> None:
    if args.json:
        data = {"pid": rep.pid, "label": label, "status": {k: rep.status.get(k) for k in
                                                           ("VmPeak", "VmSize", "VmHWM", "VmRSS", "Threads")},
                "kinds": rep.totals, "allocator": rep.allocator.__dict__ if rep.allocator else None,
                "glibc_arena_heaps": [a.__dict__ for a in rep.arenas], "explanation": pi.explain_arenas(rep)}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    st = rep.status
    exe = rep.allocator.exe if rep.allocator and rep.allocator.exe else ""
    who = escape(label) if label else (escape(exe) if exe else "process")
    alloc = rep.allocator.allocator if rep.allocator and rep.allocator.allocator else "unknown"
    out.print(f"[bold]mallard vmem[/]: {who} (PID {rep.pid}, {rep.threads} threads, allocator: {alloc})")
    out.print(f"VIRT {st.get('VmSize', '?')} (peak {st.get('VmPeak', '?')}), RSS {st.get('VmRSS', '?')} "
              f"(peak {st.get('VmHWM', '?')})")
    t = Table(title="Memory by kind", title_justify="left")
    for c in ("kind", "mappings", "VIRT", "RSS", "PSS", "swap"):
        t.add_column(c, justify="left" if c == "kind" else "right")
    tv = tr = 0
    for key, name in pi.KINDS:
        x = rep.totals[key]
        if not x["count"]:
            continue
        tv += x["virt"]
        tr += x["rss"]
        t.add_row(escape(name), str(x["count"]), pi.fmt_bytes(x["virt"]), pi.fmt_bytes(x["rss"]), pi.fmt_bytes(x["pss"]),
                  pi.fmt_bytes(x["swap"]))
    t.add_row("[bold]total[/]", str(len(rep.mappings)), f"[bold]{pi.fmt_bytes(tv)}[/]", f"[bold]{pi.fmt_bytes(tr)}[/]",
              "", "")
    out.print(t)
    if rep.arenas:
        t = Table(title=f"glibc arena heaps: {len(rep.arenas)}", title_justify="left")
        for c in ("address", "reserved", "accessible", "PROT_NONE", "RSS"):
            t.add_column(c, justify="right")
        for a in rep.arenas[: args.top]:
            t.add_row(f"{a.start:#x}", pi.fmt_bytes(a.accessible + a.reserved), pi.fmt_bytes(a.accessible),
                      pi.fmt_bytes(a.reserved), pi.fmt_bytes(a.rss))
        out.print(t)
        for line in pi.explain_arenas(rep):
            out.print(line)
    else:
        out.print("No glibc per-thread arena reservations (64 MiB-aligned heaps) found.")
    if args.mappings:
        t = Table(title="Mappings", title_justify="left")
        for c in ("start", "end", "perms", "kind", "VIRT", "RSS", "path"):
            t.add_column(c)
        for m in rep.mappings:
            t.add_row(f"{m.start:x}", f"{m.end:x}", m.perms, m.kind, pi.fmt_bytes(m.size), pi.fmt_bytes(m.rss), escape(m.path))
        out.print(t)


# ---------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mallard", description="Run, profile, compare and explain memory allocators.",
                                epilog="Put the program after --, e.g. mallard run -a jemalloc -- ./server --port 80")
    p.add_argument("--version", action="version", version=f"mallard {__version__}")
    sub = p.add_subparsers(dest="sub", metavar="COMMAND")

    s = sub.add_parser("list", help="allocators available on this machine")
    s.add_argument("--json", action="store_true", help="machine-readable output")

    def alloc_opt(s, default=None, default_text=None):
        text = default_text or default
        s.add_argument("-a", "--allocator", metavar="NAME|PATH", default=default,
                       help="allocator name (see `mallard list`) or path to a .so" + (f" (default {text})" if text else ""))
        s.add_argument("--conf", metavar="K:V,...", help="Mallard options, passed as MALLARD_CONF")

    s = sub.add_parser("run", help="run a program with an allocator (LD_PRELOAD)",
                       usage="mallard run [-a NAME|PATH] [--conf K:V,...] [-v] -- CMD [ARGS...]")
    alloc_opt(s, default_text="mallard when built, else glibc")
    s.add_argument("-v", "--verbose", action="store_true", help="say which allocator is used (on stderr)")

    s = sub.add_parser("env", help="lines that enable an allocator in a shell, /etc/profile.d, a Dockerfile")
    alloc_opt(s, default_text="mallard when built, else glibc")
    s.add_argument("--format", choices=["all", "shell", "profile.d", "dockerfile", "systemd"], default="all")

    s = sub.add_parser("which", help="which allocator a running process uses")
    s.add_argument("pid", metavar="PID")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("profile", help="count a program's allocator calls with the interposing tracer",
                       usage="mallard profile [-a NAME|PATH] [-o FILE.json] [--top N] [--overhead [-n N]] -- CMD [ARGS...]")
    alloc_opt(s, default_text="whatever the program would use")
    s.add_argument("-o", "--output", metavar="FILE.json", help="write the full report (every process record) as JSON")
    s.add_argument("--top", type=int, default=10, help="rows in the size and thread tables (default 10)")
    s.add_argument("--overhead", action="store_true",
                   help="measure the tracer's overhead instead: runs with and without it, interleaved")
    s.add_argument("-n", type=int, default=5, help="rounds for --overhead (default 5)")

    s = sub.add_parser("bench", help="compare allocators on a program: time, CPU, peak RSS",
                       usage="mallard bench [-a LIST] [-n N] [--warmup W] [--metric-from-output REGEX] [--plot FILE] "
                             "[--json FILE] [--timeout S] -- CMD [ARGS...]")
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
    s.add_argument("--conf", metavar="K:V,...", help="MALLARD_CONF for every run")

    s = sub.add_parser("demo", help="compare every allocator on a threaded Python file reader (the quick start)")
    s.add_argument("-n", type=int, default=5, help="recorded rounds (default 5)")
    s.add_argument("--warmup", type=int, default=1, metavar="W")
    s.add_argument("--size-mb", type=float, default=50.0, help="size of the file the workload reads (default 50)")
    s.add_argument("--plot", metavar="FILE", default="results/demo.png", help="(default results/demo.png)")
    s.add_argument("--json", metavar="FILE")

    s = sub.add_parser("vmem", help="virtual and resident memory of a process, by kind",
                       usage="mallard vmem [options] PID  |  mallard vmem [-a NAME] [--ready REGEX | --delay S] "
                             "[options] -- CMD [ARGS...]")
    s.add_argument("pid", metavar="PID", nargs="?")
    alloc_opt(s, "glibc")
    s.add_argument("--delay", type=float, default=1.0, help="with a command: seconds before sampling (default 1)")
    s.add_argument("--ready", metavar="REGEX", help="with a command: sample once it prints a matching line")
    s.add_argument("--timeout", type=float, default=30.0, help="with --ready: seconds to wait (default 30)")
    s.add_argument("--show-output", action="store_true", help="with a command: copy its stdout")
    s.add_argument("--mappings", action="store_true", help="also list every mapping with its kind")
    s.add_argument("--top", type=int, default=20, help="rows in the arena table (default 20)")
    s.add_argument("--json", metavar="FILE", help="write the summary as JSON")

    s = sub.add_parser("advise", help="tuning advice from a Mallard statistics dump (JSON)",
                       usage="mallard advise [--json] STATS.json")
    s.add_argument("dump", metavar="STATS.json",
                   help="output of mallard_stats_print(..., \"J\") or MALLARD_CONF=stats_print:true,stats_print_opts:J")
    s.add_argument("--json", action="store_true", help="print the advice as JSON")
    return p


def cmd_advise(args) -> int:
    from . import advise as adv
    try:
        dump = adv.load(args.dump)
    except adv.BadDump as e:
        raise CliError(str(e), EXIT_ERROR) from None
    items = adv.advise(dump)
    if args.json:
        print(json.dumps([a.__dict__ for a in items], indent=2))
    else:
        print(adv.render(items))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command = command
    if args.sub is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.sub in NEEDS_COMMAND and not command:
        sub_usage = f"usage: mallard {args.sub} [options] -- CMD [ARGS...]"
        err.print(sub_usage, markup=False)
        err.print(f"mallard {args.sub}: no command after --", markup=False)
        return EXIT_USAGE
    handler = {"list": cmd_list, "run": cmd_run, "env": cmd_env, "which": cmd_which, "profile": cmd_profile,
               "bench": cmd_bench, "demo": cmd_demo, "vmem": cmd_vmem, "advise": cmd_advise}[args.sub]
    try:
        return handler(args)
    except CliError as e:
        return fail(str(e), e.code)
    except KeyboardInterrupt:
        return fail("interrupted", 130)


if __name__ == "__main__":
    sys.exit(main())
