"""Symbolisation of a profile's locations: runtime address -> ELF address -> function, file:line and inlined frames.

ELF headers, PT_LOAD segments, build IDs and symbol tables (.symtab, else .dynsym) are read with pyelftools;
DWARF line tables and inlined frames come from binutils' `addr2line -f -C -i` (one call per file, all its
addresses at once), which also finds separate debug files (/usr/lib/debug/.build-id/...) by build ID and
debuglink. Without addr2line, or where a file has no DWARF, function names still come from the symbol tables, so
stripped distribution binaries that keep .dynsym (Debian's python3, redis-server, libc) are named, not `??`.
"""
from __future__ import annotations

import bisect
import os
import shutil
import subprocess
from dataclasses import dataclass

from .pprof import Location, Mapping, Profile


@dataclass(frozen=True)
class Frame:
    function: str  # demangled name, or MODULE+0xADDR when unknown
    file: str  # source file, "" when no debug information
    line: int  # 0 when unknown
    module: str  # the mapping's file name (basename), "" when the location has no mapping
    known: bool = True  # False when function is only MODULE+0xADDR

    def site(self) -> str:
        """The frame as shown: function, then file:line when known."""
        return f"{self.function} {os.path.basename(self.file)}:{self.line}" if self.file and self.line else \
            self.function


def build_id_debug_file(build_id: str) -> str | None:
    """The separate debug file of a build ID in the standard place (Debian's *-dbgsym packages), when installed."""
    if len(build_id) < 3:
        return None
    p = f"/usr/lib/debug/.build-id/{build_id[:2]}/{build_id[2:]}.debug"
    return p if os.path.isfile(p) else None


class ElfInfo:
    """What the symboliser needs of one ELF file, read once."""

    def __init__(self, path: str):
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile

        self.path = path
        self.segments: list[tuple[int, int, int]] = []  # (file offset, file size, virtual address) of PT_LOAD
        self.build_id = ""
        self.has_dwarf = False
        self.symbols: list[tuple[int, int, str]] = []  # (start, end, name) of functions, sorted by start
        self.aliases: dict[int, set[str]] = {}  # start -> every function name at that address
        try:
            with open(path, "rb") as f:
                elf = ELFFile(f)
                for seg in elf.iter_segments():
                    if seg["p_type"] == "PT_LOAD":
                        self.segments.append((seg["p_offset"], seg["p_filesz"], seg["p_vaddr"]))
                    elif seg["p_type"] == "PT_NOTE":
                        for note in seg.iter_notes():
                            if note["n_type"] == "NT_GNU_BUILD_ID":
                                self.build_id = note["n_desc"]
                self.has_dwarf = elf.get_section_by_name(".debug_info") is not None
                self.symbols = self._functions(elf)
        except (ELFError, OSError, ValueError) as e:
            raise OSError(f"{path}: not a readable ELF file ({e})") from None

    def _functions(self, elf) -> list[tuple[int, int, str]]:
        syms: dict[int, tuple[int, tuple, str]] = {}  # start -> (size, preference key, name)
        for name in (".symtab", ".dynsym"):  # the full table first; .dynsym adds what a stripped file keeps
            sec = elf.get_section_by_name(name)
            if sec is None or not hasattr(sec, "iter_symbols"):
                continue
            for s in sec.iter_symbols():
                if s["st_info"]["type"] not in ("STT_FUNC", "STT_GNU_IFUNC") or s["st_shndx"] == "SHN_UNDEF" \
                        or not s["st_value"] or not s.name:
                    continue
                start, size, nm = s["st_value"], s["st_size"], s.name.split("@")[0]
                # Aliases share an address (libc's __strdup and strdup, __libc_malloc and malloc): the public name
                # wins: fewest leading underscores, then global before weak before local, then the shorter.
                bind = {"STB_GLOBAL": 0, "STB_WEAK": 1}.get(s["st_info"]["bind"], 2)
                pref = (len(nm) - len(nm.lstrip("_")), bind, len(nm), nm)
                old = syms.get(start)
                if old is None or (pref < old[1]):
                    syms[start] = (max(size, old[0] if old else 0), pref, nm)
                else:
                    syms[start] = (max(size, old[0]), old[1], old[2])
                self.aliases.setdefault(start, set()).add(nm)
        starts = sorted(syms)
        out = []
        for i, st in enumerate(starts):
            size, _, name = syms[st]
            # A symbol without size reaches to the next symbol (hand-written assembly often has none).
            end = st + size if size else (starts[i + 1] if i + 1 < len(starts) else st + 1)
            out.append((st, end, name))
        return out

    def vaddr(self, file_offset: int) -> int | None:
        """The ELF virtual address of a file offset, through the PT_LOAD segment that holds it."""
        for off, size, va in self.segments:
            if off <= file_offset < off + max(size, 1):
                return file_offset - off + va
        return None

    def symbol(self, vaddr: int) -> str | None:
        i = bisect.bisect_right(self.symbols, (vaddr, float("inf"), "")) - 1
        if i >= 0 and self.symbols[i][0] <= vaddr < self.symbols[i][1]:
            return self.symbols[i][2]
        return None

    def public(self, vaddr: int, name: str) -> str:
        """The public alias of name when name is another name of the function holding vaddr (addr2line reports the
        name its tables give, e.g. glibc's internal __GI___strdup from a debug file, where users know strdup)."""
        sym = self.symbol(vaddr)
        if sym is None:
            return name
        start = self.symbols[bisect.bisect_right(self.symbols, (vaddr, float("inf"), "")) - 1][0]
        bare = name[len("__GI_"):] if name.startswith("__GI_") else name
        return sym if bare in self.aliases.get(start, ()) or name == sym else name


def _addr2line(path: str, addrs: list[int]) -> dict[int, list[tuple[str, str, int]]] | None:
    """addr2line's frames per address, innermost first: (function or '??', file or '', line or 0); None if absent."""
    exe = shutil.which("addr2line")
    if not exe or not addrs:
        return None
    # -a prints each address before its frames, which delimits the variable number of inlined frames.
    try:
        r = subprocess.run([exe, "-a", "-f", "-C", "-i", "-e", path], input="".join(f"0x{a:x}\n" for a in addrs),
                           capture_output=True, text=True, timeout=300, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    res: dict[int, list[tuple[str, str, int]]] = {}
    cur: list | None = None
    lines = r.stdout.splitlines()
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("0x") and _is_hex(ln):  # function names and file:line never look like this
            cur = res.setdefault(int(ln, 16), [])
            i += 1
            continue
        if cur is None or i + 1 >= len(lines):
            break
        func, loc = ln, lines[i + 1]
        i += 2
        loc = loc.split(" (discriminator")[0]
        file, _, num = loc.rpartition(":")
        line = int(num) if num.isdigit() else 0
        cur.append((func, "" if file in ("??", "") else file, line))
    return res


def _is_hex(s: str) -> bool:
    try:
        int(s, 16)
        return True
    except ValueError:
        return False


def _demangle(names: set[str]) -> dict[str, str]:
    mangled = sorted(n for n in names if n.startswith("_Z"))
    exe = shutil.which("c++filt")
    if not mangled or not exe:
        return {}
    try:
        r = subprocess.run([exe], input="\n".join(mangled) + "\n", capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    got = r.stdout.splitlines()
    return dict(zip(mangled, got)) if r.returncode == 0 and len(got) == len(mangled) else {}


class Symbolizer:
    """Resolves every location of a profile; warnings (missing file, build-ID mismatch) are collected, not raised."""

    def __init__(self, use_addr2line: bool = True):
        self.use_addr2line = use_addr2line
        self.warnings: list[str] = []
        self._elf: dict[str, ElfInfo | None] = {}

    def _open(self, m: Mapping) -> ElfInfo | None:
        key = f"{m.filename}\0{m.build_id}"
        if key in self._elf:
            return self._elf[key]
        info = None
        name = m.filename
        if not name or name.startswith("[") or name.startswith("//anon"):
            self._elf[key] = None  # [vdso], [heap], anonymous JIT code: nothing to read
            return None
        cands = [name] + ([d] if (d := build_id_debug_file(m.build_id)) else [])
        for c in cands:
            if not os.path.isfile(c):
                continue
            try:
                info = ElfInfo(c)
            except OSError as e:
                self.warnings.append(str(e))
                continue
            if m.build_id and info.build_id and info.build_id.lower() != m.build_id.lower():
                self.warnings.append(f"{c}: build ID {info.build_id} differs from the profile's {m.build_id} (the "
                                     "file changed since the profile was taken): its addresses are not symbolised")
                info = None
                continue
            break
        if info is None and not any(os.path.isfile(c) for c in cands):
            self.warnings.append(f"{name}: file not found: its addresses are not symbolised")
        self._elf[key] = info
        return info

    def resolve(self, prof: Profile) -> dict[int, list[Frame]]:
        """Frames (innermost inlined function first) of every location id of prof."""
        by_file: dict[str, list[tuple[Location, int]]] = {}
        infos: dict[str, ElfInfo] = {}
        vaddrs: dict[int, tuple[ElfInfo, int] | None] = {}
        for loc in prof.locations.values():
            m = prof.mappings.get(loc.mapping_id)
            info = self._open(m) if m else None
            va = info.vaddr(loc.address - m.start + m.offset) if info and m and loc.address >= m.start else None
            vaddrs[loc.id] = (info, va) if info and va is not None else None
            if info and va is not None:
                by_file.setdefault(info.path, []).append((loc, va))
                infos[info.path] = info
        dwarf: dict[str, dict] = {}
        if self.use_addr2line:
            for path, items in by_file.items():
                got = _addr2line(path, sorted({va for _, va in items}))
                if got is not None:
                    dwarf[path] = got
        frames: dict[int, list[Frame]] = {}
        names: set[str] = set()
        for loc in prof.locations.values():
            m = prof.mappings.get(loc.mapping_id)
            module = os.path.basename(m.filename) if m else ""
            hit = vaddrs[loc.id]
            fr: list[Frame] = []
            if hit:
                info, va = hit
                sym = info.symbol(va)
                for func, file, line in dwarf.get(info.path, {}).get(va, []):
                    # Without DWARF (no file), addr2line names an address after the nearest symbol before it, even
                    # far past that symbol's end (a static function of a stripped binary gets a neighbour's
                    # name): such names are not trusted; the size-checked symbol tables decide.
                    fr.append(Frame(func if func != "??" and file else "", file, line, module))
                if fr and sym:  # the outermost frame is the symbol holding the address
                    fr[-1] = Frame(info.public(va, fr[-1].function) if fr[-1].function else sym, fr[-1].file,
                                   fr[-1].line, module)
                if not fr and sym:
                    fr = [Frame(sym, "", 0, module)]
            fr = [f for f in fr if f.function or f.file]
            if not any(f.function for f in fr):
                fr = self._from_profile(prof, loc, module) or fr
            if not fr or not fr[-1].function:
                # MODULE+0xN, stable across load addresses: N is the ELF address when the file could be read, else
                # the offset in the file.
                n = hit[1] if hit else (loc.address - m.start + m.offset if m and loc.address >= m.start else None)
                unknown = f"{module}+0x{n:x}" if module and n is not None else f"0x{loc.address:x}"
                fr = [Frame(f.function or unknown, f.file, f.line, module, bool(f.function)) for f in fr] or \
                    [Frame(unknown, "", 0, module, False)]
            frames[loc.id] = fr
            names.update(f.function for f in fr)
        dem = _demangle(names)
        if dem:
            frames = {k: [Frame(dem.get(f.function, f.function), f.file, f.line, f.module, f.known) for f in v]
                      for k, v in frames.items()}
        return frames

    @staticmethod
    def _from_profile(prof: Profile, loc: Location, module: str) -> list[Frame]:
        """The names the writer put in the profile (libmallard names what it can resolve cheaply)."""
        out = []
        for ln in loc.lines:
            f = prof.functions.get(ln.function_id)
            if f and (f.name or f.system_name):
                out.append(Frame(f.name or f.system_name, f.filename, ln.line, module))
        return out
