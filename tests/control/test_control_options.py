"""Options: defaults, every option valid and invalid, the three sources and their priority, abort_conf."""
import os
import shutil
import subprocess

import pytest

from conftest import parse_opts

DEFAULTS = {
    "dirty_decay_ms": "1000", "background_thread": "1", "retain": "0", "thp": "default", "verbose": "0",
    "abort_conf": "0", "stats_print": "0", "stats_print_opts": "", "page_cache": "4", "huge_cache_max": str(256 << 20),
    # the secure variant's defences, held off in the fast variant (secure_noaccess_min: none is SIZE_MAX)
    "guard_slab_interval": "0", "secure_noaccess_min": str(2**64 - 1), "large_quarantine": "0", "delayed_reuse": "0",
    "shuffle": "0", "junk": "false",
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
    ("junk:true", "junk", "true"),
    ("junk:alloc", "junk", "alloc"),
    ("junk:free", "junk", "free"),
    ("junk:false", "junk", "false"),
    # the fast variant takes the secure defences' "off" values (what it has) without a word
    ("guard_slab_interval:0", "guard_slab_interval", "0"),
    ("secure_noaccess_min:none", "secure_noaccess_min", str(2**64 - 1)),
    ("large_quarantine:0", "large_quarantine", "0"),
    ("delayed_reuse:false", "delayed_reuse", "0"),
    ("shuffle:0", "shuffle", "0"),
]

INVALID = [
    ("narenas", "x"), ("narenas", "65"), ("narenas", "-1"), ("dirty_decay_ms", "soon"), ("dirty_decay_ms", "-2"),
    ("background_thread", "yes"), ("retain", "2"), ("thp", "sometimes"), ("verbose", ""), ("abort_conf", "maybe"),
    ("stats_print", "TRUE"), ("stats_print_opts", "Z"), ("page_cache", "65"), ("huge_cache_max", "12X"),
    ("junk", "yes"), ("junk", "TRUE"), ("junk", ""), ("guard_slab_interval", "x"), ("guard_slab_interval", "-1"),
    ("guard_slab_interval", "1025"), ("secure_noaccess_min", "12X"), ("secure_noaccess_min", "2T"),
    ("large_quarantine", "65"), ("large_quarantine", "many"), ("delayed_reuse", "perhaps"),
    ("shuffle", "x"), ("shuffle", "1025"), ("shuffle", "-1"),
    ("slab_sizes", "1-4096"), ("slab_sizes", "4096-1:2"), ("slab_sizes", "1-1024:17"), ("slab_sizes", "200K-256K:1"),
]


def test_defaults(probe):
    opts = parse_opts(probe("opts").stdout)
    for k, v in DEFAULTS.items():
        assert opts[k] == v, k
    assert int(opts["narenas"]) == len(os.sched_getaffinity(0))
    assert opts["slab.16"] == str(64 << 10)
    # medium pages: ~8 blocks, at most 4 slots in the fast variant, always room for one block
    assert opts["slab.10240"] == str(128 << 10)
    assert opts["slab.114688"] == str(256 << 10)
    assert opts["slab.262144"] == str(256 << 10)


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


# ---- configuration sources (comments, links, size, special files) ----

def mallard_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("mallard")]


def test_comment_runs_to_end_of_line_in_file(probe, tmp_path):
    f = tmp_path / "mallard.conf"
    f.write_text("# narenas:3,dirty_decay_ms:0\nretain:true # ,page_cache:9\n")
    r = probe("opts", conf_file=f)
    opts = parse_opts(r.stdout)
    assert opts["dirty_decay_ms"] == "1000" and opts["page_cache"] == "4" and opts["retain"] == "1"
    assert not mallard_lines(r.stderr), r.stderr


def test_comment_runs_to_end_of_environment_string(probe):
    r = probe("opts", conf="narenas:2 # ,dirty_decay_ms:0")
    opts = parse_opts(r.stdout)
    assert opts["narenas"] == "2" and opts["dirty_decay_ms"] == "1000"
    assert not mallard_lines(r.stderr), r.stderr


def test_conf_file_symlink_to_real_file_is_read(probe, tmp_path):
    real = tmp_path / "real.conf"
    real.write_text("dirty_decay_ms:4321\n")
    link = tmp_path / "link.conf"
    os.symlink(real, link)
    r = probe("opts", conf_file=link)
    assert parse_opts(r.stdout)["dirty_decay_ms"] == "4321"
    assert not mallard_lines(r.stderr), r.stderr


def test_long_conf_file_is_read_whole(probe, tmp_path):
    f = tmp_path / "mallard.conf"
    f.write_text("#" + "x" * 1010 + "\n" + "dirty_decay_ms:86400000\n" + "# padding\n" * 3000 + "page_cache:11\n")
    assert f.stat().st_size > 30000
    r = probe("opts", conf_file=f)
    opts = parse_opts(r.stdout)
    assert opts["dirty_decay_ms"] == "86400000" and opts["page_cache"] == "11"
    assert not mallard_lines(r.stderr), r.stderr


def test_oversized_conf_file_is_refused_in_one_line(probe, tmp_path):
    f = tmp_path / "mallard.conf"
    f.write_text("dirty_decay_ms:5\n" + "#\n" * 40000)
    r = probe("opts", conf_file=f)
    lines = mallard_lines(r.stderr)
    assert len(lines) == 1 and str(f) in lines[0] and "64 KiB" in lines[0], r.stderr
    assert parse_opts(r.stdout)["dirty_decay_ms"] == "1000"   # ignored whole, never cut mid-value


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_conf_file_not_regular_is_reported_and_skipped(probe, tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "fifo.conf"
        os.mkfifo(path)
    elif kind == "directory":
        path = tmp_path / "dir.conf"
        path.mkdir()
    else:
        path = "/dev/zero"
    r = probe("opts", conf_file=path, conf="page_cache:6")   # opening a FIFO for reading would block forever
    lines = mallard_lines(r.stderr)
    assert len(lines) == 1 and str(path) in lines[0] and "not a regular file" in lines[0], r.stderr
    assert parse_opts(r.stdout)["page_cache"] == "6"   # start-up carried on


def test_conf_file_contents_are_never_echoed(probe, tmp_path):
    f = tmp_path / "mallard.conf"
    f.write_text("narenas:2\nsecret_key_abc:value_xyz\nretain:perhaps_secret\nno colon here\n")
    r = probe("opts", conf_file=f)
    lines = mallard_lines(r.stderr)
    assert len(lines) == 3, r.stderr
    assert "secret" not in r.stderr and "xyz" not in r.stderr and "colon" not in r.stderr, r.stderr
    assert "line 2" in lines[0] and "line 3" in lines[1] and "'retain'" in lines[1] and "line 4" in lines[2]
    assert parse_opts(r.stdout)["narenas"] == "2"


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_unterminated_value_is_not_scanned_past_its_end(build_dir, tmp_path):
    f = tmp_path / "mallard.conf"
    f.write_text("stats_print_opts:Jab")   # no newline: the value ends with the file
    env = {k: v for k, v in os.environ.items() if k not in ("MALLARD_CONF", "LD_PRELOAD")}
    env["MALLARD_CONF_PATH"] = str(f)
    r = subprocess.run(["valgrind", "-q", "--error-exitcode=99", str(build_dir / "bin" / "mallard-ctl-probe"), "opts"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert parse_opts(r.stdout)["stats_print_opts"] == "Jab"


# ---- options reported are options in force ----

def test_zero_on_free_refused_by_fast_variant(probe):
    r = probe("opts", conf="zero_on_free:true")
    lines = mallard_lines(r.stderr)
    assert len(lines) == 1 and "zero_on_free" in lines[0] and "secure" in lines[0], r.stderr
    assert parse_opts(r.stdout)["zero_on_free"] == "0"


def test_zero_on_free_false_accepted(probe):
    r = probe("opts", conf="zero_on_free:false")
    assert not mallard_lines(r.stderr) and parse_opts(r.stdout)["zero_on_free"] == "0"


@pytest.mark.parametrize("conf,key", [("guard_slab_interval:4", "guard_slab_interval"),
                                      ("secure_noaccess_min:256K", "secure_noaccess_min"),
                                      ("secure_noaccess_min:0", "secure_noaccess_min"),
                                      ("large_quarantine:8", "large_quarantine"),
                                      ("delayed_reuse:true", "delayed_reuse"),
                                      ("shuffle:16", "shuffle")])
def test_secure_defences_refused_by_fast_variant(probe, conf, key):
    """The fast variant has none of the secure defences: asked for one, it says so in one line and keeps it off."""
    r = probe("opts", conf=conf)
    lines = mallard_lines(r.stderr)
    assert len(lines) == 1 and f"'{key}'" in lines[0] and "not available in this variant" in lines[0], r.stderr
    assert "secure variant" in lines[0]
    assert parse_opts(r.stdout)[key] == DEFAULTS[key]


# ---- the printed options are in the parser's own syntax ----

CUSTOM = ("narenas:3,dirty_decay_ms:250,background_thread:false,retain:true,thp:never,page_cache:9,"
          "huge_cache_max:3M,stats_print_opts:Jb,slab_sizes:1-1024:2|8K-64K:16,junk:alloc")


def test_verbose_line_is_valid_configuration(probe):
    r = probe("opts", conf="verbose:true," + CUSTOM)
    line = [l for l in r.stderr.splitlines() if l.startswith("mallard ")][0]
    printed = line.split(": ", 1)[1]
    for key in ("thp:never", "slab_sizes:", "page_cache:9", "huge_cache_max:3145728", "zero_on_free:false",
                "guard_slab_interval:0", "secure_noaccess_min:none", "large_quarantine:0", "delayed_reuse:false",
                "shuffle:0", "junk:alloc"):
        assert key in printed, printed
    again = probe("opts", conf=printed)
    assert not [l for l in again.stderr.splitlines() if l.startswith("mallard:")], again.stderr
    assert parse_opts(again.stdout) == parse_opts(r.stdout)


def test_text_report_options_header_is_valid_configuration(probe):
    base = probe("opts", conf=CUSTOM)
    out = probe("text", conf=CUSTOM).stdout
    header = [l for l in out.splitlines() if l.startswith("options: ")][0]
    printed = header.split(": ", 1)[1]
    again = probe("opts", conf=printed)
    assert not [l for l in again.stderr.splitlines() if l.startswith("mallard:")], again.stderr
    assert parse_opts(again.stdout) == parse_opts(base.stdout)
