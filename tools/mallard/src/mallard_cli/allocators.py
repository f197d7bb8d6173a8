"""Allocator discovery: Mallard's own builds, glibc's built-in malloc and peer libraries found on this machine."""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Folders searched for peer allocators, in order; the first match of a name wins.
LIBRARY_DIRS = [
    "/usr/local/lib",
    "/usr/local/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
]

# name -> file-name stems to look for (lib<stem>.so[.N]), most preferred first.
PEERS = {
    "jemalloc": ["jemalloc"],
    "mimalloc": ["mimalloc"],
    "mimalloc-secure": ["mimalloc-secure"],
    "tcmalloc": ["tcmalloc_minimal", "tcmalloc"],
    "tcmalloc-full": ["tcmalloc"],
    "snmalloc": ["snmallocshim", "snmalloc"],
    "rpmalloc": ["rpmalloc"],
    "hoard": ["hoard"],
    "scudo": ["scudo_standalone", "scudo"],
    "hardened_malloc": ["hardened_malloc"],
}

# How to install the common peers on Debian/Ubuntu (and Alpine, Fedora) when they are missing.
INSTALL_HINTS = {
    "jemalloc": "apt-get install libjemalloc2   (apk add jemalloc; dnf install jemalloc)",
    "mimalloc": "apt-get install libmimalloc2.0   (apk add mimalloc; dnf install mimalloc)",
    "tcmalloc": "apt-get install libtcmalloc-minimal4   (apk add gperftools; dnf install gperftools-libs)",
}

MALLARD_VARIANTS = {"mallard": "libmallard.so", "mallard-secure": "libmallard-secure.so"}
# The profiler's interposer forwards to an allocator (it is not one); the no-statistics build only measures
# the cost of counting (bench/run.py --allocators can still name its path).
NOT_ALLOCATORS = {"libmallard-tracer.so", "libmallard-nostats.so"}
ALIASES = {"system": "glibc", "default": "glibc", "libc": "glibc", "ptmalloc": "glibc", "ptmalloc2": "glibc"}


class UnknownAllocator(ValueError):
    """An allocator name or path that is not available here; the message lists the known names."""

    def __init__(self, name: str, known: list[str], reason: str = "unknown allocator"):
        self.name = name
        self.known = known
        super().__init__(f"{reason} '{name}'; known allocators: {', '.join(known)} (or a path to a .so file)")


@dataclass
class Allocator:
    name: str  # 'glibc', 'jemalloc', 'mimalloc', 'tcmalloc', 'mallard', 'mallard-secure', or a custom file name
    path: str | None  # the .so to LD_PRELOAD; None for glibc (nothing preloaded)
    version: str  # e.g. '5.3.0' or 'unknown'


def repo_root() -> Path:
    """The repository root, found relative to this file (tools/mallard/src/mallard_cli/)."""
    return Path(__file__).resolve().parents[4]


def build_dir() -> Path:
    env = os.environ.get("MALLARD_BUILD_DIR")
    return Path(env) if env else repo_root() / "build"


def mallard_lib_dirs() -> list[Path]:
    """Where Mallard's own libraries are looked for: the build dir, then the installed prefix's lib dir."""
    dirs = [build_dir() / "lib"]
    prefix = Path(__file__).resolve()
    # An installed package lives in <prefix>/lib/pythonX.Y/site-packages/mallard_cli.
    for parent in prefix.parents:
        if parent.name.startswith("python") and parent.parent.name in ("lib", "lib64"):
            dirs.append(parent.parent)
            break
    dirs += [Path("/usr/local/lib"), Path("/usr/lib")]
    return dirs


def tracer_path() -> Path | None:
    """The interposing tracer library of `mallard profile`, if built."""
    for d in mallard_lib_dirs():
        p = d / "libmallard-tracer.so"
        if p.is_file():
            return p
    return None


def _so_candidates(stem: str, dirs: list[str]) -> list[str]:
    """Files lib<stem>.so.N / lib<stem>.so in dirs, soname-like names first (libx.so.2 before libx.so)."""
    found = []
    pat = re.compile(r"^lib" + re.escape(stem) + r"\.so(\.\d+)?$")
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        hits = sorted((n for n in names if pat.match(n)), key=lambda n: (n.endswith(".so"), n))
        found += [os.path.join(d, n) for n in hits]
    return found


def _dpkg_version(path: str) -> str | None:
    try:
        owner = subprocess.run(["dpkg-query", "-S", path], capture_output=True, text=True, timeout=10)
        if owner.returncode != 0:
            owner = subprocess.run(["dpkg-query", "-S", os.path.realpath(path)], capture_output=True, text=True, timeout=10)
        if owner.returncode != 0:
            return None
        # "libjemalloc2:amd64: /usr/lib/..." -> "libjemalloc2:amd64"
        q = owner.stdout.splitlines()[0].split(": ", 1)[0].split(",")[0].strip()
        if not q:
            return None
        ver = subprocess.run(["dpkg-query", "-W", "-f=${Version}", q], capture_output=True, text=True, timeout=10)
        if ver.returncode == 0 and ver.stdout.strip():
            v = ver.stdout.strip()
            v = v.split(":", 1)[-1]  # drop the epoch
            return re.split(r"[-+~]", v, maxsplit=1)[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return None


_VERSION_PATTERNS = {
    "jemalloc": rb"(\d+\.\d+\.\d+)-\d+-g[0-9a-f]{6,}",
    "mallard": rb"[Mm]allard[ /-]v?(\d+\.\d+\.\d+)",
}


def _embedded_version(path: str, name: str) -> str | None:
    pat = _VERSION_PATTERNS.get("mallard" if name.startswith("mallard") else name)
    if pat is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
    except OSError:
        return None
    m = re.search(pat, data)
    return m.group(1).decode() if m else None


def _project_version() -> str | None:
    try:
        text = (repo_root() / "CMakeLists.txt").read_text()
    except OSError:
        return None
    m = re.search(r"project\(\s*mallard\s+VERSION\s+([0-9.]+)", text)
    return m.group(1) if m else None


def library_version(path: str, name: str) -> str:
    v = _embedded_version(path, name)
    if v:
        return v
    if name.startswith("mallard"):
        return _project_version() or "unknown"
    return _dpkg_version(path) or "unknown"


def glibc_version() -> str:
    try:
        v = os.confstr("CS_GNU_LIBC_VERSION")  # 'glibc 2.36'
        if v:
            return v.split()[-1]
    except (ValueError, OSError):
        pass
    return "unknown"


def mallard_variants() -> list[tuple[str, str]]:
    """(name, path) of Mallard's shared libraries: libmallard.so is 'mallard', libmallard-X.so is 'mallard-X'."""
    found: dict[str, str] = {}
    for d in mallard_lib_dirs():
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for fname in names:
            m = re.match(r"^libmallard(-[A-Za-z0-9_]+)?\.so$", fname)
            if not m or fname in NOT_ALLOCATORS:
                continue
            name = "mallard" + (m.group(1) or "")
            # Only the build dir and Mallard's own prefix are searched, so the first hit of a name wins.
            found.setdefault(name, str(d / fname))
    order = list(MALLARD_VARIANTS)
    return sorted(found.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]))


def discover() -> list[Allocator]:
    """Every allocator available on this machine: glibc first, then Mallard's variants (when built), then peers."""
    allocs = [Allocator("glibc", None, glibc_version())]
    for name, path in mallard_variants():
        allocs.append(Allocator(name, path, library_version(path, name)))
    used: set[str] = set()
    for name, stems in PEERS.items():
        for stem in stems:
            cands = [c for c in _so_candidates(stem, LIBRARY_DIRS) if os.path.realpath(c) not in used]
            if cands:
                path = cands[0]
                used.add(os.path.realpath(path))
                allocs.append(Allocator(name, path, library_version(path, name)))
                break
    return allocs


def missing_common(allocs: list[Allocator]) -> dict[str, str]:
    """Install hints for the common peers that discover() did not find."""
    have = {a.name for a in allocs}
    return {n: h for n, h in INSTALL_HINTS.items() if n not in have}


def resolve(name_or_path: str, allocs: list[Allocator] | None = None) -> Allocator:
    """An allocator by name (glibc, jemalloc, ...) or by path to a shared library; raises UnknownAllocator."""
    allocs = discover() if allocs is None else allocs
    known = [a.name for a in allocs]
    key = ALIASES.get(name_or_path.lower(), name_or_path.lower())
    for a in allocs:
        if a.name == key:
            return a
    if "/" in name_or_path or name_or_path.endswith(".so") or ".so." in name_or_path:
        p = Path(name_or_path).expanduser()
        if not p.is_file():
            raise UnknownAllocator(name_or_path, known, reason="no such allocator library")
        real = os.path.realpath(p)
        for a in allocs:
            if a.path and os.path.realpath(a.path) == real:
                return Allocator(a.name, str(p.resolve()), a.version)
        base = p.name
        m = re.match(r"^lib(.+?)\.so", base)
        label = m.group(1) if m else base
        return Allocator(label, str(p.resolve()), library_version(str(p), label))
    raise UnknownAllocator(name_or_path, known)


def preload_env(alloc: Allocator, base_env: dict | None = None, conf: str | None = None) -> dict:
    """A copy of base_env (default os.environ) that loads alloc: its path prepended to LD_PRELOAD, MALLARD_CONF set."""
    env = dict(os.environ if base_env is None else base_env)
    if alloc.path:
        old = env.get("LD_PRELOAD", "").strip()
        env["LD_PRELOAD"] = alloc.path + (":" + old if old else "")
    if conf is not None:
        env["MALLARD_CONF"] = conf
    return env
