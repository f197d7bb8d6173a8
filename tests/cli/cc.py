"""Builds the small C programs of the CLI tests (tests/cli/progs) into a test's temporary folder with cc."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

PROGS = Path(__file__).resolve().parent / "progs"


def build(name: str, out_dir: Path, *extra: str) -> str:
    """Compiles progs/<name>.c with extra flags/libraries; fails the test with the compiler's message."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "no C compiler (cc) on this machine"
    exe = out_dir / name
    r = subprocess.run([cc, "-O1", "-fno-builtin", "-Wall", "-Werror", "-o", str(exe), str(PROGS / f"{name}.c"),
                        *extra], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return str(exe)
