"""scripts/check_layers.py: the real tree passes, and a planted upward include or call fails (issue 37)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "scripts" / "check_layers.py"
BUILD = Path(os.environ.get("MALLARD_BUILD_DIR", str(REPO / "build")))


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=120)


def objects(build: Path) -> list[str]:
    dirs = [build / "src" / "CMakeFiles" / f"{t}.dir" for t in ("mallard", "mallard-secure", "mallard-prefix")]
    for d in dirs:
        assert d.is_dir(), f"{d} is not built: build the library into {build}"
    return [a for d in dirs for a in ("--objects", str(d))]


def test_the_tree_keeps_its_layers():
    r = run(*objects(BUILD))
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 problem(s)" in r.stdout


def _tree(tmp_path: Path, low_src: str) -> tuple[Path, Path]:
    """A two-layer tree (low/ below high/) and its objects, compiled as CMake lays them out."""
    src = tmp_path / "src"
    (src / "low").mkdir(parents=True)
    (src / "high").mkdir()
    (src / "LAYERS").write_text("# test\nlow: low/\nhigh: high/\n")
    (src / "low" / "low.h").write_text("int low_fn(void);\n")
    (src / "high" / "high.h").write_text("int high_fn(void);\n")
    (src / "low" / "a.c").write_text(low_src)
    (src / "high" / "b.c").write_text('#include "low/low.h"\nint high_fn(void) { return low_fn() + 1; }\n')
    objdir = tmp_path / "obj"
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler"
    for rel in ("low/a.c", "high/b.c"):
        (objdir / rel).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([cc, "-c", "-I", str(src), str(src / rel), "-o", str(objdir / (rel + ".o"))], check=True)
    return src, objdir


def test_a_clean_tree_passes(tmp_path):
    src, objdir = _tree(tmp_path, '#include "low/low.h"\nint low_fn(void) { return 1; }\n')
    r = run("--src", str(src), "--layers", str(src / "LAYERS"), "--objects", str(objdir))
    assert r.returncode == 0, r.stdout


def test_a_planted_upward_call_fails(tmp_path):
    """The lower layer calls the higher one's function, declared by hand (no include): only the objects show it."""
    src, objdir = _tree(tmp_path, "int high_fn(void);\nint low_fn(void) { return 1; }\nint g(void) { return high_fn(); }\n")
    r = run("--src", str(src), "--layers", str(src / "LAYERS"), "--objects", str(objdir))
    assert r.returncode == 1, r.stdout
    assert "src/low/a.c: uses high_fn, defined in src/high/b.c (high), from the low layer" in r.stdout


def test_a_planted_upward_include_fails(tmp_path):
    src, objdir = _tree(tmp_path, '#include "high/high.h"\nint low_fn(void) { return 1; }\n')
    r = run("--src", str(src), "--layers", str(src / "LAYERS"), "--objects", str(objdir))
    assert r.returncode == 1, r.stdout
    assert "src/low/a.c:1: includes high/high.h (high) from the low layer" in r.stdout


def test_a_file_in_no_layer_fails(tmp_path):
    src, objdir = _tree(tmp_path, '#include "low/low.h"\nint low_fn(void) { return 1; }\n')
    (src / "stray.c").write_text("int stray;\n")
    r = run("--src", str(src), "--layers", str(src / "LAYERS"))
    assert r.returncode == 1 and "src/stray.c: in no layer" in r.stdout, r.stdout


@pytest.mark.parametrize("bad", ["nocolon", "x:"])
def test_a_malformed_layers_file_is_one_line(tmp_path, bad):
    (tmp_path / "LAYERS").write_text(bad + "\n")
    r = run("--src", str(tmp_path), "--layers", str(tmp_path / "LAYERS"))
    assert r.returncode != 0 and "expected 'LAYER: PATTERN...'" in r.stderr, r


def test_an_os_call_outside_its_layer_fails(tmp_path):
    """`@low: mmap` keeps mmap to the low layer: the high layer calling it fails, the low layer calling it passes."""
    src, objdir = _tree(tmp_path, '#include <sys/mman.h>\n#include "low/low.h"\n'
                                   'int low_fn(void) { return mmap(0, 4096, 3, 0x22, -1, 0) != 0; }\n')
    (src / "LAYERS").write_text("low: low/\nhigh: high/\n@low: mmap\n")
    r = run("--src", str(src), "--layers", str(src / "LAYERS"), "--objects", str(objdir))
    assert r.returncode == 0, r.stdout
    (src / "high" / "b.c").write_text('#include <sys/mman.h>\n#include "low/low.h"\n'
                                      'int high_fn(void) { return mmap(0, 4096, 3, 0x22, -1, 0) != 0; }\n')
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-c", "-I", str(src), str(src / "high/b.c"), "-o", str(objdir / "high/b.c.o")], check=True)
    r = run("--src", str(src), "--layers", str(src / "LAYERS"), "--objects", str(objdir))
    assert r.returncode == 1 and "src/high/b.c: calls mmap, which only the low layer may call" in r.stdout, r.stdout


WALK = REPO / "scripts" / "walk_free.sh"


@pytest.mark.skipif(shutil.which("addr2line") is None or shutil.which("gcc") is None, reason="needs gcc and addr2line")
def test_the_walk_of_a_remote_free_only_goes_down(tmp_path):
    """scripts/walk_free.sh traces the functions a free of another thread's block enters (owner alive, exited, and
    the slow paths after): every call goes to the caller's layer or one below."""
    r = subprocess.run(["bash", str(WALK)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "UPWARD" not in r.stdout, r.stdout + r.stderr
    assert [ln.split(":")[0] for ln in r.stdout.splitlines() if not ln.startswith(" ")] == ["alive", "exited", "follow"]


@pytest.mark.skipif(shutil.which("addr2line") is None or shutil.which("gcc") is None, reason="needs gcc and addr2line")
def test_the_walk_finds_a_planted_upward_call(tmp_path):
    """The same walk on a copy of the tree where the core calls the api layer on every remote free fails, naming it."""
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "src", tree / "src")
    shutil.copytree(REPO / "include", tree / "include")
    outbox = tree / "src" / "core" / "outbox.c"
    text = outbox.read_text()
    text = text.replace("void mld_remote_push(", "extern void mallard_planted_up(void);\nvoid mld_remote_push(", 1)
    text = text.replace("  remote_notice_t notice = remote_notice(pg);", "  mallard_planted_up();\n  remote_notice_t notice = remote_notice(pg);", 1)
    outbox.write_text(text)
    api = tree / "src" / "api" / "api.c"
    api.write_text(api.read_text() + "\nvoid mallard_planted_up(void) {}\n")
    r = subprocess.run(["bash", str(WALK), str(tree)], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "UPWARD CALL: mld_remote_push (core/outbox.c) calls mallard_planted_up (api/api.c)" in r.stdout, r.stdout + r.stderr
