#!/usr/bin/env python3
"""Benchmark runner: every workload under every allocator, interleaved repeats, medians, ratios, tables, plots, docs."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
try:
    from mallard_cli import allocators as alloc_mod
    from mallard_cli import measure
except ImportError:  # the venv lacks `pip install -e tools/mallard`: use the source tree directly
    sys.path.insert(0, str(REPO / "tools" / "mallard" / "src"))
    from mallard_cli import allocators as alloc_mod
    from mallard_cli import measure

import mbench_programs  # noqa: E402
import mbench_report  # noqa: E402
import mbench_scaling  # noqa: E402
import mimalloc_bench  # noqa: E402
import musl_static  # noqa: E402

# The peers Mallard is compared against; "best peer" is the fastest (or leanest) of these in each cell.
PEERS = ("glibc", "jemalloc", "mimalloc", "tcmalloc")
# Mallard's variants compared by default (others, e.g. a no-statistics build, only with --allocators).
MALLARD = ("mallard", "mallard-secure")
MODES = ("smoke", "quick", "full", "scaling", "mbench", "musl")
REPEATS = {"smoke": 1, "quick": 3, "full": 5, "scaling": 3, "mbench": 3, "musl": 3}
TIMEOUT_S = {"smoke": 60, "quick": 60, "full": 180, "scaling": 180, "mbench": 300, "musl": 60}
# The scaling mode's workloads: every one moves objects between threads.
SCALING_WORKLOADS = ("xstorm", "server", "localremote", "larson", "succession", "prodcons")


def rss_floor_note(helper: str | None) -> str | None:
    """What the peak RSS figures mean when mallard-measure (built with tools/tracer) is missing (None when it is
    there): each program is then forked from this Python process, whose high-water mark Linux keeps in the
    program's ru_maxrss (run.py and mbench_rounds.py warn with it)."""
    if helper:
        return None
    return ("no mallard-measure (build/bin, carry build/ to a lent machine): every peak RSS is at least this Python "
            "process's own (tens of MiB), so smaller peaks are hidden and their ratios read 1.00")


@dataclass
class Cell:
    """One workload at one thread count: the unit that every allocator runs, repeatedly and interleaved."""
    workload: str
    threads: int
    kind: str                      # "c" (a mallard-bench-* program), "py", "sqlite" or "redis"
    args: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    stresses: str = ""             # what the workload exercises: used to explain where an allocator is behind
    timed: bool = True             # False: a memory-only study whose time is not a speed figure
    figures: tuple = ()            # the workload's own RESULT fields worth tabulating
    fixed_time: bool = False       # runs for a set time: its time figures are per million of its operations

    @property
    def id(self) -> str:
        return f"{self.workload}/t{self.threads}"


def thread_counts(mode: str) -> list[int]:
    """1, 2 and 4 threads here; on machines with more cores, powers of two up to the core count as well
    (scaling: powers of two up to 8 or the core count, whichever is more)."""
    if mode == "smoke":
        return [2]
    if mode == "quick":
        return [2]
    cores = os.cpu_count() or 1
    if mode == "scaling":
        top = max(8, cores)
        return [1 << i for i in range(top.bit_length()) if 1 << i <= top]
    counts = [1, 2, 4]
    t = 8
    while t <= cores:
        counts.append(t)
        t *= 2
    return counts


def plan(mode: str, data_dir: Path, only: list[str] | None = None, threads: list[int] | None = None) -> list[Cell]:
    """The cells of a mode with their parameters; sizes are picked so quick < 3 min and full < 25 min on 2 cores."""
    tc = threads or thread_counts(mode)
    many = [t for t in tc if t >= 2] or [2]
    # (smoke, quick, full) scale: smoke is the CI check, tiny and untimed.
    s = {"smoke": 0, "quick": 1, "full": 2}[mode]

    def pick(smoke, quick, full):
        return (smoke, quick, full)[s]

    py = python_for_workloads()
    cells: list[Cell] = []
    for t in tc:
        cells.append(Cell("larson", t, "c", ["-t", str(t), "-n", str(pick(500, 200000, 600000) // t), "-s", "1000", "-w",
                                              str(pick(2, 5, 10))],
                          stresses="remote frees of objects handed to new threads and thread-exit caching",
                          figures=("ops_per_s",)))
    for t in tc:
        cells.append(Cell("succession", t, "c", ["-t", str(t), "-n", str(pick(500, 200000, 500000) // t), "-s", "5000",
                                                  "-w", str(pick(2, 20, 30))],
                          stresses="threads that start a successor, hand it every live block and exit (larson's "
                                   "pattern, fixed work)", figures=("ops_per_s",)))
    for t in many:
        cells.append(Cell("prodcons", t, "c", ["-t", str(t), "-n", str(pick(2000, 1000000, 3000000) // max(1, t // 2))],
                          stresses="every free is a remote free (cross-thread free path)", figures=("ops_per_s",)))
    # xstorm at -t 1 still runs one producer and one consumer, so it starts at 2 threads like prodcons.
    for t in many:
        cells.append(Cell("xstorm", t, "c", ["-t", str(t), "-n", str(pick(2000, 2000000, 4000000)), "-s", "64"],
                          stresses="many producers to many consumers: batches freed by threads that never allocate",
                          figures=("ops_per_s",)))
    for t in tc:
        cells.append(Cell("server", t, "c", ["-t", str(t), "-w", str(pick(100, 1000, 1000)), "-s", "1000",
                                              "-n", "10000"],
                          stresses="fixed-time server: random 16-1000 B replacements, slot arrays traded between "
                                   "threads", figures=("ops_per_s",), fixed_time=True))
    for t in tc:
        cells.append(Cell("localremote", t, "c", ["-t", str(t), "-n", str(pick(2000, 4000000, 8000000)), "-m", "50",
                                                   "-s", "64"],
                          stresses="half the frees local, half by the next thread of a ring", figures=("ops_per_s",)))
    for name in ("cache-scratch", "cache-thrash"):
        for t in tc:
            cells.append(Cell(name, t, "c", ["-t", str(t), "-n", str(pick(200, 200000, 800000) // t), "-s", "8",
                                             "-w", "100"],
                              stresses="false sharing between small objects handed to different threads",
                              figures=("ops_per_s",)))
    cells.append(Cell("churn", 1, "c", ["-n", str(pick(2, 20, 50)), "-s", str(pick(2000, 20000, 30000))],
                      stresses="the single-thread fast path: small objects freed LIFO, FIFO, at random, lists",
                      figures=("lifo_s", "fifo_s", "random_s", "list_s")))
    for t in tc:
        cells.append(Cell("mixed", t, "c", ["-t", str(t), "-n", str(pick(2000, 60000, 300000) // t), "-s", "2000"],
                          stresses="size-class breadth and medium/large reuse (16 B-256 KiB, log-uniform)",
                          figures=("ops_per_s",)))
    for t in tc[:2]:
        cells.append(Cell("realloc", t, "c", ["-t", str(t), "-n", str(max(1, pick(4, 200, 1000) // t))],
                          stresses="realloc growth in place or by mremap, and shrinking",
                          figures=("ops_per_s",)))
    for t in tc[:2]:
        cells.append(Cell("buffers", t, "c", ["-t", str(t), "-n", str(pick(200, 5000, 20000) // t), "-w", "16"],
                          stresses="bursts of 1-16 medium buffers (16-256 KiB) of one size, taken and all given back: "
                                   "medium pages emptied and refilled", figures=("ops_per_s",)))
    for t in tc[:2]:
        cells.append(Cell("large", t, "c", ["-t", str(t), "-n", str(pick(20, 150, 300) // t), "-w", "4"],
                          stresses="large blocks (64 KiB-32 MiB): extent reuse, mmap/munmap and page faults",
                          figures=("ops_per_s",)))
    cells.append(Cell("aligned", 1, "c", ["-n", str(pick(2000, 300000, 1000000))],
                      stresses="posix_memalign/memalign with alignments 16-4096", figures=("ops_per_s", "misaligned")))
    for t in many:
        cells.append(Cell("thread-churn", t, "c", ["-t", str(t), "-n", str(pick(50, 2000, 5000)), "-s", "4"],
                          stresses="thread creation and exit: per-thread heap set-up and abandonment",
                          figures=("ops_per_s", "rss_after_threads_kib")))
    cells.append(Cell("fragmentation", 1, "c", ["-s", str(pick(5000, 60000, 150000)), "-w", str(pick(0, 200, 1000))],
                      stresses="fragmentation and returning memory: RSS across phases and after freeing all",
                      figures=("rss_with_survivors_kib", "rss_all_freed_kib", "rss_after_wait_kib"), timed=False))
    cells.append(Cell("vmem", 10, "c", ["-t", "10"], timed=False,
                      stresses="per-thread address-space reservation of a thread that calls malloc(8) once",
                      figures=("virt_alloc_per_thread_kib", "rss_alloc_per_thread_kib", "data_alloc_per_thread_kib")))
    data_file = data_dir / f"pyreader-{pick(2, 12, 40)}mb.txt"
    for pm in ("default", "malloc"):
        cells.append(Cell("pyreader" + ("" if pm == "default" else "-malloc"), 10, "py",
                          [py, str(BENCH_DIR / "workloads" / "pyreader.py"), "--file", str(data_file), "--size-mb",
                           str(pick(2, 12, 40))],
                          env={} if pm == "default" else {"PYTHONMALLOC": "malloc"},
                          stresses="CPython threads reading lines (pymalloc arenas vs PYTHONMALLOC=malloc)",
                          figures=("seconds",)))
    cells.append(Cell("pydict-json", 1, "py",
                      [py, str(BENCH_DIR / "workloads" / "pydict_json.py"), "--records", str(pick(500, 4000, 10000)),
                       "--rounds", str(pick(1, 2, 3))], env={"PYTHONMALLOC": "malloc"},
                      stresses="CPython dicts, strings and JSON with PYTHONMALLOC=malloc", figures=("seconds",)))
    cells.append(Cell("sqlite", 1, "sqlite", [str(pick(2000, 40000, 120000))],
                      stresses="SQLite's page cache and row buffers in memory (sqlite3 shell)", figures=()))
    cells.append(Cell("redis", 1, "redis", [str(pick(2000, 20000, 50000)), str(pick(1000, 20000, 50000)), "256"],
                      stresses="redis-server under redis-benchmark: many small objects, RSS after FLUSHALL",
                      figures=("requests_per_s", "rss_loaded_kib", "rss_flushed_kib")))
    if only:
        cells = [c for c in cells if any(o == c.workload or o == c.id for o in only)]
    return cells


def python_for_workloads() -> str:
    """The Debian system interpreter when present (a stable target for LD_PRELOAD), else this one."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def bin_dir() -> Path:
    env = os.environ.get("MALLARD_BUILD_DIR")
    return (Path(env) if env else REPO / "build") / "bin"


def command_for(cell: Cell, bins: Path) -> list[str]:
    if cell.kind == "c":
        return [str(bins / f"mallard-bench-{cell.workload}"), *cell.args]
    if cell.kind == "py":
        return list(cell.args)
    if cell.kind == "sqlite":
        return ["sqlite3", ":memory:", f".parameter set @n {cell.args[0]}",
                f".read {BENCH_DIR / 'workloads' / 'sqlite_mem.sql'}"]
    raise ValueError(cell.kind)


def parse_result(stdout: str) -> dict:
    """The JSON of the last `RESULT {...}` line; raises ValueError when there is none or it does not parse."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise ValueError("no RESULT line in the output")


def repro(cell: Cell, alloc, bins: Path) -> str:
    """A shell line that reruns one cell under one allocator."""
    env = {k: v for k, v in cell.env.items()}
    if alloc.path:
        env["LD_PRELOAD"] = alloc.path
    var = alloc_mod.conf_variable(alloc, getattr(alloc, "conf", None))
    if var:
        env[var[0]] = var[1]
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    if cell.kind == "redis":
        cmd = f"bench/run.py full --workloads redis --allocators {alloc.name} --repeats 1"
        return cmd
    return (prefix + " " if prefix else "") + " ".join(shlex.quote(a) for a in command_for(cell, bins))


def run_once(cell: Cell, alloc, bins: Path, timeout: float) -> dict:
    """One run of one cell under one allocator: times, peak RSS and figures, or ok=False with the reason."""
    env = alloc_mod.preload_env(alloc, dict(os.environ))
    env.update(cell.env)
    rec = {"ok": False, "wall_s": None, "cpu_s": None, "max_rss_kib": None, "metrics": {}, "error": None}
    try:
        if cell.kind == "redis":
            n, keys, size = (int(x) for x in cell.args)
            r = mbench_programs.run_redis(env, n, keys, size, timeout=timeout)
            rec.update(ok=True, wall_s=r["wall_s"], cpu_s=r["cpu_s"], max_rss_kib=r["max_rss_kib"],
                       metrics=r["metrics"])
            return rec
        # run_measured starts the command through the `mallard` command's launcher (mallard-measure), which reports
        # the command's own peak RSS rather than one inflated by this Python process.
        r = measure.run_measured(command_for(cell, bins), env, timeout=timeout, cwd=str(REPO))
        rec.update(wall_s=r.wall_s, cpu_s=r.user_s + r.sys_s, max_rss_kib=r.max_rss_kib)
        if r.returncode != 0:
            how = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit status {r.returncode}"
            rec["error"] = f"{how}: {(r.stderr.strip() or r.stdout.strip())[-400:]}"
            return rec
        res = parse_result(r.stdout)
        if cell.kind == "sqlite" and res.get("ok") != 1:
            rec["error"] = f"wrong SQLite result: {res}"
            return rec
        if cell.fixed_time and not (res.get("ops", 0) > 0 and res.get("seconds", 0) > 0):
            rec["error"] = f"no operations completed in the set time: {res}"
            return rec
        rec["metrics"] = {k: v for k, v in res.items() if isinstance(v, (int, float, list)) and not isinstance(v, bool)}
        rec["ok"] = True
    except subprocess.TimeoutExpired:
        rec["error"] = f"timed out after {timeout:.0f} s"
    except (ValueError, RuntimeError, OSError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    return rec


def machine_info(allocs) -> dict:
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "unknown"

    mem_kib = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kib / 1048576, 1),
        "kernel": os.uname().release, "os": out(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "allocators": {a.name: {"version": a.version, "path": a.path, "conf": a.conf} for a in allocs},
        "python": out([python_for_workloads(), "--version"]), "sqlite": out(["sqlite3", "--version"]).split(" ")[0],
        "redis": out(["redis-server", "--version"]).split(" ")[2] if shutil.which("redis-server") else "absent",
        "compiler": out(["cc", "--version"]).splitlines()[0] if shutil.which("cc") else "unknown",
        "git": out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
    }


def fastpath_runs(allocs, bins: Path, repeats: int, iters: int, timeout: float, progress=None) -> dict:
    """ns per malloc/free pair (16-8192 B) and per remote free, interleaved repeats; medians per allocator."""
    runs: dict = {a.name: [] for a in allocs}
    for _ in range(repeats):
        for a in allocs:
            cell = Cell("fastpath", 1, "c", ["-n", str(iters)])
            runs[a.name].append(run_once(cell, a, bins, timeout))
            if progress:
                progress()
    return runs


def callgrind_counts(allocs, bins: Path, sizes=(16, 64, 256, 1024, 8192), n1=20000, n2=60000,
                     timeout: float = 120) -> dict:
    """Instructions per malloc/free pair from callgrind: (Ir(n2) - Ir(n1)) / (n2 - n1), which cancels start-up."""
    if not shutil.which("valgrind"):
        return {"error": "valgrind not installed (apt-get install valgrind)"}
    out: dict = {}
    for a in allocs:
        out[a.name] = {}
        for sz in sizes:
            irs = []
            for n in (n1, n2):
                cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                       str(bins / "mallard-bench-fastpath"), "-m", "pairs", "-s", str(sz), "-n", str(n)]
                try:
                    r = subprocess.run(cmd, env=alloc_mod.preload_env(a, dict(os.environ)), capture_output=True,
                                       text=True, timeout=timeout, stdin=subprocess.DEVNULL)
                except subprocess.TimeoutExpired:
                    irs = None
                    break
                ir = None
                for line in r.stderr.splitlines():
                    if "Collected :" in line:
                        ir = int(line.split("Collected :")[1].split()[0])
                if r.returncode != 0 or ir is None:
                    irs = None
                    break
                irs.append(ir)
            out[a.name][str(sz)] = round((irs[1] - irs[0]) / (n2 - n1), 1) if irs else None
    return out


def resolve_allocators(spec: str, found: list) -> list:
    """--allocators: names from `mallard list` or paths to .so files (a path is named after its file: libfoo.so is
    foo); a name that repeats gets -2, -3, ... so every allocator of a run has its own row. NAME@OPTIONS runs a
    Mallard library with those options (MALLARD_CONF; '+' between options, since ',' separates allocators), in a
    row of its own named NAME@OPTIONS. Raises UnknownAllocator, or ConfNotApplicable for options an allocator
    does not read."""
    allocs: list = []
    for x in [x.strip() for x in spec.split(",") if x.strip()]:
        x, _, opts = x.partition("@")
        al = alloc_mod.resolve(x, found)
        if opts:
            conf = opts.replace("+", ",")
            al = alloc_mod.Allocator(f"{al.name}@{opts}", al.path, al.version, conf)
            alloc_mod.conf_variable(al, conf)   # raises ConfNotApplicable for an allocator that ignores them
        taken = {y.name for y in allocs}
        name, k = al.name, 1
        while name in taken:
            k += 1
            name = f"{al.name}-{k}"
        if name != al.name:
            print(f"bench: a second allocator named {al.name} ({x}) is called {name}", file=sys.stderr)
            al = alloc_mod.Allocator(name, al.path, al.version, al.conf)
        allocs.append(al)
    return allocs


def run_cells(cells: list, allocs: list, bins: Path, repeats: int, timeout: float, prog, task, t_start: float,
              run=None, reproduce=None) -> list:
    """Runs every cell under every allocator, interleaved and repeated; returns the cells' raw entries. `run` and
    `reproduce` (default run_once and repro) run one cell under one allocator and write its command line."""
    run = run or run_once
    reproduce = reproduce or repro
    entries = []
    for cell in cells:
        runs = {x.name: [] for x in allocs}
        # Interleaved: A B C A B C ..., rotating the starting allocator so no one always goes first.
        for rep in range(repeats):
            order = allocs[rep % len(allocs):] + allocs[:rep % len(allocs)]
            for al in order:
                prog.update(task, description=f"{cell.id:<22} {al.name:<14}")
                runs[al.name].append(run(cell, al, bins, timeout))
                prog.advance(task)
        entries.append({**asdict(cell), "id": cell.id, "runs": runs,
                        "repro": {x.name: reproduce(cell, x, bins) for x in allocs}})
        if not sys.stderr.isatty():  # a log file gets one line per cell instead of the progress bar
            print(f"bench: {cell.id} done at {time.monotonic() - t_start:.0f} s", file=sys.stderr, flush=True)
        fails = [f"{n}: {r['error']}" for n, rs in runs.items() for r in rs if not r["ok"]]
        for f in fails[:3]:
            print(f"bench: {cell.id} failed under {f}", file=sys.stderr)
    return entries


def progress_bar():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=False, disable=not sys.stderr.isatty())


def run_scaling(a, allocs: list, bins: Path, peers: tuple, out_dir: Path, stamp: str, command: str) -> int:
    """The scaling mode: the cross-thread workloads at each thread count; results.md holds one grid per workload."""
    only = [w.strip() for w in a.workloads.split(",")] if a.workloads else list(SCALING_WORKLOADS)
    unknown = [w for w in only if w not in SCALING_WORKLOADS]
    if unknown:
        print(f"bench: scaling runs only {', '.join(SCALING_WORKLOADS)}; not {', '.join(unknown)}", file=sys.stderr)
        return 2
    threads = [int(t) for t in a.threads.split(",")] if a.threads else thread_counts("scaling")
    cells = plan(a.sizes, Path(tempfile.gettempdir()) / "mallard-bench-data", only, threads)
    # plan() runs the paired workloads (two threads at least) at 2 threads when none of the counts reaches 2.
    cells = [c for c in cells if c.threads in threads]
    if not cells:
        print(f"bench: nothing to run at threads {threads} (xstorm and prodcons need 2 at least)", file=sys.stderr)
        return 2
    # Workloads in the order asked for, thread counts ascending.
    cells.sort(key=lambda c: (only.index(c.workload), c.threads))
    repeats = a.repeats or REPEATS["scaling"]
    timeout = a.timeout or TIMEOUT_S["scaling"]
    raw = {"mode": "scaling", "sizes": a.sizes, "repeats": repeats, "command": command, "started": stamp,
           "machine": machine_info(allocs), "allocators": [x.name for x in allocs], "peers": list(peers),
           "threads": threads, "cells": []}
    t_start = time.monotonic()
    with progress_bar() as prog:
        task = prog.add_task("scaling", total=len(cells) * len(allocs) * repeats)
        raw["cells"] = run_cells(cells, allocs, bins, repeats, timeout, prog, task, t_start)
    raw["elapsed_s"] = round(time.monotonic() - t_start, 1)
    summary = mbench_scaling.summarize(raw, peers)
    raw["summary"] = {w: {str(t): per for t, per in per_t.items()} for w, per_t in summary.items()}
    (out_dir / "raw.json").write_text(json.dumps(raw, indent=1))
    (out_dir / "results.md").write_text(mbench_scaling.markdown(raw, summary, level=1, peers=peers))
    plot = mbench_scaling.plot(raw, summary, out_dir) if a.plots else None
    note = ""
    if a.docs_section:
        doc = Path(a.docs_file) if a.docs_file else REPO / "docs" / "PERFORMANCE.md"
        mbench_scaling.write_docs_section(doc, a.docs_section,
                                          mbench_scaling.markdown(raw, summary, level=2, peers=peers))
        note = f"; section {a.docs_section} of {doc} written"
    failed = [(w, t, n) for w, per_t in summary.items() for t, per in per_t.items() for n, s in per.items()
              if not s["ok"]]
    print(f"bench: scaling, {len(cells)} cells x {len(allocs)} allocators x {repeats} repeats in {raw['elapsed_s']} s;"
          f" results in {out_dir} ({plot.name if plot else 'no plot'}){note}")
    if failed:
        print(f"bench: {len(failed)} failed cell(s); see the Failures section of {out_dir / 'results.md'}",
              file=sys.stderr)
    return 0


def run_mbench(a, allocs: list, peers: tuple, out_dir: Path, stamp: str, command: str) -> int:
    """The mbench mode: mimalloc-bench's programs from --mbench-dir at each thread count; results.md holds one table
    per program and thread count, geometric means (all, cross-thread, other) and Mallard against the best peer."""
    mb = mimalloc_bench
    if not a.mbench_dir:
        print("bench: the mbench mode needs --mbench-dir DIR (mimalloc-bench's built programs, e.g. /work/peers/bin)",
              file=sys.stderr)
        return 2
    mdir = Path(a.mbench_dir).resolve()
    if not mdir.is_dir():
        print(f"bench: --mbench-dir {mdir}: no such folder", file=sys.stderr)
        return 2
    asked = [p.strip() for p in a.programs.split(",") if p.strip()] if a.programs else list(mb.PROGRAMS)
    unknown = [p for p in asked if p not in mb.PROGRAMS]
    if unknown:
        print(f"bench: unknown mbench program(s) {', '.join(unknown)}; known: {', '.join(mb.PROGRAMS)}",
              file=sys.stderr)
        return 2
    programs, skipped = mb.available(asked, mdir)
    for msg in skipped:
        print(f"bench: mbench: skipping {msg}", file=sys.stderr)
    if not programs:
        print(f"bench: none of the programs asked for is in {mdir}", file=sys.stderr)
        return 2
    threads = [int(t) for t in a.threads.split(",")] if a.threads else thread_counts("full")
    if a.run_s is not None and a.run_s <= 0:
        print("bench: --run-s must be positive", file=sys.stderr)
        return 2
    cells = mb.plan(programs, threads, a.run_s)
    out_dir.mkdir(parents=True, exist_ok=True)
    repeats = a.repeats or REPEATS["mbench"]
    timeout = a.timeout or TIMEOUT_S["mbench"]
    raw = {"mode": "mbench", "repeats": repeats, "command": command, "started": stamp, "mbench_dir": str(mdir),
           "run_s": a.run_s, "machine": machine_info(allocs), "allocators": [x.name for x in allocs],
           "peers": list(peers), "threads": threads, "programs": programs, "skipped": skipped, "cells": []}
    t_start = time.monotonic()
    with progress_bar() as prog:
        task = prog.add_task("mbench", total=len(cells) * len(allocs) * repeats)
        raw["cells"] = run_cells(cells, allocs, mdir, repeats, timeout, prog, task, t_start,
                                 run=mb.run_once, reproduce=mb.repro)
    raw["elapsed_s"] = round(time.monotonic() - t_start, 1)
    summary = mb.summarize(raw, peers)
    raw["summary"] = summary
    (out_dir / "raw.json").write_text(json.dumps(raw, indent=1))
    (out_dir / "results.md").write_text(mb.markdown(raw, summary, level=1, peers=peers))
    note = ""
    if a.docs_section:
        doc = Path(a.docs_file) if a.docs_file else REPO / "docs" / "PERFORMANCE.md"
        mbench_scaling.write_docs_section(doc, a.docs_section, mb.markdown(raw, summary, level=2, peers=peers),
                                          kind="mbench")
        note = f"; section {a.docs_section} of {doc} written"
    print(mb.console_summary(raw, summary))
    print(f"bench: mbench, {len(cells)} cells x {len(allocs)} allocators x {repeats} repeats in {raw['elapsed_s']} s;"
          f" results in {out_dir}{note}")
    failed = [(cid, n) for cid, cell in summary["cells"].items() for n, s in cell["per"].items() if not s["ok"]]
    if failed:
        print(f"bench: {len(failed)} failed cell(s); see the Failures section of {out_dir / 'results.md'}",
              file=sys.stderr)
    return 0


def run_musl(a, out_dir: Path, stamp: str, command: str) -> int:
    """The musl mode: every C workload as two static musl programs (bench/CMakeLists.txt: bin/static-musl/ with
    musl's malloc, bin/static-mallard/ with libmallard.a), run side by side, interleaved; ratios Mallard / musl."""
    bins = Path(a.bin_dir).resolve() if a.bin_dir else musl_static.default_build_dir(REPO).resolve() / "bin"
    threads = [int(t) for t in a.threads.split(",")] if a.threads else thread_counts("quick")
    data_dir = Path(tempfile.gettempdir()) / "mallard-bench-data"
    every = plan(a.sizes, data_dir, None, threads)
    fp_iters = {"smoke": 20000, "quick": 2000000, "full": 5000000}[a.sizes]
    # The fast-path loop is a cell here (the other modes run it apart, for their fast-path table).
    every.append(Cell("fastpath", 1, "c", ["-n", str(fp_iters)],
                      stresses="malloc/free pairs of 16-8192 B in a tight loop, and remote frees",
                      figures=("ns_pair_16", "ns_pair_64", "ns_pair_256", "ns_pair_1024", "ns_pair_8192",
                               "ns_remote_free")))
    left_out = {c.workload: musl_static.LEFT_OUT.get(c.workload, "not a C workload") for c in every if c.kind != "c"}
    cells = [c for c in every if c.kind == "c"]
    if a.workloads:
        only = [w.strip() for w in a.workloads.split(",") if w.strip()]
        refused = [w for w in only if w.split("/")[0] in left_out]
        if refused:
            print("bench: the musl mode runs the C workloads only; not " + "; ".join(
                f"{w} ({left_out[w.split('/')[0]]})" for w in refused), file=sys.stderr)
            return 2
        cells = [c for c in cells if any(o == c.workload or o == c.id for o in only)]
        if not cells:
            print("bench: no workload matches --workloads", file=sys.stderr)
            return 2
    workloads = sorted({c.workload for c in cells})
    mallard_version = alloc_mod.library_version(str(bins.parent / "lib" / "libmallard.a"), "mallard")
    builds, problems = musl_static.builds(bins, workloads, mallard_version)
    if problems:
        for p in problems[:8]:
            print(f"bench: musl: {p}", file=sys.stderr)
        if len(problems) > 8:
            print(f"bench: musl: ... and {len(problems) - 8} more", file=sys.stderr)
        print(f"bench: the musl mode needs the static musl programs in {bins}/static-musl and static-mallard; build "
              "them with: bash scripts/test-musl.sh (or CC=musl-gcc cmake -S . -B build-musl -G Ninja "
              "-DCMAKE_BUILD_TYPE=Release && cmake --build build-musl --target mallard-bench-musl), or give "
              "--bin-dir", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    repeats = a.repeats or REPEATS["musl"]
    timeout = a.timeout or TIMEOUT_S["musl"]
    machine = machine_info(builds)
    machine["arch"] = os.uname().machine
    raw = {"mode": "musl", "sizes": a.sizes, "repeats": repeats, "command": command, "started": stamp,
           "machine": machine, "allocators": [b.name for b in builds], "peers": ["musl"],
           "builds": [{"name": b.name, "bins": musl_static.where(b.bins, REPO), "version": b.version,
                       "what": b.what} for b in builds],
           "left_out": left_out, "cells": []}
    t_start = time.monotonic()
    with progress_bar() as prog:
        task = prog.add_task("musl", total=len(cells) * len(builds) * repeats)
        # Each build runs its own programs: the folder comes from the build, not from one --bin-dir.
        raw["cells"] = run_cells(cells, builds, bins, repeats, timeout, prog, task, t_start,
                                 run=lambda cell, b, _bins, t: run_once(cell, b, b.bins, t),
                                 reproduce=lambda cell, b, _bins: repro(cell, b, b.bins))
    raw["elapsed_s"] = round(time.monotonic() - t_start, 1)
    summary = mbench_report.summarize(raw, ("musl",))
    raw["summary"] = summary
    (out_dir / "raw.json").write_text(json.dumps(raw, indent=1))
    (out_dir / "results.md").write_text(musl_static.markdown(raw, summary, level=1))
    plots = mbench_report.plots(raw, summary, out_dir) if a.plots else []
    note = ""
    if a.docs_section:
        doc = Path(a.docs_file) if a.docs_file else REPO / "docs" / "PERFORMANCE.md"
        mbench_scaling.write_docs_section(doc, a.docs_section, musl_static.markdown(raw, summary, level=2),
                                          kind="musl")
        note = f"; section {a.docs_section} of {doc} written"
    print(musl_static.console_summary(summary))
    print(f"bench: musl, {len(cells)} cells x {len(builds)} builds x {repeats} repeats in {raw['elapsed_s']} s; "
          f"results in {out_dir} ({', '.join(p.name for p in plots) or 'no plots'}){note}")
    if summary["failures"]:
        print(f"bench: {len(summary['failures'])} failed cell(s); see the Failures section of "
              f"{out_dir / 'results.md'}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example: .venv/bin/python bench/run.py quick --allocators glibc,mimalloc\n"
                                        "         .venv/bin/python bench/run.py scaling --threads 1,2,4,8,16 "
                                        "--allocators glibc,mallard,/work/peers/lib/libsnmallocshim.so\n"
                                        "         .venv/bin/python bench/run.py mbench --mbench-dir /work/peers/bin "
                                        "--threads 1,2,4 --allocators glibc,mallard --run-s 2\n"
                                        "         .venv/bin/python bench/run.py musl --docs-section 2core")
    ap.add_argument("mode", choices=MODES, help="smoke: tiny CI check; quick: < 3 min; full: < 25 min, rewrites docs; "
                                                "scaling: the cross-thread workloads at each of --threads; "
                                                "mbench: mimalloc-bench's programs from --mbench-dir; "
                                                "musl: the C workloads as static musl programs, musl's malloc "
                                                "against libmallard.a linked in")
    ap.add_argument("--allocators", help="comma-separated names or .so paths (default: every one discover() finds); "
                                         "a path is named after its file (libfoo.so: foo); NAME@OPT:V+OPT:V runs a "
                                         "Mallard library with those options (MALLARD_CONF) as a row of its own")
    ap.add_argument("--peers", help="allocators whose best median is the 1.00 of the ratios (default: "
                                    + ",".join(PEERS) + "; any names of this run)")
    ap.add_argument("--repeats", type=int, help="repeats per allocator and cell (default: quick 3, full 5, scaling 3, "
                                                "mbench 3)")
    ap.add_argument("--out", help="results folder (default: results/<timestamp>-<mode>)")
    ap.add_argument("--workloads", help="comma-separated workload names or ids (e.g. larson,mixed/t2)")
    ap.add_argument("--threads", help="comma-separated thread counts (default: 1,2,4 and more on bigger machines; "
                                      "scaling: powers of two up to 8 or the core count)")
    ap.add_argument("--sizes", choices=("smoke", "quick", "full"), default="quick",
                    help="scaling, musl: the problem sizes of this mode (default quick)")
    ap.add_argument("--docs-section", metavar="NAME",
                    help="scaling, mbench, musl: also write the tables between <!-- MODE:NAME begin --> and "
                         "<!-- MODE:NAME end --> of docs/PERFORMANCE.md (replacing that section, or appending it)")
    ap.add_argument("--docs-file", metavar="PATH", help="the page --docs-section writes (default docs/PERFORMANCE.md)")
    ap.add_argument("--callgrind", action=argparse.BooleanOptionalAction, default=None,
                    help="callgrind instruction counts per pair (default: on in full mode)")
    ap.add_argument("--docs", action=argparse.BooleanOptionalAction, default=None,
                    help="rewrite docs/PERFORMANCE.md (default: on in full mode with every workload)")
    ap.add_argument("--bin-dir", help="folder of the mallard-bench-* programs (default: $MALLARD_BUILD_DIR/bin, "
                                      "else build/bin; musl: $MALLARD_MUSL_BUILD_DIR/bin, else build-musl/bin, "
                                      "which holds static-musl/ and static-mallard/)")
    ap.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True, help="write matplotlib plots")
    ap.add_argument("--timeout", type=float, metavar="S",
                    help="seconds before one run counts as failed (default: smoke/quick 60, full/scaling 180, "
                         "mbench 300)")
    ap.add_argument("--mbench-dir", metavar="DIR", help="mbench: the folder of mimalloc-bench's built programs")
    ap.add_argument("--programs", help="mbench: comma-separated programs (default: all of "
                                       + ",".join(mimalloc_bench.PROGRAMS) + ")")
    ap.add_argument("--run-s", type=float, metavar="S",
                    help="mbench: run time of the fixed-time programs whose arguments set one (xmalloc-test -t, "
                         "larson's first argument; default: their standard 5 s)")
    a = ap.parse_args(argv)
    if a.mode not in ("scaling", "mbench", "musl") and (a.docs_section or a.docs_file):
        print("bench: --docs-section and --docs-file belong to the scaling, mbench and musl modes", file=sys.stderr)
        return 2
    if a.mode == "musl" and (a.allocators or a.peers or a.callgrind):
        print("bench: the musl mode compares its two static builds (musl's malloc, Mallard linked in); "
              "--allocators, --peers and --callgrind do not apply", file=sys.stderr)
        return 2
    if a.mode in ("scaling", "mbench", "musl") and a.docs:
        print(f"bench: the {a.mode} mode never rewrites docs/PERFORMANCE.md; --docs-section NAME writes one section",
              file=sys.stderr)
        return 2
    if a.mode != "mbench" and (a.mbench_dir or a.programs or a.run_s is not None):
        print("bench: --mbench-dir, --programs and --run-s belong to the mbench mode", file=sys.stderr)
        return 2
    if a.mode == "mbench" and a.workloads:
        print("bench: the mbench mode takes --programs, not --workloads", file=sys.stderr)
        return 2
    if a.docs_section and not mbench_scaling.SECTION_NAME.match(a.docs_section):
        print(f"bench: --docs-section {a.docs_section!r}: letters, digits, '.', '_' and '-' only", file=sys.stderr)
        return 2

    found = alloc_mod.discover()
    if a.allocators:
        try:
            allocs = resolve_allocators(a.allocators, found)
        except (alloc_mod.UnknownAllocator, alloc_mod.ConfNotApplicable) as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
    else:
        # glibc, the three other peers and Mallard's variants; other discovered libraries only when asked for.
        allocs = [x for x in found if x.name in PEERS + MALLARD]
    peers = tuple(p.strip() for p in a.peers.split(",") if p.strip()) if a.peers else PEERS
    bins = Path(a.bin_dir).resolve() if a.bin_dir else bin_dir()
    note = rss_floor_note(measure.helper_path())
    if note:
        print(f"bench: warning: {note}", file=sys.stderr)
    missing = [p for p in ("larson", "fastpath") if not (bins / f"mallard-bench-{p}").exists()]
    # The mbench mode runs programs from outside the repository only; the musl mode checks its own programs.
    if missing and a.mode not in ("mbench", "musl"):
        print(f"bench: workloads not built in {bins}; run: cmake --build {bins.parent} --target mallard-bench "
              f"(or set MALLARD_BUILD_DIR)", file=sys.stderr)
        return 2
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(a.out) if a.out else REPO / "results" / f"{stamp}-{a.mode}"
    if a.mode not in ("mbench", "musl"):  # these check their own options first, then make the folder
        out_dir.mkdir(parents=True, exist_ok=True)
    command = "cd " + str(REPO) + " && " + " ".join(shlex.quote(x) for x in [
        os.path.relpath(sys.executable, REPO) if sys.executable.startswith(str(REPO)) else sys.executable,
        os.path.relpath(__file__, REPO), *(argv if argv is not None else sys.argv[1:])])
    if a.mode == "scaling":
        return run_scaling(a, allocs, bins, peers, out_dir, stamp, command)
    if a.mode == "mbench":
        return run_mbench(a, allocs, peers, out_dir, stamp, command)
    if a.mode == "musl":
        return run_musl(a, out_dir, stamp, command)

    repeats = a.repeats or REPEATS[a.mode]
    only = [w.strip() for w in a.workloads.split(",")] if a.workloads else None
    threads = [int(t) for t in a.threads.split(",")] if a.threads else None
    data_dir = Path(tempfile.gettempdir()) / "mallard-bench-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    cells = plan(a.mode, data_dir, only, threads)
    if not cells:
        print("bench: no workload matches --workloads", file=sys.stderr)
        return 2
    if any(c.kind == "redis" for c in cells) and mbench_programs.redis_available():
        print(f"bench: skipping redis: {mbench_programs.redis_available()}", file=sys.stderr)
        cells = [c for c in cells if c.kind != "redis"]
    # Generate the reader's input once, outside any timing.
    for c in cells:
        if c.workload.startswith("pyreader"):
            gen = subprocess.run([*c.args, "--generate-only"], capture_output=True, text=True)
            if gen.returncode != 0:
                print(f"bench: generating the reader's input failed (exit {gen.returncode}): {gen.stderr.strip()}",
                      file=sys.stderr)
                return 1
            break
    do_callgrind = a.callgrind if a.callgrind is not None else (a.mode == "full" and not only)
    do_docs = a.docs if a.docs is not None else (a.mode == "full" and not only)
    timeout = a.timeout or TIMEOUT_S[a.mode]
    fp_iters = {"smoke": 20000, "quick": 2000000, "full": 5000000}[a.mode]

    raw = {"mode": a.mode, "repeats": repeats, "command": command, "started": stamp,
           "machine": machine_info(allocs), "allocators": [a_.name for a_ in allocs], "peers": list(peers),
           "cells": [], "fastpath": {}, "callgrind": None}
    total = len(cells) * len(allocs) * repeats + len(allocs) * repeats
    t_start = time.monotonic()
    with progress_bar() as prog:
        task = prog.add_task("benchmarks", total=total)
        raw["cells"] = run_cells(cells, allocs, bins, repeats, timeout, prog, task, t_start)
        if not only or "fastpath" in only:
            prog.update(task, description="fastpath")
            raw["fastpath"] = fastpath_runs(allocs, bins, repeats, fp_iters, timeout, lambda: prog.advance(task))
    if do_callgrind:
        print("bench: callgrind instruction counts ...", file=sys.stderr)
        raw["callgrind"] = callgrind_counts(allocs, bins)
    raw["elapsed_s"] = round(time.monotonic() - t_start, 1)
    summary = mbench_report.summarize(raw, peers)
    raw["summary"] = summary
    (out_dir / "raw.json").write_text(json.dumps(raw, indent=1))
    md = mbench_report.markdown(raw, summary)
    (out_dir / "results.md").write_text(md)
    plots = mbench_report.plots(raw, summary, out_dir) if a.plots else []
    if do_docs:
        (REPO / "docs").mkdir(exist_ok=True)
        doc = REPO / "docs" / "PERFORMANCE.md"
        doc.write_text(mbench_report.performance_doc(raw, summary, md, out_dir,
                                                     kept=mbench_report.kept_sections(doc.read_text() if doc.exists() else "")))
    print(mbench_report.console_summary(raw, summary))
    print(f"bench: {len(cells)} cells x {len(allocs)} allocators x {repeats} repeats in {raw['elapsed_s']} s; "
          f"results in {out_dir} ({', '.join(p.name for p in plots) or 'no plots'})"
          + ("; docs/PERFORMANCE.md rewritten" if do_docs else ""))
    failed = summary["failures"]
    if failed:
        print(f"bench: {len(failed)} failed cell(s); see the Failures section of {out_dir / 'results.md'}",
              file=sys.stderr)
    return 1 if failed and a.mode == "smoke" else 0


if __name__ == "__main__":
    sys.exit(main())
