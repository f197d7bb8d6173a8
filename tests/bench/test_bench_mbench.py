"""Tests of the runner's mbench mode (mimalloc-bench's programs): parsers, time conversions, plan, summary, end to end.

The end-to-end tests run fake programs (shell scripts that print what the real ones print), so they need neither
/work/peers nor mimalloc-bench. Never a timing assertion.
"""
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from test_bench_smoke import ALLOCATORS, REPO, run_mod

mb = run_mod.mimalloc_bench
RUN = [sys.executable, str(REPO / "bench" / "run.py")]

# Output captured from the programs of /work/peers/bin (mimalloc-bench ce5784f) under glibc, 2 threads.
XMALLOC_OUT = "rtime: 6.598, free/sec: 15.157 M\n"
LARSON_OUT = "Throughput = 13929889 operations per second, relative time: 71.788s.\nDone sleeping...\n"
GLIBC_THREAD_OUT = "95072402 iterations\n"
RPTEST_OUT = ("crt          2 threads random linear size [8,16000] 100 loops 1000 allocs 100 ops: ........1987413 "
              "memory ops/CPU second (23MiB peak, 6MiB -> 23MiB bytes sample, 247% overhead)\n")
ALLOC_TEST_OUT = """threads: 2
about to run thread 0...
    ...done
about to exit thread 0 (100000000 operations performed) [ctr = -9187201946737535613]...
joining thread 1...
    ...done
2 threads made 200000000 alloc/dealloc operations in 9045 ms (45 ms per 1 million)
"""
MSTRESS_OUT = "start with 2 threads with a 50% load-per-thread and 25 iterations\n"


def test_parsers_read_each_programs_own_figure():
    assert mb.parse_xmalloc(XMALLOC_OUT) == {"free_per_s": pytest.approx(15.157e6), "rtime": 6.598}
    assert mb.parse_larson(LARSON_OUT) == {"ops_per_s": 13929889.0, "relative_time": 71.788}
    # larson prints with %8.0f: small throughputs come with leading blanks
    assert mb.parse_larson("Throughput =    91234 operations per second, relative time: 10960.6s.")["ops_per_s"] \
        == 91234.0
    assert mb.parse_glibc_thread(GLIBC_THREAD_OUT) == {"iterations": 95072402}
    assert mb.parse_rptest(RPTEST_OUT) == {"ops_per_cpu_s": 1987413.0, "own_peak_mib": 23}
    assert mb.parse_alloc_test(ALLOC_TEST_OUT) == {"threads": 2, "ops": 200000000, "own_ms": 9045}
    assert mb.parse_nothing(MSTRESS_OUT) == {}


@pytest.mark.parametrize("parse", ["parse_xmalloc", "parse_larson", "parse_glibc_thread", "parse_rptest",
                                   "parse_alloc_test"])
def test_parsers_refuse_output_without_the_figure(parse):
    """A run that printed something else (a crash message, another program's output) has no figure: ValueError."""
    for text in ("", MSTRESS_OUT, "Segmentation fault\n", "rtime: inf, free/sec: nan M\n"):
        with pytest.raises(ValueError):
            getattr(mb, parse)(text)


def test_conversions_give_seconds_per_fixed_work():
    """Lower is better, and the constants are mimalloc-bench's: xmalloc-test's own rtime and larson's own relative
    time come out again from the rates they print."""
    x = mb.parse_xmalloc(XMALLOC_OUT)
    assert mb.xmalloc_time(x) == pytest.approx(x["rtime"], abs=0.001)
    assert mb.xmalloc_time({"free_per_s": 20e6}) == pytest.approx(5.0)
    lar = mb.parse_larson(LARSON_OUT)
    assert mb.larson_time(lar) == pytest.approx(lar["relative_time"], abs=0.001)
    assert mb.glibc_thread_time({"iterations": 50_000_000}) == pytest.approx(20.0)
    assert mb.rptest_time({"ops_per_cpu_s": 4e6}) == pytest.approx(0.5)
    # twice the throughput is half the time
    assert mb.larson_time({"ops_per_s": 2e7}) == pytest.approx(mb.larson_time({"ops_per_s": 1e7}) / 2)
    for f, key in ((mb.xmalloc_time, "free_per_s"), (mb.larson_time, "ops_per_s"),
                   (mb.glibc_thread_time, "iterations"), (mb.rptest_time, "ops_per_cpu_s")):
        with pytest.raises(ValueError):
            f({key: 0})
        with pytest.raises(ValueError):
            f({})


def test_plan_uses_the_standard_arguments():
    """Without --run-s every program gets bench.sh's command line (ARGS.md), N substituted; programs without a
    thread count run once."""
    cells = {c.id: c.args for c in mb.plan(list(mb.PROGRAMS), [1, 4], None)}
    assert cells["xmalloc-test/t4"] == ["-w", "4", "-t", "5", "-s", "64"]
    assert cells["larson/t4"] == ["5", "8", "1000", "5000", "100", "4141", "4"]
    assert cells["larson-sized/t1"] == ["5", "8", "1000", "5000", "100", "4141", "1"]
    assert cells["alloc-test/t4"] == ["4"]
    assert cells["cache-thrash/t4"] == ["4", "1000", "1", "2000000", "4"]
    assert cells["cache-scratch/t1"] == ["1", "1000", "1", "2000000", "1"]
    assert cells["glibc-thread/t4"] == ["4"]
    assert cells["mstress/t4"] == ["4", "50", "25"]
    assert cells["rptest/t4"] == ["4", "0", "1", "2", "500", "1000", "100", "8", "16000"]
    assert cells["glibc-simple"] == [] and cells["malloc-large"] == []
    assert len(cells) == 9 * 2 + 2


def test_plan_run_s_and_thread_cap():
    """--run-s shortens xmalloc-test (-t, fractional) and larson (first argument, whole seconds, at least 1) only;
    alloc-test, capped at 16 threads by bench.sh, runs once at 16 for any count above."""
    cells = {c.id: c.args for c in mb.plan(list(mb.PROGRAMS), [2], 2.5)}
    assert cells["xmalloc-test/t2"][2:4] == ["-t", "2.5"]
    assert cells["larson/t2"][0] == "2" and cells["larson-sized/t2"][0] == "2"
    assert cells["glibc-thread/t2"] == ["2"] and cells["rptest/t2"][4] == "500"
    assert {c.id: c.args for c in mb.plan(["larson"], [2], 0.2)}["larson/t2"][0] == "1"
    ids = [c.id for c in mb.plan(["alloc-test", "glibc-simple"], [8, 16, 32, 64], None)]
    assert ids == ["alloc-test/t8", "alloc-test/t16", "glibc-simple"]


def test_cross_thread_group():
    """The programs whose objects are freed by other threads than the ones that allocated them."""
    assert mb.CROSS_THREAD == ("xmalloc-test", "larson", "larson-sized", "mstress", "rptest")
    assert all(mb.PROGRAMS[p].fixed_time for p in ("xmalloc-test", "larson", "larson-sized", "glibc-thread"))


def _run(ok=True, wall=1.0, cpu=1.0, rss=1000, **metrics):
    return {"ok": ok, "wall_s": wall, "cpu_s": cpu, "max_rss_kib": rss, "metrics": metrics,
            "error": None if ok else "exit status 1: boom"}


def test_summary_ratios_geomeans_and_groups():
    """Ratios are to the best median among the peers only (a faster non-peer does not become the 1.00); geometric
    means split into cross-thread and other cells; a failing allocator fails its cell only."""
    cells = [
        {"id": "xmalloc-test/t2", "workload": "xmalloc-test", "threads": 2, "cross_thread": True, "runs": {
            "glibc": [_run(free_per_s=10e6, rss=4000), _run(free_per_s=10e6, rss=4000), _run(free_per_s=1e6)],
            "jemalloc": [_run(free_per_s=20e6, rss=8000)] * 3,
            "mallard": [_run(free_per_s=40e6, rss=2000)] * 3}},
        {"id": "glibc-simple", "workload": "glibc-simple", "threads": None, "cross_thread": False, "runs": {
            "glibc": [_run(wall=2.0, rss=1000)] * 3,
            "jemalloc": [_run(wall=4.0, rss=1000), _run(ok=False), _run(wall=4.0)],
            "mallard": [_run(wall=1.0, rss=3000)] * 3}},
    ]
    raw = {"allocators": ["glibc", "jemalloc", "mallard"], "cells": cells}
    s = mb.summarize(raw, ("glibc", "jemalloc"))
    x = s["cells"]["xmalloc-test/t2"]["per"]
    assert x["glibc"]["time"] == pytest.approx(10.0)  # median of 10, 10, 100
    assert x["jemalloc"]["time"] == pytest.approx(5.0) and x["jemalloc"]["time_ratio"] == pytest.approx(1.0)
    assert x["glibc"]["time_ratio"] == pytest.approx(2.0) and x["mallard"]["time_ratio"] == pytest.approx(0.5)
    assert x["mallard"]["best_time_peer"] == "jemalloc"
    assert s["cells"]["xmalloc-test/t2"]["best_time"] == pytest.approx(5.0)
    assert s["cells"]["xmalloc-test/t2"]["best_rss_peer"] == "glibc"
    assert x["glibc"]["rss_ratio"] == pytest.approx(1.0) and x["mallard"]["rss_ratio"] == pytest.approx(0.5)
    g = s["cells"]["glibc-simple"]["per"]
    assert not g["jemalloc"]["ok"] and "boom" in g["jemalloc"]["error"] and g["jemalloc"]["failed_runs"] == 1
    assert g["mallard"]["time_ratio"] == pytest.approx(0.5) and g["mallard"]["rss_ratio"] == pytest.approx(3.0)
    gm = s["geomean"]
    assert gm["mallard"]["all"]["time"] == pytest.approx(0.5) and gm["mallard"]["all"]["n"] == 2
    assert gm["mallard"]["all"]["rss"] == pytest.approx(math.sqrt(0.5 * 3.0))
    assert gm["mallard"]["cross-thread"]["rss"] == pytest.approx(0.5)
    assert gm["mallard"]["other"]["rss"] == pytest.approx(3.0)
    assert gm["glibc"]["all"]["time"] == pytest.approx(math.sqrt(2.0))
    assert gm["jemalloc"]["failed"] == 1 and gm["jemalloc"]["all"]["n"] == 1
    assert s["mallard"] == ["mallard"]
    raw["machine"] = {"cpu": "cpu", "cores": 2, "memory_gib": 1, "kernel": "k", "os": "os", "compiler": "cc",
                      "git": "g", "allocators": {}}
    raw.update(started="now", command="cmd", mbench_dir="/x", repeats=3, skipped=["malloc-large: not found in /x"])
    for c in cells:
        c["args"] = mb.PROGRAMS[c["workload"]].args(c["threads"] or 1, None)
    md = mb.markdown(raw, s, peers=("glibc", "jemalloc"))
    assert "| mallard | ×0.50 (2/2) | ×1.22 | ×0.50 (1/1) | ×0.50 | ×0.50 (1/1) | ×3.00 | 0 |" in md, md
    assert "| jemalloc | **FAIL** |" in md and "## Failures" in md and "Skipped: malloc-large" in md
    assert "| **geomean, cross-thread** |" in md


def test_docs_sections_of_the_two_modes_do_not_mix():
    """An mbench section and a scaling section of the same name are different sections of the page."""
    sc = run_mod.mbench_scaling
    doc = sc.replace_section("# Performance\n", "h100", "scaling table")
    doc = sc.replace_section(doc, "h100", "mbench table", kind="mbench")
    doc = sc.replace_section(doc, "h100", "mbench table 2", kind="mbench")
    assert "<!-- scaling:h100 begin -->\nscaling table\n<!-- scaling:h100 end -->" in doc
    assert "<!-- mbench:h100 begin -->\nmbench table 2\n<!-- mbench:h100 end -->" in doc
    assert "mbench table\n" not in doc


# Fake programs: each prints what the real one prints, checks the arguments it gets (exit 2 when they are not the
# standard ones with --run-s 1) and logs "<program> <N> <allocator>" so that the test can see the order of runs.
FAKES = {
    "xmalloc-test": """[ "$1 $3 $4 $5 $6" = "-w -t 1 -s 64" ] || { echo "bad args: $*" >&2; exit 2; }
log "$2"
echo "rtime: 0.000, free/sec: $((10 * $2)).000 M"
""",
    "larson": """[ "$1 $2 $3 $4 $5 $6" = "1 8 1000 5000 100 4141" ] || { echo "bad args: $*" >&2; exit 2; }
log "$7"
echo "Throughput = $((1000000 * $7)) operations per second, relative time: 0.000s."
echo "Done sleeping..."
""",
    "mstress": """log "$1"
echo "start with $1 threads with a 50% load-per-thread and 25 iterations"
kill -SEGV $$
""",
    "rptest": """log "$1"
echo "written by rptest" > "benchmark-random-$1-8-16000-crt.txt"
echo "crt   $1 threads random linear size [8,16000] 500 loops 1000 allocs 100 ops: ....2000000 memory ops/CPU second \
(3MiB peak, 1MiB -> 3MiB bytes sample, 200% overhead)"
""",
    # under glibc (nothing preloaded) it prints no figure: that allocator's cell fails, the others' do not
    "alloc-test": """log "$1"
[ -n "$LD_PRELOAD" ] && echo "$1 threads made 1000 alloc/dealloc operations in 5 ms (5000 ms per 1 million)"
exit 0
""",
    # the very first run of the whole test hangs (a timeout); every later run returns at once
    "cache-thrash": """log "$1"
if mkdir "$FAKE_DIR/hung" 2>/dev/null; then exec sleep 60; fi
""",
    "glibc-simple": """log -
""",
    "glibc-thread": """log "$1"
echo "$((50000000 * $1)) iterations"
""",
}


def _fake_dir(tmp_path: Path) -> Path:
    d = tmp_path / "mbench-bin"
    d.mkdir()
    for name, body in FAKES.items():
        f = d / name
        f.write_text(f"#!/bin/sh\n# Fake {name} of the mbench mode's test: prints what the real one prints.\n"
                     "log() { echo \"$(basename \"$0\") $1 ${LD_PRELOAD:-glibc}\" >> \"$FAKE_DIR/log\"; }\n" + body)
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    (d / "larson-sized").write_text("#!/bin/sh\n# Fake larson-sized without the execute bit: skipped\n")
    return d


def _names():
    return ["glibc"] + (["mallard"] if any(a.name == "mallard" for a in ALLOCATORS) else [])


def test_mbench_mode_end_to_end(tmp_path, bins):
    """bench/run.py mbench on fake programs at N = 1, 2 with glibc (and mallard when built), 2 repeats: a table per
    cell, converted times, crashes / missing figures / timeouts recorded as failures of their cells, missing and
    non-executable programs skipped, runs interleaved with the first allocator rotating, the docs section written
    only into the file named, and the scratch files of the programs left in no folder of ours."""
    names = _names()
    mdir = _fake_dir(tmp_path)
    env = dict(os.environ, MALLARD_BUILD_DIR=str(bins.parent), FAKE_DIR=str(tmp_path))
    doc = REPO / "docs" / "PERFORMANCE.md"
    before = doc.read_bytes() if doc.exists() else None
    page = tmp_path / "PERF.md"
    page.write_text("# Performance\n\nhand-written\n")
    out = tmp_path / "out"
    r = subprocess.run([*RUN, "mbench", "--mbench-dir", str(mdir), "--threads", "1,2", "--repeats", "2",
                        "--run-s", "1", "--timeout", "3", "--allocators", ",".join(names), "--out", str(out),
                        "--docs-section", "ci", "--docs-file", str(page)],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for missing in ("malloc-large: not found", "cache-scratch: not found", "larson-sized: "):
        assert f"skipping {missing}" in r.stderr, r.stderr
    raw = json.loads((out / "raw.json").read_text())
    ids = [c["id"] for c in raw["cells"]]
    assert ids == ["xmalloc-test/t1", "xmalloc-test/t2", "larson/t1", "larson/t2", "mstress/t1", "mstress/t2",
                   "rptest/t1", "rptest/t2", "alloc-test/t1", "alloc-test/t2", "cache-thrash/t1", "cache-thrash/t2",
                   "glibc-simple", "glibc-thread/t1", "glibc-thread/t2"]
    assert all(len(runs) == 2 for c in raw["cells"] for runs in c["runs"].values())
    cells = raw["summary"]["cells"]
    for n in names:
        assert cells["xmalloc-test/t2"]["per"][n]["time"] == pytest.approx(5.0)     # 1e8 / 20 M frees/s
        assert cells["larson/t1"]["per"][n]["time"] == pytest.approx(1000.0)        # 1e9 / 1 M ops/s
        assert cells["glibc-thread/t2"]["per"][n]["time"] == pytest.approx(10.0)    # 1e9 / 1e8 iterations
        assert cells["rptest/t1"]["per"][n]["time"] == pytest.approx(1.0)           # 2e6 / 2 M ops per CPU s
        assert cells["glibc-simple"]["per"][n]["ok"] and cells["glibc-simple"]["per"][n]["rss"] > 0
        for t in (1, 2):
            s = cells[f"mstress/t{t}"]["per"][n]
            assert not s["ok"] and "signal 11" in s["error"] and s["failed_runs"] == 2
    assert "no 'N threads made" in cells["alloc-test/t1"]["per"]["glibc"]["error"]
    if "mallard" in names:
        assert cells["alloc-test/t1"]["per"]["mallard"]["ok"]
    hung = [(cid, n) for cid, c in cells.items() for n, s in c["per"].items()
            if not s["ok"] and "timed out" in s["error"]]
    assert hung == [("cache-thrash/t1", "glibc")], hung
    assert cells["cache-thrash/t2"]["per"]["glibc"]["ok"]
    # interleaved, A B then B A: the first allocator rotates each repeat
    log = (tmp_path / "log").read_text().splitlines()
    alloc_of = {"glibc": "glibc"} | {a.path: a.name for a in ALLOCATORS if a.path}
    order = [alloc_of[line.split(" ", 2)[2]] for line in log if line.startswith("xmalloc-test 1 ")]
    assert order == names + names[::-1], log
    assert not list(REPO.glob("benchmark-random-*")) and not list(tmp_path.glob("benchmark-random-*"))
    md = (out / "results.md").read_text()
    assert md.count("| allocator | time (") == len(ids)
    assert "### xmalloc-test, N = 2 (4 threads, cross-thread)" in md and "### glibc-simple (other)" in md
    assert "**FAIL**" in md and "## Failures" in md and "mstress 1 50 25" in md
    assert "Skipped: " in md and "malloc-large: not found" in md
    assert "## Geometric means of the ratios to the best peer" in md and "time, cross-thread (cells)" in md
    assert raw["machine"]["cpu"] in md and "cores" in md
    assert ("## mallard against the best peer, per cell" in md) == ("mallard" in names)
    for n in names:
        assert f"| {n} | ×" in md  # its geomean row
    text = page.read_text()
    assert text.startswith("# Performance\n\nhand-written\n")
    assert "<!-- mbench:ci begin -->\n## mimalloc-bench programs" in text and "### Geometric means" in text
    assert text.rstrip().endswith("<!-- mbench:ci end -->")
    assert (doc.read_bytes() if doc.exists() else None) == before


def test_mbench_needs_no_build_and_skips_missing_programs(tmp_path):
    """Without any build (an empty MALLARD_BUILD_DIR) the mode runs glibc on what the folder has; a program asked
    for that the folder lacks is skipped with a message; the table appears."""
    mdir = _fake_dir(tmp_path)
    empty = tmp_path / "nobuild"
    empty.mkdir()
    env = dict(os.environ, MALLARD_BUILD_DIR=str(empty), FAKE_DIR=str(tmp_path))
    out = tmp_path / "out"
    r = subprocess.run([*RUN, "mbench", "--mbench-dir", str(mdir), "--threads", "2", "--repeats", "1",
                        "--programs", "glibc-thread,malloc-large", "--allocators", "glibc", "--out", str(out),
                        "--no-plots"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "skipping malloc-large: not found" in r.stderr
    md = (out / "results.md").read_text()
    assert "### glibc-thread, N = 2 (other)" in md and "| glibc | **10.0** | ×1.00 |" in md, md
    assert "malloc-large" not in [c["workload"] for c in json.loads((out / "raw.json").read_text())["cells"]]


def test_mbench_refuses_bad_options(tmp_path):
    mdir = _fake_dir(tmp_path)
    env = dict(os.environ, FAKE_DIR=str(tmp_path))

    def run(*args):
        return subprocess.run([*RUN, *args, "--out", str(tmp_path / "o")], capture_output=True, text=True,
                              timeout=60, env=env)

    r = run("mbench", "--allocators", "glibc")
    assert r.returncode == 2 and "--mbench-dir" in r.stderr, r.stderr
    r = run("mbench", "--mbench-dir", str(tmp_path / "nowhere"), "--allocators", "glibc")
    assert r.returncode == 2 and "no such folder" in r.stderr, r.stderr
    r = run("mbench", "--mbench-dir", str(mdir), "--programs", "larson,sh6bench", "--allocators", "glibc")
    assert r.returncode == 2 and "sh6bench" in r.stderr, r.stderr
    r = run("mbench", "--mbench-dir", str(mdir), "--programs", "malloc-large", "--allocators", "glibc")
    assert r.returncode == 2 and "none of the programs" in r.stderr, r.stderr
    r = run("mbench", "--mbench-dir", str(mdir), "--workloads", "larson", "--allocators", "glibc")
    assert r.returncode == 2 and "--programs" in r.stderr, r.stderr
    r = run("mbench", "--mbench-dir", str(mdir), "--docs", "--allocators", "glibc")
    assert r.returncode == 2 and "never rewrites" in r.stderr, r.stderr
    r = run("quick", "--programs", "larson")
    assert r.returncode == 2 and "mbench mode" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()
