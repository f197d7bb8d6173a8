"""Statistics: exact counts, JSON schema, text report, stats_print at exit of a real program under LD_PRELOAD."""
import json
import os
import shutil
import subprocess

from conftest import parse_opts  # noqa: F401  (shared helpers live in conftest)

TOP = {"version": str, "options": dict, "stats": dict, "arenas": list, "classes": list}
STATS = ["allocated", "active", "resident", "mapped", "retained", "dirty", "metadata", "huge_cached",
         "invalid_frees", "remote_frees"]
ARENA = ["index", "nthreads", "nthreads_total", "segments", "dirty_bytes", "purged_bytes", "large_active", "npurge_passes", "nmadvise",
         "purged_total"]
CLASS = ["class", "size", "page_bytes", "objs_per_page", "nmalloc", "nfree", "nrequests", "curobjs", "nrefills",
         "npages", "npages_cached", "npages_released", "curpages"]


def check_schema(doc):
    m = doc["mallard"]
    for k, t in TOP.items():
        assert isinstance(m[k], t), k
    for k in STATS:
        assert isinstance(m["stats"][k], int) and m["stats"][k] >= 0, k
    assert isinstance(m["uptime_ms"], int) and m["ncpus"] >= 1
    for k in ("large", "huge"):
        assert set(m["stats"][k]) == {"nmalloc", "nfree"}
    assert isinstance(m["stats"]["background_thread"]["running"], bool)
    assert m["arenas"], "at least one arena"
    for a in m["arenas"]:
        for k in ARENA:
            assert isinstance(a[k], int), k
        assert set(a["mutex"]) == {"ops", "contended", "wait_ns"}
    for c in m["classes"]:
        for k in CLASS:
            assert isinstance(c[k], int), k
        assert c["curobjs"] == c["nmalloc"] - c["nfree"]
        assert c["objs_per_page"] == c["page_bytes"] // c["size"]
    s = m["stats"]
    assert s["mapped"] >= s["active"] >= s["allocated"] > 0


def test_exact_counts(probe):
    out = probe("exact").stdout
    fields = dict(kv.split("=") for kv in out.split())
    assert fields["size"] == "112"
    assert (fields["nmalloc"], fields["nfree"], fields["curobjs"]) == ("1000", "400", "600")


def test_json_schema(probe):
    doc = json.loads(probe("json").stdout)
    check_schema(doc)
    live = sum(c["curobjs"] for c in doc["mallard"]["classes"])
    assert live >= 250   # the probe keeps 250 of its 500 blocks


def test_text_report(probe):
    out = probe("text").stdout
    assert out.startswith("___ Mallard statistics")
    assert "memory (bytes): allocated " in out and "lock_ops" in out and "nmalloc" in out


def test_stats_print_at_exit_of_real_program(build_dir):
    env = dict(os.environ, LD_PRELOAD=str(build_dir / "lib" / "libmallard.so"),
               MALLARD_CONF="stats_print:true,stats_print_opts:J")
    r = subprocess.run(["sort"], input="\n".join(str(i) for i in range(20000, 0, -1)), env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert r.stdout.splitlines()[0] == "1"
    doc = json.loads(r.stderr)
    check_schema(doc)
    assert doc["mallard"]["stats"]["mapped"] > 0
    assert sum(c["nmalloc"] for c in doc["mallard"]["classes"]) > 100


def test_dump_names_its_process(build_dir, tmp_path):
    """The JSON dump carries the writer's pid and executable (mallard advise picks a dump by them)."""
    exe = tmp_path / 'we"ird\\name'   # a quote and a backslash in the path must come out escaped
    shutil.copy(shutil.which("sort"), exe)
    env = dict(os.environ, LD_PRELOAD=str(build_dir / "lib" / "libmallard.so"),
               MALLARD_CONF="stats_print:true,stats_print_opts:J")
    p = subprocess.Popen([str(exe)], env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    err = p.communicate("b\na\n" * 1000, timeout=60)[1]
    doc = json.loads(err)
    check_schema(doc)
    assert doc["mallard"]["pid"] == p.pid
    assert doc["mallard"]["exe"] == str(exe)
