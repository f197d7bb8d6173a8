"""What every subcommand shares: consoles, exit codes, the one-line error, tables and allocator/option helpers."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as _RichTable

from . import allocators as al
from . import libc as lc

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


def wants_command(args, cmd: str, noun: str, example: str = "") -> bool:
    """True when a program follows `--`, False when a PID was given; a usage error for both or neither."""
    if args.command:
        if args.pid:
            raise CliError(f"{cmd} takes a PID or a {noun} after --, not both", EXIT_USAGE)
        return True
    if not args.pid:
        raise CliError(f"{cmd} needs a PID or a {noun} after --{example}", EXIT_USAGE)
    return False


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


@dataclass
class Target:
    """The program a command runs and the allocators that can serve it (a musl program: musl builds only)."""

    program: lc.Program
    name: str  # the command's program as the user wrote it
    allocs: list | None  # what can serve it; None until available() looks (every allocator found here)
    left_out: list = field(default_factory=list)  # musl programs: peers built for glibc, which cannot serve them
    looked_in: list = field(default_factory=list)  # musl programs: where Mallard's musl builds were looked for

    def available(self) -> list:
        if self.allocs is None:
            self.allocs = al.discover()
        return self.allocs


def target_of(cmd: list[str], allocs: list[al.Allocator] | None = None) -> Target:
    """What cmd's program is built for, and the allocators found here that can be preloaded into it."""
    p = lc.examine(cmd[0])
    name = printable(cmd[0])
    if p.musl and p.static:
        return Target(p, name, [al.Allocator(p.linked or "musl", None, lc.musl_version())])
    if p.musl:
        m = lc.discover_musl(p.interp if lc.system_loader(p.interp) else None)  # its version: run alone
        return Target(p, name, m.allocs, m.left_out, m.looked_in)
    return Target(p, name, allocs)  # a glibc program (or one that cannot be read): looked for when needed


def static_refusal(t: Target, consequence: str = "") -> str:
    """Why nothing can be preloaded into t's static musl program, and what to do instead."""
    return (f"{t.name} is {t.program.describe()}: LD_PRELOAD cannot replace the malloc of a static program"
            + (f", {consequence}" if consequence else "") + "; "
            + ("it has Mallard already" if t.program.linked == "mallard" else lc.STATIC_HINT))


def no_musl_build(t: Target, what: str) -> CliError:
    looked = ", ".join(printable(str(d)) for d in t.looked_in[:3]) + (", ..." if len(t.looked_in) > 3 else "")
    return CliError(f"{t.name} is a musl program: it needs a musl build of {what}, since a glibc-built library cannot "
                    f"be preloaded into it, and none was found (looked in {looked}): {lc.BUILD_HINT}", EXIT_NOT_BUILT)


GLIBC_NAMES = {"glibc", "ptmalloc", "ptmalloc2"}
BUILTIN_NAMES = {"system", "default", "libc"}


def allocator_for(t: Target, name: str | None) -> al.Allocator:
    """The allocator name (or path) names for t's program; None: Mallard for a musl program, else glibc's malloc.
    Raises CliError when it cannot serve that program: a library built for the other C library (exit 3), a static
    musl program (exit 3), no musl build of Mallard (exit 6)."""
    p = t.program
    key = (name or "").lower()
    if p.musl and p.static:
        builtin = t.allocs[0]  # the allocator linked in: the only one it can run with
        if (key or "mallard") in BUILTIN_NAMES | {builtin.name}:
            return builtin
        raise CliError(static_refusal(t), EXIT_UNKNOWN_ALLOCATOR)
    if p.musl:
        key = "musl" if key in BUILTIN_NAMES else key or "mallard"
        for a in t.allocs:
            if a.name == key:
                return a
        names = ", ".join(a.name for a in t.allocs)
        if key in GLIBC_NAMES:
            raise CliError(f"glibc's malloc cannot serve {t.name}: it is a musl program, whose own malloc is musl's "
                           f"(-a musl); for it, here: {names}", EXIT_UNKNOWN_ALLOCATOR)
        if key in al.MALLARD_VARIANTS or any(v == key for v, _ in al.mallard_variants()):
            raise no_musl_build(t, f"lib{key}.so")
        for a in t.left_out:
            if a.name == key:
                raise CliError(f"{key} here ({a.path}) is built for glibc and cannot be preloaded into the musl "
                               f"program {t.name}; for it, here: {names}", EXIT_UNKNOWN_ALLOCATOR)
        a = get_allocator(name, t.allocs)
        if a.path and lc.library_libc(a.path) == "glibc":
            raise CliError(f"{printable(name or '')} is built for glibc and cannot be preloaded into the musl program "
                           f"{t.name}; for it, here: {names}", EXIT_UNKNOWN_ALLOCATOR)
        return a
    if key == "musl":
        raise CliError(f"musl's malloc serves musl programs only, and {t.name} is "
                       f"{p.describe() if p.libc else 'not one'}", EXIT_UNKNOWN_ALLOCATOR)
    a = get_allocator(name, t.available())
    if a.path and p.libc == "glibc" and lc.library_libc(a.path) == "musl":
        shown_name = printable(name if name and "/" in name else a.path)
        raise CliError(f"{shown_name} is built for musl and cannot be preloaded into the glibc program {t.name}",
                       EXIT_UNKNOWN_ALLOCATOR)
    return a


def tracer_for(t: Target) -> str:
    """The tracer library that can be preloaded into t's program (the musl build for a musl program)."""
    if t.program.musl and t.program.static:
        raise CliError(f"the tracer cannot be preloaded into {t.name}: it is {t.program.describe()}, and LD_PRELOAD "
                       "does not reach a static program", EXIT_ERROR)
    if t.program.musl:
        tr = lc.musl_tracer_path()
        if tr is None:
            raise no_musl_build(t, "the tracer, libmallard-tracer.so")
        return str(tr)
    tr = al.tracer_path()
    if tr is None:
        raise CliError(TRACER_MISSING, EXIT_NOT_BUILT)
    return str(tr)


TRACER_MISSING = ("the tracer library libmallard-tracer.so is not built or installed: build the target "
                  "`mallard-tracer` (cmake --build build --target mallard-tracer), or point MALLARD_LIBDIR (or "
                  "MALLARD_BUILD_DIR) at it")


def default_allocator(args, allocs: list[al.Allocator] | None = None) -> None:
    """Without -a: Mallard when it is found, else glibc's malloc."""
    if args.allocator is None:
        allocs = al.discover() if allocs is None else allocs
        args.allocator = "mallard" if any(x.name == "mallard" for x in allocs) else "glibc"


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
