"""Every example session of docs/CLI.md still runs and still has the documented shape: same exit status, the same
first line (numbers, paths and table contents aside) and the same labelled lines (`Fastest:`, `mallard:`, …)."""
from __future__ import annotations

import re
import shutil

import pytest
from doc_examples import DOC, environment, parse, run_block, silent

BLOCKS = parse(DOC.read_text())
BOX = re.compile(r"[│┃┏┓┗┛┡┩└┘┌┐━─┳┻╇╈┼├┤╋]")
PATH = re.compile(r"(/[\w.+-]+)+/?|(?<!\w)build/[\w./+-]+")


def skeleton(line: str) -> str:
    """A line without what varies between runs and machines: numbers, paths, table borders, spacing."""
    s = PATH.sub("P", line)
    s = re.sub(r"\d[\d,.]*", "9", s)
    s = BOX.sub(" ", s)
    return " ".join(s.split())


def label(line: str) -> str | None:
    """The label a line starts with (`Fastest:`, `mallard:`, `Step 1:`, `Plot:`), if any."""
    m = re.match(r"^\s*([A-Z][\w ]{0,30}?|mallard(?: \w+)?|\d+\.|   - |   try):", line)
    return m.group(1) if m else None


def first_line(lines: list[str]) -> str | None:
    for line in lines:
        if line.strip() and not BOX.match(line.strip()[:1]):
            return line
    return None


def test_every_documented_command_has_output(tmp_path):
    assert len(BLOCKS) >= 10
    for block in BLOCKS:
        for ex in block.examples:
            if not silent(ex.command):
                assert ex.status is not None, f"{ex.command}: no [exit status N] documented"


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=lambda i: BLOCKS[i].examples[0].command[:40])
def test_documented_examples_still_hold(index, tmp_path, build):
    block = BLOCKS[index]
    if any(ex.command.startswith("musl-gcc ") for ex in block.examples) and shutil.which("musl-gcc") is None:
        pytest.skip("musl-gcc is not installed (Debian package musl-tools): the musl example cannot be built")
    (tmp_path / "build").symlink_to(build)  # the examples name build/... relative to the repository root
    (tmp_path / "tests").symlink_to(DOC.parent.parent / "tests")
    # A terminal wide enough that a checkout deep in a long path does not wrap (nor fold) the report's paths.
    got = run_block(block, tmp_path, dict(environment(build), COLUMNS="1000"), tmp=tmp_path)
    for doc, real in zip(block.examples, got):
        if silent(doc.command):
            continue
        where = f"`{doc.command}`:\n" + "\n".join(real.output)
        assert real.status == doc.status, where
        # The real output is compared as text, not as line layout: a checkout deep in a long path makes the report
        # wrap where the documented run did not, so the first line is read on into the lines that continue it.
        d_first, r_first = first_line(doc.output), first_line(real.output)
        if d_first is not None:
            assert r_first is not None, where
            d_key = skeleton(d_first).split(":")[0]
            r_text = skeleton(" ".join(real.output[real.output.index(r_first):]))
            # The same words up to the first colon (or the whole first line), then a colon, a space or the end.
            assert r_text.startswith(d_key) and r_text[len(d_key):][:1] in ((":",) if ":" in d_first else ("", " ")), \
                where
        doc_labels = {label(l) for l in doc.output} - {None}
        if shutil.which("musl-gcc") is None:  # `mallard list` names musl's allocators only where musl is installed
            doc_labels = {l for l in doc_labels if "musl" not in l}
        real_labels = {label(l) for l in real.output} - {None}
        assert doc_labels <= real_labels, f"{where}\nmissing: {doc_labels - real_labels}"
        # Error lines (one line each) are compared whole, numbers and paths aside.
        for line in doc.output:
            if line.startswith("mallard: ") and len(doc.output) == 1:
                assert skeleton(line) == skeleton(" ".join(real.output)), where
