"""Fixtures of the `mallard` command tests: the build directory, the test programs and a runner for the command."""
from __future__ import annotations

import os
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "tools" / "mallard" / "src"
BUILD = Path(os.environ.get("MALLARD_BUILD_DIR", str(REPO / "build")))

if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))


class Mallard:
    """Runs `python -m mallard_cli ARGS` with the build directory of the tests; returns the CompletedProcess."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self.env["MALLARD_BUILD_DIR"] = str(BUILD)
        # Wide enough that where the checkout and the temporary folder lie does not change the layout: the widths the
        # tests were written at (200 columns, short paths) plus room for longer paths in the reports.
        self.env["COLUMNS"] = str(200 + 4 * (len(str(BUILD)) + len(tempfile.gettempdir())))
        self.env["PYTHONPATH"] = str(SRC) + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env.pop("LD_PRELOAD", None)

    def __call__(self, *args: str, timeout: float = 300, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        e = dict(self.env)
        if env:
            e.update(env)
        return subprocess.run([sys.executable, "-m", "mallard_cli", *args], env=e, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, **kw)


@pytest.fixture(scope="session")
def mallard() -> Mallard:
    return Mallard()


@pytest.fixture(scope="session")
def build() -> Path:
    return BUILD


@pytest.fixture(scope="session")
def prog():
    """Path of a test program built by tools/tracer (fails, not skips, when the build lacks it)."""

    def get(name: str) -> str:
        p = BUILD / "bin" / f"mallard-testprog-{name}"
        assert p.is_file(), f"{p} is not built: build the tools/tracer targets into {BUILD}"
        return str(p)

    return get


@pytest.fixture(scope="session")
def allocators():
    from mallard_cli import allocators as al

    old = os.environ.get("MALLARD_BUILD_DIR")
    os.environ["MALLARD_BUILD_DIR"] = str(BUILD)
    try:
        return al.discover()
    finally:  # leave the session's environment as it was
        if old is None:
            del os.environ["MALLARD_BUILD_DIR"]
        else:
            os.environ["MALLARD_BUILD_DIR"] = old


PEER_FILES = {
    "jemalloc": "libjemalloc.so.2 (Debian package libjemalloc2)",
    "mimalloc": "libmimalloc.so.2 (Debian package libmimalloc2.0)",
    "tcmalloc": "libtcmalloc_minimal.so.4 (Debian package libtcmalloc-minimal4)",
}


def require(allocators, name: str):
    """The allocator named, or a skip when it is a peer whose package is not installed (never for mallard/glibc)."""
    for a in allocators:
        if a.name == name:
            return a
    if name in PEER_FILES:
        pytest.skip(f"peer allocator {name} is not installed: {PEER_FILES[name]} is absent")
    raise AssertionError(f"allocator {name} not found in {BUILD}/lib: it must be built")


@pytest.fixture(scope="session")
def need():
    return require
