"""Bad input gets one line and a documented exit code: non-allocator libraries, bad regexes, exited programs, signals."""
from __future__ import annotations

import glob
import re

import pytest


def one_line(r):
    assert "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


@pytest.mark.parametrize("path,why", [("/etc/passwd", "not a shared library"),
                                      ("LIBM", "does not define malloc")])
@pytest.mark.parametrize("sub", ["run", "bench", "vmem", "profile"])
def test_allocator_path_must_be_an_allocator(mallard, path, why, sub):
    if path == "LIBM":
        libs = glob.glob("/lib/x86_64-linux-gnu/libm.so.6") + glob.glob("/lib*/libm.so.6") + \
            glob.glob("/usr/lib*/*/libm.so.6")
        assert libs, "no libm.so.6 found"
        path = libs[0]
    r = mallard(sub, "-a", path, "--", "true")
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert why in one_line(r)


def test_vmem_bad_regex_is_a_usage_error(mallard):
    r = mallard("vmem", "--ready", "x(", "--", "true")
    assert r.returncode == 2 and "--ready" in one_line(r)


def test_vmem_of_a_program_that_exited_says_so(mallard):
    for _ in range(3):
        r = mallard("vmem", "--delay", "0", "--", "true")
        assert "kernel thread" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert (r.returncode == 5 and "exited" in one_line(r)) or (r.returncode == 0 and "mallard vmem" in r.stdout)


def test_which_of_a_kernel_thread_fails_like_vmem(mallard):
    for sub in ("which", "vmem"):
        r = mallard(sub, "2")
        assert r.returncode == 4, (sub, r.stdout, r.stderr)
        assert "kernel thread" in one_line(r)


def test_profile_of_a_killed_program_names_the_signal(mallard):
    r = mallard("profile", "--", "sh", "-c", "kill -9 $$")
    assert r.returncode in (1, 137), r.stderr
    assert "SIGKILL" in r.stdout + r.stderr and "-9" not in r.stdout + r.stderr


def test_bench_names_the_signal(mallard):
    r = mallard("bench", "-a", "glibc", "-n", "1", "--warmup", "0", "--", "sh", "-c", "kill -TERM $$")
    assert r.returncode == 5 and "SIGTERM" in r.stderr, r.stderr


@pytest.mark.parametrize("args", [["bench", "--no-such-option", "--", "true"], ["profile", "--top", "x", "--", "true"],
                                  ["nosuchcommand"], ["bench", "-n", "0", "--", "true"], ["vmem", "1", "--", "true"]])
def test_usage_errors_are_one_line(mallard, args):
    r = mallard(*args)
    assert r.returncode == 2, r.stderr
    assert re.match(r"^mallard", one_line(r))


def test_vmem_units_and_thread_count(mallard):
    # One unit system (binary bytes) in the whole report, and "1 thread" in the singular.
    r = mallard("vmem", "--ready", "^ready", "--", "sh", "-c", "echo ready; sleep 5")
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[:2]
    assert "1 thread," in head[0], head
    assert " kB" not in r.stdout and re.search(r"VIRT [\d.]+ (KiB|MiB|GiB)", head[1]), head
