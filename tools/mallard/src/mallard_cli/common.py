"""What every subcommand shares: consoles, exit codes, the one-line error, tables and allocator/option helpers."""
from __future__ import annotations

import json
import os

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as _RichTable

from . import allocators as al

# Exit codes (documented in docs/CLI.md).
EXIT_OK = 0
EXIT_ERROR = 1  # something else went wrong (e.g. no trace record, file not writable, unreadable dump)
EXIT_USAGE = 2  # bad options or no command after --
EXIT_UNKNOWN_ALLOCATOR = 3  # unknown name, or a path that is not a loadable allocator
EXIT_BAD_PID = 4  # no such process, or its /proc files cannot be read
EXIT_PROGRAM_FAILED = 5  # bench/demo/vmem: the program failed (under at least one allocator)
EXIT_NOT_BUILT = 6  # the tracer library is not built / installed
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_CANNOT_EXECUTE = 126  # the program exists but cannot be executed
EXIT_NOT_FOUND = 127  # the program does not exist


def _console(stderr: bool = False) -> Console:
    c = Console(stderr=stderr, highlight=False, soft_wrap=False)
    if not c.is_terminal:
        cols = os.environ.get("COLUMNS", "")
        c.width = int(cols) if cols.isdigit() and int(cols) >= 60 else 140
    return c


out = _console()
err = _console(stderr=True)


class CliError(Exception):
    """An error the user can act on: printed as one line, exits with code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def write_json(path: str, data) -> None:
    """Write a report as indented JSON; a file that cannot be written is a one-line error."""
    try:
        with open(path, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror}", EXIT_ERROR) from None


def printable(s: str) -> str:
    """A user string (argument, path, program output) made printable: undecodable bytes shown as \\xNN."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def shown(s: str) -> str:
    """A user string ready for rich markup: printable and with its [ ] escaped."""
    return escape(printable(s))


def fail(message: str, code: int) -> int:
    err.print(f"[bold red]mallard:[/] {shown(' '.join(message.split()))}", markup=True, soft_wrap=True)
    return code


def start_error(cmd: list[str], e: OSError) -> CliError:
    """The error of a program that cannot start, with the shell's exit codes (127 not found, 126 not executable)."""
    code = EXIT_NOT_FOUND if isinstance(e, FileNotFoundError) else EXIT_CANNOT_EXECUTE
    return CliError(f"cannot run '{printable(cmd[0])}': {e.strerror or e}", code)


def get_allocator(name: str | None, allocs: list[al.Allocator] | None = None) -> al.Allocator:
    try:
        return al.resolve(name or "glibc", allocs)
    except al.UnknownAllocator as e:
        raise CliError(str(e), EXIT_UNKNOWN_ALLOCATOR) from None


def parse_conf(conf: str | None) -> str | None:
    """--conf K:V,K:V is passed to Mallard as MALLARD_CONF; checks only its shape here."""
    if conf is None:
        return None
    for item in conf.split(","):
        if item and ":" not in item:
            raise CliError(f"--conf expects key:value pairs separated by commas, got '{item}'", EXIT_USAGE)
    return conf


def check_conf(alloc: al.Allocator, conf: str | None) -> tuple[str, str] | None:
    """The variable carrying --conf to alloc; a usage error when alloc has no equivalent of Mallard's options."""
    try:
        return al.conf_variable(alloc, conf)
    except al.ConfNotApplicable as e:
        raise CliError(str(e), EXIT_USAGE) from None


def default_allocator(args) -> None:
    """Without -a: Mallard when it is found, else glibc's malloc."""
    if args.allocator is None:
        args.allocator = "mallard" if any(x.name == "mallard" for x in al.discover()) else "glibc"


def Table(*a, **kw):  # noqa: N802 - rich's Table whose title never wraps
    title = kw.get("title")
    if title and "min_width" not in kw:
        kw["min_width"] = len(str(title)) + 2
    return _RichTable(*a, **kw)


def progress() -> Progress:
    return Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, transient=True, disable=not err.is_terminal)


def alloc_opt(s, default=None, default_text=None) -> None:
    """The -a/--conf pair of run, env, profile and vmem."""
    text = default_text or default
    s.add_argument("-a", "--allocator", metavar="NAME|PATH", default=default,
                   help="allocator name (see `mallard list`) or path to a .so" + (f" (default {text})" if text else ""))
    s.add_argument("--conf", metavar="K:V,...", help="Mallard options, passed as MALLARD_CONF (Mallard only)")
