"""Fixtures for the control tests: the build directory and a runner for the probe program."""
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def build_dir():
    d = pathlib.Path(os.environ.get("MALLARD_BUILD_DIR", REPO / "build"))
    assert (d / "lib" / "libmallard.so").exists(), f"build Mallard first: {d}/lib/libmallard.so is missing"
    return d


@pytest.fixture
def probe(build_dir, tmp_path):
    """Run the probe with a clean configuration: no MALLARD_CONF, no /etc/mallard.conf unless given."""

    def run(*args, conf=None, conf_file=None, program="mallard-ctl-probe", check=True):
        env = {k: v for k, v in os.environ.items() if k not in ("MALLARD_CONF", "LD_PRELOAD")}
        env["MALLARD_CONF_PATH"] = str(conf_file) if conf_file else str(tmp_path / "no-such-mallard.conf")
        if conf is not None:
            env["MALLARD_CONF"] = conf
        r = subprocess.run([str(build_dir / "bin" / program), *args], env=env, capture_output=True, text=True,
                           timeout=60)
        if check:
            assert r.returncode == 0, r.stderr
        return r

    return run


def parse_opts(stdout):
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
