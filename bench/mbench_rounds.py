"""mimalloc-bench's programs under every allocator in rounds (every cell once per round) until a deadline, for a
lent machine whose time is short: raw.json (run.py's mbench format) is rewritten after every cell, so a run cut off
still leaves every finished round; --report turns a raw.json into run.py's results.md tables."""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "tools" / "mallard" / "src"))

import mimalloc_bench as mb  # noqa: E402
import run as bench_run  # noqa: E402  (bench/run.py: its machine record)
from mallard_cli import allocators as alloc_mod  # noqa: E402
from mallard_cli import measure  # noqa: E402


def library_path(option: str, name: str, path: str) -> str | None:
    """The library file of NAME=PATH, absolute; None for PATH empty or 'none' (the system's own malloc)."""
    if path in ("", "none"):
        return None
    if not Path(path).is_file():
        raise ValueError(f"{option}: {name}: no such file {path}")
    return str(Path(path).resolve())


def parse_allocators(spec: str) -> list:
    """NAME=PATH pairs (PATH empty or 'none': the system's own malloc), in the order given; names must differ."""
    out = []
    for item in [x.strip() for x in spec.split(",") if x.strip()]:
        name, sep, path = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--allocators: '{item}' is not NAME=PATH")
        path = library_path("--allocators", name, path)
        if any(a.name == name for a in out):
            raise ValueError(f"--allocators: {name} named twice")
        # The system's malloc is its C library's: its name and version as Python finds them.
        version = (" ".join(platform.libc_ver()).strip() or "unknown") if path is None else "unknown"
        out.append(alloc_mod.Allocator(name, path, version, None))
    return out


def machine(allocs: list) -> dict:
    """run.py's record of the machine; the checkout's git may be absent on a lent machine (MALLARD_GIT then)."""
    info = bench_run.machine_info(allocs)
    info["git"] = info["git"] or os.environ.get("MALLARD_GIT", "unknown")
    return info


def run_together(cell, allocs: list, mdir: Path, timeout: float, stagger_s: float) -> dict:
    """Every allocator's run of one cell at once, each started stagger_s after the one before (for programs that
    sleep nearly all the time, such as rptest): {name: record}."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i_al):
        i, al = i_al
        time.sleep(i * stagger_s)
        return al.name, mb.run_once(cell, al, mdir, timeout)

    with ThreadPoolExecutor(max_workers=len(allocs)) as ex:
        return dict(ex.map(one, enumerate(allocs)))


def run(a) -> int:
    allocs = parse_allocators(a.allocators)
    mdir = Path(a.mbench_dir).resolve()
    programs = [p.strip() for p in a.programs.split(",") if p.strip()]
    unknown = [p for p in programs if p not in mb.PROGRAMS]
    if unknown:
        print(f"mbench_rounds: unknown program(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    together = {p.strip() for p in (a.together or "").split(",") if p.strip()}
    threads = [int(t) for t in a.threads.split(",")]
    cells = mb.plan(programs, threads, a.run_s)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    peers = [x.name for x in allocs if x.name != a.subject]
    raw = {"mode": "mbench", "repeats": 0, "command": " ".join(sys.argv), "started": time.strftime("%Y-%m-%d %H:%M"),
           "mbench_dir": str(mdir), "run_s": a.run_s, "machine": machine(allocs), "allocators": [x.name for x in allocs],
           "peers": peers, "threads": threads, "programs": programs, "skipped": [],
           "cells": [{"workload": c.workload, "threads": c.threads, "args": c.args, "cross_thread": c.cross_thread,
                      "fixed_time": c.fixed_time, "id": c.id, "runs": {x.name: [] for x in allocs},
                      "repro": {x.name: mb.repro(c, x, mdir) for x in allocs}} for c in cells]}
    note = bench_run.rss_floor_note(measure.helper_path())
    if note:
        raw["rss_note"] = note
        print(f"mbench_rounds: warning: {note}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    deadline = t0 + a.deadline_s

    def save():
        raw["elapsed_s"] = round(time.monotonic() - t0, 1)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(raw, indent=1))
        tmp.replace(out)

    for rnd in range(a.rounds):
        for cell, entry in zip(cells, raw["cells"]):
            if time.monotonic() >= deadline:
                print(f"mbench_rounds: deadline reached in round {rnd + 1}", flush=True)
                save()
                return 0
            # Rotate the starting allocator each round so no one always goes first.
            k = (rnd + cells.index(cell)) % len(allocs)
            order = allocs[k:] + allocs[:k]
            if cell.workload in together:
                recs = run_together(cell, order, mdir, a.timeout, a.stagger_s)
            else:
                recs = {al.name: mb.run_once(cell, al, mdir, a.timeout) for al in order}
            for name, rec in recs.items():
                entry["runs"][name].append(rec)
            bad = [f"{n}: {r['error']}" for n, r in recs.items() if not r["ok"]]
            print(f"mbench_rounds: round {rnd + 1} {cell.id} at {time.monotonic() - t0:.0f} s"
                  + (f"; failed {bad[:2]}" if bad else ""), flush=True)
            save()
        raw["repeats"] = rnd + 1
    save()
    return 0


def report(a) -> int:
    raw = json.loads(Path(a.report).read_text())
    peers = tuple(raw["peers"])
    summary = mb.summarize(raw, peers)
    if raw.get("rss_note"):
        print(f"**Peak RSS**: {raw['rss_note']}.\n")
    print(mb.markdown(raw, summary, level=2, peers=peers))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mbench-dir", help="mimalloc-bench's built programs")
    ap.add_argument("--programs", default="larson,mstress,xmalloc-test,rptest")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--allocators", help="NAME=PATH,... (PATH empty: the system's malloc), e.g. glibc=,mallard=lib.so")
    ap.add_argument("--subject", default="mallard", help="the allocator that is not a peer")
    ap.add_argument("--run-s", type=float, default=1, help="run time of the fixed-time programs (run.py's --run-s)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deadline-s", type=float, default=3600, help="start no cell after this many seconds")
    ap.add_argument("--timeout", type=float, default=120, help="one run's limit in seconds")
    ap.add_argument("--together", default="", help="programs whose allocators run at once (they mostly sleep)")
    ap.add_argument("--stagger-s", type=float, default=0.25)
    ap.add_argument("--out", default="raw.json")
    ap.add_argument("--report", help="print the tables of this raw.json and exit")
    a = ap.parse_args(argv)
    if a.report:
        return report(a)
    if not a.mbench_dir or not a.allocators:
        ap.error("--mbench-dir and --allocators are needed (or --report)")
    try:
        return run(a)
    except ValueError as e:
        print(f"mbench_rounds: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
