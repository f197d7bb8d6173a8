"""Fixtures of the real-program tests: run a program with LD_PRELOAD=libmallard.so and read Mallard's exit reports."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("MALLARD_BUILD_DIR", str(REPO / "build"))).resolve()
LIB = BUILD / "lib" / "libmallard.so"
# The variants some tests also run on: name -> library (the secure build is used only where it was built).
VARIANTS = {"mallard": LIB, "mallard-secure": BUILD / "lib" / "libmallard-secure.so"}
REPORT_MARK = '{"mallard":'


def find_system_python() -> str:
    """Debian's python3 (the one libpython3.11-testsuite belongs to), else whatever python3 is on PATH."""
    if Path("/usr/bin/python3").exists():
        return "/usr/bin/python3"
    found = shutil.which("python3")
    assert found, "python3 is not installed"
    return found


def parse_reports(text: str) -> list[dict]:
    """Every JSON exit report (`stats_print_opts:J`) found in a process tree's stderr, in order."""
    decoder = json.JSONDecoder()
    reports = []
    pos = text.find(REPORT_MARK)
    while pos >= 0:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            # Two processes exiting at once may interleave their reports; skip a torn one.
            end = pos + len(REPORT_MARK)
        else:
            reports.append(obj["mallard"])
        pos = text.find(REPORT_MARK, end)
    return reports


def mallocs(report: dict) -> int:
    """Blocks a process took from Mallard: small and medium classes, large and huge blocks."""
    st = report["stats"]
    return sum(c["nmalloc"] for c in report["classes"]) + st["large"]["nmalloc"] + st["huge"]["nmalloc"]


def as_text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def without_reports(text: str) -> str:
    """stderr with the JSON exit reports cut out (what the program itself wrote)."""
    out, pos = [], 0
    decoder = json.JSONDecoder()
    start = text.find(REPORT_MARK)
    while start >= 0:
        out.append(text[pos:start])
        try:
            _, pos = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            pos = start + len(REPORT_MARK)
        start = text.find(REPORT_MARK, pos)
    out.append(text[pos:])
    return "".join(out).strip()


@dataclass
class Result:
    """A finished run: the process, and the exit reports of every process in its tree that printed one."""
    proc: subprocess.CompletedProcess
    reports: list[dict] = field(default_factory=list)

    @property
    def stdout(self):
        return self.proc.stdout

    @property
    def stderr(self) -> str:
        return without_reports(as_text(self.proc.stderr))

    def assert_mallard_active(self, min_mallocs: int, min_reports: int = 1) -> dict:
        """Mallard served this program: see check_reports. Returns the busiest process's report."""
        return check_reports(self.reports, min_mallocs, min_reports, self.proc.stderr)


def check_reports(reports: list[dict], min_mallocs: int, min_reports: int = 1, stderr="") -> dict:
    """At least min_reports exit reports, none with a foreign pointer freed, one process with min_mallocs blocks."""
    assert len(reports) >= min_reports, (
        f"expected at least {min_reports} Mallard exit report(s), got {len(reports)}; stderr: {stderr[-2000:]}")
    for r in reports:
        # A foreign pointer in free() would mean some allocation bypassed the preloaded library.
        assert r["stats"]["invalid_frees"] == 0, f"invalid frees reported: {r['stats']}"
    busiest = max(reports, key=mallocs)
    assert mallocs(busiest) >= min_mallocs, f"only {mallocs(busiest)} blocks from Mallard: {busiest['stats']}"
    return busiest


class Preload:
    """Runs commands with LD_PRELOAD=<a Mallard library> and a clean Mallard configuration."""

    def __init__(self, lib: Path = LIB, name: str = "mallard", workdir: Path | None = None):
        self.lib = lib
        self.name = name
        # Where a command runs unless the test names a folder: a fresh temporary one, never the checkout.
        self.workdir = workdir

    def env(self, stats: bool = False, extra: dict | None = None, preload: bool = True) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLARD_CONF")}
        # Keep a machine-wide /etc/mallard.conf out of the tests.
        env["MALLARD_CONF_PATH"] = "/nonexistent/mallard.conf"
        if preload:
            env["LD_PRELOAD"] = str(self.lib)
        if stats:
            # JSON report without the per-arena table: size classes stay, for the block counts.
            env["MALLARD_CONF"] = "stats_print:true,stats_print_opts:Ja"
        if extra:
            env.update(extra)
        return env

    def run(self, cmd: list[str], *, stats: bool = True, extra_env: dict | None = None, check: bool = True,
            timeout: float = 120, text: bool = True, **kw) -> Result:
        """Run cmd under Mallard; with check, a failure is shown beside the same command without Mallard."""
        __tracebackhide__ = True
        if "input" not in kw:
            kw.setdefault("stdin", subprocess.DEVNULL)
        if self.workdir is not None:
            kw.setdefault("cwd", self.workdir)
        proc = subprocess.run(cmd, env=self.env(stats, extra_env), capture_output=True, text=text,
                              timeout=timeout, **kw)
        if check and proc.returncode != 0:
            base = subprocess.run(cmd, env=self.env(False, extra_env, preload=False), capture_output=True,
                                  text=text, timeout=timeout, **kw)
            pytest.fail(f"{cmd!r} failed under Mallard (rc {proc.returncode}); without Mallard rc "
                        f"{base.returncode}.\n--- stdout ---\n{as_text(proc.stdout)[-3000:]}\n--- stderr ---\n"
                        f"{without_reports(as_text(proc.stderr))[-3000:]}")
        return Result(proc, parse_reports(as_text(proc.stderr)) if stats else [])

    check_reports = staticmethod(check_reports)
    parse_reports = staticmethod(parse_reports)


@pytest.fixture(scope="session")
def preload(tmp_path_factory) -> Preload:
    assert LIB.exists(), f"build Mallard first: {LIB} is missing (MALLARD_BUILD_DIR={BUILD})"
    return Preload(workdir=tmp_path_factory.mktemp("programs-cwd"))


@pytest.fixture(scope="session", params=list(VARIANTS))
def preload_variant(request, tmp_path_factory) -> Preload:
    """libmallard.so, then libmallard-secure.so where this build directory has it."""
    lib = VARIANTS[request.param]
    if request.param != "mallard" and not lib.exists():
        pytest.skip(f"{lib.name} is not built in {BUILD}")
    assert lib.exists(), f"build Mallard first: {lib} is missing (MALLARD_BUILD_DIR={BUILD})"
    return Preload(lib, request.param, workdir=tmp_path_factory.mktemp(f"{request.param}-cwd"))


@pytest.fixture(scope="session")
def system_python() -> str:
    return find_system_python()
