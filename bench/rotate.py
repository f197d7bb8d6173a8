"""Paired comparison of libraries on one command: rounds in which every library runs the command once, in an order
rotated round by round; each round's figure and peak RSS are divided by the first library's of the same round, and
the medians and interquartile ranges of those ratios are printed (the per-pass figures of docs/PERFORMANCE.md's
issue 39 passes). Peak RSS comes from mallard-measure (build/bin) when it is there, as bench/run.py measures it."""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "tools" / "mallard" / "src"))

import mbench_rounds  # noqa: E402  (library_path)
import run as bench_run  # noqa: E402  (bench/run.py: rss_floor_note)
from mallard_cli import allocators as alloc_mod  # noqa: E402
from mallard_cli import measure  # noqa: E402


def parse_lib(spec: str) -> alloc_mod.Allocator:
    """NAME=PATH[@OPTIONS]: PATH empty or 'none' is the system's own malloc; OPTIONS go in MALLARD_CONF (Mallard only:
    allocators.conf_variable refuses them for others)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name:
        raise ValueError(f"--lib: '{spec}' is not NAME=PATH[@OPTIONS]")
    path, _, conf = rest.partition("@")
    return alloc_mod.Allocator(name, mbench_rounds.library_path("--lib", name, path), "unknown", conf or None)


def figure(metric: str, result: measure.RunResult) -> float:
    """The run's figure: 'wall' (seconds), else the first group of the regular expression in its standard output
    and error, as a number."""
    if metric == "wall":
        return result.wall_s
    m = re.search(metric, result.stdout + result.stderr)
    if not m or not m.groups():
        raise ValueError(f"no match for --metric {metric!r} in the output:\n{(result.stdout + result.stderr)[-1000:]}")
    return float(m.group(1))


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """Median and the interquartile range's ends (the median itself for fewer than 4 values)."""
    med = statistics.median(xs)
    if len(xs) < 4:
        return med, med, med
    q = statistics.quantiles(xs, n=4)
    return med, q[0], q[2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="rounds (each library once per round; default 10)")
    ap.add_argument("--metric", required=True,
                    help="'wall', or a regular expression whose first group is the run's figure in its output")
    ap.add_argument("--lib", action="append", required=True, metavar="NAME=PATH[@OPTIONS]",
                    help="a library to compare (two at least); the first is the one the others are divided by")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a run may take (default 300)")
    ap.add_argument("--json", metavar="FILE", help="also write every run's figure and peak RSS here")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its arguments")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    try:
        if not cmd:
            raise ValueError("no command: give it after --")
        if a.rounds < 1:
            raise ValueError("--rounds must be at least 1")
        if a.metric != "wall":
            re.compile(a.metric)
        libs = [parse_lib(s) for s in a.lib]
        if len(libs) < 2:
            raise ValueError("--lib: give two libraries at least")
        if len({lib.name for lib in libs}) != len(libs):
            raise ValueError("--lib: every library needs a name of its own")
        envs = [alloc_mod.preload_env(lib) for lib in libs]
    except (ValueError, re.error, alloc_mod.ConfNotApplicable) as e:
        print(f"rotate.py: {e}", file=sys.stderr)
        return 2
    note = bench_run.rss_floor_note(measure.helper_path())
    if note:
        print(f"rotate.py: {note}", file=sys.stderr)
    runs: dict[str, list[tuple[float, int]]] = {lib.name: [] for lib in libs}
    pairs = list(zip(libs, envs))
    for i in range(a.rounds):
        k = i % len(pairs)
        for lib, env in pairs[k:] + pairs[:k]:
            try:
                r = measure.run_measured(cmd, env, timeout=a.timeout)
                if r.returncode != 0:
                    raise ValueError(f"exit status {r.returncode}: {(r.stderr.strip() or r.stdout.strip())[-400:]}")
                runs[lib.name].append((figure(a.metric, r), r.max_rss_kib))
            except (ValueError, OSError, subprocess.TimeoutExpired) as e:
                print(f"rotate.py: {lib.name}, round {i + 1}: {e}", file=sys.stderr)
                return 1
    base = runs[libs[0].name]
    zero = [i + 1 for i, (f, _) in enumerate(base) if f == 0]
    if zero:
        print(f"rotate.py: {libs[0].name}'s figure is 0 in round {zero[0]}: nothing to divide by", file=sys.stderr)
        return 1
    for lib in libs:
        own = runs[lib.name]
        fig = quartiles([f / b[0] for (f, _), b in zip(own, base)])
        rss = quartiles([r / b[1] if b[1] else 1.0 for (_, r), b in zip(own, base)])
        print(f"{lib.name:16s} figure {statistics.median(f for f, _ in own):.4g}  x{fig[0]:.3f} "
              f"(IQR {fig[1]:.3f}-{fig[2]:.3f})  peak RSS {statistics.median(r for _, r in own) / 1024:.1f} MiB  "
              f"x{rss[0]:.3f} (IQR {rss[1]:.3f}-{rss[2]:.3f})")
    if a.json:
        Path(a.json).write_text(json.dumps({"command": cmd, "metric": a.metric, "rounds": a.rounds,
                                            "libs": {lib.name: {"path": lib.path, "conf": lib.conf} for lib in libs},
                                            "runs": {n: [{"figure": f, "max_rss_kib": r} for f, r in v]
                                                     for n, v in runs.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
