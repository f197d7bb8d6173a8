"""The secure variant's defences as options (guard_slab_interval, secure_noaccess_min, large_quarantine,
delayed_reuse): each one parsed, reported through mallard_ctl, and in force — turned off, its misuse goes through."""
import signal

import pytest

from test_secure_misuse import FAST, SECURE, output, run


def secure_opts(lib, conf=None):
    """(guard_slab_interval, secure_noaccess_min, large_quarantine, delayed_reuse, junk) as mallard_ctl reports."""
    r = run(lib, "secure-opts", conf=conf)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    g, nm, lq, dr, junk = r.stdout.split()
    return (int(g), int(nm), int(lq), dr == "1", junk), r.stderr


SECURE_DEFAULTS = (4, 256 << 10, 8, True, "false")


def test_secure_defaults():
    opts, err = secure_opts(SECURE)
    assert opts == SECURE_DEFAULTS and not err


def test_fast_defaults_are_off():
    opts, err = secure_opts(FAST)
    assert opts == (0, 2**64 - 1, 0, False, "false") and not err


@pytest.mark.parametrize("conf,expected", [
    ("guard_slab_interval:0", (0, 256 << 10, 8, True, "false")),
    ("guard_slab_interval:1", (1, 256 << 10, 8, True, "false")),
    ("secure_noaccess_min:1g", (4, 1 << 30, 8, True, "false")),
    ("secure_noaccess_min:none", (4, 2**64 - 1, 8, True, "false")),
    ("secure_noaccess_min:0", (4, 0, 8, True, "false")),
    ("large_quarantine:0", (4, 256 << 10, 0, True, "false")),
    ("large_quarantine:64", (4, 256 << 10, 64, True, "false")),
    ("delayed_reuse:false", (4, 256 << 10, 8, False, "false")),
    ("junk:free", (4, 256 << 10, 8, True, "free")),
])
def test_secure_option_parsed(conf, expected):
    opts, err = secure_opts(SECURE, conf)
    assert opts == expected and not err, err


@pytest.mark.parametrize("key,value", [("guard_slab_interval", "often"), ("guard_slab_interval", "1025"),
                                       ("secure_noaccess_min", "big"), ("secure_noaccess_min", "-1"),
                                       ("large_quarantine", "65"), ("large_quarantine", "-1"),
                                       ("delayed_reuse", "sometimes"), ("junk", "both")])
def test_secure_option_bad_value(key, value):
    """A bad value: one line naming the option, the value and what is accepted; the default stays."""
    opts, err = secure_opts(SECURE, f"{key}:{value}")
    lines = [ln for ln in err.splitlines() if ln.startswith("mallard")]
    assert len(lines) == 1 and f"'{key}'" in lines[0] and f"(value '{value}')" in lines[0], err
    assert "accepted:" in lines[0] and "default stays in force" in lines[0]
    assert opts == SECURE_DEFAULTS


def test_guard_slab_interval_0_lets_slab_overflow_through():
    """Control of test_secure_faults[slab-guard]: without guard slabs the 8 KiB overflow runs on."""
    assert run(SECURE, "slab-guard").returncode == -signal.SIGSEGV
    r = run(SECURE, "slab-guard", "guard_slab_interval:0")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)


def test_large_quarantine_0_reuses_at_once():
    assert output(SECURE, "reuse-large") == "0"
    assert output(SECURE, "reuse-large", "large_quarantine:0") == "20"


def test_delayed_reuse_false_reuses_at_once():
    assert output(SECURE, "reuse") == "0"
    assert output(SECURE, "reuse", "delayed_reuse:false") == "100"


@pytest.mark.parametrize("misuse", ["large-uaf-read", "huge-uaf-read"])
@pytest.mark.parametrize("conf", ["secure_noaccess_min:1g", "secure_noaccess_min:none"])
def test_secure_noaccess_min_above_block_leaves_it_readable(misuse, conf):
    assert run(SECURE, misuse).returncode == -signal.SIGSEGV
    r = run(SECURE, misuse, conf)
    assert r.returncode == 0 and "read 5a" in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_secure_noaccess_min_is_a_threshold():
    """600 KiB: the freed 512 KiB large block stays readable, the freed 8 MiB huge block does not."""
    assert run(SECURE, "large-uaf-read", "secure_noaccess_min:600k").returncode == 0
    assert run(SECURE, "huge-uaf-read", "secure_noaccess_min:600k").returncode == -signal.SIGSEGV
