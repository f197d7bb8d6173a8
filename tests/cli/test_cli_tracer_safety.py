"""The tracer behind `mallard profile` is as safe as the programs it is preloaded into: signal handlers that leave
the process, tiny thread stacks, non-ASCII arguments, fork children, _Exit/quick_exit, and exit racing exec/_exit."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from cc import build


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return build("tracer_cases", tmp_path_factory.mktemp("progs"), "-pthread")


def profile(mallard, tmp_path, *cmd, timeout=60):
    out = tmp_path / "p.json"
    if out.exists():
        out.unlink()
    # Its own session, so that a hung program is killed with the command on timeout.
    p = subprocess.Popen([sys.executable, "-m", "mallard_cli", "profile", "-o", str(out), "--", *cmd], env=mallard.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    data = json.loads(out.read_text(encoding="utf-8")) if out.exists() else None
    return r, data


@pytest.mark.parametrize("how", ["sigexit", "sigexec"])
def test_leaving_from_a_signal_handler_inside_malloc_never_hangs(mallard, tmp_path, cases, how):
    # The handler interrupts malloc/free; the old writer took a lock and called qsort (malloc) there and hung.
    for _ in range(10):
        try:
            r, data = profile(mallard, tmp_path, cases, how, timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{how}: the traced program hung")
        assert r.returncode == 0, r.stderr
        ends = [p["ended_by"] for p in data["processes"] if p["exe"] == cases]
        assert ends == ["_exit" if how == "sigexit" else "exec"], data["processes"]


@pytest.mark.parametrize("stack", [16384, 32768, 40960, 57344])
def test_fork_and_exec_from_a_thread_with_a_small_stack(mallard, tmp_path, cases, stack):
    r, data = profile(mallard, tmp_path, cases, "smallstack", str(stack))
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert any(p["ended_by"] == "exec" for p in data["processes"]), data["processes"]


def test_non_ascii_arguments_are_utf8_in_the_record(mallard, tmp_path):
    r, data = profile(mallard, tmp_path, b"sh".decode(), "-c", "exit 0", "héllo", "日本語", "\udcff")
    assert r.returncode == 0, r.stderr
    cmdline = data["processes"][0]["cmdline"]
    assert "héllo" in cmdline and "日本語" in cmdline and "\ufffd" in cmdline, cmdline


def test_fork_child_inherits_live_blocks(mallard, tmp_path, cases):
    r, data = profile(mallard, tmp_path, cases, "fork")
    assert r.returncode == 0, r.stderr
    assert len(data["processes"]) == 2
    for p in data["processes"]:
        assert p["peak_live_bytes"] >= 0 and p["live_bytes_at_end"] >= 0, p
    child = next(p for p in data["processes"] if p["ppid"] != data["processes"][0]["ppid"] or p["calls"]["free"] >= 10)
    assert child["calls"]["free"] >= 10 and child["live_bytes_at_end"] >= 0


@pytest.mark.parametrize("how", ["_Exit", "quick_exit"])
def test_exit_variants_leave_a_record(mallard, tmp_path, cases, how):
    r, data = profile(mallard, tmp_path, cases, how)
    assert r.returncode == 0, r.stderr
    assert [p["ended_by"] for p in data["processes"]] == [how]
    assert data["processes"][0]["calls"]["malloc"] >= 10


@pytest.mark.parametrize("how", ["race-exit", "race-exec"])
def test_exit_racing_exec_or_exit_writes_exactly_one_record(mallard, tmp_path, cases, how):
    for _ in range(15):
        r, data = profile(mallard, tmp_path, cases, how)
        assert r.returncode == 0, r.stderr
        mine = [p for p in data["processes"] if p["exe"] == cases]
        assert len(mine) == 1, mine


def test_tracer_is_built_with_stack_clash_protection(build):
    # The flag leaves no mark in the library; check the build's compile command instead.
    cmds = (build / "compile_commands.json")
    text = cmds.read_text() if cmds.exists() else ""
    if not text:
        ninja = build / "build.ninja"
        text = ninja.read_text() if ninja.exists() else ""
    assert "tracer.c" in text, "cannot find the tracer's compile command in the build directory"
    assert "-fstack-clash-protection" in text and "-Wframe-larger-than=" in text
