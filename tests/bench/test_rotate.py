"""Tests of bench/rotate.py (paired comparisons in rotated rounds): the ratios to the first library, the rotation of
the order, and the refusals (a figure not found, a bad library, options for a library that cannot read them)."""
import os
import subprocess
import sys

from test_bench_smoke import REPO

ROTATE = [sys.executable, str(REPO / "bench" / "rotate.py")]

# Prints a figure that doubles under the "other" library and logs which library ran, in order.
PROG = """import os, sys
lib = 'other' if 'libother' in os.environ.get('LD_PRELOAD', '') else 'base'
open(sys.argv[1], 'a').write(lib + '\\n')
print('rate = %d per s' % (200 if lib == 'other' else int(os.environ.get('BASE_RATE', '100'))))
"""


def _setup(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    other = tmp_path / "libother.so"
    other.write_text("not an ELF file\n")   # the loader says it cannot preload it and runs the program
    return prog, other


def _run(tmp_path, *args, **env):
    return subprocess.run([*ROTATE, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=dict(os.environ, **env))


def test_ratios_to_the_first_library_in_rotated_rounds(tmp_path):
    prog, other = _setup(tmp_path)
    log = tmp_path / "log"
    r = _run(tmp_path, "--rounds", "4", "--metric", r"rate = ([0-9.]+)", "--lib", "base=", "--lib", f"other={other}",
             "--json", str(tmp_path / "raw.json"), "--", sys.executable, str(prog), str(log))
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines()}
    assert "x1.000 (IQR 1.000-1.000)" in lines["base"]
    assert "figure 200  x2.000 (IQR 2.000-2.000)" in lines["other"]
    # round 1 starts with the first library, round 2 with the second, and so on
    assert log.read_text().split() == ["base", "other", "other", "base", "base", "other", "other", "base"]
    assert (tmp_path / "raw.json").exists()


def test_a_figure_not_found_stops_with_the_output(tmp_path):
    prog, other = _setup(tmp_path)
    r = _run(tmp_path, "--rounds", "1", "--metric", r"speed = ([0-9.]+)", "--lib", "base=", "--lib",
             f"other={other}", "--", sys.executable, str(prog), str(tmp_path / "log"))
    assert r.returncode == 1
    assert "no match for --metric" in r.stderr and "rate = 100" in r.stderr


def test_a_first_figure_of_zero_is_said_not_divided_by(tmp_path):
    prog, other = _setup(tmp_path)
    r = _run(tmp_path, "--rounds", "2", "--metric", r"rate = ([0-9.]+)", "--lib", "base=", "--lib", f"other={other}",
             "--", sys.executable, str(prog), str(tmp_path / "log"), BASE_RATE="0")
    assert r.returncode == 1 and "base's figure is 0 in round 1" in r.stderr, r.stderr


def test_bad_libraries_and_options_are_refused(tmp_path):
    prog, other = _setup(tmp_path)
    cmd = ["--", sys.executable, str(prog), str(tmp_path / "log")]
    for libs, said in ((["--lib", "base="], "two libraries at least"),
                       (["--lib", "base=", "--lib", "x=/no/such.so"], "no such file"),
                       (["--lib", "base=", "--lib", "base=none"], "a name of its own"),
                       (["--lib", "base=@thp:always", "--lib", f"other={other}"], "MALLARD_CONF")):
        r = _run(tmp_path, "--metric", "wall", *libs, *cmd)
        assert r.returncode == 2 and said in r.stderr, (libs, r.stderr)
    assert not (tmp_path / "log").exists()   # nothing ran
