"""Debian's redis-server (linked with libjemalloc) under LD_PRELOAD=libmallard.so: its mallctl calls reach Mallard.

INFO memory's allocator_* figures are Mallard's stats.* (they agree with Redis's own used_memory), and MEMORY PURGE
(Redis's arena.<narenas>.purge) makes Mallard give memory back. 127.0.0.1 only, every step bounded in time.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import redis_server
from conftest import BUILD, REPO

pytestmark = pytest.mark.skipif(not (shutil.which("redis-server") and shutil.which("redis-cli")),
                                reason="redis-server and redis-cli are not installed")


class Server(redis_server.Server):
    """Debian's redis-server on Mallard with `conf` as MALLARD_CONF and DEBUG allowed; cli() answers text."""

    def __init__(self, preload, tmp: Path, conf: str):
        super().__init__(tmp, env=preload.env(extra={"MALLARD_CONF": conf}), cli_env=None,
                         args=("--enable-debug-command", "local", "--activedefrag", "no"))

    def cli(self, *args, check=True, **kw):
        raw = "text" in kw   # the base class's own calls want the whole result
        kw.setdefault("text", True)
        r = super().cli(*args, check=check, timeout=60, **kw)
        return r if raw else r.stdout.strip()

    def info_memory(self) -> dict:
        return {k: v for k, v in re.findall(r"^(\w+):(\S+)", self.cli("INFO", "memory"), re.M)}

    def info_memory_after(self, at_least: int) -> dict:
        """INFO memory once its allocator_* figures reach `at_least` bytes: Redis refreshes them from its cron (every
        100 ms), so the INFO that follows a DEBUG POPULATE at once may still show the figures from before it."""
        deadline = time.monotonic() + 30
        while int((info := self.info_memory())["allocator_allocated"]) < at_least:
            assert time.monotonic() < deadline, f"allocator_allocated stayed at {info['allocator_allocated']}"
            time.sleep(0.05)
        return info

    def rss_kb(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1))


@pytest.fixture
def server(preload, tmp_path):
    # dirty_decay_ms:-1: Mallard never purges on its own, so only MEMORY PURGE can lower the RSS below.
    s = Server(preload, tmp_path, "dirty_decay_ms:-1")
    try:
        yield s
    finally:
        s.stop()


def mallard_stats(pid: int) -> dict:
    """Mallard's own statistics of the running server, read from its memory (`mallard stats --json PID`)."""
    env = dict(os.environ, MALLARD_BUILD_DIR=str(BUILD),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "tools" / "mallard" / "src"),
                                                       os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-m", "mallard_cli", "stats", "--json", str(pid)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["mallard"]["stats"]


def test_redis_info_memory_matches_mallards_own_statistics(server):
    """100k keys of ~200 bytes: INFO memory's allocator_* are Mallard's own figures (read live from the process
    by `mallard stats`), within 10%; MEMORY MALLOC-STATS is Mallard's report."""
    assert server.cli("DEBUG", "POPULATE", "100000", "key", "200") == "OK"
    info = server.info_memory_after(20 << 20)
    own = mallard_stats(server.proc.pid)
    for redis_key, ours in (("allocator_allocated", "allocated"), ("allocator_active", "active"),
                            ("allocator_resident", "resident")):
        value = int(info[redis_key])
        assert value > 20 << 20, f"{redis_key} {value}: not the figures of a server holding 100k keys"
        assert abs(value - own[ours]) <= own[ours] // 10, f"{redis_key} {value} vs Mallard's {ours} {own[ours]}"
    report = server.cli("MEMORY", "MALLOC-STATS")
    assert "Mallard statistics" in report and "jemalloc" not in report.split("\n", 1)[0], report[:300]


def test_redis_info_memory_and_purge_reach_mallard(server):
    assert "/libmallard.so" in Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert server.cli("DEBUG", "POPULATE", "200000", "key", "256") == "OK"   # about 60 MB
    info = server.info_memory_after(50 << 20)
    allocated, active, resident = (int(info[k]) for k in ("allocator_allocated", "allocator_active",
                                                          "allocator_resident"))
    used = int(info["used_memory"])
    # jemalloc, linked but unused, would answer a few MB at most: these are Mallard's stats.allocated/active/resident.
    assert used > 50 << 20, info
    assert abs(allocated - used) <= used // 10, f"allocator_allocated {allocated} vs used_memory {used}"
    assert allocated <= active <= resident, info

    # ASYNC: a synchronous FLUSHALL purges by itself (Redis calls jemalloc_purge after it); the lazy-free thread
    # frees the data without purging.
    assert server.cli("FLUSHALL", "ASYNC") == "OK"
    deadline = time.monotonic() + 30
    while int(server.info_memory().get("lazyfree_pending_objects", "0")) or int(server.cli("DBSIZE")):
        assert time.monotonic() < deadline, "the lazy free did not finish"
        time.sleep(0.05)
    time.sleep(0.3)
    before = server.rss_kb()
    assert before > 40_000, f"RSS {before} KiB after FLUSHALL: nothing left to purge, the test cannot tell"
    assert server.cli("MEMORY", "PURGE") == "OK"
    after = server.rss_kb()
    assert after < before - 30_000, f"MEMORY PURGE did not make Mallard purge: RSS {before} KiB -> {after} KiB"
    after_info = server.info_memory()
    assert int(after_info["allocator_allocated"]) < allocated // 4, after_info
