"""Allocation sites of a heap profile: symbolised stacks without the allocator's own frames, totals per site, diffs."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .pprof import Profile, ProfileError
from .symbolize import Frame, Symbolizer

# The four sample types of a heap profile (pprof's names), and what --by picks.
TYPES = ("inuse_space", "inuse_objects", "alloc_space", "alloc_objects")
BY = {"inuse": "inuse_space", "alloc": "alloc_space"}

# Entry points of an allocator: the frames above them (towards the caller) are the allocation site.
_ALLOC_NAMES = {"malloc", "calloc", "realloc", "reallocarray", "free", "posix_memalign", "aligned_alloc", "memalign",
                "valloc", "pvalloc", "mallocx", "rallocx", "xallocx", "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t",
                "_ZnamRKSt9nothrow_t", "_ZnwmSt11align_val_t", "_ZnamSt11align_val_t"}
_ALLOC_PREFIXES = ("operator new", "__libc_malloc", "__libc_calloc", "__libc_realloc", "__libc_memalign",
                   "mallard_", "mld_")
# libmallard itself (its sampling and unwinding code) and the unwinder library are never the site.
_ALLOC_MODULES = re.compile(r"^(libmallard[-\w]*\.so|libgcc_s\.so|libunwind[-\w]*\.so)")


def is_allocator_frame(f: Frame) -> bool:
    return bool(_ALLOC_MODULES.match(f.module)) or f.function in _ALLOC_NAMES or \
        f.function.startswith(_ALLOC_PREFIXES)


@dataclass
class Site:
    frame: Frame
    values: dict[str, int] = field(default_factory=dict)  # sample type -> total
    stacks: dict[tuple[Frame, ...], int] = field(default_factory=dict)  # callers (after the site) -> chosen value

    def callers(self) -> tuple[Frame, ...]:
        """The heaviest stack's callers of this site, nearest first."""
        return max(self.stacks.items(), key=lambda kv: (kv[1], -len(kv[0])))[0] if self.stacks else ()

    def as_json(self, depth: int) -> dict:
        f = self.frame
        return {"function": f.function, "file": f.file or None, "line": f.line or None, "module": f.module or None,
                **{t: self.values.get(t, 0) for t in TYPES},
                "stack": [{"function": c.function, "file": c.file or None, "line": c.line or None}
                          for c in (f,) + self.callers()[:depth]]}


@dataclass
class Analysis:
    profile: Profile
    stacks: list[tuple[tuple[Frame, ...], list[int]]]  # (frames leaf first, without allocator frames; values)
    warnings: list[str]

    def has(self, t: str) -> bool:
        return any(st.type == t for st in self.profile.sample_types)

    def total(self, t: str) -> int:
        return self.profile.total(t) if self.has(t) else 0

    def sites(self, by: str) -> list[Site]:
        """Sites (the first frame outside the allocator) with their totals, heaviest by `by` first."""
        by_i = self.profile.index(by)
        idx = {t: self.profile.index(t) for t in TYPES if self.has(t)}
        out: dict[Frame, Site] = {}
        for frames, vals in self.stacks:
            if not frames:
                continue
            s = out.setdefault(frames[0], Site(frames[0]))
            for t, i in idx.items():
                s.values[t] = s.values.get(t, 0) + vals[i]
            s.stacks[frames[1:]] = s.stacks.get(frames[1:], 0) + vals[by_i]
        return sorted(out.values(), key=lambda s: (-s.values.get(by, 0), s.frame.function, s.frame.line))


def trim(frames: list[Frame], drop: re.Pattern | None) -> list[Frame]:
    """The stack without the allocator's frames at its leaf end (and, like pprof, without frames matching the
    profile's drop_frames and everything leafward of them); unchanged when nothing would remain."""
    k = 0
    if drop is not None:
        hits = [i for i, f in enumerate(frames) if drop.fullmatch(f.function)]
        k = hits[-1] + 1 if hits else 0
    while k < len(frames) and is_allocator_frame(frames[k]):
        k += 1
    return frames[k:] if k < len(frames) else frames


def analyse(prof: Profile, symbolizer: Symbolizer | None = None) -> Analysis:
    sym = symbolizer or Symbolizer()
    frames = sym.resolve(prof)
    drop = None
    if prof.drop_frames:
        try:
            drop = re.compile(prof.drop_frames)
        except re.error:
            drop = None
    stacks = []
    for s in prof.samples:
        stack: list[Frame] = []
        for lid in s.location_ids:
            stack += frames[lid]
        stacks.append((tuple(trim(stack, drop)), s.values))
    return Analysis(prof, stacks, sym.warnings)


@dataclass
class Growth:
    frame: Frame
    old: int
    new: int
    old_objects: int
    new_objects: int
    callers: tuple[Frame, ...]

    @property
    def delta(self) -> int:
        return self.new - self.old


def diff(old: Analysis, new: Analysis, by: str) -> list[Growth]:
    """Per site, the change of `by` (and its object count) from old to new; growing sites first.

    Sites are matched by function and file:line (or module+offset when unnamed), which do not depend on where the
    program was loaded, so two runs of the same binary compare as well as two dumps of one process.
    """
    objects = by.replace("_space", "_objects")
    olds = {s.frame: s for s in old.sites(by)}
    news = {s.frame: s for s in new.sites(by)}
    out = []
    for f in set(olds) | set(news):
        o, n = olds.get(f), news.get(f)
        out.append(Growth(f, o.values.get(by, 0) if o else 0, n.values.get(by, 0) if n else 0,
                          o.values.get(objects, 0) if o else 0, n.values.get(objects, 0) if n else 0,
                          (n or o).callers()))
    return sorted(out, key=lambda g: (-g.delta, g.frame.function))


def check_heap(prof: Profile, by: str) -> None:
    """A usage-level check that prof carries the requested values (raises ProfileError naming what it has)."""
    if by not in TYPES:
        raise ProfileError(f"unknown sample type {by}")
    prof.index(by)
