"""Workload of `mallard demo`: 2 threads each start 5 threads that read one large file line by line; prints the elapsed time.

Modelled on the threaded file-reader example of the distribution malloc guides: the file is made first (not timed),
then only the thread start-up and the reading are timed.
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import threading
import time


def make_file(path: str, size_mb: float, seed: int = 1) -> int:
    """Writes about size_mb MiB of symbol-table-like lines (address, type, name) of varied length; returns its size.

    One MiB of random lines is made and written again with shifted addresses, so making the file stays fast.
    """
    rng = random.Random(seed)
    kinds = "TtDdBbRrWw"
    parts = ["init", "exit", "alloc", "free", "page", "cache", "sched", "irq", "net", "vfs", "mm", "lock", "dev",
             "read", "write", "core", "map", "slab", "task", "timer"]
    lines = []
    block = 0
    addr = 0
    while block < (1 << 20):
        addr += rng.randrange(16, 4096)
        name = "_".join(rng.choice(parts) for _ in range(rng.randrange(1, 6)))
        lines.append((addr, f" {rng.choice(kinds)} {name}\n"))
        block += 17 + len(lines[-1][1])
    target = int(size_mb * (1 << 20))
    written = 0
    base = 0xFFFFFFFF81000000
    with open(path, "w") as f:
        while written < target:
            chunk = "".join(f"{base + a:016x}{rest}" for a, rest in lines)
            f.write(chunk)
            written += len(chunk)
            base += addr
    return written


def read_file(path: str) -> None:
    with open(path) as f:
        for _line in f:
            pass


def spawn(n: int, target, args: tuple) -> None:
    threads = [threading.Thread(target=target, args=args) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=50.0, help="size of the temporary file (default 50)")
    ap.add_argument("--outer", type=int, default=2, help="threads that each start --inner readers (default 2)")
    ap.add_argument("--inner", type=int, default=5, help="reader threads per outer thread (default 5)")
    ap.add_argument("--file", help="read this existing file instead of making a temporary one")
    args = ap.parse_args(argv)
    tmp = None
    path = args.file
    if path is None:
        fd, tmp = tempfile.mkstemp(prefix="mallard-reader-", suffix=".txt")
        os.close(fd)
        path = tmp
        make_file(path, args.size_mb)
    try:
        t0 = time.perf_counter()
        spawn(args.outer, spawn, (args.inner, read_file, (path,)))
        elapsed = time.perf_counter() - t0
    finally:
        if tmp:
            os.unlink(tmp)
    print(f"elapsed: {elapsed:.6f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
