"""Tests of the runner's musl mode: the C workloads as static programs, musl's malloc against libmallard.a linked in.

The end-to-end tests run fake static programs (a small C program built with `cc -static`, with the symbols that tell
the two builds apart), so they need no musl; the last test checks the real static musl programs where a musl build
has them (scripts/test-musl.sh builds them). Never a timing assertion.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_bench_smoke import REPO, run_mod

ms = run_mod.musl_static
RUN = [sys.executable, str(REPO / "bench" / "run.py")]

# One source for every fake: BUILD is "musl" or "mallard"; the mallard build defines Mallard's entry point, the musl
# build mallocng's implementation symbol, as the real static programs do (FAKE_BOTH: both, two allocators in one).
# Each run logs "<build> <program>" so that the test sees which program ran for which row, in which order; the
# mallard build touches 24 MiB, so that its peak RSS is told apart from the musl build's; FAKE_CRASH="<build>/<program
# name>" makes that program abort.
FAKE_C = r"""/* Fake workload of the musl mode's test: logs its build and program, prints a RESULT line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FAKE_MALLARD
#define BUILD "mallard"
void mallard_malloc(void) {}
#else
#define BUILD "musl"
#endif
#if !defined FAKE_MALLARD || defined FAKE_BOTH
const char __libc_malloc_impl[1];
#endif
int main(int argc, char **argv) {
  const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  const char *log = getenv("FAKE_LOG"), *crash = getenv("FAKE_CRASH");
  FILE *f = log ? fopen(log, "a") : NULL;
  if (f) { fprintf(f, "%s %s\n", BUILD, argv[0]); fclose(f); }
  char me[256];
  snprintf(me, sizeof me, "%s/%s", BUILD, name);
  if (crash && !strcmp(crash, me)) abort();
#ifdef FAKE_MALLARD
  size_t n = 24u << 20;
  volatile char *p = malloc(n);
  for (size_t i = 0; p && i < n; i += 4096) p[i] = 1;
#endif
  (void)argc;
  printf("RESULT {\"workload\": \"%s\", \"ops\": 1000, \"seconds\": 0.001, \"ops_per_s\": 1000000}\n", name);
  return 0;
}
"""
WORKLOADS = ("larson", "churn")


def _cc(src: Path, out: Path, *flags) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["cc", "-O1", *flags, str(src), "-o", str(out)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(f"cc {' '.join(flags)} fails here: {r.stderr.strip()[:200]}")


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    """A bin folder as the musl build lays it out: static-musl/ and static-mallard/, one fake per workload."""
    if not shutil.which("cc") or not shutil.which("nm"):
        pytest.skip("cc and nm are needed to build the fake static programs")
    d = tmp_path_factory.mktemp("musl-fakes")
    src = d / "fake.c"
    src.write_text(FAKE_C)
    bins = d / "bin"
    for build, folder, _ in ms.BUILDS:
        first = bins / folder / f"mallard-bench-{WORKLOADS[0]}"
        _cc(src, first, "-static", *(["-DFAKE_MALLARD"] if build == "mallard" else []))
        for w in WORKLOADS[1:]:
            shutil.copy2(first, bins / folder / f"mallard-bench-{w}")
    _cc(src, d / "dynamic" / "fake", "-DFAKE_MALLARD")
    _cc(src, d / "both" / "fake", "-static", "-DFAKE_MALLARD", "-DFAKE_BOTH")
    return d


def _run(*args, env=None, timeout=300):
    return subprocess.run([*RUN, "musl", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def test_musl_mode_end_to_end_on_fake_static_programs(fakes, tmp_path):
    """Both builds of each workload run side by side, each from its own folder, interleaved with the first one
    alternating; medians and ratios to musl's; a crash is a failure of its cell with a reproducing command; the docs
    section goes into the file named only."""
    log = tmp_path / "log"
    page = tmp_path / "PERF.md"
    page.write_text("# Performance\n\nhand-written\n")
    doc = REPO / "docs" / "PERFORMANCE.md"
    before = doc.read_bytes() if doc.exists() else None
    out = tmp_path / "out"
    r = _run("--bin-dir", str(fakes / "bin"), "--workloads", ",".join(WORKLOADS), "--sizes", "smoke",
             "--repeats", "2", "--out", str(out), "--no-plots", "--docs-section", "ci", "--docs-file", str(page),
             env={"FAKE_LOG": str(log), "FAKE_CRASH": "mallard/mallard-bench-larson"})
    assert r.returncode == 0, r.stderr
    raw = json.loads((out / "raw.json").read_text())
    assert raw["allocators"] == ["musl", "mallard"] and raw["peers"] == ["musl"]
    assert [c["id"] for c in raw["cells"]] == ["larson/t2", "churn/t1"]
    runs = [line.split(" ", 1) for line in log.read_text().splitlines()]
    assert len(runs) == 2 * 2 * len(WORKLOADS), runs
    for build, prog in runs:   # every row ran its own build's program
        assert Path(prog).parent.name == f"static-{build}", (build, prog)
    churn = [b for b, p in runs if p.endswith("mallard-bench-churn")]
    assert churn == ["musl", "mallard", "mallard", "musl"], churn
    cells = raw["summary"]["cells"]
    ok = cells["churn/t1"]["per"]
    assert ok["musl"]["ok"] and ok["mallard"]["ok"]
    assert ok["musl"]["wall"]["ratio"] == pytest.approx(1.0) and ok["musl"]["rss"]["ratio"] == pytest.approx(1.0)
    assert ok["mallard"]["rss"]["ratio"] > 3, ok   # 24 MiB touched against a tiny program
    bad = cells["larson/t2"]["per"]
    assert bad["musl"]["ok"] and not bad["mallard"]["ok"] and "signal 6" in bad["mallard"]["error"]
    md = (out / "results.md").read_text()
    assert md.startswith("# musl: static programs, musl's malloc against Mallard linked in")
    for heading in ("## Geometric means of Mallard / musl", "## Wall time (s)", "## CPU time, user + system (s)",
                    "## Peak RSS (MiB)", "## Failures"):
        assert heading in md, heading
    assert "| cell | musl | mallard |" in md
    assert "static-mallard/mallard-bench-larson -t 2" in md     # the failed cell's reproducing command
    assert "Left out: pyreader, pyreader-malloc, pydict-json: they run the system's python3" in md
    assert "sqlite: it runs" in md and "redis: it runs" in md
    assert "aarch64: correctness only" in md and f"Command: `{raw['command']}`" in md
    text = page.read_text()
    assert text.startswith("# Performance\n\nhand-written\n\n<!-- musl:ci begin -->\n## musl: static programs")
    assert "### Wall time (s)" in text and text.rstrip().endswith("<!-- musl:ci end -->")
    assert (doc.read_bytes() if doc.exists() else None) == before


def test_musl_mode_refuses_programs_of_the_wrong_kind(fakes, tmp_path):
    """Before anything runs: a program whose malloc is not the build's (or not the build's alone), a dynamic program
    and a missing one are each refused (exit 2) with what is wrong and how to build the right ones."""
    bins = tmp_path / "bin"
    shutil.copytree(fakes / "bin", bins)
    swapped = bins / "static-mallard" / "mallard-bench-churn"
    shutil.copy2(bins / "static-musl" / "mallard-bench-churn", swapped)
    r = _run("--bin-dir", str(bins), "--workloads", "churn", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and f"{swapped}: malloc is not Mallard's alone" in r.stderr, r.stderr
    assert "mallard-bench-musl" in r.stderr and not (tmp_path / "o").exists()
    shutil.copy2(fakes / "both" / "fake", swapped)
    r = _run("--bin-dir", str(bins), "--workloads", "churn", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "musl's malloc: __libc_malloc_impl)" in r.stderr, r.stderr
    shutil.copy2(fakes / "dynamic" / "fake", swapped)
    r = _run("--bin-dir", str(bins), "--workloads", "churn", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and f"{swapped}: dynamically linked" in r.stderr, r.stderr
    shutil.copy2(bins / "static-mallard" / "mallard-bench-larson", swapped)
    shutil.copy2(bins / "static-mallard" / "mallard-bench-larson", bins / "static-musl" / "mallard-bench-larson")
    r = _run("--bin-dir", str(bins), "--workloads", "churn,larson", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "static-musl/mallard-bench-larson: malloc is not musl's" in r.stderr, r.stderr
    r = _run("--bin-dir", str(bins), "--workloads", "mixed", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "static-musl/mallard-bench-mixed: not built" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_musl_mode_refuses_other_workloads_and_options(tmp_path):
    def run(*args):
        return _run("--bin-dir", str(tmp_path), "--out", str(tmp_path / "o"), *args, timeout=60)

    r = run("--workloads", "larson,sqlite")
    assert r.returncode == 2 and "sqlite (it runs the system's sqlite3 shell" in r.stderr, r.stderr
    r = run("--allocators", "glibc")
    assert r.returncode == 2 and "--allocators" in r.stderr, r.stderr
    r = run("--docs")
    assert r.returncode == 2 and "never rewrites" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def _musl_bins() -> Path:
    return ms.default_build_dir(REPO) / "bin"


@pytest.mark.skipif(not (_musl_bins() / "static-mallard").is_dir(),
                    reason="no static musl programs (bash scripts/test-musl.sh builds them in build-musl)")
def test_real_static_musl_programs(tmp_path):
    """Every workload's two builds in the musl build: static, musl's malloc in one and Mallard's alone in the other
    (the symbol check the runner makes); and the mode runs two of them under both, each run checking its objects."""
    bins = _musl_bins()
    c_workloads = sorted({c.workload for c in run_mod.plan("smoke", tmp_path) if c.kind == "c"} | {"fastpath"})
    _, problems = ms.builds(bins, c_workloads, "test")
    assert not problems, problems
    out = tmp_path / "out"
    r = _run("--workloads", "churn,xstorm", "--sizes", "smoke", "--repeats", "1", "--out", str(out), "--no-plots",
             env={"MALLARD_MUSL_BUILD_DIR": str(bins.parent)})
    assert r.returncode == 0, r.stderr
    raw = json.loads((out / "raw.json").read_text())
    for c in raw["cells"]:
        for build in ("musl", "mallard"):
            (run,) = c["runs"][build]
            assert run["ok"], (c["id"], build, run["error"])
            assert run["metrics"]["ops"] > 0 and run["max_rss_kib"] > 0
            assert f"static-{build}/mallard-bench-{c['workload']}" in c["repro"][build]
