-- In-memory SQLite workload for the sqlite3 shell: set @n first (.parameter set @n 50000), then .read this file.
CREATE TABLE kv(id INTEGER PRIMARY KEY, k TEXT NOT NULL, v TEXT NOT NULL, grp INTEGER NOT NULL);
WITH RECURSIVE seq(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM seq WHERE x < @n)
INSERT INTO kv(id, k, v, grp) SELECT x, printf('key%09d', x), hex(randomblob(8 + x % 200)), x % 97 FROM seq;
CREATE INDEX kv_k ON kv(k);
CREATE INDEX kv_grp ON kv(grp, id);
-- Grow a third of the values, delete a fifth of the rows: the page cache reallocates and frees.
UPDATE kv SET v = v || hex(randomblob(64)) WHERE id % 3 = 0;
DELETE FROM kv WHERE id % 5 = 0;
CREATE TABLE agg AS SELECT grp, count(*) AS c, sum(length(v)) AS bytes, group_concat(substr(k, 4, 4), ',') AS ks
  FROM kv GROUP BY grp ORDER BY grp;
CREATE TEMP TABLE joined AS SELECT a.id, b.k FROM kv a JOIN kv b ON b.id = a.id + 1 WHERE a.grp < 50;
-- The check: row counts follow from @n exactly; lengths follow from the generator (hex doubles byte counts).
SELECT 'RESULT ' || json_object(
  'workload', 'sqlite', 'n', @n,
  'rows', (SELECT count(*) FROM kv),
  'groups', (SELECT count(*) FROM agg),
  'joined', (SELECT count(*) FROM joined),
  'ok', (SELECT count(*) FROM kv) = @n - @n / 5
        AND (SELECT sum(c) FROM agg) = @n - @n / 5
        AND (SELECT sum(length(v)) FROM kv) =
            (SELECT sum(2 * (8 + id % 200) + CASE WHEN id % 3 = 0 THEN 128 ELSE 0 END) FROM kv)
        AND (SELECT count(*) FROM kv WHERE k = printf('key%09d', id)) = @n - @n / 5);
