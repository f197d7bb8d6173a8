"""musl programs (docs/CLI.md, "musl programs"): `which` and `list` name musl's malloc; `run`, `bench` and `profile`
preload only musl builds of Mallard and of the tracer, and refuse (one line, non-zero) what cannot serve a musl
program: glibc-built libraries, a missing musl build, any preload into a static musl program."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from cc import build
from conftest import BUILD

MUSL_GCC = shutil.which("musl-gcc")
pytestmark = pytest.mark.skipif(MUSL_GCC is None, reason="musl-gcc is not installed (Debian package musl-tools), so "
                                                         "no musl program can be built for these tests")


def one_line(r) -> str:
    """The error of a refusal: exactly one line on stderr, nothing on stdout (the program never ran)."""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mallard: "), r.stderr
    assert r.stdout == "", r.stdout
    return lines[0]


@pytest.fixture(scope="module")
def musl_libs():
    """Mallard's musl builds as the command finds them (beside the tests' build: <build>-musl/lib)."""
    from mallard_cli import libc as lc

    old = os.environ.get("MALLARD_BUILD_DIR")
    os.environ["MALLARD_BUILD_DIR"] = str(BUILD)
    try:
        found = dict(lc.musl_mallard_variants())
        tracer = lc.musl_tracer_path()
    finally:
        if old is None:
            del os.environ["MALLARD_BUILD_DIR"]
        else:
            os.environ["MALLARD_BUILD_DIR"] = old
    assert "mallard" in found and "mallard-secure" in found and tracer is not None, (
        f"no musl build of Mallard beside {BUILD} (looked for {BUILD}-musl/lib): build it with "
        "`bash scripts/test-musl.sh` (MALLARD_MUSL_BUILD_DIR or MALLARD_MUSL_LIBDIR may point elsewhere)")
    found["tracer"] = str(tracer)
    return found


@pytest.fixture(scope="module")
def progs(tmp_path_factory, musl_libs):
    """The probe built as a dynamic musl program, a static one, a static one with libmallard.a linked in (and a
    stripped copy), a static one with an allocator of its own, and a glibc one."""
    d = tmp_path_factory.mktemp("musl")
    static_lib = os.path.join(os.path.dirname(musl_libs["mallard"]), "libmallard.a")
    p = {
        "dyn": build("musl_probe", d, compiler=MUSL_GCC, out="dyn"),
        "static": build("musl_probe", d, "-static", compiler=MUSL_GCC, out="static"),
        "linked": build("musl_probe", d, "-static", static_lib, compiler=MUSL_GCC, out="linked"),
        "own": build("musl_probe", d, "-static", "-DOWN_MALLOC", compiler=MUSL_GCC, out="own"),
        "glibc": build("musl_probe", d, "-ldl", out="glibc"),
    }
    p["stripped"] = str(d / "stripped")
    shutil.copy(p["linked"], p["stripped"])
    subprocess.run(["strip", p["stripped"]], check=True)
    script = d / "script"
    script.write_text(f"#!/usr/bin/env {os.path.basename(p['dyn'])}\n")
    script.chmod(0o755)
    p["script"] = str(script)
    p["dir"] = str(d)
    return p


def probe_line(r) -> str:
    """The probe's line: 'ready preload=... mallard=0|1'."""
    return next(x for x in r.stdout.splitlines() if x.startswith("ready"))


# ------------------------------------------------------------------ telling musl programs apart


def test_examine_tells_musl_from_glibc(progs):
    from mallard_cli import libc as lc

    d = lc.examine(progs["dyn"])
    assert (d.libc, d.static) == ("musl", False) and "ld-musl" in d.interp, d
    s = lc.examine(progs["static"])
    assert (s.libc, s.static, s.linked) == ("musl", True, "musl"), s
    for name in ("linked", "stripped"):
        m = lc.examine(progs[name])
        assert (m.libc, m.static, m.linked) == ("musl", True, "mallard"), m
    o = lc.examine(progs["own"])
    assert (o.libc, o.static, o.linked) == ("musl", True, None), o
    g = lc.examine(progs["glibc"])
    assert (g.libc, g.static) == ("glibc", False), g
    # A #! script is the program it runs (through /usr/bin/env and $PATH too).
    old = os.environ["PATH"]
    os.environ["PATH"] = progs["dir"] + os.pathsep + old
    try:
        assert lc.examine(progs["script"]).libc == "musl"
    finally:
        os.environ["PATH"] = old


def test_libraries_are_told_apart(musl_libs, allocators):
    from mallard_cli import libc as lc

    glibc_mallard = next(a.path for a in allocators if a.name == "mallard")
    assert lc.library_libc(glibc_mallard) == "glibc"
    assert lc.library_libc(musl_libs["mallard"]) == "musl"
    assert lc.library_libc(musl_libs["tracer"]) == "musl"


def test_static_glibc_program_is_not_taken_for_musl(tmp_path):
    try:
        exe = build("musl_probe", tmp_path, "-static", out="gstatic")
    except AssertionError as e:
        pytest.skip(f"no static glibc (libc.a) to link with: {e}")
    from mallard_cli import libc as lc

    p = lc.examine(exe)
    assert (p.libc, p.static) == ("glibc", True), p


# ------------------------------------------------------------------ which and list


def start(argv, env=None):
    p = subprocess.Popen([*argv, "30"], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().startswith("ready")
    return p


def which(mallard, pid):
    r = mallard("which", "--json", str(pid))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), " ".join(mallard("which", str(pid)).stdout.split())


@pytest.mark.parametrize("kind,allocator", [("dyn", "musl"), ("static", "musl"), ("linked", "mallard"),
                                            ("stripped", "mallard"), ("own", None)])
def test_which_of_a_running_musl_process(mallard, progs, kind, allocator):
    p = start([progs[kind]])
    try:
        w, text = which(mallard, p.pid)
    finally:
        p.kill()
        p.wait()
    assert w["allocator"] == allocator and w["libc"] == "musl", w
    if kind == "dyn":
        assert w["method"] == "got" and "mallocng" in w["reason"], w
        assert text.startswith(f"PID {p.pid} ({progs[kind]}): musl"), text
    elif allocator == "musl":
        assert w["method"] == "executable" and "musl's malloc (mallocng) is linked in" in w["reason"], w
    elif allocator == "mallard":  # by its symbols, or (stripped) by its strings
        assert "Mallard (libmallard.a) is linked in" in w["reason"], w
        assert ("it defines mallard_" if kind == "linked" else "Mallard's strings") in w["reason"], w
    else:
        assert "cannot tell" in text and "another allocator is linked in" in text, text


def test_which_of_a_musl_process_with_mallard_preloaded(mallard, progs, musl_libs):
    p = start([progs["dyn"]], env=dict(os.environ, LD_PRELOAD=musl_libs["mallard"]))
    try:
        w, text = which(mallard, p.pid)
    finally:
        p.kill()
        p.wait()
    assert w["allocator"] == "mallard" and w["libc"] == "musl" and "preloaded" in w["reason"], w


def test_which_of_a_program_file(mallard, progs, musl_libs):
    """`mallard which -- PROG`, the guides' `ldd /bin/busybox` check."""
    r = mallard("which", "--json", "--", progs["dyn"])
    assert r.returncode == 0, r.stderr
    w = json.loads(r.stdout)
    assert (w["allocator"], w["libc"], w["method"]) == ("musl", "musl", "loader-list"), w
    assert "mallocng" in w["reason"] and os.path.realpath(musl_libs["mallard"]) in \
        os.path.realpath(w["mallard"].split()[-1]), w
    for kind, name in (("static", "musl"), ("linked", "mallard"), ("own", None)):
        w = json.loads(mallard("which", "--json", "--", progs[kind]).stdout)
        assert (w["allocator"], w["libc"], w["static"]) == (name, "musl", True), w
        assert "LD_PRELOAD cannot reach" in w["mallard"] or name == "mallard", w
    g = json.loads(mallard("which", "--json", "--", progs["glibc"]).stdout)
    assert (g["allocator"], g["libc"], g["mallard"]) == ("glibc", "glibc", None), g
    text = " ".join(mallard("which", "--", progs["dyn"]).stdout.split())
    assert text.startswith(f"{progs['dyn']} (musl program): musl"), text


def test_which_of_a_program_file_sees_the_preload(progs, musl_libs, allocators):
    from mallard_cli import procinfo as pi

    # In-process: this test's own Python is a glibc program, which a musl library in LD_PRELOAD would stop.
    w = pi.which_program(progs["dyn"], env=dict(os.environ, LD_PRELOAD=musl_libs["mallard"]))
    assert w.allocator == "mallard" and "preloaded" in w.reason, w
    # A glibc-built Mallard in LD_PRELOAD (a global preload meant for glibc programs): musl's loader refuses it.
    glibc_mallard = next(a.path for a in allocators if a.name == "mallard")
    w = pi.which_program(progs["dyn"], env=dict(os.environ, LD_PRELOAD=glibc_mallard))
    assert w.allocator is None and "the loader cannot start it" in w.reason, w


def test_list_names_the_allocators_of_musl_programs(mallard, musl_libs, allocators):
    r = mallard("list", "--json")
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)["musl"]
    names = [a["name"] for a in m["allocators"]]
    assert names[:3] == ["musl", "mallard", "mallard-secure"], names
    assert m["allocators"][0]["path"] is None and m["allocators"][0]["version"][0].isdigit(), m
    assert os.path.realpath(m["allocators"][1]["path"]) == os.path.realpath(musl_libs["mallard"])
    assert os.path.realpath(m["tracer"]) == os.path.realpath(musl_libs["tracer"])
    glibc_peers = {a.name for a in allocators if a.path and not a.name.startswith("mallard")}
    assert {a["name"] for a in m["left_out"]} == glibc_peers - set(names), m
    text = " ".join(mallard("list").stdout.split())
    assert "For musl programs" in text and "built into musl's libc: mallocng" in text, text


def test_list_says_how_to_build_the_musl_build(mallard, tmp_path):
    r = mallard("list", env={"MALLARD_MUSL_LIBDIR": str(tmp_path)})
    text = " ".join(r.stdout.split())
    assert r.returncode == 0 and "mallard for musl: not found" in text and "scripts/test-musl.sh" in text, text


# ------------------------------------------------------------------ run


def test_run_preloads_the_musl_build(mallard, progs, musl_libs):
    for args, lib in (([], "mallard"), (["-a", "mallard"], "mallard"), (["-a", "mallard-secure"], "mallard-secure")):
        r = mallard("run", *args, "--", progs["dyn"])
        assert r.returncode == 0, r.stderr
        line = probe_line(r)
        assert line == f"ready preload={musl_libs[lib]} mallard=1", (args, line)
    r = mallard("run", "-a", "musl", "--", progs["dyn"])
    assert r.returncode == 0 and probe_line(r) == "ready preload= mallard=0", r.stdout
    r = mallard("run", "-a", musl_libs["mallard"], "--", progs["dyn"])
    assert r.returncode == 0 and probe_line(r).endswith("mallard=1"), r.stdout + r.stderr


def test_run_refuses_what_cannot_serve_a_musl_program(mallard, progs, allocators, tmp_path):
    glibc_mallard = next(a.path for a in allocators if a.name == "mallard")
    cases = [(["-a", "glibc"], 3, "glibc's malloc cannot serve"),
             (["-a", glibc_mallard], 3, "built for glibc"),
             (["-a", "no-such"], 3, "unknown allocator")]
    peers = [a for a in allocators if a.name in ("jemalloc", "mimalloc", "tcmalloc")]
    cases += [(["-a", a.name], 3, f"{a.name} here ({a.path}) is built for glibc") for a in peers]
    for args, code, words in cases:
        r = mallard("run", *args, "--", progs["dyn"])
        assert r.returncode == code and words in one_line(r), (args, r.stderr)
    # No musl build: one line that says how to build one, whether -a names Mallard or not.
    for args in ([], ["-a", "mallard"], ["-a", "mallard-secure"]):
        r = mallard("run", *args, "--", progs["dyn"], env={"MALLARD_MUSL_LIBDIR": str(tmp_path)})
        line = one_line(r)
        assert r.returncode == 6 and "is a musl program" in line and "scripts/test-musl.sh" in line, (args, line)


def test_run_refuses_to_preload_into_a_static_musl_program(mallard, progs):
    for kind, args in (("static", []), ("static", ["-a", "mallard"]), ("static", ["-a", "mallard-secure"]),
                       ("linked", ["-a", "mallard-secure"]), ("linked", ["-a", "musl"])):
        r = mallard("run", *args, "--", progs[kind])
        line = one_line(r)
        assert r.returncode == 3 and "static musl program" in line and "LD_PRELOAD cannot" in line, (kind, args, line)
    assert "libmallard.a" in one_line(mallard("run", "--", progs["static"]))
    # Each with the allocator it has linked in: nothing to preload (a static dlsym finds nothing: mallard=0).
    for kind, args in (("static", ["-a", "musl"]), ("linked", []), ("linked", ["-a", "mallard"])):
        r = mallard("run", *args, "--", progs[kind])
        assert r.returncode == 0 and probe_line(r) == "ready preload= mallard=0", (kind, args, r.stderr)


def test_glibc_programs_get_no_musl_library(mallard, progs, musl_libs):
    r = mallard("run", "-a", "musl", "--", progs["glibc"])
    assert r.returncode == 3 and "serves musl programs only" in one_line(r)
    r = mallard("run", "-a", musl_libs["mallard"], "--", progs["glibc"])
    assert r.returncode == 3 and "built for musl" in one_line(r)
    r = mallard("run", "--", progs["glibc"])  # unchanged: the glibc build
    assert r.returncode == 0 and "libmallard" in probe_line(r) and "-musl" not in probe_line(r), r.stdout


# ------------------------------------------------------------------ bench


def test_bench_compares_musl_with_mallard(mallard, progs, musl_libs, allocators, tmp_path):
    out = tmp_path / "b.json"
    r = mallard("bench", "-n", "1", "--warmup", "0", "--json", str(out), "--metric-from-output", r"mallard=(\d)",
                "--", progs["dyn"])
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    got = {a["name"]: a for a in data["allocators"]}
    assert list(got) == ["musl", "mallard", "mallard-secure"] and data["libc"] == "musl", list(got)
    assert got["musl"]["path"] is None and got["musl"]["metrics"] == [0.0], got["musl"]
    for name in ("mallard", "mallard-secure"):  # the musl build really served malloc
        assert got[name]["path"] == musl_libs[name] and got[name]["metrics"] == [1.0], got[name]
    text = r.stdout
    assert "Ratios are to musl" in text and "musl's own malloc (mallocng) is the baseline" in text, text
    guide = text.split("As in the distribution guides' table", 1)[1].splitlines()
    header = guide[1].split()
    assert header[:2] == ["musl", "glibc"] and guide[3].split()[0] == "musl" and guide[3].split()[2] == "-", guide
    peers = [a.name for a in allocators if a.path and not a.name.startswith("mallard")]
    if peers:
        left = next(x for x in text.splitlines() if x.startswith("Left out:"))
        assert all(p in left for p in peers) and "built for glibc" in left, left
        assert all(p in header for p in peers), header


def test_bench_refusals_for_musl_programs(mallard, progs, tmp_path):
    r = mallard("bench", "-n", "1", "--", progs["static"])
    line = one_line(r)
    assert r.returncode == 3 and "static musl program" in line and "nothing to compare" in line, line
    r = mallard("bench", "-n", "1", "--", progs["dyn"], env={"MALLARD_MUSL_LIBDIR": str(tmp_path)})
    assert r.returncode == 6 and "scripts/test-musl.sh" in one_line(r)
    r = mallard("bench", "-n", "1", "-a", "musl,glibc", "--", progs["dyn"])
    assert r.returncode == 3 and "glibc's malloc cannot serve" in one_line(r)


# ------------------------------------------------------------------ profile


def test_profile_uses_the_musl_tracer(mallard, progs, tmp_path):
    for args in ([], ["-a", "mallard"]):
        out = tmp_path / "p.json"
        r = mallard("profile", *args, "-o", str(out), "--", progs["dyn"])
        assert r.returncode == 0, r.stderr
        rep = json.loads(out.read_text())
        assert rep["summary"]["calls"]["malloc"] >= 1 and rep["summary"]["calls"]["free"] >= 1, rep["summary"]
        assert ("mallard=1" in r.stdout) == (args != []), r.stdout
    r = mallard("profile", "--overhead", "-n", "1", "--", progs["dyn"])
    assert r.returncode == 0 and "Tracer overhead" in r.stdout, r.stderr


def test_profile_refusals_for_musl_programs(mallard, progs, musl_libs, tmp_path):
    r = mallard("profile", "--", progs["static"])
    line = one_line(r)
    assert r.returncode == 1 and "the tracer cannot be preloaded" in line and "static musl program" in line, line
    # A folder with Mallard's musl build but no tracer: the tracer's musl build is what is missing.
    only = tmp_path / "lib"
    only.mkdir()
    os.symlink(musl_libs["mallard"], only / "libmallard.so")
    for args in ([], ["--overhead"]):
        r = mallard("profile", *args, "--", progs["dyn"], env={"MALLARD_MUSL_LIBDIR": str(only)})
        line = one_line(r)
        assert r.returncode == 6 and "libmallard-tracer.so" in line and "scripts/test-musl.sh" in line, line



# ------------------------------------------------------------------ vmem and heap


def test_vmem_and_heap_of_musl_programs(mallard, progs, tmp_path):
    r = mallard("vmem", "--ready", "^ready", "--", progs["dyn"], "30")  # default: the program's own malloc
    assert r.returncode == 0 and "allocator: musl)" in " ".join(r.stdout.split()), r.stdout + r.stderr
    r = mallard("vmem", "-a", "mallard", "--ready", "^ready", "--", progs["dyn"], "30")
    assert r.returncode == 0 and "allocator: mallard)" in " ".join(r.stdout.split()), r.stdout + r.stderr
    # heap: Mallard's musl build preloaded, or the Mallard linked into a static program; none for mallocng's.
    for kind in ("dyn", "linked"):
        out = tmp_path / f"{kind}.pb.gz"
        r = mallard("heap", "-o", str(out), "--", progs[kind])
        assert r.returncode == 0 and out.is_file(), (kind, r.stderr)
    r = mallard("heap", "--", progs["static"])
    assert r.returncode == 3 and "static musl program" in one_line(r)


def test_inspecting_a_program_never_runs_its_own_interpreter(mallard, tmp_path):
    """`which -- PROG` runs only a loader installed in a system folder: a program's PT_INTERP may be anything."""
    fake = tmp_path / "ld-musl-x86_64.so.1"
    marker = tmp_path / "ran"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    exe = build("musl_probe", tmp_path, f"-Wl,--dynamic-linker={fake}", compiler=MUSL_GCC, out="odd")
    w = json.loads(mallard("which", "--json", "--", exe).stdout)
    assert w["libc"] == "musl" and w["method"] == "loader-list", w  # listed by the system's musl loader instead
    assert not marker.exists(), "the program's own interpreter was run"
