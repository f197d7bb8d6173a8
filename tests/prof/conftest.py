"""Fixtures of the heap-profiling tests: the library, Go's pprof, and test programs compiled on demand."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("MALLARD_BUILD_DIR", str(REPO / "build"))).resolve()
LIB = BUILD / "lib" / "libmallard.so"
HERE = Path(__file__).resolve().parent


def find_go() -> str:
    """`go` on PATH, else Debian's golang-go (/usr/lib/go/bin), else an upstream install (/usr/local/go/bin)."""
    found = shutil.which("go")
    if found:
        return found
    for cand in ("/usr/lib/go/bin/go", "/usr/local/go/bin/go"):
        if Path(cand).exists():
            return cand
    raise AssertionError("Go's toolchain is missing (apt install golang-go: scripts/apt-packages.txt lists it)")


@pytest.fixture(scope="session")
def go() -> str:
    return find_go()


@pytest.fixture(scope="session")
def lib() -> Path:
    assert LIB.exists(), f"{LIB} is missing: build first (ninja -C build)"
    return LIB


@pytest.fixture(scope="session")
def build_prog(tmp_path_factory):
    """Compiles tests/prof/NAME.c with the given flags (cached per flag set); returns the executable's path."""
    cache: dict = {}
    out = tmp_path_factory.mktemp("progs")

    def build(name: str, *flags: str) -> Path:
        key = (name, flags)
        if key not in cache:
            exe = out / (name + "".join(re.sub(r"[^a-z0-9]", "_", f) for f in flags))
            subprocess.run([os.environ.get("CC", "cc"), "-O2", "-g", *flags, "-o", str(exe), str(HERE / f"{name}.c"),
                            "-ldl"], check=True)
            cache[key] = exe
        return cache[key]

    return build


def pprof_top(go: str, exe: Path | None, profile: Path, index: str, cum: bool = False) -> dict[str, tuple[int, int]]:
    """`go tool pprof -top` of one sample type: function -> (flat, cum), in bytes or objects."""
    cmd = [go, "tool", "pprof", "-top", "-nodecount=200", f"-sample_index={index}"]
    if index.endswith("_space"):
        cmd.append("-unit=B")
    if cum:
        cmd.append("-cum")
    cmd += ([str(exe)] if exe else []) + [str(profile)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PPROF_TMPDIR=str(profile.parent)))
    assert res.returncode == 0, res.stderr
    rows = {}
    for line in res.stdout.splitlines():
        m = re.match(r"\s*(-?[\d.]+)(B|)\s+[\d.]+%\s+[\d.]+%\s+(-?[\d.]+)(B|)\s+[\d.]+%\s+(.+?)\s*$", line)
        if m:
            rows.setdefault(m.group(5), (int(float(m.group(1))), int(float(m.group(3)))))
    assert rows, f"no rows in pprof's output:\n{res.stdout}\n{res.stderr}"
    return rows
