"""Python dict/JSON workload: builds nested records, serialises and parses them, merges and indexes dicts, checks every round trip."""
import argparse
import json
import os
import random
import sys
import time


def record(rng, i):
    return {
        "id": i,
        "name": f"user-{i:07d}",
        "email": f"user{i}@example.org",
        "score": rng.random(),
        "tags": [f"t{rng.randrange(1000)}" for _ in range(rng.randrange(1, 8))],
        "attrs": {f"k{j}": rng.randrange(1 << 30) for j in range(rng.randrange(1, 12))},
        "note": "x" * rng.randrange(0, 300),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    t0 = time.perf_counter()
    ops = 0
    checksum = 0
    for r in range(a.rounds):
        recs = [record(rng, i) for i in range(a.records)]
        text = json.dumps(recs)
        back = json.loads(text)
        if back != recs:
            print("pydict_json: JSON round trip changed the data", file=sys.stderr)
            return 3
        by_name = {x["name"]: x for x in back}
        by_tag = {}
        for x in back:
            for t in x["tags"]:
                by_tag.setdefault(t, []).append(x["id"])
        merged = {}
        for x in back[: a.records // 2]:
            merged.update(x["attrs"])
        # Rebuild smaller documents, dropping half the keys, as an API layer reshaping responses.
        slim = [{k: v for k, v in x.items() if k in ("id", "name", "tags")} for x in back]
        slim_text = json.dumps(slim, sort_keys=True)
        if len(json.loads(slim_text)) != a.records or len(by_name) != a.records:
            print("pydict_json: index sizes are wrong", file=sys.stderr)
            return 3
        checksum += sum(len(v) for v in by_tag.values()) + len(merged) + len(slim_text) % 1000
        ops += a.records
        del recs, back, by_name, by_tag, merged, slim, text, slim_text
    secs = time.perf_counter() - t0
    res = {"workload": "pydict_json", "threads": 1, "ops": ops, "seconds": round(secs, 6), "checksum": checksum,
           "pythonmalloc": os.environ.get("PYTHONMALLOC", "default")}
    print("RESULT " + json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
