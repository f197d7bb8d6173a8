"""Automatic dumps (prof_interval, prof_signal) and records across prof.reset, with the test program dumps.c:
about one interval dump per interval crossed (also when one sample is worth several intervals), prof_signal refusing
the signals sigaction cannot install (glibc's 32 and 33) and saying so when sigaction fails, no dump written while a
dlopen is in progress, and a huge block resized during prof.reset forgotten like every other block."""
from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
MIB = 1 << 20


def run(lib, exe, args, conf: str, preload: list[Path] | None = None, extra_env: dict | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, LD_PRELOAD=" ".join(str(p) for p in [*(preload or []), lib]), MALLARD_CONF=conf,
               **(extra_env or {}))
    res = subprocess.run([str(exe), *map(str, args)], env=env, capture_output=True, text=True, timeout=120)
    if check:
        assert res.returncode == 0, (res.returncode, res.stdout, res.stderr)
    return res


def interval_dumps(lib, exe, tmp_path, block: int, count: int, interval: int, sample: int) -> tuple[int, int]:
    """Runs `dumps blocks`: returns (samples, dump files written)."""
    out = tmp_path / f"b{block}_i{interval}_s{sample}"
    out.mkdir()
    conf = (f"prof:true,prof_seed:7,prof_sample:{sample},prof_interval:{interval},prof_prefix:{out}/p,"
            "background_thread:false")
    res = run(lib, exe, ["blocks", block, count], conf)
    m = re.fullmatch(r"samples (\d+) dumps (\d+)\n", res.stdout)
    assert m, res.stdout
    files = list(out.glob("p.*.pb.gz"))
    assert len(files) == int(m.group(2)), (files, res.stdout)
    return int(m.group(1)), len(files)


@pytest.mark.parametrize("block,count,sample", [
    (8 * MIB, 100, 512 * 1024),     # 800 MiB, each block worth 8 intervals: one dump per block (it was 1 in all)
    (64 * 1024, 4096, 4 * MIB),     # prof_interval below half of prof_sample: each sample worth ~4 intervals
    (64 * 1024, 1024, 512 * 1024),  # each sample worth about half an interval: one dump per interval
])
def test_interval_dumps_keep_coming(lib, build_prog, tmp_path, block, count, sample):
    """prof_interval:1M writes about one dump per interval crossed, several crossed by one sample giving one dump
    (the counter keeps the remainder). A sample worth more than twice the interval used to stop interval dumps for
    good: 800 MiB in 8 MiB blocks wrote 1 dump."""
    exe = build_prog("dumps", "-pthread")
    interval = MIB
    samples, dumps = interval_dumps(lib, exe, tmp_path, block, count, interval, sample)
    total = block * count
    # Estimated bytes per sample: about max(block, sample); a sample crosses at most one interval's dump.
    per_sample = max(block, sample)
    expected = min(samples, total // interval) if per_sample >= interval else total // interval
    assert samples > 20, samples
    assert 0.7 * expected <= dumps <= 1.3 * expected + 1, (samples, dumps, expected)
    assert dumps <= samples, (samples, dumps)


def test_prof_signal_refuses_glibc_reserved_numbers(lib, build_prog):
    """32 and 33 lie below SIGRTMIN (glibc keeps them for itself: sigaction refuses them): refused at start-up with
    the usual message, like SIGKILL, and not reported in force. They used to be accepted, and no dump ever came."""
    exe = build_prog("dumps", "-pthread")
    for value in ("32", "33", "SIG32", "KILL", "65"):
        res = run(lib, exe, ["blocks", 100, 1], f"prof:true,prof_signal:{value},verbose:true")
        assert f"bad value for option 'prof_signal' (value '{value}')" in res.stderr, res.stderr
        assert ",prof_signal:none," in res.stderr, res.stderr


def test_prof_signal_real_time_signal_dumps(lib, build_prog, tmp_path):
    """A real-time signal (SIGRTMIN, read at run time, and SIGRTMIN+1) is accepted and dumps (prof_sample:1: the
    dump thread starts at the first sample)."""
    exe = build_prog("dumps", "-pthread")
    for sig in (int(signal.SIGRTMIN), int(signal.SIGRTMIN) + 1):
        out = tmp_path / f"rt{sig}"
        out.mkdir()
        res = run(lib, exe, ["raise", sig], f"prof:true,prof_sample:1,prof_signal:{sig},prof_prefix:{out}/p,verbose:true")
        assert f",prof_signal:{sig}," in res.stderr, res.stderr
        assert res.stdout == "dumps 1\n", (res.stdout, res.stderr)
        assert len(list(out.glob("p.*.0.pb.gz"))) == 1, list(out.iterdir())


def test_prof_signal_sigaction_failure_is_reported(lib, build_prog, tmp_path):
    """When sigaction refuses the handler, one clear line says so (it used to be ignored: the option looked in force
    and the signal then killed the process)."""
    exe = build_prog("dumps", "-pthread")
    shim = tmp_path / "sigaction_fails.so"
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-o", str(shim),
                    str(HERE / "sigaction_fails.c")], check=True)
    res = run(lib, exe, ["blocks", 100, 1], "prof:true,prof_signal:SIGUSR2", preload=[shim],
              extra_env={"MLD_TEST_REFUSE_SIGNAL": str(int(signal.SIGUSR2))})
    assert re.search(r"^mallard: prof: prof_signal:SIGUSR2: cannot install a handler \(EINVAL\); no profile will be "
                     r"written on that signal$", res.stderr, re.M), res.stderr


def test_no_interval_dump_while_a_dlopen_is_in_progress(lib, build_prog, tmp_path):
    """Samples taken while the loader's state says a dlopen is mapping objects write no dump (the writer walks the
    loader's half-updated lists); the dump waits for the next sample in a safe context."""
    exe = build_prog("dumps", "-pthread")
    res = run(lib, exe, ["unsafe-interval"],
              f"prof:true,prof_sample:1,prof_interval:1k,prof_prefix:{tmp_path}/p,background_thread:false")
    m = re.fullmatch(r"in_window (\d+) after (\d+)\n", res.stdout)
    assert m, res.stdout
    assert int(m.group(1)) == 0, res.stdout
    assert int(m.group(2)) >= 1, res.stdout


def test_no_early_signal_dump_while_a_dlopen_is_in_progress(lib, build_prog, tmp_path):
    """The same for a signal dump taken by a sample before the dump thread runs (in a fork child)."""
    exe = build_prog("dumps", "-pthread")
    res = run(lib, exe, ["unsafe-signal", int(signal.SIGUSR2)],
              f"prof:true,prof_sample:1,prof_signal:SIGUSR2,prof_prefix:{tmp_path}/p,background_thread:false")
    m = re.fullmatch(r"in_window (\d+) after (\d+)\n", res.stdout)
    assert m, res.stdout
    assert int(m.group(1)) == 0, res.stdout
    assert int(m.group(2)) == 1, res.stdout


def test_reset_during_huge_realloc_forgets_the_block(lib, build_prog):
    """prof.reset while a sampled huge block is being resized (its record out of the table during mremap): the block
    is forgotten like every other one. It used to be put back, uncounted, and its free then took its bytes off the
    in-use figures of blocks sampled after the reset (seen in ~98% of the rounds)."""
    exe = build_prog("dumps", "-pthread")
    res = run(lib, exe, ["reset-race", 500], "prof:true,prof_sample:1,background_thread:false")
    assert res.stdout == "live0 1 bad 0\n", res.stdout


def test_reset_and_interval_stress(lib, build_prog, tmp_path):
    """prof_reset_stress.c, preloaded: resets during huge reallocs while two threads take interval dumps (the same
    program runs under ThreadSanitizer against the prefixed library: see its header)."""
    exe = build_prog("prof_reset_stress", "-pthread")
    res = run(lib, exe, [], f"prof:true,prof_sample:1,prof_interval:1M,prof_prefix:{tmp_path}/s,"
                            "background_thread:false")
    assert re.fullmatch(r"rounds 300 bad 0 live 0 dumps \d+\n", res.stdout), res.stdout
    assert not list(tmp_path.glob("s.*")), list(tmp_path.iterdir())
