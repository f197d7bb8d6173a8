"""The musl mode: the C workloads as static musl programs, musl's own malloc against libmallard.a linked in."""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import mbench_report

# The two builds of every workload (bench/CMakeLists.txt, when the build is against musl): row name, folder under
# the build's bin/, what serves malloc there.
BUILDS = (("musl", "static-musl", "musl's own malloc (mallocng, from libc.a)"),
          ("mallard", "static-mallard", "libmallard.a linked in"))
# Cells of the other modes that are not C workloads of this repository, and why they are not run here.
LEFT_OUT = {
    "pyreader": "they run the system's python3, a dynamic glibc program, with no static musl build of it here",
    "pyreader-malloc": "they run the system's python3, a dynamic glibc program, with no static musl build of it here",
    "pydict-json": "they run the system's python3, a dynamic glibc program, with no static musl build of it here",
    "sqlite": "it runs the system's sqlite3 shell, a dynamic glibc program, with no static musl build of it here",
    "redis": "it runs the system's redis-server and redis-benchmark, dynamic glibc programs",
}
# Symbols that tell the two builds apart in a static program's symbol table: Mallard's entry points, and musl's
# mallocng (its implementation and its state); a static program keeps them, local or not.
MALLARD_SYMBOL = "mallard_malloc"
MUSL_SYMBOLS = ("__libc_malloc_impl", "__malloc_context")
PT_INTERP = 3


@dataclass
class StaticBuild:
    """One build of the workloads, standing where an allocator stands in the other modes: nothing to preload (path
    None), its programs in a folder of their own (bins)."""
    name: str
    bins: Path
    version: str
    what: str
    path: None = None
    conf: None = None


def default_build_dir(repo: Path) -> Path:
    """$MALLARD_MUSL_BUILD_DIR (scripts/test-musl.sh's variable), else build-musl/."""
    env = os.environ.get("MALLARD_MUSL_BUILD_DIR")
    return Path(env) if env else repo / "build-musl"


def musl_version() -> str:
    """musl's version, as its dynamic loader prints it when run alone (else Debian's package version)."""
    arch = os.uname().machine
    for loader in (f"/lib/ld-musl-{arch}.so.1", f"/usr/lib/ld-musl-{arch}.so.1"):
        if os.access(loader, os.X_OK):
            try:
                r = subprocess.run([loader], capture_output=True, text=True, timeout=10)
            except (OSError, subprocess.SubprocessError):
                continue
            m = re.search(r"Version (\S+)", r.stdout + r.stderr)
            if m:
                return m.group(1)
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "musl"], capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip().split("-")[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def symbols(prog: Path) -> set | None:
    """The names in a program's symbol table (nm), or None when nm is missing or fails."""
    if not shutil.which("nm"):
        return None
    try:
        r = subprocess.run(["nm", str(prog)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return {line.split()[-1] for line in r.stdout.splitlines() if line.strip()}


def has_interpreter(prog: Path) -> bool:
    """Whether an ELF program names a program interpreter (PT_INTERP: a dynamic program); ValueError if not ELF."""
    with open(prog, "rb") as f:
        ident = f.read(64)
        if len(ident) < 52 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ValueError("not an ELF program")
        wide, end = ident[4] == 2, "<" if ident[5] == 1 else ">"
        # e_phoff, e_phentsize and e_phnum sit at different offsets in the 32- and 64-bit headers.
        phoff = struct.unpack_from(end + ("Q" if wide else "I"), ident, 32 if wide else 28)[0]
        phentsize, phnum = struct.unpack_from(end + "HH", ident, 54 if wide else 42)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return any(struct.unpack_from(end + "I", table, i * phentsize)[0] == PT_INTERP for i in range(phnum)
               if (i + 1) * phentsize <= len(table))


def check_program(build: str, prog: Path) -> str | None:
    """Why `prog` is not a static program whose malloc comes from `build` ("musl" or "mallard"), or None when it is:
    statically linked (no program interpreter), and Mallard's symbols without mallocng's (mallard) or mallocng's
    without Mallard's (musl). Without nm the symbol check is skipped."""
    try:
        interp = has_interpreter(prog)
    except OSError as e:
        return f"{prog}: {e.strerror}"
    except ValueError as e:
        return f"{prog}: {e}"
    if interp:
        return f"{prog}: dynamically linked (it names a program interpreter); the musl mode needs static programs"
    syms = symbols(prog)
    if syms is None:
        return None
    has_mallard = MALLARD_SYMBOL in syms
    has_musl = [s for s in MUSL_SYMBOLS if s in syms]
    if build == "mallard" and (not has_mallard or has_musl):
        return (f"{prog}: malloc is not Mallard's alone ({MALLARD_SYMBOL}: {'yes' if has_mallard else 'no'}; "
                f"musl's malloc: {', '.join(has_musl) or 'no'})")
    if build == "musl" and (has_mallard or not has_musl):
        return f"{prog}: malloc is not musl's ({MALLARD_SYMBOL}: {'yes' if has_mallard else 'no'})"
    return None


def builds(bins: Path, workloads: list, mallard_version: str) -> tuple[list, list]:
    """The two StaticBuilds under `bins`, and the problems found: a missing program, or one of the wrong kind."""
    out, problems = [], []
    mv = musl_version()
    for name, folder, what in BUILDS:
        b = StaticBuild(name, bins / folder, mv if name == "musl" else mallard_version, what)
        for w in workloads:
            prog = b.bins / f"mallard-bench-{w}"
            if not prog.exists():
                problems.append(f"{prog}: not built")
                continue
            why = check_program(name, prog)
            if why:
                problems.append(why)
        out.append(b)
    return out, problems


def where(p: Path, repo: Path) -> str:
    try:
        return str(p.resolve().relative_to(repo))
    except ValueError:
        return str(p)


AARCH64_NOTE = ("aarch64: correctness only. The aarch64 build runs the C tests under qemu-user "
                "(`scripts/test-aarch64.sh`); an emulator's timings say nothing of a real aarch64 CPU, and Debian "
                "has no aarch64 musl toolchain, so there are no aarch64 timings here.")


def markdown(raw: dict, summary: dict, level: int = 1) -> str:
    """The musl mode's report; `level` is the heading level of its title (1 for results.md, 2 in a docs section)."""
    h = "#" * level
    m = raw["machine"]
    b = {x["name"]: x for x in raw["builds"]}
    mu, ma = b["musl"], b["mallard"]
    g = summary["geomean"].get("mallard", {})
    cells = summary["cells"]
    out = [f"{h} musl: static programs, musl's malloc against Mallard linked in ({raw['started']})", "",
           f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, kernel {m['kernel']}, {m['os']} "
           f"({m['arch']}); git {m['git']}.", "",
           f"Programs: the suite's C workloads, each linked twice with `musl-gcc -static` from the same object: "
           f"`{mu['bins']}/` with musl {mu['version']}'s own malloc (mallocng, from libc.a) and `{ma['bins']}/` "
           f"with Mallard {ma['version']}'s `libmallard.a` linked in, which defines the whole malloc family and "
           "musl's internal `__libc_*` names, so no allocator of musl's is linked "
           "(docs/COMPATIBILITY.md, \"Static\"). The runner checks every program's symbol table before it runs: "
           f"`{MALLARD_SYMBOL}` and none of mallocng's symbols in one build, the reverse in the other. "
           "Build them with `bash scripts/test-musl.sh` (or `CC=musl-gcc cmake -S . -B build-musl -G Ninja "
           "-DCMAKE_BUILD_TYPE=Release && cmake --build build-musl --target mallard-bench-musl`).", "",
           f"Command: `{raw['command']}`", "",
           f"Method: the two builds of each workload run interleaved (A B A B …, the first one alternating), "
           f"{raw['repeats']} time{'s' if raw['repeats'] != 1 else ''} each, problem sizes of the {raw['sizes']} "
           "mode; nothing is preloaded. "
           "Each entry is the median (min–max) and ×ratio to musl's median: lower is better, below 1 Mallard is "
           "faster or leaner; the better median of a row is bold. Wall and CPU time (user + system) and peak RSS "
           "(ru_maxrss) are the process's own. FAIL: a run crashed, timed out or failed its own check.",
           ""]
    if any(cl.get("fixed_time") for cl in cells.values()):
        out[-2] += " " + mbench_report.PER_MOP_NOTE
    left = raw.get("left_out") or {}
    if left:
        # One sentence per reason, naming the workloads it keeps out.
        by_reason: dict = {}
        for w, why in left.items():
            by_reason.setdefault(why, []).append(w)
        out += ["Left out: " + "; ".join(f"{', '.join(ws)}: {why}" for why, ws in by_reason.items()) + ".", ""]
    frag = next((c for c in raw["cells"] if c["workload"] == "fragmentation"), None)
    wait = int(frag["args"][frag["args"].index("-w") + 1]) if frag and "-w" in frag["args"] else None
    if wait is not None and wait < 1000:
        out += [f"fragmentation's `rss_after_wait_kib` is read {wait} ms after everything was freed: sooner than "
                "Mallard gives free memory back (`dirty_decay_ms`, 1000 ms by default: docs/OPTIONS.md), so Mallard's "
                "figure there can be the one before its purge; the full sizes (`--sizes full`) wait 1000 ms.", ""]
    out += [AARCH64_NOTE, ""]

    def gm(k):
        return f"**{g[k]:.3f}×** (n={g[k + '_n']})" if g.get(k) else "–"

    out += [f"{h}# Geometric means of Mallard / musl", "",
            "Over the timed cells for time, over every cell for peak RSS.", "",
            mbench_report._table(["wall time", "CPU time", "peak RSS"], [[gm("wall"), gm("cpu"), gm("rss")]]), ""]
    out += [f"{h}# Wall time (s)", "", mbench_report._metric_table(raw, summary, "wall"), ""]
    out += [f"{h}# CPU time, user + system (s)", "", mbench_report._metric_table(raw, summary, "cpu"), ""]
    out += [f"{h}# Peak RSS (MiB)", "", mbench_report._metric_table(raw, summary, "rss", 1 / 1024, "MiB"), ""]
    rows = []
    for cid, cl in cells.items():
        for f in cl["figures"]:
            row = [cid, f"{f} ({mbench_report.FIGURE_UNITS.get(f, '')})"]
            for a in raw["allocators"]:
                s = cl["per"][a]
                v = s["figures"].get(f) if s["ok"] else None
                row.append(mbench_report._fmt(v) if isinstance(v, (int, float)) else ("FAIL" if not s["ok"] else "–"))
            rows.append(row)
    if rows:
        out += [f"{h}# Workload figures (medians)", "", mbench_report._table(["cell", "figure"] + raw["allocators"],
                                                                             rows), ""]
    behind = summary["behind"].get("mallard", [])
    if behind:
        out += [f"{h}# Where Mallard is behind musl's malloc", "",
                mbench_report._table(["cell", "metric", "ratio", "what the workload stresses"],
                                     [[r["cell"], "time" if r["metric"] == "wall" else "peak RSS",
                                       f"{r['ratio']:.2f}", r["stresses"]] for r in behind]), ""]
    if summary["failures"]:
        out += [f"{h}# Failures", "", mbench_report._table(["cell", "build", "failed runs", "error", "reproduce"], [
            [f["cell"], f["allocator"], f"{f['failed_runs']}/{f['runs']}",
             f["error"].replace("|", "\\|").replace("\n", " ")[:200], f"`{f['repro']}`"]
            for f in summary["failures"]]), ""]
    return "\n".join(out)


def console_summary(summary: dict) -> str:
    g = summary["geomean"].get("mallard", {})

    def f(k):
        return f"{g[k]:.3f}" if g.get(k) else "–"

    return f"musl: geometric mean of Mallard / musl: time {f('wall')}, CPU {f('cpu')}, peak RSS {f('rss')}"
