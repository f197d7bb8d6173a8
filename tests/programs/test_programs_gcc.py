"""gcc under LD_PRELOAD=libmallard.so: the compiler (driver, cc1, as, ld) builds a C program, which then runs on Mallard."""
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "alloc_churn.c"


def expected_output() -> str:
    """What alloc_churn prints, recomputed from the formulas in its source."""
    churn = sum(1 + (i * 7919) % 5000 for i in range(200000))
    grown, i = 0, 0
    while grown < 4 << 20:
        grown += 1 + i % 97
        i += 1
    aligned = len([a for a in range(4, 17) if 1 << a])  # alignments 16 .. 65536
    return f"churn_bytes={churn} grown={grown} aligned={aligned} cross_freed={4 * 20000}"


def test_gcc_compiles_and_runs_c_program(preload, tmp_path):
    exe = tmp_path / "alloc_churn"
    cc = preload.run(["gcc", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", str(exe), str(SOURCE)],
                     cwd=tmp_path)
    assert cc.stderr == ""
    assert exe.exists()
    # Driver, cc1, as, collect2 and ld each ran on Mallard; cc1 alone allocates tens of thousands of blocks.
    cc.assert_mallard_active(min_mallocs=10_000, min_reports=3)

    run = preload.run([str(exe)])
    assert run.stdout.strip() == expected_output()
    rep = run.assert_mallard_active(min_mallocs=200_000)
    # Blocks of the exited producer threads were freed by main: the remote-free path, with nothing lost.
    assert rep["stats"]["remote_frees"] > 0
    assert rep["stats"]["allocated"] < 1 << 20
