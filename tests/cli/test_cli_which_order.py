"""`mallard which`/`vmem` name the allocator that serves malloc (the loader's order), not the first one mapped."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cc import build


def start(mallard, argv):
    p = subprocess.Popen(argv, env=mallard.env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("ready")
    return p


@pytest.fixture
def jemalloc(allocators, need):
    return need(allocators, "jemalloc").path


def which(mallard, pid):
    r = mallard("which", "--json", str(pid))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_preloaded_mallard_over_a_linked_jemalloc(mallard, tmp_path, jemalloc):
    exe = build("linked_wait", tmp_path, jemalloc)
    # Linked alone: jemalloc serves malloc.
    p = start(mallard, [exe])
    try:
        assert which(mallard, p.pid)["allocator"] == "jemalloc"
    finally:
        p.kill()
        p.wait()
    # Mallard preloaded in front of the linked jemalloc: Mallard serves every call (jemalloc is mapped too).
    p = start(mallard, [sys.executable, "-m", "mallard_cli", "run", "-a", "mallard", "--", exe])
    try:
        w = which(mallard, p.pid)
        assert w["allocator"] == "mallard", w
        assert any("jemalloc" in lib for lib in w["libraries"]), w
        text = " ".join(mallard("which", str(p.pid)).stdout.split())  # as text: long paths wrap the report
        assert "preloaded" in text and "behind it" in text, text
        v = mallard("vmem", "--json", str(tmp_path / "v.json"), str(p.pid))
        assert v.returncode == 0, v.stderr
        assert "allocator: mallard" in " ".join(v.stdout.split())
        assert json.loads((tmp_path / "v.json").read_text())["allocator"]["allocator"] == "mallard"
    finally:
        p.kill()
        p.wait()


def test_dlopened_allocator_does_not_serve_malloc(mallard, tmp_path, allocators):
    # Mallard's own library: it can be dlopened (jemalloc's static TLS cannot) and maps like any allocator.
    lib = next(a.path for a in allocators if a.name == "mallard")
    exe = build("dlopen_wait", tmp_path, "-ldl")
    p = start(mallard, [exe, lib])
    try:
        w = which(mallard, p.pid)
        assert w["allocator"] == "glibc", w
        assert "dlopen" in w["reason"]
    finally:
        p.kill()
        p.wait()
