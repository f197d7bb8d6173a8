"""The secure variant detects each heap misuse, reports the address and aborts; the fast variant survives them."""
import os
import pathlib
import re
import signal
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("MALLARD_BUILD_DIR", REPO / "build"))
PROG = BUILD / "bin" / "mallard-misuse"
SECURE = BUILD / "lib" / "libmallard-secure.so"
FAST = BUILD / "lib" / "libmallard.so"

ABORTS = {
    "double-free": "double free or invalid free of 0x",
    "interior-free": "double free or invalid free of 0x",
    "misaligned-free": "double free or invalid free of 0x",
    "stack-free": "free(0x",
    "foreign-free": "free(0x",
    "overflow": "heap buffer overflow: canary damaged after block 0x",
    "overflow-realloc": "heap buffer overflow: canary damaged after block 0x",
    "use-after-free": "free list corrupted",
    "remote-double-free": "double free (by another thread) of 0x",
}


def run(lib, misuse, conf=None):
    env = dict(os.environ, LD_PRELOAD=str(lib))
    env.pop("MALLARD_CONF", None)
    if conf:
        env["MALLARD_CONF"] = conf
    return subprocess.run([str(PROG), misuse], env=env, capture_output=True, text=True, timeout=60)


def test_clean_program_runs():
    r = run(SECURE, "none")
    assert r.returncode == 0 and "not detected" in r.stdout


@pytest.mark.parametrize("misuse", sorted(ABORTS))
def test_secure_detects(misuse):
    r = run(SECURE, misuse)
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stdout, r.stderr)
    assert "mallard-secure:" in r.stderr and ABORTS[misuse] in r.stderr
    assert re.search(r"0x[0-9a-f]+", r.stderr), "the report names the address"
    assert "not detected" not in r.stdout


@pytest.mark.parametrize("misuse", ["metadata-guard", "huge-guard"])
def test_secure_guard_pages(misuse):
    r = run(SECURE, misuse)
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stdout, r.stderr)


def test_zero_on_free():
    r = run(SECURE, "zero-on-free", conf="zero_on_free:true")
    assert r.returncode == 0 and "wiped" in r.stdout


@pytest.mark.parametrize("misuse", ["stack-free", "foreign-free"])
def test_fast_variant_reports_foreign_once_and_runs_on(misuse):
    r = run(FAST, misuse)
    assert r.returncode == 0 and "not detected" in r.stdout
    assert r.stderr.count("pointer not allocated by mallard") == 1
