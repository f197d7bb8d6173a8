"""The README's package route from a fresh checkout: no .venv, no build folder, python3 from the system PATH.

packaging/build-debs.sh must produce the four packages, the `mallard` one with the command's Python package
inside (issue 15 item 7: an empty MALLARD_PIP_PYTHON cache entry once made the install step run `"" -m pip`).
Needs no root: it only builds the packages (tests/packaging/test_debian_packages.py installs them, as root).
"""
import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ["libmallard-dev", "libmallard0", "mallard", "mallard-global"]

pytestmark = pytest.mark.skipif(not (shutil.which("dpkg-deb") and shutil.which("cpack") and shutil.which("git")),
                                reason="needs dpkg-deb, cpack and git")


def fresh_checkout(dest):
    """The working tree's files as a clone would have them (tracked and new, not ignored: no .venv, no build/)."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.split(b"\0")
    for f in filter(None, files):
        src = REPO / os.fsdecode(f)
        if src.is_file():   # a file deleted but not yet staged is listed and absent
            (dest / os.fsdecode(f)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(f))
    subprocess.run(["git", "init", "-q", str(dest)], check=True)


def system_env():
    """The environment of a shell without the test's virtual environment: python3 is the system's."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "LD_PRELOAD")}
    venv_bins = {str(REPO / ".venv" / "bin")}
    if os.environ.get("VIRTUAL_ENV"):
        venv_bins.add(os.path.join(os.environ["VIRTUAL_ENV"], "bin"))
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p not in venv_bins)
    return env


def test_build_debs_from_fresh_checkout(tmp_path):
    clone = tmp_path / "clone"
    clone.mkdir()
    fresh_checkout(clone)
    assert not (clone / ".venv").exists() and not (clone / "build").exists()
    r = subprocess.run(["bash", "packaging/build-debs.sh"], cwd=clone, env=system_env(), capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, f"packaging/build-debs.sh failed in a fresh checkout:\n{r.stdout}\n{r.stderr}"
    debs = {p.name.split("_")[0]: p for p in (clone / "build-deb" / "debs").glob("*.deb")}
    assert sorted(debs) == PACKAGES, debs
    listing = subprocess.run(["dpkg-deb", "-c", str(debs["mallard"])], capture_output=True, text=True,
                             check=True).stdout
    assert "./usr/lib/python3/dist-packages/mallard_cli/" in listing, listing
    assert "./usr/bin/mallard" in listing, listing
    cache = (clone / "build-deb" / "CMakeCache.txt").read_text()
    found = [line for line in cache.splitlines() if line.startswith("MALLARD_PYTHON3:")]
    assert found and "/.venv/" not in found[0] and not found[0].endswith("NOTFOUND"), found
