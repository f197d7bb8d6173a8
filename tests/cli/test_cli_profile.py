"""`mallard profile`: exact call counts and sizes from real programs, threads, fork/exec, allocations before main."""
from __future__ import annotations

import json

import pytest

ALLOCATORS = ["glibc", "mallard", "jemalloc", "mimalloc", "tcmalloc"]


def sizes_of(record: dict) -> dict:
    return {(fn, size): n for fn, size, n in record["sizes"]}


@pytest.mark.parametrize("name", ALLOCATORS)
def test_profile_counts_exact_calls_in_four_threads(mallard, prog, allocators, need, tmp_path, name):
    need(allocators, name)
    out = tmp_path / "p.json"
    r = mallard("profile", "-a", name, "-o", str(out), "--", prog("mt-realloc"))
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert len(rep["processes"]) == 1
    rec = rep["processes"][0]
    s = sizes_of(rec)
    assert s[("malloc", 8225)] == 1000
    assert s[("realloc", 16450)] == 500
    assert rec["calls"]["realloc"] == 500
    assert rec["calls"]["malloc"] >= 1000
    assert rec["calls"]["free"] >= 1000
    workers = [t for t in rec["threads"] if t["by_function"].get("realloc")]
    assert len(workers) == 4
    # Each worker's own calls; the C library may add a call of its own in a thread (e.g. a calloc for TLS).
    for t in workers:
        f = t["by_function"]
        assert (f["malloc"], f["realloc"], f["free"]) == (250, 125, 250), f
    # The blocks of all four threads can be live at once: at least one thread's 250 blocks of 8225 bytes.
    assert rec["peak_live_bytes"] >= 250 * 8225
    top = rep["summary"]["top_sizes"][0]
    assert top["size"] == 8225 and top["calls"] == 1000
    # The printed report shows the same figures.
    assert "8,225" in r.stdout and "1,000" in r.stdout and "16,450" in r.stdout
    assert "Verdict" in r.stdout
    assert "calls/s" in r.stdout


def test_profile_one_record_per_process_across_fork_and_exec(mallard, prog, tmp_path):
    out = tmp_path / "p.json"
    r = mallard("profile", "-o", str(out), "--", prog("fork-exec"))
    assert r.returncode == 0, r.stderr
    recs = json.loads(out.read_text())["processes"]
    assert len(recs) == 3, [(x["pid"], x["ended_by"]) for x in recs]
    by_size = {}
    for rec in recs:
        for (fn, size), n in sizes_of(rec).items():
            if size in (1111, 2222, 3333):
                by_size[size] = (rec, n)
    before, n1 = by_size[1111]
    child, n2 = by_size[2222]
    after, n3 = by_size[3333]
    assert (n1, n2, n3) == (100, 200, 300)
    assert before["ended_by"] == "exec"
    assert after["ended_by"] == "exit" and after["pid"] == before["pid"]
    assert child["ppid"] == before["pid"] and child["pid"] != before["pid"]
    # Each record holds only its own process image's calls.
    assert (2222 not in {s for _, s in sizes_of(before)}) and (1111 not in {s for _, s in sizes_of(child)})
    assert "3 process records" in r.stdout


def test_profile_sees_allocations_before_main_and_every_thread(mallard, prog, tmp_path):
    out = tmp_path / "p.json"
    r = mallard("profile", "-o", str(out), "--", prog("arenas"), "0")
    assert r.returncode == 0, r.stderr
    rec = json.loads(out.read_text())["processes"][0]
    s = sizes_of(rec)
    assert s[("malloc", 777)] == 1  # from a constructor, before main
    assert s[("malloc", 8)] == 10
    assert len([t for t in rec["threads"] if t["by_function"].get("malloc") == 1 and t["exited"]]) >= 10


def test_profile_returns_the_program_status(mallard):
    r = mallard("profile", "--", "sh", "-c", "exit 3")
    assert r.returncode == 3
    assert "Calls per function" in r.stdout


def test_profile_overhead_mode_reports_both_medians(mallard, prog):
    r = mallard("profile", "--overhead", "-n", "2", "--", prog("churn"), "2", "100000")
    assert r.returncode == 0, r.stderr
    assert "without tracer" in r.stdout and "with tracer" in r.stdout and "Overhead:" in r.stdout


@pytest.mark.parametrize("name", ["glibc", "mallard"])
def test_profile_counts_every_malloc_family_function(mallard, prog, allocators, need, tmp_path, name):
    # pvalloc is in the program: jemalloc does not replace it (a known peer defect), so only glibc and Mallard here.
    need(allocators, name)
    out = tmp_path / "p.json"
    r = mallard("profile", "-a", name, "-o", str(out), "--", prog("variants"))
    assert r.returncode == 0, r.stderr
    rec = json.loads(out.read_text())["processes"][0]
    s = sizes_of(rec)
    expected = {("calloc", 3000), ("aligned_alloc", 640), ("posix_memalign", 1280), ("memalign", 2560),
                ("valloc", 5000), ("pvalloc", 6000), ("reallocarray", 7000)}
    for key in expected:
        assert s.get(key) == 1, (key, rec["sizes"])
    for fn in ("aligned_alloc", "posix_memalign", "memalign", "valloc", "pvalloc", "reallocarray"):
        assert rec["calls"][fn] == 1, fn
    assert rec["calls"]["realloc"] == 0  # reallocarray is counted once, not again as realloc
    assert rec["calls"]["free"] >= 7
    assert rec["live_objects_at_end"] <= rec["peak_live_objects"]
