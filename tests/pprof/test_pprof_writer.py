"""The heap profile writer (src/prof/pprof.c): its gzip'd profile.proto checked with the real reader (go tool pprof),
gzip -t, Python's gzip and a small independent protobuf walker. The programs are tests/pprof/pprof_writer.c, built
twice: with debug info (pprof-writer) and stripped to its dynamic symbols (pprof-writer-stripped)."""
import gzip
import os
import re
import subprocess

import pathlib

import pytest

REPO_TESTS = pathlib.Path(__file__).resolve().parent
SAMPLE_TYPES = [("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"),
                ("inuse_space", "bytes")]


# ---- an independent protobuf walker (tests only): wire format -> {field: [values]} ----
def varint(buf, i):
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i
        assert shift < 70, "varint too long"


def fields(buf):
    """{field number: [int or bytes]}; the whole buffer must be consumed exactly."""
    out, i = {}, 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 2:
            n, i = varint(buf, i)
            v = bytes(buf[i:i + n])
            assert len(v) == n, "truncated length-delimited field"
            i += n
        else:
            raise AssertionError(f"unexpected wire type {wt} for field {num}")
        out.setdefault(num, []).append(v)
    assert i == len(buf)
    return out


def packed(vals):
    """A repeated varint field: packed (bytes) or not (ints)."""
    res = []
    for v in vals:
        if isinstance(v, bytes):
            i = 0
            while i < len(v):
                x, i = varint(v, i)
                res.append(x)
        else:
            res.append(v)
    return res


def s64(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def one(f, num, default=0):
    v = f.get(num, [default])
    assert len(v) == 1, f"field {num} repeated"
    return v[0]


def decode(path):
    raw = gzip.open(path).read()
    p = fields(raw)
    strings = [s.decode() for s in p.get(6, [])]
    prof = {"raw": raw, "strings": strings}
    prof["sample_type"] = [(strings[one(f, 1)], strings[one(f, 2)]) for f in map(fields, p.get(1, []))]
    prof["samples"] = [(packed(f.get(1, [])), [s64(x) for x in packed(f.get(2, []))]) for f in map(fields, p.get(2, []))]
    prof["mappings"] = [{k: one(f, n) for k, n in (("id", 1), ("start", 2), ("limit", 3), ("offset", 4), ("file", 5),
                                                   ("build_id", 6), ("has_functions", 7))}
                        for f in map(fields, p.get(3, []))]
    for m in prof["mappings"]:
        m["file"], m["build_id"] = strings[m["file"]], strings[m["build_id"]]
    prof["locations"] = [{"id": one(f, 1), "mapping": one(f, 2), "address": one(f, 3),
                          "functions": [one(fields(line), 1) for line in f.get(4, [])]}
                         for f in map(fields, p.get(4, []))]
    prof["functions"] = {one(f, 1): (strings[one(f, 2)], strings[one(f, 3)]) for f in map(fields, p.get(5, []))}
    assert len(prof["functions"]) == len(p.get(5, [])), "function ids repeat"
    prof["period_type"] = tuple(strings[one(fields(one(p, 11)), n)] for n in (1, 2))
    prof["period"] = s64(one(p, 12))
    prof["time_nanos"], prof["duration_nanos"] = s64(one(p, 9)), s64(one(p, 10))
    prof["default_sample_type"] = strings[one(p, 14)]
    return prof


# ---- helpers ----
def run_writer(build_dir, program, *args):
    r = subprocess.run([str(build_dir / "bin" / program), *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def keyvals(out):
    return dict(re.findall(r"(\w+)=(\S+)", out))


def build_id(path):
    """The GNU build ID as readelf -n prints it."""
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True, check=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", out).group(1)


def pprof_raw(pprof, path):
    """pprof -raw: (samples [(values, location ids)], {location id: (address, mapping id, text)}, mappings)."""
    out = pprof("-raw", path)
    samples, locs, maps = [], {}, []
    section = None
    for line in out.splitlines():
        if line in ("Samples:", "Locations", "Mappings"):
            section = line
            continue
        if section == "Samples:" and ":" in line and not line.startswith("alloc_objects"):
            vals, ids = line.split(":", 1)
            samples.append(([int(v) for v in vals.split()], [int(x) for x in ids.split()]))
        elif section == "Locations" and re.match(r"\s+\d+: 0x", line):
            m = re.match(r"\s+(\d+): (0x[0-9a-f]+) M=(\d+) ?(.*)", line)
            locs[int(m.group(1))] = (int(m.group(2), 16), int(m.group(3)), m.group(4))
        elif section == "Mappings" and re.match(r"\d+: 0x", line):
            maps.append(line.split())
    return samples, locs, maps


def total(pprof, path, index, *opts):
    unit = ["-unit=B"] if index.endswith("space") else []
    out = pprof("-top", f"-sample_index={index}", *unit, *opts, path)
    return int(re.search(r"% of (\d+)B? total", out).group(1))


# ---- tests ----
@pytest.mark.parametrize("program", ["pprof-writer", "pprof-writer-stripped"])
def test_basic_profile(build_dir, pprof, tmp_path, program):
    out = tmp_path / "basic.pb.gz"
    kv = {k: int(v, 16) for k, v in keyvals(run_writer(build_dir, program, "basic", out)).items()}
    assert subprocess.run(["gzip", "-t", str(out)]).returncode == 0
    p = decode(out)
    # the fixed parts
    assert p["strings"][0] == ""
    assert p["sample_type"] == SAMPLE_TYPES
    assert p["period_type"] == ("space", "bytes") and p["period"] == 524288
    assert p["default_sample_type"] == "inuse_space"
    assert p["time_nanos"] == 1700000000123456789 and p["duration_nanos"] == 2500000000
    assert len(set(p["strings"])) == len(p["strings"]), "string table entries repeat"
    # locations: one per distinct pc, address pc - 1, ids 1..n
    addrs = [loc["address"] for loc in p["locations"]]
    assert [loc["id"] for loc in p["locations"]] == list(range(1, len(addrs) + 1))
    assert sorted(addrs) == sorted({kv["ra_in_beta"] - 1, kv["ra_in_gamma"] - 1, kv["ra_in_main"] - 1,
                                    kv["ra_in_static"] - 1, kv["nosize"], kv["nosize"] + 32})
    by_addr = {loc["address"]: loc for loc in p["locations"]}
    ids = {name: by_addr[kv[name] - 1]["id"] for name in ("ra_in_beta", "ra_in_gamma", "ra_in_main", "ra_in_static")}
    assert p["samples"] == [
        ([ids["ra_in_beta"], ids["ra_in_gamma"], ids["ra_in_main"]], [10, 10240, 4, 4096]),
        ([ids["ra_in_gamma"], ids["ra_in_main"]], [3, 3000, 1, 1000]),   # the 0 pc dropped
        ([ids["ra_in_static"], ids["ra_in_main"]], [7, 700, 0, 0]),
        ([], [1, 1, 1, 1]),
        ([by_addr[kv["nosize"]]["id"], by_addr[kv["nosize"] + 32]["id"]], [5, 50, 0, 0]),
    ]
    # our own names (from .dynsym, kept even in the stripped program); the static function has no name of ours,
    # and above all not its exported neighbour's
    def our_name(key):
        fids = by_addr[kv[key] - 1]["functions"]
        return [p["functions"][f][0] for f in fids]
    assert our_name("ra_in_beta") == ["pprof_test_beta"]
    assert our_name("ra_in_gamma") == ["pprof_test_gamma"]
    assert our_name("ra_in_static") == []
    assert by_addr[kv["nosize"]]["functions"] == []   # a symbol without a size names nothing
    assert by_addr[kv["nosize"] + 32]["functions"] == []
    assert all(name == system for name, system in p["functions"].values())
    # mappings: the program first, with its file and build ID; each location's mapping holds its address
    exe = build_dir / "bin" / program
    m0 = p["mappings"][0]
    assert os.path.realpath(m0["file"]) == os.path.realpath(exe)
    assert m0["build_id"] == build_id(exe)
    assert m0["start"] <= kv["alpha"] < m0["limit"] and m0["has_functions"] == 0
    maps = {m["id"]: m for m in p["mappings"]}
    assert sorted(maps) == list(range(1, len(maps) + 1))
    for loc in p["locations"]:
        m = maps[loc["mapping"]]
        assert m["start"] <= loc["address"] < m["limit"]
        if loc["address"] == kv["ra_in_main"] - 1:   # main's caller is in libc
            assert "libc" in os.path.basename(m["file"]) and m["build_id"] == build_id(m["file"])

    # the real reader
    samples, locs, pmaps = pprof_raw(pprof, out)
    assert [vals for vals, _ in samples] == [[10, 10240, 4, 4096], [3, 3000, 1, 1000], [7, 700, 0, 0], [1, 1, 1, 1],
                                             [5, 50, 0, 0]]
    assert [[locs[i][0] for i in lids] for _, lids in samples] == [
        [kv["ra_in_beta"] - 1, kv["ra_in_gamma"] - 1, kv["ra_in_main"] - 1],
        [kv["ra_in_gamma"] - 1, kv["ra_in_main"] - 1], [kv["ra_in_static"] - 1, kv["ra_in_main"] - 1], [],
        [kv["nosize"], kv["nosize"] + 32]]
    text = {addr: t for addr, _, t in locs.values()}
    assert text[kv["ra_in_beta"] - 1].startswith("pprof_test_beta ")
    assert text[kv["ra_in_gamma"] - 1].startswith("pprof_test_gamma ")
    assert "pprof_test_neighbour" not in text[kv["ra_in_static"] - 1]
    if program == "pprof-writer":
        # has_functions is false: pprof still reads the debug info, for file:line and the static function
        assert re.match(r"pprof_test_beta \S*pprof_writer\.c:\d+", text[kv["ra_in_beta"] - 1])
        assert text[kv["ra_in_static"] - 1].startswith("hidden_static_function ")
    else:
        assert text[kv["ra_in_static"] - 1] == ""
        assert text[kv["nosize"]] == "" and text[kv["nosize"] + 32] == ""
    assert os.path.realpath(pmaps[0][2]) == os.path.realpath(exe) and pmaps[0][3] == build_id(exe)
    for index, want in zip(("alloc_objects", "alloc_space", "inuse_objects", "inuse_space"), (26, 13991, 6, 5097)):
        assert total(pprof, out, index) == want
    top = pprof("-top", "-sample_index=alloc_space", "-unit=B", out)
    assert re.search(r"^\s+10240B\s.*\spprof_test_beta$", top, re.M), top
    assert re.search(r"^\s+3000B\s.*\s13240B\s.*\spprof_test_gamma$", top, re.M), top


def test_many_samples(build_dir, pprof, tmp_path):
    """100k samples over 20k distinct pcs: buffers and hash tables grow many times."""
    out = tmp_path / "many.pb.gz"
    kv = {k: int(v) for k, v in keyvals(run_writer(build_dir, "pprof-writer", "many", out, 100000)).items()}
    assert subprocess.run(["gzip", "-t", str(out)]).returncode == 0
    p = decode(out)
    assert len(p["samples"]) == 100000
    sums = [sum(v[k] for _, v in p["samples"]) for k in range(4)]
    want = [kv["alloc_objects"], kv["alloc_space"], kv["inuse_objects"], kv["inuse_space"]]
    assert sums == want
    assert len(p["locations"]) == kv["distinct_pcs"]
    assert len({loc["address"] for loc in p["locations"]}) == len(p["locations"])
    nloc = len(p["locations"])
    assert all(1 <= i <= nloc for lids, _ in p["samples"] for i in lids)
    assert [len(lids) for lids, _ in p["samples"][:16]] == [1 + i % 8 for i in range(16)]
    for index, w in zip(("alloc_objects", "alloc_space", "inuse_objects", "inuse_space"), want):
        assert total(pprof, out, index, "-symbolize=none") == w   # (symbolising 20k pcs from DWARF is slow)
    # the LZ77 pass finds the repeats: well under the raw size
    assert os.path.getsize(out) < 0.9 * len(p["raw"])


@pytest.mark.parametrize("program", ["pprof-writer", "pprof-writer-stripped"])
def test_deep_stacks(build_dir, pprof, tmp_path, program):
    """A 128-frame stack from a real recursion, and 128 distinct synthetic frames."""
    out = tmp_path / "deep.pb.gz"
    kv = keyvals(run_writer(build_dir, program, "deep", out))
    recurse = int(kv["recurse"], 16)
    p = decode(out)
    (rec, _), (syn, _) = p["samples"]
    assert len(rec) == 128 and len(syn) == 128
    loc = {x["id"]: x for x in p["locations"]}
    assert [loc[i]["address"] for i in syn] == [recurse + k for k in range(128)]
    names = {i: [p["functions"][f][0] for f in x["functions"]] for i, x in loc.items()}
    assert names[rec[0]] == ["pprof_test_recurse"] and names[rec[127]] == ["main"]
    samples, locs, _ = pprof_raw(pprof, out)
    assert [len(lids) for _, lids in samples] == [128, 128]
    assert [locs[i][0] for i in samples[0][1]] == [loc[i]["address"] for i in rec]
    assert locs[samples[0][1][127]][2].startswith("main ")
    if program == "pprof-writer":
        # the compiler unrolled part of the recursion into clones; pprof finds every frame's line in the debug info
        # (Go's pprof leaves the name empty for a function also inlined elsewhere: it does not follow
        # DW_AT_abstract_origin; the stripped program keeps our dynsym name instead)
        src = (REPO_TESTS / "pprof_writer.c").read_text().splitlines()
        first = next(n for n, line in enumerate(src, 1) if "void pprof_test_recurse(" in line)
        lines = {int(m.group(1)) for i in samples[0][1][:127]
                 for m in [re.search(r"pprof_writer\.c:(\d+)", locs[i][2])] if m}
        assert len([i for i in samples[0][1][:127] if "pprof_writer.c:" in locs[i][2]]) == 127
        assert lines and all(first <= n <= first + 4 for n in lines), (first, lines)
    else:
        assert locs[samples[0][1][0]][2].startswith("pprof_test_recurse ")
    assert total(pprof, out, "alloc_space") == 384


def test_write_file_is_all_or_nothing(build_dir, pprof, tmp_path):
    out = tmp_path / "f.pb.gz"
    assert run_writer(build_dir, "pprof-writer", "file", out).strip() == "ok"
    assert os.listdir(tmp_path) == ["f.pb.gz"]   # the failed second write left no temporary file
    assert subprocess.run(["gzip", "-t", str(out)]).returncode == 0
    assert total(pprof, out, "alloc_space") == 100


def test_interrupted_short_writes(build_dir, tmp_path):
    """Through a slow pipe with SIGALRM every 100 us (no SA_RESTART): the same bytes as a direct write."""
    out = tmp_path / "pipe.pb.gz"
    kv = keyvals(run_writer(build_dir, "pprof-writer", "pipe", out))
    assert int(kv["alarms"]) > 0
    assert out.read_bytes() == (tmp_path / "pipe.pb.gz.direct").read_bytes()
    assert len(decode(out)["samples"]) == 30000


def test_errors(build_dir):
    assert run_writer(build_dir, "pprof-writer", "errors").strip() == "ok"
