"""The secure variant detects each heap misuse, reports the address and aborts; the fast variant survives them."""
import os
import pathlib
import re
import signal
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("MALLARD_BUILD_DIR", REPO / "build"))
PROG = BUILD / "bin" / "mallard-misuse"
SECURE = BUILD / "lib" / "libmallard-secure.so"
FAST = BUILD / "lib" / "libmallard.so"

ABORTS = {
    "double-free": "double free or invalid free of 0x",
    "interior-free": "double free or invalid free of 0x",
    "misaligned-free": "double free or invalid free of 0x",
    "stack-free": "free(0x",
    "foreign-free": "free(0x",
    "overflow": "heap buffer overflow: canary damaged after block 0x",
    "overflow-realloc": "heap buffer overflow: canary damaged after block 0x",
    # found when the owner collects the block another thread freed (the freeing thread does not read the canary)
    "overflow-remote": "heap buffer overflow: canary damaged after block 0x",
    "use-after-free": "free list corrupted",
    "remote-double-free": "double free or invalid free of 0x",
    # Issue 16's bypasses: any order of owner and remote double free (the remote free clears the bit at once, also
    # while the block waits in an outbox), and the self-loop made by copying one freed block's link into another.
    "remote-then-owner": "double free or invalid free of 0x",
    "remote-pending-then-owner": "double free or invalid free of 0x",
    "owner-then-remote": "double free or invalid free of 0x",
    "self-loop": "free list corrupted: the next block to hand out is not free: 0x",
    "racing-double-free": "double free or invalid free of 0x",
    "racing-owner-remote": ("double free or invalid free of 0x", "the next block to hand out is not free: 0x"),
    # In-band marks forged back (misuse.c "forged-*"): caught by the bitmap, when the owner collects the block or
    # hands it out again.
    "forged-remote-then-owner": ("double free or invalid free of 0x", "the next block to hand out is not free: 0x"),
    "forged-remote-then-remote": ("double free or invalid free of 0x", "the next block to hand out is not free: 0x"),
    "forged-owner-then-remote": ("double free or invalid free of 0x", "the next block to hand out is not free: 0x"),
}
# Reported at the misuse itself: the program never gets past it (misuse.c prints "past the misuse" after it).
IMMEDIATE = ["remote-then-owner", "remote-pending-then-owner"]
# The fast variant lets these through (the program runs on and prints "not detected"): the control showing
# that the tests above tell the two variants apart.
LETS_THROUGH = ["remote-then-owner", "remote-pending-then-owner", "owner-then-remote", "self-loop", "double-free",
                "interior-free", "misaligned-free", "overflow", "overflow-realloc", "overflow-remote", "remote-double-free",
                "metadata-guard", "racing-double-free"]
# (The forged-* cases have no control: the fast variant's lists do not survive a double free followed by a write
# after free; they may loop for ever.)


def run(lib, misuse, conf=None):
    env = dict(os.environ, LD_PRELOAD=str(lib))
    # The guard sampler (on by default in the secure variant) may pick the block a misuse aims at and report it
    # itself; its own tests are in test_guard_sample.py, so these runs keep it off unless a test names it.
    if not conf or "guard_sample" not in conf:
        conf = "guard_sample:0" + (f",{conf}" if conf else "")
    env["MALLARD_CONF"] = conf
    return subprocess.run([str(PROG), misuse], env=env, capture_output=True, text=True, timeout=60)


def test_clean_program_runs():
    r = run(SECURE, "none")
    assert r.returncode == 0 and "not detected" in r.stdout


@pytest.mark.parametrize("misuse", sorted(ABORTS))
def test_secure_detects(misuse):
    r = run(SECURE, misuse)
    assert r.returncode == -signal.SIGABRT, (r.returncode, r.stdout, r.stderr)
    expect = ABORTS[misuse] if isinstance(ABORTS[misuse], tuple) else (ABORTS[misuse],)
    assert "mallard-secure:" in r.stderr and any(e in r.stderr for e in expect), r.stderr
    assert re.search(r"0x[0-9a-f]+", r.stderr), "the report names the address"
    assert "not detected" not in r.stdout
    if misuse in IMMEDIATE:
        assert "past the misuse" not in r.stdout, r.stdout


@pytest.mark.parametrize("misuse", ["metadata-guard", "huge-guard"])
def test_secure_guard_pages(misuse):
    r = run(SECURE, misuse)
    if misuse == "metadata-guard" and os_page(SECURE) == 65536:
        # At 64 KiB pages the bitmaps end inside the metadata's last page: no page is left for the guard
        # (docs/DESIGN.md "Page size"), and the read lands in the first data slot's own memory.
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        return
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stdout, r.stderr)


def zero_on_free(lib, conf=None):
    """(wiped?, what opt.zero_on_free reports, stderr) after the program dirtied a block opaquely and freed it."""
    r = run(lib, "zero-on-free", conf=conf)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith("reported "), r.stdout
    return lines[0] == "wiped", int(lines[1].split()[1]), r.stderr


def test_zero_on_free():
    wiped, reported, err = zero_on_free(SECURE, "zero_on_free:true")
    assert wiped and reported == 1, err


def test_zero_on_free_control_secure_off():
    """Control: the same program with the option off sees its own bytes (so the check above can fail)."""
    wiped, reported, err = zero_on_free(SECURE, "zero_on_free:false")
    assert not wiped and reported == 0, err


def test_zero_on_free_control_fast_default():
    """Control: the fast variant does not wipe by default."""
    wiped, reported, err = zero_on_free(FAST)
    assert not wiped and reported == 0, err


def test_fast_variant_zero_on_free_is_in_force_or_refused():
    """An option mallard_ctl reports must be in force: the fast variant wipes, or refuses the option in one line."""
    wiped, reported, err = zero_on_free(FAST, "zero_on_free:true")
    if wiped:
        assert reported == 1
    else:
        assert reported == 0, f"opt.zero_on_free reported on but nothing was wiped; stderr: {err!r}"
        lines = [ln for ln in err.splitlines() if "zero_on_free" in ln]
        assert len(lines) == 1, f"the refusal must be one line naming the option: {err!r}"


def guard_after_huge(lib):
    r = run(lib, "huge-guard-maps")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return r.stdout.strip()


def test_secure_huge_block_followed_by_prot_none_mapping():
    """The page right after a huge block is a PROT_NONE mapping in /proc/self/maps (not just any fault)."""
    assert guard_after_huge(SECURE) == "guard"


def test_fast_huge_block_has_no_guard_control():
    """Control: the fast variant has no guard page there, so the check above distinguishes the two."""
    assert guard_after_huge(FAST) != "guard"


def layout(lib):
    """(small block addresses in allocation order, addresses of 8 blocks each in a fresh region)."""
    r = run(lib, "layout")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    rows = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    return [int(x, 16) for x in rows["small"].split()], [int(x, 16) for x in rows["big"].split()]


def stride_share(addrs):
    """The share of consecutive differences equal to the most common one (1.0: a sequential layout)."""
    diffs = [b - a for a, b in zip(addrs, addrs[1:])]
    return max(diffs.count(d) for d in set(diffs)) / len(diffs)


def rank_order(addrs):
    return sorted(range(len(addrs)), key=addrs.__getitem__)


def test_secure_allocation_order_is_random():
    """Blocks of one class do not come in address order, and the order differs from one run to the next."""
    small1, _ = layout(SECURE)
    small2, _ = layout(SECURE)
    assert stride_share(small1) < 0.5 and stride_share(small2) < 0.5, (small1, small2)
    assert rank_order(small1) != rank_order(small2)


def test_secure_region_addresses_are_random():
    """Regions are neither next to each other nor at the same places across runs."""
    _, big1 = layout(SECURE)
    _, big2 = layout(SECURE)
    assert stride_share(big1) < 0.5 and stride_share(big2) < 0.5, ([hex(a) for a in big1], [hex(a) for a in big2])
    assert not set(big1) & set(big2)
    # Not packed together either: the regions span far more than their own size.
    assert max(big1) - min(big1) > 64 * len(big1) * (8 << 20)


def test_fast_layout_is_sequential_control():
    """Control: the fast variant hands out blocks and regions in sequence, which the checks above would reject."""
    small1, big1 = layout(FAST)
    small2, _ = layout(FAST)
    assert stride_share(small1) == 1.0 and stride_share(big1) == 1.0
    assert rank_order(small1) == rank_order(small2)


@pytest.mark.parametrize("misuse", ["stack-free", "foreign-free"])
def test_fast_variant_reports_foreign_once_and_runs_on(misuse):
    r = run(FAST, misuse)
    assert r.returncode == 0 and "not detected" in r.stdout
    assert r.stderr.count("pointer not allocated by mallard") == 1


@pytest.mark.parametrize("misuse", LETS_THROUGH)
def test_fast_variant_lets_misuse_through_control(misuse):
    r = run(FAST, misuse)
    assert r.returncode == 0 and "not detected" in r.stdout, (r.returncode, r.stdout, r.stderr)


def output(lib, mode, conf=None):
    r = run(lib, mode, conf=conf)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    return r.stdout.strip()


def os_page(lib):
    """The page size the library runs with (the kernel's, or a MALLARD_TEST_PAGE_SIZE build's), from its report."""
    r = run(lib, "none", conf="stats_print:true")
    m = re.search(r"^page size: (\d+) KiB$", r.stderr, re.M)
    assert r.returncode == 0 and m, (r.returncode, r.stderr[:500])
    return int(m.group(1)) << 10


def carve_runs(lib, conf=None):
    """The carved chunks of the carve-order run (page.c carves 16 KiB at a time: MLD_EXTEND_BYTES // block size blocks
    from the page's start on): for each chunk met, the block indices inside the page in hand-out order."""
    addrs = [int(x, 16) for x in output(lib, "carve-order", conf).split()]
    step = min(b - a for a, b in zip(addrs, addrs[1:]) if b > a)   # the class's block size (adjacent blocks exist)
    per_chunk = 16384 // step
    # A page of this class is one 64 KiB slot; two in the secure variant at 64 KiB pages (docs/DESIGN.md "Page
    # size"), and then not aligned to its size: a page starts at the slot of the first block met outside the last.
    page_bytes = (2 if lib == SECURE and os_page(lib) == 65536 else 1) << 16
    runs, cur, chunk, page = [], [], None, None
    for a in addrs:
        if page is None or not page <= a < page + page_bytes:
            page = a & ~0xFFFF   # carving starts at the page's start: its first chunk lies in its first slot
        c = (page, (a - page) // step // per_chunk)
        if c != chunk and cur:
            runs.append(cur)
            cur = []
        chunk = c
        cur.append((a - page) // step)
    runs.append(cur)
    return step, [r for r in runs if len(r) == per_chunk]   # whole chunks only


def test_secure_carves_fresh_blocks_in_random_order():
    """Under shuffle:1024 (each chunk whole; the default shuffles runs of 16: test_secure_options.py), fresh blocks
    come out of each carved chunk in a shuffled order: few hand-outs are the block right after the previous one, the
    first block of a chunk is anywhere in it (uniformly: a chi-square test over 8 bins), and two processes get
    different orders."""
    step, runs = carve_runs(SECURE, "shuffle:1024")
    assert 200 < step <= 256 and len(runs) >= 100, (step, len(runs))
    pairs = [(a, b) for r in runs for a, b in zip(r, r[1:])]
    adjacent = sum(b == a + 1 for a, b in pairs)
    assert adjacent < 0.05 * len(pairs), (adjacent, len(pairs))
    firsts = [(r[0] - min(r)) * 8 // (max(r) - min(r) + 1) for r in runs]
    counts = [firsts.count(k) for k in range(8)]
    expected = len(firsts) / 8
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    assert chi2 < 24.3, (counts, chi2)   # 7 degrees of freedom: p = 0.001
    assert carve_runs(SECURE, "shuffle:1024")[1][:5] != runs[:5]


def test_fast_carves_in_address_order_control():
    step, runs = carve_runs(FAST)
    pairs = [(a, b) for r in runs for a, b in zip(r, r[1:])]
    assert sum(b == a + 1 for a, b in pairs) > 0.95 * len(pairs)


def reuse_or_extend(lib, conf=None, runs=24):
    return [output(lib, "reuse-or-extend", conf) for _ in range(runs)]


def test_secure_refill_chooses_between_fresh_and_recycled_blocks():
    """When a page has both blocks freed by another thread and room to carve, the secure variant's refill carves a
    few fresh blocks first at a coin toss: over 24 processes both outcomes occur (all alike by chance: 2 * 2^-24), and
    nothing else (a block of another page, or one still handed out). shuffle:0 (address order) turns it off."""
    got = reuse_or_extend(SECURE)
    assert set(got) == {"fresh", "recycled"}, got
    assert set(reuse_or_extend(SECURE, "shuffle:0", runs=6)) == {"recycled"}


def test_fast_refill_reuses_control():
    assert set(reuse_or_extend(FAST, runs=6)) == {"recycled"}


def test_secure_fresh_blocks_hold_no_link():
    """The first word of a fresh block (it held the next free block's encrypted link, or a list's end) reads 0."""
    assert output(SECURE, "fresh-words") == "clean"


def test_fast_fresh_blocks_hold_links_control():
    assert output(FAST, "fresh-words").startswith("nonzero")


def test_secure_remote_freed_blocks_hold_no_skip_hint():
    """A block freed by another thread carries, on its way back, an encrypted skip hint in its second word; the
    owner's collection clears it, so no block handed out again holds a stored address."""
    assert output(SECURE, "remote-words") == "clean"


def test_remote_words_control_fast():
    """Control: the fast variant's batch head keeps its tail and count in the second word, which the test sees."""
    assert output(FAST, "remote-words").startswith("hint")


def test_secure_collections_clear_every_remote_bit():
    """Rounds of remote frees in shuffled order into one-slot and multi-slot pages: every collected block's remote
    bit is cleared (one left set would make its next remote free a false double free)."""
    assert output(SECURE, "remote-rounds") == "ok"


def test_secure_canaries_reveal_no_common_key():
    """canary ^ (address >> 4) differs between blocks: a canary read by the program is no process-wide key.
    (Before issue 16 it was the same value for every block: the secret.)"""
    assert output(SECURE, "canary-key") == "varied"


def test_secure_no_immediate_reuse():
    """malloc right after free does not return the block just freed (issue 16's 100-iteration check)."""
    assert output(SECURE, "reuse") == "0"


def test_fast_immediate_reuse_control():
    assert output(FAST, "reuse") == "100"


def test_secure_zero_on_free_remote():
    """zero_on_free wipes a block freed by another thread too."""
    assert output(SECURE, "zero-on-free-remote", "zero_on_free:true") == "wiped"


def test_secure_zero_on_free_remote_control_off():
    assert output(SECURE, "zero-on-free-remote", "zero_on_free:false").startswith("not wiped")


def test_fast_zero_on_free_remote_control():
    assert output(FAST, "zero-on-free-remote").startswith("not wiped")


def fork_children(lib):
    lines = output(lib, "fork-random").splitlines()
    assert len(lines) == 2, lines
    return lines


def test_secure_fork_children_are_reseeded():
    """Two children of one parent get different new-region addresses and a different order of fresh blocks."""
    a, b = fork_children(SECURE)
    assert a.split()[0] != b.split()[0] and a.split()[1:] != b.split()[1:], (a, b)


def test_fast_fork_children_alike_control():
    a, b = fork_children(FAST)
    assert a == b


# Guard pages and freed big blocks: the secure variant faults (SIGSEGV), the fast variant runs on (control).
# (huge-uaf-after-reuse: the freed block's memory is handed out again before the old pointer is read; the fast
# variant hands it out at the same address.)
# (*-reused: the spans went back to the arena with their closed pages and came out again; "filled" is printed once
# every byte handed out was written, so a closed page left inside a block fails them too.)
FAULTS = ["slab-guard", "slab-guard-reused", "large-guard", "large-reused-guard", "large-realloc-guard",
          "huge-cache-guard", "large-uaf-read", "huge-uaf-read", "huge-uaf-after-reuse"]


@pytest.mark.parametrize("misuse", FAULTS)
def test_secure_faults(misuse):
    r = run(SECURE, misuse)
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stdout, r.stderr)
    if misuse.endswith("-reused"):
        assert "filled" in r.stdout, (r.stdout, r.stderr)


@pytest.mark.parametrize("misuse", FAULTS)
def test_fast_runs_on_control(misuse):
    r = run(FAST, misuse)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)


def test_secure_no_immediate_reuse_large():
    assert output(SECURE, "reuse-large") == "0"


def test_fast_immediate_reuse_large_control():
    assert output(FAST, "reuse-large") == "20"


def test_secure_huge_realloc_keeps_guard():
    """A huge block grown and then shrunk inside its mapping faults 100 bytes past its end. (No fast-variant
    control: the fast variant resizes huge mappings with mremap to the block's end, so it faults there too.)"""
    r = run(SECURE, "huge-realloc-guard")
    assert r.returncode == -signal.SIGSEGV, (r.returncode, r.stdout, r.stderr)
