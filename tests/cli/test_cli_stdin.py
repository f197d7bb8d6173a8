"""`mallard bench` (and `profile --overhead`) give every run the same standard input: the redirected one, or --stdin."""
from __future__ import annotations

import json
import subprocess
import sys

COUNT = ["sh", "-c", 'printf "bytes=%s\\n" "$(wc -c)"']


def run_with_stdin(mallard, args, stdin_file):
    with open(stdin_file, "rb") as f:
        return subprocess.run([sys.executable, "-m", "mallard_cli", *args], env=mallard.env, stdin=f,
                              capture_output=True, text=True, timeout=300)


def metrics(js):
    data = json.loads(js.read_text())
    return {a["name"]: a["metrics"] for a in data["allocators"]}


def test_redirected_input_reaches_every_run(mallard, tmp_path):
    data = tmp_path / "in.sql"
    data.write_bytes(b"select 1;\n" * 12345)
    js = tmp_path / "b.json"
    r = run_with_stdin(mallard, ["bench", "-a", "glibc,mallard", "-n", "3", "--warmup", "1", "--metric-from-output",
                                 r"bytes=(\d+)", "--json", str(js), "--", *COUNT], data)
    assert r.returncode == 0, r.stderr
    for name, vals in metrics(js).items():
        assert vals == [123450.0] * 3, (name, vals)


def test_stdin_option_and_pipe(mallard, tmp_path):
    data = tmp_path / "in.txt"
    data.write_bytes(b"x" * 777)
    js = tmp_path / "b.json"
    r = mallard("bench", "-a", "glibc", "-n", "2", "--warmup", "0", "--stdin", str(data), "--metric-from-output",
                r"bytes=(\d+)", "--json", str(js), "--", *COUNT)
    assert r.returncode == 0, r.stderr
    assert metrics(js)["glibc"] == [777.0, 777.0]
    # Through a pipe, read once and replayed.
    p = subprocess.run(f"head -c 4242 /dev/zero | {sys.executable} -m mallard_cli bench -a glibc -n 2 --warmup 1 "
                       f"--metric-from-output 'bytes=([0-9]+)' --json {js} -- sh -c 'printf \"bytes=%s\\n\" \"$(wc -c)\"'",
                       shell=True, env=mallard.env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert metrics(js)["glibc"] == [4242.0, 4242.0]


def test_no_input_from_devnull_and_bad_stdin_file(mallard, tmp_path):
    js = tmp_path / "b.json"
    r = mallard("bench", "-a", "glibc", "-n", "1", "--warmup", "0", "--metric-from-output", r"bytes=(\d+)",
                "--json", str(js), "--", *COUNT)
    assert r.returncode == 0 and metrics(js)["glibc"] == [0.0], r.stderr
    r = mallard("bench", "--stdin", str(tmp_path / "missing"), "--", "true")
    assert r.returncode == 2 and "--stdin" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr


def test_profile_overhead_replays_the_input(mallard, tmp_path):
    data = tmp_path / "in.txt"
    data.write_bytes(b"y" * 1000)
    out = tmp_path / "o.json"
    # The program fails unless it reads exactly the 1000 bytes: every round must get them.
    r = run_with_stdin(mallard, ["profile", "--overhead", "-n", "2", "-o", str(out), "--", "sh", "-c",
                                 'test "$(wc -c)" = 1000'], data)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(out.read_text())["with"]) == 2
