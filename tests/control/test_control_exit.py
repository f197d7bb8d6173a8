"""stats_print at exit: no descriptor the program can see or inherit, nothing written into a file the program
opened itself, no death by SIGPIPE, and the program's own output kept."""
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

CONF = "stats_print:true,stats_print_opts:J"


def probe_env(build_dir, tmp_path, conf=CONF):
    env = {k: v for k, v in os.environ.items() if k not in ("MALLARD_CONF", "LD_PRELOAD")}
    env["MALLARD_CONF_PATH"] = str(tmp_path / "no-such-mallard.conf")
    env["MALLARD_CONF"] = conf
    return env


def test_fd2_closed_at_startup_report_not_written_into_later_file(build_dir, tmp_path):
    out = tmp_path / "program.txt"
    r = subprocess.run([str(build_dir / "bin" / "mallard-ctl-probe"), "reopen2", str(out)],
                       env=probe_env(build_dir, tmp_path), stdout=subprocess.PIPE, text=True, timeout=60,
                       preexec_fn=lambda: os.close(2))
    assert r.returncode == 0
    assert out.read_text() == "program output\n"   # the report did not land in the program's own file


def test_daemon_child_does_not_hold_the_parents_pipe(build_dir, tmp_path):
    pidfile = tmp_path / "child.pid"

    def kill_child():
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass

    p = subprocess.Popen([str(build_dir / "bin" / "mallard-ctl-probe"), "daemon", str(pidfile)],
                         env=probe_env(build_dir, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = p.communicate(timeout=20)   # EOF comes when the parent exits, unless the child holds the pipe
    except subprocess.TimeoutExpired:
        kill_child()
        p.kill()
        p.communicate()
        pytest.fail("the pipe stayed open after the parent exited: the daemon child holds it")
    finally:
        kill_child()
    assert p.returncode == 0
    assert b"parent done" in out and b'{"mallard":' in out   # the parent's output and its report


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_exec_10_redirection_keeps_its_file(build_dir, tmp_path):
    f = tmp_path / "ten.txt"
    env = probe_env(build_dir, tmp_path, conf="stats_print:true")
    env["LD_PRELOAD"] = str(build_dir / "lib" / "libmallard.so")
    r = subprocess.run(["bash", "-c", f"exec 10>'{f}'; echo hello >&10"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert f.read_text() == "hello\n"
    assert "___ Mallard statistics" in r.stderr


def test_dead_stderr_pipe_keeps_stdout_and_exit_status(build_dir, tmp_path):
    out = tmp_path / "stdout.txt"
    rd, wr = os.pipe()
    os.close(rd)   # stderr leads to a pipe nobody reads: writing there raises SIGPIPE
    try:
        with open(out, "w") as f:
            r = subprocess.run([str(build_dir / "bin" / "mallard-ctl-probe"), "stdout", "2000"],
                               env=probe_env(build_dir, tmp_path), stdout=f, stderr=wr, timeout=60)
    finally:
        os.close(wr)
    assert r.returncode == 0, f"status {r.returncode} (negative: killed by that signal)"
    lines = out.read_text().splitlines()
    assert len(lines) == 2000 and lines[-1] == "line 1999"


def test_report_still_reaches_stderr_closed_by_program_exit_handlers(build_dir, tmp_path):
    """coreutils close stderr in their own exit handler, before the report: the report still arrives."""
    env = probe_env(build_dir, tmp_path)
    env["LD_PRELOAD"] = str(build_dir / "lib" / "libmallard.so")
    r = subprocess.run(["sort"], input="b\na\n", env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "a\nb\n"
    assert json.loads(r.stderr)["mallard"]["stats"]["mapped"] > 0
