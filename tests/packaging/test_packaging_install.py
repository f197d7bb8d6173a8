"""Install tree: `cmake --install` into a temporary prefix, then consumers built with pkg-config and find_package run."""
import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("MALLARD_BUILD_DIR", REPO / "build"))

# Prints which allocator serves malloc and the prefixed API; exit 0 only when that matches the variant's promise.
PROGRAM = r"""
#include <mallard.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
  int replaced = argc > 1 && strcmp(argv[1], "replaced") == 0;   /* does this variant replace malloc? */
  void *p = malloc(100);
  void *q = mallard_malloc(200);
  const char *v = "?"; size_t len = sizeof v;
  int ctl = mallard_ctl("version", &v, &len, NULL, 0);
  int ok = mallard_owns(q) && ctl == 0 && (mallard_owns(p) ? replaced : !replaced);
  printf("%s malloc=%s version=%s\n", ok ? "ok" : "wrong", mallard_owns(p) ? "mallard" : "system", v);
  free(p);
  mallard_free(q);
  return ok ? 0 : 1;
}
"""

CMAKE_PROJECT = """
cmake_minimum_required(VERSION 3.16)
project(consumer C)
find_package(mallard 0.1 CONFIG REQUIRED)
foreach(t mallard secure static prefix)
  add_executable(use-${t} main.c)
  target_link_libraries(use-${t} PRIVATE mallard::${t})
endforeach()
"""

# variant -> does malloc become Mallard's in a program linked with it?
VARIANTS = {"mallard": True, "mallard-secure": True, "mallard-static": True, "mallard-prefix": False}


def run(cmd, **kw):
    """Runs cmd; on failure the assertion shows its output."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def clean_env():
    """The environment of a user who set nothing: no loader or pkg-config paths inherited from the test run."""
    return {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "PKG_CONFIG_PATH")}


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    p = tmp_path_factory.mktemp("install") / "prefix"
    run(["cmake", "--install", str(BUILD), "--prefix", str(p)])
    return p


def test_install_tree(prefix):
    for f in ("include/mallard.h", "lib/libmallard.so.0", "lib/libmallard-secure.so.0", "lib/libmallard.a",
              "lib/libmallard-prefix.a", "lib/libmallard-tracer.so", "bin/mallard-run", "bin/mallard-measure",
              "lib/cmake/mallard/mallardConfig.cmake", "lib/cmake/mallard/mallardConfigVersion.cmake",
              "share/man/man1/mallard.1", "share/man/man3/libmallard.3", "share/man/man5/mallard.conf.5",
              *(f"lib/pkgconfig/{v}.pc" for v in VARIANTS)):
        assert (prefix / f).exists(), f"{f} is not installed"
    for lib in ("libmallard", "libmallard-secure"):
        # The development link points at the soname link, which points at the versioned file.
        assert os.readlink(prefix / "lib" / f"{lib}.so") == f"{lib}.so.0"
        assert os.readlink(prefix / "lib" / f"{lib}.so.0") == f"{lib}.so.0.1.0"
        dyn = run(["readelf", "-d", str(prefix / "lib" / f"{lib}.so.0.1.0")])
        assert f"Library soname: [{lib}.so.0]" in dyn, dyn


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_pkg_config_consumer(prefix, variant, tmp_path):
    """The README's route: cc main.c $(pkg-config --cflags --libs mallard); the program starts as built."""
    assert shutil.which("pkg-config"), "pkg-config is missing (scripts/apt-packages.txt installs it)"
    env = dict(clean_env(), PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", variant], env=env).split()
    libdir = run(["pkg-config", "--variable=libdir", variant], env=env).strip()
    # The command finds the tracer through this variable: it must be the folder holding the libraries.
    assert os.path.realpath(libdir) == os.path.realpath(prefix / "lib"), libdir
    assert (pathlib.Path(libdir) / "libmallard-tracer.so").exists()
    src = tmp_path / "main.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "main"
    run(["cc", str(src), *flags, "-o", str(exe)], env=env)
    out = run([str(exe), "replaced" if VARIANTS[variant] else "beside"], env=clean_env())
    assert out.startswith("ok malloc=" + ("mallard" if VARIANTS[variant] else "system") + " version=0.1.0"), out


def test_find_package_consumer(prefix, tmp_path):
    """find_package(mallard CONFIG): every imported target links, and the programs start from their build folder."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CMAKE_PROJECT)
    (src / "main.c").write_text(PROGRAM)
    build = tmp_path / "build"
    run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}"], env=clean_env())
    run(["cmake", "--build", str(build)], env=clean_env())
    for target, replaced in (("mallard", True), ("secure", True), ("static", True), ("prefix", False)):
        exe = build / f"use-{target}"
        out = run([str(exe), "replaced" if replaced else "beside"], env=clean_env())
        assert out.startswith("ok malloc=" + ("mallard" if replaced else "system")), (target, out)
    # The shared targets really are the installed libraries, not a copy linked in.
    assert "libmallard.so.0" in run(["ldd", str(build / "use-mallard")])
    assert "libmallard-secure.so.0" in run(["ldd", str(build / "use-secure")])


def test_mallard_run_preloads_the_installed_library(prefix):
    """mallard-run finds the library relative to itself, keeps an LD_PRELOAD already set, and explains misuse."""
    run_cmd = str(prefix / "bin" / "mallard-run")
    maps = run([run_cmd, "cat", "/proc/self/maps"], env=clean_env())
    assert os.path.realpath(prefix / "lib" / "libmallard.so.0") in maps, maps
    maps = run([run_cmd, "--secure", "cat", "/proc/self/maps"], env=clean_env())
    assert os.path.realpath(prefix / "lib" / "libmallard-secure.so.0") in maps, maps
    other = os.path.realpath(prefix / "lib" / "libmallard-tracer.so")
    out = run([run_cmd, "sh", "-c", "echo $LD_PRELOAD"], env=dict(clean_env(), LD_PRELOAD=other))
    assert out.strip() == other + ":" + os.path.realpath(prefix / "lib" / "libmallard.so.0"), out
    r = subprocess.run([run_cmd], capture_output=True, text=True, env=clean_env())
    assert r.returncode == 2 and "usage: mallard-run" in r.stderr, r.stderr
