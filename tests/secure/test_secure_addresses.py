"""The secure variant's unpredictable addresses: segments and huge mappings, including the huge cache's moved ones,
lie at random addresses in [2^40, 2^46) (core/secure.c mld_random_hint), not where the kernel would put them (near
the mmap base, above 2^46). A regression of the layering (issue 37): the platform's move of a freed huge mapping
lost the secure hint, and 39 of 40 reused huge blocks came back near the mmap base."""
import os
import subprocess

from test_secure_misuse import FAST, PROG, SECURE


def addresses(lib):
    env = dict(os.environ, LD_PRELOAD=str(lib))
    r = subprocess.run([str(PROG), "huge-addresses"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)
    got = [int(x, 16) for x in r.stdout.split()]
    assert len(got) == 40, r.stdout
    return got


def test_huge_blocks_of_the_secure_variant_lie_at_random_addresses():
    got = addresses(SECURE)
    outside = [hex(a) for a in got if not (1 << 40) <= a < (1 << 46)]
    assert not outside, f"{len(outside)} of {len(got)} huge blocks outside [2^40, 2^46): {outside[:5]}"
    assert len({a >> 22 for a in got}) >= 30, "huge blocks keep coming back at the same few addresses"


def test_the_fast_variant_leaves_addresses_to_the_kernel():
    """The control: without the secure hint the kernel places them near the mmap base, above 2^46."""
    got = addresses(FAST)
    assert sum(a >= (1 << 46) for a in got) >= 35, [hex(a) for a in got[:5]]
