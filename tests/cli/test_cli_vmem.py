"""`mallard vmem`: glibc's per-thread arena reservations are found and explained; other allocators have none."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

# glibc allows 8 arenas per core, the main arena included: with fewer cores, fewer than 10 threads get their own.
EXPECTED_ARENAS = min(10, 8 * (os.cpu_count() or 1) - 1)


def vmem_of(mallard, prog, tmp_path, alloc: str) -> tuple[subprocess.CompletedProcess, dict]:
    js = tmp_path / f"{alloc}.json"
    r = mallard("vmem", "-a", alloc, "--ready", "^ready", "--json", str(js), "--", prog("arenas"))
    assert r.returncode == 0, r.stderr
    return r, json.loads(js.read_text())


def test_vmem_finds_glibc_arena_reservations(mallard, prog, tmp_path):
    r, data = vmem_of(mallard, prog, tmp_path, "glibc")
    arenas = data["glibc_arena_heaps"]
    assert len(arenas) >= EXPECTED_ARENAS
    for a in arenas:
        assert a["start"] % (64 << 20) == 0
        assert a["accessible"] + a["reserved"] == 64 << 20
        assert a["accessible"] < 4 << 20  # one malloc(8) touches little of the 64 MiB
    assert data["kinds"]["reserved"]["virt"] >= EXPECTED_ARENAS * (60 << 20)
    assert data["kinds"]["thread-stack"]["count"] >= 10
    assert data["allocator"]["allocator"] == "glibc"
    text = r.stdout
    assert "glibc per-thread arenas" in text and "MALLOC_ARENA_MAX" in text and "64 MiB" in text
    assert "reserved, inaccessible (PROT_NONE)" in text


@pytest.mark.parametrize("name", ["mallard", "jemalloc", "mimalloc", "tcmalloc"])
def test_vmem_other_allocators_have_no_glibc_arenas(mallard, prog, allocators, need, tmp_path, name):
    need(allocators, name)
    r, data = vmem_of(mallard, prog, tmp_path, name)
    assert data["glibc_arena_heaps"] == []
    assert data["allocator"]["allocator"] == name
    assert "No glibc per-thread arena reservations" in r.stdout
    assert data["kinds"]["thread-stack"]["count"] >= 10


def test_vmem_arena_max_removes_the_reservations(mallard, prog, tmp_path):
    js = tmp_path / "v.json"
    r = mallard("vmem", "--ready", "^ready", "--json", str(js), "--", prog("arenas"), env={"MALLOC_ARENA_MAX": "1"})
    assert r.returncode == 0, r.stderr
    assert json.loads(js.read_text())["glibc_arena_heaps"] == []


def test_vmem_of_a_running_pid(mallard, prog):
    p = subprocess.Popen([prog("arenas"), "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().startswith("ready")
        r = mallard("vmem", str(p.pid))
        assert r.returncode == 0, r.stderr
        assert f"PID {p.pid}" in r.stdout
        assert "glibc arena heaps" in r.stdout
        assert "executable and libraries" in r.stdout
    finally:
        p.kill()
        p.wait()
