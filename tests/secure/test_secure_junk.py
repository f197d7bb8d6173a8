"""Debug fills (junk:alloc|free|true|false) on every allocator path, in both variants: new memory (not calloc's)
reads 0xa5, freed memory that stays readable reads 0x5a, and junk:false leaves no pattern."""
import pytest

from test_secure_misuse import FAST, SECURE, output, run

# What each path of `mallard-misuse junk` reads with junk:true (misuse.c: junk_paths).
NEW = {"small-new": "alloc", "small-new-thread-malloc0": "alloc", "large-new": "alloc", "huge-new": "alloc", "realloc-small-tail": "alloc",
       "realloc-large-tail": "alloc", "realloc-huge-tail": "alloc"}
FREED = {"small-freed": "free", "small-remote-freed": "free", "large-freed": "free", "huge-freed": "free",
         "realloc-small-old": "free", "realloc-large-shrink": "free"}
ALWAYS = {"small-calloc": "zero", "large-calloc": "zero", "huge-calloc": "zero", "realloc-small-kept": "mine",
          "realloc-large-kept": "mine", "realloc-huge-kept": "mine"}
# The secure variant's freed large and huge blocks are PROT_NONE from secure_noaccess_min on: read with it off.
LIBS = {"fast": (FAST, ""), "secure": (SECURE, ",secure_noaccess_min:none")}


def paths(lib, conf, mode="junk"):
    r = run(lib, mode, conf=conf)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "mallard" not in r.stderr, r.stderr   # no false corruption report, no refused option
    return dict(line.split() for line in r.stdout.splitlines())


@pytest.mark.parametrize("variant", LIBS)
def test_junk_true_every_path(variant):
    lib, extra = LIBS[variant]
    got = paths(lib, "junk:true" + extra)
    want = {**NEW, **FREED, **ALWAYS}
    if got.get("realloc-large-shrink") == "moved":   # only a block shrunk in place has bytes to read
        want["realloc-large-shrink"] = "moved"
    assert got == want


@pytest.mark.parametrize("variant", LIBS)
def test_junk_false_leaves_no_pattern(variant):
    lib, extra = LIBS[variant]
    got = paths(lib, "junk:false" + extra)
    assert set(got) >= set(NEW) | set(FREED) | set(ALWAYS)
    assert not {k for k, v in got.items() if v in ("alloc", "free")}, got
    assert all(got[k] == v for k, v in ALWAYS.items()), got


@pytest.mark.parametrize("variant", LIBS)
def test_junk_alloc_fills_only_new_memory(variant):
    lib, extra = LIBS[variant]
    got = paths(lib, "junk:alloc" + extra)
    assert all(got[k] == "alloc" for k in NEW), got
    assert not [k for k in FREED if got[k] == "free"], got
    assert all(got[k] == v for k, v in ALWAYS.items()), got


@pytest.mark.parametrize("variant", LIBS)
def test_junk_free_fills_only_freed_memory(variant):
    lib, extra = LIBS[variant]
    got = paths(lib, "junk:free" + extra)
    assert not [k for k in NEW if got[k] == "alloc"], got
    assert all(got[k] == "free" for k in FREED if got[k] != "moved"), got
    assert all(got[k] == v for k, v in ALWAYS.items()), got


def test_secure_junk_with_its_defences_on():
    """The secure variant's defaults (freed big blocks PROT_NONE, canaries, encrypted links) with junk:true: no false
    report, every readable path filled."""
    got = paths(SECURE, "junk:true", mode="junk-live")
    assert "large-freed" not in got and "huge-freed" not in got
    assert all(got[k] == v for k, v in {**NEW, **ALWAYS}.items()), got
    assert all(got[k] == "free" for k in ("small-freed", "small-remote-freed", "realloc-small-old")), got


@pytest.mark.parametrize("lib", [FAST, SECURE])
def test_junk_keeps_heap_profiling_sampling(lib):
    """junk:alloc sends every allocation to the countdown's slow path: the profiler still samples at its rate."""
    conf = "prof:true,prof_sample:16384"
    plain = int(output(lib, "junk-prof", conf))
    junk = int(output(lib, "junk-prof", conf + ",junk:true"))
    # 4096 blocks of 1000 bytes at one sample per 16 KiB: about 250 samples either way.
    assert 150 < plain < 400 and 150 < junk < 400, (plain, junk)
