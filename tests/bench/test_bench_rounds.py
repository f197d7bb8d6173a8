"""Tests of bench/mbench_rounds.py (mimalloc-bench's programs in rounds until a deadline) on the fake programs of
test_bench_mbench.py: round-major order, the deadline, programs run together, the report, bad allocators."""
import json
import os
import subprocess
import sys

from test_bench_mbench import _fake_dir
from test_bench_smoke import REPO

ROUNDS = [sys.executable, str(REPO / "bench" / "mbench_rounds.py")]


def _run(tmp_path, *args, timeout=120):
    mdir = _fake_dir(tmp_path)
    # Not a library: the loader says it cannot preload it and runs the program; its path marks the runs in the log.
    other = tmp_path / "libother.so"
    other.write_text("not an ELF file\n")
    out = tmp_path / "raw.json"
    r = subprocess.run([*ROUNDS, "--mbench-dir", str(mdir), "--allocators", f"glibc=,other={other}",
                        "--subject", "other", "--out", str(out), *args], capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, FAKE_DIR=str(tmp_path)), cwd=tmp_path)
    log = (tmp_path / "log").read_text().splitlines() if (tmp_path / "log").exists() else []
    names = [("glibc" if ln.endswith(" glibc") else "other") for ln in log]
    return r, (json.loads(out.read_text()) if out.exists() else None), log, names


def test_rounds_run_every_cell_once_before_any_cell_again(tmp_path):
    r, raw, log, names = _run(tmp_path, "--programs", "xmalloc-test,larson", "--threads", "1,2", "--rounds", "2")
    assert r.returncode == 0, r.stderr
    assert raw["repeats"] == 2 and raw["peers"] == ["glibc"]
    cells = [" ".join(ln.split()[:2]) for ln in log]
    one = ["xmalloc-test 1", "xmalloc-test 1", "xmalloc-test 2", "xmalloc-test 2",
           "larson 1", "larson 1", "larson 2", "larson 2"]
    assert cells == one + one, log
    # the first allocator rotates from cell to cell and from round to round
    assert names[:4] == ["glibc", "other", "other", "glibc"] and names[8:10] == ["other", "glibc"], log
    assert all(len(runs) == 2 and all(x["ok"] for x in runs) for c in raw["cells"] for runs in c["runs"].values())
    assert raw["cells"][0]["runs"]["glibc"][0]["metrics"]["free_per_s"] == 10e6


def test_deadline_stops_between_cells_and_keeps_what_ran(tmp_path):
    r, raw, log, _ = _run(tmp_path, "--programs", "larson", "--threads", "1", "--rounds", "3", "--deadline-s", "0")
    assert r.returncode == 0, r.stderr
    assert "deadline reached in round 1" in r.stdout and log == []
    assert raw["repeats"] == 0 and all(runs == [] for runs in raw["cells"][0]["runs"].values())


def test_together_runs_every_allocator_of_a_cell(tmp_path):
    r, raw, log, names = _run(tmp_path, "--programs", "rptest", "--threads", "2", "--rounds", "1",
                              "--together", "rptest", "--stagger-s", "0.05")
    assert r.returncode == 0, r.stderr
    assert sorted(names) == ["glibc", "other"], log
    assert all(runs[0]["ok"] for runs in raw["cells"][0]["runs"].values())
    rep = subprocess.run([*ROUNDS, "--report", str(tmp_path / "raw.json")], capture_output=True, text=True,
                         timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert "#### rptest, N = 2 (cross-thread)" in rep.stdout, rep.stdout
    assert "| glibc | ×1.00 (1/1) |" in rep.stdout and "| other | ×1.00 (1/1) |" in rep.stdout, rep.stdout


def test_bad_allocators_are_refused(tmp_path):
    for spec, msg in (("glibc", "not NAME=PATH"), ("a=,a=", "named twice"), (f"x={tmp_path}/none.so", "no such file")):
        r = subprocess.run([*ROUNDS, "--mbench-dir", str(tmp_path), "--allocators", spec], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and msg in r.stderr, (spec, r.stderr)


def test_missing_measure_helper_is_said_in_the_raw_file_and_the_report(tmp_path):
    # In a child: importing bench/run.py (the note's home) puts bench/'s modules on this process's path.
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import run as m; "
             "assert m.rss_floor_note('/usr/bin/mallard-measure') is None; print(m.rss_floor_note(None))")
    c = subprocess.run([sys.executable, "-c", probe, str(REPO / "bench")], capture_output=True, text=True, timeout=60)
    note = c.stdout.strip()
    assert c.returncode == 0 and "mallard-measure" in note, (c.stdout, c.stderr)
    r, raw, _, _ = _run(tmp_path, "--programs", "larson", "--threads", "1", "--rounds", "1")
    assert r.returncode == 0, r.stderr
    assert ("rss_note" in raw) == ("warning: no mallard-measure" in r.stderr)
    raw["rss_note"] = note
    (tmp_path / "noted.json").write_text(json.dumps(raw))
    rep = subprocess.run([*ROUNDS, "--report", str(tmp_path / "noted.json")], capture_output=True, text=True,
                         timeout=60)
    assert rep.returncode == 0 and f"**Peak RSS**: {note}." in rep.stdout, rep.stderr
