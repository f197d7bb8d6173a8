"""Closed pages (guard slabs, large blocks' guard slots, freed large blocks) stay closed while their spans are free:
a span is opened where its new use needs it when it is handed out. Every byte handed out is writable, and a
thread's pages that come back to the same place cost no mprotect (tests/secure/prot_reuse.c)."""
import os
import pathlib
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("MALLARD_BUILD_DIR", REPO / "build"))
PROG = BUILD / "bin" / "mallard-prot-reuse"
SECURE = BUILD / "lib" / "libmallard-secure.so"


def run(mode: str, conf: str = "guard_sample:0") -> str:
    env = dict(os.environ, LD_PRELOAD=str(SECURE), MALLARD_CONF=conf)
    r = subprocess.run([str(PROG), mode], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return r.stdout.strip()


def test_thread_churn_keeps_guard_slabs_without_mprotect():
    """200 threads each take pages of 4000-byte blocks (one in 4 ends in a guard page) and exit: 0 calls
    (2 per thread when a page's guard was opened on its return and closed again on its next hand-out)."""
    calls = int(run("churn").split()[1])
    assert calls <= 20, calls


def test_guard_slabs_off_costs_nothing_either():
    assert int(run("churn", "guard_sample:0,guard_slab_interval:0").split()[1]) == 0


def test_small_pages_of_each_size_come_back_without_mprotect():
    """Large blocks freed (inaccessible) between rounds of small pages of four sizes taken in a changing order: 0
    calls in the small rounds, since large blocks and each page size have segments of their own (about 400 when
    pages of different sizes shared segments, 600 when large blocks shared them too). The bound leaves room for a
    segment given back by the purging thread and mapped again."""
    calls = int(run("kinds").split()[1])
    assert calls <= 40, calls


def test_realloc_growth_of_a_large_block_moves_its_guard_rarely():
    """A large block grown by realloc gets about twice what it asks (up to 2 MiB) and keeps it at the next
    realloc that fits, so a growth from 300 KiB to 1.9 MiB in 16 KiB steps moves the guard slot a few times, not
    once per 64 KiB (about 50 calls when each growth takes exactly what it asks)."""
    calls = int(run("grow").split()[1])
    assert calls <= 16, calls


def test_spans_reused_across_kinds_are_open_where_handed_out():
    """Large blocks freed closed, grown and shrunk in place, and small pages cut from the same spans: every byte
    written (a closed page left inside a block would fault)."""
    assert run("mixed") == "ok"


def test_wiped_and_junked_blocks_keep_their_canary():
    """zero_on_free and junk:free wipe or fill a freed block's usable bytes but not its canary (armed once, when
    the block is carved): blocks freed and handed out again are freed again without a false overflow report."""
    assert run("mixed", "guard_sample:0,zero_on_free:true") == "ok"
    assert run("mixed", "guard_sample:0,junk:true") == "ok"
