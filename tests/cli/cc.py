"""Builds the small C programs of the CLI tests (tests/cli/progs) into a test's temporary folder with cc (or
musl-gcc, for the musl tests)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

PROGS = Path(__file__).resolve().parent / "progs"


def build(name: str, out_dir: Path, *extra: str, compiler: str | None = None, out: str | None = None) -> str:
    """Compiles progs/<name>.c with extra flags/libraries into out_dir/<out or name>; fails the test with the
    compiler's message. compiler: e.g. musl-gcc (default cc)."""
    cc = compiler or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "no C compiler (cc) on this machine"
    exe = out_dir / (out or name)
    r = subprocess.run([cc, "-O1", "-fno-builtin", "-Wall", "-Werror", "-o", str(exe), str(PROGS / f"{name}.c"),
                        *extra], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return str(exe)
