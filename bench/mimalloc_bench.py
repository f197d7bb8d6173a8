"""The mbench mode: mimalloc-bench's programs (built outside the repository) under every allocator, parsed and compared."""
from __future__ import annotations

import math
import os
import re
import shlex
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mbench_scaling  # the shared cell helpers (bench/ is on the path of the runner and of its tests)

# ---------------------------------------------------------------------------------------------------------------
# Parsers: each program's own figure from its standard output (ValueError when the line it must print is missing).

_NUM = r"([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)"


def parse_xmalloc(out: str) -> dict:
    """`rtime: 6.598, free/sec: 15.157 M`: frees per second (and the program's own rtime = 100 / M frees/s)."""
    m = re.search(r"free/sec:\s*" + _NUM + r"\s*M\b", out)
    if not m:
        raise ValueError("no 'free/sec: X M' line in xmalloc-test's output")
    res = {"free_per_s": float(m[1]) * 1e6}
    r = re.search(r"rtime:\s*" + _NUM, out)
    if r:
        res["rtime"] = float(r[1])
    return res


def parse_larson(out: str) -> dict:
    """`Throughput = 13929889 operations per second, relative time: 71.788s.`: operations per second."""
    m = re.search(r"Throughput\s*=\s*" + _NUM + r"\s+operations per second", out)
    if not m:
        raise ValueError("no 'Throughput = X operations per second' line in larson's output")
    res = {"ops_per_s": float(m[1])}
    r = re.search(r"relative time:\s*" + _NUM + r"\s*s", out)
    if r:
        res["relative_time"] = float(r[1])
    return res


def parse_glibc_thread(out: str) -> dict:
    """`95072402 iterations`: loop iterations of all threads together in its fixed 2 s."""
    m = re.search(r"^\s*([0-9]+) iterations\s*$", out, re.M)
    if not m:
        raise ValueError("no 'X iterations' line in glibc-thread's output")
    return {"iterations": int(m[1])}


def parse_rptest(out: str) -> dict:
    """`... 100 ops: ........1987413 memory ops/CPU second (23MiB peak, ...)`: memory operations per second of the
    threads' timed sections (rptest calls it "CPU second"; it times each section with CLOCK_MONOTONIC)."""
    m = re.search(_NUM + r" memory ops/CPU second", out)
    if not m:
        raise ValueError("no 'X memory ops/CPU second' line in rptest's output")
    res = {"ops_per_cpu_s": float(m[1])}
    p = re.search(r"\(([0-9]+)MiB peak", out)
    if p:
        res["own_peak_mib"] = int(p[1])
    return res


def parse_alloc_test(out: str) -> dict:
    """`2 threads made 200000000 alloc/dealloc operations in 9045 ms (...)`: operations and the program's own ms."""
    m = re.search(r"([0-9]+) threads made ([0-9]+) alloc/dealloc operations in ([0-9]+) ms", out)
    if not m:
        raise ValueError("no 'N threads made X alloc/dealloc operations in Y ms' line in alloc-test's output")
    return {"threads": int(m[1]), "ops": int(m[2]), "own_ms": int(m[3])}


def parse_nothing(out: str) -> dict:
    """Programs timed by their wall time print no figure of their own (mstress prints only what it starts)."""
    return {}


# ---------------------------------------------------------------------------------------------------------------
# Conversions to a time, lower is better: seconds per a fixed amount of work (for programs that run for a fixed time,
# the reciprocal of their throughput); the constants are mimalloc-bench's (bench.sh), so its charts compare.

def _per(work: float, rate: float | None, what: str) -> float:
    if not rate or rate <= 0:
        raise ValueError(f"no {what} completed")
    return work / rate


def xmalloc_time(m: dict) -> float:
    """Seconds per 100 million frees: 1e8 / frees per second (= xmalloc-test's own rtime)."""
    return _per(1e8, m.get("free_per_s"), "frees")


def larson_time(m: dict) -> float:
    """Seconds per 1e9 operations: 1e9 / operations per second (= larson's own 'relative time')."""
    return _per(1e9, m.get("ops_per_s"), "operations")


def glibc_thread_time(m: dict) -> float:
    """1e9 / iterations, as bench.sh: its run lasts a fixed 2 s, so this is half the seconds per 1e9 iterations."""
    return _per(1e9, m.get("iterations"), "iterations")


def rptest_time(m: dict) -> float:
    """Seconds per 2 million memory operations, as bench.sh: 2e6 / rptest's "memory ops/CPU second", which is wall time
    inside each thread's timed sections (CLOCK_MONOTONIC) summed over the threads: waits and preemptions there count."""
    return _per(2e6, m.get("ops_per_cpu_s"), "memory operations")


def _fig_xmalloc(m: dict) -> str:
    return f"{m['free_per_s'] / 1e6:.2f} M frees/s"


def _fig_larson(m: dict) -> str:
    return f"{m['ops_per_s'] / 1e6:.2f} M ops/s"


def _fig_glibc_thread(m: dict) -> str:
    return f"{m['iterations'] / 1e6:.1f} M iterations"


def _fig_rptest(m: dict) -> str:
    return f"{m['ops_per_cpu_s'] / 1e6:.3f} M ops/CPU s"


def _fig_alloc_test(m: dict) -> str:
    return f"{m['own_ms']:,.0f} ms (own timer)"


# ---------------------------------------------------------------------------------------------------------------
# The programs: standard arguments (mimalloc-bench's bench.sh; N = thread count) and how each one is read.

def _secs(run_s: float | None, standard: float) -> str:
    return f"{run_s if run_s else standard:g}"


def _whole_secs(run_s: float | None, standard: int) -> str:
    return str(max(1, round(run_s)) if run_s else standard)


@dataclass(frozen=True)
class Program:
    name: str
    args: Callable[[int, float | None], list]   # (N, --run-s) -> arguments
    threaded: bool                              # takes a thread count; otherwise runs once per cell list
    cross_thread: bool                          # objects are freed by other threads than the one that allocated them
    parse: Callable[[str], dict]
    time_of: Callable[[dict], float] | None     # figures -> time (lower is better); None: the run's wall time
    time_unit: str                              # the time column's unit, short
    what: str                                   # what the program does
    fixed_time: bool = False                    # runs for a set time: its wall time says nothing
    figure: Callable[[dict], str] | None = None  # its own figure, as the tables print it
    max_threads: int | None = None              # bench.sh's cap on N
    run_s_arg: str = ""                         # which argument --run-s sets ("" when none)
    conversion: str = "the run's wall time"     # how the time is made, in words


PROGRAMS: dict[str, Program] = {p.name: p for p in (
    Program("xmalloc-test", lambda n, r: ["-w", str(n), "-t", _secs(r, 5), "-s", "64"], True, True, parse_xmalloc,
            xmalloc_time, "s / 100 M frees",
            "N producer threads allocate 64 B objects, N consumer threads free them (2N threads)", fixed_time=True,
            figure=_fig_xmalloc, run_s_arg="-t (seconds, standard 5)",
            conversion="1e8 / frees per second: seconds per 100 M frees (= its own rtime)"),
    Program("larson", lambda n, r: [_whole_secs(r, 5), "8", "1000", "5000", "100", "4141", str(n)], True, True,
            parse_larson, larson_time, "s / 1e9 ops",
            "server simulation: threads replace random 8-1000 B objects, then hand their arrays to new threads",
            fixed_time=True, figure=_fig_larson, run_s_arg="1st (whole seconds, standard 5)",
            conversion="1e9 / operations per second: seconds per 1e9 operations (= its own relative time)"),
    Program("larson-sized", lambda n, r: [_whole_secs(r, 5), "8", "1000", "5000", "100", "4141", str(n)], True, True,
            parse_larson, larson_time, "s / 1e9 ops",
            "larson with sized delete (operator delete[](void*, size_t))", fixed_time=True, figure=_fig_larson,
            run_s_arg="1st (whole seconds, standard 5)",
            conversion="1e9 / operations per second: seconds per 1e9 operations"),
    Program("mstress", lambda n, r: [str(n), "50", "25"], True, True, parse_nothing, None, "wall s",
            "threads allocate and free objects of 2^k sizes and swap 25% of them through a shared transfer array"),
    Program("rptest", lambda n, r: [str(n), "0", "1", "2", "500", "1000", "100", "8", "16000"], True, True,
            parse_rptest, rptest_time, "thread s / 2 M ops",
            "rpmalloc's harness on malloc/free: random 8-16000 B, cross-thread rate 2 (wall ~16 s: built-in sleeps)",
            figure=_fig_rptest,
            conversion="2e6 / its memory operations per \"CPU second\" (as bench.sh): seconds per 2 M operations of its "
                       "threads' timed sections, wall time (CLOCK_MONOTONIC) summed over the threads, not CPU time"),
    Program("alloc-test", lambda n, r: [str(n)], True, False, parse_alloc_test, None, "wall s",
            "each thread: 100 M random alloc/free of items up to 1 KiB in its own working set", figure=_fig_alloc_test,
            max_threads=16),
    Program("cache-scratch", lambda n, r: [str(n), "1000", "1", "2000000", str(n)], True, False, parse_nothing, None,
            "wall s", "passive false sharing: each thread frees one object the main thread allocated, then works "
                      "on its own 1 B objects"),
    Program("cache-thrash", lambda n, r: [str(n), "1000", "1", "2000000", str(n)], True, False, parse_nothing, None,
            "wall s", "active false sharing: threads allocate and write their own 1 B objects"),
    Program("glibc-simple", lambda n, r: [], False, False, parse_nothing, None, "wall s",
            "glibc's malloc micro-benchmark: single-thread and thread-arena malloc/free of small blocks"),
    Program("glibc-thread", lambda n, r: [str(n)], True, False, parse_glibc_thread, glibc_thread_time,
            "1e9 / iterations", "N threads each malloc/free in their own working set for a fixed 2 s",
            fixed_time=True, figure=_fig_glibc_thread,
            conversion="1e9 / iterations of all threads in its fixed 2 s (as bench.sh)"),
    Program("malloc-large", lambda n, r: [], False, False, parse_nothing, None, "wall s",
            "one thread: large blocks of 5-25 MiB allocated and freed"),
)}
CROSS_THREAD = tuple(n for n, p in PROGRAMS.items() if p.cross_thread)


@dataclass
class MbCell:
    """One program at one thread count (threads None: a program that takes none): what every allocator runs."""
    workload: str
    threads: int | None
    args: list
    cross_thread: bool
    fixed_time: bool

    @property
    def id(self) -> str:
        return self.workload if self.threads is None else f"{self.workload}/t{self.threads}"


def plan(programs: list[str], threads: list[int], run_s: float | None) -> list[MbCell]:
    """Cells in the order of `programs`, thread counts ascending; a program without a thread count once; a count
    above a program's cap runs at the cap, once."""
    cells: list[MbCell] = []
    for name in programs:
        p = PROGRAMS[name]
        counts = sorted({min(t, p.max_threads) if p.max_threads else t for t in threads}) if p.threaded else [None]
        for t in counts:
            cells.append(MbCell(name, t, p.args(t or 1, run_s), p.cross_thread, p.fixed_time))
    return cells


def available(programs: list[str], mbench_dir: Path) -> tuple[list[str], list[str]]:
    """(programs present as executables in mbench_dir, messages for those that are not)."""
    have, skipped = [], []
    for name in programs:
        f = mbench_dir / name
        if f.is_file() and os.access(f, os.X_OK):
            have.append(name)
        else:
            skipped.append(f"{name}: not found in {mbench_dir}" if not f.exists() else f"{name}: {f} not executable")
    return have, skipped


def command_for(cell: MbCell, mbench_dir: Path) -> list[str]:
    return [str(mbench_dir / cell.workload), *cell.args]


def repro(cell: MbCell, alloc, mbench_dir: Path) -> str:
    """A shell line that reruns one cell under one allocator (in a scratch folder: rptest writes a file there)."""
    from mallard_cli import allocators as alloc_mod

    pre = f"LD_PRELOAD={shlex.quote(alloc.path)} " if alloc.path else ""
    var = alloc_mod.conf_variable(alloc, getattr(alloc, "conf", None))
    if var:
        pre += f"{var[0]}={shlex.quote(var[1])} "
    return "cd \"$(mktemp -d)\" && " + pre + " ".join(shlex.quote(a) for a in command_for(cell, mbench_dir))


def run_time(cell: MbCell | dict, run: dict) -> float | None:
    """The time of one successful run, lower is better: the converted figure, or the wall time."""
    name = cell.workload if isinstance(cell, MbCell) else cell["workload"]
    p = PROGRAMS[name]
    if p.time_of is None:
        return run.get("wall_s")
    return p.time_of(run.get("metrics") or {})


def run_once(cell: MbCell, alloc, mbench_dir: Path, timeout: float) -> dict:
    """One run of one cell under one allocator in a fresh scratch folder: wall, CPU, peak RSS and the program's own
    figures, or ok=False with the reason (crash, exit status, timeout, missing figure)."""
    from mallard_cli import allocators as alloc_mod
    from mallard_cli import measure

    env = alloc_mod.preload_env(alloc, dict(os.environ))
    rec = {"ok": False, "wall_s": None, "cpu_s": None, "max_rss_kib": None, "metrics": {}, "error": None}
    try:
        with tempfile.TemporaryDirectory(prefix="mallard-mbench-") as cwd:
            r = measure.run_measured(command_for(cell, mbench_dir), env, timeout=timeout, cwd=cwd)
        rec.update(wall_s=r.wall_s, cpu_s=r.user_s + r.sys_s, max_rss_kib=r.max_rss_kib)
        if r.returncode != 0:
            rec["error"] = f"{measure.exit_text(r.returncode)}: {(r.stderr.strip() or r.stdout.strip())[-400:]}"
            return rec
        rec["metrics"] = PROGRAMS[cell.workload].parse(r.stdout + "\n" + r.stderr)
        run_time(cell, rec)  # raises ValueError when the figure says no work was done
        rec["ok"] = True
    except subprocess.TimeoutExpired:
        rec["error"] = f"timed out after {timeout:g} s"
    except (ValueError, RuntimeError, OSError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    return rec


# ---------------------------------------------------------------------------------------------------------------
# Summary: medians, ratios to the best peer, geometric means.

def geomean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


GROUPS = ("all", "cross-thread", "other")


def summarize(raw: dict, peers: tuple) -> dict:
    """{"cells": {id: {program, threads, cross_thread, best_time(_peer), best_rss(_peer), per: {allocator: stats}}},
    "geomean": {allocator: {group: {time, rss, n, n_rss, cells}, failed}}, "mallard": [Mallard's variants]}; stats:
    ok/error, median time, wall, CPU, RSS (KiB), median figures, and time_ratio / rss_ratio to the best peer's median
    (the best among `peers` that succeeded in the cell)."""
    cells: dict = {}
    for c in raw["cells"]:
        per = {}
        for name in raw["allocators"]:
            per[name] = mbench_scaling.failed(c, name)
            if per[name] is not None:
                continue
            runs = c["runs"][name]
            keys = {k for r in runs for k, v in r["metrics"].items() if isinstance(v, (int, float))}
            per[name] = {
                "ok": True, "error": None, "runs": len(runs),
                "time": statistics.median(run_time(c, r) for r in runs),
                "wall": statistics.median(r["wall_s"] for r in runs),
                "cpu": statistics.median(r["cpu_s"] for r in runs),
                "rss": statistics.median(r["max_rss_kib"] for r in runs) if all(
                    r["max_rss_kib"] is not None for r in runs) else None,
                "metrics": {k: statistics.median(r["metrics"][k] for r in runs if k in r["metrics"]) for k in keys},
            }
        cell = {"program": c["workload"], "threads": c["threads"], "cross_thread": c["cross_thread"], "per": per}
        for metric in ("time", "rss"):
            best = mbench_scaling.rate(per, peers, metric)
            if best is None:
                continue
            cell[f"best_{metric}"], cell[f"best_{metric}_peer"] = best
            for s in per.values():
                if s["ok"] and s[metric]:
                    s[f"best_{metric}_peer"] = best[1]
        cells[c["id"]] = cell
    gm: dict = {}
    for name in raw["allocators"]:
        g = {"failed": sum(1 for cell in cells.values() if not cell["per"][name]["ok"])}
        for group in GROUPS:
            sel = [cell["per"][name] for cell in cells.values()
                   if group == "all" or cell["cross_thread"] == (group == "cross-thread")]
            tr = [s.get("time_ratio") for s in sel if s["ok"] and s.get("time_ratio")]
            rr = [s.get("rss_ratio") for s in sel if s["ok"] and s.get("rss_ratio")]
            g[group] = {"time": geomean(tr), "rss": geomean(rr), "n": len(tr), "n_rss": len(rr), "cells": len(sel)}
        gm[name] = g
    return {"cells": cells, "geomean": gm,
            "mallard": [n for n in raw["allocators"] if n.startswith("mallard")]}


# ---------------------------------------------------------------------------------------------------------------
# Markdown.

def _table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def _num(x: float | None) -> str:
    if x is None:
        return "–"
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"


def _ratio(x: float | None) -> str:
    return f"×{x:.2f}" if x else "–"


def _cell_title(cell: dict) -> str:
    t, group = cell["threads"], "cross-thread" if cell["cross_thread"] else "other"
    if t is None:
        return f"{cell['program']} ({group})"
    both = f"{2 * t} threads, " if cell["program"] == "xmalloc-test" else ""
    return f"{cell['program']}, N = {t} ({both}{group})"


def _cell_table(raw: dict, cell: dict) -> str:
    per = cell["per"]
    p = PROGRAMS[cell["program"]]
    best_t = min((s["time"] for s in per.values() if s["ok"]), default=None)
    best_r = min((s["rss"] for s in per.values() if s["ok"] and s["rss"]), default=None)
    rows = []
    for a in raw["allocators"]:
        s = per[a]
        if not s["ok"]:
            rows.append([a, "**FAIL**", "", "", "", "", "", (s["error"] or "")[:60].replace("|", "\\|")
                         .replace("\n", " ")])
            continue
        t = _num(s["time"])
        r = _num(s["rss"] / 1024) if s["rss"] else "–"
        if s["time"] == best_t:
            t = f"**{t}**"
        if s["rss"] and s["rss"] == best_r:
            r = f"**{r}**"
        fig = p.figure(s["metrics"]) if p.figure and s["metrics"] else "–"
        rows.append([a, t, _ratio(s.get("time_ratio")), r, _ratio(s.get("rss_ratio")), _num(s["wall"]),
                     _num(s["cpu"]), fig])
    return _table(["allocator", f"time ({p.time_unit})", "× best peer", "peak RSS (MiB)", "× best peer", "wall s",
                   "CPU s", "own figure"], rows)


def _geomean_table(raw: dict, summary: dict) -> str:
    rows = []
    for a in raw["allocators"]:
        g = summary["geomean"][a]
        row = [a]
        for group in GROUPS:
            row += [_ratio(g[group]["time"]) + f" ({g[group]['n']}/{g[group]['cells']})", _ratio(g[group]["rss"])]
        row.append(str(g["failed"]) if g["failed"] else "0")
        rows.append(row)
    return _table(["allocator", "time, all (cells)", "RSS, all", "time, cross-thread (cells)", "RSS, cross-thread",
                   "time, other (cells)", "RSS, other", "failed cells"], rows)


def _mallard_table(summary: dict, variant: str) -> str:
    rows = []
    for cid, cell in summary["cells"].items():
        s = cell["per"][variant]
        group = "cross-thread" if cell["cross_thread"] else "other"
        bt = f"{cell['best_time_peer']} {_num(cell['best_time'])}" if cell.get("best_time") else "–"
        br = f"{cell['best_rss_peer']} {_num(cell['best_rss'] / 1024)}" if cell.get("best_rss") else "–"
        if not s["ok"]:
            rows.append([cid, group, bt, "**FAIL**", "", br, "**FAIL**", ""])
            continue
        rows.append([cid, group, bt, _num(s["time"]), _ratio(s.get("time_ratio")), br,
                     _num(s["rss"] / 1024) if s["rss"] else "–", _ratio(s.get("rss_ratio"))])
    g = summary["geomean"][variant]
    for group in GROUPS:
        rows.append([f"**geomean, {group}**", "", "", "", f"**{_ratio(g[group]['time'])}** ({g[group]['n']} cells)",
                     "", "", f"**{_ratio(g[group]['rss'])}**"])
    return _table(["cell", "group", "best peer: time", f"{variant}: time", "× best peer", "best peer: RSS MiB",
                   f"{variant}: RSS MiB", "× best peer"], rows)


def markdown(raw: dict, summary: dict, level: int = 1, peers: tuple = ()) -> str:
    """The mbench report; `level` is the heading level of its title (1 for results.md, 2 inside a docs section)."""
    h = "#" * level
    m = raw["machine"]
    present_peers = [p for p in peers if p in raw["allocators"]]
    programs = list(dict.fromkeys(c["workload"] for c in raw["cells"]))
    threads = sorted({c["threads"] for c in raw["cells"] if c["threads"] is not None})
    out = [f"{h} mimalloc-bench programs: {len(programs)} programs at N = {', '.join(map(str, threads)) or '–'} "
           f"({raw['started']})", "",
           f"Machine: {m['cpu']}, {m['cores']} cores (os.cpu_count), {m['memory_gib']} GiB, kernel {m['kernel']}, "
           f"{m['os']}; compiler {m['compiler']}; git {m['git']}.", "",
           "Allocators: " + ", ".join(f"{n} {v['version']}" + (f" (`{v['path']}`)" if v["path"] else "")
                                      for n, v in m["allocators"].items()) + ".", "",
           f"Programs: `{raw['mbench_dir']}` (mimalloc-bench, built outside the repository). "
           f"Command: `{raw['command']}`", "",
           f"Method: every allocator runs each program at each thread count N, interleaved (A B C A B C …, the first "
           f"one rotating), {raw['repeats']} time(s), each run in a fresh scratch folder, the allocator "
           "preloaded (glibc: nothing preloaded). Time: lower is better — the wall time, or, for programs that run "
           "for a fixed time or report their own rate, seconds per a fixed amount of work derived from that rate "
           "(table below). ×: ratio to the best peer's median in that cell (" +
           (", ".join(present_peers) or "no peer in this run") + "), lower is better; the best median of a cell is "
           "bold. Peak RSS: median of the process's ru_maxrss. Wall and CPU (user + system) seconds are the whole "
           "process's. FAIL: a run crashed, timed out, exited non-zero or printed no figure; the cell's other "
           "allocators still count. Geometric means are over the cells where the allocator and at least one peer "
           "succeeded (the count in brackets).", "",
           _table(["program", "arguments", "group", "time (lower is better)", "what it does"],
                  [[n, "`" + (" ".join(next(c["args"] for c in raw["cells"] if c["workload"] == n)) or "(none)") + "`"
                    + (" (N)" if PROGRAMS[n].threaded else ""),
                    "cross-thread" if PROGRAMS[n].cross_thread else "other", PROGRAMS[n].conversion,
                    PROGRAMS[n].what] for n in programs]), ""]
    if threads and max(threads) > (m.get("cores") or 0):
        out += [f"Thread counts above {m['cores']} oversubscribe this machine's cores.", ""]
    if raw.get("skipped"):
        out += ["Skipped: " + "; ".join(raw["skipped"]) + ".", ""]
    out += [f"{h}# Geometric means of the ratios to the best peer", "", _geomean_table(raw, summary), ""]
    for v in summary["mallard"]:
        out += [f"{h}# {v} against the best peer, per cell", "", _mallard_table(summary, v), ""]
    out += [f"{h}# Per program and thread count", ""]
    for cid, cell in summary["cells"].items():
        out += [f"{h}## {_cell_title(cell)}", "", _cell_table(raw, cell), ""]
    fails = [(cid, a, s) for cid, cell in summary["cells"].items() for a, s in cell["per"].items() if not s["ok"]]
    if fails:
        out += [f"{h}# Failures", "", _table(["cell", "allocator", "failed runs", "error", "reproduce"], [
            [cid, a, f"{s['failed_runs']}/{s['runs']}", (s["error"] or "").replace("|", "\\|").replace("\n", " ")[:200],
             f"`{s.get('repro', '')}`"] for cid, a, s in fails]), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def console_summary(raw: dict, summary: dict) -> str:
    lines = ["geometric mean of time ratios to the best peer (all / cross-thread / other), RSS ratio (all):"]
    for a in raw["allocators"]:
        g = summary["geomean"][a]
        lines.append(f"  {a:<16}" + "  ".join(f"{g[k]['time']:.3f}" if g[k]["time"] else "  –  " for k in GROUPS)
                     + (f"   RSS {g['all']['rss']:.3f}" if g["all"]["rss"] else "   RSS –")
                     + (f"   ({g['failed']} failed)" if g["failed"] else ""))
    return "\n".join(lines)
