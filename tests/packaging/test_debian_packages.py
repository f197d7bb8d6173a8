"""Debian packages (as root): build them, install them, a login shell runs on Mallard, remove, the next one on glibc.

The test owns the package names libmallard0, libmallard-dev, mallard, mallard-global and jemalloc-global on the
machine it runs on: it purges them before it starts and after it ends, pass or fail.
"""
import os
import pathlib
import shutil
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ["mallard-global", "mallard", "libmallard-dev", "libmallard0"]
FAKE_GLOBAL = "jemalloc-global"   # stands for another allocator's -global package
OTHER_PROFILE = pathlib.Path("/etc/profile.d/zz-mallard-test-other-global.sh")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("dpkg"),
                                reason="installs Debian packages: needs root and dpkg (CI runs it as root)")


def dpkg(*args, check=True):
    """dpkg with its arguments; waits for the dpkg lock when another installer holds it."""
    for _ in range(60):
        r = subprocess.run(["dpkg", *args], capture_output=True, text=True, timeout=300)
        if r.returncode == 0 or "lock" not in r.stderr:
            break
        time.sleep(2)
    if check:
        assert r.returncode == 0, f"dpkg {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r


def purge_all():
    """Purges every package the test owns (dpkg only warns about those not installed)."""
    dpkg("--purge", *PACKAGES, FAKE_GLOBAL, check=False)
    OTHER_PROFILE.unlink(missing_ok=True)


def login_shell(script, home, **env):
    """A fresh login shell (bash -l) with nothing inherited but PATH and HOME, running script."""
    base = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home), **env}
    r = subprocess.run(["bash", "-l", "-c", script], env=base, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"login shell failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    out = tmp_path_factory.mktemp("deb") / "build"
    r = subprocess.run(["bash", str(REPO / "packaging" / "build-debs.sh"), str(out)], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, f"packaging/build-debs.sh failed:\n{r.stdout}\n{r.stderr}"
    found = {p.name.split("_")[0]: p for p in (out / "debs").glob("*.deb")}
    assert sorted(found) == sorted(PACKAGES), found
    purge_all()
    yield found
    purge_all()


def fake_global_deb(tmp_path):
    """A minimal package named like another allocator's global switch."""
    root = tmp_path / "fake"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {FAKE_GLOBAL}\nVersion: 1.0\nArchitecture: all\nMaintainer: test <t@localhost>\n"
        "Description: stand-in for another allocator's -global package\n")
    deb = tmp_path / f"{FAKE_GLOBAL}.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True, capture_output=True)
    return deb


def test_global_switch_lifecycle(debs, tmp_path):
    libdir = subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True, text=True).stdout.strip()
    lib = f"/usr/lib/{libdir}/libmallard.so.0"
    home = tmp_path / "home"
    home.mkdir()
    assert "libmallard" not in login_shell("cat /proc/self/maps", home), "Mallard is preloaded before the install"

    dpkg("-i", *(str(debs[p]) for p in PACKAGES))
    # A login shell's programs run on Mallard.
    maps = login_shell("cat /proc/self/maps", home)
    assert "/libmallard.so.0" in maps, maps
    # An LD_PRELOAD already set is kept, Mallard goes after it; a shell sourcing the script twice adds it once.
    other = f"/lib/{libdir}/libdl.so.2"
    assert login_shell(". /etc/profile.d/mallard-global.sh; echo $LD_PRELOAD", home,
                       LD_PRELOAD=other).strip() == f"{other}:{lib}"
    # One program on Mallard without the global switch, and the installed command starts.
    assert "/libmallard-secure.so.0" in subprocess.run(["mallard-run", "--secure", "cat", "/proc/self/maps"],
                                                      env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                                                      text=True).stdout
    r = subprocess.run(["/usr/bin/mallard", "--help"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stdout + r.stderr
    # The installed command finds the installed library (not a build tree) and prints its path.
    r = subprocess.run(["/usr/bin/mallard", "env", "-a", "mallard", "--format", "shell"], capture_output=True,
                       text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(home)})
    assert r.returncode == 0 and f"/usr/lib/{libdir}/libmallard.so" in r.stdout, r.stdout + r.stderr
    assert "/build/" not in r.stdout, r.stdout
    # A C consumer of the system-wide install: pkg-config from /usr, no run path needed.
    src = tmp_path / "main.c"
    src.write_text("#include <mallard.h>\n#include <stdlib.h>\n"
                   "int main(void) { void *p = malloc(10); int ok = mallard_owns(p); free(p); return !ok; }\n")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "mallard"], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"}).stdout.split()
    assert not any("rpath" in f for f in flags), flags
    subprocess.run(["cc", str(src), *flags, "-o", str(tmp_path / "main")], check=True)
    assert subprocess.run([str(tmp_path / "main")], env={}).returncode == 0

    # Another -global package cannot join it.
    r = dpkg("-i", str(fake_global_deb(tmp_path)), check=False)
    assert r.returncode != 0 and "conflict" in (r.stdout + r.stderr).lower(), r.stdout + r.stderr

    # Removed: the profile script goes, the next login shell runs on glibc (the library itself is still installed).
    dpkg("--remove", "mallard-global")
    assert not pathlib.Path("/etc/profile.d/mallard-global.sh").exists()
    assert pathlib.Path(lib).exists()
    maps = login_shell("cat /proc/self/maps", home)
    assert "libmallard" not in maps, maps

    # An allocator preloaded by a script no package owns: the preinst refuses, nothing is left installed.
    OTHER_PROFILE.write_text(f"export LD_PRELOAD=/usr/lib/{libdir}/libjemalloc.so.2\n")
    r = dpkg("-i", str(debs["mallard-global"]), check=False)
    assert r.returncode != 0 and "another allocator is already enabled globally" in r.stderr, r.stdout + r.stderr
    OTHER_PROFILE.unlink()
    dpkg("--purge", "mallard-global")
    assert not pathlib.Path("/etc/profile.d/mallard-global.sh").exists()
    assert "libmallard" not in login_shell("cat /proc/self/maps", home)

    # Purged, the packages leave nothing behind (the command's byte-code included: it ran above as root).
    dpkg("--purge", *PACKAGES)
    left = [p for p in ("/usr/lib/python3/dist-packages/mallard_cli", lib, f"/usr/lib/{libdir}/libmallard-tracer.so",
                        "/usr/bin/mallard", "/usr/bin/mallard-run", f"/usr/lib/{libdir}/cmake/mallard",
                        "/usr/include/mallard.h") if os.path.lexists(p)]
    assert not left, f"left behind after purge: {left}"
