"""Measured runs: wall time, user and system CPU and peak RSS of a command's whole process tree."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass


@dataclass
class RunResult:
    wall_s: float
    user_s: float
    sys_s: float
    max_rss_kib: int  # the largest peak RSS of any process in the tree (ru_maxrss of the waited child)
    returncode: int  # like subprocess: negative signal number when killed by a signal
    stdout: str
    stderr: str


def helper_path() -> str | None:
    """The launcher mallard-measure (built with the tracer): with it, peak RSS is the command's own.

    Without it the command is the CLI's direct child, and Linux keeps in its ru_maxrss the high-water mark of the
    Python process it was forked from (tens of MiB), so small peaks would be hidden.
    """
    from .allocators import build_dir, in_source_tree, mallard_lib_dirs

    cands = [build_dir() / "bin" / "mallard-measure"] if (os.environ.get("MALLARD_BUILD_DIR") or in_source_tree()) else []
    for d in mallard_lib_dirs():  # <prefix>/lib[/<multiarch>] -> <prefix>/bin, <prefix>/libexec/mallard, <libdir>/mallard
        prefixes = [d.parent, d.parent.parent] if d.parent.name in ("lib", "lib64") else [d.parent]
        cands += [d / "mallard" / "mallard-measure"]
        for p in prefixes:
            cands += [p / "bin" / "mallard-measure", p / "libexec" / "mallard" / "mallard-measure"]
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return shutil.which("mallard-measure")


def _drain(stream, sink: list) -> None:
    sink.append(stream.read())
    stream.close()


def exit_text(rc: int) -> str:
    """How a program ended, in words: 'exit status 3' or 'killed by signal 9 (SIGKILL)'."""
    if rc >= 0:
        return f"exit status {rc}"
    try:
        name = signal.Signals(-rc).name
    except ValueError:
        name = "unknown signal"
    return f"killed by signal {-rc} ({name})"


def run_measured(cmd: list[str], env: dict, timeout: float | None = None, cwd: str | None = None,
                 capture: bool = True, stdin_path: str | None = None) -> RunResult:
    """Run cmd to completion and measure it; raises OSError if it cannot start, subprocess.TimeoutExpired on timeout.

    CPU times and peak RSS come from wait4() on the child, which includes every descendant it waited for.
    The child gets its own process group so that a timeout kills the whole tree. Its standard input is stdin_path
    (read from the start on every run) or /dev/null.
    """
    pipe = subprocess.PIPE if capture else None
    helper = helper_path()
    report_r = report_w = -1
    argv = list(cmd)
    run_env = env
    if helper:
        report_r, report_w = os.pipe()
        argv = [helper, str(report_w)] + list(cmd)
        run_env = dict(env)
        # The helper runs without the allocator; it hands LD_PRELOAD to the command.
        run_env["MALLARD_MEASURE_LD_PRELOAD"] = run_env.pop("LD_PRELOAD", "")
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, env=run_env, cwd=cwd, stdout=pipe, stderr=pipe, stdin=stdin,
                                start_new_session=True, pass_fds=(report_w,) if helper else ())
    except BaseException:
        if helper:
            os.close(report_r)
            os.close(report_w)
        raise
    finally:
        if stdin_path:
            stdin.close()
    if helper:
        os.close(report_w)
    outs: list = []
    errs: list = []
    readers = []
    if capture:
        readers = [threading.Thread(target=_drain, args=(proc.stdout, outs), daemon=True),
                   threading.Thread(target=_drain, args=(proc.stderr, errs), daemon=True)]
        for r in readers:
            r.start()
    timed_out = threading.Event()

    def _kill() -> None:
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass

    timer = threading.Timer(timeout, _kill) if timeout else None
    if timer:
        timer.start()
    try:
        while True:
            try:
                _, status, ru = os.wait4(proc.pid, 0)
                break
            except InterruptedError:
                continue
            except KeyboardInterrupt:
                _kill()
                raise
    finally:
        if timer:
            timer.cancel()
    wall = time.perf_counter() - t0
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    proc.returncode = rc  # tell Popen the child is reaped
    if capture:
        # Descendants that outlive the child may hold the pipes open; do not wait for them forever.
        for r in readers:
            r.join(timeout=5 if not timed_out.is_set() else 1)
        if any(r.is_alive() for r in readers):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            for r in readers:
                r.join(timeout=2)
    out = outs[0].decode(errors="replace") if outs else ""
    err = errs[0].decode(errors="replace") if errs else ""
    user, system, maxrss = ru.ru_utime, ru.ru_stime, int(ru.ru_maxrss)
    if helper:
        with os.fdopen(report_r) as f:
            report = f.read().split()
        if report[:1] == ["exec-failed"]:
            e = int(report[1])
            raise OSError(e, os.strerror(e), cmd[0])
        if len(report) == 4:
            user, system, maxrss = float(report[0]), float(report[1]), int(report[2])
    if timed_out.is_set():
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
    return RunResult(wall, user, system, maxrss, rc, out, err)
