"""Man pages: they render without groff warnings, and mallard(1) names every subcommand the command has."""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
MAN = REPO / "docs" / "man"
PAGES = ["mallard.1", "libmallard.3", "mallard.conf.5"]


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_cleanly(page):
    assert shutil.which("groff"), "groff is missing (scripts/apt-packages.txt installs groff-base)"
    r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(MAN / page)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_mallard_1_covers_every_subcommand():
    r = subprocess.run([sys.executable, "-m", "mallard_cli", "--help"], capture_output=True, text=True,
                       env=dict(os.environ, COLUMNS="200"))
    assert r.returncode == 0, r.stderr
    listed = re.search(r"\{([a-z,]+)\}", r.stdout)
    commands = listed.group(1).split(",") if listed else re.findall(r"^    ([a-z]+) ", r.stdout, re.M)
    assert len(commands) >= 5, r.stdout
    page = (MAN / "mallard.1").read_text()
    missing = [c for c in commands if not re.search(rf"^\.TP\n\.B {c}$", page, re.M)]   # its own paragraph
    assert not missing, f"mallard.1 does not describe: {missing}"


def test_options_page_covers_every_option():
    """Every option of docs/OPTIONS.md has its entry in mallard.conf(5)."""
    options = re.findall(r"^\| `([a-z_]+)` \|", (REPO / "docs" / "OPTIONS.md").read_text(), re.M)
    assert len(options) >= 10
    page = (MAN / "mallard.conf.5").read_text()
    missing = [o for o in options if not re.search(rf"^\.BR {o} ", page, re.M)]
    assert not missing, f"mallard.conf.5 lacks: {missing}"
