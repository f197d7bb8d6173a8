"""`mallard vmem`: a process's virtual and resident memory by kind, with glibc's arena reservations explained."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

from .. import allocators as al
from .. import procinfo as pi
from ..common import (wants_command, EXIT_BAD_PID, EXIT_OK, EXIT_PROGRAM_FAILED, EXIT_USAGE, CliError, Table, alloc_opt,
                      allocator_for, check_conf, out, parse_conf, printable, shown, start_error, target_of, write_json)
from ..measure import exit_text

NAME = "vmem"
NEEDS_COMMAND = False


def register(sub) -> None:
    s = sub.add_parser("vmem", help="virtual and resident memory of a process, by kind",
                       usage="mallard vmem [options] PID  |  mallard vmem [-a NAME] [--ready REGEX | --delay S] "
                             "[options] -- CMD [ARGS...]")
    s.add_argument("pid", metavar="PID", nargs="?")
    alloc_opt(s, default_text="the program's own malloc: glibc's, or musl's for a musl program")
    s.add_argument("--delay", type=float, default=1.0, help="with a command: seconds before sampling (default 1)")
    s.add_argument("--ready", metavar="REGEX", help="with a command: sample once it prints a matching line")
    s.add_argument("--timeout", type=float, default=30.0, help="with --ready: seconds to wait (default 30)")
    s.add_argument("--show-output", action="store_true", help="with a command: copy its stdout")
    s.add_argument("--mappings", action="store_true", help="also list every mapping with its kind")
    s.add_argument("--top", type=int, default=20, help="rows in the arena table (default 20)")
    s.add_argument("--json", metavar="FILE", help="write the summary as JSON")


def run(args) -> int:
    if args.top < 1:
        raise CliError("--top must be at least 1", EXIT_USAGE)
    if wants_command(args, "vmem", "command"):
        return of_command(args)
    try:
        pid = pi.check_pid(args.pid)
        rep = pi.vmem(pid)
    except pi.ProcessError as e:
        raise CliError(str(e), EXIT_BAD_PID) from None
    report(rep, args)
    return EXIT_OK


def of_command(args) -> int:
    a = allocator_for(target_of(args.command), args.allocator or "default")  # musl programs: musl builds only
    conf = parse_conf(args.conf)
    check_conf(a, conf)
    env = al.preload_env(a, conf=conf)
    if args.delay < 0 or args.timeout <= 0:
        raise CliError("--delay must be at least 0 and --timeout positive", EXIT_USAGE)
    try:
        ready = re.compile(args.ready) if args.ready else None
    except re.error as e:
        raise CliError(f"--ready is not a valid regular expression: {e}", EXIT_USAGE) from None
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

    def gone() -> CliError:
        proc.wait()
        return CliError(f"the program exited ({exit_text(proc.returncode)}) before it could be sampled; "
                        "sample sooner (--delay) or make it wait (--ready)", EXIT_PROGRAM_FAILED)

    try:
        if ready is not None:
            seen.wait(args.timeout)
        else:
            deadline = time.monotonic() + args.delay
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.02)
        if proc.poll() is not None or pi.is_zombie(proc.pid):
            raise gone()
        if ready is not None and not seen.is_set():
            raise CliError(f"the program printed no line matching --ready {args.ready!r} within {args.timeout:g} s",
                           EXIT_PROGRAM_FAILED)
        try:
            rep = pi.vmem(proc.pid)
        except pi.ProcessError as e:
            try:
                proc.wait(1)  # an exiting process loses its memory just before it becomes a zombie
            except subprocess.TimeoutExpired:
                pass
            if proc.poll() is not None or pi.is_zombie(proc.pid):
                raise gone() from None
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
    report(rep, args, label=f"{' '.join(args.command)} under {a.name}")
    return EXIT_OK


def report(rep: pi.VmemReport, args, label: str | None = None) -> None:
    if args.json:
        data = {"pid": rep.pid, "label": printable(label) if label else None,
                "status": {k: rep.status.get(k) for k in ("VmPeak", "VmSize", "VmHWM", "VmRSS", "Threads")},
                "kinds": rep.totals, "allocator": rep.allocator.__dict__ if rep.allocator else None,
                "glibc_arena_heaps": [a.__dict__ for a in rep.arenas], "explanation": pi.explain_arenas(rep)}
        write_json(args.json, data)
    st = rep.status
    exe = rep.allocator.exe if rep.allocator and rep.allocator.exe else ""
    who = shown(label) if label else (shown(exe) if exe else "process")
    alloc = rep.allocator.allocator if rep.allocator and rep.allocator.allocator else "unknown"
    nt = rep.threads
    out.print(f"[bold]mallard vmem[/]: {who} (PID {rep.pid}, {nt} thread{'s' if nt != 1 else ''}, allocator: {alloc})")
    out.print(f"VIRT {pi.status_bytes(st, 'VmSize')} (peak {pi.status_bytes(st, 'VmPeak')}), "
              f"RSS {pi.status_bytes(st, 'VmRSS')} (peak {pi.status_bytes(st, 'VmHWM')})")
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
        t.add_row(shown(name), str(x["count"]), pi.fmt_bytes(x["virt"]), pi.fmt_bytes(x["rss"]),
                  pi.fmt_bytes(x["pss"]), pi.fmt_bytes(x["swap"]))
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
            out.print(shown(line))
    else:
        out.print("No glibc per-thread arena reservations (64 MiB-aligned heaps) found.")
    if args.mappings:
        t = Table(title="Mappings", title_justify="left")
        for c in ("start", "end", "perms", "kind", "VIRT", "RSS", "path"):
            t.add_column(c)
        for m in rep.mappings:
            t.add_row(f"{m.start:x}", f"{m.end:x}", m.perms, m.kind, pi.fmt_bytes(m.size), pi.fmt_bytes(m.rss),
                      shown(m.path))
        out.print(t)
