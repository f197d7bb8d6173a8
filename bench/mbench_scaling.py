"""Scaling report: cross-thread workloads per thread count, ns per operation and peak RSS, ratios to the best peer."""
from __future__ import annotations

import re
import statistics
from pathlib import Path

# What one operation is in each workload's RESULT "ops", as the tables name it.
OPERATION = {
    "xstorm": "object (allocated by a producer, checked and freed by a consumer)",
    "server": "replacement (free + malloc of a 16-1000 B object)",
    "localremote": "object (allocated, then freed by its own thread or the next one)",
    "larson": "replacement (free + malloc of a 16-1000 B object)",
    "succession": "replacement (free + malloc of a 16-1000 B object)",
    "prodcons": "object (allocated by a producer, freed by its consumer)",
}
# Workloads whose threads come in producer/consumer pairs: at -t 1 they still run two threads, so they start at 2.
PAIRED = {"xstorm", "prodcons"}


def ns_per_op(run: dict) -> float | None:
    """Elapsed nanoseconds per operation of one successful run, from the workload's own RESULT (its timed part)."""
    m = run.get("metrics") or {}
    ops, secs = m.get("ops"), m.get("seconds")
    if not ops or secs is None or ops <= 0:
        return None
    return 1e9 * secs / ops


def failed(c: dict, name: str) -> dict | None:
    """The failure record of allocator `name` in cell c (not run, or a run that failed), None when every run succeeded."""
    runs = c["runs"].get(name, [])
    bad = [r for r in runs if not r["ok"]]
    if runs and not bad:
        return None
    return {"ok": False, "error": bad[0]["error"] if bad else "not run", "failed_runs": len(bad), "runs": len(runs),
            "repro": c.get("repro", {}).get(name, "")}


def rate(per: dict, peers: tuple, metric: str) -> tuple | None:
    """(best median, its peer) of `metric` among the peers that succeeded in a cell, and `<metric>_ratio` set on every
    allocator that succeeded; None when no peer has the figure."""
    cands = [(per[p][metric], p) for p in peers if p in per and per[p]["ok"] and per[p][metric]]
    if not cands:
        return None
    best = min(cands)
    for s in per.values():
        if s["ok"] and s[metric]:
            s[metric + "_ratio"] = s[metric] / best[0]
    return best


def summarize(raw: dict, peers: tuple) -> dict:
    """Per workload, thread count and allocator: ok/error, median ns/op and peak RSS (KiB), and each one's ratio to
    the best peer's median at that thread count (lower is better for both)."""
    out: dict = {}
    for c in raw["cells"]:
        w = out.setdefault(c["workload"], {})
        per = {}
        for name in raw["allocators"]:
            per[name] = failed(c, name)
            if per[name] is not None:
                continue
            runs = c["runs"][name]
            ns = [x for x in (ns_per_op(r) for r in runs) if x is not None]
            rss = [r["max_rss_kib"] for r in runs if r["max_rss_kib"] is not None]
            per[name] = {"ok": bool(ns), "error": None if ns else "no operations reported",
                         "ns": statistics.median(ns) if ns else None, "rss": statistics.median(rss) if rss else None,
                         "ops_per_s": 1e9 / statistics.median(ns) if ns else None, "runs": len(runs)}
        for metric in ("ns", "rss"):
            rate(per, peers, metric)
        w[c["threads"]] = per
    return out


def _table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def _num(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _grid(raw: dict, per_t: dict, metric: str, scale: float, threads: list) -> str:
    """Rows: allocators; columns: thread counts; each entry the median and ×ratio to the best peer, best in bold."""
    rows = []
    best = {t: min((s[metric] for s in per_t[t].values() if s["ok"] and s[metric]), default=None)
            for t in threads if t in per_t}
    for a in raw["allocators"]:
        row = [a]
        for t in threads:
            s = per_t.get(t, {}).get(a)
            if s is None:
                row.append("–")
                continue
            if not s["ok"]:
                row.append("**FAIL**")
                continue
            txt = _num(s[metric] * scale)
            if s.get(metric + "_ratio"):
                txt += f" ×{s[metric + '_ratio']:.2f}"
            if s[metric] == best.get(t):
                txt = f"**{txt}**"
            row.append(txt)
        rows.append(row)
    return _table(["allocator"] + [f"{t} thr" for t in threads], rows)


def markdown(raw: dict, summary: dict, level: int = 1, peers: tuple = ()) -> str:
    """The scaling report; `level` is the heading level of its title (1 for results.md, 2 inside a docs section)."""
    h = "#" * level
    m = raw["machine"]
    threads = sorted({c["threads"] for c in raw["cells"]})
    present_peers = [p for p in peers if p in raw["allocators"]]
    out = [f"{h} Scaling: {', '.join(summary)} at {', '.join(map(str, threads))} threads ({raw['started']})", "",
           f"Machine: {m['cpu']}, {m['cores']} cores (os.cpu_count), {m['memory_gib']} GiB, kernel {m['kernel']}, "
           f"{m['os']}; git {m['git']}.", "",
           "Allocators: " + ", ".join(f"{n} {v['version']}" + (f" (`{v['path']}`)" if v["path"] else "")
                                      for n, v in m["allocators"].items()) + ".", "",
           f"Command: `{raw['command']}`", "",
           f"Method: every allocator runs each workload at each thread count, interleaved (A B C A B C …, the first "
           f"one rotating), {raw['repeats']} time(s); problem sizes of the {raw['sizes']} mode, the same total work at "
           "every thread count (server: the same run time). Time: median nanoseconds per operation, elapsed over "
           "the workload's timed part divided by its operations (= milliseconds per million operations; for the "
           "fixed-time server the throughput's reciprocal), lower is better. ×: ratio to the best peer's median at "
           "that thread count (" + (", ".join(present_peers) or "no peer in this run") + "), lower is better; "
           "the best median of a column is bold. Peak RSS: median of the process's ru_maxrss. "
           "FAIL: a run crashed, timed out or failed its own check; –: not run at that thread count."]
    if threads and max(threads) > (m.get("cores") or 0):
        out[-1] += f" Thread counts above {m['cores']} oversubscribe this machine's cores."
    out.append("")
    for w, per_t in summary.items():
        op = OPERATION.get(w, "operation")
        note = " (starts at 2 threads: one producer and one consumer)" if w in PAIRED else ""
        out += [f"{h}# {w}{note}", "", f"ns per {op}:", "", _grid(raw, per_t, "ns", 1.0, threads), "",
                "Peak RSS (MiB):", "", _grid(raw, per_t, "rss", 1 / 1024, threads), ""]
    fails = [(w, t, a, s) for w, per_t in summary.items() for t, per in per_t.items() for a, s in per.items()
             if not s["ok"]]
    if fails:
        out += [f"{h}# Failures", "", _table(["workload", "threads", "allocator", "error", "reproduce"], [
            [w, t, a, (s["error"] or "").replace("|", "\\|").replace("\n", " ")[:200], f"`{s.get('repro', '')}`"]
            for w, t, a, s in fails]), ""]
    return "\n".join(out)


SECTION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def markers(name: str, kind: str = "scaling") -> tuple[str, str]:
    """The comment lines around section `name` of a mode (`kind`: scaling or mbench)."""
    return f"<!-- {kind}:{name} begin -->", f"<!-- {kind}:{name} end -->"


def replace_section(doc: str, name: str, body: str, kind: str = "scaling") -> str:
    """doc with the text between the markers of section `name` (of mode `kind`) replaced by body (markers kept); a
    section not yet there is appended at the end, after everything else (so a full-mode rewrite, which keeps the
    page's tail, keeps it too). Raises ValueError for a bad name or markers out of order."""
    if not SECTION_NAME.match(name):
        raise ValueError(f"section name {name!r}: letters, digits, '.', '_' and '-' only")
    begin, end = markers(name, kind)
    block = f"{begin}\n{body.strip()}\n{end}"
    i, j = doc.find(begin), doc.find(end)
    if i < 0 and j < 0:
        return doc.rstrip("\n") + ("\n\n" if doc.strip() else "") + block + "\n"
    if i < 0 or j < i or doc.count(begin) > 1 or doc.count(end) > 1:
        raise ValueError(f"the markers of section {name!r} are missing, repeated or out of order")
    return doc[:i] + block + doc[j + len(end):]


def write_docs_section(path: Path, name: str, body: str, kind: str = "scaling") -> None:
    """Writes or replaces section `name` (of mode `kind`) of the markdown file at path (created when absent)."""
    old = path.read_text() if path.exists() else "# Performance\n"
    path.write_text(replace_section(old, name, body, kind))


def plot(raw: dict, summary: dict, out_dir: Path) -> Path | None:
    """scaling.png: throughput (M operations/s) against threads, one panel per workload, one line per allocator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not summary:
        return None
    n = len(summary)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.4), squeeze=False)
    for ax, (w, per_t) in zip(axes[0], summary.items()):
        ts = sorted(per_t)
        for a in raw["allocators"]:
            pts = [(t, per_t[t][a]["ops_per_s"] / 1e6) for t in ts if per_t[t].get(a, {}).get("ok")]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=a)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ts)
        ax.set_xticklabels([str(t) for t in ts])
        ax.set_title(w)
        ax.set_xlabel("threads")
        ax.set_ylabel("M ops/s (higher is better)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    f = out_dir / "scaling.png"
    fig.savefig(f, dpi=110)
    plt.close(fig)
    return f
