"""ruby and node under LD_PRELOAD=libmallard.so: scripts building strings, hashes, objects and Buffers."""
from pathlib import Path

HERE = Path(__file__).resolve().parent


def ruby_expected() -> str:
    n = 200_000
    value_bytes = sum(i % 100 + len(str(i)) for i in range(n))
    keys = sum(1 for i in range(n) if not str(i).endswith("7"))
    joined = sum(len(f"item{i},") for i in range(20_000))
    thread_bytes = sum(2 * len(str(i * (k + 1))) for k in range(4) for i in range(50_000))
    return f"keys={keys} value_bytes={value_bytes} parts=20000 joined={joined} thread_bytes={thread_bytes}"


def node_expected() -> str:
    buffers = sum(100 + i % 5000 for i in range(20_000))
    first = sum(i & 0xFF for i in range(20_000))
    kept = len(range(0, 20_000, 3))
    large = sum(i * 100_000 for i in range(1, 21))
    strs = sum(i % 50 for i in range(100_000))
    return (f"buffers={buffers} first={first} kept={kept} large={large} zlib={len('mallard ') * 100_000} "
            f"objects=100000 str={strs}")


def test_ruby_strings_hashes_threads(preload_variant, tmp_path):
    r = preload_variant.run(["ruby", str(HERE / "workload.rb")], extra_env={"HOME": str(tmp_path)})
    assert r.stdout.strip() == ruby_expected()
    assert r.stderr == ""
    rep = r.assert_mallard_active(min_mallocs=100_000)
    # Ruby's object heap pages and the big hash tables come from Mallard too, as large or huge blocks.
    assert rep["stats"]["large"]["nmalloc"] + rep["stats"]["huge"]["nmalloc"] > 0


def test_node_buffers_and_objects(preload_variant, tmp_path):
    r = preload_variant.run(["node", str(HERE / "workload.js")], extra_env={"HOME": str(tmp_path)})
    assert r.stdout.strip() == node_expected()
    assert r.stderr == ""
    rep = r.assert_mallard_active(min_mallocs=100_000)
    # Buffers of 300 KB .. 2 MB have malloc'd backing stores: at least those 18 are large (or huge) blocks.
    assert rep["stats"]["large"]["nmalloc"] + rep["stats"]["huge"]["nmalloc"] >= 18
