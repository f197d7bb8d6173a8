"""`mallard top PID`: a live view of a running process under Mallard: memory, allocation rates, locks, purging."""
from __future__ import annotations

import json
import sys
import time

from rich import box
from rich.console import Group
from rich.live import Live
from rich.table import Table

from .. import live
from ..common import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CliError, out, shown
from ..procinfo import fmt_bytes
from .stats import error, target

NAME = "top"
NEEDS_COMMAND = False
MEMORY = ("allocated", "active", "resident", "mapped", "dirty", "retained", "metadata")
ROWS = 12  # classes shown, busiest first


def register(sub) -> None:
    s = sub.add_parser("top", help="live view of a running process under Mallard (rates per second)",
                       description="Refresh a view of a process running under Mallard: RSS, Mallard's memory "
                                   "figures, malloc/free rates per size class and for large/huge blocks, arena lock "
                                   "contention and purging, until Ctrl-C (or --iterations). Read from its memory "
                                   "without stopping it. See docs/STATS.md.")
    s.add_argument("pid", metavar="PID")
    s.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes (default 1)")
    s.add_argument("--iterations", type=int, default=0, metavar="N", help="stop after N refreshes (default: never)")
    s.add_argument("--json", action="store_true", help="one JSON object of figures and rates per refresh")


def _rate(cur: float, prev: float, dt: float) -> float:
    return max(cur - prev, 0) / dt if dt > 0 else 0.0


def rates(prev: dict, cur: dict, dt: float) -> dict:
    """Figures of `cur` and rates per second since `prev` (counters that went backwards count as 0)."""
    ps, cs = prev["stats"], cur["stats"]
    pcls = {c["class"]: c for c in prev["classes"]}
    classes = []
    for c in cur["classes"]:
        p = pcls.get(c["class"], {"nmalloc": 0, "nfree": 0})
        classes.append({"class": c["class"], "size": c["size"], "curobjs": c["curobjs"],
                        "malloc_per_s": _rate(c["nmalloc"], p["nmalloc"], dt),
                        "free_per_s": _rate(c["nfree"], p["nfree"], dt)})
    classes.sort(key=lambda c: (-(c["malloc_per_s"] + c["free_per_s"]), c["class"]))
    big = {k: {"malloc_per_s": _rate(cs[k]["nmalloc"], ps[k]["nmalloc"], dt),
               "free_per_s": _rate(cs[k]["nfree"], ps[k]["nfree"], dt),
               "live": max(cs[k]["nmalloc"] - cs[k]["nfree"], 0)} for k in ("large", "huge")}
    parenas = {a["index"]: a for a in prev["arenas"]}
    arenas = []
    for a in cur["arenas"]:
        p = parenas.get(a["index"], a)
        arenas.append({"index": a["index"], "nthreads": a["nthreads"],
                       "lock_ops_per_s": _rate(a["mutex"]["ops"], p["mutex"]["ops"], dt),
                       "contended_per_s": _rate(a["mutex"]["contended"], p["mutex"]["contended"], dt),
                       "wait_ms_per_s": _rate(a["mutex"]["wait_ns"], p["mutex"]["wait_ns"], dt) / 1e6,
                       "purges_per_s": _rate(a["npurge_passes"], p["npurge_passes"], dt),
                       "madvise_per_s": _rate(a["nmadvise"], p["nmadvise"], dt),
                       "purged_bytes_per_s": _rate(a["purged_total"], p["purged_total"], dt),
                       "dirty_bytes": a["dirty_bytes"]})
    bg = cs["background_thread"]
    return {"pid": cur["pid"], "exe": cur["exe"], "uptime_ms": cur["uptime_ms"], "interval_s": dt, "rss": cur["rss"],
            "memory": {k: cs[k] for k in MEMORY}, "classes": classes, "large": big["large"], "huge": big["huge"],
            "arenas": arenas, "remote_frees_per_s": _rate(cs["remote_frees"], ps["remote_frees"], dt),
            "purging_thread": {"running": bg["running"], "wakeups": bg["wakeups"]}}


def _n(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 or x == 0 else f"{x:.1f}"


def view(r: dict, sample: int) -> Group:
    head = (f"[bold]mallard top[/] PID {r['pid']}  up {r['uptime_ms'] / 1000:.1f} s  "
            f"refresh {sample} every {r['interval_s']:.1f} s\n{shown(r['exe'])}")
    mem = Table(box=box.SIMPLE, title="memory", title_justify="left")
    for k in ("RSS",) + MEMORY:
        mem.add_column(k, justify="right")
    mem.add_row("?" if r["rss"] is None else fmt_bytes(r["rss"]), *(fmt_bytes(r["memory"][k]) for k in MEMORY))
    rt = Table(box=box.SIMPLE, title="allocations per second", title_justify="left")
    for k in ("class", "size", "malloc/s", "free/s", "live"):
        rt.add_column(k, justify="right")
    for c in r["classes"][:ROWS]:
        rt.add_row(str(c["class"]), fmt_bytes(c["size"]), _n(c["malloc_per_s"]), _n(c["free_per_s"]),
                   f"{c['curobjs']:,}")
    for k in ("large", "huge"):
        rt.add_row(k, "", _n(r[k]["malloc_per_s"]), _n(r[k]["free_per_s"]), f"{r[k]['live']:,}")
    at = Table(box=box.SIMPLE, title="arenas (per second)", title_justify="left")
    for k in ("arena", "threads", "lock ops", "contended", "wait ms", "purges", "madvise", "purged", "dirty"):
        at.add_column(k, justify="right")
    for a in r["arenas"]:
        at.add_row(str(a["index"]), str(a["nthreads"]), _n(a["lock_ops_per_s"]), _n(a["contended_per_s"]),
                   f"{a['wait_ms_per_s']:.2f}", _n(a["purges_per_s"]), _n(a["madvise_per_s"]),
                   fmt_bytes(a["purged_bytes_per_s"]), fmt_bytes(a["dirty_bytes"]))
    bg = r["purging_thread"]
    tail = (f"purging thread: {'running' if bg['running'] else 'not running'}"
            + (f", {bg['wakeups']:,} wake-ups" if bg["wakeups"] is not None else "")
            + f"   remote frees/s: {_n(r['remote_frees_per_s'])}")
    return Group(head, mem, rt, at, tail)


def run(args) -> int:
    if args.interval <= 0:
        raise CliError("--interval must be a positive number of seconds", EXIT_USAGE)
    if args.iterations < 0:
        raise CliError("--iterations must be 0 (never stop) or more", EXIT_USAGE)
    t = target(args.pid)

    def sample() -> tuple[dict, float]:
        try:
            return live.snapshot(t), time.monotonic()
        except live.LiveError as e:
            raise error(e) from None

    prev, t0 = sample()
    tty = out.is_terminal and not args.json
    display = Live(console=out, auto_refresh=False, transient=False) if tty else None
    n = 0
    try:
        if display:
            display.start()
            display.update(f"mallard top PID {t.pid}: first figures in {args.interval:g} s...", refresh=True)
        while not args.iterations or n < args.iterations:
            time.sleep(args.interval)
            cur, t1 = sample()
            n += 1
            r = rates(prev, cur, t1 - t0)
            prev, t0 = cur, t1
            if args.json:
                print(json.dumps(r), flush=True)
            elif display:
                display.update(view(r, n), refresh=True)
            else:
                out.print(view(r, n))
                sys.stdout.flush()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED  # Ctrl-C is how a live view ends: no error line
    finally:
        if display:
            display.stop()
    return EXIT_OK
