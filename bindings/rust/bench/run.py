#!/usr/bin/env python3
"""Runs the Rust allocation workloads under each global allocator, interleaved, and prints a Markdown table of medians.

Usage: python3 run.py [--repeats N] [--allocators system,mallard,mimalloc,jemalloc]  (after: cargo build --release)
"""
import argparse
import pathlib
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ALLOCATORS = ["system", "mallard", "mimalloc", "jemalloc"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    args = ap.parse_args()
    allocators = args.allocators.split(",")
    bins = {a: HERE / "target" / "release" / a for a in allocators}
    missing = [str(p) for p in bins.values() if not p.exists()]
    if missing:
        print(f"run.py: not built: {', '.join(missing)} (run: cargo build --release)", file=sys.stderr)
        return 2
    times: dict[tuple[str, str], list[float]] = {}
    order: list[str] = []
    for r in range(args.repeats):
        # Interleaved: every allocator runs once per round, in a rotating order, so drifts hit all alike.
        for a in allocators[r % len(allocators):] + allocators[:r % len(allocators)]:
            out = subprocess.run([str(bins[a])], capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                alloc, workload, secs = line.split()
                if workload not in order:
                    order.append(workload)
                times.setdefault((alloc, workload), []).append(float(secs))
    print(f"Median seconds of {args.repeats} interleaved runs (ratio to system in parentheses; lower is better).\n")
    print("| workload | " + " | ".join(allocators) + " |")
    print("|---|" + "---|" * len(allocators))
    for w in order:
        base = statistics.median(times[("system", w)]) if "system" in allocators else None
        cells = []
        for a in allocators:
            m = statistics.median(times[(a, w)])
            cells.append(f"{m:.3f}" + (f" ({m / base:.2f})" if base else ""))
        print(f"| {w} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
