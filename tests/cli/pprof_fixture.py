"""Test-only writer of pprof profile.proto files (written from the .proto's field numbers, independently of the
reader under test), and the ELF facts a synthetic profile needs, taken from binutils (readelf, nm)."""
from __future__ import annotations

import gzip
import re
import subprocess
from dataclasses import dataclass, field

HEAP_TYPES = [("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"),
              ("inuse_space", "bytes")]


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 fields: two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def key(num: int, wire: int) -> bytes:
    return varint(num << 3 | wire)


def f_int(num: int, v: int) -> bytes:
    return key(num, 0) + varint(v) if v else b""


def f_bytes(num: int, b: bytes) -> bytes:
    return key(num, 2) + varint(len(b)) + b


def f_ints(num: int, vals: list[int], packed: bool) -> bytes:
    if packed:
        return f_bytes(num, b"".join(varint(v) for v in vals)) if vals else b""
    return b"".join(key(num, 0) + varint(v) for v in vals)


@dataclass
class ProfileBuilder:
    """Builds a heap profile: mappings, locations (with optional function lines) and samples with 4 values."""
    types: list[tuple[str, str]] = field(default_factory=lambda: list(HEAP_TYPES))
    period: int = 524288
    packed: bool = True
    strings: list[str] = field(default_factory=lambda: [""])
    mappings: list[bytes] = field(default_factory=list)
    locations: list[bytes] = field(default_factory=list)
    functions: dict[tuple[str, str], int] = field(default_factory=dict)
    function_msgs: list[bytes] = field(default_factory=list)
    samples: list[bytes] = field(default_factory=list)
    drop_frames: str = ""

    def s(self, text: str) -> int:
        if text not in self.strings:
            self.strings.append(text)
        return self.strings.index(text)

    def mapping(self, start: int, limit: int, offset: int, filename: str, build_id: str = "") -> int:
        mid = len(self.mappings) + 1
        self.mappings.append(f_int(1, mid) + f_int(2, start) + f_int(3, limit) + f_int(4, offset)
                             + f_int(5, self.s(filename)) + f_int(6, self.s(build_id)))
        return mid

    def function(self, name: str, filename: str = "") -> int:
        k = (name, filename)
        if k not in self.functions:
            fid = len(self.function_msgs) + 1
            self.functions[k] = fid
            self.function_msgs.append(f_int(1, fid) + f_int(2, self.s(name)) + f_int(3, self.s(name))
                                      + f_int(4, self.s(filename)))
        return self.functions[k]

    def location(self, address: int, mapping_id: int = 0, names: list[str] = ()) -> int:
        lid = len(self.locations) + 1
        lines = b"".join(f_bytes(4, f_int(1, self.function(n))) for n in names)
        self.locations.append(f_int(1, lid) + f_int(2, mapping_id) + f_int(3, address) + lines)
        return lid

    def sample(self, location_ids: list[int], values: list[int]) -> None:
        assert len(values) == len(self.types)
        self.samples.append(f_ints(1, location_ids, self.packed) + f_ints(2, values, self.packed))

    def heap_sample(self, location_ids: list[int], inuse_bytes: int, inuse_n: int, alloc_bytes: int,
                    alloc_n: int) -> None:
        self.sample(location_ids, [alloc_n, alloc_bytes, inuse_n, inuse_bytes])

    def encode(self, default: str = "inuse_space") -> bytes:
        body = b"".join(f_bytes(1, f_int(1, self.s(t)) + f_int(2, self.s(u))) for t, u in self.types)
        body += b"".join(f_bytes(2, x) for x in self.samples)
        body += b"".join(f_bytes(3, x) for x in self.mappings)
        body += b"".join(f_bytes(4, x) for x in self.locations)
        body += b"".join(f_bytes(5, x) for x in self.function_msgs)
        drop = f_int(7, self.s(self.drop_frames)) if self.drop_frames else b""
        tail = f_bytes(11, f_int(1, self.s("space")) + f_int(2, self.s("bytes"))) + f_int(12, self.period)
        tail += f_int(14, self.s(default)) if default else b""
        tail += drop + f_int(9, 1_700_000_000_000_000_000)
        strings = b"".join(f_bytes(6, x.encode()) for x in self.strings)
        return body + strings + tail

    def gz(self, default: str = "inuse_space") -> bytes:
        return gzip.compress(self.encode(default))


@dataclass
class Segment:
    offset: int
    vaddr: int
    filesz: int
    memsz: int


def elf_facts(path: str) -> tuple[list[Segment], str, str]:
    """PT_LOAD segments, build ID and ELF type ('EXEC' or 'DYN') of a file, read with binutils' readelf."""
    out = subprocess.run(["readelf", "-lW", "-n", "-h", path], capture_output=True, text=True, check=True).stdout
    segs = [Segment(int(m[0], 16), int(m[1], 16), int(m[2], 16), int(m[3], 16)) for m in
            re.findall(r"^\s*LOAD\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+0x[0-9a-f]+\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)", out,
                       re.M)]
    bid = re.search(r"Build ID:\s*([0-9a-f]+)", out)
    typ = re.search(r"Type:\s+(\w+)", out)
    return segs, bid.group(1) if bid else "", typ.group(1) if typ else ""


def symbols(path: str, dynamic: bool = False) -> dict[str, int]:
    """Function symbols of a file (nm, or nm -D): name -> ELF address."""
    out = subprocess.run(["nm", "-D", path] if dynamic else ["nm", path], capture_output=True, text=True,
                         check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtWi":
            syms.setdefault(parts[2].split("@")[0], int(parts[0], 16))
    return syms


class Loaded:
    """An ELF file as the loader would map it at base (0 for a non-PIE executable): one mapping per PT_LOAD
    segment, like /proc/PID/maps; addr(symbol, k) is a runtime address k bytes into that function."""

    def __init__(self, b: ProfileBuilder, path: str, base: int, dynamic_symbols: bool = False,
                 filename: str | None = None, build_id: str | None = None):
        self.path, self.base = path, base
        segs, bid, typ = elf_facts(path)
        if typ == "EXEC":
            self.base = base = 0
        self.syms = symbols(path, dynamic_symbols)
        self.segments = segs
        self.mids: list[tuple[int, int, int]] = []  # (start, limit, mapping id)
        for sg in segs:
            start = base + (sg.vaddr & ~0xFFF)
            limit = base + ((sg.vaddr + sg.memsz + 0xFFF) & ~0xFFF)
            mid = b.mapping(start, limit, sg.offset & ~0xFFF, filename or path, bid if build_id is None else build_id)
            self.mids.append((start, limit, mid))
        self.b = b

    def addr(self, name: str, k: int = 4) -> int:
        return self.base + self.syms[name] + k

    def loc(self, name: str, k: int = 4, names: list[str] = ()) -> int:
        a = self.addr(name, k)
        mid = next(m for s, l, m in self.mids if s <= a < l)
        return self.b.location(a, mid, names)
