"""redis-server under LD_PRELOAD=libmallard.so on 127.0.0.1: SET/GET round trips, redis-benchmark, clean shutdown."""
import hashlib
import re
import subprocess
from pathlib import Path

import pytest

import redis_server


class Server(redis_server.Server):
    """A redis-server on Mallard (statistics on); redis-cli runs on Mallard too."""

    def __init__(self, preload, tmp: Path):
        self.preload = preload
        super().__init__(tmp, env=preload.env(stats=True), cli_env=preload.env())


@pytest.fixture
def redis(preload, tmp_path):
    server = Server(preload, tmp_path)
    try:
        yield server
    finally:
        server.stop()


def test_redis_set_get_under_mallard(redis, preload):
    maps = Path(f"/proc/{redis.proc.pid}/maps").read_text()
    assert "/libmallard.so" in maps, "libmallard.so is not mapped into redis-server"

    assert redis.cli("SET", "greeting", "hello mallard", text=True).stdout.strip() == "OK"
    assert redis.cli("GET", "greeting", text=True).stdout == "hello mallard\n"
    # Values from a few bytes to 1 MiB: small, medium and large blocks on the server side.
    for n in (1, 100, 5000, 70_000, 300_000, 1 << 20):
        value = hashlib.sha256(str(n).encode()).hexdigest().encode() * (n // 64 + 1)
        value = value[:n]
        assert redis.cli("-x", "SET", f"blob:{n}", input=value).stdout.strip() == b"OK"
        got = redis.cli("--no-raw", "STRLEN", f"blob:{n}", text=True).stdout.strip()
        assert got == f"(integer) {n}"
        assert redis.cli("GET", f"blob:{n}").stdout == value + b"\n"
    for i in range(50):
        redis.cli("HSET", "h", *[x for k in range(i * 20, i * 20 + 20) for x in (f"f{k}", str(k * k))])
    assert redis.cli("HLEN", "h", text=True).stdout.strip() == "1000"
    assert redis.cli("HGET", "h", "f999", text=True).stdout.strip() == str(999 * 999)
    used = re.search(r"used_memory:(\d+)", redis.cli("INFO", "memory", text=True).stdout)
    assert used and int(used.group(1)) > 1 << 20

    assert redis.stop() == 0
    # The server's exit report: thousands of blocks, the 300 KiB and 1 MiB values among the large or huge ones.
    rep = preload.check_reports(preload.parse_reports(redis.stderr_path.read_text()), min_mallocs=5000)
    assert rep["stats"]["large"]["nmalloc"] + rep["stats"]["huge"]["nmalloc"] > 0


def test_redis_benchmark(redis, preload):
    bench = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(redis.port), "-n", "20000", "-q",
                            "-t", "set,get,lpush"], capture_output=True, text=True, timeout=120,
                           env=preload.env(), stdin=subprocess.DEVNULL)
    assert bench.returncode == 0, bench.stderr
    # -q prints progress lines ending in '\r', then one "NAME: N requests per second" per test.
    rates = {m.group(1): float(m.group(2))
             for m in re.finditer(r"(\w+): ([\d.]+) requests per second", bench.stdout)}
    assert set(rates) == {"SET", "GET", "LPUSH"}, bench.stdout
    assert all(v > 0 for v in rates.values()), rates
    # The benchmark's LPUSH test pushed all its requests onto one list.
    assert redis.cli("LLEN", "mylist", text=True).stdout.strip() == "20000"
    assert redis.cli("DBSIZE", text=True).stdout.strip() == "2"  # key:__rand_int__ and mylist
    assert redis.stop() == 0
    preload.check_reports(preload.parse_reports(redis.stderr_path.read_text()), min_mallocs=20_000)
