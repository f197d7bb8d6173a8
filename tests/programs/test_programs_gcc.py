"""gcc under LD_PRELOAD=libmallard.so: the compiler (driver, cc1, as, ld) builds a C program, which then runs on Mallard."""
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent / "alloc_churn.c"


def expected_output() -> str:
    """What alloc_churn prints, recomputed from the formulas in its source."""
    churn = sum(1 + (i * 7919) % 5000 for i in range(200_000))
    grown, i = 0, 0
    while grown < 4 << 20:
        grown += 1 + i % 97
        i += 1
    aligned = len(range(4, 17))  # alignments 16 .. 65536
    return f"churn_bytes={churn} grown={grown} aligned={aligned} cross_freed={4 * 20_000}"


@pytest.fixture(scope="module")
def compiled(preload, tmp_path_factory):
    """alloc_churn built by gcc running on Mallard: (the compiler run, the executable)."""
    out = tmp_path_factory.mktemp("gcc")
    exe = out / "alloc_churn"
    cc = preload.run(["gcc", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", str(exe), str(SOURCE)],
                     cwd=out)
    return cc, exe


def test_gcc_compiles_under_mallard(compiled):
    cc, exe = compiled
    assert cc.stderr == ""
    assert exe.exists()
    # Driver, cc1, as, collect2 and ld each ran on Mallard; cc1 alone allocates tens of thousands of blocks.
    cc.assert_mallard_active(min_mallocs=10_000, min_reports=3)


def test_compiled_program_runs_under_mallard(compiled, preload_variant):
    _, exe = compiled
    run = preload_variant.run([str(exe)])
    assert run.stdout.strip() == expected_output()
    assert run.stderr == ""
    rep = run.assert_mallard_active(min_mallocs=200_000)
    # Blocks of the exited producer threads were freed by main: the remote-free path, with nothing lost.
    assert rep["stats"]["remote_frees"] > 0
    assert rep["stats"]["allocated"] < 1 << 20
