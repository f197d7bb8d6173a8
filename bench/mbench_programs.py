"""Real programs for the benchmark suite: redis-server driven by redis-benchmark on 127.0.0.1, with RSS read from /proc."""
from __future__ import annotations

import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import time

# Debian's redis-server links libjemalloc.so.2; preloading glibc's own libc puts glibc's malloc ahead of it,
# so the "glibc" row really measures glibc and not the jemalloc that redis would otherwise use.
LIBC_FOR_REDIS = "/lib/x86_64-linux-gnu/libc.so.6"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_status_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def proc_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a live process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14 and 15 of stat)


def _cli(port: int, *args: str, timeout: float = 10) -> str:
    r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args], capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"redis-cli {' '.join(args)} failed: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip()


def redis_available() -> str | None:
    """None when redis-server and redis-benchmark are installed, else what is missing."""
    missing = [p for p in ("redis-server", "redis-benchmark", "redis-cli") if not shutil.which(p)]
    return ", ".join(missing) + " not installed (apt-get install redis-server redis-tools)" if missing else None


def run_redis(env: dict, requests: int, keyspace: int, value_size: int, settle_s: float = 0.5,
              timeout: float = 120) -> dict:
    """Starts redis-server under env, loads it with redis-benchmark, reads RSS, flushes, reads RSS again, stops it.

    Returns wall_s (benchmark time), cpu_s and max_rss_kib of the server, and the workload figures; raises
    RuntimeError when the server dies or a step fails. The server is always stopped.
    """
    port = free_port()
    srv_env = dict(env)
    if "LD_PRELOAD" not in srv_env:
        srv_env["LD_PRELOAD"] = LIBC_FOR_REDIS
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
           "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning"]
    proc = subprocess.Popen(cmd, env=srv_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {proc.returncode}: {proc.stdout.read().decode()[-500:]}")
            try:
                if _cli(port, "PING", timeout=2) == "PONG":
                    break
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING within 10 s")
            time.sleep(0.05)
        rss_start = proc_status_kib(proc.pid, "VmRSS")
        cpu0 = proc_cpu_s(proc.pid)
        bench = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-n", str(requests), "-c", "16", "-P", "8",
                 "-d", str(value_size), "-r", str(keyspace), "-t", "set,get,incr,lpush,lpop,sadd,hset,mset", "--csv"]
        t0 = time.perf_counter()
        b = subprocess.run(bench, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        if b.returncode != 0 or proc.poll() is not None:
            raise RuntimeError(f"redis-benchmark failed (rc {b.returncode}, server "
                               f"{'alive' if proc.poll() is None else 'exited ' + str(proc.returncode)}): "
                               f"{b.stderr.strip()[-300:]}")
        rps = {}
        for row in csv.reader(io.StringIO(b.stdout)):
            if len(row) >= 2 and row[0] != "test":
                try:
                    rps[row[0].split()[0].lower()] = float(row[1])
                except ValueError:
                    pass
        if len(rps) < 8:
            raise RuntimeError(f"redis-benchmark output not understood: {b.stdout[-300:]}")
        # Loaded data must really be there: a wrong answer is a failure, not a time.
        keys = int(_cli(port, "DBSIZE"))
        if keys <= 0:
            raise RuntimeError("redis holds no keys after the benchmark")
        time.sleep(settle_s)
        rss_loaded = proc_status_kib(proc.pid, "VmRSS")
        _cli(port, "FLUSHALL")
        time.sleep(settle_s)
        rss_flushed = proc_status_kib(proc.pid, "VmRSS")
        if int(_cli(port, "DBSIZE")) != 0:
            raise RuntimeError("FLUSHALL left keys behind")
        cpu = proc_cpu_s(proc.pid) - cpu0
        hwm = proc_status_kib(proc.pid, "VmHWM")
        total_req = requests * len(rps)
        return {"wall_s": wall, "cpu_s": cpu, "max_rss_kib": hwm,
                "metrics": {"requests_per_s": total_req / wall, "rss_start_kib": rss_start,
                            "rss_loaded_kib": rss_loaded, "rss_flushed_kib": rss_flushed, "keys_loaded": keys,
                            **{f"rps_{k}": v for k, v in rps.items()}}}
    finally:
        if proc.poll() is None:
            try:
                _cli(port, "SHUTDOWN", "NOSAVE", timeout=5)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.stdout:
            proc.stdout.close()
