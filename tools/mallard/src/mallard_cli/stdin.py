"""The standard input of measured runs: read once (a file given, or the command's redirected input) and replayed."""
from __future__ import annotations

import contextlib
import os
import select
import shutil
import stat
import sys
import tempfile
from typing import Iterator

from .common import EXIT_USAGE, CliError


@contextlib.contextmanager
def replay_source(path: str | None) -> Iterator[str | None]:
    """A file every run reads as its standard input, or None (no input: /dev/null).

    With --stdin FILE: that file. Without it, a redirected standard input (file or pipe) is copied once, so each run
    gets the same bytes; a terminal is never read (a benchmark must not wait for typing).
    """
    if path is not None:
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise CliError(f"--stdin: cannot read {path}: {e.strerror}", EXIT_USAGE) from None
        yield path
        return
    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        yield None
        return
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        yield None  # a terminal or /dev/null
        return
    if not stat.S_ISREG(mode):
        ready, _, _ = select.select([fd], [], [], 2.0)
        if not ready:  # e.g. `ssh host mallard bench ...`: an open pipe nobody writes to
            from .common import err

            err.print("mallard: reading the standard input to replay it to every run (it is a pipe); give the "
                      "input with --stdin FILE, or --stdin /dev/null for none", markup=False, soft_wrap=True)
    tmp = tempfile.NamedTemporaryFile(prefix="mallard-stdin-", delete=False)
    try:
        with tmp:
            with os.fdopen(os.dup(fd), "rb") as src:
                shutil.copyfileobj(src, tmp, 1 << 20)
        yield tmp.name
    finally:
        os.unlink(tmp.name)
