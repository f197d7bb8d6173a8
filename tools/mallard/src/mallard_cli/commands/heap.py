"""`mallard heap`: runs a program with Mallard's sampling heap profiler and explains its pprof profile (show, diff,
flame graph)."""
from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from .. import allocators as al
from ..common import (EXIT_ERROR, EXIT_OK, EXIT_USAGE, CliError, Table, allocator_for, check_conf, err, out,
                      parse_conf, printable, shown, start_error, target_of)
from ..heapprof import flame as fl
from ..heapprof.pprof import Profile, ProfileError, load
from ..heapprof.sites import BY, Analysis, analyse, diff
from ..heapprof.symbolize import Frame
from ..measure import exit_text
from ..procinfo import fmt_bytes

NAME = "heap"
NEEDS_COMMAND = False  # `heap -- CMD` needs one, `heap show|diff|flame` must not have one: checked in run()

USAGE = ("mallard heap [--sample SIZE] [-o FILE.pb.gz] [--top N] [-a NAME|PATH] [--conf K:V,...] -- CMD [ARGS...]\n"
         "       mallard heap show FILE [--top N] [--by inuse|alloc] [--json]\n"
         "       mallard heap diff OLD NEW [--top N] [--by inuse|alloc] [--json]\n"
         "       mallard heap flame FILE -o OUT.svg [--by inuse|alloc]")
SIZE = re.compile(r"^[1-9][0-9]*[kmgKMG]?$")
# Options `mallard heap` sets itself; a user's value for them would send the profile elsewhere.
OWN_KEYS = ("prof", "prof_final", "prof_prefix")
STACK_DEPTH = 3  # callers shown after each site


def register(sub) -> None:
    s = sub.add_parser("heap", help="heap profile: which code holds the memory (sampled; pprof format)", usage=USAGE,
                       description="Without an action: run CMD under Mallard with heap profiling, then print its "
                                   "top allocation sites and write its profile.")
    s.add_argument("-a", "--allocator", metavar="NAME|PATH", default="mallard",
                   help="a Mallard build with heap profiling (default mallard)")
    s.add_argument("--conf", metavar="K:V,...", help="more Mallard options (MALLARD_CONF), e.g. prof_leak:true")
    s.add_argument("--sample", metavar="SIZE",
                   help="mean bytes allocated between samples (prof_sample; default Mallard's 512k), e.g. 8k, 1m")
    s.add_argument("-o", "--output", metavar="FILE.pb.gz",
                   help="where to write the profile (default ./mallard-heap.PID.pb.gz)")
    s.add_argument("--top", type=int, default=10, help="sites per table (default 10)")
    acts = s.add_subparsers(dest="action", metavar="ACTION", parser_class=type(s))
    sh = acts.add_parser("show", help="top allocation sites of a profile",
                         usage="mallard heap show FILE [--top N] [--by inuse|alloc] [--json]")
    sh.add_argument("file", metavar="FILE", help="profile (.pb.gz or plain .pb)")
    d = acts.add_parser("diff", help="growth between two profiles: the leak candidates",
                        usage="mallard heap diff OLD NEW [--top N] [--by inuse|alloc] [--json]")
    d.add_argument("old", metavar="OLD")
    d.add_argument("new", metavar="NEW")
    f = acts.add_parser("flame", help="flame graph (SVG) of a profile",
                        usage="mallard heap flame FILE -o OUT.svg [--by inuse|alloc]")
    f.add_argument("file", metavar="FILE")
    f.add_argument("-o", "--output", metavar="OUT.svg", required=True, help="the SVG file to write")
    for p in (sh, d, f):
        p.add_argument("--by", choices=sorted(BY), default="inuse",
                       help="live bytes at the dump (inuse, default) or bytes allocated since the start (alloc)")
    for p in (sh, d):
        p.add_argument("--top", type=int, default=10, help="rows (default 10)")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args) -> int:
    action = getattr(args, "action", None)
    if action and args.command:
        raise CliError(f"heap {action}: takes no command after --", EXIT_USAGE)
    if not action and not args.command:
        raise CliError("heap: no command after -- and no action (usage: mallard heap -- CMD [ARGS...], or "
                       "mallard heap show|diff|flame FILE)", EXIT_USAGE)
    if getattr(args, "top", 1) < 1:
        raise CliError("--top must be at least 1", EXIT_USAGE)
    if action == "show":
        return show(args)
    if action == "diff":
        return diff_cmd(args)
    if action == "flame":
        return flame_cmd(args)
    return profile_program(args)


# ---------------------------------------------------------------- reading and printing profiles


def read(path: str) -> Profile:
    try:
        return load(path)
    except FileNotFoundError:
        raise CliError(f"cannot read {printable(path)}: no such file", EXIT_ERROR) from None
    except IsADirectoryError:
        raise CliError(f"cannot read {printable(path)}: it is a directory", EXIT_ERROR) from None
    except OSError as e:
        raise CliError(f"cannot read {printable(path)}: {e.strerror or e}", EXIT_ERROR) from None
    except ProfileError as e:
        raise CliError(f"{printable(path)}: {e}", EXIT_ERROR) from None


def analysed(path: str, by: str) -> Analysis:
    prof = read(path)
    try:
        prof.index(by)
    except ProfileError as e:
        raise CliError(f"{printable(path)}: {e}", EXIT_ERROR) from None
    an = analyse(prof)
    for w in dict.fromkeys(an.warnings):
        err.print(f"[dim]mallard: {shown(w)}[/]")
    return an


def site_text(f: Frame) -> str:
    return shown(f.site())


def stack_text(callers: tuple[Frame, ...]) -> str:
    """The first callers, nearest first; a run of one frame (recursion) is shown once with its count."""
    runs: list[list] = []
    for c in callers:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    parts = [shown(c.site()) + (f" (×{n})" if n > 1 else "") for c, n in runs[:STACK_DEPTH]]
    more = sum(n for _, n in runs[STACK_DEPTH:])
    return " ← ".join(parts) + (f" ← … ({more} more)" if more > 0 else "")


def sites_table(an: Analysis, by: str, top: int, title: str) -> Table:
    sites = [s for s in an.sites(by) if s.values.get(by, 0) > 0]
    total = an.total(by)
    other = "alloc_space" if by == "inuse_space" else "inuse_space"
    objs = by.replace("_space", "_objects")
    t = Table(title=title, title_justify="left")
    t.add_column("#", justify="right")
    t.add_column("live bytes" if by == "inuse_space" else "allocated", justify="right", no_wrap=True)
    t.add_column("share", justify="right")
    t.add_column("blocks", justify="right")
    t.add_column("allocated" if by == "inuse_space" else "live bytes", justify="right", no_wrap=True)
    t.add_column("site (function file:line)")
    t.add_column("called from")
    for i, s in enumerate(sites[:top], 1):
        v = s.values.get(by, 0)
        t.add_row(str(i), fmt_bytes(v), f"{v / total:.1%}" if total > 0 else "", f"{s.values.get(objs, 0):,}",
                  fmt_bytes(s.values.get(other, 0)) if an.has(other) else "", site_text(s.frame),
                  stack_text(s.callers()))
    if len(sites) > top:
        rest = sites[top:]
        t.add_row("…", fmt_bytes(sum(s.values.get(by, 0) for s in rest)), "", "", "", f"{len(rest)} more sites", "")
    if not sites:
        t.add_row("", "", "", "", "", "(no sampled allocation)", "")
    return t


def totals_line(an: Analysis) -> str:
    parts = []
    if an.has("inuse_space"):
        parts.append(f"live {fmt_bytes(an.total('inuse_space'))}"
                     + (f" in {an.total('inuse_objects'):,} blocks" if an.has("inuse_objects") else ""))
    if an.has("alloc_space"):
        parts.append(f"allocated {fmt_bytes(an.total('alloc_space'))}"
                     + (f" in {an.total('alloc_objects'):,} blocks" if an.has("alloc_objects") else ""))
    rate = ""
    p = an.profile
    if p.period and p.period_type and p.period_type.unit == "bytes":
        rate = f" (estimates from {len(p.samples):,} sampled stacks, one sample per {fmt_bytes(p.period)} on average)"
    return "Totals: " + ", ".join(parts) + rate


def json_report(path: str, an: Analysis, by: str, top: int) -> dict:
    return {"file": printable(path), "by": by,
            "sample_types": [f"{s.type}/{s.unit}" for s in an.profile.sample_types],
            "period": an.profile.period,
            "totals": {t: an.total(t) for t in ("inuse_space", "inuse_objects", "alloc_space", "alloc_objects")
                       if an.has(t)},
            "sites": [s.as_json(STACK_DEPTH) for s in an.sites(by)[:top]],
            "warnings": list(dict.fromkeys(an.warnings))}


def show(args) -> int:
    by = BY[args.by]
    an = analysed(args.file, by)
    if args.json:
        print(json.dumps(json_report(args.file, an, by, args.top), indent=2))
        return EXIT_OK
    line(f"[bold]mallard heap show[/]: {shown(args.file)}")
    line(totals_line(an))
    what = "live bytes (inuse_space)" if by == "inuse_space" else "bytes allocated (alloc_space)"
    out.print(sites_table(an, by, args.top, f"Top allocation sites by {what}"))
    return EXIT_OK


def diff_cmd(args) -> int:
    by = BY[args.by]
    old, new = analysed(args.old, by), analysed(args.new, by)
    rows = diff(old, new, by)
    grew = [g for g in rows if g.delta > 0]
    told, tnew = old.total(by), new.total(by)
    if args.json:
        print(json.dumps({"old": printable(args.old), "new": printable(args.new), "by": by, "old_total": told,
                          "new_total": tnew, "growth": [
                              {"function": g.frame.function, "file": g.frame.file or None, "line": g.frame.line or None,
                               "old": g.old, "new": g.new, "delta": g.delta,
                               "objects_delta": g.new_objects - g.old_objects,
                               "stack": [c.site() for c in g.callers[:STACK_DEPTH]]} for g in grew[:args.top]]},
                         indent=2))
        return EXIT_OK
    what = "live bytes" if by == "inuse_space" else "bytes allocated"
    line(f"[bold]mallard heap diff[/]: {shown(args.old)} → {shown(args.new)}")
    line(f"Totals: {what} {fmt_bytes(told)} → {fmt_bytes(tnew)} ({'+' if tnew >= told else '-'}"
              f"{fmt_bytes(abs(tnew - told))})")
    if not grew:
        line(f"No site grew: no leak candidate between these two profiles ({by}).")
        return EXIT_OK
    t = Table(title=f"Leak candidates: sites whose {what} grew, largest growth first", title_justify="left")
    for c, j in (("#", "right"), ("growth", "right"), ("old", "right"), ("new", "right"), ("blocks", "right"),
                 ("site (function file:line)", "left"), ("called from", "left")):
        t.add_column(c, justify=j, no_wrap=c in ("growth", "old", "new"))
    for i, g in enumerate(grew[:args.top], 1):
        t.add_row(str(i), "+" + fmt_bytes(g.delta), fmt_bytes(g.old), fmt_bytes(g.new),
                  f"{g.new_objects - g.old_objects:+,}", site_text(g.frame), stack_text(g.callers))
    if len(grew) > args.top:
        rest = grew[args.top:]
        t.add_row("…", "+" + fmt_bytes(sum(g.delta for g in rest)), "", "", "", f"{len(rest)} more sites", "")
    out.print(t)
    return EXIT_OK


def flame_cmd(args) -> int:
    by = BY[args.by]
    an = analysed(args.file, by)
    unit = an.profile.sample_types[an.profile.index(by)].unit
    svg = fl.render(an, by, f"mallard heap flame: {printable(os.path.basename(args.file))}",
                    unit_is_bytes=unit == "bytes")
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(svg)
    except OSError as e:
        raise CliError(f"cannot write {printable(args.output)}: {e.strerror or e}", EXIT_ERROR) from None
    line(f"Flame graph of {by} ({fmt_bytes(an.total(by))}): {shown(args.output)} (open it in a browser; hover a "
              "frame for its bytes)")
    return EXIT_OK


# ---------------------------------------------------------------- running a program with the profiler


def merged_conf(user_env: str | None, user_opt: str | None, prefix: str, sample: str | None) -> str:
    """MALLARD_CONF for the run: the user's variable and --conf (minus the keys heap sets), then heap's own keys."""
    own = set(OWN_KEYS) | ({"prof_sample"} if sample else set())
    items = []
    for src in (user_env, user_opt):
        for item in (src or "").split(","):
            if item.strip() and item.split(":", 1)[0].strip() not in own:
                items.append(item.strip())
    items += ["prof:true", "prof_final:true", f"prof_prefix:{prefix}"]
    if sample:
        items.append(f"prof_sample:{sample}")
    return ",".join(items)


def has_profiler(lib: str | None) -> bool:
    """Whether the Mallard library knows the prof options (their names are in its option table)."""
    if not lib:
        return False
    try:
        with open(lib, "rb") as f:
            return b"prof_sample" in f.read()
    except OSError:
        return False


def collected(tmp: str, pid: int) -> tuple[str | None, bool, list[str]]:
    """(the profile to report, whether it is the final dump, the other profile files) of a run's dump folder."""
    files = sorted(glob.glob(os.path.join(tmp, "mallard.*.pb.gz")))
    final = os.path.join(tmp, f"mallard.{pid}.final.pb.gz")
    if final in files:
        return final, True, [f for f in files if f != final]
    seq = re.compile(re.escape(os.path.join(tmp, f"mallard.{pid}.")) + r"(\d+)\.pb\.gz$")
    numbered = sorted((int(m.group(1)), f) for f in files if (m := seq.match(f)))
    if numbered:
        last = numbered[-1][1]
        return last, False, [f for f in files if f != last]
    return None, False, files


def profile_program(args) -> int:
    a = allocator_for(target_of(args.command), args.allocator)  # musl programs: Mallard's musl build
    if not al.is_mallard(a):
        raise CliError(f"heap: profiling is Mallard's (-a mallard); {a.name} has no heap profiler that this command "
                       "reads", EXIT_USAGE)
    conf = parse_conf(args.conf)
    if args.sample is not None and not SIZE.match(args.sample):
        raise CliError(f"--sample expects a size such as 4096, 8k, 512k or 1m, got '{args.sample}'", EXIT_USAGE)
    output = args.output
    if output:
        d = os.path.dirname(os.path.abspath(output))
        if not os.path.isdir(d):
            raise CliError(f"cannot write {printable(output)}: no folder {printable(d)}", EXIT_ERROR)
    tmp = tempfile.mkdtemp(prefix="mallard-heap-")
    try:
        prefix = os.path.join(tmp, "mallard")
        if "," in prefix:
            raise CliError(f"the temporary folder {printable(tmp)} has a comma in its path, which MALLARD_CONF "
                           "cannot carry: set TMPDIR to another folder", EXIT_ERROR)
        full = merged_conf(os.environ.get("MALLARD_CONF"), conf, prefix, args.sample)
        check_conf(a, full)
        env = al.preload_env(a, conf=full)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            p = subprocess.Popen(args.command, env=env)
        except OSError as e:
            raise start_error(args.command, e) from None
        try:
            rc = p.wait()
        except KeyboardInterrupt:  # the program got the Ctrl-C too: let it finish its exit (and its dump)
            rc = p.wait()
        status = rc if rc >= 0 else 128 - rc
        found, final, others = collected(tmp, p.pid)
        if found is None:
            if rc < 0:
                err.print(f"[bold red]mallard:[/] heap: no profile: {shown(' '.join(args.command))} was "
                          f"{shown(exit_text(rc))} before it could write one (the final dump is written at exit; "
                          "prof_interval or prof_signal dump while it runs: see docs/PROFILING.md)")
                return status
            if a.path and not has_profiler(a.path):  # no path: Mallard linked into a static program
                raise CliError(f"heap: no profile was written: the Mallard library {printable(a.path or '')} has no "
                               "heap profiler (no 'prof' option); build a version that has one", EXIT_ERROR)
            raise CliError(f"heap: no profile was written ({exit_text(rc)}): the program may be statically linked or "
                           "set-user-ID (LD_PRELOAD and MALLARD_CONF do not reach it), may have ended with _exit(), or "
                           "may not allocate at all", EXIT_ERROR)
        dest = output or f"mallard-heap.{p.pid}.pb.gz"
        moved = place(found, dest, others)
        try:
            an = analyse(read(dest))
        except ProfileError as e:
            raise CliError(f"{printable(dest)}: {e}", EXIT_ERROR) from None
        report(args, an, rc, final, dest, moved)
        return status
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def place(found: str, dest: str, others: list[str]) -> list[str]:
    """Moves the reported profile to dest and the run's other dumps (children, periodic dumps) beside it."""
    stem = dest[:-len(".pb.gz")] if dest.endswith(".pb.gz") else dest
    moved = []
    try:
        shutil.move(found, dest)
        for o in others:
            target = f"{stem}.{os.path.basename(o)[len('mallard.'):]}"
            shutil.move(o, target)
            moved.append(target)
    except OSError as e:
        raise CliError(f"cannot write {printable(dest)}: {e.strerror or e}", EXIT_ERROR) from None
    return moved


def line(text) -> None:
    """One line of text, never wrapped (paths and commands stay whole for copying); tables go through out.print."""
    out.print(text, soft_wrap=True) if isinstance(text, str) else out.print(text)


def report(args, an: Analysis, rc: int, final: bool, dest: str, moved: list[str]) -> None:
    w = line
    w(f"[bold]mallard heap[/]: {shown(' '.join(args.command))}  ({shown(exit_text(rc))})")
    if not final:
        w("Note: the program did not write its final profile (it did not exit normally): this is its last periodic "
          "dump")
    for warning in dict.fromkeys(an.warnings):
        err.print(f"[dim]mallard: {shown(warning)}[/]")
    w(totals_line(an))
    if an.has("inuse_space"):
        w(sites_table(an, "inuse_space", args.top, "Top allocation sites by live bytes at exit (inuse_space)"))
    if an.has("alloc_space"):
        w(sites_table(an, "alloc_space", args.top, "Top allocation sites by bytes allocated (alloc_space)"))
    w(f"Profile: {shown(dest)}")
    if moved:
        w(f"Other dumps of this run (child processes, periodic dumps): {len(moved)}, beside it "
          f"({shown(os.path.basename(moved[0]))}{', …' if len(moved) > 1 else ''})")
    q = shown(shlex.quote(dest))
    w(f"Open it: go tool pprof -http=: {q}   (or: go tool pprof -top -sample_index=inuse_space {q}; "
      f"mallard heap show {q})")
