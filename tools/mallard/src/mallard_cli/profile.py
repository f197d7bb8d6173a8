"""`mallard profile`: runs a program under the interposing tracer, reads one record per process and summarises them."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

from .allocators import Allocator, preload_env, tracer_path

FUNCTIONS = ["malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign", "memalign", "valloc", "pvalloc",
             "reallocarray"]
ALLOC_FUNCTIONS = [f for f in FUNCTIONS if f != "free"]


class TracerMissing(Exception):
    pass


@dataclass
class ProfileRun:
    returncode: int
    wall_s: float
    records: list[dict]


def tracer_env(tracer: str, alloc: Allocator | None, trace_dir: str, base_env: dict | None = None,
               conf: str | None = None) -> dict:
    """Environment that loads the tracer in front of alloc (the tracer forwards to whatever comes next)."""
    env = dict(os.environ if base_env is None else base_env)
    if alloc is not None:
        env = preload_env(alloc, env, conf)
    old = env.get("LD_PRELOAD", "").strip()
    env["LD_PRELOAD"] = tracer + (":" + old if old else "")
    env["MALLARD_TRACE_DIR"] = trace_dir
    return env


def run_traced(cmd: list[str], alloc: Allocator | None, conf: str | None = None, capture: bool = False,
               base_env: dict | None = None, tracer: str | None = None) -> ProfileRun:
    """Runs cmd with the tracer (default: the one found for glibc programs) preloaded; raises TracerMissing if it is
    not built, OSError if cmd cannot start."""
    tracer = tracer or tracer_path()
    if tracer is None:
        raise TracerMissing("the tracer library libmallard-tracer.so is not built or installed: build the target "
                            "`mallard-tracer` (cmake --build build --target mallard-tracer), or point MALLARD_LIBDIR "
                            "(or MALLARD_BUILD_DIR) at it")
    trace_dir = tempfile.mkdtemp(prefix="mallard-profile-")
    try:
        env = tracer_env(str(tracer), alloc, trace_dir, base_env, conf=conf)
        t0 = time.perf_counter()
        out = subprocess.PIPE if capture else None
        proc = subprocess.run(cmd, env=env, stdout=out, stderr=out)
        wall = time.perf_counter() - t0
        records = []
        for path in sorted(glob.glob(os.path.join(trace_dir, "trace.*.json"))):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    records.append(normalise(json.load(f)))
            except (OSError, ValueError):
                continue
        records.sort(key=lambda r: (r.get("pid", 0), r.get("ended_by") != "exec", r.get("elapsed_s", 0)))
        return ProfileRun(proc.returncode, wall, records)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)


TOP_SIZES = 200  # sizes kept per record, most frequent first


def normalise(rec: dict) -> dict:
    """A record as the tracer writes it (raw: sizes unsorted and repeated per thread, threads unsorted, so that the
    writer stays async-signal-safe) merged and sorted: sizes [fn, size, calls] busiest first, distinct_sizes,
    threads busiest first with their total and per-function calls."""
    if rec.get("format") != "raw":
        return rec
    merged: dict[tuple[str, int], int] = {}
    for fn, size, n in rec.get("sizes", []):
        merged[(fn, size)] = merged.get((fn, size), 0) + n
    top = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0][1], kv[0][0]))
    rec["sizes"] = [[fn, size, n] for (fn, size), n in top[:TOP_SIZES]]
    rec["distinct_sizes"] = len(merged)
    threads = []
    for t in rec.get("threads", []):
        by = {f: n for f, n in t.get("calls", {}).items() if n}
        threads.append({"tid": t.get("tid"), "exited": t.get("exited", False), "calls": sum(by.values()),
                        "by_function": by})
    threads.sort(key=lambda t: (t["exited"], -t["calls"]))
    rec["threads"] = threads
    del rec["format"]
    return rec


def size_ranges(hist: list[int]) -> list[tuple[int, int, int]]:
    """(low, high, calls) for each non-empty log2 bucket: bucket 0 is size 0, bucket b holds [2^(b-1), 2^b - 1]."""
    out = []
    for b, n in enumerate(hist):
        if not n:
            continue
        if b == 0:
            out.append((0, 0, n))
        else:
            out.append((1 << (b - 1), (1 << b) - 1, n))
    return out


def summarise(records: list[dict]) -> dict:
    """Totals over all processes, plus per-process summaries."""
    calls = {f: 0 for f in FUNCTIONS}
    hist = [0] * 65
    sizes: dict[int, dict[str, int]] = {}
    for r in records:
        for f, n in r.get("calls", {}).items():
            calls[f] = calls.get(f, 0) + n
        for b, n in enumerate(r.get("histogram_log2", [])):
            hist[b] += n
        for fn, size, n in r.get("sizes", []):
            sizes.setdefault(size, {})
            sizes[size][fn] = sizes[size].get(fn, 0) + n
    alloc_calls = sum(calls[f] for f in ALLOC_FUNCTIONS)
    total = sum(calls.values())
    top = sorted(((sum(v.values()), s, v) for s, v in sizes.items()), key=lambda t: (-t[0], t[1]))
    top_sizes = [{"size": s, "calls": n, "share": (n / alloc_calls if alloc_calls else 0.0), "by_function": v}
                 for n, s, v in top[:20]]
    procs = []
    for r in records:
        t = sum(r.get("calls", {}).values())
        el = r.get("elapsed_s", 0.0) or 0.0
        procs.append({"pid": r.get("pid"), "ppid": r.get("ppid"), "ended_by": r.get("ended_by"), "exe": r.get("exe"),
                      "cmdline": r.get("cmdline", "").replace(" ", " ").strip(), "calls": t, "elapsed_s": el,
                      "calls_per_s": (t / el if el > 0 else 0.0), "threads": len(r.get("threads", [])),
                      "peak_live_bytes": r.get("peak_live_bytes", 0), "peak_live_objects": r.get("peak_live_objects", 0)})
    busiest = max(records, key=lambda r: sum(r.get("calls", {}).values()), default=None)
    elapsed = busiest.get("elapsed_s", 0.0) if busiest else 0.0
    bcalls = sum(busiest.get("calls", {}).values()) if busiest else 0
    threads = []
    if busiest:
        threads = sorted(busiest.get("threads", []), key=lambda t: -t.get("calls", 0))
    return {
        "processes": len(records),
        "calls": calls,
        "total_calls": total,
        "allocation_calls": alloc_calls,
        "top_sizes": top_sizes,
        "distinct_sizes": max([len(sizes)] + [r.get("distinct_sizes", 0) for r in records]),
        "size_ranges": [{"low": lo, "high": hi, "calls": n} for lo, hi, n in size_ranges(hist)],
        "per_process": procs,
        "busiest_pid": busiest.get("pid") if busiest else None,
        "busiest_threads": threads,
        "peak_live_bytes": max((r.get("peak_live_bytes", 0) for r in records), default=0),
        "peak_live_objects": max((r.get("peak_live_objects", 0) for r in records), default=0),
        "calls_per_s": (bcalls / elapsed if elapsed > 0 else 0.0),
    }


def verdict(s: dict, wall_s: float) -> list[str]:
    """A few plain sentences on whether switching or tuning the allocator is likely to pay."""
    lines = []
    rate = s["calls_per_s"]
    total = s["total_calls"]
    if total == 0:
        return ["The program made no allocator calls that the tracer saw: the allocator does not matter for it "
                "(or it is statically linked)."]
    if rate < 20_000:
        lines.append(f"Low allocation rate ({rate:,.0f} calls/s): the allocator costs well under 1% of the run time; "
                     "switching will not speed it up noticeably (it may still change memory use: see `mallard vmem`).")
    elif rate < 1_000_000:
        lines.append(f"Moderate allocation rate ({rate:,.0f} calls/s): a faster allocator can save a few percent; "
                     "measure with `mallard bench -- CMD` before switching.")
    else:
        lines.append(f"High allocation rate ({rate:,.0f} calls/s): the allocator is on the hot path; switching "
                     "(mimalloc, jemalloc, tcmalloc or mallard) is likely to pay. Compare with `mallard bench -- CMD`.")
    threads = s["busiest_threads"]
    active = [t for t in threads if t.get("calls", 0) >= max(1, 0.05 * s["total_calls"] / max(1, s["processes"]))]
    if len(active) >= 2:
        lines.append(f"{len(active)} threads allocate: glibc gives each its own arena (64 MiB of address space each) and "
                     "serialises frees across threads; thread-caching allocators scale better here.")
    ac = max(1, s["allocation_calls"])
    big = sum(r["calls"] for r in s["size_ranges"] if r["low"] >= 128 * 1024)
    if big / ac > 0.01 and big > 100:
        lines.append(f"{big / ac:.0%} of allocations are 128 KiB or larger: glibc serves them with mmap/munmap each time "
                     "(raise M_MMAP_THRESHOLD via GLIBC_TUNABLES=glibc.malloc.mmap_threshold, or use an allocator that "
                     "reuses large extents).")
    re_calls = s["calls"].get("realloc", 0) + s["calls"].get("reallocarray", 0)
    if re_calls / ac > 0.2:
        lines.append(f"realloc is {re_calls / ac:.0%} of allocation calls: growth in place matters; allocators differ a "
                     "lot here (benchmark it).")
    if s["top_sizes"] and s["top_sizes"][0]["share"] > 0.5:
        t = s["top_sizes"][0]
        lines.append(f"One size dominates ({t['size']} bytes, {t['share']:.0%} of calls): a size-class allocator serves "
                     "it from a thread cache; check its rounding waste.")
    return lines
