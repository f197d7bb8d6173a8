"""User strings never reach a markup or math parser raw: arguments full of $ [ ] % \\ and non-UTF-8 bytes."""
from __future__ import annotations

import os
import subprocess
import sys

NASTY = ["$h{\"k$i\"}++ for 1..10", "a $x^^$ b", "[/]", "[bold]x[/bold]", "%s%d%%", "\\", "a$b$c", "[red"]


def run(mallard, *args, timeout=300):
    argv = [os.fsencode(sys.executable), b"-m", b"mallard_cli", *[a if isinstance(a, bytes) else os.fsencode(a)
                                                                     for a in args]]
    return subprocess.run(argv, env=mallard.env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def no_crash(r):
    err = r.stderr.decode(errors="replace")
    assert "Traceback" not in err and "MarkupError" not in err and "ParseFatal" not in err, err
    return err


def test_bench_and_plot_with_nasty_arguments(mallard, tmp_path):
    png = tmp_path / "b.png"
    js = tmp_path / "b.json"
    r = run(mallard, "bench", "-a", "glibc,mallard", "-n", "1", "--warmup", "0", "--plot", str(png), "--json",
            str(js), "--", "sh", "-c", "exit 0", *NASTY, b"\xff\xfe-not-utf8")
    no_crash(r)
    assert r.returncode == 0
    out = r.stdout.decode()
    assert "[/]" in out and "$h{" in out and "\\xff" in out, out
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_profile_run_vmem_with_nasty_arguments(mallard, tmp_path):
    r = run(mallard, "profile", "--", "sh", "-c", "exit 0", *NASTY, b"\xff")
    no_crash(r)
    assert r.returncode == 0 and "[/]" in r.stdout.decode()
    r = run(mallard, "profile", "--overhead", "-n", "1", "--", "sh", "-c", "exit 0", *NASTY)
    no_crash(r)
    assert r.returncode == 0
    r = run(mallard, "run", "-v", "--", "sh", "-c", "exit 3", *NASTY)
    no_crash(r)
    assert r.returncode == 3
    r = run(mallard, "vmem", "--ready", "^ready", "--", "sh", "-c", "echo ready; sleep 5", *NASTY, b"\xff")
    no_crash(r)
    assert r.returncode == 0 and "[/]" in r.stdout.decode()


def test_errors_with_nasty_names(mallard, tmp_path):
    for args in (["run", "--", "/no/such/[/]$x$"], ["bench", "-a", "[/]", "--", "true"],
                 ["run", "-a", "/etc/[bold]/x.so", "--", "true"]):
        r = run(mallard, *args)
        err = no_crash(r)
        assert r.returncode != 0 and len(err.strip().splitlines()) == 1, err
        assert "[/]" in err or "[bold]" in err, err
