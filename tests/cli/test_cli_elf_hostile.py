"""ELF files from the target's side are data: a crafted one never ends the command in an exception (issue 36)."""
from __future__ import annotations

import random
import struct
import subprocess

import pytest
from cc import build


def _craft_malloc_slot(src: str, dst: str, r_offset: int) -> None:
    """A copy of the executable src whose section headers show a malloc JUMP_SLOT at r_offset (appended to the file;
    the loader reads DT_JMPREL, not section headers, so the program still runs)."""
    from elftools.elf.elffile import ELFFile

    with open(src, "rb") as f:
        data = bytearray(f.read())
        f.seek(0)
        elf = ELFFile(f)
        dynsym = elf.get_section_by_name(".dynsym")
        idx = next(i for i, s in enumerate(dynsym.iter_symbols()) if s.name == "malloc")
        secs = [s.name for s in elf.iter_sections()]
        rela = secs.index(".rela.plt")
        shoff = elf["e_shoff"]
    off = len(data)
    data += struct.pack("<QQq", r_offset, (idx << 32) | 7, 0)  # R_X86_64_JUMP_SLOT (7)
    struct.pack_into("<QQ", data, shoff + 64 * rela + 24, off, 24)  # sh_offset, sh_size
    with open(dst, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("r_offset", [(1 << 64) - 8, 1 << 62], ids=["past-2**63", "unmapped"])
def test_crafted_relocation_is_one_line(mallard, tmp_path, r_offset):
    import os
    import platform

    if platform.machine() != "x86_64":
        pytest.fail("this test crafts an x86-64 relocation")
    exe = build("title_wait", tmp_path)
    crafted = str(tmp_path / "crafted")
    _craft_malloc_slot(exe, crafted, r_offset)
    os.chmod(crafted, 0o755)
    p = subprocess.Popen([crafted, "30"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert p.stdout.readline().startswith("ready")
        for cmd in (["which", str(p.pid)], ["which", "--json", str(p.pid)], ["stats", str(p.pid)]):
            r = mallard(*cmd)
            out = r.stdout + r.stderr
            assert "internal error" not in out and "Traceback" not in out, (cmd, out)
        text = " ".join(mallard("which", str(p.pid)).stdout.split())
        assert "outside the object's mappings" in text, text
    finally:
        p.kill()
        p.wait(timeout=30)


def test_elf_readers_take_mutated_files(build, tmp_path):
    """Random bytes of the headers, section headers and sections of a real library changed, 300 times: each reader
    returns its answer or None (or OSError for the symboliser), never another exception."""
    from mallard_cli import allocators as al
    from mallard_cli import gotslot as gs
    from mallard_cli import procinfo as pi
    from mallard_cli.heapprof import symbolize as sy

    src = (build / "lib" / "libmallard.so").read_bytes()
    shoff = struct.unpack_from("<Q", src, 0x28)[0]
    shnum = struct.unpack_from("<H", src, 0x3C)[0]
    offsets = list(range(64)) + list(range(shoff, shoff + 64 * shnum))
    for k in range(shnum):
        o, size = struct.unpack_from("<QQ", src, shoff + 64 * k + 24)
        offsets += range(o, min(o + min(size, 512), len(src)))
    rng = random.Random(36)
    path = tmp_path / "mutant.so"
    for i in range(300):
        data = bytearray(src)
        for _ in range(rng.randint(1, 4)):
            data[rng.choice(offsets)] = rng.choice([0, 0xFF, rng.randrange(256)])
        path.write_bytes(data)
        p = str(path)
        gs._cache.clear()
        pi._elf_cache.clear()
        for name, fn in (("relocations", lambda: gs.relocations(p)), ("elf", lambda: pi._elf(p)),
                         ("not_an_allocator", lambda: al.not_an_allocator(p))):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - the point: nothing may escape
                pytest.fail(f"mutant {i}: {name} raised {type(e).__name__}: {e}")
        try:
            sy.ElfInfo(p)
        except OSError:
            pass
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"mutant {i}: ElfInfo raised {type(e).__name__}: {e}")
