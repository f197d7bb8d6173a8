"""`mallard heap -- CMD`: the program runs under libmallard with profiling on, its exit status comes back, and the
report names its allocation sites; missing, killed and unprofiled programs get clear messages and exit codes.

The end-to-end tests need a libmallard with the `prof` option: they skip, saying so, when the library built here
lacks it (its option table has no 'prof_sample'); with a library that has it, a missing profile fails them."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess

import cc
import pytest

from mallard_cli.commands.heap import merged_conf

MiB = 1 << 20


def mallard_lib(build) -> str:
    p = build / "lib" / "libmallard.so"
    assert p.exists(), f"{p} is not built"
    return str(p)


def profiling(build) -> bool:
    with open(mallard_lib(build), "rb") as f:
        return b"prof_sample" in f.read()


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    d = tmp_path_factory.mktemp("heaprun")
    lib = cc.build("heap_lib", d, "-g", "-shared", "-fPIC")
    return cc.build("heap_sites", d, "-g", lib)


def test_missing_program(mallard, tmp_path):
    r = mallard("heap", "--", str(tmp_path / "no-such-program"))
    assert r.returncode == 127 and "cannot run" in r.stderr and "Traceback" not in r.stderr


def test_not_executable(mallard, tmp_path):
    f = tmp_path / "data.txt"
    f.write_text("x")
    r = mallard("heap", "--", str(f))
    assert r.returncode == 126 and "cannot run" in r.stderr


@pytest.mark.parametrize("args", [["-a", "glibc"], ["--sample", "0"], ["--sample", "lots"], ["--top", "0"],
                                  ["--conf", "prof"]])
def test_usage_errors(mallard, args):
    r = mallard("heap", *args, "--", "true")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("mallard: ") and len(r.stderr.strip().splitlines()) == 1


def test_output_folder_must_exist(mallard, tmp_path):
    r = mallard("heap", "-o", str(tmp_path / "nowhere" / "p.pb.gz"), "--", "true")
    assert r.returncode == 1 and "no folder" in r.stderr


def test_killed_program_keeps_its_status(mallard, tmp_path):
    r = mallard("heap", "--", "sh", "-c", "kill -9 $$", cwd=tmp_path)
    assert r.returncode == 128 + 9, r.stderr
    assert "killed by signal 9 (SIGKILL)" in r.stderr and "no profile" in r.stderr
    assert not list(tmp_path.glob("*.pb.gz"))


def test_static_program_gets_no_profile(mallard, tmp_path, build):
    """LD_PRELOAD cannot reach a static program: no profile, exit 1, and a message that says why."""
    try:
        exe = cc.build("heap_sites", tmp_path, "-static", "-DHEAP_STATIC")
    except AssertionError as e:
        pytest.skip(f"no static C library to link a static program with: {e}")
    r = mallard("heap", "--", exe, "1", "1", "1", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "heap_sites done" in r.stdout  # the program itself ran
    assert "no profile was written" in r.stderr
    if profiling(build):
        assert "statically linked" in r.stderr
    else:
        assert "has no heap profiler" in r.stderr


def test_merged_conf_keeps_the_users_options():
    got = merged_conf("narenas:2,prof_prefix:/elsewhere/x,prof:false", "prof_leak:true,prof_final:false", "/t/m", None)
    assert got == "narenas:2,prof_leak:true,prof:true,prof_final:true,prof_prefix:/t/m"
    got = merged_conf("prof_sample:64k", None, "/t/m", None)
    assert got.startswith("prof_sample:64k,") and got.count("prof_sample") == 1
    got = merged_conf("prof_sample:64k", None, "/t/m", "8k")
    assert got.endswith(",prof_sample:8k") and got.count("prof_sample") == 1


def test_profile_a_program_end_to_end(mallard, sites, tmp_path, build):
    if not profiling(build):
        pytest.skip(f"{mallard_lib(build)} has no heap profiler yet (no 'prof_sample' option): the prof branch "
                    "adds it")
    out = tmp_path / "run.pb.gz"
    r = mallard("heap", "--sample", "8k", "-o", str(out), "--", sites, "1000", "800", "20000", "3", cwd=tmp_path,
                env={"MALLARD_CONF": "prof_prefix:/nonexistent/x,narenas:2"})
    assert r.returncode == 3, r.stderr  # the program's own exit status
    assert "heap_sites done" in r.stdout
    assert out.is_file() and gzip.decompress(out.read_bytes())
    live = r.stdout[r.stdout.index("by live bytes"):r.stdout.index("by bytes allocated")]
    alloc = r.stdout[r.stdout.index("by bytes allocated"):]
    assert re.search(r"hold_site heap_sites\.c:\d+", live) and re.search(r"leak_site heap_sites\.c:\d+", live)
    assert live.index("hold_site") < live.index("leak_site")
    assert "churn_site" in alloc and alloc.index("churn_site") < alloc.index("hold_site")
    assert "go tool pprof -http=:" in r.stdout and str(out) in r.stdout
    rep = json.loads(mallard("heap", "show", str(out), "--json").stdout)
    by = {s["function"]: s for s in rep["sites"]}
    # 8 KiB sampling: the standard deviation of 50 MiB is ~0.1%, of 10 MiB ~2.8%; 25% is far outside chance.
    assert by["hold_site"]["inuse_space"] == pytest.approx(800 * 65536, rel=0.25)
    assert by["leak_site"]["inuse_space"] == pytest.approx(1000 * 10240, rel=0.25)
    assert "run_all" in [f["function"] for f in by["leak_site"]["stack"]]


def test_default_output_name_and_status_zero(mallard, sites, tmp_path, build):
    if not profiling(build):
        pytest.skip(f"{mallard_lib(build)} has no heap profiler yet (no 'prof_sample' option)")
    r = mallard("heap", "--", sites, "10", "10", "10", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    files = list(tmp_path.glob("mallard-heap.*.pb.gz"))
    assert len(files) == 1 and f"Profile: {files[0].name}" in r.stdout.replace(str(tmp_path) + os.sep, "")
    assert subprocess.run(["gzip", "-t", str(files[0])]).returncode == 0


# A stand-in for libmallard's dumps (until the library has them, and to steer the cases): the program run under
# `mallard heap` is this script, which reads prof_prefix from its MALLARD_CONF, as the library does, and writes a
# synthetic profile of heap_sites there, named as the library names its dumps.
WRITER = r'''
import os, signal, sys
sys.path.insert(0, {here!r})
from pprof_fixture import Loaded, ProfileBuilder
exe, mode, status = sys.argv[1], sys.argv[2], int(sys.argv[3])
conf = dict(kv.split(":", 1) for kv in os.environ["MALLARD_CONF"].split(","))
assert conf["prof"] == "true" and conf["prof_final"] == "true", conf
print("conf", os.environ["MALLARD_CONF"], flush=True)
# The tools this script starts (nm, readelf) run without the library; and it leaves with os._exit so that a library
# that profiles does not write its own final dump over this one.
os.environ.pop("LD_PRELOAD", None)
os.environ.pop("MALLARD_CONF", None)
def dump(name, leak):
    b = ProfileBuilder()
    p = Loaded(b, exe, 0x555555554000)
    b.heap_sample([p.loc("leak_site", 8), p.loc("run_all", 30), p.loc("main", 20)], leak, 10, leak, 10)
    b.heap_sample([p.loc("churn_site", 8), p.loc("run_all", 30)], 0, 0, 1 << 30, 5000)
    with open(conf["prof_prefix"] + "." + name + ".pb.gz", "wb") as f:
        f.write(b.gz())
pid = os.getpid()
if mode == "final":
    dump(f"{{pid}}.0", 1 << 20)
    dump(f"{{pid + 1}}.final", 1 << 10)  # as a child process would
    dump(f"{{pid}}.final", 5 << 20)
elif mode == "killed":
    dump(f"{{pid}}.0", 1 << 20)
    dump(f"{{pid}}.1", 2 << 20)
    os.kill(pid, signal.SIGKILL)
sys.stdout.flush()
os._exit(status)
'''


@pytest.fixture()
def writer(tmp_path):
    w = tmp_path / "writer.py"
    w.write_text(WRITER.format(here=str(cc.PROGS.parent)))
    return str(w)


def test_report_of_a_final_dump(mallard, sites, writer, tmp_path):
    import sys

    out = tmp_path / "out" / "p.pb.gz"
    out.parent.mkdir()
    r = mallard("heap", "-o", str(out), "--sample", "64k", "--conf", "narenas:3", "--", sys.executable, writer, sites,
                "final", "4", cwd=tmp_path, env={"MALLARD_CONF": "prof_prefix:/nonexistent/x,prof_leak:true"})
    assert r.returncode == 4, r.stderr  # the program's status
    conf = re.search(r"^conf (\S+)", r.stdout, re.M).group(1)
    assert conf.startswith("prof_leak:true,narenas:3,prof:true,prof_final:true,prof_prefix:")
    assert conf.endswith(",prof_sample:64k") and "/nonexistent" not in conf
    assert "(exit status 4)" in r.stdout
    live = r.stdout[r.stdout.index("by live bytes"):r.stdout.index("by bytes allocated")]
    assert re.search(r"5\.0 MiB .* leak_site heap_sites\.c:\d+ .* run_all heap_sites\.c:\d+ ← main", live)
    assert "churn_site" not in live and "churn_site" in r.stdout[r.stdout.index("by bytes allocated"):]
    assert f"Profile: {out}" in r.stdout and f"go tool pprof -http=: {out}" in r.stdout
    assert "Other dumps of this run" in r.stdout
    rep = json.loads(mallard("heap", "show", str(out), "--json").stdout)
    assert rep["totals"]["inuse_space"] == 5 << 20  # the final dump of the program's own PID, not the others
    others = sorted(p.name for p in out.parent.iterdir() if p != out)
    assert len(others) == 2 and all(re.fullmatch(r"p\.\d+\.(0|final)\.pb\.gz", n) for n in others), others
    assert not list(tmp_path.glob("mallard-heap.*"))


def test_killed_program_reports_its_last_periodic_dump(mallard, sites, writer, tmp_path):
    import sys

    r = mallard("heap", "--", sys.executable, writer, sites, "killed", "0", cwd=tmp_path)
    assert r.returncode == 128 + 9, r.stderr
    assert "killed by signal 9 (SIGKILL)" in r.stdout and "last periodic dump" in r.stdout
    assert "2.0 MiB" in r.stdout  # dump 1, the last one, not dump 0
    prof = list(tmp_path.glob("mallard-heap.*.pb.gz"))
    assert len(prof) == 2  # the reported dump and the earlier one beside it


def test_corrupt_dump_is_an_error(mallard, sites, tmp_path):
    import sys

    script = tmp_path / "bad.py"
    script.write_text("import os\nc = dict(kv.split(':', 1) for kv in os.environ['MALLARD_CONF'].split(','))\n"
                      "open(c['prof_prefix'] + f'.{os.getpid()}.final.pb.gz', 'wb').write(b'\\x1f\\x8bxx')\n"
                      "os._exit(0)  # not through exit(): a library that profiles must not replace this dump\n")
    r = mallard("heap", "--", sys.executable, str(script), cwd=tmp_path)
    assert r.returncode == 1 and ("corrupt gzip" in r.stderr or "truncated gzip" in r.stderr), r.stderr
