"""Verdicts only beyond noise: a winner is named only when its runs beat every other's; ratios carry their range."""
from __future__ import annotations

import json
import re


def test_no_winner_within_noise(mallard, tmp_path):
    js = tmp_path / "b.json"
    r = mallard("bench", "-a", "glibc,mallard", "-n", "3", "--warmup", "0", "--json", str(js), "--", "sleep", "0.2")
    assert r.returncode == 0, r.stderr
    assert "Fastest: no measurable difference" in r.stdout, r.stdout
    assert json.loads(js.read_text())["verdict"]["fastest"] is None
    # Every ratio shows the range the runs allow.
    rows = [l for l in r.stdout.splitlines() if l.startswith("│ mallard")]
    assert rows and re.search(r"\d\.\d\dx \(\d\.\d\d–\d\.\d\d\)", rows[0]), r.stdout


def test_winner_beyond_noise(mallard, tmp_path):
    # The same program, made clearly slower when Mallard is preloaded: glibc is named, with the reason.
    slow = 'case "$LD_PRELOAD" in *mallard*) sleep 0.4;; *) sleep 0.05;; esac'
    js = tmp_path / "b.json"
    r = mallard("bench", "-a", "glibc,mallard", "-n", "3", "--warmup", "0", "--json", str(js), "--", "sh", "-c", slow)
    assert r.returncode == 0, r.stderr
    assert "Fastest: glibc" in r.stdout, r.stdout
    assert json.loads(js.read_text())["verdict"]["fastest"] == "glibc"


def test_overhead_within_noise(mallard, tmp_path):
    r = mallard("profile", "--overhead", "-n", "3", "--", "sleep", "0.2")
    assert r.returncode == 0, r.stderr
    assert "no measurable difference" in r.stdout, r.stdout
    assert "ratio range" in r.stdout
