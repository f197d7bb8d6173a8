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
    # the 112 KiB class's default page is 4 slots (2 blocks): the advice doubles it
    "refills": ("", "go back and forth between threads and the arena", "slab_sizes:114688-114688:8"),
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


# Ordinary programs: a healthy reuse loop, allocate-everything-then-free-all, a steady state, a thread pool.
@pytest.mark.parametrize("workload", ["healthy", "allocfree", "steady", "threadpool"])
def test_no_advice_for_ordinary_programs(build_dir, tmp_path, workload):
    r = advise(dump(build_dir, tmp_path, workload, ""))
    assert r.returncode == 0, r.stderr
    assert "Nothing to change" in r.stdout, r.stdout
    for title in TITLES:
        assert title not in r.stdout


def merge_conf(base, suggested):
    items = dict(i.split(":", 1) for i in base.split(",") if i)
    items.update(dict(i.split(":", 1) for i in suggested.split(",") if i))
    return ",".join(f"{k}:{v}" for k, v in items.items())


@pytest.mark.parametrize("workload", sorted(CASES))
def test_following_the_advice_removes_it(build_dir, tmp_path, workload):
    # Every rule converges: the run with its line applied gets no advice of that kind (not the next, larger step).
    conf, title, _ = CASES[workload]
    first = advise(dump(build_dir, tmp_path, workload, conf)).stdout
    line = next(l for l in first.splitlines() if "try: MALLARD_CONF=" in l)
    applied = merge_conf(conf, line.split("MALLARD_CONF=", 1)[1].strip())
    again = advise(dump(build_dir, tmp_path, workload, applied))
    assert again.returncode == 0, again.stderr
    assert title not in again.stdout, f"with {applied}: {again.stdout}"


def test_real_program_advice_converges(build_dir, tmp_path):
    # The Python dict/JSON workload with every object from malloc: whatever it is advised, applying it once must
    # leave no further advice of that kind (it used to ask for ever larger pages, round after round).
    script = REPO / "bench" / "workloads" / "pydict_json.py"
    assert script.is_file(), script
    env0 = {k: v for k, v in os.environ.items() if k not in ("MALLARD_CONF", "LD_PRELOAD")}
    env0.update(PYTHONMALLOC="malloc", LD_PRELOAD=str(build_dir / "lib" / "libmallard.so"))

    def run(conf):
        f = tmp_path / f"py{len(conf)}.json"
        env = dict(env0, MALLARD_CONF="stats_print:true,stats_print_opts:J" + (f",{conf}" if conf else ""))
        r = subprocess.run([sys.executable, str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        f.write_text(r.stderr)
        out = advise(f)
        assert out.returncode == 0, out.stderr
        return out.stdout

    first = run("")
    lines = [l.split("MALLARD_CONF=", 1)[1].strip() for l in first.splitlines() if "try: MALLARD_CONF=" in l]
    if not lines:
        assert "Nothing to change" in first, first
        return
    again = run(lines[0])
    title = next(l for l in first.splitlines() if l.startswith("1. "))[3:]
    assert title not in again, f"with {lines[0]}: {again}"


def test_advice_never_contradicts_itself(build_dir, tmp_path):
    # A dump that triggers both page churn (bigger page cache) and tiny-working-set (no page cache): only the first
    # survives, and every option appears once in the combined line.
    import json
    src = dump(build_dir, tmp_path, "refills", "")
    doc = json.loads(src.read_text())
    m = doc["mallard"]
    m["stats"]["allocated"] = 1000
    m["stats"]["active"] = 4096
    m["stats"]["metadata"] = 4 << 20
    f = tmp_path / "both.json"
    f.write_text(json.dumps(doc))
    r = advise(f)
    assert r.returncode == 0, r.stderr
    assert CASES["refills"][1] in r.stdout
    assert "page_cache:0" not in r.stdout, r.stdout


def test_several_dumps_and_trailing_text(build_dir, tmp_path):
    # A wrapper's small dump, the program's dump, then /usr/bin/time's lines: the busiest dump is used and named.
    env = dict(os.environ, LD_PRELOAD=str(build_dir / "lib" / "libmallard.so"),
               MALLARD_CONF="stats_print:true,stats_print_opts:J")
    small = subprocess.run(["true"], env=env, capture_output=True, text=True, timeout=60).stderr
    assert '{"mallard"' in small
    big = dump(build_dir, tmp_path, "refills", "").read_text()
    f = tmp_path / "mixed.txt"
    f.write_text("starting\n" + small + "program output\n" + big + small +
                 "0.30user 0.01system 0:00.31elapsed 99%CPU (0avgtext+0avgdata 4000maxresident)k\n")
    r = advise(f)
    assert r.returncode == 0, r.stderr
    assert CASES["refills"][1] in r.stdout, r.stdout
    assert "3 dumps" in r.stderr and "dump 2 of 3" in r.stderr, r.stderr
    r = subprocess.run([*MALLARD, "advise", "--dump", "1", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and CASES["refills"][1] not in r.stdout and "dump 1 of 3" in r.stderr, r.stdout + r.stderr
    r = subprocess.run([*MALLARD, "advise", "--dump", "4", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "holds 3 dumps" in r.stderr and len(r.stderr.strip().splitlines()) == 1


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
    items = json.loads(r.stdout)["advice"]
    assert items[0]["kind"] == "dirty" and items[0]["conf"].startswith("MALLARD_CONF=")
