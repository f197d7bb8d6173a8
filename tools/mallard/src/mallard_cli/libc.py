"""Which C library a program is built for (glibc or musl, dynamic or static); the musl builds that serve musl ones."""
from __future__ import annotations

import os
import platform
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import allocators as al

# The loaders (PT_INTERP) and the names musl's libc goes by: Debian's musl-tools maps /usr/lib/<triplet>-musl/libc.so
# (ld-musl-<arch>.so.1 is a link to it), Alpine /lib/ld-musl-<arch>.so.1 (libc.musl-<arch>.so.1 is a link to it).
MUSL_LOADER = re.compile(r"^ld-musl-[\w-]+\.so\.1$")
MUSL_LIBC = re.compile(r"^(ld-musl-[\w-]+\.so\.1|libc\.musl-[\w-]+\.so\.1)$")
GLIBC_LOADER = re.compile(r"^ld-linux[\w.-]*\.so\.\d+$")  # ld-linux-x86-64.so.2, ld-linux-aarch64.so.1
GLIBC_LIBC = re.compile(r"^libc\.so\.6$")

# The start of mallocng's size-class table (musl 1.2.1 and later), in 16-byte units, as 16-bit words: every program
# that links musl's malloc holds it in its read-only data, stripped or not; Mallard's libmallard.a does not.
_MALLOCNG_CLASSES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 18, 20, 25, 31, 36, 42, 50, 63, 72, 84, 102, 127)
# Symbols only musl's static libc defines (in a program that is not stripped).
_MUSL_SYMBOLS = ("__init_libc", "__libc_start_init", "__malloc_context", "__libc_malloc_impl")
# Strings of musl's libc that glibc does not have: strerror's message for 0, printf's prefix table.
_MUSL_STRINGS = (b"No error information\0", b"-0X+0X 0X-0x+0x 0x\0")
# Symbols and strings that name a linked-in Mallard (libmallard.a): its control call, the root of its live statistics,
# and the variable it reads its options from (left in a stripped program).
_MALLARD_SYMBOLS = ("mallard_ctl", "mallard_live_root")
_MALLARD_STRING = b"MALLARD_CONF\0"

BUILD_HINT = ("build one with `bash scripts/test-musl.sh` (or: CC=musl-gcc cmake -S . -B build-musl && cmake --build "
              "build-musl), or set MALLARD_MUSL_LIBDIR to the folder that holds it")
STATIC_HINT = "link Mallard in instead: musl-gcc -static ... build-musl/lib/libmallard.a"


@dataclass
class Program:
    """What a command's program file says about its C library."""

    path: str | None  # the ELF file examined (after $PATH and #! lines); None when there is none
    libc: str | None  # "musl", "glibc", or None (another runtime, not ELF, not readable)
    static: bool = False  # no program interpreter: LD_PRELOAD cannot reach it
    interp: str | None = None  # PT_INTERP
    linked: str | None = None  # static programs: the allocator linked in, "musl" (mallocng) or "mallard", or None
    evidence: str = ""  # how libc was decided, in words
    linked_why: str = ""  # how linked was decided

    @property
    def musl(self) -> bool:
        return self.libc == "musl"

    def describe(self) -> str:
        """'a static musl program (musl's malloc linked in)', 'a musl program', 'a glibc program'..."""
        kind = f"{'a static' if self.static else 'a'} {self.libc or 'non-C'} program"
        if self.static and self.linked:
            kind += " (" + ("musl's malloc, mallocng, linked in" if self.linked == "musl"
                            else "Mallard linked in (libmallard.a)") + ")"
        return kind


def _script_interpreter(path: str) -> str | None:
    """The program a `#!` script runs (through `/usr/bin/env NAME` too), or None when path is not such a script."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        rest = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        return shutil.which(rest[0]) if rest else None
    return words[0]


def find_program(name: str) -> str | None:
    """The file a command name runs, found like execvp does ($PATH unless it has a slash), or None."""
    if "/" in name:
        return name if os.path.isfile(name) else None
    return shutil.which(name)


def _symbol_names(elf) -> set[str]:
    names: set[str] = set()
    for secname in (".symtab", ".dynsym"):
        sec = elf.get_section_by_name(secname)
        if sec is None or not hasattr(sec, "iter_symbols"):
            continue
        for s in sec.iter_symbols():
            if s["st_shndx"] != "SHN_UNDEF" and s.name:
                names.add(s.name)
    return names


def _has_abi_tag(elf) -> bool:
    """glibc's start files put an NT_GNU_ABI_TAG note in every program they link; musl's put none."""
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_NOTE":
            for note in seg.iter_notes():
                if note["n_type"] == "NT_GNU_ABI_TAG":
                    return True
    return False


def _mallocng_signature(little: bool) -> bytes:
    return struct.pack(("<" if little else ">") + "%dH" % len(_MALLOCNG_CLASSES), *_MALLOCNG_CLASSES)


def _linked_in(elf, data: bytes, syms: set[str]) -> tuple[str | None, str]:
    """The allocator linked into an executable, as far as its contents tell: ('musl', why) when mallocng is in it,
    ('mallard', why) when libmallard.a is, else (None, '')."""
    if _mallocng_signature(elf.little_endian) in data or "__malloc_context" in syms:
        return "musl", "mallocng's size-class table is in it"
    if any(s in syms for s in _MALLARD_SYMBOLS):
        return "mallard", "it defines " + next(s for s in _MALLARD_SYMBOLS if s in syms)
    if _MALLARD_STRING in data:
        return "mallard", "it holds Mallard's strings (" + _MALLARD_STRING.rstrip(b"\0").decode() + ")"
    return None, ""


def _static_facts(elf, data: bytes) -> tuple[str | None, str | None, str, str]:
    """(libc, linked allocator, why that libc, why that allocator) of a program with no interpreter."""
    syms = _symbol_names(elf)
    sections = {s.name for s in elf.iter_sections()}
    linked, how_linked = _linked_in(elf, data, syms)
    if _has_abi_tag(elf) or b"GLIBC_TUNABLES\0" in data:
        # glibc's own malloc leaves no mark of its own: only a linked-in Mallard is named.
        return ("glibc", linked if linked == "mallard" else None, "glibc's ABI note or tunables are in it",
                how_linked if linked == "mallard" else "")
    if ".note.go.buildid" in sections or b"\xff Go buildinf:" in data:
        return None, None, "a Go program (no C library)", ""
    marks = [s for s in _MUSL_SYMBOLS if s in syms] + [s.rstrip(b"\0").decode() for s in _MUSL_STRINGS if s in data]
    if linked == "musl":
        why = "musl's malloc is in it"
    elif marks:
        why = "musl's " + ", ".join(f"'{m}'" for m in marks[:2]) + " are in it"
    else:
        why = "it has no glibc markers (no ABI note), so it is taken for musl"
    return "musl", linked, why, how_linked


def linked_allocator(path: str) -> tuple[str | None, str]:
    """('mallard' or 'musl', why) when the executable at path has that allocator linked in, else (None, '')."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
            f.seek(0)
            elf = ELFFile(f)
            return _linked_in(elf, data, _symbol_names(elf))
    except (OSError, ELFError, ValueError, KeyError, IndexError, AttributeError, struct.error):
        return None, ""


def examine(name: str, _depth: int = 0) -> Program:
    """What the program a command runs is built for: follows $PATH and `#!` lines (four deep); never raises."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    path = find_program(name)
    if path is None:
        return Program(None, None, evidence="not found")
    script = _script_interpreter(path)
    if script is not None:
        if _depth >= 4:
            return Program(path, None, evidence="too many #! interpreters")
        inner = examine(script, _depth + 1)
        if inner.path:
            inner.evidence = f"a script run by {inner.path}: " + inner.evidence
        return inner
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            if elf["e_type"] not in ("ET_EXEC", "ET_DYN"):
                return Program(path, None, evidence=f"not a program ({elf['e_type']})")
            interp = None
            for seg in elf.iter_segments():
                if seg["p_type"] == "PT_INTERP":
                    interp = seg.get_interp_name()
            if interp:
                base = os.path.basename(interp)
                if MUSL_LOADER.match(base):
                    return Program(path, "musl", interp=interp, evidence=f"its interpreter is {interp}")
                if GLIBC_LOADER.match(base):
                    return Program(path, "glibc", interp=interp, evidence=f"its interpreter is {interp}")
                return Program(path, None, interp=interp, evidence=f"its interpreter {interp} is neither glibc's nor "
                                                                   "musl's")
            f.seek(0)
            data = f.read(64 << 20)  # only a static program's contents are searched
            libc, linked, why, how_linked = _static_facts(elf, data)
            return Program(path, libc, static=True, linked=linked, evidence="statically linked; " + why,
                           linked_why=how_linked)
    except OSError as e:
        return Program(path, None, evidence=f"cannot read it ({e.strerror})")
    except (ELFError, ValueError, KeyError, IndexError, AttributeError, struct.error, UnicodeDecodeError):
        return Program(path, None, evidence="not an ELF file")


def library_libc(path: str) -> str | None:
    """The C library a shared library was built for: 'glibc' (libc.so.6, GLIBC_ symbol versions), 'musl' (libc.so or
    libc.musl-*.so.1 and no glibc versions), or None (no C library named, or unreadable)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            needed: list[str] = []
            for sec in elf.iter_sections():
                if isinstance(sec, DynamicSection):
                    needed += [t.needed for t in sec.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
            glibc_versions = False
            vr = elf.get_section_by_name(".gnu.version_r")
            if vr is not None and hasattr(vr, "iter_versions"):
                for _, auxs in vr.iter_versions():
                    if any(a.name.startswith("GLIBC_") for a in auxs):
                        glibc_versions = True
    except (OSError, ELFError, ValueError, KeyError, IndexError, AttributeError, struct.error):
        return None
    if glibc_versions or any(GLIBC_LIBC.match(n) or GLIBC_LOADER.match(n) for n in needed):
        return "glibc"
    if any(n == "libc.so" or MUSL_LIBC.match(n) for n in needed):
        return "musl"
    return None


def is_musl_libc_object(path: str, exe_interp: str | None = None) -> bool:
    """Whether a mapped file is musl's libc (which is its loader too): by its names, or as the musl interpreter the
    executable named (Debian maps it as /usr/lib/<triplet>-musl/libc.so)."""
    if MUSL_LIBC.match(os.path.basename(path)):
        return True
    if exe_interp and MUSL_LOADER.match(os.path.basename(exe_interp)):
        try:
            return os.path.realpath(path) == os.path.realpath(exe_interp)
        except OSError:
            return False
    return False


def interpreter(path: str) -> str | None:
    """The PT_INTERP of an ELF file (None: static, or not readable as ELF)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            for seg in ELFFile(f).iter_segments():
                if seg["p_type"] == "PT_INTERP":
                    return seg.get_interp_name()
    except (OSError, ELFError, ValueError, KeyError, IndexError, AttributeError, struct.error, UnicodeDecodeError):
        pass
    return None


# Folders whose loaders may be run (a program's PT_INTERP elsewhere would be code of the program's own choosing).
SYSTEM_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/local/musl/lib")


def system_loader(interp: str | None) -> bool:
    """Whether interp is a file in a system folder (after links), so that running it runs no code of a program's."""
    if not interp:
        return False
    real = os.path.realpath(interp)
    return os.path.isfile(real) and any(real.startswith(d + "/") for d in SYSTEM_DIRS)


def musl_loader() -> str | None:
    """This machine's musl loader (/lib/ld-musl-<arch>.so.1), when musl is installed."""
    for d in ("/lib", "/usr/lib", "/usr/local/musl/lib"):
        p = os.path.join(d, f"ld-musl-{platform.machine()}.so.1")
        if os.path.isfile(p):
            return p
    return None


_versions: dict[str, str] = {}


def musl_version(loader: str | None = None) -> str:
    """musl's version, as its loader prints it when run alone ('Version 1.2.3')."""
    loader = loader or musl_loader()
    if not loader:
        return "unknown"
    if loader not in _versions:
        v = "unknown"
        try:
            r = subprocess.run([loader], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
            m = re.search(r"Version\s+(\S+)", r.stdout + r.stderr)
            if m:
                v = m.group(1)
        except (OSError, subprocess.SubprocessError):
            pass
        _versions[loader] = v
    return _versions[loader]


def musl_lib_dirs() -> list[Path]:
    """Where musl builds of Mallard are looked for, in order (only files built for musl are taken from them).

    MALLARD_MUSL_LIBDIR (folders separated by ':') when set, and nothing else; otherwise $MALLARD_MUSL_BUILD_DIR/lib
    (scripts/test-musl.sh's variable), the musl build beside the glibc one (<build>-musl/lib: build-musl/lib in a
    checkout), a `musl` folder inside each of Mallard's usual folders, the musl multiarch and prefix folders, then
    Mallard's usual folders themselves (a musl distribution installs musl builds there).
    """
    override = os.environ.get("MALLARD_MUSL_LIBDIR")
    if override:
        return [Path(d) for d in override.split(os.pathsep) if d]
    dirs: list[Path] = []
    env_build = os.environ.get("MALLARD_MUSL_BUILD_DIR")
    if env_build:
        dirs.append(Path(env_build) / "lib")
    if os.environ.get("MALLARD_BUILD_DIR") or al.in_source_tree():
        b = al.build_dir()
        dirs.append(b.parent / (b.name + "-musl") / "lib")
    usual = al.mallard_lib_dirs()
    dirs += [d / "musl" for d in usual]
    arch = platform.machine()
    dirs += [Path(f"/usr/local/lib/{arch}-linux-musl"), Path(f"/usr/lib/{arch}-linux-musl"),
             Path("/usr/local/musl/lib"), Path("/usr/lib/musl/lib")]
    dirs += usual
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def _musl_files() -> dict[str, Path]:
    """Mallard's libraries built for musl: stem -> file, the first folder holding one winning."""
    found: dict[str, Path] = {}
    for d in musl_lib_dirs():
        for sub in (d, d / "mallard"):
            for stem, p in sorted(al._mallard_files(sub).items()):  # noqa: SLF001 - same package
                if stem not in found and p.is_file() and library_libc(str(p)) == "musl":
                    found[stem] = p
    return found


def musl_tracer_path() -> Path | None:
    """The tracer of `mallard profile` built for musl, if found."""
    return _musl_files().get("libmallard-tracer")


def musl_mallard_variants() -> list[tuple[str, str]]:
    """(name, path) of Mallard's musl builds: the same names as the glibc builds (mallard, mallard-secure)."""
    found = {"mallard" + stem[len("libmallard"):]: str(p) for stem, p in _musl_files().items()
             if stem + ".so" not in al.NOT_ALLOCATORS}
    order = list(al.MALLARD_VARIANTS)
    return sorted(found.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]))


@dataclass
class MuslAllocators:
    allocs: list  # what can serve a musl program: musl's own malloc first, then Mallard's musl builds, musl peers
    left_out: list  # peers found here that are built for glibc (they cannot be preloaded into a musl program)
    looked_in: list  # the folders searched for Mallard's musl builds


def discover_musl(loader: str | None = None) -> MuslAllocators:
    """The allocators a dynamic musl program can use on this machine."""
    allocs = [al.Allocator("musl", None, musl_version(loader))]
    for name, path in musl_mallard_variants():
        allocs.append(al.Allocator(name, path, al.library_version(path, name)))
    arch = platform.machine()
    peer_dirs = [f"/usr/local/lib/{arch}-linux-musl", f"/usr/lib/{arch}-linux-musl"] + al.LIBRARY_DIRS
    left_out: list = []
    used: set[str] = set()
    for name, stems in al.PEERS.items():
        glibc_one = None
        for stem in stems:
            cands = [c for c in al._so_candidates(stem, peer_dirs)  # noqa: SLF001 - same package
                     if os.path.realpath(c) not in used]
            musl = [c for c in cands if library_libc(c) == "musl"]
            if musl:
                used.add(os.path.realpath(musl[0]))
                allocs.append(al.Allocator(name, musl[0], al.library_version(musl[0], name)))
                glibc_one = None
                break
            if cands and glibc_one is None:
                glibc_one = cands[0]
        if glibc_one is not None and not any(a.name == name for a in allocs):
            used.add(os.path.realpath(glibc_one))
            left_out.append(al.Allocator(name, glibc_one, al.library_version(glibc_one, name)))
    return MuslAllocators(allocs, left_out, musl_lib_dirs())
