"""Bad input to `mallard`: unknown allocators, missing commands, bad PIDs and programs that cannot start."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

NEEDS_COMMAND = [["run"], ["profile"], ["bench"], ["run", "-a", "glibc", "--"], ["profile", "--"], ["bench", "-n", "1", "--"]]


@pytest.mark.parametrize("sub", ["run", "env", "profile", "bench", "vmem"])
def test_unknown_allocator_lists_the_known_ones(mallard, allocators, sub):
    flag = "-a"
    args = [sub, flag, "nosuchalloc"] + (["--", "true"] if sub != "env" else [])
    r = mallard(*args)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "unknown allocator 'nosuchalloc'" in r.stderr
    for a in allocators:
        assert a.name in r.stderr


def test_missing_allocator_file(mallard):
    r = mallard("run", "-a", "/nonexistent/libfoo.so", "--", "true")
    assert r.returncode == 3 and "no such allocator library" in r.stderr


@pytest.mark.parametrize("args", NEEDS_COMMAND)
def test_no_command_after_dashes_prints_usage(mallard, args):
    r = mallard(*args)
    assert r.returncode == 2
    assert "usage: mallard" in r.stderr and "no command after --" in r.stderr


def test_no_subcommand_prints_usage(mallard):
    r = mallard()
    assert r.returncode == 2 and "usage: mallard" in r.stderr


def test_bad_option_is_a_usage_error(mallard):
    r = mallard("bench", "--no-such-option", "--", "true")
    assert r.returncode == 2


@pytest.mark.parametrize("sub", ["which", "vmem"])
def test_pid_that_does_not_exist(mallard, sub):
    pid = 4194304 + 7  # above the kernel's largest PID
    r = mallard(sub, str(pid))
    assert r.returncode == 4
    assert f"no process with PID {pid}" in r.stderr


@pytest.mark.parametrize("sub", ["which", "vmem"])
def test_pid_that_is_not_a_number(mallard, sub):
    r = mallard(sub, "12abc")
    assert r.returncode == 4 and "is not a PID" in r.stderr


def test_pid_that_cannot_be_read(mallard):
    # A zombie has no mappings left to read.
    z = subprocess.Popen(["true"])
    try:
        for _ in range(200):
            with open(f"/proc/{z.pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        r = mallard("vmem", str(z.pid))
        assert r.returncode == 4 and "has exited" in r.stderr, r.stderr
    finally:
        z.wait()
    # A process of another user (or one we may not trace) cannot be read: a clear message too.
    try:
        with open("/proc/1/smaps") as f:
            f.read(1)
    except PermissionError:
        r = mallard("vmem", "1")
        assert r.returncode == 4 and "permission denied" in r.stderr


def test_vmem_without_pid_or_command(mallard):
    r = mallard("vmem")
    assert r.returncode == 2 and "PID or a command" in r.stderr


@pytest.mark.parametrize("sub", [["run"], ["profile"], ["bench", "-n", "1", "--warmup", "0"], ["vmem"]])
def test_program_that_does_not_exist(mallard, sub):
    r = mallard(*sub, "--", "/nonexistent/program", "arg")
    assert r.returncode == 127, (r.stdout, r.stderr)
    assert "cannot run '/nonexistent/program': No such file or directory" in r.stderr


@pytest.mark.parametrize("sub", [["run"], ["profile"], ["bench", "-n", "1", "--warmup", "0"]])
def test_program_that_is_not_executable(mallard, sub, tmp_path):
    f = tmp_path / "script.sh"
    f.write_text("echo hi\n")
    f.chmod(0o644)
    r = mallard(*sub, "--", str(f))
    if os.geteuid() == 0 and r.returncode == 0:
        pytest.fail("root could execute a file without execute permission")
    assert r.returncode == 126, (r.stdout, r.stderr)
    assert "Permission denied" in r.stderr


def test_bad_conf_shape(mallard):
    r = mallard("run", "--conf", "novalue", "--", "true")
    assert r.returncode == 2 and "key:value" in r.stderr


def test_vmem_program_that_exits_too_soon(mallard):
    r = mallard("vmem", "--delay", "2", "--", "true")
    assert r.returncode == 5 and "exited" in r.stderr


@pytest.mark.parametrize("args", [["bench", "-a", "glibc", "-n", "1", "--warmup", "0", "--json", "{out}", "--", "true"],
                                  ["profile", "-o", "{out}", "--", "true"],
                                  ["profile", "--overhead", "-n", "1", "-o", "{out}", "--", "true"],
                                  ["vmem", "--json", "{out}", "--delay", "0.2", "--", "sleep", "1"]])
def test_unwritable_report_file_is_one_line(mallard, tmp_path, args):
    out = str(tmp_path)   # a folder where the report file should go (bench makes missing folders)
    r = mallard(*[a.replace("{out}", out) for a in args])
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines[-1] == f"mallard: cannot write {out}: Is a directory" and "Traceback" not in r.stderr
