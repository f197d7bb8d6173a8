"""`mallard advise`: advice for each case from dumps of real runs of workloads built to trigger it, none when healthy."""
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
MALLARD = [sys.executable, "-m", "mallard_cli"]

# workload -> (MALLARD_CONF for the run, the advice it must trigger, a fragment of the suggested line)
CASES = {
    "contention": ("narenas:1,dirty_decay_ms:0", "Threads contend for arena locks", "MALLARD_CONF=narenas:"),
    "refills": ("", "go back and forth between threads and the arena", "slab_sizes:114688-114688:16"),
    "dirty": ("dirty_decay_ms:60000,background_thread:false", "Much freed memory stays resident",
              "background_thread:true"),
    "metadata": ("", "working set is tiny next to the allocator's own overhead", "MALLARD_CONF=narenas:1,page_cache:0"),
}
TITLES = [c[1] for c in CASES.values()]


def dump(build_dir, tmp_path, workload, conf):
    out = tmp_path / f"{workload}.json"
    env = {k: v for k, v in os.environ.items() if k != "MALLARD_CONF"}
    if conf:
        env["MALLARD_CONF"] = conf
    subprocess.run([str(build_dir / "bin" / "mallard-advise-workload"), workload, str(out)], env=env, check=True,
                   timeout=120)
    return out


def advise(path):
    return subprocess.run([*MALLARD, "advise", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("workload", sorted(CASES))
def test_advice_for_each_case(build_dir, tmp_path, workload):
    conf, title, line = CASES[workload]
    r = advise(dump(build_dir, tmp_path, workload, conf))
    assert r.returncode == 0, r.stderr
    assert title in r.stdout, r.stdout
    assert line in r.stdout, r.stdout
    for other in TITLES:
        if other != title:
            assert other not in r.stdout, f"unexpected advice for {workload}: {r.stdout}"
    assert "Nothing to change" not in r.stdout


def test_no_advice_when_healthy(build_dir, tmp_path):
    r = advise(dump(build_dir, tmp_path, "healthy", ""))
    assert r.returncode == 0, r.stderr
    assert "Nothing to change" in r.stdout
    for title in TITLES:
        assert title not in r.stdout


def test_following_the_advice_removes_it(build_dir, tmp_path):
    first = advise(dump(build_dir, tmp_path, "refills", "")).stdout
    conf = next(l.split("MALLARD_CONF=", 1)[1] for l in first.splitlines() if "MALLARD_CONF=" in l)
    again = advise(dump(build_dir, tmp_path, "refills", conf.strip()))
    assert "Nothing to change" in again.stdout, again.stdout


def test_dump_after_other_output_and_from_stats_print(build_dir, tmp_path):
    # A dump printed at exit (stats_print) follows the program's own stderr lines.
    env = dict(os.environ, LD_PRELOAD=str(build_dir / "lib" / "libmallard.so"),
               MALLARD_CONF="stats_print:true,stats_print_opts:J")
    r = subprocess.run(["sh", "-c", "echo something on stderr >&2; sort /etc/passwd > /dev/null"], env=env,
                       capture_output=True, text=True, timeout=60)
    f = tmp_path / "exit.json"
    f.write_text(r.stderr)
    out = advise(f)
    assert out.returncode == 0 and out.stdout.startswith("1. "), out.stdout + out.stderr


@pytest.mark.parametrize("content,message", [
    ("not json at all", "no Mallard statistics found"),
    ('{"mallard": {"stats": ', "malformed statistics JSON"),
    ('{"mallard": {"version": "x"}}', "not a Mallard statistics dump"),
])
def test_bad_input(tmp_path, content, message):
    f = tmp_path / "bad.json"
    f.write_text(content)
    r = advise(f)
    assert r.returncode != 0 and message in r.stderr


def test_missing_file(tmp_path):
    r = advise(tmp_path / "nope.json")
    assert r.returncode != 0 and "cannot read" in r.stderr


def test_json_output(build_dir, tmp_path):
    import json
    r = subprocess.run([*MALLARD, "advise", "--json", str(dump(build_dir, tmp_path, "dirty",
                                                               "dirty_decay_ms:60000,background_thread:false"))],
                       capture_output=True, text=True, timeout=60)
    items = json.loads(r.stdout)
    assert items[0]["kind"] == "dirty" and items[0]["conf"].startswith("MALLARD_CONF=")
