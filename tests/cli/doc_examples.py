"""Runs the example sessions of docs/CLI.md: each ```console block is one bash session; `$ ` lines are commands, the
lines after them their output, then `[exit status N]`. `python doc_examples.py --write` refreshes the outputs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "CLI.md"
MARK = "@@mallard-doc@@"


@dataclass
class Example:
    command: str
    output: list[str] = field(default_factory=list)
    status: int | None = None  # None: no exit status shown (background jobs, sleep)


@dataclass
class Block:
    start: int  # line index of the ```console fence
    end: int  # line index of the closing fence
    examples: list[Example]


def parse(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```console":
            j = i + 1
            examples: list[Example] = []
            while j < len(lines) and lines[j].strip() != "```":
                line = lines[j]
                if line.startswith("$ "):
                    examples.append(Example(line[2:]))
                elif (m := re.fullmatch(r"\[exit status (\d+)\]", line)) and examples:
                    examples[-1].status = int(m.group(1))
                elif examples:
                    examples[-1].output.append(line)
                j += 1
            blocks.append(Block(i, j, examples))
            i = j
        i += 1
    return blocks


def silent(cmd: str) -> bool:
    """Commands whose output and status the doc does not show: background jobs and waits."""
    return cmd.rstrip().endswith("&") or cmd.startswith("sleep ")


def run_block(block: Block, cwd: Path, env: dict, python: str = sys.executable, timeout: float = 900,
              tmp: Path | None = None) -> list[Example]:
    """Runs the block's commands in one bash session (so `$!` works); returns them with their real output. With tmp,
    the files the examples write under /tmp/ go to that folder instead."""
    import tempfile

    # `mallard` is an executable that execs the command (not a shell function): `mallard run ... &` keeps one PID.
    bindir = Path(tempfile.mkdtemp(prefix="mallard-doc-bin-"))
    wrapper = bindir / "mallard"
    wrapper.write_text(f'#!/bin/sh\nexec "{python}" -m mallard_cli "$@"\n')
    wrapper.chmod(0o755)
    env = dict(env, PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}")
    script = ["set +e"]
    for k, ex in enumerate(block.examples):
        script.append(f"echo '{MARK} {k}'")
        command = ex.command.replace("/tmp/", f"{tmp}/") if tmp else ex.command
        if silent(command):
            script.append(command)
        else:
            script.append(f"{{ {command}\n}} 2>&1; echo \"{MARK} rc $?\"")
    script.append("kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; true")
    try:
        r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    finally:
        wrapper.unlink()
        bindir.rmdir()
    results = [Example(ex.command) for ex in block.examples]
    cur = None
    for line in r.stdout.splitlines():
        if line.startswith(MARK):
            parts = line.split()
            if parts[1] == "rc":
                if cur is not None:
                    results[cur].status = int(parts[2])
            else:
                cur = int(parts[1])
            continue
        if cur is not None:
            results[cur].output.append(line.rstrip())
    return results


def environment(build: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLARD_CONF", "MALLARD_LIBDIR")}
    env.update(COLUMNS="120", MALLARD_BUILD_DIR=str(build), PYTHONPATH=str(REPO / "tools" / "mallard" / "src"))
    return env


def write(build: Path, only: str | None = None) -> None:
    """Refreshes every example's output in docs/CLI.md from a real run in the repository root (only: just the
    blocks whose first command contains that text)."""
    text = DOC.read_text()
    lines = text.splitlines()
    for block in reversed(parse(text)):
        if only is not None and only not in block.examples[0].command:
            continue
        got = run_block(block, REPO, environment(build))
        body = []
        for ex in got:
            body.append(f"$ {ex.command}")
            if not silent(ex.command):
                body.extend(ex.output)
                body.append(f"[exit status {ex.status}]")
        lines[block.start + 1:block.end] = body
    DOC.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--write"] or len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--only"):
        sys.exit("usage: doc_examples.py --write [--only TEXT]   (TEXT: in the first command of the blocks to refresh; "
                 "MALLARD_BUILD_DIR: the build to run; default build/)")
    write(Path(os.environ.get("MALLARD_BUILD_DIR", REPO / "build")).resolve(),
          sys.argv[3] if len(sys.argv) == 4 else None)
