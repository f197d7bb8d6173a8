"""CI smoke test of the benchmark suite: every workload completes under every installed allocator and its RESULT parses.

Never a timing assertion: the machine is noisy and small. The workloads must already be built
(cmake --build build --target mallard-bench, part of the full build).
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_runner():
    """bench/run.py as a module (it is a script, not a package), under a name no other test uses."""
    name = "mallard_bench_run"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "bench" / "run.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


run_mod = _load_runner()
ALLOCATORS = [a for a in run_mod.alloc_mod.discover() if a.name in run_mod.PEERS + run_mod.MALLARD]
# Planned once at import for the parametrisation (names only); the cells that run read and write the test's own
# temporary folder (the `cells` fixture), never a folder left over from an earlier run.
CELLS = run_mod.plan("smoke", Path("/nonexistent/mallard-bench-data"))
C_WORKLOADS = sorted({c.workload for c in CELLS if c.kind == "c"})
# Arguments that make each C workload fill at least a few dozen objects (so -c 5 has something to corrupt).
CORRUPT_ARGS = {"fastpath": ["-m", "remote", "-n", "2048"], "vmem": ["-t", "10"], "realloc": ["-n", "10"]}


def test_every_workload_is_built(bins):
    missing = [w for w in C_WORKLOADS if not (bins / f"mallard-bench-{w}").exists()]
    assert not missing, f"not built in {bins}: {missing} (cmake --build <build> --target mallard-bench)"


def test_peers_and_glibc_discovered():
    names = [a.name for a in ALLOCATORS]
    assert names[0] == "glibc"
    assert len(set(names)) == len(names)


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    """The smoke cells with their data in a fresh folder of this test run (the reader's input file generated there,
    in a folder that does not exist yet, as on a fresh machine)."""
    data_dir = tmp_path_factory.mktemp("bench") / "mallard-bench-data"
    planned = run_mod.plan("smoke", data_dir)
    for c in planned:
        if c.workload.startswith("pyreader"):
            r = subprocess.run([*c.args, "--generate-only"], capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, f"{c.args} --generate-only failed (rc {r.returncode}):\n{r.stderr}"
            break
    return planned


def test_reader_input_generated_into_missing_folder(tmp_path):
    """pyreader.py --generate-only creates its folder (a fresh TMPDIR has none) and the file it names."""
    cell = next(c for c in run_mod.plan("smoke", tmp_path / "no" / "such" / "dir") if c.workload == "pyreader")
    r = subprocess.run([*cell.args, "--generate-only"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    data = Path(cell.args[cell.args.index("--file") + 1])
    assert data.is_file() and data.stat().st_size > 0


@pytest.mark.parametrize("alloc", ALLOCATORS, ids=lambda a: a.name)
def test_every_cell_runs_under_allocator(alloc, bins, cells):
    """Each smoke cell completes, exits 0 and prints a RESULT line that parses; failures name the repro command."""
    if any(c.kind == "redis" for c in cells):
        assert run_mod.mbench_programs.redis_available() is None, "redis-server/redis-tools missing"
    failures = []
    for cell in cells:
        rec = run_mod.run_once(cell, alloc, bins, timeout=60)
        if not rec["ok"]:
            failures.append(f"{cell.id}: {rec['error']}\n    reproduce: {run_mod.repro(cell, alloc, bins)}")
            continue
        assert rec["wall_s"] > 0 and rec["cpu_s"] >= 0 and rec["max_rss_kib"] > 0, (cell.id, rec)
        m = rec["metrics"]
        if cell.kind != "sqlite":
            assert m.get("ops", m.get("requests_per_s", 0)) > 0, (cell.id, m)
        for f in cell.figures:
            assert f in m, f"{cell.id}: figure {f} missing from {sorted(m)}"
    assert not failures, f"{alloc.name}:\n" + "\n".join(failures)


@pytest.mark.parametrize("workload", C_WORKLOADS)
def test_corrupted_pattern_fails_the_run(workload, bins):
    """-c 5 flips a byte of the 5th object filled; the check before its free must catch it (exit 3)."""
    exe = bins / f"mallard-bench-{workload}"
    args = CORRUPT_ARGS.get(workload)
    if args is None:
        args = next(c.args for c in CELLS if c.workload == workload)
    clean = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)
    assert clean.returncode == 0, clean.stderr
    assert run_mod.parse_result(clean.stdout)["workload"]
    bad = subprocess.run([str(exe), *args, "-c", "5"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 3, f"{workload} did not detect the corruption: rc={bad.returncode} {bad.stderr}"
    assert "CORRUPTION" in bad.stderr
    assert "RESULT" not in bad.stdout


def test_peak_rss_is_the_commands_own(runner, bins):
    """A 2 MiB program must not report the runner's own tens of MiB as its peak (the launcher's job)."""
    rec = runner.run_once(runner.Cell("vmem", 1, "c", ["-t", "1"]), ALLOCATORS[0], bins, timeout=30)
    assert rec["ok"], rec["error"]
    assert 0 < rec["max_rss_kib"] < 12 * 1024, rec["max_rss_kib"]


def test_bad_option_is_refused(bins):
    r = subprocess.run([str(bins / "mallard-bench-larson"), "-t", "two"], capture_output=True, text=True)
    assert r.returncode == 2 and "-t" in r.stderr, r.stderr


def test_fastpath_replace_mode_reports_its_figure_alone(bins):
    """-m replace (larson's loop on one thread) reports ns_replace and nothing of the pair or remote modes."""
    r = subprocess.run([str(bins / "mallard-bench-fastpath"), "-m", "replace", "-n", "20000"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    res = run_mod.parse_result(r.stdout)
    assert res["ops"] == 20000 and res["ns_replace"] > 0, res
    assert not [k for k in res if k.startswith("ns_pair") or k == "ns_remote_free"], res


def test_strict_alignment_mode_fails_on_misalignment_only(bins):
    r = subprocess.run([str(bins / "mallard-bench-aligned"), "-n", "2000", "-m", "posix-strict"], capture_output=True,
                       text=True, timeout=60)
    assert "RESULT" in r.stdout, f"rc {r.returncode}: {r.stderr}"
    res = run_mod.parse_result(r.stdout)
    assert (r.returncode == 6) == (res["misaligned"] > 0), f"rc {r.returncode}: {r.stderr}"


def test_failed_run_is_recorded_not_raised(runner, bins):
    """A crashing or corrupting run becomes a failed record with its reason; the runner carries on."""
    glibc = ALLOCATORS[0]
    cell = runner.Cell("larson", 2, "c", ["-t", "2", "-n", "100", "-s", "50", "-w", "1", "-c", "3"])
    rec = runner.run_once(cell, glibc, bins, timeout=30)
    assert not rec["ok"] and "exit status 3" in rec["error"] and "CORRUPTION" in rec["error"]
    # A workload that cannot even start is a failed record too.
    rec = runner.run_once(runner.Cell("vmem", 1, "c", ["-t", "1"]), glibc, Path("/nonexistent"), timeout=30)
    assert not rec["ok"] and rec["error"]


def test_summary_ranks_and_reports_failures(runner):
    """Ratios to the best peer, geometric means, the generated 'behind' section and failures, on known numbers."""
    def runs(wall, rss, ok=True):
        return [{"ok": ok, "wall_s": wall, "cpu_s": wall, "max_rss_kib": rss, "metrics": {"ops": 1},
                 "error": None if ok else "killed by signal 11: boom"}]
    raw = {"allocators": ["glibc", "mimalloc", "mallard"], "mode": "quick", "repeats": 1, "started": "x",
           "command": "cmd", "fastpath": {}, "callgrind": None,
           "machine": {"cpu": "c", "cores": 2, "memory_gib": 1, "kernel": "k", "os": "o", "allocators": {},
                       "python": "p", "sqlite": "s", "redis": "r", "git": "g"},
           "cells": [{"id": "a/t1", "workload": "a", "threads": 1, "timed": True, "stresses": "remote frees",
                      "figures": [], "repro": {"mallard": "LD_PRELOAD=x a"},
                      "runs": {"glibc": runs(2.0, 100), "mimalloc": runs(1.0, 200), "mallard": runs(1.5, 100)}},
                     {"id": "b/t1", "workload": "b", "threads": 1, "timed": True, "stresses": "large blocks",
                      "figures": [], "repro": {"mallard": "LD_PRELOAD=x b"},
                      "runs": {"glibc": runs(1.0, 100), "mimalloc": runs(1.0, 100), "mallard": runs(9, 9, ok=False)}}]}
    s = runner.mbench_report.summarize(raw, runner.PEERS)
    a = s["cells"]["a/t1"]["per"]
    assert a["mimalloc"]["wall"]["ratio"] == 1.0 and a["mallard"]["wall"]["ratio"] == 1.5
    assert a["mallard"]["rss"]["ratio"] == 1.0 and a["mimalloc"]["rss"]["ratio"] == 2.0
    assert abs(s["geomean"]["glibc"]["wall"] - 2 ** 0.5) < 1e-9
    assert s["geomean"]["mallard"]["wall_n"] == 1
    assert s["behind"]["mallard"][0]["cell"] == "a/t1" and s["behind"]["mallard"][0]["best_peer"] == "mimalloc"
    assert [(f["cell"], f["allocator"]) for f in s["failures"]] == [("b/t1", "mallard")]
    md = runner.mbench_report.markdown(raw, s)
    assert "**FAIL**" in md and "LD_PRELOAD=x b" in md and "Where mallard is behind" in md
    assert "remote frees" in md.split("Where mallard is behind")[1]


def test_runner_end_to_end(tmp_path, bins):
    """bench/run.py smoke writes raw JSON, a markdown table and plots, and does not touch docs/."""
    # A TMPDIR of its own: the runner's data folder must be created, not found left over.
    env = dict(os.environ, MALLARD_BUILD_DIR=str(bins.parent), TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    doc = REPO / "docs" / "PERFORMANCE.md"
    before = doc.read_bytes() if doc.exists() else None
    r = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "smoke", "--allocators", "glibc",
                        "--workloads", "larson,vmem,sqlite,fastpath", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    raw = json.loads((tmp_path / "raw.json").read_text())
    assert [c["id"] for c in raw["cells"]] == ["larson/t2", "vmem/t10", "sqlite/t1"]
    assert raw["summary"]["failures"] == []
    assert raw["fastpath"]["glibc"][0]["metrics"]["ns_pair_64"] > 0
    md = (tmp_path / "results.md").read_text()
    assert "| larson/t2 |" in md and "## Peak RSS" in md
    assert (tmp_path / "time_ratio.png").stat().st_size > 1000
    assert (doc.read_bytes() if doc.exists() else None) == before


def test_unknown_allocator_is_refused(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "smoke", "--allocators", "nosuchmalloc",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "nosuchmalloc" in r.stderr, r.stderr
