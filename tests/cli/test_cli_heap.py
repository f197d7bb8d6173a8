"""`mallard heap show|diff|flame` on synthetic pprof profiles (tests/cli/pprof_fixture.py) whose addresses point at
real functions of small C programs and of Debian's python3 and libc: ordering, totals, names, file:line, growth,
flame graph geometry, symbolisation of stripped files, bad files, and agreement with Go's pprof."""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import cc
import pytest
from pprof_fixture import Loaded, ProfileBuilder, symbols

MiB = 1 << 20
BASE = 0x555555554000  # where the kernel puts a PIE executable (no ASLR)
LIB_BASE = 0x7F1234560000
SRC = cc.PROGS / "heap_sites.c"


@pytest.fixture(scope="module")
def progs(tmp_path_factory):
    d = tmp_path_factory.mktemp("heapprogs")
    lib = cc.build("heap_lib", d, "-g", "-shared", "-fPIC")
    exe = cc.build("heap_sites", d, "-g", lib)
    return {"dir": d, "lib": lib, "exe": exe}


def function_lines(name: str, src: Path = SRC) -> range:
    """Lines of a function of the test program: from its definition to its MARK line + 3."""
    text = src.read_text().splitlines()
    start = next(i for i, t in enumerate(text, 1) if re.match(rf"^__attribute__.*\b{name}\(", t))
    mark = next(i for i, t in enumerate(text, 1) if f"MARK {name}" in t)
    return range(start, mark + 4)


def standard(progs, base: int = BASE, leak: int = 10 * MiB, hold: int = 50 * MiB, churn: int = 1 << 30,
             packed: bool = True) -> ProfileBuilder:
    """leak_site holds `leak` bytes in 1000 blocks, hold_site `hold` in 800, churn_site allocated `churn` and holds
    nothing, heap_lib_alloc (in the shared library) holds 4 KiB; each under run_all <- main."""
    b = ProfileBuilder(packed=packed)
    p = Loaded(b, progs["exe"], base)
    lib = Loaded(b, progs["lib"], LIB_BASE)
    run, main = p.loc("run_all", 30), p.loc("main", 20)
    b.heap_sample([p.loc("leak_site", 8), run, main], leak, 1000, leak, 1000)
    b.heap_sample([p.loc("hold_site", 8), run, main], hold, 800, hold, 800)
    b.heap_sample([p.loc("churn_site", 8), run, main], 0, 0, churn, 20000)
    b.heap_sample([lib.loc("heap_lib_alloc", 8), run, main], 4096, 1, 4096, 1)
    return b


def write(tmp_path: Path, b: ProfileBuilder, name: str = "p.pb.gz", plain: bool = False) -> str:
    path = tmp_path / name
    path.write_bytes(b.encode() if plain else b.gz())
    return str(path)


def show_json(mallard, path: str, *extra: str) -> dict:
    r = mallard("heap", "show", path, "--json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_show_orders_sites_by_live_bytes_with_names_and_lines(mallard, progs, tmp_path):
    path = write(tmp_path, standard(progs))
    rep = show_json(mallard, path)
    names = [s["function"] for s in rep["sites"]]
    assert names == ["hold_site", "leak_site", "heap_lib_alloc", "churn_site"]
    assert rep["totals"] == {"inuse_space": 60 * MiB + 4096, "inuse_objects": 1801,
                             "alloc_space": 60 * MiB + 4096 + (1 << 30), "alloc_objects": 21801}
    hold, leak, lib = rep["sites"][:3]
    assert (hold["inuse_space"], hold["inuse_objects"]) == (50 * MiB, 800)
    assert (leak["inuse_space"], leak["alloc_space"]) == (10 * MiB, 10 * MiB)
    for s in (hold, leak):  # file:line from the DWARF of the -g build, inside the function
        assert s["file"].endswith("heap_sites.c") and s["line"] in function_lines(s["function"]), s
        assert [f["function"] for f in s["stack"]] == [s["function"], "run_all", "main"]
    assert lib["file"].endswith("heap_lib.c") and lib["module"] == "heap_lib"  # a shared library's DWARF
    r = mallard("heap", "show", path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.index("hold_site heap_sites.c:") < r.stdout.index("leak_site heap_sites.c:")
    assert "run_all heap_sites.c:" in r.stdout and "live 60.0 MiB in 1,801 blocks" in r.stdout


def test_by_alloc_and_top(mallard, progs, tmp_path):
    path = write(tmp_path, standard(progs))
    rep = show_json(mallard, path, "--by", "alloc", "--top", "2")
    assert [s["function"] for s in rep["sites"]] == ["churn_site", "hold_site"]
    assert rep["sites"][0]["alloc_space"] == 1 << 30 and rep["sites"][0]["alloc_objects"] == 20000
    r = mallard("heap", "show", path, "--by", "alloc", "--top", "2")
    assert r.returncode == 0 and "bytes allocated (alloc_space)" in r.stdout
    assert "2 more sites" in r.stdout and "leak_site" not in r.stdout


def test_plain_and_unpacked_encodings_read_the_same(mallard, progs, tmp_path):
    a = show_json(mallard, write(tmp_path, standard(progs), "a.pb.gz"))
    b = show_json(mallard, write(tmp_path, standard(progs, packed=False), "b.pb", plain=True))
    assert a["sites"] == b["sites"] and a["totals"] == b["totals"]


def test_allocator_frames_are_not_the_site(mallard, progs, tmp_path):
    """Frames of libmallard (sampling, unwinding) and malloc itself sit at the leaf: the site is their caller."""
    b = ProfileBuilder()
    p = Loaded(b, progs["exe"], BASE)
    mallard_map = b.mapping(0x7F0000000000, 0x7F0000100000, 0, "/opt/x/libmallard.so.0", "")
    inner = b.location(0x7F0000001234, mallard_map, ["mld_prof_sample"])
    mal = b.location(0x7F0000002345, mallard_map, ["malloc"])
    b.heap_sample([inner, mal, p.loc("leak_site", 8), p.loc("main", 20)], 5 * MiB, 5, 5 * MiB, 5)
    rep = show_json(mallard, write(tmp_path, b))
    assert [s["function"] for s in rep["sites"]] == ["leak_site"]
    assert [f["function"] for f in rep["sites"][0]["stack"]] == ["leak_site", "main"]


def test_names_from_the_profile_when_the_file_is_gone(mallard, tmp_path):
    b = ProfileBuilder()
    m = b.mapping(0x400000, 0x500000, 0, "/nonexistent/server", "abcd")
    named = b.location(0x401000, m, ["handle_request"])
    unnamed = b.location(0x402345, m)
    b.heap_sample([named, unnamed], 3 * MiB, 3, 3 * MiB, 3)
    b.heap_sample([unnamed], MiB, 1, MiB, 1)
    r = mallard("heap", "show", write(tmp_path, b), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert [s["function"] for s in rep["sites"]] == ["handle_request", "server+0x2345"]
    assert "/nonexistent/server: file not found" in r.stderr


def test_build_id_mismatch_is_not_symbolised(mallard, progs, tmp_path):
    b = ProfileBuilder()
    p = Loaded(b, progs["exe"], BASE, build_id="0123456789abcdef")
    b.heap_sample([p.loc("leak_site", 8)], MiB, 1, MiB, 1)
    r = mallard("heap", "show", write(tmp_path, b), "--json")
    assert r.returncode == 0, r.stderr
    site = json.loads(r.stdout)["sites"][0]
    assert site["function"].startswith("heap_sites+0x") and site["file"] is None
    assert "build ID" in r.stderr and "differs" in r.stderr


@pytest.mark.parametrize("how", ["--strip-debug", "--strip-unneeded"])
def test_stripped_program_keeps_its_names(mallard, progs, tmp_path, how):
    """A stripped copy (no DWARF; with --strip-unneeded only .dynsym, as distributions ship programs linked with
    -rdynamic) is named through its symbol tables, without file:line."""
    exe = cc.build("heap_sites", tmp_path, "-g", "-rdynamic", progs["lib"])
    stripped = tmp_path / "heap_sites.stripped"
    subprocess.run(["strip", how, "-o", str(stripped), exe], check=True)
    assert ".debug_info" not in subprocess.run(["readelf", "-S", str(stripped)], capture_output=True,
                                               text=True).stdout
    b = ProfileBuilder()
    p = Loaded(b, str(stripped), BASE, dynamic_symbols=how == "--strip-unneeded")
    b.heap_sample([p.loc("hold_site", 8), p.loc("run_all", 30), p.loc("main", 20)], 2 * MiB, 2, 2 * MiB, 2)
    b.heap_sample([p.loc("leak_site", 8), p.loc("run_all", 30), p.loc("main", 20)], MiB, 1, MiB, 1)
    path = write(tmp_path, b)
    for env in ({}, {"PATH": "/nonexistent"}):  # with binutils' addr2line, and with pyelftools' tables only
        rep = show_json(mallard, path) if not env else json.loads(
            mallard("heap", "show", path, "--json", env=env).stdout)
        assert [s["function"] for s in rep["sites"]] == ["hold_site", "leak_site"], env
        assert [f["function"] for f in rep["sites"][0]["stack"]] == ["hold_site", "run_all", "main"]
        assert all(s["file"] is None for s in rep["sites"])


def test_fully_stripped_program_shows_module_offsets(mallard, progs, tmp_path):
    stripped = tmp_path / "heap_sites.bare"
    subprocess.run(["strip", "--strip-all", "-o", str(stripped), progs["exe"]], check=True)
    syms = symbols(progs["exe"])
    b = ProfileBuilder()
    p = Loaded(b, str(stripped), BASE)
    p.syms = syms  # the addresses of the unstripped twin: the code is the same
    b.heap_sample([p.loc("leak_site", 8)], MiB, 1, MiB, 1)
    rep = show_json(mallard, write(tmp_path, b))
    assert rep["sites"][0]["function"] == f"heap_sites.bare+0x{syms['leak_site'] + 8:x}"


def distro_python() -> str:
    py = os.path.realpath("/usr/bin/python3")  # the distribution's (python3 on PATH may be a pyenv shim script)
    if not os.path.isfile(py):
        pytest.skip("no /usr/bin/python3 (Debian's python3 package) on this machine")
    if "PyObject_Malloc" not in symbols(py, dynamic=True):
        pytest.skip(f"{py} exports no PyObject_Malloc (not a Debian-style python3 binary)")
    return py


def libc_path() -> str:
    out = subprocess.run(["ldd", sys.executable], capture_output=True, text=True).stdout
    m = re.search(r"libc\.so\.6 => (\S+)", out)
    assert m, out
    return m.group(1)


@pytest.mark.parametrize("use_path", [True, False], ids=["addr2line", "pyelftools-only"])
def test_distribution_python_and_libc_are_named(mallard, tmp_path, use_path):
    """Debian's python3 (stripped, non-PIE or PIE, symbols kept in .dynsym) and libc.so.6: no '??', no offsets."""
    py, libc = distro_python(), libc_path()
    b = ProfileBuilder()
    pm = Loaded(b, py, 0x560000000000, dynamic_symbols=True)
    lc = Loaded(b, libc, 0x7F5500000000, dynamic_symbols=True)
    want = ["PyObject_Malloc", "PyMem_Malloc", "PyUnicode_New"]
    for i, name in enumerate(want):
        b.heap_sample([pm.loc(name, 5), pm.loc("Py_RunMain", 9)], (3 - i) * MiB, 1, (3 - i) * MiB, 1)
    b.heap_sample([lc.loc("strdup", 7), pm.loc("Py_BytesMain", 3)], 4096, 1, 4096, 1)
    r = mallard("heap", "show", write(tmp_path, b), "--json", env=None if use_path else {"PATH": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert [s["function"] for s in rep["sites"]] == want + ["strdup"]
    assert rep["sites"][0]["stack"][1]["function"] == "Py_RunMain"
    assert rep["sites"][3]["module"] == "libc.so.6" and rep["sites"][3]["stack"][1]["function"] == "Py_BytesMain"
    assert "??" not in r.stdout


def test_diff_lists_growth_first_across_load_addresses(mallard, progs, tmp_path):
    old = write(tmp_path, standard(progs, leak=4 * MiB, hold=50 * MiB, churn=1 << 20), "old.pb.gz")
    new = write(tmp_path, standard(progs, base=BASE + 0x7000000, leak=10 * MiB, hold=50 * MiB, churn=2 << 20),
                "new.pb.gz")
    r = mallard("heap", "diff", old, new, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert [g["function"] for g in rep["growth"]] == ["leak_site"]  # hold_site did not grow; churn holds nothing
    assert rep["growth"][0]["delta"] == 6 * MiB and rep["growth"][0]["old"] == 4 * MiB
    assert rep["new_total"] - rep["old_total"] == 6 * MiB
    rep = json.loads(mallard("heap", "diff", old, new, "--json", "--by", "alloc").stdout)
    assert [g["function"] for g in rep["growth"]] == ["leak_site", "churn_site"]
    r = mallard("heap", "diff", old, new)
    assert r.returncode == 0 and "Leak candidates" in r.stdout and "+6.0 MiB" in r.stdout
    r = mallard("heap", "diff", new, old)
    assert r.returncode == 0 and "No site grew" in r.stdout


def test_flame_graph_is_valid_svg_with_proportional_frames(mallard, progs, tmp_path):
    path = write(tmp_path, standard(progs))
    svg = tmp_path / "f.svg"
    r = mallard("heap", "flame", path, "-o", str(svg))
    assert r.returncode == 0, r.stderr
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.parse(svg).getroot()
    frames = {}
    for g in root.iter("{http://www.w3.org/2000/svg}g"):
        title = g.find("s:title", ns).text
        rect = g.find("s:rect", ns)
        frames[title.split(" ")[0].rstrip(":")] = (float(rect.get("width")), float(rect.get("y")), title)
    total = 60 * MiB + 4096
    span = frames["all"][0]
    assert span > 1000
    for name, v in (("hold_site", 50 * MiB), ("leak_site", 10 * MiB), ("run_all", total), ("main", total)):
        assert frames[name][0] == pytest.approx(span * v / total, rel=1e-3), name
    assert "churn_site" not in frames  # it holds no live bytes
    assert frames["main"][1] > frames["run_all"][1] > frames["hold_site"][1]  # callers below their callees
    assert "50.0 MiB" in frames["hold_site"][2] and "heap_sites.c:" in frames["hold_site"][2]
    r = mallard("heap", "flame", path, "-o", str(svg), "--by", "alloc")
    assert r.returncode == 0, r.stderr
    titles = [t.text for t in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("churn_site") and "1.0 GiB" in t for t in titles)


def test_flame_escapes_names(mallard, tmp_path):
    b = ProfileBuilder()
    loc = b.location(0x1000, 0, ["operator<< <std::vector<int, A&B>>"])
    b.heap_sample([loc], MiB, 1, MiB, 1)
    svg = tmp_path / "e.svg"
    assert mallard("heap", "flame", write(tmp_path, b), "-o", str(svg)).returncode == 0
    titles = [t.text for t in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("operator<< <std::vector<int, A&B>>") for t in titles)


@pytest.mark.parametrize("kind", ["random", "truncated", "text", "empty", "cpu", "missing", "dir", "dangling"])
def test_bad_files_are_one_line_errors(mallard, progs, tmp_path, kind):
    path = tmp_path / "bad.pb.gz"
    good = standard(progs).gz()
    expect = {"random": "malformed", "truncated": "truncated gzip", "text": "not a pprof profile", "empty": "empty",
              "cpu": "no 'inuse_space' values", "missing": "no such file", "dir": "directory",
              "dangling": "location 99"}[kind]
    if kind == "random":
        path.write_bytes(bytes([0x0A, 0xFF, 0xFF, 0x03, 0x01]))
    elif kind == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif kind == "text":
        path.write_text("\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "cpu":
        b = ProfileBuilder(types=[("samples", "count"), ("cpu", "nanoseconds")])
        b.sample([b.location(0x1000, 0, ["f"])], [1, 10_000_000])
        path.write_bytes(b.gz())
    elif kind == "dir":
        path = tmp_path
    elif kind == "dangling":
        b = ProfileBuilder()
        b.heap_sample([99], 1, 1, 1, 1)
        path.write_bytes(b.gz())
    for args in (["show", str(path)], ["flame", str(path), "-o", str(tmp_path / "x.svg")],
                 ["diff", str(path), str(path)]):
        r = mallard("heap", *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("mallard: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert expect in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_usage_errors(mallard, progs, tmp_path):
    path = write(tmp_path, standard(progs))
    for args in (["heap"], ["heap", "show", path, "--", "true"], ["heap", "show", path, "--top", "0"],
                 ["heap", "show", path, "--by", "peak"], ["heap", "flame", path], ["heap", "show"]):
        r = mallard(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.startswith("mallard: "), r.stderr


def go_tool() -> str:
    for cand in (shutil.which("go"), "/usr/lib/go/bin/go", "/usr/local/go/bin/go"):
        if cand and os.access(cand, os.X_OK):
            return cand
    pytest.skip("Go's toolchain (go tool pprof) is not installed: the cross-check with pprof's own reader needs "
                "it (Debian: apt-get install golang-go; .ci/run installs it)")


def pprof_top(path: str, index: str, tmp_path: Path) -> tuple[int, dict[str, int]]:
    env = dict(os.environ, HOME=os.environ.get("HOME") or str(tmp_path), PPROF_TMPDIR=str(tmp_path))
    r = subprocess.run([go_tool(), "tool", "pprof", "-top", "-unit=B", "-nodefraction=0", f"-sample_index={index}",
                        path], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    total = int(re.search(r"of (\d+)B total", r.stdout).group(1))
    flat = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^\s*(\d+)B?\s+[\d.]+%\s+[\d.]+%\s+\d+B?\s+[\d.]+%\s+(\S+)", line)
        if m:
            flat[m.group(2)] = int(m.group(1))
    return total, flat


@pytest.mark.parametrize("by,index", [("inuse", "inuse_space"), ("alloc", "alloc_space")])
def test_go_pprof_agrees_on_totals_and_sites(mallard, progs, tmp_path, by, index):
    path = write(tmp_path, standard(progs))
    total, flat = pprof_top(path, index, tmp_path)
    rep = show_json(mallard, path, "--by", by)
    assert total == rep["totals"][index]
    mine = {s["function"]: s[index] for s in rep["sites"] if s[index]}
    assert mine and {k: flat.get(k) for k in mine} == mine


def test_recursion_is_shown_once_with_its_count(mallard, progs, tmp_path):
    b = ProfileBuilder()
    p = Loaded(b, progs["exe"], BASE)
    run = p.loc("run_all", 30)
    b.heap_sample([p.loc("leak_site", 8)] + [run] * 5 + [p.loc("main", 20)], MiB, 1, MiB, 1)
    r = mallard("heap", "show", write(tmp_path, b))
    assert r.returncode == 0, r.stderr
    assert re.search(r"run_all heap_sites\.c:\d+ \(×5\) ← main", r.stdout), r.stdout


def test_static_function_of_a_stripped_program_gets_no_neighbours_name(mallard, progs, tmp_path):
    """static_site has no dynamic symbol: in a stripped copy its address is shown as an offset, never as the name
    of the exported function before it (binutils' addr2line alone would say so)."""
    exe = cc.build("heap_sites", tmp_path, "-g", "-rdynamic", progs["lib"])
    stripped = tmp_path / "hs.stripped"
    subprocess.run(["strip", "--strip-unneeded", "-o", str(stripped), exe], check=True)
    full = symbols(exe)
    assert "static_site" not in symbols(str(stripped), dynamic=True)
    b = ProfileBuilder()
    p = Loaded(b, str(stripped), BASE, dynamic_symbols=True)
    p.syms = full
    b.heap_sample([p.loc("static_site", 8), p.loc("run_all", 30)], MiB, 1, MiB, 1)
    rep = show_json(mallard, write(tmp_path, b))
    site = rep["sites"][0]
    assert site["function"] == f"hs.stripped+0x{full['static_site'] + 8:x}", site
    assert site["stack"][1]["function"] == "run_all"
    # The same address in the unstripped program is named, with its line.
    b = ProfileBuilder()
    p = Loaded(b, exe, BASE)
    b.heap_sample([p.loc("static_site", 8)], MiB, 1, MiB, 1)
    site = show_json(mallard, write(tmp_path, b, "full.pb.gz"))["sites"][0]
    assert site["function"] == "static_site" and site["line"] in function_lines("static_site")
