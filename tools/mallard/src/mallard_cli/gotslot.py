"""Which library a running process really resolved `malloc` to: the address held in the GOT slot (the dynamic
relocation R_*_JUMP_SLOT or R_*_GLOB_DAT) for `malloc` of one of its objects, read from /proc/PID/mem and looked up
in /proc/PID/maps. This does not depend on /proc/PID/environ, which many daemons overwrite (setproctitle)."""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field


class SlotError(Exception):
    """The slot could not be read; the message says why (in words for the report)."""


@dataclass
class MapRange:
    start: int
    end: int
    offset: int
    path: str


@dataclass
class Slot:
    obj: str  # the object whose relocation was read
    symbol: str
    kind: str  # JUMP_SLOT or GLOB_DAT
    address: int  # the slot's run-time address
    value: int  # the address it holds
    target: str | None  # the mapped file that address falls in (None: anonymous memory or unmapped)
    unbound: list = field(default_factory=list)  # objects tried before whose slot was not bound yet (lazy binding)


def parse_maps(maps_text: str) -> list[MapRange]:
    out = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        lo, _, hi = parts[0].partition("-")
        try:
            path = parts[5].strip() if len(parts) == 6 else ""
            out.append(MapRange(int(lo, 16), int(hi, 16), int(parts[2], 16), path))
        except ValueError:
            continue
    return out


def _reloc_types(machine: str) -> dict[int, str]:
    from elftools.elf import enums

    table = {"EM_X86_64": ("ENUM_RELOC_TYPE_x64", "R_X86_64_"), "EM_AARCH64": ("ENUM_RELOC_TYPE_AARCH64", "R_AARCH64_"),
             "EM_386": ("ENUM_RELOC_TYPE_i386", "R_386_"), "EM_RISCV": ("ENUM_RELOC_TYPE_RISCV", "R_RISCV_")}
    if machine not in table:
        return {}
    name, prefix = table[machine]
    enum = getattr(enums, name, {})
    return {enum[prefix + k]: k for k in ("JUMP_SLOT", "GLOB_DAT") if prefix + k in enum}


@dataclass
class _Relocs:
    slots: dict  # symbol -> (kind, r_offset), JUMP_SLOT preferred
    min_vaddr: int  # of the first PT_LOAD, page aligned: what the first mapping at offset 0 corresponds to
    word: int
    little: bool


_cache: dict[str, _Relocs | None] = {}


def relocations(path: str, symbols=("malloc", "free")) -> _Relocs | None:
    """The JUMP_SLOT/GLOB_DAT relocations of `symbols` in an ELF file's dynamic relocation sections."""
    key = path + "\0" + ",".join(symbols)
    if key in _cache:
        return _cache[key]
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection

    info = None
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            types = _reloc_types(elf["e_machine"])
            base = first_load_vaddr(elf)
            if types and base is not None:
                slots: dict = {}
                for sec in elf.iter_sections():
                    if not isinstance(sec, RelocationSection) or sec["sh_link"] == 0:
                        continue
                    symtab = elf.get_section(sec["sh_link"])
                    if symtab is None or symtab.name != ".dynsym":
                        continue
                    for rel in sec.iter_relocations():
                        kind = types.get(rel["r_info_type"])
                        if kind is None or rel["r_info_sym"] == 0:
                            continue
                        name = symtab.get_symbol(rel["r_info_sym"]).name
                        if name in symbols and (name not in slots or kind == "JUMP_SLOT"):
                            slots[name] = (kind, rel["r_offset"])
                info = _Relocs(slots, base, elf.elfclass // 8, elf.little_endian)
    except (OSError, ELFError, ValueError, KeyError, IndexError, AttributeError, TypeError):
        info = None
    _cache[key] = info
    return info


def first_load_vaddr(elf) -> int | None:
    """The page-aligned address of an ELF file's first PT_LOAD (an elftools ELFFile): what the file's first mapping
    at offset 0 corresponds to (load_bias). None without PT_LOAD."""
    loads = [seg for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"]
    return loads[0]["p_vaddr"] & ~(max(loads[0]["p_align"], 1) - 1) if loads else None


def load_bias(maps: list[MapRange], path: str, min_vaddr: int) -> int | None:
    """Load bias of a mapped file: the start of its first mapping at file offset 0, less the first PT_LOAD's address
    (0 for a non-PIE executable, the load base for a PIE executable or a shared library)."""
    first = next((m for m in maps if m.path == path and m.offset == 0), None)
    return None if first is None else first.start - min_vaddr


def _denied(path: str) -> str:
    return f"cannot read {path}: permission denied (only the process's owner, with ptrace allowed, or root can)"


def read_word(pid: int, address: int, word: int = 8, little: bool = True) -> int:
    path = f"/proc/{pid}/mem"
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise SlotError(f"process {pid} has exited") from None
    except PermissionError:
        raise SlotError(_denied(path)) from None
    except OSError as e:
        raise SlotError(f"cannot open {path}: {e.strerror}") from None
    try:
        if not 0 <= address <= (1 << 63) - word:  # beyond what pread can take: no process memory lies there
            raise SlotError(f"cannot read {path} at {address:#x}: not an address of the process")
        data = os.pread(fd, word, address)
    except ProcessLookupError:
        raise SlotError(f"process {pid} exited while being read") from None
    except PermissionError:
        raise SlotError(_denied(path)) from None
    except OSError as e:
        raise SlotError(f"cannot read {path} at {address:#x}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) != word:
        raise SlotError(f"cannot read {path} at {address:#x}: the process's memory is gone")
    return struct.unpack(("<" if little else ">") + ("Q" if word == 8 else "I"), data)[0]


def target_of(maps: list[MapRange], value: int) -> str | None:
    m = next((m for m in maps if m.start <= value < m.end), None)
    return m.path if m is not None and m.path.startswith("/") else None


def read_slot(pid: int, maps: list[MapRange], obj: str, symbol: str = "malloc") -> Slot | None:
    """The slot of `symbol` in the mapped object `obj` and where it points; None when `obj` has no such relocation."""
    r = relocations(obj)
    if r is None or symbol not in r.slots:
        return None
    bias = load_bias(maps, obj, r.min_vaddr)
    if bias is None:
        return None
    kind, off = r.slots[symbol]
    addr = bias + off
    # The file's relocations are data from the target's side: the slot must lie in one of the object's own mappings
    # (a crafted r_offset may point anywhere, even past what /proc/PID/mem can address).
    if not any(m.path == obj and m.start <= addr and addr + r.word <= m.end for m in maps):
        raise SlotError(f"the {symbol} relocation of {obj} points to {addr:#x}, outside the object's mappings "
                        "(the file does not match what is mapped, or it was crafted)")
    value = read_word(pid, addr, r.word, r.little)
    return Slot(obj, symbol, kind, addr, value, target_of(maps, value))
