"""The smaps classifier of `mallard vmem` on synthetic mappings: arena heaps, thread stacks and their limits."""
from __future__ import annotations

from mallard_cli.procinfo import ARENA_HEAP, classify, parse_smaps

MiB = 1 << 20


def smaps(entries) -> str:
    """entries: (start, size, perms, path) -> smaps text with Size and Rss."""
    lines = []
    for start, size, perms, path in entries:
        inode = "1234" if path.startswith("/") else "0"
        lines.append(f"{start:x}-{start + size:x} {perms} 00000000 00:00 {inode}    {path}".rstrip())
        lines.append(f"Size: {size // 1024} kB")
        lines.append("Rss: 4 kB")
        lines.append("VmFlags: rd wr mr mw me ac")
    return "\n".join(lines) + "\n"


def arena(base: int, accessible: int):
    return [(base, accessible, "rw-p", ""), (base + accessible, ARENA_HEAP - accessible, "---p", "")]


def test_glibc_arena_heaps_are_found_only_under_glibc():
    base = 0x7F0000000000
    text = smaps(arena(base, 132 * 1024) + arena(base + ARENA_HEAP, 2 * MiB))
    maps = parse_smaps(text)
    found = classify(maps, [], glibc=True)
    assert [a.start for a in found] == [base, base + ARENA_HEAP]
    assert found[0].accessible == 132 * 1024 and found[0].reserved == ARENA_HEAP - 132 * 1024
    assert [m.kind for m in maps] == ["arena-heap", "arena-reserved"] * 2
    # The same shape under another allocator (mimalloc reserves like this) is that allocator's region.
    maps = parse_smaps(text)
    assert classify(maps, [], glibc=False) == []
    assert [m.kind for m in maps] == ["allocator", "reserved"] * 2


def test_unaligned_or_short_reservations_are_not_arenas():
    base = 0x7F0000000000 + 4096  # not on a 64 MiB boundary
    maps = parse_smaps(smaps(arena(base, 132 * 1024)))
    assert classify(maps, [], glibc=True) == []
    short = [(0x7F0004000000, 132 * 1024, "rw-p", ""), (0x7F0004000000 + 132 * 1024, 32 * MiB, "---p", "")]
    maps = parse_smaps(smaps(short))
    assert classify(maps, [], glibc=True) == []


def test_thread_stacks_by_stack_pointer_and_by_guard_page_up_to_the_thread_count():
    g = 4096
    base = 0x7E0000000000
    entries = []
    starts = []
    for i in range(4):  # four guard + 8 MiB regions
        s = base + i * 16 * MiB
        entries += [(s, g, "---p", ""), (s + g, 8 * MiB - g, "rw-p", "")]
        starts.append(s + g)
    entries += [(0x7D0000000000, 12 * 1024, "rw-p", "[stack]"), (0x7C0000000000, 8192, "r-xp", "/usr/lib/libc.so.6")]
    maps = parse_smaps(smaps(entries))
    # One thread is seen in a system call (its stack pointer is known); 3 threads in all besides main: only the
    # two largest guarded candidates without a stack pointer are counted as stacks.
    classify(maps, [starts[0] + 100], glibc=True, threads=3)
    kinds = {m.start: m.kind for m in maps}
    assert kinds[starts[0]] == "thread-stack"
    assert sum(kinds[s] == "thread-stack" for s in starts) == 2
    assert kinds[0x7D0000000000] == "main-stack"
    assert kinds[0x7C0000000000] == "library"
    assert sum(m.kind == "stack-guard" for m in maps) == 2
