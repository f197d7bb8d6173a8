#!/usr/bin/env python3
"""check_layers.py — fails when a source file of a layer uses a higher layer: an #include of its header, or (read from
the build's object files) a reference to a symbol that a higher layer's object defines. The order is src/LAYERS."""
from __future__ import annotations

import argparse
import fnmatch
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


OWN: dict[str, set[str]] = {}  # layer -> outside symbols (the C library's) that only that layer may call


def read_layers(path: Path) -> list[tuple[str, list[str]]]:
    """[(layer, [patterns relative to src/])], bottom first. A line: `NAME: PATTERN [PATTERN...]`; # starts a comment.
    A line `@NAME: SYMBOL...` reserves those outside symbols (OS calls) to layer NAME (kept in OWN)."""
    layers = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("@"):
            name, sep, syms = line[1:].partition(":")
            if not sep or not name.strip() or not syms.split():
                sys.exit(f"{path}:{n}: expected '@LAYER: SYMBOL...', got {line!r}")
            OWN.setdefault(name.strip(), set()).update(syms.split())
            continue
        name, sep, pats = line.partition(":")
        if not sep or not name.strip() or not pats.split():
            sys.exit(f"{path}:{n}: expected 'LAYER: PATTERN...', got {line!r}")
        layers.append((name.strip(), pats.split()))
    if not layers:
        sys.exit(f"{path}: no layers")
    unknown = set(OWN) - {name for name, _ in layers}
    if unknown:
        sys.exit(f"{path}: '@' names no layer: {', '.join(sorted(unknown))}")
    return layers


def layer_of(rel: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The index of the layer whose pattern matches rel (a path under src/): a folder prefix `dir/` or a glob."""
    for i, (_, pats) in enumerate(layers):
        for p in pats:
            if (p.endswith("/") and rel.startswith(p)) or fnmatch.fnmatchcase(rel, p):
                return i
    return None


def source_files(src: Path) -> list[str]:
    return sorted(str(p.relative_to(src)) for p in src.rglob("*") if p.suffix in (".c", ".h") and p.is_file())


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def include_violations(src: Path, layers, files: list[str]) -> list[str]:
    out = []
    for rel in files:
        me = layer_of(rel, layers)
        text = (src / rel).read_text(errors="replace")
        for m in INCLUDE.finditer(text):
            # Includes name their layer from src/ ("core/core.h"); a name beside the file is looked up there too.
            target = next((t for t in (src / m.group(1), (src / rel).parent / m.group(1)) if t.is_file()), None)
            if target is None:
                continue  # outside src/ (include/, a system header): not a layer
            trel = str(target.resolve().relative_to(src.resolve()))
            them = layer_of(trel, layers)
            if me is not None and them is not None and them > me:
                line = text.count("\n", 0, m.start()) + 1
                out.append(f"src/{rel}:{line}: includes {trel} ({layers[them][0]}) from the {layers[me][0]} layer")
    return out


def nm(obj: Path) -> tuple[set[str], set[str]]:
    """(defined, undefined) global symbols of an object file."""
    r = subprocess.run(["nm", "-P", "-g", str(obj)], capture_output=True, text=True, check=True)
    defined, undefined = set(), set()
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            (undefined if parts[1] in ("U", "w", "v") else defined).add(parts[0])
    return defined, undefined


def symbol_violations(objdir: Path, layers, sources: set[str]) -> tuple[list[str], int]:
    """Objects under objdir (CMake's <target>.dir: the source path plus .o) checked against each other; objects of
    sources that no longer exist (left by an older build in the same folder) are not read."""
    objs = [o for o in sorted(objdir.rglob("*.c.o")) if str(o.relative_to(objdir))[: -len(".o")] in sources]
    table = {}
    for o in objs:
        rel = str(o.relative_to(objdir))[: -len(".o")]
        table[rel] = nm(o)
    owner = {}
    for rel, (defined, _) in table.items():
        for s in defined:
            owner[s] = rel
    out = []
    for rel, (_, undefined) in sorted(table.items()):
        me = layer_of(rel, layers)
        for s in sorted(undefined):
            if s not in owner:  # libc, pthreads, the compiler's helpers: free to all but what a layer keeps
                keeper = next((name for name, syms in OWN.items() if s in syms), None)
                if keeper is not None and me is not None and layers[me][0] != keeper:
                    out.append(f"src/{rel}: calls {s}, which only the {keeper} layer may call")
                continue
            them = layer_of(owner[s], layers)
            if me is not None and them is not None and them > me:
                out.append(f"src/{rel}: uses {s}, defined in src/{owner[s]} ({layers[them][0]}), from the "
                           f"{layers[me][0]} layer")
    return out, len(objs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--layers", type=Path, default=ROOT / "src" / "LAYERS")
    ap.add_argument("--src", type=Path, default=ROOT / "src")
    ap.add_argument("--objects", type=Path, action="append", default=[],
                    help="a CMake object folder (build/src/CMakeFiles/mallard-prefix.dir); repeatable")
    a = ap.parse_args()
    layers = read_layers(a.layers)
    files = source_files(a.src)
    unplaced = [f for f in files if layer_of(f, layers) is None]
    problems = [f"src/{f}: in no layer of {a.layers.name}" for f in unplaced]
    problems += include_violations(a.src, layers, files)
    nobj = 0
    for d in a.objects:
        if not d.is_dir():
            problems.append(f"{d}: no such object folder (build first)")
            continue
        v, n = symbol_violations(d, layers, set(files))
        problems += v
        nobj += n
    for p in problems:
        print(p)
    order = " -> ".join(name for name, _ in reversed(layers))
    print(f"layers ({order}): {len(files)} source files, {nobj} object files, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
