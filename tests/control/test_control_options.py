"""Options: defaults, every option valid and invalid, the three sources and their priority, abort_conf."""
import os

import pytest

from conftest import parse_opts

DEFAULTS = {
    "dirty_decay_ms": "1000", "background_thread": "1", "retain": "0", "thp": "default", "verbose": "0",
    "abort_conf": "0", "stats_print": "0", "stats_print_opts": "", "page_cache": "4", "huge_cache_max": str(256 << 20),
}

VALID = [
    ("narenas:5", "narenas", "5"),
    ("dirty_decay_ms:0", "dirty_decay_ms", "0"),
    ("dirty_decay_ms:-1", "dirty_decay_ms", "-1"),
    ("dirty_decay_ms:86400000", "dirty_decay_ms", "86400000"),
    ("background_thread:false", "background_thread", "0"),
    ("retain:true", "retain", "1"),
    ("thp:never", "thp", "never"),
    ("thp:madvise", "thp", "madvise"),
    ("thp:always", "thp", "always"),
    ("verbose:true", "verbose", "1"),
    ("abort_conf:true", "abort_conf", "1"),
    ("stats_print:false", "stats_print", "0"),
    ("stats_print_opts:Ja", "stats_print_opts", "Ja"),
    ("page_cache:0", "page_cache", "0"),
    ("page_cache:64", "page_cache", "64"),
    ("huge_cache_max:16M", "huge_cache_max", str(16 << 20)),
    ("huge_cache_max:0", "huge_cache_max", "0"),
]

INVALID = [
    ("narenas", "x"), ("narenas", "65"), ("narenas", "-1"), ("dirty_decay_ms", "soon"), ("dirty_decay_ms", "-2"),
    ("background_thread", "yes"), ("retain", "2"), ("thp", "sometimes"), ("verbose", ""), ("abort_conf", "maybe"),
    ("stats_print", "TRUE"), ("stats_print_opts", "Z"), ("page_cache", "65"), ("huge_cache_max", "12X"),
    ("slab_sizes", "1-4096"), ("slab_sizes", "4096-1:2"), ("slab_sizes", "1-1024:17"), ("slab_sizes", "200K-256K:1"),
]


def test_defaults(probe):
    opts = parse_opts(probe("opts").stdout)
    for k, v in DEFAULTS.items():
        assert opts[k] == v, k
    assert int(opts["narenas"]) == len(os.sched_getaffinity(0))
    assert opts["slab.16"] == str(64 << 10)
    assert opts["slab.262144"] == str(1 << 20)


@pytest.mark.parametrize("conf,key,expected", VALID)
def test_valid_option(probe, conf, key, expected):
    r = probe("opts", conf=conf)
    assert parse_opts(r.stdout)[key] == expected
    assert "mallard:" not in r.stderr


def test_stats_print_true_is_accepted(probe):
    r = probe("opts", conf="stats_print:true")
    assert parse_opts(r.stdout)["stats_print"] == "1"
    assert "___ Mallard statistics" in r.stderr


def test_slab_sizes(probe):
    opts = parse_opts(probe("opts", conf="slab_sizes:1-1024:2|8K-64K:16").stdout)
    assert opts["slab.16"] == str(128 << 10)
    assert opts["slab.1024"] == str(128 << 10)
    assert opts["slab.1280"] == str(64 << 10)
    assert opts["slab.8192"] == str(1 << 20)
    assert opts["slab.65536"] == str(1 << 20)


@pytest.mark.parametrize("key,value", INVALID)
def test_invalid_value(probe, key, value):
    r = probe("opts", conf=f"{key}:{value}")
    lines = [l for l in r.stderr.splitlines() if l.startswith("mallard:")]
    assert len(lines) == 1, r.stderr
    assert f"'{key}'" in lines[0] and f"(value '{value}')" in lines[0] and "accepted:" in lines[0]
    assert "default stays in force" in lines[0]
    opts = parse_opts(r.stdout)
    baseline = parse_opts(probe("opts").stdout)
    assert opts == baseline


def test_unknown_key(probe):
    r = probe("opts", conf="narenas:3,no_such_option:1")
    lines = [l for l in r.stderr.splitlines() if l.startswith("mallard:")]
    assert len(lines) == 1
    assert "unknown option 'no_such_option'" in lines[0] and "(value '1')" in lines[0]
    assert "narenas" in lines[0].split("accepted:")[1]
    assert parse_opts(r.stdout)["narenas"] == "3"   # the good item still applies


def test_missing_value(probe):
    r = probe("opts", conf="narenas")
    assert "missing ':value'" in r.stderr


def test_abort_conf(probe):
    r = probe("opts", conf="abort_conf:true,narenas:lots", check=False)
    assert r.returncode == -6
    assert "'narenas'" in r.stderr and "abort" in r.stderr


def test_abort_conf_not_triggered_by_good_conf(probe):
    r = probe("opts", conf="abort_conf:true,narenas:2")
    assert parse_opts(r.stdout)["narenas"] == "2"


def test_priority_of_sources(probe, tmp_path):
    f = tmp_path / "mallard.conf"
    f.write_text("# site defaults\nnarenas:5\ndirty_decay_ms:555\n")
    # program string < file < environment
    r = probe("opts", program="mallard-ctl-probe-conf", conf_file=f, conf="narenas:6")
    opts = parse_opts(r.stdout)
    assert opts["narenas"] == "6"          # environment wins
    assert opts["dirty_decay_ms"] == "555"  # file beats the program's string
    assert opts["page_cache"] == "9"        # only the program's string sets it
    r = probe("opts", program="mallard-ctl-probe-conf")
    opts = parse_opts(r.stdout)
    assert (opts["narenas"], opts["dirty_decay_ms"], opts["page_cache"]) == ("3", "777", "9")


def test_conf_file_as_symlink_name(probe, tmp_path):
    link = tmp_path / "malloc-link.conf"
    os.symlink("dirty_decay_ms:4321,retain:true", link)
    opts = parse_opts(probe("opts", conf_file=link).stdout)
    assert opts["dirty_decay_ms"] == "4321" and opts["retain"] == "1"


def test_errors_name_their_source(probe, tmp_path):
    f = tmp_path / "mallard.conf"
    f.write_text("retain:perhaps\n")
    r = probe("opts", conf_file=f)
    assert str(f) in r.stderr and "'retain'" in r.stderr


def test_verbose_prints_options(probe):
    r = probe("opts", conf="verbose:true,narenas:2")
    assert "narenas:2" in r.stderr and "dirty_decay_ms:1000" in r.stderr
