"""Heap profiles of real distribution programs (Debian's python3 and redis-server) under LD_PRELOAD with prof:true:
Go's pprof reads them, and the sites holding the memory are named functions of those programs, not `??`."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import pprof_top

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "programs"))
import redis_server  # noqa: E402  (tests/programs' helper: a redis-server on 127.0.0.1 with a free port)

PY_SCRIPT = """
import sys
keep = []
for i in range(200000):
    keep.append({"k": str(i) * 3, "v": [i, i + 1, i + 2]})
print(len(keep))
"""


def named_share(rows: dict[str, tuple[int, int]]) -> float:
    """Share of the flat values attributed to named functions (not bare addresses, ?? or pprof's `[object]` for
    code it could not name: static functions of a stripped binary)."""
    total = sum(flat for flat, _ in rows.values())
    unnamed = sum(flat for name, (flat, _) in rows.items()
                  if name.startswith(("0x", "[", "<unknown>")) or "??" in name)
    return (total - unnamed) / total if total else 0.0


def outer_share(cum_rows: dict[str, tuple[int, int]], flat_rows: dict[str, tuple[int, int]], outer) -> float:
    """Largest cumulative share of the total held by one of the program's outermost functions: near 1 only when
    the stacks were unwound to the program's entry, not cut at the allocation's caller."""
    total = sum(flat for flat, _ in flat_rows.values())
    best = max((cum for name, (_, cum) in cum_rows.items() if name in outer), default=0)
    return best / total if total else 0.0


def test_python3_profile_names_cpython_allocators(lib, go, tmp_path):
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else shutil.which("python3")
    prefix = tmp_path / "py"
    env = dict(os.environ, LD_PRELOAD=str(lib), PYTHONMALLOC="malloc",
               MALLARD_CONF=f"prof:true,prof_final:true,prof_sample:64k,prof_prefix:{prefix}")
    p = subprocess.run([python, "-c", PY_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "200000", p.stderr
    finals = list(tmp_path.glob("py.*.final.pb.gz"))
    assert len(finals) == 1, f"expected one final profile: {sorted(f.name for f in tmp_path.iterdir())}"
    profile = finals[0]
    rows = pprof_top(go, Path(python), profile, "alloc_space", cum=True)
    names = " ".join(rows)
    # CPython's object allocators and the loop's callers carry the bytes: dicts, lists, str.
    assert any(n in names for n in ("PyObject_Malloc", "_PyObject_GC_New", "PyUnicode_New", "PyDict_New",
                                    "_PyObject_GC_NewVar", "PyList_New")), names[:2000]
    flat = pprof_top(go, Path(python), profile, "alloc_space")
    # Debian's python3 is stripped to its dynamic symbols: its static functions (most of the interpreter's
    # internal allocators) show as [python3] without python3.11-dbg, so only part of the bytes can be named.
    assert named_share(flat) > 0.2, flat
    # Whole stacks (not just the caller): the interpreter's entry carries most of the bytes cumulatively.
    assert outer_share(rows, flat, ("Py_RunMain", "Py_BytesMain", "main")) > 0.5, names[:2000]


@pytest.mark.skipif(not (shutil.which("redis-server") and shutil.which("redis-cli")),
                    reason="redis-server and redis-cli are not installed")
def test_redis_server_profile_names_redis_functions(lib, go, tmp_path):
    prefix = tmp_path / "redis"
    env = dict(os.environ, LD_PRELOAD=str(lib),
               MALLARD_CONF=f"prof:true,prof_sample:64k,prof_signal:SIGUSR2,prof_prefix:{prefix}")
    server = redis_server.Server(tmp_path, env=env, cli_env=None, args=("--enable-debug-command", "local"))
    try:
        assert server.cli("DEBUG", "POPULATE", "100000", "key", "200", timeout=60, text=True).stdout.strip() == "OK"
        server.proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        dumps: list[Path] = []
        while not dumps:
            assert time.monotonic() < deadline, "SIGUSR2 wrote no profile"
            time.sleep(0.1)
            dumps = [d for d in tmp_path.glob("redis.*.0.pb.gz")]
    finally:
        server.stop()
    exe = Path(os.path.realpath(shutil.which("redis-server")))
    rows = pprof_top(go, exe, dumps[0], "inuse_space", cum=True)
    names = " ".join(rows)
    # Redis allocates through zmalloc/zcalloc/zrealloc into its dict, sds and listpack code.
    assert any(n.startswith(("zmalloc", "zcalloc", "zrealloc", "ztrymalloc", "_sdsnewlen", "sdsnewlen", "dictAdd",
                             "dictCreate", "lpNew", "lpInsert", "createObject", "createStringObject"))
               for n in rows), names[:2000]
    flat = pprof_top(go, exe, dumps[0], "inuse_space")
    assert named_share(flat) > 0.9, flat
    assert outer_share(rows, flat, ("aeMain", "main")) > 0.5, names[:2000]
