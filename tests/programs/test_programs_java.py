"""java under LD_PRELOAD=libmallard.so: javac compiles a multi-threaded program, the JVM runs it, both on Mallard."""
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "MallardWorkload.java"
THREADS, ENTRIES = 4, 100_000


def expected_output() -> str:
    """What MallardWorkload prints, recomputed from its formulas."""
    maps = sum(len("v" + str(j * k)) for k in range(1, THREADS + 1) for j in range(ENTRIES))
    zipped = sum(200_000 + k for k in range(1, THREADS + 1))
    direct = sum(4096 * (1 + (r + k) % 16) // 512 for k in range(1, THREADS + 1) for r in range(50))
    return f"maps={maps} zipped={zipped} direct={direct}"


def test_java_multithreaded_program(preload, tmp_path):
    # A bounded heap keeps the JVM's reservations modest on a small CI machine.
    jvm = {"JAVA_TOOL_OPTIONS": "-Xmx256m -Xss1m", "HOME": str(tmp_path)}
    javac = preload.run(["javac", "-d", str(tmp_path), str(SOURCE)], extra_env=jvm, timeout=180)
    assert (tmp_path / "MallardWorkload.class").exists()
    javac.assert_mallard_active(min_mallocs=20_000)

    run = preload.run(["java", "-cp", str(tmp_path), "MallardWorkload"], extra_env=jvm, timeout=180)
    assert run.stdout.strip() == expected_output()
    run.assert_mallard_active(min_mallocs=5_000)
    assert "Exception" not in run.stderr and "fatal error" not in run.stderr, run.stderr
