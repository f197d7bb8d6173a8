"""An installed `mallard` (pipx, a Debian package) finds an installed Mallard: MALLARD_LIBDIR, then pkg-config's
libdir, then the loader's path; `mallard env` then prints the installed paths, never a build tree's."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "tools" / "mallard" / "src"


@pytest.fixture
def installed(tmp_path, build):
    """A copy of the command outside any checkout and a fake install prefix holding the runtime libraries."""
    site = tmp_path / "site"
    shutil.copytree(SRC / "mallard_cli", site / "mallard_cli", ignore=shutil.ignore_patterns("__pycache__"))
    prefix = tmp_path / "prefix"
    libdir = prefix / "lib" / "x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    # A runtime package ships the soname only (libmallard.so.0); the tracer sits in a subfolder of the libdir.
    shutil.copy(build / "lib" / "libmallard.so", libdir / "libmallard.so.0")
    (libdir / "mallard").mkdir()
    shutil.copy(build / "lib" / "libmallard-tracer.so", libdir / "mallard" / "libmallard-tracer.so")
    env = {k: v for k, v in os.environ.items() if k not in ("MALLARD_BUILD_DIR", "MALLARD_LIBDIR", "LD_PRELOAD",
                                                             "PKG_CONFIG_PATH")}
    env["PYTHONPATH"] = str(site)
    env["COLUMNS"] = "200"
    env["PKG_CONFIG_PATH"] = str(tmp_path / "no-pc")  # nothing found unless a test adds it

    def run(*args, extra=None):
        e = dict(env, **(extra or {}))
        return subprocess.run([sys.executable, "-m", "mallard_cli", *args], env=e, capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)

    return run, prefix, libdir, tmp_path, build


def check_finds_prefix(run, libdir, extra, build):
    r = run("list", "--json", extra=extra)
    assert r.returncode == 0, r.stderr
    found = {a["name"]: a["path"] for a in json.loads(r.stdout)["allocators"]}
    assert found.get("mallard") == str(libdir / "libmallard.so.0"), found
    r = run("env", "-a", "mallard", extra=extra)
    assert r.returncode == 0, r.stderr
    assert str(libdir / "libmallard.so.0") in r.stdout
    assert str(build) not in r.stdout and "/build/" not in r.stdout, r.stdout
    for line in ("export LD_PRELOAD=", "ENV LD_PRELOAD=", "Environment=LD_PRELOAD="):
        assert any(l.startswith(line) and str(libdir) in l for l in r.stdout.splitlines()), (line, r.stdout)
    r = run("run", "-a", "mallard", "--", "sh", "-c", 'echo "P=$LD_PRELOAD"', extra=extra)
    assert r.returncode == 0 and f"P={libdir / 'libmallard.so.0'}" in r.stdout, r.stdout + r.stderr
    r = run("profile", "--", "sh", "-c", "exit 0", extra=extra)
    assert r.returncode == 0 and "Calls per function" in r.stdout, r.stderr


def test_found_through_mallard_libdir(installed):
    run, prefix, libdir, _, build = installed
    check_finds_prefix(run, libdir, {"MALLARD_LIBDIR": str(libdir)}, build)


def test_found_through_pkg_config(installed):
    run, prefix, libdir, tmp, build = installed
    pc = tmp / "pc"
    pc.mkdir()
    (pc / "mallard.pc").write_text(f"prefix={prefix}\nlibdir=${{prefix}}/lib/x86_64-linux-gnu\n"
                                   "includedir=${prefix}/include\n\nName: mallard\nDescription: test\nVersion: 0.1.0\n"
                                   "Libs: -L${libdir} -lmallard\nCflags: -I${includedir}\n")
    check_finds_prefix(run, libdir, {"PKG_CONFIG_PATH": str(pc)}, build)


def test_nothing_installed_says_how_to_point_at_it(installed):
    run, prefix, libdir, tmp, _ = installed
    r = run("list", extra={"MALLARD_LIBDIR": str(tmp / "empty")})
    assert r.returncode == 0
    assert "mallard: not found" in r.stdout and "MALLARD_LIBDIR" in r.stdout
    r = run("profile", "--", "true", extra={"MALLARD_LIBDIR": str(tmp / "empty")})
    assert r.returncode == 6 and len(r.stderr.strip().splitlines()) == 1, r.stderr
