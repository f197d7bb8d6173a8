"""Fixtures for the pprof writer tests: the build directory, the writer's test programs and Go's pprof."""
import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def build_dir():
    d = pathlib.Path(os.environ.get("MALLARD_BUILD_DIR", REPO / "build"))
    assert (d / "bin" / "pprof-writer").exists(), f"build Mallard first: {d}/bin/pprof-writer is missing"
    return d


@pytest.fixture(scope="session")
def go():
    """Go's toolchain: `go` on PATH, then Debian's golang-go, then the upstream tarball's place."""
    for cand in (shutil.which("go"), "/usr/lib/go/bin/go", "/usr/local/go/bin/go"):
        if cand and os.access(cand, os.X_OK):
            return cand
    pytest.fail("go tool pprof is needed: install Go (Debian: apt-get install golang-go)")


@pytest.fixture
def pprof(go, tmp_path):
    """Runs `go tool pprof ARGS` and returns its standard output (the tool must succeed)."""

    def run(*args):
        env = dict(os.environ, HOME=os.environ.get("HOME", str(tmp_path)), PPROF_TMPDIR=str(tmp_path))
        r = subprocess.run([go, "tool", "pprof", *map(str, args)], capture_output=True, text=True, timeout=120,
                           env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout

    return run
