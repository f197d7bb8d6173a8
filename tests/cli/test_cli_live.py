"""`mallard stats PID` and `mallard top PID`: the report of a running process under Mallard, read from its memory,
against workloads whose allocation counts and rates are known; clear refusals for glibc, dead and foreign processes;
a hostile library in the target is never loaded, and malformed roots are refused in one line."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

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

    def __init__(self, argv, env, pre=(), cwd=None):
        self.p = subprocess.Popen([*pre, *argv], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  cwd=cwd)
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


# ---- what another user runs, staged where that user can reach it ----
# The checkout (its .venv, build and the tests' temporary folders) may lie under a directory that other users cannot
# enter (a clone in a 0700 folder, a private TMPDIR): what `nobody` runs is copied into a fresh 0755 folder made
# explicitly under /tmp (not $TMPDIR), with the command's package and its dependencies, removed after the tests.

def _dist_tops(name: str, seen: set) -> list[str]:
    """Top-level import names of a distribution and of what it requires (extras left out), recursively."""
    from importlib import metadata

    try:
        d = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return []
    key = (d.metadata["Name"] or name).lower().replace("_", "-")
    if key in seen:
        return []
    seen.add(key)
    tops = (d.read_text("top_level.txt") or "").split()
    if not tops:
        tops = sorted({str(f).split("/")[0].removesuffix(".py") for f in d.files or []
                       if str(f).endswith(".py") and not str(f).startswith("..") and ".dist-info" not in str(f)})
    for req in d.requires or []:
        if "extra ==" not in req:
            tops += _dist_tops(re.split(r"[ ;<>=!~\[(]", req.strip(), maxsplit=1)[0], seen)
    return tops


class Shared:
    """A 0755 folder under /tmp holding the package, its dependencies, the libraries and the workload."""

    def __init__(self, workload):
        import importlib.util

        self.dir = Path(tempfile.mkdtemp(prefix="mallard-live-shared-", dir="/tmp"))
        py, lib = self.dir / "py", self.dir / "lib"
        src = Path(__file__).resolve().parents[2] / "tools" / "mallard" / "src" / "mallard_cli"
        shutil.copytree(src, py / "mallard_cli", ignore=shutil.ignore_patterns("__pycache__"))
        tops: list[str] = []
        seen: set = set()
        for dist in ("rich", "pyelftools"):
            tops += _dist_tops(dist, seen)
        for top in dict.fromkeys(tops):
            spec = importlib.util.find_spec(top)
            if spec is None or not spec.origin:
                continue
            if spec.submodule_search_locations:
                shutil.copytree(Path(spec.origin).parent, py / top, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(spec.origin, py / Path(spec.origin).name)
        lib.mkdir()
        build = Path(os.environ.get("MALLARD_BUILD_DIR") or Path(__file__).resolve().parents[2] / "build")
        for f in (build / "lib").glob("libmallard*.so*"):
            shutil.copy2(f, lib / f.name)  # symbolic links followed: plain files
        self.lib = str(lib / "libmallard.so")
        self.workload = str(self.dir / "live_workload")
        shutil.copy2(workload, self.workload)
        for root, dirs, files in os.walk(self.dir):
            for n in dirs + files:
                os.chmod(os.path.join(root, n), 0o755)
        os.chmod(self.dir, 0o755)
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLUMNS": "200", "HOME": str(self.dir),
                    "TMPDIR": str(self.dir), "PYTHONPATH": str(py), "MALLARD_LIBDIR": str(lib),
                    "PYTHONDONTWRITEBYTECODE": "1"}
        self.python = self._python()

    def _python(self) -> str:
        """An interpreter that `nobody` can run and that imports the staged command."""
        nobody = as_user("nobody")
        cands = [os.path.realpath(sys.executable), getattr(sys, "_base_executable", ""), shutil.which("python3") or "",
                 "/usr/bin/python3", "/usr/local/bin/python3"]
        tried = []
        for c in dict.fromkeys(x for x in cands if x):
            r = subprocess.run([*nobody, c, "-c", "import mallard_cli.cli, mallard_cli.live, rich, elftools"],
                               env=self.env, cwd=self.dir, capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                return c
            tried.append(f"{c}: {r.stderr.strip().splitlines()[-1:] or r.returncode}")
        raise AssertionError(f"no Python that nobody can run imports the staged command: {tried}")

    def argv(self):
        return [self.python, "-m", "mallard_cli"]


@pytest.fixture(scope="module")
def shared(workload):
    as_user("nobody")  # skips without root and setpriv
    s = Shared(workload)
    try:
        yield s
    finally:
        shutil.rmtree(s.dir, ignore_errors=True)


def test_other_user_is_refused(mallard, allocators, workload, shared):
    nobody = as_user("nobody")
    with Proc([workload, *HOLD], dict(mallard.env, LD_PRELOAD=lib(allocators, "mallard"))) as w:
        r = subprocess.run([*nobody, *shared.argv(), "stats", str(w.pid)], env=shared.env, cwd=shared.dir,
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 4, r
    assert f"process {w.pid} belongs to root (uid 0)" in r.stderr and "only that user or root" in r.stderr, r.stderr


CALL = ("import ctypes, sys; L = ctypes.CDLL(sys.argv[1]); CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, "
        "ctypes.c_char_p); L.mallard_live_stats.argtypes = [ctypes.c_int, ctypes.c_size_t, CB, ctypes.c_void_p, "
        "ctypes.c_char_p]; out = []; rc = L.mallard_live_stats(int(sys.argv[2]), int(sys.argv[3]), "
        "CB(lambda o, s: out.append(s)), None, b'J'); why = ctypes.create_string_buffer(256); "
        "L.mallard_live_reason(why, 256); print(rc, len(b''.join(out)), why.value.decode())")


def reader_call(pid, root, reader, pre=(), python=None, env=None, cwd=None):
    """(errno, bytes written, reason) of mallard_live_stats of `reader` on the root at `root` of process `pid`."""
    r = subprocess.run([*pre, python or sys.executable, "-c", CALL, reader, str(pid), str(root)], capture_output=True,
                       text=True, timeout=60, env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr
    rc, n, why = (r.stdout.rstrip("\n").split(" ", 2) + [""])[:3]
    return int(rc), int(n), why


def reader_rc(pid, root, reader, **kw):
    return reader_call(pid, root, reader, **kw)[:2]


def test_reader_errors(mallard, allocators, workload, monkeypatch, request):
    import errno

    monkeypatch.setenv("MALLARD_BUILD_DIR", mallard.env["MALLARD_BUILD_DIR"])
    from mallard_cli import live

    with Proc([workload, *HOLD], dict(mallard.env, LD_PRELOAD=lib(allocators, "mallard"))) as w:
        t = live.locate(w.pid)
        reader = t.readers[0]
        # the reader is this build's own library, never the target's file
        assert os.path.dirname(reader) == str(Path(mallard.env["MALLARD_BUILD_DIR"]) / "lib"), t.readers
        assert reader_rc(w.pid, t.root, reader)[0] == 0
        rc, n, why = reader_call(w.pid, t.root + 8, reader)  # not the root: refused, nothing written, one reason
        assert (rc, n) == (errno.EPROTO, 0) and "bad magic" in why, why
        assert reader_rc(w.pid, 8, reader) == (errno.EFAULT, 0)
        assert reader_rc(0, t.root, reader) == (errno.EINVAL, 0)
        if os.geteuid() == 0 and shutil.which("setpriv"):
            # another user: the kernel refuses (the CLI says so before asking it: test_other_user_is_refused)
            shared = request.getfixturevalue("shared")
            assert reader_rc(w.pid, t.root, shared.lib, pre=as_user("nobody"), python=shared.python, env=shared.env,
                             cwd=shared.dir) == (errno.EPERM, 0)
    assert reader_rc(w.pid, t.root, reader) == (errno.ESRCH, 0)


@pytest.fixture(scope="module")
def fakeroot(tmp_path_factory):
    return build("live_fakeroot", tmp_path_factory.mktemp("fakeroot"), "-ldl")


@pytest.mark.parametrize("mode,reason", [
    ("same", None), ("shuffled", None),  # found by id: the order of the table and unknown ids do not matter
    ("offset", "field 35 (offset 1048576, 8 bytes) lies outside its record"),
    ("classes", "size-class table differs from the reader's"), ("missing", "field 21 is missing"),
    ("twice", "field 21 appears twice"), ("arenas", "field 6 has elements of 8 bytes and a count of 1073741824"),
    ("text", "options text is not terminated"), ("kind", "field 21 is of kind 2, not 1"),
    ("size", "field 21 has elements of 3 bytes"),
])
def test_reader_judges_the_field_table(mallard, allocators, fakeroot, mode, reason):
    # A copy of a real root with one thing changed: read by the table (any order, unknown ids skipped), or refused
    # with one line saying what is wrong and nothing written.
    import errno

    with Proc([fakeroot, mode], dict(mallard.env, LD_PRELOAD=lib(allocators, "mallard"))) as w:
        root = int(w.before[-1].split()[1])
        for reader in (lib(allocators, "mallard"), lib(allocators, "mallard-secure")):
            rc, n, why = reader_call(w.pid, root, reader)
            if reason is None:
                assert rc == 0 and n > 0 and why == "", (rc, n, why)
            else:
                assert (rc, n) == (errno.EPROTO, 0) and reason in why and "\n" not in why, (rc, n, why)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "libhostile.so"
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    r = subprocess.run([cc, "-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(out),
                        str(Path(__file__).resolve().parent / "progs" / "live_hostile.c")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return str(out)


@pytest.mark.parametrize("mode,reason", [
    ("garbage", "(bad magic)"), ("version", "root is of version 1; this reader reads version 3"),
    ("nfields", "field table has 4294967295 entries"), ("fieldsize", "entries of 1073741824 bytes"),
    ("pointer", "field table at 0x10 is not readable in the process"), ("header", "root header is 2147483647 bytes"),
    ("missing", "field 1 is of kind 0"),
])
def test_hostile_library_is_never_loaded(mallard, workload, hostile, tmp_path, mode, reason):
    # The target preloads a library that serves malloc and exports mallard_live_root and mallard_live_stats, whose
    # constructor and reader leave their PID in a marker file. The command must not load it (no line of its own PID,
    # no fake report): it reads the root with its own reader, and refuses it in one line.
    marker = tmp_path / "marker"
    env = dict(mallard.env, LD_PRELOAD=hostile, LIVE_HOSTILE_MARKER=str(marker), LIVE_HOSTILE_ROOT=mode)
    with Proc([workload, "hold", "10", "48", "1", "600000", "0", "0"], env) as w:
        for cmd in (["stats"], ["stats", "--json"], ["top", "--iterations", "1"]):
            r = mallard(*cmd, str(w.pid), env={"LIVE_HOSTILE_MARKER": str(marker)}, timeout=60)
            assert r.returncode == 1, r
            assert "FAKE" not in r.stdout + r.stderr, r
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and f"process {w.pid}: refused to read {hostile}" in lines[0], r.stderr
            assert reason in lines[0], lines[0]
    assert marker.read_text().splitlines() == [f"ctor {w.pid}"], marker.read_text()


def test_non_dumpable_process_of_the_same_user(mallard, allocators, workload, shared):
    # Same user, but the process made itself non-dumpable: its memory and maps are closed to the user; root may.
    nobody = as_user("nobody")
    env = dict(shared.env, LD_PRELOAD=shared.lib, LIVE_NODUMP="1")
    with Proc([shared.workload, *HOLD], env, pre=nobody, cwd=shared.dir) as w:
        r = subprocess.run([*nobody, *shared.argv(), "stats", str(w.pid)], env=shared.env, cwd=shared.dir,
                           capture_output=True, text=True, timeout=60)
        ok = mallard("stats", "--json", str(w.pid))
    assert r.returncode == 4 and "permission denied" in r.stderr, r.stderr
    assert ok.returncode == 0 and cls(json.loads(ok.stdout)["mallard"], S_SMALL)["curobjs"] >= N_SMALL, ok.stderr
