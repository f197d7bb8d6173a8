"""`mallard bench` and `mallard demo`: every installed allocator compared on real workloads, with table, JSON and plot."""
from __future__ import annotations

import json
import re
import sys

from mallard_cli.commands.demo import workload_path


def test_bench_real_workload_covers_every_allocator(mallard, allocators, tmp_path):
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    cmd = [sys.executable, str(workload_path()), "--size-mb", "2"]
    r = mallard("bench", "-n", "2", "--warmup", "1", "--metric-from-output", r"elapsed: ([0-9.]+) s",
                "--metric-name", "reader (s)", "--json", str(js), "--plot", str(png), "--", *cmd)
    assert r.returncode == 0, r.stderr
    data = json.loads(js.read_text())
    names = [a["name"] for a in data["allocators"]]
    assert names == [a.name for a in allocators]
    assert {"glibc", "mallard"} <= set(names)
    for a in data["allocators"]:
        assert a["failure"] is None
        assert len(a["runs"]) == 2 and len(a["metrics"]) == 2
        assert all(x["wall_s"] > 0 and x["max_rss_kib"] > 1000 for x in a["runs"])
        assert a["median"]["metric"] > 0
    table_rows = [line for line in r.stdout.splitlines() if line.startswith("│")]
    for name in names:
        assert any(row.split("│")[1].strip().startswith(name) for row in table_rows), name
    assert "Fastest:" in r.stdout and "Leanest:" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rss_is_the_programs_own(mallard, prog, tmp_path):
    # A small C program's peak RSS is a few MiB, not the Python CLI's (ru_maxrss survives exec).
    js = tmp_path / "b.json"
    r = mallard("bench", "-a", "glibc", "-n", "1", "--warmup", "0", "--json", str(js), "--", prog("churn"), "1", "1000")
    assert r.returncode == 0, r.stderr
    rss = json.loads(js.read_text())["allocators"][0]["runs"][0]["max_rss_kib"]
    assert 500 < rss < 8000


def test_bench_names_the_allocator_that_fails(mallard, allocators):
    # The program fails only when something is preloaded, i.e. under every allocator except glibc.
    r = mallard("bench", "-a", "glibc,mallard", "-n", "1", "--warmup", "0", "--", "sh", "-c",
                'test -n "$LD_PRELOAD" && exit 9; exit 0')
    assert r.returncode == 5
    assert "failed under mallard" in r.stderr and "exit status 9" in r.stderr
    assert "glibc" not in r.stderr


def test_bench_interleaves_runs(mallard, tmp_path):
    # Each run appends the allocator it saw to a log: the order must be A B A B, not A A B B.
    log = tmp_path / "order.log"
    r = mallard("bench", "-a", "glibc,mallard", "-n", "2", "--warmup", "0", "--", "sh", "-c",
                f'echo "${{LD_PRELOAD:-glibc}}" >> {log}')
    assert r.returncode == 0, r.stderr
    seen = ["glibc" if x == "glibc" else "mallard" for x in log.read_text().split()]
    assert seen == ["glibc", "mallard", "glibc", "mallard"]


def test_demo_runs_the_threaded_reader_over_every_allocator(mallard, allocators, tmp_path):
    png, js = tmp_path / "demo.png", tmp_path / "demo.json"
    r = mallard("demo", "-n", "1", "--warmup", "0", "--size-mb", "1", "--plot", str(png), "--json", str(js))
    assert r.returncode == 0, r.stderr
    data = json.loads(js.read_text())
    assert [a["name"] for a in data["allocators"]] == [a.name for a in allocators]
    assert "threaded_reader.py" in " ".join(data["command"])
    assert png.stat().st_size > 1000
    assert "reader time (s)" in r.stdout


def test_demo_tells_the_guides_story(mallard, tmp_path):
    # Profile first (pymalloc keeps small objects from malloc), then compare where malloc is called, then read the
    # result without naming a winner inside the noise.
    r = mallard("demo", "-n", "2", "--warmup", "0", "--size-mb", "1", "--plot", str(tmp_path / "d.png"),
                "--json", str(tmp_path / "d.json"))
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "Step 1" in out and "mallard profile" in out and "Step 2" in out and "Reading it" in out
    counts = [int(x.replace(",", "")) for x in re.findall(r": ([\d,]+) allocation calls", out)]
    assert len(counts) == 2 and counts[1] > 10 * counts[0], out  # PYTHONMALLOC=malloc sends every object to malloc
    data = json.loads((tmp_path / "d.json").read_text())
    v = data["verdict"]
    if v["fastest"] is None:
        assert "No allocator is measurably faster" in out
        assert "Fastest: no measurable difference" in out
    else:
        assert f"{v['fastest']} read fastest, beyond the spread" in out
