"""`mallard stats PID` and `mallard top PID`: the report of a running process under Mallard, read from its memory,
against workloads whose allocation counts and rates are known; clear refusals for glibc, dead and foreign processes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from cc import build

N_SMALL, S_SMALL = 10000, 48  # size class 48 B
N_LARGE, S_LARGE = 20, 600000  # large blocks (256 KiB .. 2 MiB)
N_HUGE, S_HUGE = 3, 3 << 20  # huge mappings
HOLD = ["hold", str(N_SMALL), str(S_SMALL), str(N_LARGE), str(S_LARGE), str(N_HUGE), str(S_HUGE)]


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    return build("live_workload", tmp_path_factory.mktemp("live"), "-ldl")


def lib(allocators, name):
    return next(a.path for a in allocators if a.name == name)


class Proc:
    """A workload started with `env` (and `pre` before it, e.g. setpriv); waits for "ready"; ended by a line."""

    def __init__(self, argv, env, pre=()):
        self.p = subprocess.Popen([*pre, *argv], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.before = []
        for line in self.p.stdout:
            if line.startswith("ready"):
                break
            self.before.append(line)
        else:
            raise AssertionError(f"workload ended before ready: {self.p.wait()}")
        self.pid = self.p.pid

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.p.stdin.write("end\n")
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def stats_json(mallard, pid):
    r = mallard("stats", "--json", str(pid), timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["mallard"]


def cls(data, size):
    return next(c for c in data["classes"] if c["size"] == size)


@pytest.mark.parametrize("variant", ["mallard", "mallard-secure"])
def test_stats_shows_the_known_counts(mallard, allocators, workload, variant):
    # Exact class counts: the secure variant's guard sampler (a block served from its pool counts in no class) is off.
    env = dict(mallard.env, LD_PRELOAD=lib(allocators, variant), MALLARD_CONF="guard_sample:0")
    with Proc([workload, *HOLD], env) as w:
        d = stats_json(mallard, w.pid)
        assert d["pid"] == w.pid and d["exe"] == workload, d
        c = max(d["classes"], key=lambda c: c["curobjs"])  # the secure variant's canary moves 48 B to class 64 B
        assert S_SMALL <= c["size"] <= 64, c
        assert N_SMALL <= c["nmalloc"] <= N_SMALL + 50 and N_SMALL <= c["curobjs"] <= N_SMALL + 50, c
        st = d["stats"]
        assert st["large"]["nmalloc"] - st["large"]["nfree"] == N_LARGE, st
        assert st["huge"]["nmalloc"] - st["huge"]["nfree"] == N_HUGE, st
        assert st["allocated"] >= N_SMALL * S_SMALL + N_LARGE * S_LARGE + N_HUGE * S_HUGE, st
        assert st["allocated"] <= st["active"] <= st["resident"] <= st["mapped"], st
        assert d["arenas"] and sum(a["nthreads"] for a in d["arenas"]) >= 1, d["arenas"]


def test_text_is_the_report_the_process_prints(mallard, allocators, workload):
    # The workload prints its own report (mallard_stats_print) just before "ready"; the live one read from outside
    # must be the same report: same lines, the same options line, the same counts where nothing moved since.
    with Proc([workload, *HOLD, "report"], dict(mallard.env, LD_PRELOAD=lib(allocators, "mallard"))) as w:
        r = mallard("stats", str(w.pid), timeout=60)
        assert r.returncode == 0, r.stderr
    own = "".join(w.before).split("report-begin\n")[1].split("report-end\n")[0].splitlines()
    got = r.stdout.splitlines()
    assert len(got) == len(own), (got, own)
    for a, b in zip(got, own):
        if a.split()[:1] != b.split()[:1] or a.startswith(("___", "options:", "counts:", "arena ", "class ")):
            assert a == b
    row = next(x for x in got if x.split()[1:2] == [str(S_SMALL)])
    assert row == next(x for x in own if x.split()[1:2] == [str(S_SMALL)])
    assert row.split()[4] == str(N_SMALL) or int(row.split()[4]) >= N_SMALL


def test_stats_of_a_static_link(mallard, build, workload, tmp_path):
    exe = str(tmp_path / "static_workload")
    cc = shutil.which("cc")
    subprocess.run([cc, "-O1", "-fno-builtin", "-o", exe, os.path.join(os.path.dirname(__file__), "progs",
                    "live_workload.c"), str(build / "lib" / "libmallard.a"), "-lpthread", "-ldl"], check=True,
                   timeout=120)
    with Proc([exe, *HOLD], mallard.env) as w:
        c = cls(stats_json(mallard, w.pid), S_SMALL)
        assert N_SMALL <= c["curobjs"] <= N_SMALL + 50, c
    subprocess.run(["strip", exe], check=True)
    with Proc([exe, *HOLD], mallard.env) as w:
        r = mallard("stats", str(w.pid))
        assert r.returncode == 1 and "stripped" in r.stderr, r.stderr


def test_top_shows_the_rate(mallard, allocators, workload):
    rate = 20000  # 64-byte mallocs and frees a second (a little less: the work takes time too)
    with Proc([workload, "steady", str(rate), "64"], dict(mallard.env, LD_PRELOAD=lib(allocators, "mallard"))) as w:
        r = mallard("top", str(w.pid), "--json", "--iterations", "2", "--interval", "0.5", timeout=60)
        assert r.returncode == 0, r.stderr
        samples = [json.loads(x) for x in r.stdout.splitlines()]
        assert len(samples) == 2
        for s in samples:
            c = next(c for c in s["classes"] if c["size"] == 64)
            assert rate * 0.3 <= c["malloc_per_s"] <= rate * 1.2, c
            assert rate * 0.3 <= c["free_per_s"] <= rate * 1.2, c
            assert s["classes"][0]["size"] == 64  # the busiest class first
            assert s["rss"] and s["memory"]["resident"] > 0
        t = mallard("top", str(w.pid), "--iterations", "1", "--interval", "0.3", timeout=60)
    assert t.returncode == 0, t.stderr
    assert "allocations per second" in t.stdout and "arenas (per second)" in t.stdout, t.stdout
    row = next(x for x in t.stdout.splitlines() if x.split()[1:3] == ["64", "B"])
    assert float(row.split()[3].replace(",", "")) >= rate * 0.3, row


def test_glibc_process_is_refused_naming_glibc(mallard):
    p = subprocess.Popen(["sleep", "30"], env=mallard.env)
    try:
        for cmd in (["stats"], ["top", "--iterations", "1"]):
            r = mallard(*cmd, str(p.pid))
            assert r.returncode == 1, r
            assert f"process {p.pid} uses glibc malloc" in r.stderr and "not Mallard" in r.stderr, r.stderr
            assert r.stdout == ""
    finally:
        p.kill()
        p.wait()


def test_dead_process(mallard):
    p = subprocess.Popen(["true"])
    p.wait()
    r = mallard("stats", str(p.pid))
    assert r.returncode == 4 and f"no process with PID {p.pid}" in r.stderr, r.stderr
    r = mallard("top", "--iterations", "1", "notapid")
    assert r.returncode == 4 and "not a PID" in r.stderr, r.stderr


def as_user(user):
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or not setpriv:
        pytest.skip("needs root and setpriv to run as another user")
    import pwd

    pw = pwd.getpwnam(user)
    return [setpriv, f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"]


def test_other_user_is_refused(mallard, allocators, workload):
    nobody = as_user("nobody")
    with Proc([workload, *HOLD], dict(mallard.env, LD_PRELOAD=lib(allocators, "mallard"))) as w:
        r = subprocess.run([*nobody, *mallard_argv(), "stats", str(w.pid)], env=mallard.env, capture_output=True,
                           text=True, timeout=60)
    assert r.returncode == 4, r
    assert f"process {w.pid} belongs to root (uid 0)" in r.stderr and "only that user or root" in r.stderr, r.stderr


CALL = ("import ctypes, sys; L = ctypes.CDLL(sys.argv[1]); CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, "
        "ctypes.c_char_p); L.mallard_live_stats.argtypes = [ctypes.c_int, ctypes.c_size_t, CB, ctypes.c_void_p, "
        "ctypes.c_char_p]; out = []; rc = L.mallard_live_stats(int(sys.argv[2]), int(sys.argv[3]), "
        "CB(lambda o, s: out.append(s)), None, b'J'); print(rc, len(b''.join(out)))")


def reader_rc(pid, root, reader, pre=()):
    import sys

    r = subprocess.run([*pre, sys.executable, "-c", CALL, reader, str(pid), str(root)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rc, n = r.stdout.split()
    return int(rc), int(n)


def test_reader_errors(mallard, allocators, workload, monkeypatch):
    import errno

    monkeypatch.setenv("MALLARD_BUILD_DIR", mallard.env["MALLARD_BUILD_DIR"])
    from mallard_cli import live

    with Proc([workload, *HOLD], dict(mallard.env, LD_PRELOAD=lib(allocators, "mallard"))) as w:
        t = live.locate(w.pid)
        reader = t.readers[0]
        assert reader_rc(w.pid, t.root, reader)[0] == 0
        assert reader_rc(w.pid, t.root + 8, reader) == (errno.EPROTO, 0)  # not the root: refused, nothing written
        assert reader_rc(w.pid, 8, reader) == (errno.EFAULT, 0)
        assert reader_rc(0, t.root, reader) == (errno.EINVAL, 0)
        if os.geteuid() == 0 and shutil.which("setpriv"):
            # another user: the kernel refuses (the CLI says so before asking it: test_other_user_is_refused)
            assert reader_rc(w.pid, t.root, reader, pre=as_user("nobody")) == (errno.EPERM, 0)
    assert reader_rc(w.pid, t.root, reader) == (errno.ESRCH, 0)


def test_reader_refuses_another_layout(mallard, allocators, workload):
    import errno

    with Proc([workload, "fakeroot"], dict(mallard.env, LD_PRELOAD=lib(allocators, "mallard"))) as w:
        root = int(w.before[-1].split()[1])
        assert reader_rc(w.pid, root, lib(allocators, "mallard")) == (errno.EPROTO, 0)


def test_non_dumpable_process_of_the_same_user(mallard, allocators, workload):
    # Same user, but the process made itself non-dumpable: its memory and maps are closed to the user; root may.
    nobody = as_user("nobody")
    env = dict(mallard.env, LD_PRELOAD=lib(allocators, "mallard"), LIVE_NODUMP="1")
    with Proc([workload, *HOLD], env, pre=nobody) as w:
        r = subprocess.run([*nobody, *mallard_argv(), "stats", str(w.pid)], env=mallard.env, capture_output=True,
                           text=True, timeout=60)
        ok = mallard("stats", "--json", str(w.pid))
    assert r.returncode == 4 and "permission denied" in r.stderr, r.stderr
    assert ok.returncode == 0 and cls(json.loads(ok.stdout)["mallard"], S_SMALL)["curobjs"] >= N_SMALL, ok.stderr


def mallard_argv():
    import sys

    return [sys.executable, "-m", "mallard_cli"]
