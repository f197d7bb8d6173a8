"""Tests of the cross-thread workloads (xstorm, server, localremote) and of the runner's scaling mode.

Never a timing assertion: only that runs complete, count right, fail when they must, and that tables come out.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_bench_smoke import ALLOCATORS, REPO, run_mod

NEW = ("xstorm", "server", "localremote")


def _run(bins, workload, *args, env=None, timeout=60):
    return subprocess.run([str(bins / f"mallard-bench-{workload}"), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _result(r):
    assert r.returncode == 0, f"rc {r.returncode}: {r.stderr}"
    return run_mod.parse_result(r.stdout)


def test_new_workloads_are_planned():
    """smoke, quick and full run each new workload (so the smoke test covers them); quick at 2 threads, full at 1,
    2 and 4 (xstorm, whose -t 1 is already a producer and a consumer, from 2)."""
    data = Path("/nonexistent")
    for mode in ("smoke", "quick", "full"):
        ids = {c.id for c in run_mod.plan(mode, data)}
        assert {"xstorm/t2", "server/t2", "localremote/t2"} <= ids, (mode, ids)
    full = {c.id for c in run_mod.plan("full", data)}
    assert {"server/t1", "server/t4", "localremote/t1", "localremote/t4", "xstorm/t4"} <= full
    quick = [c for c in run_mod.plan("quick", data) if c.workload in NEW]
    assert {c.threads for c in quick} == {2}
    server = [c for c in run_mod.plan("quick", data) if c.workload == "server"]
    assert all(c.fixed_time for c in server) and server[0].args[server[0].args.index("-w") + 1] == "1000"


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_xstorm_splits_producers_and_consumers(bins, threads):
    """-t N: max(1, N/2) producers, the rest (at least one) consumers; every object produced is consumed."""
    res = _result(_run(bins, "xstorm", "-t", threads, "-n", 3001, "-w", 16, "-s", 0))
    assert res["producers"] == max(1, threads // 2)
    assert res["consumers"] == max(1, threads - res["producers"])
    assert res["ops"] == 3001 and res["ops_per_s"] > 0
    per_producer = [3001 // res["producers"] + (i < 3001 % res["producers"]) for i in range(res["producers"])]
    assert res["batches"] == sum((n + 15) // 16 for n in per_producer)  # whole batches of 16, the last one short


@pytest.fixture(scope="module")
def nomalloc(bins):
    shim = bins / "libmbench-nomalloc.so"
    assert shim.exists(), f"{shim} not built (cmake --build <build> --target mallard-bench)"
    return str(shim)


@pytest.mark.parametrize("args", [["-t", "2"], ["-t", "4"], ["-t", "5", "-s", "0"], ["-t", "1", "-w", "1"]],
                         ids=lambda a: " ".join(a))
def test_xstorm_consumers_never_allocate(bins, nomalloc, args):
    """Under the nomalloc shim a consumer that enters any allocation function kills the run (exit 7)."""
    env = dict(os.environ, LD_PRELOAD=nomalloc)
    res = _result(_run(bins, "xstorm", *args, "-n", 20000, env=env))
    assert res["ops"] == 20000


def test_nomalloc_shim_catches_an_allocating_consumer(bins, nomalloc):
    """The control: consumers that allocate on purpose (-m alloc-in-consumer) must be caught, so the hook is really
    bound; without the shim that mode runs through (the fault is the consumer's allocation, nothing else)."""
    env = dict(os.environ, LD_PRELOAD=nomalloc)
    bad = _run(bins, "xstorm", "-t", "2", "-n", 5000, "-m", "alloc-in-consumer", env=env)
    assert bad.returncode == 7 and "NOMALLOC: malloc" in bad.stderr, (bad.returncode, bad.stderr)
    assert "RESULT" not in bad.stdout
    _result(_run(bins, "xstorm", "-t", "2", "-n", 5000, "-m", "alloc-in-consumer"))


# Argument sets covering each free path of the new workloads (local and remote, fixed and mixed sizes). Server's
# third set never trades (-n beyond what 1 ms gets done), so the spare array's objects (the first 2000 filled) are
# checked only by the final check; localremote's last set leaves the 777th object in the window freed at the end.
CORRUPT_CASES = {
    "xstorm": [["-t", "2", "-n", "3000"], ["-t", "3", "-n", "3000", "-s", "0", "-w", "7"]],
    "server": [["-t", "2", "-w", "50", "-s", "100", "-n", "500"], ["-t", "1", "-w", "20", "-s", "50"],
               ["-t", "1", "-w", "1", "-s", "2000", "-n", "100000000"]],
    "localremote": [["-t", "2", "-n", "3000"], ["-t", "3", "-n", "3000", "-m", "0", "-s", "0"],
                    ["-t", "2", "-n", "3000", "-m", "100"], ["-t", "1", "-n", "800", "-m", "100"]],
}


@pytest.mark.parametrize("workload,args", [(w, a) for w, cases in CORRUPT_CASES.items() for a in cases],
                         ids=lambda x: x if isinstance(x, str) else " ".join(x))
@pytest.mark.parametrize("nth", [1, 5, 777])
def test_new_workloads_detect_corruption(bins, workload, args, nth):
    """-c N flips a byte of the Nth object filled; the check before its free (local, remote or final) catches it."""
    _result(_run(bins, workload, *args))
    bad = _run(bins, workload, *args, "-c", nth)
    assert bad.returncode == 3 and "CORRUPTION" in bad.stderr, (bad.returncode, bad.stderr)
    assert "RESULT" not in bad.stdout


def test_server_stops_by_itself_and_reports_throughput(bins):
    """A fixed-time run: it ends on its own shortly after -w ms, and reports what it got done in that time."""
    r = _run(bins, "server", "-t", "3", "-w", "200", "-s", "200", "-n", "1000", timeout=30)
    res = _result(r)
    assert res["seconds"] >= 0.2 and res["run_ms"] == 200
    assert res["ops"] > 0 and res["ops_per_s"] == pytest.approx(res["ops"] / res["seconds"], rel=1e-3)
    assert res["trades"] > 0  # arrays did change hands, so objects died in other threads


@pytest.mark.parametrize("pct", [0, 50, 100])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_localremote_share_of_local_frees(bins, pct, threads):
    """-m percent of the objects are freed by their own thread, the rest by the next one; all are freed."""
    res = _result(_run(bins, "localremote", "-t", threads, "-n", 20000, "-m", pct))
    assert res["local_frees"] + res["remote_frees"] == 20000 == res["ops"]
    if pct == 0:
        assert res["local_frees"] == 0
    elif pct == 100:
        assert res["remote_frees"] == 0
    else:
        assert 0.4 < res["local_frees"] / 20000 < 0.6


def test_localremote_refuses_bad_percentage(bins):
    r = _run(bins, "localremote", "-m", "101")
    assert r.returncode == 2 and "percentage" in r.stderr


def _cell(wid, fixed, runs):
    return {"id": wid, "workload": wid.split("/")[0], "threads": 2, "timed": True, "fixed_time": fixed,
            "stresses": "", "figures": [], "repro": {}, "runs": runs}


def test_fixed_time_cells_compare_time_per_operation(runner):
    """For server (fixed time) the time entry is seconds per million operations: doing more in the same run time
    is a lower figure and a lower ratio, not the same wall time for everyone."""
    def run(ops, wall=1.0, cpu=2.0):
        return [{"ok": True, "wall_s": wall, "cpu_s": cpu, "max_rss_kib": 100,
                 "metrics": {"ops": ops, "seconds": 1.0, "ops_per_s": ops / 1.0}}]
    raw = {"allocators": ["glibc", "mimalloc", "mallard"], "cells": [
        _cell("server/t2", True, {"glibc": run(2_000_000), "mimalloc": run(4_000_000), "mallard": run(1_000_000)})]}
    per = runner.mbench_report.summarize(raw, runner.PEERS)["cells"]["server/t2"]["per"]
    assert per["mimalloc"]["wall"]["median"] == pytest.approx(0.25) and per["mimalloc"]["wall"]["ratio"] == 1.0
    assert per["mallard"]["wall"]["ratio"] == pytest.approx(4.0)
    assert per["glibc"]["cpu"]["median"] == pytest.approx(1.0)  # 2 CPU s / 2 M operations
    assert per["mallard"]["rss"]["ratio"] == 1.0


def test_scaling_summary_ratios(runner):
    """Scaling grids: ns per operation from each RESULT, ratio to the best peer at each thread count."""
    def run(ops, secs, rss=1000):
        return {"ok": True, "wall_s": 9.0, "cpu_s": 9.0, "max_rss_kib": rss, "metrics": {"ops": ops, "seconds": secs}}
    cells = []
    for t, (g, j, m) in {1: (1.0, 0.5, 0.25), 2: (0.5, 0.4, 0.8)}.items():
        cells.append({"id": f"xstorm/t{t}", "workload": "xstorm", "threads": t, "repro": {},
                      "runs": {"glibc": [run(1_000_000, g)], "jemalloc": [run(1_000_000, j, 2000)],
                               "mallard": [run(1_000_000, m, 500), run(1_000_000, m, 500)]}})
    cells.append({"id": "larson/t2", "workload": "larson", "threads": 2, "repro": {"mallard": "LD_PRELOAD=x y"},
                  "runs": {"glibc": [run(10, 1.0)], "jemalloc": [run(10, 1.0)],
                           "mallard": [{"ok": False, "error": "killed by signal 11", "wall_s": 1, "cpu_s": 1,
                                        "max_rss_kib": 1, "metrics": {}}]}})
    raw = {"allocators": ["glibc", "jemalloc", "mallard"], "cells": cells, "repeats": 2, "sizes": "smoke",
           "started": "now", "command": "cmd", "machine": {"cpu": "CPU X", "cores": 2, "memory_gib": 1,
                                                            "kernel": "k", "os": "o", "git": "g", "allocators": {
                                                                "glibc": {"version": "2", "path": None}}}}
    s = runner.mbench_scaling.summarize(raw, runner.PEERS)
    assert s["xstorm"][1]["jemalloc"]["ns"] == pytest.approx(500) and s["xstorm"][1]["jemalloc"]["ns_ratio"] == 1.0
    assert s["xstorm"][1]["mallard"]["ns_ratio"] == pytest.approx(0.5)
    assert s["xstorm"][2]["mallard"]["ns_ratio"] == pytest.approx(2.0)
    assert s["xstorm"][2]["mallard"]["rss_ratio"] == pytest.approx(0.5)
    assert not s["larson"][2]["mallard"]["ok"]
    md = runner.mbench_scaling.markdown(raw, s, peers=runner.PEERS)
    assert "| allocator | 1 thr | 2 thr |" in md and "CPU X, 2 cores" in md
    assert "| mallard | **250 ×0.50** | 800 ×2.00 |" in md
    assert "**FAIL**" in md and "LD_PRELOAD=x y" in md.split("Failures")[1]


def test_docs_section_replaces_only_its_own_text(runner):
    sc = runner.mbench_scaling
    doc = "# Performance\n\nintro\n\n<!-- keep -->\ntail\n"
    once = sc.replace_section(doc, "h100", "table one")
    assert once.startswith(doc.rstrip("\n")) and once.endswith(
        "<!-- scaling:h100 begin -->\ntable one\n<!-- scaling:h100 end -->\n")
    both = sc.replace_section(once, "laptop", "table two")
    again = sc.replace_section(both, "h100", "table three")
    assert "table one" not in again and "table three" in again and "table two" in again
    assert again.index("table three") < again.index("table two") and again.startswith(doc.rstrip("\n"))
    assert sc.replace_section(again, "h100", "table three") == again
    for bad_name in ("", "a b", "x-->", "../x"):
        with pytest.raises(ValueError):
            sc.replace_section(doc, bad_name, "t")
    with pytest.raises(ValueError):
        sc.replace_section(doc + "<!-- scaling:x end -->\n<!-- scaling:x begin -->\n", "x", "t")


def test_allocator_paths_are_named_after_their_file(runner, tmp_path):
    """--allocators with a path: a library found by discovery keeps its name, another is named after its file
    (libfoo.so: foo), and a name given twice gets a suffix instead of merging two allocators' runs."""
    lib = next((a for a in ALLOCATORS if a.path), None)
    if lib is None:
        pytest.skip("no preloadable allocator installed")
    copy = tmp_path / "libfoo.so"
    shutil.copy(lib.path, copy)
    found = runner.alloc_mod.discover()
    allocs = runner.resolve_allocators(f"glibc,{lib.path},{copy},{copy}", found)
    assert [a.name for a in allocs] == ["glibc", lib.name, "foo", "foo-2"]
    assert allocs[2].path == allocs[3].path == str(copy)
    other = tmp_path / "libfoo-2.so"
    shutil.copy(lib.path, other)
    names = [a.name for a in runner.resolve_allocators(f"{copy},{other},{copy}", found)]
    assert names == ["foo", "foo-2", "foo-3"]


def test_scaling_mode_end_to_end(tmp_path, bins):
    """bench/run.py scaling at 1 and 2 threads on tiny sizes with glibc (and mallard when built): one grid per
    workload with both thread counts, no failures, the docs section only in the file named, docs/ untouched."""
    names = ["glibc"] + (["mallard"] if any(a.name == "mallard" for a in ALLOCATORS) else [])
    env = dict(os.environ, MALLARD_BUILD_DIR=str(bins.parent), TMPDIR=str(tmp_path))
    doc = REPO / "docs" / "PERFORMANCE.md"
    before = doc.read_bytes() if doc.exists() else None
    page = tmp_path / "PERF.md"
    page.write_text("# Performance\n\nhand-written\n")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "scaling", "--sizes", "smoke", "--threads",
                        "1,2", "--allocators", ",".join(names), "--repeats", "2", "--out", str(out),
                        "--docs-section", "ci", "--docs-file", str(page)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    raw = json.loads((out / "raw.json").read_text())
    ids = [c["id"] for c in raw["cells"]]
    assert ids == ["xstorm/t2", "server/t1", "server/t2", "localremote/t1", "localremote/t2", "larson/t1",
                   "larson/t2", "succession/t1", "succession/t2", "prodcons/t2"]
    assert all(len(runs) == 2 for c in raw["cells"] for runs in c["runs"].values())
    md = (out / "results.md").read_text()
    assert "**FAIL**" not in md and "Failures" not in md, md
    assert md.count("| allocator | 1 thr | 2 thr |") == 2 * 6  # ns/op and peak RSS grids of six workloads
    for w in ("xstorm", "server", "localremote", "larson", "succession", "prodcons"):
        assert f"# {w}" in md
    for n in names:
        assert md.count(f"| {n} |") == 12
    assert "cores" in md and raw["machine"]["cpu"] in md
    assert (out / "scaling.png").stat().st_size > 1000
    text = page.read_text()
    assert text.startswith("# Performance\n\nhand-written\n") and "<!-- scaling:ci begin -->\n## Scaling" in text
    assert text.rstrip().endswith("<!-- scaling:ci end -->") and "| allocator | 1 thr | 2 thr |" in text
    assert (doc.read_bytes() if doc.exists() else None) == before


def test_scaling_refuses_other_workloads_and_docs_flags_elsewhere(tmp_path, bins):
    run = [sys.executable, str(REPO / "bench" / "run.py")]
    env = dict(os.environ, MALLARD_BUILD_DIR=str(bins.parent))
    r = subprocess.run([*run, "scaling", "--workloads", "churn", "--allocators", "glibc", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "churn" in r.stderr, r.stderr
    r = subprocess.run([*run, "smoke", "--docs-section", "x", "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "scaling" in r.stderr, r.stderr
    r = subprocess.run([*run, "scaling", "--docs", "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "never rewrites" in r.stderr, r.stderr


def test_scaling_keeps_to_the_thread_counts_asked_for(tmp_path, bins):
    """At --threads 1 the paired workloads (xstorm, prodcons: two threads at least) are left out, not run at 2."""
    run = [sys.executable, str(REPO / "bench" / "run.py"), "scaling", "--sizes", "smoke", "--threads", "1",
           "--allocators", "glibc", "--repeats", "1", "--no-plots"]
    env = dict(os.environ, MALLARD_BUILD_DIR=str(bins.parent), TMPDIR=str(tmp_path))
    r = subprocess.run([*run, "--workloads", "xstorm,server", "--out", str(tmp_path / "a")], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert [c["id"] for c in json.loads((tmp_path / "a" / "raw.json").read_text())["cells"]] == ["server/t1"]
    r = subprocess.run([*run, "--workloads", "prodcons", "--out", str(tmp_path / "b")], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 2 and "nothing to run" in r.stderr, r.stderr


def _mallard_lib():
    lib = next((a for a in ALLOCATORS if a.name == "mallard" and a.path), None)
    if lib is None:
        pytest.skip("libmallard.so is not built")
    return lib


def test_allocator_options_make_a_row_of_their_own(runner, tmp_path):
    """--allocators NAME@OPTIONS: a Mallard library (by name, or by a path whose file exports mallard_ctl) runs with
    MALLARD_CONF set to the options ('+' between them), in a row named NAME@OPTIONS beside the plain one; the
    reproduce line carries the options; an allocator that does not read MALLARD_CONF is refused."""
    lib = _mallard_lib()
    found = runner.alloc_mod.discover()
    copy = tmp_path / "libFAST.so"
    shutil.copy(lib.path, copy)
    allocs = runner.resolve_allocators(f"mallard,mallard@shuffle:0+zero_on_free:true,{copy}@junk:free", found)
    assert [a.name for a in allocs] == ["mallard", "mallard@shuffle:0+zero_on_free:true", "FAST@junk:free"]
    assert [a.conf for a in allocs] == [None, "shuffle:0,zero_on_free:true", "junk:free"]
    env = runner.alloc_mod.preload_env(allocs[1], {})
    assert env["MALLARD_CONF"] == "shuffle:0,zero_on_free:true" and env["LD_PRELOAD"] == lib.path
    assert "MALLARD_CONF" not in runner.alloc_mod.preload_env(allocs[0], {})
    cell = runner.Cell("churn", 1, "c", ["-n", "1", "-s", "100"])
    assert "MALLARD_CONF=junk:free " in runner.repro(cell, allocs[2], Path("/b"))
    mb = sys.modules["mimalloc_bench"]
    line = mb.repro(mb.MbCell("glibc-simple", None, [], False, False), allocs[1], Path("/b"))
    assert "MALLARD_CONF=shuffle:0,zero_on_free:true " in line, line
    assert "MALLARD_CONF" not in mb.repro(mb.MbCell("glibc-simple", None, [], False, False), allocs[0], Path("/b"))
    with pytest.raises(runner.alloc_mod.ConfNotApplicable):
        runner.resolve_allocators("glibc@shuffle:0", found)


def test_allocator_options_reach_the_program(runner, bins, tmp_path):
    """The options of a NAME@OPTIONS row reach the process: an unknown option with abort_conf:true makes every run of
    that row fail (Mallard refuses to start), while the plain row of the same library runs."""
    _mallard_lib()
    if not (bins / "mallard-bench-churn").exists():
        pytest.skip("the benchmark programs are not built")
    found = runner.alloc_mod.discover()
    plain, bad = runner.resolve_allocators("mallard,mallard@abort_conf:true+no_such_option:1", found)
    cell = runner.Cell("churn", 1, "c", ["-n", "1", "-s", "100"])
    assert runner.run_once(cell, plain, bins, 60)["ok"]
    rec = runner.run_once(cell, bad, bins, 60)
    assert not rec["ok"] and "invalid configuration" in (rec["error"] or ""), rec


def test_allocator_options_refused_on_the_command_line(tmp_path):
    """bench/run.py --allocators glibc@...: a clear message and exit status 2, nothing run."""
    r = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "quick", "--allocators", "glibc@shuffle:0",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "glibc" in r.stderr and "MALLARD_CONF" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
