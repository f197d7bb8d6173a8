"""Allocator discovery: Mallard's own builds, glibc's built-in malloc and peer libraries found on this machine."""
from __future__ import annotations

import os
import re
import shutil
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
NOT_ALLOCATORS = {"libmallard-tracer.so", "libmallard-nostats.so", "libmallard-faults.so"}   # tools and test shims
ALIASES = {"system": "glibc", "default": "glibc", "libc": "glibc", "ptmalloc": "glibc", "ptmalloc2": "glibc"}


class UnknownAllocator(ValueError):
    """An allocator name or path that is not available here; the message lists the known names."""

    def __init__(self, name: str, known: list[str], reason: str = "unknown allocator", problem: str | None = None):
        self.name = name
        self.known = known
        if problem:  # a file that exists but cannot serve as an allocator
            super().__init__(f"'{name}' is not an allocator: {problem}")
        else:
            super().__init__(f"{reason} '{name}'; known allocators: {', '.join(known)} (or a path to a .so file)")


@dataclass
class Allocator:
    name: str  # 'glibc', 'jemalloc', 'mimalloc', 'tcmalloc', 'mallard', 'mallard-secure', or a custom file name
    path: str | None  # the .so to LD_PRELOAD; None for glibc (nothing preloaded)
    version: str  # e.g. '5.3.0' or 'unknown'
    conf: str | None = None  # options this allocator always runs with (bench/run.py's NAME@OPTIONS), in its variable


def repo_root() -> Path:
    """The repository root, found relative to this file (tools/mallard/src/mallard_cli/)."""
    return Path(__file__).resolve().parents[4]


def in_source_tree() -> bool:
    """True when this command runs from a Mallard checkout (not from an installed copy)."""
    root = repo_root()
    return (root / "tools" / "mallard" / "pyproject.toml").is_file() and (root / "CMakeLists.txt").is_file()


def build_dir() -> Path:
    env = os.environ.get("MALLARD_BUILD_DIR")
    return Path(env) if env else repo_root() / "build"


def _pkg_config_libdir() -> Path | None:
    """`pkg-config --variable=libdir mallard`: the prefix an installed Mallard announces."""
    exe = shutil.which("pkg-config") or shutil.which("pkgconf")
    if not exe:
        return None
    try:
        r = subprocess.run([exe, "--variable=libdir", "mallard"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    d = r.stdout.strip()
    return Path(d) if r.returncode == 0 and d else None


def _ldconfig_dirs() -> list[Path]:
    """Folders of the loader's cache (ldconfig -p) that hold a Mallard library."""
    exe = shutil.which("ldconfig") or next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.isfile(p)),
                                           None)
    if not exe:
        return []
    try:
        r = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    dirs: list[Path] = []
    for line in r.stdout.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libmallard") and path:
            d = Path(path).parent
            if d not in dirs:
                dirs.append(d)
    return dirs


def mallard_lib_dirs() -> list[Path]:
    """Where Mallard's own libraries are looked for, in order.

    MALLARD_LIBDIR (folders separated by ':') when set, and nothing else; otherwise MALLARD_BUILD_DIR's lib, the
    checkout's build/lib when this command runs from a checkout, `pkg-config --variable=libdir mallard`, the prefix
    this package is installed in, the loader's cache (ldconfig -p) and the standard folders.
    """
    override = os.environ.get("MALLARD_LIBDIR")
    if override:
        return [Path(d) for d in override.split(os.pathsep) if d]
    dirs: list[Path] = []
    if os.environ.get("MALLARD_BUILD_DIR") or in_source_tree():
        dirs.append(build_dir() / "lib")
    pc = _pkg_config_libdir()
    if pc:
        dirs.append(pc)
    # A system-wide install of this package lives in <prefix>/lib/python3*/{site,dist}-packages/mallard_cli.
    for parent in Path(__file__).resolve().parents:
        if parent.name.startswith("python") and parent.parent.name in ("lib", "lib64") \
                and parent.parent.parent != Path.home() and "venv" not in str(parent):
            dirs.append(parent.parent)
            break
    dirs += _ldconfig_dirs()
    dirs += [Path(d) for d in LIBRARY_DIRS]
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


# libmallard.so, libmallard.so.0, libmallard-secure.so.0.1.0, ...: group 1 is the variant suffix.
_MALLARD_FILE = re.compile(r"^libmallard(-[A-Za-z0-9_]+)?\.so(\.\d+)*$")


def _mallard_files(d: Path) -> dict[str, Path]:
    """Mallard's libraries in one folder: file stem ('libmallard-secure') -> the file to load (the soname
    libX.so.N when present, as runtime packages ship it without the development link libX.so)."""
    try:
        names = os.listdir(d)
    except OSError:
        return {}
    best: dict[str, str] = {}
    for n in names:
        m = _MALLARD_FILE.match(n)
        if not m:
            continue
        stem = "libmallard" + (m.group(1) or "")
        # The soname libx.so.N first, then libx.so, then fully versioned names.
        pref = lambda x: (0 if x.count(".") == 2 else 1 if x.count(".") == 1 else 2, x)  # noqa: E731
        if stem not in best or pref(n) < pref(best[stem]):
            best[stem] = n
    return {stem: d / n for stem, n in best.items()}


def tracer_path() -> Path | None:
    """The interposing tracer library of `mallard profile`, if built or installed."""
    for d in mallard_lib_dirs():
        for sub in (d, d / "mallard"):
            p = _mallard_files(sub).get("libmallard-tracer")
            if p and p.is_file():
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
        for stem, path in sorted(_mallard_files(d).items()):
            if stem + ".so" in NOT_ALLOCATORS:
                continue
            found.setdefault("mallard" + stem[len("libmallard"):], str(path))  # the first folder holding it wins
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
        problem = not_an_allocator(str(p))
        if problem:
            raise UnknownAllocator(name_or_path, known, problem=problem)
        real = os.path.realpath(p)
        for a in allocs:
            if a.path and os.path.realpath(a.path) == real:
                return Allocator(a.name, str(p.resolve()), a.version)
        base = p.name
        m = re.match(r"^lib(.+?)\.so", base)
        label = m.group(1) if m else base
        return Allocator(label, str(p.resolve()), library_version(str(p), label))
    raise UnknownAllocator(name_or_path, known)


_ELF_MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64", "i686": "EM_386", "i386": "EM_386",
                 "riscv64": "EM_RISCV", "ppc64le": "EM_PPC64", "s390x": "EM_S390"}


def not_an_allocator(path: str) -> str | None:
    """Why the file at path cannot replace malloc (not ELF, not a shared object, wrong machine, no malloc), or None."""
    import platform

    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            if elf["e_type"] != "ET_DYN":
                return f"not a shared library ({elf['e_type']})"
            want = _ELF_MACHINES.get(platform.machine())
            if want and elf["e_machine"] != want:
                return f"built for another machine ({elf['e_machine']}, this one needs {want})"
            if not _elf_defines(elf, "malloc"):
                return "a shared library that does not define malloc, so it is not an allocator"
    except OSError as e:
        return f"cannot read it ({e.strerror})"
    except (ELFError, ValueError, KeyError, IndexError):
        return "not a shared library (no valid ELF header)"
    return None


def _elf_defines(elf, name: str) -> bool:
    """Whether an open ELF file (pyelftools) defines the dynamic symbol name."""
    dynsym = elf.get_section_by_name(".dynsym")
    return dynsym is not None and any(s["st_shndx"] != "SHN_UNDEF" for s in dynsym.get_symbol_by_name(name) or [])


def defines_symbol(path: str, name: str) -> bool:
    """Whether the shared library at path defines the dynamic symbol name (False when it cannot be read)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            return _elf_defines(ELFFile(f), name)
    except (OSError, ELFError, ValueError, KeyError, IndexError):
        return False


def is_mallard(alloc: Allocator) -> bool:
    return alloc.name.startswith("mallard")


# MALLARD_CONF keys that jemalloc's MALLOC_CONF accepts with the same meaning (same key:value,... syntax).
JEMALLOC_SAME_KEYS = {"narenas", "dirty_decay_ms", "muzzy_decay_ms", "background_thread", "retain"}


class ConfNotApplicable(ValueError):
    """--conf given for an allocator that does not read MALLARD_CONF and has no equivalent."""


def conf_variable(alloc: Allocator, conf: str | None) -> tuple[str, str] | None:
    """The environment variable and value that carry --conf to alloc: MALLARD_CONF for Mallard, MALLOC_CONF for
    jemalloc when every key means the same there; raises ConfNotApplicable otherwise."""
    if conf is None:
        return None
    if is_mallard(alloc) or (alloc.path and defines_symbol(alloc.path, "mallard_ctl")):
        return "MALLARD_CONF", conf
    if alloc.name == "jemalloc":
        keys = [item.split(":", 1)[0] for item in conf.split(",") if item]
        other = [k for k in keys if k not in JEMALLOC_SAME_KEYS]
        if not other:
            return "MALLOC_CONF", conf
        raise ConfNotApplicable(f"--conf: jemalloc has no option {', '.join(repr(k) for k in other)}; it reads "
                                f"MALLOC_CONF (only {', '.join(sorted(JEMALLOC_SAME_KEYS))} carry over): set "
                                "MALLOC_CONF yourself")
    hint = {"mimalloc": "mimalloc reads MIMALLOC_* variables (e.g. MIMALLOC_ARENA_EAGER_COMMIT)",
            "mimalloc-secure": "mimalloc reads MIMALLOC_* variables",
            "tcmalloc": "tcmalloc reads TCMALLOC_* variables",
            "glibc": "glibc's malloc reads GLIBC_TUNABLES (e.g. glibc.malloc.arena_max=2)",
            "musl": "musl's malloc has no options"}.get(
        alloc.name, f"{alloc.name} does not read MALLARD_CONF")
    raise ConfNotApplicable(f"--conf sets Mallard's options, which {alloc.name} ignores ({hint}): set its own "
                            "variable in the environment instead")


def preload_env(alloc: Allocator, base_env: dict | None = None, conf: str | None = None) -> dict:
    """A copy of base_env (default os.environ) that loads alloc: its path prepended to LD_PRELOAD, and --conf (else
    the allocator's own conf) in the variable alloc reads (see conf_variable; raises ConfNotApplicable)."""
    env = dict(os.environ if base_env is None else base_env)
    if conf is None:
        conf = getattr(alloc, "conf", None)
    if alloc.path:
        old = env.get("LD_PRELOAD", "").strip()
        env["LD_PRELOAD"] = alloc.path + (":" + old if old else "")
    var = conf_variable(alloc, conf)
    if var is not None:
        env[var[0]] = var[1]
    return env
