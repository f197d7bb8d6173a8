"""`mallard which` names the allocator the process really resolved (the malloc slot of its GOT, read from its memory),
also when the process wrote over its environment (setproctitle), so /proc/PID/environ shows no LD_PRELOAD."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
from cc import build


def which(mallard, pid):
    r = mallard("which", "--json", str(pid), timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def start(argv, env):
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert p.stdout.readline().startswith("ready")
    return p


def stop(p):
    p.kill()
    p.wait(timeout=30)


@pytest.fixture
def libmallard(allocators):
    return next(a.path for a in allocators if a.name == "mallard")


@pytest.mark.parametrize("flags", [[], ["-no-pie"], ["-Wl,-z,now"]], ids=["pie", "no-pie", "bind-now"])
def test_preloaded_mallard_in_a_process_that_wiped_its_environment(mallard, tmp_path, libmallard, flags):
    exe = build("title_wait", tmp_path, *flags)
    p = start([exe, "30"], dict(mallard.env, LD_PRELOAD=libmallard))
    try:
        with open(f"/proc/{p.pid}/environ", "rb") as f:
            assert b"LD_PRELOAD" not in f.read()  # the premise: the environment is gone
        w = which(mallard, p.pid)
        assert w["allocator"] == "mallard", w
        assert w["method"] == "got", w
        assert os.path.realpath(w["slot"]["target"]) == os.path.realpath(libmallard), w
        assert w["slot"]["object"] == exe, w
        assert w["ld_preload"] is None
        # Compared as text, not as line layout: the report wraps long paths (a checkout deep in a private folder).
        text = " ".join(mallard("which", str(p.pid)).stdout.split())
        assert "mallard" in text and "preloaded" in text and "malloc slot" in text, text
        assert "written over its environment" in text, text
    finally:
        stop(p)


def test_plain_glibc_process(mallard, tmp_path):
    exe = build("title_wait", tmp_path)
    p = start([exe, "30"], mallard.env)
    try:
        w = which(mallard, p.pid)
        assert w["allocator"] == "glibc", w
        assert w["method"] == "got", w
        assert "libc.so" in w["slot"]["target"], w
    finally:
        stop(p)


def test_lazily_bound_slot_falls_back_to_libc(mallard, tmp_path, libmallard):
    # A program that imports malloc but has not called it yet: with lazy binding its own slot still points into its
    # PLT; libc's GLOB_DAT slot (bound at start) decides, and the output says so.
    src = tmp_path / "nomalloc.c"
    src.write_text('#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n'
                   'int main(int c, char **v) { if (c > 5) free(malloc(1)); puts("ready"); fflush(stdout); '
                   'sleep(30); return 0; }\n')
    out = tmp_path / "nomalloc"
    subprocess.run([shutil.which("cc"), "-O1", "-fno-builtin", "-Wl,-z,lazy", "-o", str(out), str(src)], check=True,
                   timeout=120)
    p = start([str(out)], dict(mallard.env, LD_PRELOAD=libmallard))
    try:
        w = which(mallard, p.pid)
        assert w["allocator"] == "mallard", w
        assert w["method"] == "got", w
        assert "libc.so" in w["slot"]["object"], w
        assert "not bound yet" in w["reason"], w
    finally:
        stop(p)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis(argv_prefix, tmp_path, env):
    """Starts redis-server (on 127.0.0.1, a free port, no persistence) and waits until it accepts connections."""
    port = free_port()
    p = subprocess.Popen([*argv_prefix, "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", str(tmp_path)], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return p
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                stop(p)
                pytest.fail(f"redis-server did not start (exit {p.returncode})")
            time.sleep(0.1)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed (Debian package "
                    "redis-server)")
def test_redis_under_mallard_run(mallard, tmp_path):
    p = redis([sys.executable, "-m", "mallard_cli", "run", "-a", "mallard", "--"], tmp_path, mallard.env)
    try:
        w = which(mallard, p.pid)
        assert w["allocator"] == "mallard", w  # Redis's setproctitle hides LD_PRELOAD from /proc/PID/environ
        assert w["method"] == "got", w
    finally:
        stop(p)
    p = redis([], tmp_path, mallard.env)
    try:
        w = which(mallard, p.pid)
        assert w["allocator"] == "jemalloc", w
        assert w["method"] == "got", w
    finally:
        stop(p)


def test_unreadable_memory_is_said_and_the_order_decides(mallard, tmp_path, monkeypatch):
    from mallard_cli import gotslot, procinfo

    exe = build("title_wait", tmp_path)
    p = start([exe, "30"], mallard.env)
    try:
        def denied(*a, **k):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(gotslot.os, "open", denied)
        w = procinfo.which(p.pid)
        assert w.allocator == "glibc" and w.method == "loader-order", w
        assert "permission denied" in w.reason, w.reason
    finally:
        stop(p)
