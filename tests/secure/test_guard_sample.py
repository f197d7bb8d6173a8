"""Sampled guarded allocations (guard_sample, guard_slots, guard_action): an off-by-one overflow, an underflow and a
use after free in a loop are caught within the bound the sampling guarantees, in both variants; the report names the
sampled block; guard_action:report goes on; with guarding off the same loops run to completion."""
import math
import os
import pathlib
import re
import signal
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("MALLARD_BUILD_DIR", REPO / "build"))
PROG = BUILD / "bin" / "mallard-guard-sample"
SECURE = BUILD / "lib" / "libmallard-secure.so"
FAST = BUILD / "lib" / "libmallard.so"
LIBS = {"fast": FAST, "secure": SECURE}
PREFIX = {"fast": "mallard: guarded allocation: ", "secure": "mallard-secure: guarded allocation: "}

RATE = 4096   # guard_sample at the test rate: mean bytes between guarded samples
SECURE_DEFAULT = 64 << 20   # the secure variant's default (guarded.h: MLD_GUARD_SAMPLE_DEFAULT)


def bound(size, rate=RATE):
    """Iterations within which a loop allocating `size` bytes must meet a guarded sample: the distance between two
    samples is drawn uniformly from [1, 2 * rate - 1] bytes, so at most ceil((2 * rate - 1) / size) + 1 allocations
    (the program's other allocations only bring it closer)."""
    return math.ceil((2 * rate - 1) / size) + 1


def run(lib, mode, size, iters, conf):
    env = dict(os.environ, LD_PRELOAD=str(lib))
    env.pop("MALLARD_CONF", None)
    if conf is not None:
        env["MALLARD_CONF"] = conf
    return subprocess.run([str(PROG), mode, str(size), str(iters)], env=env, capture_output=True, text=True,
                          timeout=120)


def blocks(stdout):
    return [int(m, 16) for m in re.findall(r"^block (0x[0-9a-f]+)$", stdout, re.M)]


def reported_block(stderr):
    """(address, size, state) of the block the report names."""
    m = re.search(r"block (0x[0-9a-f]+) of (\d+) bytes \((live|freed)\)", stderr)
    assert m, stderr
    return int(m.group(1), 16), int(m.group(2)), m.group(3)


# (mode, size, what the report says): 144 is a multiple of 16, so its block ends at the guard page and one byte past
# it faults at once; 17 leaves 15 bytes of slack before the guard, checked when the block is freed. Neither size is
# caught by the secure variant's own canary (its classes leave room past 17 and 144 bytes), nor harmful unguarded.
CASES = [
    ("overflow", 144, "heap buffer overflow at 0x"),
    ("overflow", 17, "heap buffer overflow: bytes past the end of block 0x"),
    ("use-after-free", 48, "use after free at 0x"),
    ("use-after-free", 4096, "use after free at 0x"),
]


@pytest.mark.parametrize("variant", ["fast", "secure"])
@pytest.mark.parametrize("mode,size,says", CASES)
def test_caught_within_bound(variant, mode, size, says):
    n = bound(size)
    r = run(LIBS[variant], mode, size, n, f"guard_sample:{RATE}")
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stdout[-300:], r.stderr)
    assert "not detected" not in r.stdout
    assert PREFIX[variant] + says in r.stderr, r.stderr
    assert "aborting (guard_action:abort)" in r.stderr
    addr, got_size, state = reported_block(r.stderr)
    seen = blocks(r.stdout)
    assert seen and len(seen) <= n
    assert addr == seen[-1] and got_size == size, (hex(addr), seen[-3:], r.stderr)   # the loop's last block, named
    assert state == ("freed" if mode == "use-after-free" or size == 17 else "live")
    assert "  allocated by thread " in r.stderr and re.search(r"    #0 0x[0-9a-f]+", r.stderr)
    if state == "freed":
        assert "  freed by thread " in r.stderr


@pytest.mark.parametrize("variant", ["fast", "secure"])
def test_underflow_caught(variant):
    r = run(LIBS[variant], "underflow", 64, 4, "guard_sample:1")
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stderr)
    assert PREFIX[variant] + "heap buffer underflow: bytes before block 0x" in r.stderr, r.stderr
    assert reported_block(r.stderr)[0] == blocks(r.stdout)[-1]


@pytest.mark.parametrize("variant", ["fast", "secure"])
def test_double_free_of_guarded_block(variant):
    r = run(LIBS[variant], "double-free", 64, 1, "guard_sample:1")
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stderr)
    assert "double free or invalid free of 0x" in r.stderr and "already freed" in r.stderr, r.stderr
    assert reported_block(r.stderr) == (blocks(r.stdout)[-1], 64, "freed")


@pytest.mark.parametrize("mode,size", [("overflow", 144), ("overflow", 17), ("use-after-free", 48)])
def test_report_action_goes_on(mode, size):
    """guard_action:report: each error is reported once per slot and the program runs to its end."""
    r = run(FAST, mode, size, 3 * bound(size), f"guard_sample:{RATE},guard_action:report")
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "not detected" in r.stdout   # the program's own last line: it finished
    assert "the program goes on (guard_action:report)" in r.stderr and "aborting" not in r.stderr
    m = re.search(r"samples (\d+) reports (\d+)", r.stdout)
    assert int(m.group(1)) >= 1 and int(m.group(2)) >= 1, r.stdout


@pytest.mark.parametrize("variant", ["fast", "secure"])
@pytest.mark.parametrize("mode,size,says", CASES)
def test_control_off(variant, mode, size, says):
    """guard_sample:0: the same loops (ten times as long) run to completion, nothing reported."""
    r = run(LIBS[variant], mode, size, 10 * bound(size), "guard_sample:0")
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "not detected" in r.stdout and "guarded allocation" not in r.stderr
    assert "samples 0 reports 0" in r.stdout


@pytest.mark.parametrize("mode", ["realloc", "calloc", "clean"])
@pytest.mark.parametrize("size", [1, 16, 17, 1000, 4095, 4096, 4097])
def test_correct_programs_unaffected(mode, size):
    """Every allocation guarded (guard_sample:1, few slots so they are reused): correct use reports nothing, sizes
    are exact, calloc's bytes are zero in a reused slot, realloc keeps the bytes."""
    r = run(FAST, mode, size, 200, "guard_sample:1,guard_slots:4")
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "guarded allocation" not in r.stderr
    samples = int(re.search(r"samples (\d+)", r.stdout).group(1))
    assert samples >= (100 if size <= 4096 else 0), r.stdout


def test_secure_default_on_fast_default_off():
    """The defaults: on in the secure variant (a sample within the bound its default rate guarantees), off in the
    fast one."""
    n = bound(64, SECURE_DEFAULT)
    fast = run(FAST, "clean", 64, n, None)
    secure = run(SECURE, "clean", 64, n, None)
    assert fast.returncode == 0 and secure.returncode == 0, (fast.stderr, secure.stderr)
    assert "samples 0 " in fast.stdout
    assert int(re.search(r"samples (\d+)", secure.stdout).group(1)) >= 1, secure.stdout


@pytest.mark.parametrize("key,value", [("guard_sample", "often"), ("guard_sample", "-1"), ("guard_sample", "2T"),
                                       ("guard_slots", "0"), ("guard_slots", "4097"), ("guard_slots", "x"),
                                       ("guard_action", "ignore"), ("guard_action", "")])
@pytest.mark.parametrize("variant", ["fast", "secure"])
def test_bad_option_value(variant, key, value):
    """One line naming the option, the value and what is accepted; the default stays (nothing guarded in the fast
    variant)."""
    r = run(LIBS[variant], "clean", 64, 10, f"{key}:{value}")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("mallard")]
    assert len(lines) == 1 and f"'{key}'" in lines[0] and f"(value '{value}')" in lines[0], r.stderr
    assert "accepted:" in lines[0] and "default stays in force" in lines[0]
