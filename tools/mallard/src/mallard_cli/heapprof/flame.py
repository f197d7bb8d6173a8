"""Flame graph of a heap profile as a standalone SVG: one box per frame, width proportional to its bytes, root at
the bottom, each box's <title> (the browser's tooltip) giving the function, its file and its bytes."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from .sites import Analysis

WIDTH = 1200  # px of the whole picture
PAD = 10  # px left and right of the frames
ROW = 17  # px per stack level
TOP = 44  # px above the deepest row (title and subtitle)
MIN_PX = 0.1  # frames narrower than this are left out (their bytes still count in their parents)
CHAR_PX = 6.6  # average width of a glyph of the 11 px monospace font, to fit labels


@dataclass
class Node:
    name: str
    value: int = 0
    files: set[str] = field(default_factory=set)
    children: dict[str, Node] = field(default_factory=dict)


def tree(an: Analysis, by: str) -> Node:
    """The call tree of an's stacks, root first, weighted by the sample type `by`; negative values are ignored."""
    i = an.profile.index(by)
    root = Node("all")
    for frames, vals in an.stacks:
        v = vals[i]
        if v <= 0:
            continue
        root.value += v
        node = root
        for f in reversed(frames):  # from the outermost caller to the site
            node = node.children.setdefault(f.function, Node(f.function))
            node.value += v
            if f.file:
                node.files.add(f"{os.path.basename(f.file)}:{f.line}" if f.line else os.path.basename(f.file))
    return root


def _colour(name: str) -> str:
    """A warm colour that depends only on the name, so a function keeps its colour between graphs."""
    h = hashlib.md5(name.encode("utf-8", "surrogateescape")).digest()
    return f"rgb({205 + h[0] % 50},{80 + h[1] % 130},{h[2] % 60})"


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _depth(n: Node) -> int:
    return 1 + max((_depth(c) for c in n.children.values()), default=0)


def render(an: Analysis, by: str, title: str, unit_is_bytes: bool = True) -> str:
    """The SVG text of the flame graph of an weighted by `by` (e.g. inuse_space)."""
    root = tree(an, by)
    depth = _depth(root)
    height = TOP + depth * ROW + 10
    span = WIDTH - 2 * PAD
    fmt = _fmt if unit_is_bytes else (lambda x: f"{x:,.0f}")
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="11">',
        "<style>g.f:hover rect{stroke:#000;stroke-width:0.8} text{pointer-events:none}</style>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fdf8ef"/>',
        f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="15">{escape(title)}</text>',
        f'<text x="{WIDTH / 2}" y="34" text-anchor="middle" fill="#555">{escape(by)}: {escape(fmt(root.value))} in all; '
        "width is proportional to the value, callers below their callees; hover a frame for its figures</text>",
    ]
    total = root.value

    def emit(n: Node, x: float, level: int) -> None:
        w = span * n.value / total if total else span
        if w < MIN_PX:
            return
        y = height - 10 - (level + 1) * ROW
        where = f" ({', '.join(sorted(n.files)[:3])}{', …' if len(n.files) > 3 else ''})" if n.files else ""
        tip = f"{n.name}{where}: {fmt(n.value)}, {100 * n.value / total if total else 100:.2f}% of {by}"
        parts.append(f'<g class="f"><title>{escape(tip)}</title>'
                     f'<rect x="{x:.3f}" y="{y}" width="{w:.3f}" height="{ROW - 1}" rx="2" '
                     f'fill="{"#e6e6e6" if level == 0 else _colour(n.name)}"/>')
        chars = int((w - 6) / CHAR_PX)
        if chars >= 3:
            label = n.name if len(n.name) <= chars else n.name[:chars - 2] + ".."
            parts.append(f'<text x="{x + 3:.3f}" y="{y + ROW - 5}">{escape(label)}</text>')
        parts.append("</g>")
        cx = x
        for c in sorted(n.children.values(), key=lambda c: c.name):
            emit(c, cx, level + 1)
            cx += span * c.value / total

    emit(root, PAD, 0)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
