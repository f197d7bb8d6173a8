"""Packaging: `cmake --install` into a prefix, then a program built with pkg-config links and uses Mallard."""
import os
import pathlib
import shutil
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("MALLARD_BUILD_DIR", REPO / "build"))

PROGRAM = r"""
#include <mallard.h>
#include <stdio.h>
#include <stdlib.h>
int main(void) {
  void *p = malloc(100);                       /* the replaced malloc */
  void *q = mallard_malloc(200);               /* the prefixed API */
  const char *v; size_t len = sizeof v;
  int ok = mallard_owns(p) && mallard_owns(q) && mallard_ctl("version", &v, &len, NULL, 0) == 0;
  printf("%s %s\n", ok ? "mallard" : "not-mallard", v);
  free(p);
  mallard_free(q);
  return ok ? 0 : 1;
}
"""


def test_install_and_pkg_config(tmp_path):
    assert shutil.which("pkg-config"), "pkg-config is missing (scripts/apt-packages.txt installs it)"
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], check=True, capture_output=True)
    for f in ("include/mallard.h", "lib/libmallard.so", "lib/libmallard.a", "lib/libmallard-secure.so",
              "lib/pkgconfig/mallard.pc"):
        assert (prefix / f).exists(), f
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "mallard"], env=env, check=True, capture_output=True,
                           text=True).stdout.split()
    assert "-lmallard" in flags
    includes = [os.path.realpath(f[2:]) for f in flags if f.startswith("-I")]
    assert os.path.realpath(prefix / "include") in includes, flags   # the .pc follows the install prefix
    src = tmp_path / "main.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "main"
    subprocess.run(["cc", str(src), *flags, "-lpthread", f"-Wl,-rpath,{prefix}/lib", "-o", str(exe)], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("mallard 0."), r.stdout + r.stderr
