"""Reading a live process: which allocator it uses (from its mappings) and its memory by kind (from smaps)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from . import libc as lc

ARENA_HEAP = 64 << 20  # glibc HEAP_MAX_SIZE on 64-bit: each non-main arena heap reserves this much, aligned to it


class ProcessError(Exception):
    """A PID that does not exist or whose /proc files cannot be read."""


# Library file names (without lib prefix) -> allocator names, most specific first.
ALLOCATOR_LIBS = [
    (re.compile(r"libmallard-tracer\.so"), "mallard-tracer"),
    (re.compile(r"libmallard-secure\.so"), "mallard-secure"),
    (re.compile(r"libmallard\.so"), "mallard"),
    (re.compile(r"libjemalloc\.so"), "jemalloc"),
    (re.compile(r"libmimalloc-secure\.so"), "mimalloc-secure"),
    (re.compile(r"libmimalloc\.so"), "mimalloc"),
    (re.compile(r"libtcmalloc_minimal(_debug)?\.so"), "tcmalloc"),
    (re.compile(r"libtcmalloc(_and_profiler|_debug)?\.so"), "tcmalloc-full"),
    (re.compile(r"libsnmalloc\w*\.so"), "snmalloc"),
    (re.compile(r"librpmalloc\.so"), "rpmalloc"),
    (re.compile(r"libhoard\.so"), "hoard"),
    (re.compile(r"libscudo\w*\.so"), "scudo"),
    (re.compile(r"libhardened_malloc\w*\.so"), "hardened_malloc"),
    (re.compile(r"libc_malloc_debug\.so"), "glibc-malloc-debug"),
]


def _read(pid: int, name: str, binary: bool = False):
    path = f"/proc/{pid}/{name}"
    try:
        with open(path, "rb" if binary else "r") as f:
            return f.read()
    except FileNotFoundError:
        raise ProcessError(f"no process with PID {pid}") from None
    except PermissionError:
        raise ProcessError(f"cannot read {path}: permission denied (run as the process's owner or as root)") from None
    except ProcessLookupError:
        raise ProcessError(f"process {pid} exited while being read") from None
    except OSError as e:
        raise ProcessError(f"cannot read {path}: {e.strerror}") from None


def check_pid(pid_text: str) -> int:
    try:
        pid = int(pid_text)
    except ValueError:
        raise ProcessError(f"'{pid_text}' is not a PID (a positive number)") from None
    if pid <= 0:
        raise ProcessError(f"'{pid_text}' is not a PID (a positive number)")
    if not os.path.exists(f"/proc/{pid}"):
        raise ProcessError(f"no process with PID {pid}")
    return pid


@dataclass
class WhichResult:
    pid: int
    allocator: str | None  # None: cannot tell
    libraries: list[str]  # allocator libraries mapped, in the loader's search order
    reason: str  # how it was decided, or why it cannot tell
    traced: bool = False  # the mallard tracer is interposed in front of the allocator
    exe: str = ""
    ld_preload: str | None = None
    unreadable: bool = False  # no mappings could be read (a kernel thread, a zombie)
    # What decided: "got" (the malloc slot the process resolved, read from its memory), "loader-order" (the loader's
    # search order from the ELF files; LD_PRELOAD from /proc/PID/environ), "mappings" (the mapped files alone).
    method: str = ""  # or "executable": a static program's own contents (mallocng's table, Mallard's symbols)
    slot: dict | None = None  # with "got": the object, symbol, relocation, slot address, value and target file
    libc: str | None = None  # the C library the program is built for: "glibc", "musl", or None (cannot tell)


def _mapped_files(maps_text: str) -> list[str]:
    seen: list[str] = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            path = parts[5].strip()
            if path not in seen:
                seen.append(path)
    return seen


def allocator_name(path: str) -> str | None:
    base = os.path.basename(path)
    for pat, name in ALLOCATOR_LIBS:
        if pat.match(base):
            return name
    return None


@dataclass
class _Elf:
    needed: list[str]
    soname: str | None
    defines_malloc: bool


_elf_cache: dict[str, _Elf | None] = {}


def _elf(path: str) -> _Elf | None:
    """The dynamic-linking facts of one mapped file (None when it cannot be read as ELF)."""
    if path in _elf_cache:
        return _elf_cache[path]
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    info = None
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            needed, soname = [], None
            for sec in elf.iter_sections():
                if isinstance(sec, DynamicSection):
                    for tag in sec.iter_tags():
                        if tag.entry.d_tag == "DT_NEEDED":
                            needed.append(tag.needed)
                        elif tag.entry.d_tag == "DT_SONAME":
                            soname = tag.soname
            dynsym = elf.get_section_by_name(".dynsym")
            syms = (dynsym.get_symbol_by_name("malloc") or []) if dynsym is not None else []
            info = _Elf(needed, soname, any(x["st_shndx"] != "SHN_UNDEF" for x in syms))
    except (OSError, ELFError, ValueError, KeyError, IndexError, AttributeError):
        info = None
    _elf_cache[path] = info
    return info


def _preload_list(preload: str | None) -> list[str]:
    """LD_PRELOAD's entries, then /etc/ld.so.preload's: the order in which the loader puts them in front."""
    items = [p for p in re.split(r"[:\s]+", preload or "") if p]
    try:
        with open("/etc/ld.so.preload") as f:
            items += [p for p in f.read().split() if p and not p.startswith("#")]
    except OSError:
        pass
    return items


def search_order(exe: str, files: list[str], preload: str | None) -> tuple[list[str], bool]:
    """The mapped objects in the order the loader searches them for a symbol: the executable, the preloaded
    libraries, then the dependencies breadth first. Objects loaded later (dlopen) are not in it. The flag is False
    when the order could not be read from the ELF files (then it is the mapping order)."""
    libs = [f for f in files if f != exe]
    by_name: dict[str, str] = {}
    for f in libs:
        by_name.setdefault(os.path.basename(f), f)
        by_name.setdefault(os.path.basename(os.path.realpath(f)), f)

    def lookup(name: str) -> str | None:
        if "/" in name:
            real = os.path.realpath(name)
            return next((f for f in libs if f == name or os.path.realpath(f) == real), None)
        if name in by_name:
            return by_name[name]
        for f in libs:  # a file whose name is not its soname (libx.so.1.2.3 for libx.so.1)
            e = _elf(f)
            if e and e.soname == name:
                by_name[name] = f
                return f
        return None

    exe_elf = _elf(exe) if exe else None
    if exe_elf is None:
        return files, False
    order: list[str] = [exe]
    for p in _preload_list(preload):
        f = lookup(p)
        if f and f not in order:
            order.append(f)
    queue = list(order)
    while queue:
        obj = queue.pop(0)
        e = _elf(obj)
        for name in (e.needed if e else []):
            f = lookup(name)
            if f and f not in order:
                order.append(f)
                queue.append(f)
    return order, True


def _m(method: str, w: WhichResult) -> WhichResult:
    w.method = method
    return w


_LIBC = re.compile(r"libc(-[\d.]+)?\.so")
# How the reason names a C library's own malloc.
_C_MALLOC = {"musl": "musl's libc, whose malloc is mallocng", "glibc": "glibc"}
_interps: dict[str, str | None] = {}


def libc_of(path: str, exe: str) -> str | None:
    """'musl' or 'glibc' when the mapped file path is that C library (its malloc the C library's own), else None."""
    if exe and exe not in _interps:
        _interps[exe] = lc.interpreter(exe)
    if lc.is_musl_libc_object(path, _interps.get(exe)):
        return "musl"
    return "glibc" if _LIBC.match(os.path.basename(path)) else None


def _linked_reason(exe: str) -> tuple[str | None, str]:
    """The allocator linked into an executable that defines malloc itself, and the words that say so."""
    name, why = lc.linked_allocator(exe) if exe else (None, "")
    if name == "mallard":
        return name, f"the executable {exe} defines malloc itself: Mallard is linked in (libmallard.a; {why})"
    return None, f"the executable {exe} defines malloc itself (an allocator linked in statically)"


def _environ_preload(pid: int) -> str | None:
    """LD_PRELOAD as /proc/PID/environ shows it: only a hint, since a process may write over that memory."""
    try:
        env = _read(pid, "environ", binary=True)
    except ProcessError:
        return None
    preload = None
    for item in env.split(b"\0"):
        if item.startswith(b"LD_PRELOAD="):
            preload = item[len(b"LD_PRELOAD="):].decode(errors="replace")
    return preload


def resolved_slot(pid: int, maps_text: str, exe: str, files: list[str]):
    """The malloc slot the process resolved: from the executable's relocations, else libc's, else the first mapped
    object's that imports malloc. Returns (Slot, "") or (None, why it cannot be used)."""
    from . import gotslot as gs

    maps = gs.parse_maps(maps_text)
    libc = [f for f in files if _LIBC.match(os.path.basename(f))]
    candidates = ([exe] if exe in files else []) + libc + [f for f in files if f != exe and f not in libc]
    unbound: list[str] = []
    for obj in candidates:
        try:
            slot = gs.read_slot(pid, maps, obj, "malloc")
        except gs.SlotError as e:
            return None, str(e)
        if slot is None:
            continue
        e = _elf(obj)
        if slot.target == obj and not (e and e.defines_malloc):
            unbound.append(obj)  # lazy binding: it still points into the object's own PLT; try the next one
            continue
        if slot.target is None:
            return None, f"the malloc slot of {obj} holds {slot.value:#x}, which is in no mapped file"
        slot.unbound = unbound
        return slot, ""
    if unbound:
        return None, ("the malloc slot of " + ", ".join(unbound) + " is not bound yet (lazy binding: it still points "
                      "into the object's own PLT)")
    return None, "no mapped object imports malloc through a relocation slot (statically linked)"


def which(pid: int) -> WhichResult:
    w = _which(pid)
    if not w.unreadable:
        interp = lc.interpreter(f"/proc/{pid}/exe")
        if interp:
            base = os.path.basename(interp)
            w.libc = "musl" if lc.MUSL_LOADER.match(base) else "glibc" if lc.GLIBC_LOADER.match(base) else None
        elif w.exe:
            w.libc = lc.examine(f"/proc/{pid}/exe").libc
    return w


def _which(pid: int) -> WhichResult:
    maps = _read(pid, "maps")
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    preload = _environ_preload(pid)
    if not maps.strip():
        return WhichResult(pid, None, [], _why_no_mappings(pid), exe=exe, unreadable=True)
    files = _mapped_files(maps)
    base = _by_order(pid, maps, exe, preload, files)
    slot, why_not = resolved_slot(pid, maps, exe, files)
    if slot is None:
        base.reason += f" [decided by the {base.method.replace('-', ' ')}: {why_not}]"
        return base
    target = slot.target
    name = allocator_name(target)
    where = (f"decided by the malloc slot ({slot.kind}) of {slot.obj}, read from the process's memory: it holds "
             f"{slot.value:#x}, in {target}")
    if slot.unbound:
        where += " (the slot of " + ", ".join(slot.unbound) + " is not bound yet: lazy binding)"
    info = {"object": slot.obj, "symbol": "malloc", "relocation": slot.kind, "address": hex(slot.address),
            "value": hex(slot.value), "target": target}
    free_note = ""
    from . import gotslot as gs

    try:
        fslot = gs.read_slot(pid, gs.parse_maps(maps), slot.obj, "free")
    except gs.SlotError:  # free is only a cross-check
        fslot = None
    if fslot is not None and fslot.target not in (None, slot.obj):
        info["free_target"] = fslot.target
        if fslot.target != target:
            free_note = f"; but its free slot points into {fslot.target}"
    base.slot = info
    if name == "mallard-tracer":
        # The tracer forwards every call to the next definition in the loader's order.
        base.reason += f" [{where}, the mallard-tracer, which forwards to the allocator behind it]"
        return base
    if target == exe:
        base.allocator, why = _linked_reason(exe)
        base.reason = f"{why} [{where}]"
        return _m("got", base)
    c_lib = libc_of(target, exe) if name is None else None
    if c_lib:
        name = c_lib
    needed_order, exact = search_order(exe, files, None)
    preloaded_env = {os.path.realpath(x) for x in _preload_list(preload) if "/" in x}
    preloaded = os.path.realpath(target) in preloaded_env or os.path.basename(target) in (preload or "") or \
        (exact and target not in needed_order)
    how = f"{target} " + (f"({_C_MALLOC[c_lib]}) " if c_lib == "musl" else "") + \
        ("is preloaded (LD_PRELOAD), so its malloc comes first" if preloaded
         else "defines the first malloc in the loader's search order")
    alloc_libs = [target] if allocator_name(target) not in (None, "mallard-tracer") else []
    alloc_libs += [f for f in base.libraries if f != target]
    others = [f for f in alloc_libs if f != target]
    if others:
        how += "; also linked, but behind it: " + ", ".join(others)
    later = [f for f in files if allocator_name(f) not in (None, "mallard-tracer") and f not in needed_order
             and f != target and os.path.realpath(f) not in preloaded_env]
    if later:
        how += "; also mapped but loaded later (dlopen), so not serving malloc: " + ", ".join(later)
    if preloaded and not preload:
        how += "; /proc/PID/environ shows no LD_PRELOAD: the process has written over its environment (e.g. its title)"
    if base.allocator != (name or os.path.basename(target)):
        how += f"; the environment and the loader's order alone would say {base.allocator or 'cannot tell'}"
    how += f" [{where}{free_note}]"
    return _m("got", WhichResult(pid, name or os.path.basename(target), alloc_libs, how, base.traced, exe, preload,
                                 slot=info))


def _by_order(pid: int, maps: str, exe: str, preload: str | None, files: list[str]) -> WhichResult:
    """The allocator as the loader's search order (LD_PRELOAD from /proc/PID/environ) or the mappings say."""
    traced = any(allocator_name(f) == "mallard-tracer" for f in files)
    order, exact = search_order(exe, files, preload)
    alloc_libs = [f for f in order if allocator_name(f) not in (None, "mallard-tracer")]
    later = [f for f in files if allocator_name(f) not in (None, "mallard-tracer") and f not in order]
    preloaded = {os.path.realpath(x) for x in _preload_list(preload) if "/" in x}
    note_later = ("; also mapped but loaded later (dlopen), so not serving malloc: " + ", ".join(later)) if later else ""
    if exact:
        for obj in order:
            name = allocator_name(obj)
            if name == "mallard-tracer":
                continue  # it forwards every call to the next definition
            e = _elf(obj)
            if not (e and e.defines_malloc):
                continue
            if obj == exe:
                linked, why = _linked_reason(exe)
                return _m("loader-order", WhichResult(pid, linked, alloc_libs, why, traced, exe, preload))
            c_lib = libc_of(obj, exe) if name is None else None
            if c_lib:
                name = c_lib
            how = f"{obj} " + (f"({_C_MALLOC[c_lib]}) " if c_lib == "musl" else "") + \
                ("is preloaded (LD_PRELOAD), so its malloc comes first"
                               if os.path.realpath(obj) in preloaded or os.path.basename(obj) in (preload or "")
                               else "defines the first malloc in the loader's search order")
            others = [f for f in alloc_libs if f != obj]
            if others:
                how += "; also linked, but behind it: " + ", ".join(others)
            return _m("loader-order", WhichResult(pid, name or os.path.basename(obj), alloc_libs, how + note_later,
                                                  traced, exe, preload))
    # The ELF files could not be read: fall back to the mappings alone.
    real = [f for f in files if allocator_name(f) not in (None, "mallard-tracer")]
    if real:
        how = f"{real[0]} is mapped (the ELF files could not be read to check the loader's order)"
        return _m("mappings", WhichResult(pid, allocator_name(real[0]), real, how, traced, exe, preload))
    libc = [(p, libc_of(p, exe)) for p in files if libc_of(p, exe)]
    if libc:
        p, c_lib = libc[0]
        return _m("mappings", WhichResult(pid, c_lib, [], f"no other allocator library is mapped; malloc comes from "
                                          f"{p}" + (f" ({_C_MALLOC[c_lib]})" if c_lib == "musl" else ""), traced,
                                          exe, preload))
    # No libc mapped: a static binary (or one with another C library); the allocator is inside the executable, and
    # its contents may name it: musl's mallocng (its size-class table) or Mallard (libmallard.a).
    prog = lc.examine(f"/proc/{pid}/exe") if exe else None
    where = exe or "the executable"
    if prog is not None and prog.static and prog.linked:
        return _m("executable", WhichResult(pid, prog.linked, [], f"no C library is mapped: {where} is "
                                            + _static_words(prog), traced, exe, preload))
    hint = _static_hint(pid)
    why = "cannot tell: no C library is mapped, so the program is statically linked and its allocator is built into " \
          f"{where}"
    if prog is not None and prog.static and prog.libc == "musl":
        why = (f"cannot tell: no C library is mapped: {where} is statically linked with musl "
               f"({prog.evidence.split('; ', 1)[-1]}), but musl's malloc is not in it, so another allocator is "
               "linked in")
    if hint:
        why += f"; the executable mentions {hint}"
    return _m("mappings", WhichResult(pid, None, [], why, traced, exe, preload))


def _static_words(prog: lc.Program) -> str:
    """'statically linked with musl, and musl's malloc (mallocng) is linked in: <why>' for a static program."""
    what = ("musl's malloc (mallocng) is linked in" if prog.linked == "musl"
            else "Mallard (libmallard.a) is linked in" if prog.linked == "mallard" else "")
    libc_words = f"with {prog.libc}" if prog.libc else "with no C library"
    return f"statically linked {libc_words}" + (f", and {what}: {prog.linked_why}" if what else "")


@dataclass
class ProgramWhich:
    """`mallard which -- PROG`: the allocator a program file would use if started now (this environment)."""

    program: str  # the file examined (after $PATH and #! lines)
    libc: str | None
    static: bool
    allocator: str | None  # None: cannot tell
    libraries: list[str]  # allocator libraries the loader would load, in its search order
    reason: str
    method: str  # "loader-list" (the loader's --list of the program) or "executable" (a static program's contents)
    interpreter: str | None = None
    ld_preload: str | None = None


def _system_loader(prog: lc.Program) -> tuple[str | None, str]:
    """The loader to list prog's libraries with: its interpreter when that is a system file, or why not."""
    interp = prog.interp or ""
    if lc.system_loader(interp):
        return interp, ""
    if prog.musl and lc.musl_loader():
        return lc.musl_loader(), ""
    return None, f"its interpreter {interp} is not a loader installed in a system folder"


_LIST_LINE = re.compile(r"^\s*(?:(\S+) => )?(/\S*)\s+\(0x[0-9a-f]+\)\s*$")


def which_program(name: str, env: dict | None = None) -> ProgramWhich:
    """Which allocator the program `name` would use: from its ELF file, and the loader's list of the libraries it
    loads (`LOADER --list PROG`, as ldd does) with LD_PRELOAD from env. Raises ProcessError when there is no such
    program."""
    import subprocess

    env = dict(os.environ if env is None else env)
    preload = env.get("LD_PRELOAD") or None
    prog = lc.examine(name)
    if prog.path is None:
        raise ProcessError(f"no program '{name}' (not a file, nor found in $PATH)")
    path = prog.path
    if prog.static:
        if prog.linked:
            return ProgramWhich(path, prog.libc, True, prog.linked, [], f"{path} is " + _static_words(prog),
                                "executable", ld_preload=preload)
        why = f"cannot tell: {path} is {_static_words(prog)} ({prog.evidence.split('; ', 1)[-1]})"
        if prog.libc == "musl":
            why += ", but musl's malloc is not in it, so another allocator is linked in"
        return ProgramWhich(path, prog.libc, True, None, [], why, "executable", ld_preload=preload)
    if prog.interp is None:
        return ProgramWhich(path, None, False, None, [], f"cannot tell: {path} is not an ELF program "
                            f"({prog.evidence})", "loader-list", ld_preload=preload)
    loader, why_not = _system_loader(prog)
    if loader is None:
        return ProgramWhich(path, prog.libc, False, None, [], f"cannot tell: {why_not}", "loader-list", prog.interp,
                            preload)
    how_listed = f"{loader} --list {path}"
    try:
        r = subprocess.run([loader, "--list", path], env=env, capture_output=True, text=True, timeout=30,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return ProgramWhich(path, prog.libc, False, None, [], f"cannot tell: {how_listed} failed ({e})",
                            "loader-list", prog.interp, preload)
    files = [path]
    for line in r.stdout.splitlines():
        m = _LIST_LINE.match(line)
        if m and m.group(2) not in files:
            files.append(m.group(2))
    if r.returncode != 0:
        first = next((x.strip() for x in (r.stderr + r.stdout).splitlines() if "rror" in x), "")
        return ProgramWhich(path, prog.libc, False, None, [], f"the loader cannot start it: {first or how_listed} "
                            f"(exit status {r.returncode}) [{how_listed}]", "loader-list", prog.interp, preload)
    order, _ = search_order(path, files, preload)
    alloc_libs = [f for f in order if allocator_name(f) not in (None, "mallard-tracer")]
    for obj in order:
        e = _elf(obj)
        if allocator_name(obj) == "mallard-tracer" or not (e and e.defines_malloc):
            continue
        if obj == path:
            linked, why = _linked_reason(path)
            return ProgramWhich(path, prog.libc, False, linked, alloc_libs, f"{why} [{how_listed}]", "loader-list",
                                prog.interp, preload)
        c_lib = libc_of(obj, path)
        name_ = allocator_name(obj) or c_lib or os.path.basename(obj)
        preloaded = any(os.path.realpath(obj) == os.path.realpath(x) or os.path.basename(obj) == x
                        for x in _preload_list(preload))
        how = f"{obj} " + (f"({_C_MALLOC[c_lib]}) " if c_lib == "musl" else "") + \
            ("is preloaded (LD_PRELOAD), so its malloc comes first" if preloaded
             else "defines the first malloc in the loader's search order")
        others = [f for f in alloc_libs if f != obj]
        if others:
            how += "; also loaded, but behind it: " + ", ".join(others)
        return ProgramWhich(path, prog.libc, False, name_, alloc_libs, f"{how} [{how_listed}]", "loader-list",
                            prog.interp, preload)
    return ProgramWhich(path, prog.libc, False, None, alloc_libs, f"cannot tell: no library the loader lists defines "
                        f"malloc [{how_listed}]", "loader-list", prog.interp, preload)


def is_kernel_thread(pid: int) -> bool:
    """PF_KTHREAD in the flags of /proc/PID/stat (field 9)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
        return bool(int(fields[6]) & 0x00200000)
    except (OSError, IndexError, ValueError):
        return False


def _why_no_mappings(pid: int) -> str:
    if is_kernel_thread(pid):
        return f"process {pid} is a kernel thread: it has no user memory or allocator"
    if is_zombie(pid):
        return f"process {pid} has exited (a zombie waiting for its parent): no memory left to read"
    return f"process {pid} is exiting: its memory is already gone"


def is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def status_bytes(status: dict, key: str) -> str:
    """A /proc/PID/status figure ('1234 kB') in the units of the rest of the report."""
    parts = status.get(key, "").split()
    if len(parts) == 2 and parts[0].isdigit() and parts[1] == "kB":
        return fmt_bytes(int(parts[0]) * 1024)
    return status.get(key, "?")


def _static_hint(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/exe", "rb") as f:
            data = f.read(64 << 20)
    except OSError:
        return None
    names = [n for n in (b"jemalloc", b"mimalloc", b"tcmalloc", b"snmalloc", b"rpmalloc", b"scudo", b"mallard", b"musl",
                         b"runtime.mallocgc") if n in data]
    if not names:
        return None
    return ", ".join("'" + n.decode() + "'" for n in names)


# ---------------------------------------------------------------- vmem

@dataclass
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    inode: int
    path: str
    fields: dict = field(default_factory=dict)  # smaps fields in KiB (Size, Rss, Pss, Swap, ...)
    vmflags: str = ""
    kind: str = ""

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def rss(self) -> int:
        return self.fields.get("Rss", 0) * 1024

    @property
    def anonymous(self) -> bool:
        return self.inode == 0 and (self.path == "" or self.path.startswith("[anon"))


_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+)\s+(\S{4})\s+([0-9a-f]+)\s+\S+\s+(\d+)\s*(.*)$")


def parse_smaps(text: str) -> list[Mapping]:
    maps: list[Mapping] = []
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            maps.append(Mapping(int(m.group(1), 16), int(m.group(2), 16), m.group(3), int(m.group(4), 16),
                                int(m.group(5)), m.group(6).strip()))
            continue
        if not maps:
            continue
        key, _, val = line.partition(":")
        if key == "VmFlags":
            maps[-1].vmflags = val.strip()
        else:
            parts = val.split()
            if parts and parts[0].isdigit():
                maps[-1].fields[key] = int(parts[0])
    return maps


def _thread_stack_pointers(pid: int) -> list[int]:
    """Stack pointers of the threads that are blocked in a system call (from /proc/PID/task/TID/syscall)."""
    sps = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return sps
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                parts = f.read().split()
        except OSError:
            continue
        if len(parts) >= 3 and parts[0] not in ("running", "-1"):
            try:
                sps.append(int(parts[-2], 16))
            except ValueError:
                pass
    return sps


ALLOCATOR_ANON_NAMES = ("mallard", "jemalloc", "mimalloc", "tcmalloc", "malloc", "arena", "heap")

KINDS = [
    ("main-heap", "main heap ([heap], brk)"),
    ("arena-heap", "glibc arena heaps (accessible part)"),
    ("allocator", "allocator regions"),
    ("reserved", "reserved, inaccessible (PROT_NONE)"),
    ("thread-stack", "thread stacks"),
    ("main-stack", "main thread stack"),
    ("library", "executable and libraries"),
    ("file", "other mapped files"),
    ("anon", "other anonymous memory"),
    ("kernel", "kernel ([vdso], [vvar], ...)"),
]


@dataclass
class ArenaHeap:
    start: int
    accessible: int  # bytes readable/writable
    reserved: int  # bytes PROT_NONE
    rss: int


@dataclass
class VmemReport:
    pid: int
    status: dict
    mappings: list[Mapping]
    totals: dict  # kind -> {"count", "virt", "rss", "pss", "swap"}
    arenas: list[ArenaHeap]
    allocator: WhichResult | None
    threads: int


def classify(maps: list[Mapping], stack_pointers: list[int], exe: str = "", page: int = 4096,
             glibc: bool = True, threads: int = 0) -> list[ArenaHeap]:
    """Sets each mapping's kind; returns the glibc arena heaps found (none unless glibc's malloc is in use:
    other allocators, e.g. mimalloc, make the same shape of partly committed aligned reservations)."""
    arenas: list[ArenaHeap] = []
    for m in maps:
        p = m.path
        if p == "[heap]":
            m.kind = "main-heap"
        elif p == "[stack]":
            m.kind = "main-stack"
        elif p.startswith("[stack:"):
            m.kind = "thread-stack"
        elif p in ("[vdso]", "[vvar]", "[vsyscall]", "[vvar_vclock]", "[uprobes]") or (p.startswith("[") and not p.startswith("[anon")):
            m.kind = "kernel"
        elif p.startswith("[anon:"):
            label = p[6:].lower()
            m.kind = "allocator" if any(n in label for n in ALLOCATOR_ANON_NAMES) else "anon"
            if "stack" in label:
                m.kind = "thread-stack"
        elif m.inode != 0 or p.startswith("/"):
            base = os.path.basename(p.split(" (deleted)")[0])
            m.kind = "library" if (".so" in base or p == exe) else "file"
        elif m.perms.startswith("---"):
            m.kind = "reserved"
        else:
            m.kind = "anon"
    # glibc arena heaps: an anonymous mapping at a 64 MiB boundary, accessible part first, PROT_NONE rest, ending at +64 MiB.
    for i, m in enumerate(maps):
        if m.kind not in ("anon", "reserved") or m.start % ARENA_HEAP != 0:
            continue
        parts = [m]
        j = i + 1
        while j < len(maps) and maps[j].start == parts[-1].end and maps[j].kind in ("anon", "reserved") \
                and maps[j].end <= m.start + ARENA_HEAP:
            parts.append(maps[j])
            j += 1
        if parts[-1].end != m.start + ARENA_HEAP or not parts[0].perms.startswith("rw") or not parts[-1].perms.startswith("---"):
            continue
        acc = sum(x.size for x in parts if not x.perms.startswith("---"))
        res = sum(x.size for x in parts if x.perms.startswith("---"))
        if acc == 0:
            continue
        for x in parts:
            if not glibc:
                x.kind = "allocator" if not x.perms.startswith("---") else "reserved"
            else:
                x.kind = "arena-heap" if not x.perms.startswith("---") else "arena-reserved"
        if not glibc:
            continue
        arenas.append(ArenaHeap(m.start, acc, res, sum(x.rss for x in parts)))
    # Thread stacks: an anonymous rw mapping holding a thread's stack pointer; for threads whose stack pointer is
    # unknown (running, not in a system call), the largest rw mappings right above a small guard, no more of them
    # than such threads (hardened allocators also put guard pages below their regions).
    def guard_below(i: int) -> Mapping | None:
        prev = maps[i - 1] if i > 0 else None
        if prev is not None and prev.end == maps[i].start and prev.kind == "reserved" and prev.size <= 64 * page:
            return prev
        return None

    found = 0
    candidates = []
    for i, m in enumerate(maps):
        if m.kind != "anon" or not m.perms.startswith("rw"):
            continue
        if any(m.start <= sp < m.end for sp in stack_pointers):
            m.kind = "thread-stack"
            found += 1
            g = guard_below(i)
            if g is not None:
                g.kind = "stack-guard"
        elif guard_below(i) is not None and m.size >= 64 * 1024:
            candidates.append(i)
    unknown = max(0, threads - 1 - found) if threads else len(candidates)
    for i in sorted(candidates, key=lambda i: -maps[i].size)[:unknown]:
        maps[i].kind = "thread-stack"
        guard_below(i).kind = "stack-guard"
    # Large anonymous rw regions on 2 MiB boundaries are almost always an allocator's (jemalloc extents, mimalloc
    # segments, tcmalloc spans): small mmaps of programs are page-aligned only.
    for m in maps:
        if m.kind == "anon" and m.start % (2 << 20) == 0 and m.size >= (2 << 20) and "ht" not in m.vmflags.split():
            m.kind = "allocator"
    return arenas


# Where each detailed kind is summed.
KIND_GROUP = {"arena-reserved": "reserved", "stack-guard": "thread-stack"}


def vmem(pid: int) -> VmemReport:
    smaps = _read(pid, "smaps")
    status_text = _read(pid, "status")
    status = {}
    for line in status_text.splitlines():
        k, _, v = line.partition(":")
        status[k.strip()] = v.strip()
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    maps = parse_smaps(smaps)
    if not maps:
        raise ProcessError(_why_no_mappings(pid))
    try:
        w = which(pid)
    except ProcessError:
        w = None
    uses_glibc = w is None or w.allocator in (None, "glibc", "glibc-malloc-debug")
    threads = int(status.get("Threads", "0") or 0)
    arenas = classify(maps, _thread_stack_pointers(pid), exe, os.sysconf("SC_PAGE_SIZE"), uses_glibc, threads)
    totals: dict = {k: {"count": 0, "virt": 0, "rss": 0, "pss": 0, "swap": 0} for k, _ in KINDS}
    for m in maps:
        t = totals[KIND_GROUP.get(m.kind, m.kind)]
        t["count"] += 1
        t["virt"] += m.size
        t["rss"] += m.rss
        t["pss"] += m.fields.get("Pss", 0) * 1024
        t["swap"] += m.fields.get("Swap", 0) * 1024
    return VmemReport(pid, status, maps, totals, arenas, w, threads)


def explain_arenas(rep: VmemReport) -> list[str]:
    """Plain-words explanation of glibc's per-thread arena reservations, with remedies; empty when there are none."""
    if not rep.arenas:
        return []
    n = len(rep.arenas)
    acc = sum(a.accessible for a in rep.arenas)
    res = sum(a.reserved for a in rep.arenas)
    rss = sum(a.rss for a in rep.arenas)
    cores = os.cpu_count() or 1
    return [
        f"glibc per-thread arenas: {n} arena heap{'s' if n != 1 else ''} reserve {fmt_bytes(acc + res)} of address space "
        f"({fmt_bytes(ARENA_HEAP)} each, aligned to 64 MiB), of which only {fmt_bytes(acc)} is accessible and "
        f"{fmt_bytes(rss)} is resident.",
        "Why: glibc gives a thread that calls malloc its own arena (up to 8 per core, here "
        f"{8 * cores}) to avoid lock contention, and each arena's heap is a 64 MiB reservation that grows in place. "
        "Touching a few bytes in a thread costs 64 MiB of VIRT but almost no RSS.",
        "This is mostly harmless (reserved address space is not memory), but it inflates VIRT, trips address-space "
        "limits (ulimit -v, some container monitors) and can fragment memory across arenas.",
        "Remedies: limit the arenas with MALLOC_ARENA_MAX=2 (or GLIBC_TUNABLES=glibc.malloc.arena_max=2); or use an "
        "allocator that reserves little per thread: `mallard run -a mallard -- CMD` (or jemalloc, mimalloc, tcmalloc).",
    ]


def fmt_bytes(n: float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
