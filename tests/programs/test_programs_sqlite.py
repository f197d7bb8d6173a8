"""sqlite3 under LD_PRELOAD=libmallard.so: an in-memory database of 100k rows, indexed, aggregated and updated."""
ROWS = 100_000
GROUPS = 97

SCRIPT = f"""
CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, pad TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {ROWS})
  INSERT INTO t SELECT x, x % {GROUPS}, printf('name-%08d', x), substr(hex(zeroblob(200)), 1, x % 200) FROM c;
CREATE INDEX t_name ON t(name);
CREATE INDEX t_grp ON t(grp, id);
SELECT 'count', count(*), sum(id), count(DISTINCT grp), sum(length(pad)) FROM t;
SELECT 'group', grp, count(*), sum(id) FROM t WHERE grp IN (0, 1, 96) GROUP BY grp ORDER BY grp;
SELECT 'lookup', id FROM t WHERE name = 'name-00031337';
UPDATE t SET pad = pad || pad WHERE id % 10 = 0;
DELETE FROM t WHERE id % 2 = 0;
SELECT 'after', count(*), sum(id), sum(length(pad)) FROM t;
SELECT 'sorted', group_concat(id) FROM (SELECT id FROM t ORDER BY pad DESC, id LIMIT 3);
"""


def expected_lines() -> list[str]:
    ids = range(1, ROWS + 1)
    lines = [f"count|{ROWS}|{sum(ids)}|{GROUPS}|{sum(i % 200 for i in ids)}"]
    for g in (0, 1, 96):
        members = [i for i in ids if i % GROUPS == g]
        lines.append(f"group|{g}|{len(members)}|{sum(members)}")
    lines.append("lookup|31337")
    pad = {i: (i % 200) * (2 if i % 10 == 0 else 1) for i in ids}
    kept = [i for i in ids if i % 2]
    lines.append(f"after|{len(kept)}|{sum(kept)}|{sum(pad[i] for i in kept)}")
    # pad is a run of '0's: ORDER BY pad DESC puts the longest first, ties by id.
    top = sorted(kept, key=lambda i: (-pad[i], i))[:3]
    lines.append("sorted|" + ",".join(map(str, top)))
    return lines


def test_sqlite_100k_rows_in_memory(preload_variant, tmp_path):
    r = preload_variant.run(["sqlite3", "-batch", ":memory:"], input=SCRIPT, extra_env={"HOME": str(tmp_path)})
    assert r.stdout.splitlines() == expected_lines()
    assert r.stderr == ""
    rep = r.assert_mallard_active(min_mallocs=100_000)
    # Everything but SQLite's own caches is freed when the database closes at exit.
    assert rep["stats"]["allocated"] < 4 << 20
