"""Comparisons that respect noise: a difference counts only when the ranges of the repeated runs do not overlap."""
from __future__ import annotations

import statistics
from dataclasses import dataclass


# Differences smaller than this share of the median are not worth a verdict even when the runs separate (e.g. the
# fraction of a millisecond it takes to load one more library).
MEANINGFUL = 0.01


@dataclass
class Comparison:
    ratio: float  # median(a) / median(b)
    low: float  # min(a) / max(b): the smallest ratio the runs allow
    high: float  # max(a) / min(b): the largest
    beyond_noise: bool  # the ranges [min, max] of a and b do not overlap, and the medians differ by MEANINGFUL or more


def compare(a: list[float], b: list[float]) -> Comparison:
    """a against b (e.g. an allocator's wall times against the baseline's)."""
    ma, mb = statistics.median(a), statistics.median(b)
    ratio = ma / mb if mb else float("inf")
    low = min(a) / max(b) if max(b) else float("inf")
    high = max(a) / min(b) if min(b) else float("inf")
    separated = max(a) < min(b) or min(a) > max(b)
    return Comparison(ratio, low, high, separated and abs(ratio - 1) >= MEANINGFUL)


def spread(vals: list[float]) -> float:
    """Half the range of the runs relative to their median (0.05 = ±5%)."""
    m = statistics.median(vals)
    return (max(vals) - min(vals)) / 2 / m if m else 0.0


def clear_winner(candidates: list[tuple[str, list[float]]], higher_is_better: bool = False) -> tuple[str | None, str]:
    """The best candidate when its runs beat every other's runs outright, else None; with a sentence saying why."""
    if not candidates:
        return None, "no results"
    pick = max if higher_is_better else min
    best_name, best = pick(candidates, key=lambda c: statistics.median(c[1]))
    if len(candidates) == 1:
        return best_name, "the only result"
    tied = []
    for name, vals in candidates:
        if name == best_name:
            continue
        if not compare(vals, best).beyond_noise:
            tied.append(name)
    if tied:
        return None, (f"{best_name}'s runs overlap with those of {', '.join(tied)}, or differ by less than "
                      f"{MEANINGFUL:.0%}")
    return best_name, "every one of its runs beats every run of the others"
