"""`mallard bench`: runs a command under several allocators, interleaved, and compares time, CPU and peak RSS."""
from __future__ import annotations

import re
import statistics
import subprocess
from dataclasses import asdict, dataclass, field

from .allocators import Allocator, preload_env
from .measure import RunResult, exit_text, run_measured


@dataclass
class AllocRuns:
    alloc: Allocator
    runs: list[RunResult] = field(default_factory=list)
    metrics: list[float] = field(default_factory=list)
    failure: str | None = None  # why the command failed under this allocator

    def med(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.runs)

    def values(self, key: str) -> list[float]:
        if key == "cpu_s":
            return [r.user_s + r.sys_s for r in self.runs]
        if key == "metric":
            return list(self.metrics)
        return [float(getattr(r, key)) for r in self.runs]


def extract_metric(regex: re.Pattern, r: RunResult) -> float | None:
    for text in (r.stdout, r.stderr):
        m = regex.search(text)
        if m:
            s = m.group(1) if m.groups() else m.group(0)
            try:
                return float(s)
            except ValueError:
                return None
    return None


def run_bench(cmd: list[str], allocs: list[Allocator], n: int, warmup: int, metric: re.Pattern | None = None,
              timeout: float | None = None, conf: str | None = None, progress=None, task=None,
              base_env: dict | None = None, stdin_path: str | None = None) -> list[AllocRuns]:
    """Rounds of A B C ... (warm-up rounds first, not recorded). An allocator whose run fails is dropped from later rounds.
    Every run reads stdin_path from its start (or /dev/null); MALLARD_CONF (conf) reaches Mallard's variants only.

    Raises OSError when the command cannot start at all.
    """
    results = [AllocRuns(a) for a in allocs]
    envs = [preload_env(a, base_env, conf if a.name.startswith("mallard") else None) for a in allocs]
    for rnd in range(warmup + n):
        for res, env in zip(results, envs):
            if res.failure is None:
                label = f"{'warm-up' if rnd < warmup else 'round'} {rnd + 1 - (warmup if rnd >= warmup else 0)}: {res.alloc.name}"
                if progress is not None:
                    progress.update(task, description=label)
                try:
                    r = run_measured(cmd, env, timeout=timeout, stdin_path=stdin_path)
                except subprocess.TimeoutExpired:
                    res.failure = f"timed out after {timeout:g} s"
                    r = None
                if r is not None and r.returncode != 0:
                    tail = (r.stderr.strip().splitlines() or [""])[-1][:200]
                    res.failure = exit_text(r.returncode) + (f": {tail}" if tail else "")
                elif r is not None and rnd >= warmup:
                    if metric is not None:
                        v = extract_metric(metric, r)
                        if v is None:
                            res.failure = f"the output has no match for --metric-from-output {metric.pattern!r}"
                        else:
                            res.metrics.append(v)
                    if res.failure is None:
                        res.runs.append(r)
            if progress is not None:
                progress.advance(task)
    return results


def baseline(results: list[AllocRuns]) -> AllocRuns | None:
    ok = [r for r in results if r.failure is None and r.runs]
    for r in ok:  # the C library's own malloc: glibc's, or musl's for a musl program
        if r.alloc.name in ("glibc", "musl"):
            return r
    return ok[0] if ok else None


def to_json(cmd: list[str], results: list[AllocRuns], n: int, warmup: int, metric: str | None) -> dict:
    return {
        "command": cmd,
        "rounds": n,
        "warmup": warmup,
        "metric_regex": metric,
        "order": "interleaved",
        "allocators": [
            {"name": r.alloc.name, "path": r.alloc.path, "version": r.alloc.version, "failure": r.failure,
             "runs": [{k: v for k, v in asdict(x).items() if k not in ("stdout", "stderr")} for x in r.runs],
             "metrics": r.metrics,
             "median": ({"wall_s": r.med("wall_s"), "cpu_s": statistics.median(r.values("cpu_s")),
                         "max_rss_kib": r.med("max_rss_kib"),
                         "metric": statistics.median(r.metrics) if r.metrics else None} if r.runs else None)}
            for r in results],
    }


def plot(results: list[AllocRuns], path: str, title: str, metric_name: str | None) -> None:
    """Bars of the medians with min-max whiskers: time (or the program's own figure) and peak RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.runs]
    panels = [("wall_s", "wall time (s)", 1.0), ("max_rss_kib", "peak RSS (MiB)", 1 / 1024)]
    if metric_name and any(r.metrics for r in ok):
        panels.insert(0, ("metric", metric_name, 1.0))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2))
    names = [r.alloc.name for r in ok]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, label, scale) in zip(axes, panels):
        meds, lo, hi = [], [], []
        for r in ok:
            vals = [v * scale for v in r.values(key)]
            m = statistics.median(vals) if vals else 0.0
            meds.append(m)
            lo.append(m - min(vals) if vals else 0.0)
            hi.append(max(vals) - m if vals else 0.0)
        x = range(len(ok))
        ax.bar(x, meds, yerr=[lo, hi], capsize=4, color=[colors[i % len(colors)] for i in x], alpha=0.85)
        ax.set_xticks(list(x))
        # Names, labels and the title are the user's strings: never parsed as mathtext ($...$).
        ax.set_xticklabels(names, rotation=30, ha="right", parse_math=False)
        ax.set_title(label, parse_math=False)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10, parse_math=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

