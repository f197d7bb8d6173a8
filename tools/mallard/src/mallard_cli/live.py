"""Statistics of a running process under Mallard, read from its memory: where its Mallard is (the object that serves its
malloc), the address of that object's root (the symbol mallard_live_root, read from the object's file as data), and
the report, written by mallard_live_stats of THIS command's own Mallard library (found as allocators.mallard_variants
finds it, never a file the target names): the root describes its own layout, and the reader validates all it reads.
Nothing of the target's files is loaded, mapped or run here. See docs/STATS.md."""
from __future__ import annotations

import ctypes
import errno
import json
import os
import pwd
from dataclasses import dataclass

from . import gotslot as gs
from . import procinfo as pi

ROOT = "mallard_live_root"
READER = "mallard_live_stats"
REASON = "mallard_live_reason"  # why the last root was refused: one line
ROOT_HEADER = 48  # bytes of the root's header (docs/STATS.md)


class LiveError(Exception):
    """The statistics cannot be read; the message says why in words, `kind` picks the exit code."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind  # "pid" (no such process, not allowed) or "allocator" (not under Mallard, other build)


@dataclass
class Target:
    pid: int
    obj: str  # the object that carries the root: a libmallard*.so or a statically linked executable
    root: int  # run-time address of mallard_live_root in the process
    readers: list  # this command's own Mallard libraries able to read it (never a file of the target)


def _uid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_access(pid: int) -> None:
    """Only the process's own user or root may read its counters (the kernel enforces it too): say so first."""
    uid = _uid_of(pid)
    me = os.geteuid()
    if uid is not None and me != 0 and uid != me:
        raise LiveError(f"process {pid} belongs to {_user(uid)}: only that user or root can read its statistics "
                        f"(you are {_user(me)})", "pid")


def _symbol(path: str, name: str) -> tuple[int | None, int]:
    """The value of a defined symbol in the dynamic symbol table, else the full one (a static executable), and the
    file's first PT_LOAD address (gotslot.first_load_vaddr; 0 when unknown), read in one opening of the file."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            base = gs.first_load_vaddr(elf) or 0
            for tab in (".dynsym", ".symtab"):
                sec = elf.get_section_by_name(tab)
                for s in (sec.get_symbol_by_name(name) or []) if sec is not None else []:
                    if s["st_shndx"] != "SHN_UNDEF" and s["st_value"]:
                        return s["st_value"], base
            return None, base
    except Exception:  # noqa: BLE001 - a crafted or truncated file: no symbol, never a traceback
        return None, 0


def _file_of(pid: int, maps_text: str, obj: str) -> str:
    """A path to the very file mapped as `obj`: obj itself while it is unchanged, else /proc/PID/map_files/RANGE."""
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].strip().removesuffix(" (deleted)") == obj and int(parts[2], 16) == 0:
            inode = int(parts[4])
            try:
                if os.stat(obj).st_ino == inode and not parts[5].strip().endswith(" (deleted)"):
                    return obj
            except OSError:
                pass
            alt = f"/proc/{pid}/map_files/{parts[0]}"
            if os.access(alt, os.R_OK):
                return alt
            raise LiveError(f"{obj} was replaced or removed since process {pid} loaded it, and the copy it still maps "
                            f"({alt}) cannot be opened here: restart the process, or run as root", "allocator")
    return obj


def locate(pid: int) -> Target:
    """The root of the process's Mallard, or a LiveError naming the allocator it uses instead."""
    try:
        w = pi.which(pid)
        maps_text = pi._read(pid, "maps")
    except pi.ProcessError as e:
        raise LiveError(str(e), "pid") from None
    if w.unreadable:
        raise LiveError(w.reason, "pid")
    exe = w.exe
    if w.slot and w.slot.get("target") and pi.allocator_name(w.slot["target"]) != "mallard-tracer":
        obj = w.slot["target"]
    elif w.allocator is None and "defines malloc itself" in w.reason:
        obj = exe
    else:  # decided without the slot (or through the tracer): the first allocator library in the loader's order
        obj = next((f for f in w.libraries if pi.allocator_name(f) != "mallard-tracer"), None)
    name = w.allocator or (pi.allocator_name(obj) if obj else None)
    if obj is None:
        raise LiveError(f"process {pid}: cannot tell which allocator it uses ({w.reason}); no Mallard found",
                        "allocator")
    if name in ("glibc", "glibc-malloc-debug"):
        raise LiveError(f"process {pid} uses glibc malloc ({obj}), not Mallard", "allocator")
    # The file is only read as data (its symbol table), the very copy the process maps when it was replaced since.
    sym, min_vaddr = _symbol(_file_of(pid, maps_text, obj) if obj != exe else obj, ROOT)
    if sym is None:
        if obj == exe:
            raise LiveError(f"process {pid} uses an allocator linked into its executable {exe}, not Mallard (or a "
                            f"Mallard without {ROOT}, or a stripped executable)", "allocator")
        if (name or "").startswith("mallard"):
            raise LiveError(f"process {pid} uses {obj}, a Mallard built without live statistics ({ROOT} missing): "
                            "an older version", "allocator")
        raise LiveError(f"process {pid} uses {name} ({obj}), not Mallard", "allocator")
    maps = gs.parse_maps(maps_text)
    bias = gs.load_bias(maps, obj, min_vaddr)
    if bias is None:
        raise LiveError(f"cannot find where {obj} is mapped in process {pid}", "pid")
    root = bias + sym
    # The root must lie in the object's own mappings (the reader then validates everything it points to).
    if not any(m.path.removesuffix(" (deleted)") == obj and m.start <= root and root + ROOT_HEADER <= m.end
               for m in maps):
        raise LiveError(f"process {pid}: refused to read {obj}: its {ROOT} ({root:#x}) lies outside the object's "
                        "mappings", "allocator")
    return Target(pid, obj, root, own_readers())


def own_readers() -> list[str]:
    """This command's own Mallard libraries that hold the reader (never a path taken from the target)."""
    from . import allocators as al

    readers = [path for _, path in al.mallard_variants()
               if path and _symbol(path, READER)[0] and _symbol(path, REASON)[0]]
    if not readers:
        raise LiveError("reading a process's statistics needs this command's own libmallard.so (with "
                        f"{READER}), and none is found: build it, or set MALLARD_BUILD_DIR or MALLARD_LIBDIR",
                        "allocator")
    return readers[:1]


_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)


def _call(reader: str, pid: int, root: int, opts: str) -> tuple[int, str]:
    """mallard_live_stats of our own reader library: (errno or 0, the report, or the reason of a refusal)."""
    try:
        lib = ctypes.CDLL(reader)
        fn = getattr(lib, READER)
        why = getattr(lib, REASON)
    except (OSError, AttributeError) as e:
        return errno.ENOEXEC, str(e)
    fn.argtypes = [ctypes.c_int, ctypes.c_size_t, _CB, ctypes.c_void_p, ctypes.c_char_p]
    fn.restype = ctypes.c_int
    why.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    why.restype = None
    chunks: list[bytes] = []
    cb = _CB(lambda _o, s: chunks.append(s))
    rc = fn(pid, root, cb, None, opts.encode())
    if rc:
        buf = ctypes.create_string_buffer(256)
        why(buf, len(buf))
        return rc, buf.value.decode("ascii", "replace")
    return rc, b"".join(chunks).decode("utf-8", "surrogateescape")


def _one_line(text: str) -> str:
    return " ".join("".join(c if c.isprintable() else "?" for c in text).split())


def report(t: Target, as_json: bool = False, opts: str = "") -> str:
    """The report of mallard_stats_print for the process (opts as its: J json, a no arenas, b no classes)."""
    opts = opts + ("J" if as_json else "")
    rc, detail = _call(t.readers[0], t.pid, t.root, opts)
    if rc == 0:
        return detail
    pid = t.pid
    if rc == errno.ESRCH:
        raise LiveError(f"process {pid} has exited", "pid")
    if rc in (errno.EPERM, errno.EACCES):
        raise LiveError(f"not allowed to read the memory of process {pid}: only its user (when ptrace is allowed: "
                        "kernel.yama.ptrace_scope, a non-dumpable process) or root can", "pid")
    if rc in (errno.EPROTO, errno.EFAULT):
        raise LiveError(f"process {pid}: refused to read {t.obj}: {_one_line(detail) or 'not a valid Mallard root'} "
                        f"(live root at {t.root:#x}, read by {t.readers[0]})", "allocator")
    if rc == errno.EAGAIN:
        raise LiveError(f"Mallard is not initialised yet in process {pid}: try again", "pid")
    if rc == errno.ENOEXEC:
        raise LiveError(f"cannot load the reader {t.readers[0]}: {_one_line(detail)}", "allocator")
    raise LiveError(f"cannot read the statistics of process {pid}: {os.strerror(rc)}", "pid")


def snapshot(t: Target) -> dict:
    """The JSON report as a dict (its "mallard" object), with the process's RSS from /proc/PID/status added."""
    data = json.loads(report(t, as_json=True))["mallard"]
    rss = None
    try:
        with open(f"/proc/{t.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
    except OSError:
        pass
    data["rss"] = rss
    return data
