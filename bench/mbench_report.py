"""Benchmark reporting: medians and ranges, ratios to the best peer, geometric means, markdown, plots, PERFORMANCE.md."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

# Figures shown in the per-workload table, with their units.
FIGURE_UNITS = {
    "ops_per_s": "ops/s", "requests_per_s": "req/s", "seconds": "s", "rss_loaded_kib": "KiB",
    "rss_flushed_kib": "KiB", "rss_after_threads_kib": "KiB", "rss_with_survivors_kib": "KiB",
    "rss_all_freed_kib": "KiB", "rss_after_wait_kib": "KiB", "virt_alloc_per_thread_kib": "KiB",
    "rss_alloc_per_thread_kib": "KiB", "data_alloc_per_thread_kib": "KiB", "lifo_s": "s", "fifo_s": "s",
    "random_s": "s", "list_s": "s", "misaligned": "blocks", "ns_pair_16": "ns", "ns_pair_64": "ns",
    "ns_pair_256": "ns", "ns_pair_1024": "ns", "ns_pair_8192": "ns", "ns_remote_free": "ns",
}


def _stats(values: list) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def _geomean(xs: list) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def run_times(cell: dict, run: dict) -> tuple:
    """(wall, CPU) of one successful run as the tables compare them: the process's own seconds, except for a
    fixed-time workload (server), whose run time is set in advance: there both are seconds per million of its
    operations (its RESULT's seconds and the process's CPU time, each divided by its operations), so that lower is
    better in every time table and every ratio."""
    if not cell.get("fixed_time"):
        return run["wall_s"], run["cpu_s"]
    ops = run["metrics"].get("ops") or 0
    secs = run["metrics"].get("seconds")
    if ops <= 0 or secs is None:
        return None, None
    return 1e6 * secs / ops, (1e6 * run["cpu_s"] / ops if run["cpu_s"] is not None else None)


PER_MOP_NOTE = ("†: a fixed-time workload (it runs for a set time and counts what it gets done): its time entries are "
                "seconds per million operations (1e6 / ops_per_s; CPU: CPU seconds / operations × 1e6), not the "
                "length of the run, so lower is better there too.")


def summarize(raw: dict, peers: tuple) -> dict:
    """Per cell and allocator: status, median/min/max of wall, CPU and peak RSS, median figures, ratios to best peer."""
    allocs = raw["allocators"]
    cells = {}
    failures = []
    for c in raw["cells"]:
        per = {}
        for name in allocs:
            runs = c["runs"].get(name, [])
            bad = [r for r in runs if not r["ok"]]
            if not runs or bad:
                err = bad[0]["error"] if bad else "not run"
                per[name] = {"ok": False, "error": err, "failed_runs": len(bad), "runs": len(runs)}
                failures.append({"cell": c["id"], "allocator": name, "error": err, "failed_runs": len(bad),
                                 "runs": len(runs), "repro": c["repro"].get(name, "")})
                continue
            figs = {}
            keys = set().union(*(r["metrics"].keys() for r in runs))
            for k in keys:
                vals = [r["metrics"].get(k) for r in runs]
                if all(isinstance(v, (int, float)) for v in vals):
                    figs[k] = statistics.median(vals)
                elif all(isinstance(v, list) for v in vals) and len({len(v) for v in vals}) == 1:
                    figs[k] = [statistics.median(col) for col in zip(*vals)]
            times = [run_times(c, r) for r in runs]
            per[name] = {"ok": True, "wall": _stats([w for w, _ in times]), "cpu": _stats([u for _, u in times]),
                         "rss": _stats([r["max_rss_kib"] for r in runs]), "figures": figs}
        for metric in ("wall", "cpu", "rss"):
            best_name, best = None, None
            for p in peers:
                s = per.get(p)
                if s and s["ok"] and (best is None or s[metric]["median"] < best):
                    best_name, best = p, s[metric]["median"]
            for name, s in per.items():
                if s["ok"] and best:
                    s[metric]["ratio"] = s[metric]["median"] / best
                    s[metric]["best_peer"] = best_name
        cells[c["id"]] = {"workload": c["workload"], "threads": c["threads"], "timed": c["timed"],
                          "fixed_time": bool(c.get("fixed_time")), "stresses": c["stresses"],
                          "figures": c["figures"], "per": per}

    geo = {}
    for name in allocs:
        g = {}
        for metric in ("wall", "cpu", "rss"):
            rs = [cl["per"][name][metric].get("ratio") for cl in cells.values()
                  if cl["per"][name]["ok"] and (cl["timed"] or metric == "rss")]
            rs = [r for r in rs if r]
            g[metric] = _geomean(rs)
            g[metric + "_n"] = len(rs)
        geo[name] = g

    # Mallard's variants against each peer, over the cells where both ran: the brief's targets are stated this way.
    pairwise = {}
    for m in [a for a in allocs if a.startswith("mallard")]:
        pairwise[m] = {}
        for p in [a for a in allocs if a in peers]:
            row = {}
            for metric in ("wall", "rss"):
                rs = [cl["per"][m][metric]["median"] / cl["per"][p][metric]["median"] for cl in cells.values()
                      if cl["per"][m]["ok"] and cl["per"][p]["ok"] and (cl["timed"] or metric == "rss")
                      and cl["per"][p][metric]["median"] > 0]
                row[metric] = _geomean(rs)
                row[metric + "_n"] = len(rs)
            pairwise[m][p] = row

    behind = {}
    for m in [a for a in allocs if a.startswith("mallard")]:
        rows = []
        for cid, cl in cells.items():
            s = cl["per"][m]
            if not s["ok"]:
                continue
            for metric in ("wall", "rss"):
                if metric == "wall" and not cl["timed"]:
                    continue
                r = s[metric].get("ratio")
                if r and r > 1.0:
                    rows.append({"cell": cid, "metric": metric, "ratio": r, "best_peer": s[metric]["best_peer"],
                                 "stresses": cl["stresses"]})
        behind[m] = sorted(rows, key=lambda x: -x["ratio"])

    # Wrong answers that a workload counts rather than dies of (e.g. misaligned blocks): listed, not hidden.
    defects = []
    for cid, cl in cells.items():
        for name, st in cl["per"].items():
            if st["ok"] and st["figures"].get("misaligned"):
                defects.append({"cell": cid, "allocator": name,
                                "what": f"{st['figures']['misaligned']:.0f} misaligned blocks (median per run)"})

    fast = {}
    for name, runs in (raw.get("fastpath") or {}).items():
        ok = [r for r in runs if r["ok"]]
        if not ok:
            fast[name] = {"error": runs[0]["error"] if runs else "not run"}
            continue
        keys = sorted({k for r in ok for k in r["metrics"] if k.startswith("ns_")},
                      key=lambda k: (k == "ns_remote_free", int(k.rsplit("_", 1)[1]) if k[-1].isdigit() else 0))
        fast[name] = {k: _stats([r["metrics"].get(k) for r in ok]) for k in keys}
    return {"cells": cells, "geomean": geo, "pairwise": pairwise, "behind": behind, "failures": failures,
            "defects": defects, "fastpath": fast}


def _fmt(x: float, unit: str = "") -> str:
    if x is None:
        return "–"
    if unit == "MiB":
        return f"{x:.1f}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _metric_table(raw: dict, summary: dict, metric: str, scale: float = 1.0, unit: str = "") -> str:
    allocs = raw["allocators"]
    rows = []
    for cid, cl in summary["cells"].items():
        if metric != "rss" and not cl["timed"]:
            continue
        row = [cid + (" †" if cl.get("fixed_time") and metric != "rss" else "")]
        best = min((s[metric]["median"] for s in cl["per"].values() if s["ok"]), default=None)
        for a in allocs:
            s = cl["per"][a]
            if not s["ok"]:
                row.append("**FAIL**")
                continue
            st = s[metric]
            txt = f"{_fmt(st['median'] * scale, unit)} ({_fmt(st['min'] * scale, unit)}–{_fmt(st['max'] * scale, unit)})"
            if st.get("ratio"):
                txt += f" ×{st['ratio']:.2f}"
            if st["median"] == best:
                txt = f"**{txt}**"
            row.append(txt)
        rows.append(row)
    return _table(["cell"] + allocs, rows)


def markdown(raw: dict, summary: dict) -> str:
    allocs = raw["allocators"]
    m = raw["machine"]
    out = [f"# Benchmark results: {raw['mode']} mode, {raw['started']}", "",
           f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, kernel {m['kernel']}, {m['os']}. "
           f"Allocators: " + ", ".join(f"{n} {v['version']}" for n, v in m["allocators"].items()) +
           f". {m['python']}, SQLite {m['sqlite']}, Redis {m['redis']}, git {m['git']}.", "",
           f"Command: `{raw['command']}`", "",
           f"{raw['repeats']} interleaved repeats per allocator and cell; each entry is the median (min–max) and "
           "×ratio to the best of the peers (" + ", ".join(a for a in allocs if a in raw.get("peers", allocs)
                                                   and not a.startswith("mallard")) +
           "); the best median of a row is bold. FAIL: at least one run crashed, timed out or failed its own "
           "check (see Failures)."]
    if any(cl.get("fixed_time") for cl in summary["cells"].values()):
        out[-1] += " " + PER_MOP_NOTE
    out += [""]
    out += ["## Wall time (s)", "", _metric_table(raw, summary, "wall"), ""]
    out += ["## CPU time, user + system (s)", "", _metric_table(raw, summary, "cpu"), ""]
    out += ["## Peak RSS (MiB)", "", _metric_table(raw, summary, "rss", 1 / 1024, "MiB"), ""]

    out += ["## Geometric means of the ratios to the best peer", "",
            "Lower is better; 1.00 would mean best in every cell. Time over the timed cells, RSS over all cells.", ""]
    rows = []
    for a in allocs:
        g = summary["geomean"][a]
        rows.append([a] + [f"{g[k]:.3f} (n={g[k + '_n']})" if g[k] else "–" for k in ("wall", "cpu", "rss")])
    out += [_table(["allocator", "wall time", "CPU time", "peak RSS"], rows), ""]
    if summary["pairwise"]:
        out += ["### Mallard against each peer (geometric mean of Mallard / peer)", ""]
        rows = []
        for mname, per in summary["pairwise"].items():
            for p, r in per.items():
                rows.append([mname, p, f"{r['wall']:.3f} (n={r['wall_n']})" if r["wall"] else "–",
                             f"{r['rss']:.3f} (n={r['rss_n']})" if r["rss"] else "–"])
        out += [_table(["variant", "peer", "time ratio", "peak RSS ratio"], rows), ""]

    out += _targets(raw, summary)
    out += ["## Workload figures (medians)", ""]
    rows = []
    for cid, cl in summary["cells"].items():
        for f in cl["figures"]:
            row = [cid, f"{f} ({FIGURE_UNITS.get(f, '')})"]
            for a in allocs:
                s = cl["per"][a]
                v = s["figures"].get(f) if s["ok"] else None
                row.append(_fmt(v) if isinstance(v, (int, float)) else ("FAIL" if not s["ok"] else "–"))
            rows.append(row)
    out += [_table(["cell", "figure"] + allocs, rows), ""]

    frag = summary["cells"].get("fragmentation/t1")
    if frag:
        out += ["## Fragmentation over time (RSS in MiB after each phase's 90% free)", "",
                "Phases: small 16–64 B, medium 64–1024 B, mixed 16 B–16 KiB, large 16–256 KiB, small again; "
                "10% of every phase survives to the end. `freed`: after freeing everything; `waited`: after the "
                "pause given with -w.", ""]
        rows = []
        for a in allocs:
            s = frag["per"][a]
            if not s["ok"]:
                rows.append([a, "FAIL"])
                continue
            f = s["figures"]
            ph = f.get("rss_after_phase_kib", [])
            rows.append([a, _fmt(f.get("rss_start_kib", 0) / 1024, "MiB")] + [_fmt(x / 1024, "MiB") for x in ph] +
                        [_fmt(f.get("rss_all_freed_kib", 0) / 1024, "MiB"),
                         _fmt(f.get("rss_after_wait_kib", 0) / 1024, "MiB")])
        out += [_table(["allocator", "start", "small", "medium", "mixed", "large", "small again", "freed",
                        "waited"], rows), ""]

    if summary["fastpath"]:
        out += ["## Fast path: ns per malloc/free pair (tight loop) and per remote free", "",
                "Median (min–max) over the repeats; remote free: one thread frees blocks of 64 B that another "
                "allocated, timed in the freeing thread.", ""]
        keys = []
        for v in summary["fastpath"].values():
            keys += [k for k in v if k.startswith("ns_") and k not in keys]
        rows = []
        for a in allocs:
            v = summary["fastpath"].get(a, {})
            if "error" in v:
                rows.append([a] + ["FAIL"] * len(keys))
                continue
            rows.append([a] + [f"{_fmt(v[k]['median'])} ({_fmt(v[k]['min'])}–{_fmt(v[k]['max'])})"
                               if v.get(k) else "–" for k in keys])
        out += [_table(["allocator"] + [k.replace("ns_pair_", "").replace("ns_remote_free", "remote free") +
                                                   (" B" if k[-1].isdigit() else "") for k in keys], rows), ""]
    cg = raw.get("callgrind")
    if cg and "error" not in cg:
        sizes = sorted({s for v in cg.values() for s in v}, key=int)
        out += ["## Instructions per malloc/free pair (callgrind)", "",
                "`valgrind --tool=callgrind` on mallard-bench-fastpath with the allocator preloaded; "
                "(Ir of 60,000 pairs − Ir of 20,000 pairs) / 40,000. Repeatable where wall time is noisy.", ""]
        out += [_table(["allocator"] + [f"{s} B" for s in sizes],
                       [[a] + [_fmt(cg[a].get(s)) if cg[a].get(s) is not None else "FAIL" for s in sizes]
                        for a in cg]), ""]
    elif cg:
        out += [f"Callgrind: {cg['error']}", ""]

    for mname, rows in summary["behind"].items():
        out += [f"## Where {mname} is behind the best peer", ""]
        if not rows:
            out += [f"{mname} is at or ahead of the best peer in every cell it completed.", ""]
        for metric, label in (("wall", "Time"), ("rss", "Peak RSS")):
            sel = [r for r in rows if r["metric"] == metric]
            if not sel:
                continue
            out += [f"### {label}", "",
                    f"Generated from the tables above: every cell where {mname}'s median exceeds the best peer's, "
                    "worst first" + ("; ✗ marks cells beyond the brief's limit of 1.25× the best peer."
                                     if metric == "wall" else "."), ""]
            out += [_table(["cell", "ratio", "best peer", "what the workload stresses"],
                           [[r["cell"], f"{r['ratio']:.2f}" + (" ✗" if metric == "wall" and r["ratio"] > 1.25 else ""),
                             r["best_peer"], r["stresses"]] for r in sel]), ""]
    if summary["defects"]:
        out += ["## Defects observed", "", "Runs that completed but returned wrong blocks; their times are listed "
                "above all the same.", ""]
        out += [_table(["cell", "allocator", "defect"], [[d["cell"], d["allocator"], d["what"]]
                                                         for d in summary["defects"]]), ""]
    if summary["failures"]:
        out += ["## Failures", "", "Each failed cell with its first error and a command that reproduces it.", ""]
        out += [_table(["cell", "allocator", "failed runs", "error", "reproduce"],
                       [[f["cell"], f["allocator"], f"{f['failed_runs']}/{f['runs']}",
                         f["error"].replace("|", "\\|").replace("\n", " ")[:200], f"`{f['repro']}`"]
                        for f in summary["failures"]]), ""]
    return "\n".join(out)


def _targets(raw: dict, summary: dict) -> list:
    """The brief's numbers to beat (DESIGN.md §4), checked against this run for each Mallard variant."""
    out = []
    for m in [a for a in raw["allocators"] if a.startswith("mallard")]:
        rows = []
        pw = summary["pairwise"].get(m, {})

        def verdict(ok):
            return "met" if ok else "**not met**"

        for peer, limit in (("mimalloc", 0.95), ("jemalloc", 0.9), ("tcmalloc", 0.9)):
            r = pw.get(peer, {}).get("wall")
            if r:
                rows.append([f"time vs {peer} (geometric mean)", f"≤ {limit}", f"{r:.3f}", verdict(r <= limit)])
        timed = [(cid, cl["per"][m]["wall"].get("ratio")) for cid, cl in summary["cells"].items()
                 if cl["timed"] and cl["per"][m]["ok"]]
        worst = max(timed, key=lambda x: x[1] or 0, default=None)
        if worst and worst[1]:
            over = [c for c, r in timed if r and r > 1.25]
            rows.append(["no workload slower than 1.25× the best peer", "≤ 1.25",
                         f"worst {worst[1]:.2f} ({worst[0]}); {len(over)} over", verdict(not over)])
        failed = [cid for cid, cl in summary["cells"].items() if not cl["per"][m]["ok"]]
        if failed:
            rows.append(["every workload completes", "0 failures", ", ".join(failed), "**not met**"])
        gm, gmi = summary["geomean"][m]["rss"], summary["geomean"].get("mimalloc", {}).get("rss")
        if gm and gmi:
            rows.append(["peak RSS geometric mean ≤ mimalloc's", f"≤ {gmi:.3f}", f"{gm:.3f}", verdict(gm <= gmi)])
        v = summary["cells"].get("vmem/t10", {}).get("per", {}).get(m)
        if v and v["ok"]:
            x = v["figures"].get("virt_alloc_per_thread_kib")
            rows.append(["VIRT per thread for one malloc(8)", "≤ 2048 KiB", f"{x:.0f} KiB", verdict(x <= 2048)])
        f = summary["cells"].get("fragmentation/t1", {}).get("per", {}).get(m)
        if f and f["ok"]:
            st, w = f["figures"].get("rss_start_kib"), f["figures"].get("rss_after_wait_kib")
            if st and w:
                rows.append(["RSS after freeing all and waiting, vs start", "≤ 1.10×", f"{w / st:.2f}× "
                             f"({w / 1024:.1f} vs {st / 1024:.1f} MiB)", verdict(w <= 1.1 * st)])
        fp = summary["fastpath"]
        if m in fp and "error" not in fp[m]:
            worst_fp = None
            for k, st in fp[m].items():
                if not k.startswith("ns_pair_") or not st:
                    continue
                best = min((fp[p][k]["median"] for p in fp if not p.startswith("mallard") and "error" not in fp[p]
                            and fp[p].get(k)), default=None)
                if best:
                    r = st["median"] / best
                    if worst_fp is None or r > worst_fp[1]:
                        worst_fp = (k, r)
            if worst_fp:
                rows.append(["fast path within 1.5× the best peer", "≤ 1.5×",
                             f"worst {worst_fp[1]:.2f}× ({worst_fp[0].replace('ns_pair_', '')} B)",
                             verdict(worst_fp[1] <= 1.5)])
        if m == "mallard-secure" and "mallard" in raw["allocators"]:
            rs = [cl["per"][m]["wall"]["median"] / cl["per"]["mallard"]["wall"]["median"]
                  for cl in summary["cells"].values()
                  if cl["timed"] and cl["per"][m]["ok"] and cl["per"]["mallard"]["ok"]]
            g = _geomean(rs)
            if g:
                rows.append(["time vs the fast variant (geometric mean)", "≤ 1.10", f"{g:.3f} (n={len(rs)})",
                             verdict(g <= 1.10)])
        if rows:
            out += [f"## {m} against the brief's targets (DESIGN.md §4)", "",
                    _table(["target", "limit", "this run", "verdict"], rows), ""]
    return out


def plots(raw: dict, summary: dict, out_dir: Path) -> list:
    """Bar charts of time and RSS ratios, fragmentation RSS over phases and fast-path ns; returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    allocs = raw["allocators"]
    files = []

    def save(fig, fname):
        """Lay out, write and close a figure; remember its path."""
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)
        files.append(out_dir / fname)

    for metric, title, fname in (("wall", "Wall time / best peer (lower is better)", "time_ratio.png"),
                                 ("rss", "Peak RSS / best peer (lower is better)", "rss_ratio.png")):
        ids = [cid for cid, cl in summary["cells"].items() if cl["timed"] or metric == "rss"]
        if not ids:
            continue
        fig, ax = plt.subplots(figsize=(max(8, len(ids) * 0.6), 4.5))
        w = 0.8 / max(1, len(allocs))
        for i, a in enumerate(allocs):
            vals = [summary["cells"][c]["per"][a][metric].get("ratio", 0) if summary["cells"][c]["per"][a]["ok"]
                    else 0 for c in ids]
            ax.bar([x + i * w for x in range(len(ids))], vals, w, label=a)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks([x + w * (len(allocs) - 1) / 2 for x in range(len(ids))])
        ax.set_xticklabels(ids, rotation=60, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{title}; {raw['mode']} mode, median of {raw['repeats']}")
        ax.legend(fontsize=8, ncol=len(allocs))
        save(fig, fname)
    frag = summary["cells"].get("fragmentation/t1")
    if frag:
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = ["start", "small", "medium", "mixed", "large", "small again", "freed", "waited"]
        for a in allocs:
            s = frag["per"][a]
            if not s["ok"]:
                continue
            f = s["figures"]
            ys = [f.get("rss_start_kib", 0)] + list(f.get("rss_after_phase_kib", [])) + \
                 [f.get("rss_all_freed_kib", 0), f.get("rss_after_wait_kib", 0)]
            ax.plot(range(len(ys)), [y / 1024 for y in ys], marker="o", label=a)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30)
        ax.set_ylabel("RSS (MiB)")
        ax.set_title("Memory over time: RSS after each phase")
        ax.legend(fontsize=8)
        save(fig, "fragmentation.png")
    fp = {a: v for a, v in summary["fastpath"].items() if "error" not in v}
    if fp:
        keys = []
        for v in fp.values():
            keys += [k for k in v if k not in keys]
        fig, ax = plt.subplots(figsize=(8, 4))
        w = 0.8 / max(1, len(fp))
        for i, (a, v) in enumerate(fp.items()):
            ax.bar([x + i * w for x in range(len(keys))], [v[k]["median"] if v.get(k) else 0 for k in keys], w,
                   label=a)
        ax.set_xticks([x + w * (len(fp) - 1) / 2 for x in range(len(keys))])
        ax.set_xticklabels([k.replace("ns_pair_", "pair ").replace("ns_", "") for k in keys])
        ax.set_ylabel("ns")
        ax.set_title("Fast path: ns per malloc/free pair and per remote free")
        ax.legend(fontsize=8)
        save(fig, "fastpath.png")
    return files


KEEP_MARKER = "<!-- Sections below come from other benchmarks (see each); bench/run.py keeps them when it rewrites the page. -->"


def kept_sections(old_doc: str) -> str:
    """The part of the current page from KEEP_MARKER on (the Rust crate's table, ...), or nothing."""
    i = old_doc.find(KEEP_MARKER)
    return old_doc[i:] if i >= 0 else ""


def performance_doc(raw: dict, summary: dict, md: str, out_dir: Path, kept: str = "") -> str:
    """docs/PERFORMANCE.md: how the figures were made, then the full-mode tables, all generated; `kept` at the end."""
    body = md.split("\n", 1)[1]
    return "\n".join([
        "# Performance", "",
        "Everything on this page is generated by the benchmark suite (`bench/`, see bench/README.md) from one "
        "run; nothing is edited by hand. Regenerate it with the command below after a full build.", "",
        "Notes on method: allocators are run interleaved (A B C A B C …) on the same machine in the same run; "
        "wall time, CPU time (user + system) and peak RSS (`wait4` ru_maxrss; for Redis the server's VmHWM) are "
        "per process. Every C workload writes a byte pattern into each object and checks it before each free; a "
        "mismatch fails the run. Redis links jemalloc on Debian, so its glibc row preloads glibc's libc.so.6 to "
        "put glibc's malloc first. The Python reader runs with and without `PYTHONMALLOC=malloc`; the other "
        "Python workload uses `PYTHONMALLOC=malloc` so the allocator under test sees every object.",
        "", f"Raw data and plots of this run: `{_where(out_dir)}` "
        "(results/ is not committed).", "", body.rstrip("\n"), "", kept or KEEP_MARKER, ""])


def _where(p: Path) -> str:
    repo = Path(__file__).resolve().parents[1]
    try:
        return str(p.resolve().relative_to(repo))
    except ValueError:
        return str(p)


def console_summary(raw: dict, summary: dict) -> str:
    lines = ["geometric mean of ratios to the best peer (time / CPU / peak RSS):"]
    for a in raw["allocators"]:
        g = summary["geomean"][a]
        lines.append(f"  {a:<16}" + "  ".join(f"{g[k]:.3f}" if g[k] else "  –  " for k in ("wall", "cpu", "rss")))
    for m, rows in summary["behind"].items():
        worst = [r for r in rows if r["metric"] == "wall"][:3]
        if worst:
            lines.append(f"  {m} furthest behind: " + ", ".join(f"{r['cell']} ×{r['ratio']:.2f} vs {r['best_peer']}"
                                                                for r in worst))
    return "\n".join(lines)
