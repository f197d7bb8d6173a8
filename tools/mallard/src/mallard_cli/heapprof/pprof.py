"""Reader of pprof's profile.proto (gzip-compressed or plain): a small hand-written protobuf decoder of the fields used.

Field numbers follow github.com/google/pprof/proto/profile.proto. Only what `mallard heap` needs is kept; unknown
fields are skipped as the protobuf wire format allows, so newer writers stay readable.
"""
from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, field


class ProfileError(ValueError):
    """A file that is not a readable pprof profile; the message says why, in one line."""


# Protobuf wire types.
VARINT, I64, LEN, I32 = 0, 1, 2, 5


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ProfileError(f"malformed protobuf: varint runs past the end of its message (byte {pos})")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProfileError(f"malformed protobuf: varint longer than 10 bytes (byte {pos})")


def _fields(buf: bytes, start: int = 0, end: int | None = None):
    """Yields (field number, wire type, value) of one message; value is an int, or (start, end) for LEN fields."""
    pos, end = start, len(buf) if end is None else end
    while pos < end:
        key, pos = _varint(buf, pos, end)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise ProfileError(f"malformed protobuf: field number 0 (byte {pos})")
        if wt == VARINT:
            v, pos = _varint(buf, pos, end)
            yield num, wt, v
        elif wt == I64:
            if pos + 8 > end:
                raise ProfileError(f"malformed protobuf: 8-byte field runs past its message (byte {pos})")
            yield num, wt, int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wt == I32:
            if pos + 4 > end:
                raise ProfileError(f"malformed protobuf: 4-byte field runs past its message (byte {pos})")
            yield num, wt, int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        elif wt == LEN:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise ProfileError(f"malformed protobuf: field {num} of {n} bytes runs past its message (byte {pos})")
            yield num, wt, (pos, pos + n)
            pos += n
        else:
            raise ProfileError(f"malformed protobuf: wire type {wt} of field {num} is not supported (byte {pos})")


def _signed(v: int) -> int:
    """int64 fields are encoded as 64-bit two's complement varints."""
    return v - (1 << 64) if v >= 1 << 63 else v


def _ints(buf: bytes, wt: int, v, signed: bool = False) -> list[int]:
    """A repeated integer field: one value, or a packed run of varints."""
    if wt == VARINT:
        vals = [v]
    elif wt == LEN:
        vals, pos = [], v[0]
        while pos < v[1]:
            x, pos = _varint(buf, pos, v[1])
            vals.append(x)
    else:
        raise ProfileError(f"malformed profile: integer field with wire type {wt}")
    return [_signed(x) for x in vals] if signed else vals


@dataclass
class ValueType:
    type: str
    unit: str


@dataclass
class Line:
    function_id: int
    line: int


@dataclass
class Location:
    id: int
    mapping_id: int
    address: int
    lines: list[Line] = field(default_factory=list)  # innermost (inlined) function first, its caller last


@dataclass
class Function:
    id: int
    name: str
    system_name: str
    filename: str


@dataclass
class Mapping:
    id: int
    start: int
    limit: int
    offset: int
    filename: str
    build_id: str


@dataclass
class Sample:
    location_ids: list[int]  # leaf first
    values: list[int]


@dataclass
class Profile:
    sample_types: list[ValueType]
    samples: list[Sample]
    mappings: dict[int, Mapping]
    locations: dict[int, Location]
    functions: dict[int, Function]
    default_sample_type: str
    period_type: ValueType | None
    period: int
    time_nanos: int
    drop_frames: str
    comments: list[str]

    def index(self, type_name: str) -> int:
        """Index of the sample type named type_name in every sample's values."""
        for i, st in enumerate(self.sample_types):
            if st.type == type_name:
                return i
        have = ", ".join(f"{s.type}/{s.unit}" for s in self.sample_types) or "none"
        raise ProfileError(f"the profile has no '{type_name}' values (its sample types: {have}); is it a heap "
                           "profile?")

    def total(self, type_name: str) -> int:
        i = self.index(type_name)
        return sum(s.values[i] for s in self.samples)


def decompress(data: bytes) -> bytes:
    """The profile's bytes: gunzipped when the file is gzip (magic 1f 8b), as they are otherwise."""
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except EOFError:
        raise ProfileError("truncated gzip data: the file was cut short (was it still being written?)") from None
    except (OSError, zlib.error) as e:
        raise ProfileError(f"corrupt gzip data: {e}") from None


def parse(data: bytes) -> Profile:
    """Decodes a profile from its (possibly gzip-compressed) bytes; raises ProfileError on anything malformed."""
    try:
        return _parse(decompress(data))
    except ProfileError as e:
        msg = str(e)
        raise ProfileError(msg if msg.startswith(("not a pprof", "truncated", "corrupt", "empty")) else
                           f"not a pprof profile: {msg}") from None


def _parse(buf: bytes) -> Profile:
    if not buf:
        raise ProfileError("empty file: not a pprof profile")
    strings: list[str] = []
    raw_types, raw_samples, raw_maps, raw_locs, raw_funcs = [], [], [], [], []
    ints: dict[int, int] = {}
    period_type = None
    comment_idx: list[int] = []
    drop_idx = 0
    for num, wt, v in _fields(buf):
        if num in (1, 2, 3, 4, 5, 6, 11) and wt != LEN:
            raise ProfileError(f"not a pprof profile: field {num} has wire type {wt}, expected a message")
        if num == 1:
            raw_types.append(v)
        elif num == 2:
            raw_samples.append(v)
        elif num == 3:
            raw_maps.append(v)
        elif num == 4:
            raw_locs.append(v)
        elif num == 5:
            raw_funcs.append(v)
        elif num == 6:
            try:
                strings.append(buf[v[0]:v[1]].decode("utf-8"))
            except UnicodeDecodeError:
                strings.append(buf[v[0]:v[1]].decode("utf-8", "backslashreplace"))
        elif num == 7 and wt == VARINT:
            drop_idx = v
        elif num == 11:
            period_type = v
        elif num == 13:
            comment_idx += _ints(buf, wt, v)
        elif num in (9, 10, 12, 14) and wt == VARINT:
            ints[num] = _signed(v)
    if not strings or strings[0] != "":
        raise ProfileError("not a pprof profile: its string table does not start with the empty string")

    def s(i: int) -> str:
        if not 0 <= i < len(strings):
            raise ProfileError(f"malformed profile: string index {i} outside the string table ({len(strings)} entries)")
        return strings[i]

    def value_type(span) -> ValueType:
        t = u = 0
        for n, w, x in _fields(buf, *span):
            if n == 1 and w == VARINT:
                t = x
            elif n == 2 and w == VARINT:
                u = x
        return ValueType(s(t), s(u))

    types = [value_type(sp) for sp in raw_types]
    if not types:
        raise ProfileError("not a pprof profile: it declares no sample types")
    samples = []
    for sp in raw_samples:
        locs: list[int] = []
        vals: list[int] = []
        for n, w, x in _fields(buf, *sp):
            if n == 1:
                locs += _ints(buf, w, x)
            elif n == 2:
                vals += _ints(buf, w, x, signed=True)
        if len(vals) != len(types):
            raise ProfileError(f"malformed profile: a sample has {len(vals)} values for {len(types)} sample types")
        samples.append(Sample(locs, vals))
    mappings = {}
    for sp in raw_maps:
        m = {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0}
        for n, w, x in _fields(buf, *sp):
            if n in m and w == VARINT:
                m[n] = x
        mappings[m[1]] = Mapping(m[1], m[2], m[3], m[4], s(m[5]), s(m[6]))
    functions = {}
    for sp in raw_funcs:
        f = {1: 0, 2: 0, 3: 0, 4: 0}
        for n, w, x in _fields(buf, *sp):
            if n in f and w == VARINT:
                f[n] = x
        functions[f[1]] = Function(f[1], s(f[2]), s(f[3]), s(f[4]))
    locations = {}
    for sp in raw_locs:
        lid = mid = addr = 0
        lines = []
        for n, w, x in _fields(buf, *sp):
            if n == 1 and w == VARINT:
                lid = x
            elif n == 2 and w == VARINT:
                mid = x
            elif n == 3 and w == VARINT:
                addr = x
            elif n == 4 and w == LEN:
                fid = ln = 0
                for n2, w2, x2 in _fields(buf, *x):
                    if n2 == 1 and w2 == VARINT:
                        fid = x2
                    elif n2 == 2 and w2 == VARINT:
                        ln = _signed(x2)
                lines.append(Line(fid, ln))
        locations[lid] = Location(lid, mid, addr, lines)
    # Every reference must resolve: a dangling id means a broken writer, and would silently lose bytes.
    for smp in samples:
        for lid in smp.location_ids:
            if lid not in locations:
                raise ProfileError(f"malformed profile: a sample names location {lid}, which is not defined")
    for loc in locations.values():
        if loc.mapping_id and loc.mapping_id not in mappings:
            raise ProfileError(f"malformed profile: location {loc.id} names mapping {loc.mapping_id}, not defined")
        for ln in loc.lines:
            if ln.function_id and ln.function_id not in functions:
                raise ProfileError(f"malformed profile: location {loc.id} names function {ln.function_id}, "
                                   "not defined")
    default = s(ints.get(14, 0))
    return Profile(types, samples, mappings, locations, functions, default,
                   value_type(period_type) if period_type else None, ints.get(12, 0), ints.get(9, 0),
                   s(drop_idx), [s(i) for i in comment_idx])


def load(path: str) -> Profile:
    """Reads and decodes the profile file at path; OSError when it cannot be read, ProfileError when malformed."""
    with open(path, "rb") as f:
        return parse(f.read())
