"""Heap profiling accuracy, read back through Go's pprof: known leak, hold and churn sites at a fine rate (±10%), at the
default rate (churn ±10%, leak and hold present), and in a build without frame pointers."""
from __future__ import annotations

import os
import subprocess

import pytest

from conftest import pprof_top

LEAK = 1000 * 10240          # bytes leak_site leaves live
HOLD = 800 * 65536           # bytes hold_site holds at the dump
CHURN_MIN = 1 << 30          # bytes churn_site allocates (it stops at the first whole pass past 1 GiB)


def profile(lib, exe, tmp_path, conf: str):
    out = tmp_path / "accuracy.pb.gz"
    env = dict(os.environ, LD_PRELOAD=str(lib), MALLARD_CONF=conf)
    res = subprocess.run([str(exe), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert out.exists() and out.stat().st_size > 0
    return out


def near(got: int, want: int, tol: float) -> bool:
    return abs(got - want) <= tol * want


@pytest.mark.parametrize("flags", [(), ("-fomit-frame-pointer",)], ids=["default", "omit-frame-pointer"])
def test_fine_rate(lib, go, build_prog, tmp_path, flags):
    exe = build_prog("accuracy", *flags)
    prof = profile(lib, exe, tmp_path, "prof:true,prof_sample:8k")
    inuse = pprof_top(go, exe, prof, "inuse_space")
    assert near(inuse["leak_site"][0], LEAK, 0.10), inuse.get("leak_site")
    assert near(inuse["hold_site"][0], HOLD, 0.10), inuse.get("hold_site")
    alloc = pprof_top(go, exe, prof, "alloc_space")
    assert near(alloc["churn_site"][0], CHURN_MIN, 0.10), alloc.get("churn_site")
    # whole stacks: the unwinder walks from each site up through their caller (with or without frame pointers)
    assert near(inuse["run_sites"][1], LEAK + HOLD, 0.10), inuse.get("run_sites")
    assert near(alloc["run_sites"][1], LEAK + HOLD + CHURN_MIN, 0.10), alloc.get("run_sites")
    objs = pprof_top(go, exe, prof, "inuse_objects")
    assert near(objs["leak_site"][0], 1000, 0.10) and near(objs["hold_site"][0], 800, 0.10), objs


def test_default_rate(lib, go, build_prog, tmp_path):
    exe = build_prog("accuracy")
    prof = profile(lib, exe, tmp_path, "prof:true")
    alloc = pprof_top(go, exe, prof, "alloc_space")
    assert near(alloc["churn_site"][0], CHURN_MIN, 0.10), alloc.get("churn_site")
    inuse = pprof_top(go, exe, prof, "inuse_space")
    assert inuse.get("leak_site", (0, 0))[0] > 0 and inuse.get("hold_site", (0, 0))[0] > 0, inuse


def test_prof_off_writes_nothing(lib, build_prog, tmp_path):
    """prof:false: prof.dump is refused (EPERM = 1) and no file appears."""
    exe = build_prog("accuracy")
    out = tmp_path / "none.pb.gz"
    res = subprocess.run([str(exe), str(out)], env=dict(os.environ, LD_PRELOAD=str(lib)), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1 and "prof.dump: 1" in res.stderr
    assert not out.exists()
