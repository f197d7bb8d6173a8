"""Threaded file reader: 2 threads each start 5 threads that read one large file line by line (run with and without PYTHONMALLOC=malloc)."""
import argparse
import json
import os
import sys
import threading
import time


def make_file(path, size_mb):
    """Writes a deterministic text file of about size_mb MiB (lines of varying length) unless it already exists."""
    if os.path.exists(path) and os.path.getsize(path) >= size_mb * (1 << 20):
        return
    # The folder may be missing on a fresh machine (a fresh TMPDIR): create it, never rely on a leftover.
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    target = size_mb * (1 << 20)
    written = 0
    i = 0
    with open(tmp, "w") as f:
        while written < target:
            line = f"{i:09d} " + "abcdefghijklmnopqrstuvwxyz0123456789"[: 8 + i % 29] * (1 + i % 7) + "\n"
            f.write(line)
            written += len(line)
            i += 1
    os.replace(tmp, path)  # atomic, so concurrent runs never read a half-written file


def read_lines(path, out, idx):
    lines = 0
    chars = 0
    words = set()
    with open(path) as f:
        for line in f:
            lines += 1
            chars += len(line)
            # Keep a little per-line state alive, as a log parser would.
            if lines % 97 == 0:
                words.add(line[:16])
    out[idx] = (lines, chars, len(words))


def outer(path, inner, out, base):
    ts = [threading.Thread(target=read_lines, args=(path, out, base + k)) for k in range(inner)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--file", required=True, help="text file to read (created when missing)")
    ap.add_argument("--size-mb", type=int, default=20)
    ap.add_argument("--outer", type=int, default=2)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--generate-only", action="store_true", help="create the file and exit (outside any timing)")
    a = ap.parse_args()
    make_file(a.file, a.size_mb)
    if a.generate_only:
        return 0
    with open(a.file, "rb") as f:
        expected_lines = f.read().count(b"\n")
    out = [None] * (a.outer * a.inner)
    t0 = time.perf_counter()
    ts = [threading.Thread(target=outer, args=(a.file, a.inner, out, k * a.inner)) for k in range(a.outer)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    secs = time.perf_counter() - t0
    # Every reader must have seen the same, complete file.
    if any(r is None or r != out[0] or r[0] != expected_lines for r in out):
        print(f"pyreader: readers disagree: {out} (expected {expected_lines} lines)", file=sys.stderr)
        return 3
    res = {"workload": "pyreader", "threads": a.outer * a.inner, "size_mb": a.size_mb, "ops": out[0][0] * len(out),
           "seconds": round(secs, 6), "lines": out[0][0], "pythonmalloc": os.environ.get("PYTHONMALLOC", "default")}
    print("RESULT " + json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
