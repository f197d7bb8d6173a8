"""CPython under LD_PRELOAD=libmallard.so: a threaded producer/consumer workload and some of CPython's own tests."""
import functools
import importlib.util
import json
import re
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent

TEST_MODULES = ["test_json", "test_dict", "test_list", "test_bytes", "test_set", "test_re"]
# PYTHONMALLOC=malloc sends every object through malloc/free instead of pymalloc's arenas.
ALL_MALLOC = {"PYTHONMALLOC": "malloc"}


@functools.lru_cache(maxsize=None)
def expected_checksum(producers: int) -> str:
    return load_workload().expected_checksum(producers)


def load_workload():
    spec = importlib.util.spec_from_file_location("mallard_py_threads_workload", HERE / "py_threads_workload.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_python_threaded_workload(preload_variant, system_python):
    producers, consumers = 4, 3
    expected = expected_checksum(producers)
    script = HERE / "py_threads_workload.py"
    r = preload_variant.run([system_python, str(script), str(producers), str(consumers)], extra_env=ALL_MALLOC)
    assert r.stdout.split() == ["checksum", expected]
    rep = r.assert_mallard_active(min_mallocs=400_000)
    # Consumers free what producers built: Mallard's cross-thread free path was taken.
    assert rep["stats"]["remote_frees"] > 0


def test_python_pymalloc_default(preload, system_python):
    """With pymalloc on (the default), CPython still takes its arenas and large objects from Mallard."""
    build = "{str(i): [i] * (i % 50) for i in range(50000)}"
    r = preload.run([system_python, "-c", f"import json; d = {build}; s = json.dumps(d); "
                     "print(len(json.loads(s)), len(s))"])
    assert r.stdout.split() == ["50000", str(len(json.dumps(eval(build))))]
    r.assert_mallard_active(min_mallocs=1000)


def test_cpython_test_modules(preload, system_python, tmp_path):
    py = system_python
    probe = subprocess.run([py, "-c", "import test.libregrtest"], capture_output=True, text=True)
    assert probe.returncode == 0, f"{py} has no test package (Debian: libpython3.11-testsuite): {probe.stderr}"
    # The exit report would land in the stderr of the tools some tests spawn and compare with '', so this run
    # proves Mallard is active from the test runner's own memory map instead.
    runner = ("import runpy, sys\n"
              "maps = open('/proc/self/maps').read()\n"
              "sys.exit('libmallard.so is not mapped') if 'libmallard.so' not in maps else None\n"
              "print('mallard mapped', flush=True)\n"
              f"sys.argv = ['python -m test', *{TEST_MODULES!r}]\n"
              "runpy.run_module('test', run_name='__main__', alter_sys=True)\n")
    r = preload.run([py, "-c", runner], stats=False, extra_env=ALL_MALLOC, timeout=300, cwd=tmp_path)
    assert r.stdout.startswith("mallard mapped")
    assert re.search(r"Tests result: SUCCESS", r.stdout), r.stdout[-3000:]
    # Every module ran and passed (a module that fails to import or is skipped is not counted as OK).
    assert re.search(rf"All {len(TEST_MODULES)} tests OK", r.stdout), r.stdout[-3000:]
    for mod in TEST_MODULES:
        assert re.search(rf"\] {mod}\b", r.stdout), f"{mod} did not run:\n{r.stdout[-3000:]}"


def test_cpython_json_tests_exit_report(preload, system_python):
    """Part of test_json with the exit report on (the parts that spawn no tools comparing stderr with '')."""
    r = preload.run([system_python, "-m", "unittest", "-q", "test.test_json.test_decode",
                     "test.test_json.test_encode_basestring_ascii", "test.test_json.test_recursion"],
                    extra_env=ALL_MALLOC)
    assert re.search(r"^OK", r.stderr, re.M), r.stderr[-2000:]
    r.assert_mallard_active(min_mallocs=10_000)
