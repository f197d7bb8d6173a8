"""Entry point of the `mallard` command: builds the parser from the subcommand modules and dispatches to one."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .commands import ORDER
from .common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, CliError, fail


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (and the usual exit code 2), never a usage block."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        sub = self.prog[len("mallard"):].strip()
        fail(f"{sub + ': ' if sub else ''}{message} (see {self.prog} --help)", EXIT_USAGE)
        sys.exit(EXIT_USAGE)


def modules() -> dict:
    return {name: importlib.import_module(f".commands.{name}", __package__) for name in ORDER}


def build_parser(mods: dict | None = None) -> argparse.ArgumentParser:
    mods = modules() if mods is None else mods
    p = Parser(prog="mallard", description="Run, profile, compare and explain memory allocators.",
               epilog="Put the program after --, e.g. mallard run -a jemalloc -- ./server --port 80")
    p.add_argument("--version", action="version", version=f"mallard {__version__}")
    sub = p.add_subparsers(dest="sub", metavar="COMMAND", parser_class=Parser)
    for m in mods.values():
        m.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    mods = modules()
    parser = build_parser(mods)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a usage error already printed
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    args.command = command
    if args.sub is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    mod = mods[args.sub]
    if mod.NEEDS_COMMAND and not command:
        return fail(f"{args.sub}: no command after -- (usage: mallard {args.sub} [options] -- CMD [ARGS...])",
                    EXIT_USAGE)
    try:
        return mod.run(args)
    except CliError as e:
        return fail(str(e), e.code)
    except KeyboardInterrupt:
        return fail("interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        # The reader of our output went away (e.g. `mallard list | head -1`): quietly, like other tools.
        sys.stderr.close()
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001 - a bug must still reach the user as one line
        if os.environ.get("MALLARD_DEBUG"):
            raise
        return fail(f"internal error: {type(e).__name__}: {e} (set MALLARD_DEBUG=1 for the traceback, and please "
                    "report it)", EXIT_ERROR)


if __name__ == "__main__":
    sys.exit(main())
