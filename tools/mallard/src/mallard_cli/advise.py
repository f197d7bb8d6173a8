"""Tuning advice from a Mallard statistics dump (mallard_stats_print with "J"): each finding with its numbers."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

MiB = 1024 * 1024
SLOT = 64 * 1024
MAX_SLOTS = 16
TRIPS_WORTH = 100_000  # page trips per second from which the refills advice is worth its memory


@dataclass
class Advice:
    kind: str                 # contention, refills, dirty, retained, metadata, ok
    title: str
    evidence: list[str] = field(default_factory=list)
    conf: str | None = None   # the MALLARD_CONF line to try
    note: str | None = None


class BadDump(ValueError):
    """The file is not a Mallard JSON statistics dump."""


class BadChoice(ValueError):
    """--dump or --pid names no dump of the file."""


@dataclass
class Dump:
    index: int  # 1-based, in the order of the file
    count: int  # dumps in the file
    data: dict  # the "mallard" object

    @property
    def allocations(self) -> int:
        st = self.data.get("stats", {})
        n = sum(int(c.get("nmalloc", 0)) for c in self.data.get("classes", []))
        return n + int(st.get("large", {}).get("nmalloc", 0)) + int(st.get("huge", {}).get("nmalloc", 0))

    def describe(self) -> dict:
        d = self.data
        return {"index": self.index, "of": self.count, "pid": d.get("pid"), "exe": d.get("exe") or d.get("cmdline"),
                "uptime_ms": d.get("uptime_ms"), "allocations": self.allocations}

    def label(self) -> str:
        d = self.describe()
        who = f"PID {d['pid']}" if d["pid"] is not None else "process not named in the dump"
        if d["exe"]:
            who += f", {d['exe']}"
        return (f"dump {self.index} of {self.count} ({who}; {self.allocations:,} allocations, "
                f"{d['uptime_ms']} ms)")


_REQUIRED = ("stats", "arenas", "classes", "options")


def load_all(path: str) -> list[Dump]:
    """Every Mallard dump in the file, wherever it sits among other output (program output, /usr/bin/time's)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise BadDump(f"cannot read {path}: {e.strerror}") from None
    except UnicodeError as e:
        raise BadDump(f"cannot read {path}: {e}") from None
    dec = json.JSONDecoder()
    found: list[dict] = []
    first_error: str | None = None
    pos = text.find('{"mallard"')
    while pos >= 0:
        try:
            doc, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as e:
            first_error = first_error or f"malformed statistics JSON: {e}"
            pos = text.find('{"mallard"', pos + 1)
            continue
        m = doc.get("mallard") if isinstance(doc, dict) else None
        if not isinstance(m, dict) or not all(k in m for k in _REQUIRED):
            first_error = first_error or "not a Mallard statistics dump (missing stats/arenas/classes/options)"
        else:
            found.append(m)
        pos = text.find('{"mallard"', end)
    if not found:
        if first_error:
            raise BadDump(f"{path}: {first_error}")
        raise BadDump(f"{path}: no Mallard statistics found (expected JSON from mallard_stats_print with opts \"J\", "
                      "e.g. MALLARD_CONF=stats_print:true,stats_print_opts:J)")
    return [Dump(i + 1, len(found), m) for i, m in enumerate(found)]


def choose(dumps: list[Dump], index: int | None = None, pid: int | None = None) -> tuple[Dump, str]:
    """The dump to advise on, and a sentence saying which and why: the one asked for, else the busiest (a wrapper
    such as the shell that started the program usually writes its own small dump too)."""
    if index is not None:
        if not 1 <= index <= len(dumps):
            raise BadChoice(f"--dump {index}: the file holds {len(dumps)} dump{'s' if len(dumps) != 1 else ''}")
        d = dumps[index - 1]
        return d, f"using {d.label()}, as asked"
    if pid is not None:
        hits = [d for d in dumps if d.data.get("pid") == pid]
        if not hits:
            pids = [d.data.get("pid") for d in dumps]
            raise BadChoice(f"--pid {pid}: no dump of that process in the file (dumps of PIDs: "
                            f"{', '.join(str(p) for p in pids)})")
        return hits[-1], f"using {hits[-1].label()}, as asked"
    if len(dumps) == 1:
        return dumps[0], f"using {dumps[0].label()}"
    d = max(dumps, key=lambda x: (x.allocations, x.index))
    return d, (f"the file holds {len(dumps)} dumps: using {d.label()}, the one with the most allocations "
               "(choose another with --dump N or --pid PID)")


def load(path: str) -> dict:
    """The busiest dump of the file (see choose)."""
    return choose(load_all(path))[0].data


def _mib(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


def _conf(opts: dict, **changes) -> str:
    items = {**changes}
    return "MALLARD_CONF=" + ",".join(f"{k}:{v}" for k, v in items.items())


def advise(m: dict) -> list[Advice]:
    """Read a dump and return the advice, most important first; a single 'ok' item when nothing needs changing."""
    out: list[Advice] = []
    stats, opts = m["stats"], m["options"]
    uptime_ms = max(1, int(m.get("uptime_ms", 0)))
    narenas = int(opts.get("narenas", len(m["arenas"])))
    ncpus = int(m.get("ncpus", narenas or 1))

    # 1. Arena lock contention with several threads per arena.
    hot = []
    for a in m["arenas"]:
        mu = a.get("mutex", {})
        ops, cont, wait = mu.get("ops", 0), mu.get("contended", 0), mu.get("wait_ns", 0)
        threads = max(a.get("nthreads_total", 0), a.get("nthreads", 0))
        share = wait / (uptime_ms * 1e6)
        if threads >= 2 and cont >= 20 and (share >= 0.05 or cont >= 0.01 * ops):
            hot.append((a, threads, ops, cont, wait, share))
    # At most ncpus threads run at once: two arenas per CPU is the most that splitting can help, so the advice goes
    # there in one step and does not come back asking for more (waits beyond it come from preemption, not sharing).
    want = min(64, max(2, ncpus * 2))
    if hot and want > narenas:
        ev = [f"arena {a['index']}: {threads} threads used it; {cont} of {ops} lock acquisitions waited "
              f"({100 * cont / max(ops, 1):.2f}%), {wait / 1e6:.1f} ms spent waiting (summed over threads) = "
              f"{100 * share:.0f}% of the {uptime_ms} ms run" for a, threads, ops, cont, wait, share in hot]
        out.append(Advice("contention", f"Threads contend for arena locks: spread them over more arenas "
                                        f"({narenas} now)", ev, _conf(opts, narenas=want),
                          "Or give a hot thread an arena of its own: mallard_ctl(\"arenas.create\", ...) then "
                          "mallard_ctl(\"thread.arena\", NULL, NULL, &idx, sizeof idx)."))

    # 2. Size classes whose pages are taken from the arena and given back over and over.
    churn = []
    for c in m["classes"]:
        from_arena = c.get("npages", 0) - c.get("npages_cached", 0)
        nmalloc, per_page = c.get("nmalloc", 0), max(1, c.get("objs_per_page", 1))
        # Frequent trips to the arena, each serving less than two pages' worth of blocks, and often enough to cost
        # something: a trip is a lock and a page set-up, about 0.2 us here (40000 trips in 8 ms in the refills
        # workload), so below TRIPS_WORTH per second they take under 2% of the run. Without that floor the rule is
        # scale-free: doubling the pages halves the trips and doubles the blocks per page, and it fires again.
        rate = from_arena * 1000 / uptime_ms
        if from_arena >= 1000 and nmalloc / from_arena < 2 * per_page and rate >= TRIPS_WORTH:
            churn.append((c, from_arena))
    if churn:
        parts, ev, cache = [], [], int(opts.get("page_cache", 4))
        for c, from_arena in churn:
            slots = max(1, c["page_bytes"] // SLOT)
            new = min(MAX_SLOTS, slots * 2)
            ev.append(f"class {c['size']} B: {from_arena} pages taken from the arena ({from_arena * 1000 / uptime_ms:,.0f}"
                      f" per second) for {c['nmalloc']} allocations "
                      f"({c['nmalloc'] / from_arena:.1f} per page; a page holds {c['objs_per_page']}); "
                      f"{c['npages_released']} pages given back; {c['nrefills']} refills")
            if new > slots:
                parts.append(f"{c['size']}-{c['size']}:{new}")
            cache = max(cache, 4 * new)   # room for four pages of the class in each thread's cache
        conf = "MALLARD_CONF=" + (f"slab_sizes:{'|'.join(parts)}," if parts else "") + f"page_cache:{min(64, cache)}"
        # Already at the largest pages and cache this rule can suggest: repeating it would change nothing.
        if parts or min(64, cache) > int(opts.get("page_cache", 4)):
            out.append(Advice("refills", "Pages of some size classes go back and forth between threads and the arena: "
                                         "use larger pages for them and a larger per-thread page cache", ev, conf))

    # 3. Free memory waiting to be purged.
    dirty, resident = stats.get("dirty", 0), max(1, stats.get("resident", 0))
    decay = int(opts.get("dirty_decay_ms", 1000))
    # With a short decay and the purging thread on, dirty memory goes back within the delay on its own.
    slow_purge = decay < 0 or decay > 5000 or not opts.get("background_thread")
    if slow_purge and (dirty >= 64 * MiB or (dirty >= 8 * MiB and dirty >= 0.25 * resident)):
        ev = [f"{_mib(dirty)} free but not yet returned to the OS ({100 * dirty / resident:.0f}% of the "
              f"{_mib(resident)} resident estimate)", f"dirty_decay_ms is {decay}; purging thread "
              f"{'on' if opts.get('background_thread') else 'off'}"]
        changes = {"dirty_decay_ms": max(100, min(decay // 4, 1000)) if decay > 0 else 1000}
        if not opts.get("background_thread"):
            changes["background_thread"] = "true"
        out.append(Advice("dirty", "Much freed memory stays resident: purge sooner", ev, _conf(opts, **changes)))
    retained = stats.get("retained", 0)
    if opts.get("retain") and retained >= 1024 * MiB:
        out.append(Advice("retained", "Large address-space retention", [f"{_mib(retained)} mapped but purged"],
                          _conf(opts, retain="false")))

    # 4. Tiny working set, large metadata.
    alloc, meta = stats.get("allocated", 0), stats.get("metadata", 0)
    working = max(alloc, stats.get("active", 0))   # pages still held count: a dump at exit sees few live blocks
    if alloc > 0 and meta >= 256 * 1024 and meta > 2 * working and (int(opts.get("narenas", 0)) > 1
                                                                      or int(opts.get("page_cache", 4)) > 0):   # a live working set far below the overhead
        threads = sum(max(a.get("nthreads_total", 0), a.get("nthreads", 0)) for a in m["arenas"])
        ev = [f"metadata {_mib(meta)} exceeds the {_mib(working)} of pages in use ({_mib(alloc)} in live blocks)",
              f"{len(m['arenas'])} arenas, {threads} threads seen"]
        out.append(Advice("metadata", "The working set is tiny next to the allocator's own overhead: use fewer "
                                      "arenas and no page cache", ev, _conf(opts, narenas=1, page_cache=0)))

    out = consistent(out)
    if not out:
        ev = [f"allocated {_mib(alloc)}, resident {_mib(resident)}, dirty {_mib(dirty)}, metadata {_mib(meta)}",
              f"{len(m['arenas'])} arena(s), no contended locks worth acting on, no size class churning pages"]
        out.append(Advice("ok", "Nothing to change: this program is well served by the current settings", ev))
    return out


def conf_items(conf: str | None) -> dict[str, str]:
    if not conf or not conf.startswith("MALLARD_CONF="):
        return {}
    return dict(item.split(":", 1) for item in conf[len("MALLARD_CONF="):].split(",") if ":" in item)


def consistent(advice: list[Advice]) -> list[Advice]:
    """Drops advice whose line contradicts more important advice (the same option set to another value), so that
    all the lines can be applied together."""
    kept: list[Advice] = []
    taken: dict[str, str] = {}
    for a in advice:
        items = conf_items(a.conf)
        clash = [k for k, v in items.items() if k in taken and taken[k] != v]
        if clash:
            continue
        taken.update(items)
        kept.append(a)
    return kept


def combined(advice: list[Advice]) -> str | None:
    """One MALLARD_CONF line applying every piece of advice (they never contradict each other)."""
    items: dict[str, str] = {}
    for a in advice:
        items.update(conf_items(a.conf))
    return ("MALLARD_CONF=" + ",".join(f"{k}:{v}" for k, v in items.items())) if items else None


def render(advice: list[Advice]) -> str:
    lines = []
    for i, a in enumerate(advice, 1):
        lines.append(f"{i}. {a.title}")
        lines.extend(f"   - {e}" for e in a.evidence)
        if a.conf:
            lines.append(f"   try: {a.conf}")
        if a.note:
            lines.append(f"   {a.note}")
    if sum(1 for a in advice if a.conf) > 1:
        lines.append(f"All together: {combined(advice)}")
    return "\n".join(lines)
