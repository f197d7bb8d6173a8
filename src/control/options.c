/* control/options.c — options: defaults, then the program's `mallard_conf`, /etc/mallard.conf and MALLARD_CONF, parsed without
 * allocating; and their one printed form (key:value,... as the parser accepts it). */
#define _GNU_SOURCE
#include "core/core.h"
#include "control/control.h"
#include "mallard.h"
#include "prof/prof.h"
#include "core/secure.h"
#include "core/junk.h"
#include "guarded/guarded.h"
#include <stdarg.h>
#include <stdio.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A program may define `const char *mallard_conf = "key:value,...";`. */
extern const char *mallard_conf __attribute__((weak));
/* jemalloc's equivalent, for programs written for jemalloc (read by the replacing libraries only, lowest priority). */
extern const char *malloc_conf __attribute__((weak));

static const char *const thp_names[] = { "default", "madvise", "always", "never" };   /* thp -1 is "never" */

enum { T_UINT, T_LONG, T_BOOL, T_THP, T_STR, T_SLABS, T_SIZE, T_PROF, T_SECURE, T_JUNK, T_GUARD };
typedef struct opt_desc_s {
  const char *name;
  int type;
  long lo, hi;
  const char *accepts;
} opt_desc_t;

static const opt_desc_t descs[] = {
  { "narenas", T_UINT, 0, MLD_MAX_ARENAS, "an integer 0..64 (0: one per CPU)" },
  { "dirty_decay_ms", T_LONG, -1, 86400000, "milliseconds -1..86400000 (-1: never purge, 0: at once)" },
  { "dirty_decay_max_ms", T_LONG, 0, 86400000, "milliseconds 0..86400000 (at most dirty_decay_ms: never lengthened)" },
  { "background_thread", T_BOOL, 0, 1, "true or false" },
  { "retain", T_BOOL, 0, 1, "true or false" },
  { "thp", T_THP, 0, 3, "default, never, madvise or always" },
  { "verbose", T_BOOL, 0, 1, "true or false" },
#ifdef MALLARD_SECURE
  { "zero_on_free", T_BOOL, 0, 1, "true or false" },
#else
  { "zero_on_free", T_BOOL, 0, 1, "false (zero_on_free:true needs the secure variant, libmallard-secure)" },
#endif
#ifdef MALLARD_SECURE
  { "tcache", T_BOOL, 0, 1, "false (the thread cache is the fast variant's, libmallard: this one checks every free)" },
#else
  { "tcache", T_BOOL, 0, 1, "true or false" },
#endif
  { "abort_conf", T_BOOL, 0, 1, "true or false" },
  { "stats_print", T_BOOL, 0, 1, "true or false" },
  { "stats_print_opts", T_STR, 0, 15, "letters: J (JSON), a (no per-arena), b (no per-class)" },
#ifdef MALLARD_SECURE
  { "slab_sizes", T_SLABS, 1, MLD_MAX_PAGE_SLOTS,
    "ranges LO-HI:SLOTS separated by | (SLOTS of 64 KiB, 1..16; a page holds a block besides its guard page, one OS page)" },
#else
  { "slab_sizes", T_SLABS, 1, MLD_MAX_PAGE_SLOTS,
    "ranges LO-HI:SLOTS separated by | (SLOTS of 64 KiB, 1..16; a page holds a block)" },
#endif
  { "page_cache", T_UINT, 0, 64, "an integer 0..64 (empty 64 KiB pages kept per thread)" },
  { "huge_cache_max", T_SIZE, 0, 1L << 40, "a size in bytes, with optional K, M or G (0: no cache)" },
  /* the secure variant's defences (parsed by apply_secure): the fast variant takes only their "off" values */
#ifdef MALLARD_SECURE
  { "guard_slab_interval", T_SECURE, 0, 1024, "an integer 0..1024 (slots; 0: no guard slabs)" },
  { "secure_noaccess_min", T_SECURE, 0, 1L << 40, "a size in bytes 0..1T, with optional K, M or G, or none" },
  { "large_quarantine", T_SECURE, 0, MLD_LARGE_QUARANTINE_MAX, "an integer 0..64 (0: no quarantine)" },
  { "delayed_reuse", T_SECURE, 0, 1, "true or false" },
  { "shuffle", T_SECURE, 0, MLD_SHUFFLE_MAX, "an integer 0..1024 (blocks per randomised run; 0: address order)" },
#else
  { "guard_slab_interval", T_SECURE, 0, 1024, "0 (guard slabs need the secure variant, libmallard-secure)" },
  { "secure_noaccess_min", T_SECURE, 0, 1L << 40, "none (freed blocks made inaccessible need the secure variant, libmallard-secure)" },
  { "large_quarantine", T_SECURE, 0, MLD_LARGE_QUARANTINE_MAX, "0 (the large quarantine needs the secure variant, libmallard-secure)" },
  { "delayed_reuse", T_SECURE, 0, 1, "false (delayed reuse needs the secure variant, libmallard-secure)" },
  { "shuffle", T_SECURE, 0, MLD_SHUFFLE_MAX, "0 (random allocation order needs the secure variant, libmallard-secure)" },
#endif
  { "junk", T_JUNK, 0, 3, "alloc, free, true or false" },
  /* sampled guarded allocations (guarded.h; parsed by apply_guard): both variants */
  { "guard_sample", T_GUARD, 0, (long)MLD_GUARD_SAMPLE_MAX,
    "a size in bytes 0..1T, with optional K, M or G (mean bytes between guarded samples; 0: off)" },
  { "guard_slots", T_GUARD, 1, MLD_GUARD_SLOTS_MAX, "an integer 1..4096 (blocks guarded at once, freed ones included)" },
  { "guard_action", T_GUARD, 0, 1, "abort or report" },
  /* heap profiling (prof.h; parsed by apply_prof) */
  { "prof", T_PROF, 0, 1, "true or false" },
  { "prof_active", T_PROF, 0, 1, "true or false" },
  { "prof_sample", T_PROF, 1, 1L << 40, "a size in bytes 1..1T, with optional K, M or G (mean bytes between samples)" },
  { "prof_final", T_PROF, 0, 1, "true or false" },
  { "prof_leak", T_PROF, 0, 1, "true or false" },
  { "prof_prefix", T_PROF, 1, MLD_PROF_PREFIX_MAX - 1, "a path prefix of 1..255 bytes, without ',' (dumps: PREFIX.PID.SEQ.pb.gz)" },
  { "prof_interval", T_PROF, 0, 1L << 40, "a size in bytes, with optional K, M or G (0: off)" },
  { "prof_signal", T_PROF, 0, 64, "a signal name such as SIGUSR2 or USR2, a number 1-31 or SIGRTMIN..SIGRTMAX (34-64 with glibc), or none" },
  { "prof_seed", T_PROF, 0, 0, "an integer >= 0 (0: random)" },
};
#define NDESCS (sizeof descs / sizeof descs[0])

static size_t slab_guard_bytes(void);
static void set_defaults(void) {
  mld_prof_options_defaults();
  mld_opt.narenas = 0;
  mld_opt.dirty_decay_ms = 1000;
  mld_opt.dirty_decay_max_ms = 10000;
  mld_opt.background_thread = true;
  mld_opt.tcache = !MLD_SECURE_BUILD;
  mld_opt.retain = false;
  mld_opt.thp = 0;
  mld_opt.verbose = false;
  mld_opt.abort_conf = false;
  mld_opt.stats_print = false;
  mld_opt.stats_print_opts[0] = 0;
  mld_opt.huge_cache_max = 256u << 20;
  mld_opt.page_cache = 4;
#ifdef MALLARD_SECURE
  mld_opt.guard_slab_interval = MLD_GUARD_SLAB_INTERVAL;
  mld_opt.secure_noaccess_min = MLD_SECURE_NOACCESS_MIN;
  mld_opt.large_quarantine = MLD_LARGE_QUARANTINE;
  mld_opt.delayed_reuse = MLD_DELAYED_REUSE;
  mld_opt.shuffle = MLD_SHUFFLE;
#else
  mld_opt.guard_slab_interval = 0;
  mld_opt.secure_noaccess_min = SIZE_MAX;
  mld_opt.large_quarantine = 0;
  mld_opt.delayed_reuse = false;
  mld_opt.shuffle = 0;
#endif
  mld_opt.junk = 0;
  mld_opt.guard_sample = MLD_GUARD_SAMPLE_DEFAULT;
  mld_opt.guard_slots = MLD_GUARD_SLOTS_DEFAULT;
  mld_opt.guard_action = MLD_GUARD_ABORT;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    size_t bs = mld_class_size[c];
    /* Small classes use one 64 KiB slot; medium ones enough slots for ~8 blocks, in the fast variant at most
     * MLD_MEDIUM_PAGE_SLOTS (256 KiB: from 40 KiB a page holds fewer, one from 160 KiB), in the secure one at most
     * 1 MiB; every page holds a block. Pages of 8 blocks of 128-256 KiB held programs that keep one or two blocks
     * of a class per thread (mstress) or take them in bursts of a few (an I/O buffer pool) at several times their
     * blocks (docs/PERFORMANCE.md, issue 39's fifteenth pass). The secure variant: room for a block besides a
     * guard page (two slots for every class at 64 KiB pages). */
    size_t slots = bs <= MLD_SMALL_MAX ? 1 : (8 * bs + MLD_SLOT_SIZE - 1) / MLD_SLOT_SIZE;
#ifndef MALLARD_SECURE
    if (slots > MLD_MEDIUM_PAGE_SLOTS) slots = MLD_MEDIUM_PAGE_SLOTS;
#endif
    size_t fit = (bs + slab_guard_bytes() + MLD_SLOT_SIZE - 1) / MLD_SLOT_SIZE;
    if (slots < fit) slots = fit;
    mld_opt.page_slots[c] = (unsigned)(slots > MLD_MAX_PAGE_SLOTS ? MLD_MAX_PAGE_SLOTS : slots);
  }
}

static bool bad_conf;

/* Where a configuration text comes from. A file's text is never quoted back: under set-UID (or with a file the
 * user cannot read) it would disclose the file; messages about it give the line and, when known, the key. */
typedef struct conf_src_s {
  const char *name;
  bool from_file;
  unsigned line;
  bool jemalloc;   /* jemalloc's MALLOC_CONF / malloc_conf: keys without a Mallard meaning are only listed */
} conf_src_t;

/* jemalloc's keys that mean the same in Mallard, same name, same values (docs/COMPAT.md); any other key of a
 * jemalloc source is ignored and named in one line on stderr. */
static const char *const jemalloc_keys[] = { "narenas", "dirty_decay_ms", "background_thread", "retain", "thp",
                                             "abort_conf", "stats_print", "prof", "prof_active", "prof_final",
                                             "prof_leak", "prof_prefix", "junk", "tcache" };

/* The keys of one jemalloc source that were ignored, comma-separated (cut at the buffer's end, with "..."). */
static char ignored_buf[256];
static size_t ignored_len;

static void note_ignored(const char *k, size_t kl) {
  if (ignored_len + kl + 6 >= sizeof ignored_buf) {   /* room for ", ", the key, "..." and the NUL */
    if (ignored_len + 4 < sizeof ignored_buf && (ignored_len < 3 || memcmp(ignored_buf + ignored_len - 3, "...", 3))) {
      memcpy(ignored_buf + ignored_len, "...", 3);
      ignored_len += 3;
      ignored_buf[ignored_len] = 0;
    }
    return;
  }
  if (ignored_len) { memcpy(ignored_buf + ignored_len, ", ", 2); ignored_len += 2; }
  memcpy(ignored_buf + ignored_len, k, kl);
  ignored_len += kl;
  ignored_buf[ignored_len] = 0;
}

static const char *const known_keys =
    "narenas, dirty_decay_ms, dirty_decay_max_ms, background_thread, retain, thp, verbose, zero_on_free, tcache, abort_conf, stats_print, "
    "stats_print_opts, slab_sizes, page_cache, huge_cache_max, guard_slab_interval, secure_noaccess_min, "
    "large_quarantine, delayed_reuse, shuffle, junk, guard_sample, guard_slots, guard_action, prof, prof_active, "
    "prof_sample, prof_final, prof_leak, prof_prefix, prof_interval, prof_signal, prof_seed";

/* One line per problem: where, which key, which value (not from a file), what is accepted. known: the key is one of
 * ours (so naming it discloses nothing). */
static void conf_error(const conf_src_t *src, const char *key, size_t klen, bool known, const char *val, size_t vlen,
                       const char *why, const char *accepts) {
  const char *outcome = mld_opt.abort_conf ? "aborting (abort_conf:true)" : "the default stays in force";
  if (!src->from_file)
    mld_message("mallard: %s: %s '%.*s' (value '%.*s'); accepted: %s; %s\n", src->name, why, (int)klen, key, (int)vlen,
                val, accepts, outcome);
  else if (known)
    mld_message("mallard: %s line %u: %s '%.*s' (value not shown); accepted: %s; %s\n", src->name, src->line, why,
                (int)klen, key, accepts, outcome);
  else
    mld_message("mallard: %s line %u: %s (text not shown); accepted: %s; %s\n", src->name, src->line, why, accepts,
                outcome);
  bad_conf = true;
}

static bool parse_long(const char *v, size_t n, long *out) {
  if (!n || n > 20) return false;
  char buf[24];
  memcpy(buf, v, n);
  buf[n] = 0;
  char *end;
  errno = 0;
  long x = strtol(buf, &end, 10);
  if (errno || end != buf + n) return false;   /* also refuses an embedded NUL */
  *out = x;
  return true;
}

static bool parse_size(const char *v, size_t n, long *out) {
  if (!n) return false;
  long mul = 1;
  char last = v[n - 1];
  if (last == 'k' || last == 'K') mul = 1L << 10;
  else if (last == 'm' || last == 'M') mul = 1L << 20;
  else if (last == 'g' || last == 'G') mul = 1L << 30;
  if (mul != 1) n--;
  long x;
  if (!parse_long(v, n, &x) || x < 0 || x > (1L << 40) / mul) return false;
  *out = x * mul;
  return true;
}

static bool parse_bool(const char *v, size_t n, bool *out) {
  if ((n == 4 && !memcmp(v, "true", 4)) || (n == 1 && v[0] == '1')) { *out = true; return true; }
  if ((n == 5 && !memcmp(v, "false", 5)) || (n == 1 && v[0] == '0')) { *out = false; return true; }
  return false;
}

/* What a page of the secure variant may lose to its guard page (guard slabs: any page may get one, arena.c): one
 * OS page, which a page must hold a block besides, whatever guard_slab_interval says (the value means the same in
 * any order of options). The page is at most MLD_SLOT_SIZE (mld_os_page_init): slots * MLD_SLOT_SIZE - the guard
 * cannot wrap for slots >= 1; at 64 KiB pages a one-slot page would keep nothing, so no class gets one there. */
static size_t slab_guard_bytes(void) {
#ifdef MALLARD_SECURE
  return mld_os_page();
#else
  return 0;
#endif
}
_Static_assert(MLD_OS_PAGE_MAX <= MLD_SLOT_SIZE, "a guard page is at most one slot");

/* slab_sizes: "LO-HI:SLOTS|LO-HI:SLOTS": every class whose size lies in [LO, HI] gets pages of SLOTS slots. */
static bool parse_slabs(const char *v, size_t n, unsigned out[MLD_NUM_CLASSES]) {
  unsigned tmp[MLD_NUM_CLASSES];
  memcpy(tmp, out, sizeof tmp);
  const char *p = v, *end = v + n;
  while (p < end) {
    const char *bar = memchr(p, '|', (size_t)(end - p));
    const char *seg_end = bar ? bar : end;
    const char *dash = memchr(p, '-', (size_t)(seg_end - p));
    const char *colon = memchr(p, ':', (size_t)(seg_end - p));
    long lo, hi, slots;
    if (!dash || !colon || dash > colon) return false;
    if (!parse_size(p, (size_t)(dash - p), &lo) || !parse_size(dash + 1, (size_t)(colon - dash - 1), &hi) ||
        !parse_long(colon + 1, (size_t)(seg_end - colon - 1), &slots))
      return false;
    if (lo > hi || slots < 1 || slots > MLD_MAX_PAGE_SLOTS) return false;
    for (unsigned c = 0; c < MLD_NUM_CLASSES; c++)
      if ((long)mld_class_size[c] >= lo && (long)mld_class_size[c] <= hi) {
        if ((size_t)slots * MLD_SLOT_SIZE - slab_guard_bytes() < mld_class_size[c]) return false;   /* >= 1 block */
        tmp[c] = (unsigned)slots;
      }
    p = bar ? bar + 1 : end;
  }
  memcpy(out, tmp, sizeof tmp);
  return true;
}

static bool key_is(const char *k, size_t kl, const char *name) { return strlen(name) == kl && !memcmp(k, name, kl); }

/* The profiler's options (into mld_prof_opt, prof.h); false: bad value. */
static bool apply_prof(const opt_desc_t *d, const char *v, size_t vl) {
  const char *n = d->name;
  bool b;
  long x;
  if (d->lo == 0 && d->hi == 1) {
    if (!parse_bool(v, vl, &b)) return false;
    if (!strcmp(n, "prof")) mld_prof_opt.prof = b;
    else if (!strcmp(n, "prof_active")) mld_prof_opt.active = b;
    else if (!strcmp(n, "prof_final")) mld_prof_opt.final = b;
    else mld_prof_opt.leak = b;
    return true;
  }
  if (!strcmp(n, "prof_sample") || !strcmp(n, "prof_interval")) {
    if (!parse_size(v, vl, &x) || x < d->lo || x > d->hi) return false;
    if (n[5] == 's') mld_prof_opt.sample = (size_t)x; else mld_prof_opt.interval = (size_t)x;
    return true;
  }
  if (!strcmp(n, "prof_prefix")) {
    if (vl < 1 || vl >= MLD_PROF_PREFIX_MAX || memchr(v, 0, vl)) return false;
    memcpy(mld_prof_opt.prefix, v, vl);
    mld_prof_opt.prefix[vl] = 0;
    return true;
  }
  if (!strcmp(n, "prof_signal")) {
    int sig = mld_prof_signal_parse(v, vl);
    if (sig < 0) return false;
    mld_prof_opt.signal = sig;
    mld_prof_signal_name(sig, mld_prof_opt.signame, sizeof mld_prof_opt.signame);
    return true;
  }
  /* prof_seed */
  if (!parse_long(v, vl, &x) || x < 0) return false;
  mld_prof_opt.seed = (uint64_t)x;
  return true;
}

/* The secure variant's defences (into mld_opt): 1 applied, 0 bad value, -1 a valid value the fast variant cannot
 * honour (it has none of these defences: it takes only the value that says so, as with zero_on_free:true). */
static int apply_secure(const opt_desc_t *d, const char *v, size_t vl) {
  const char *n = d->name;
  long x;
  bool b;
  if (!strcmp(n, "delayed_reuse")) {
    if (!parse_bool(v, vl, &b)) return 0;
    if (!MLD_SECURE_BUILD && b) return -1;
    mld_opt.delayed_reuse = b;
    return 1;
  }
  if (!strcmp(n, "secure_noaccess_min")) {
    size_t min = SIZE_MAX;   /* none: no freed block is made inaccessible */
    if (!(vl == 4 && !memcmp(v, "none", 4))) {
      if (!parse_size(v, vl, &x) || x < d->lo || x > d->hi) return 0;
      min = (size_t)x;
    }
    if (!MLD_SECURE_BUILD && min != SIZE_MAX) return -1;
    mld_opt.secure_noaccess_min = min;
    return 1;
  }
  if (!parse_long(v, vl, &x) || x < d->lo || x > d->hi) return 0;
  if (!MLD_SECURE_BUILD && x) return -1;
  if (!strcmp(n, "guard_slab_interval")) mld_opt.guard_slab_interval = (unsigned)x;
  else if (!strcmp(n, "shuffle")) mld_opt.shuffle = (unsigned)x;   /* <= MLD_SHUFFLE_MAX: a chunk's blocks */
  else mld_opt.large_quarantine = (unsigned)x;   /* <= MLD_LARGE_QUARANTINE_MAX: the quarantine's array */
  return 1;
}

static const char *const junk_names[] = { "false", "alloc", "free", "true" };   /* index: MLD_JUNK_* bits */
static const char *const guard_action_names[] = { "abort", "report" };          /* index: MLD_GUARD_* */

/* Sampled guarded allocations (into mld_opt); false: bad value. */
static bool apply_guard(const opt_desc_t *d, const char *v, size_t vl) {
  long x;
  if (!strcmp(d->name, "guard_action")) {
    for (unsigned i = 0; i < 2; i++)
      if (strlen(guard_action_names[i]) == vl && !memcmp(guard_action_names[i], v, vl)) {
        mld_opt.guard_action = (uint8_t)i;
        return true;
      }
    return false;
  }
  if (!strcmp(d->name, "guard_slots")) {
    if (!parse_long(v, vl, &x) || x < d->lo || x > d->hi) return false;
    mld_opt.guard_slots = (unsigned)x;
    return true;
  }
  if (!parse_size(v, vl, &x) || x < d->lo || x > d->hi) return false;   /* guard_sample */
  mld_opt.guard_sample = (size_t)x;
  return true;
}

/* jemalloc's lg_prof_sample:N (2^N bytes between samples) and lg_prof_interval:N (-1: off). */
static bool apply_jemalloc_lg(const conf_src_t *src, const char *k, size_t kl, const char *v, size_t vl) {
  bool interval = key_is(k, kl, "lg_prof_interval");
  if (!interval && !key_is(k, kl, "lg_prof_sample")) return false;
  long x;
  if (!parse_long(v, vl, &x) || x < (interval ? -1 : 0) || x > 40) {
    conf_error(src, k, kl, true, v, vl, "bad value for option", "an integer 0..40 (lg_prof_interval: -1..40)");
    return true;
  }
  if (interval) mld_prof_opt.interval = x < 0 ? 0 : (size_t)1 << x;
  else mld_prof_opt.sample = (size_t)1 << x;
  return true;
}

/* Whether dirty_decay_ms and dirty_decay_max_ms were given: a decay given without a maximum is kept as given, never
 * lengthened (jemalloc's meaning of the key); the default decay lengthens up to the default maximum. */
static bool decay_set, decay_max_set;

static void apply(const conf_src_t *src, const char *k, size_t kl, const char *v, size_t vl) {
  if (src->jemalloc && apply_jemalloc_lg(src, k, kl, v, vl)) return;
  if (src->jemalloc) {
    bool mapped = false;
    for (size_t i = 0; i < sizeof jemalloc_keys / sizeof jemalloc_keys[0]; i++)
      if (strlen(jemalloc_keys[i]) == kl && !memcmp(jemalloc_keys[i], k, kl)) mapped = true;
    if (!mapped) {
      note_ignored(k, kl);
      return;
    }
  }
  const opt_desc_t *d = NULL;
  for (size_t i = 0; i < NDESCS; i++)
    if (strlen(descs[i].name) == kl && !memcmp(descs[i].name, k, kl)) { d = &descs[i]; break; }
  if (!d) {
    conf_error(src, k, kl, false, v, vl, "unknown option", known_keys);
    return;
  }
  long x;
  bool b;
  bool ok = true;
  switch (d->type) {
  case T_UINT:
  case T_LONG:
    ok = parse_long(v, vl, &x) && x >= d->lo && x <= d->hi;
    if (ok && d->type == T_UINT && d->name[0] == 'n') mld_opt.narenas = (unsigned)x;
    if (ok && d->type == T_UINT && d->name[0] == 'p') mld_opt.page_cache = (unsigned)x;
    if (ok && d->type == T_LONG && !strcmp(d->name, "dirty_decay_ms")) {
      mld_opt.dirty_decay_ms = x;
      decay_set = true;
    } else if (ok && d->type == T_LONG) {
      mld_opt.dirty_decay_max_ms = x;
      decay_max_set = true;
    }
    break;
  case T_SIZE:
    ok = parse_size(v, vl, &x) && x >= d->lo && x <= d->hi;
    if (ok) mld_opt.huge_cache_max = (size_t)x;
    break;
  case T_BOOL:
    ok = parse_bool(v, vl, &b);
#ifndef MALLARD_SECURE
    if (ok && b && !strcmp(d->name, "zero_on_free")) {   /* only the secure variant wipes blocks: never claim it */
      conf_error(src, k, kl, true, v, vl, "option not available in this variant",
                 "false (zero_on_free:true needs the secure variant, libmallard-secure)");
      return;
    }
#else
    if (ok && b && !strcmp(d->name, "tcache")) {   /* the secure free checks every block: no cache to turn on */
      conf_error(src, k, kl, true, v, vl, "option not available in this variant", d->accepts);
      return;
    }
#endif
    if (ok) {
      if (!strcmp(d->name, "background_thread")) mld_opt.background_thread = b;
      else if (!strcmp(d->name, "tcache")) mld_opt.tcache = b;
      else if (!strcmp(d->name, "retain")) mld_opt.retain = b;
      else if (!strcmp(d->name, "verbose")) mld_opt.verbose = b;
      else if (!strcmp(d->name, "zero_on_free")) mld_opt.zero_on_free = b;
      else if (!strcmp(d->name, "abort_conf")) mld_opt.abort_conf = b;
      else mld_opt.stats_print = b;
    }
    break;
  case T_THP:
    ok = false;
    for (int i = 0; i < 4; i++)
      if (strlen(thp_names[i]) == vl && !memcmp(thp_names[i], v, vl)) { mld_opt.thp = i == 3 ? -1 : i; ok = true; }
    break;
  case T_STR:
    ok = vl < sizeof mld_opt.stats_print_opts;
    for (size_t i = 0; ok && i < vl; i++) ok = v[i] == 'J' || v[i] == 'a' || v[i] == 'b';   /* bounded: no strspn */
    if (ok) { memcpy(mld_opt.stats_print_opts, v, vl); mld_opt.stats_print_opts[vl] = 0; }
    break;
  case T_SLABS:
    ok = parse_slabs(v, vl, mld_opt.page_slots);
    break;
  case T_PROF:
    ok = apply_prof(d, v, vl);
    break;
  case T_SECURE: {
    int r = apply_secure(d, v, vl);
    if (r < 0) {   /* never claim a defence this variant does not have */
      conf_error(src, k, kl, true, v, vl, "option not available in this variant", d->accepts);
      return;
    }
    ok = r > 0;
    break;
  }
  case T_GUARD:
    ok = apply_guard(d, v, vl);
    break;
  case T_JUNK:
    ok = false;
    for (unsigned i = 0; i < 4; i++)
      if (strlen(junk_names[i]) == vl && !memcmp(junk_names[i], v, vl)) { mld_opt.junk = (uint8_t)i; ok = true; }
    break;
  }
  if (!ok) conf_error(src, k, kl, true, v, vl, "bad value for option", d->accepts);
}

/* Parse "key:value,key:value": items end at a comma or a new line; '#' starts a comment that runs to the end of
 * the line; spaces around items are ignored. Reads exactly len bytes (the text need not be terminated). */
static void parse_conf(conf_src_t *src, const char *s, size_t len) {
  const char *p = s, *end = s + len;
  src->line = 1;
  while (p < end) {
    char ch = *p;
    if (ch == '\n') { src->line++; p++; continue; }
    if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\r') { p++; continue; }
    if (ch == '#') {
      while (p < end && *p != '\n') p++;
      continue;
    }
    const char *item = p;
    while (p < end && *p != ',' && *p != '\n' && *p != '#') p++;
    const char *item_end = p;
    while (item_end > item && (item_end[-1] == ' ' || item_end[-1] == '\t' || item_end[-1] == '\r')) item_end--;
    const char *colon = memchr(item, ':', (size_t)(item_end - item));
    if (!colon) {
      conf_error(src, item, (size_t)(item_end - item), false, "", 0, "missing ':value' in",
                 "key:value items separated by commas");
      continue;
    }
    apply(src, item, (size_t)(colon - item), colon + 1, (size_t)(item_end - colon - 1));
  }
}

/* The file is read whole into this buffer: static, since the parser must not allocate and a thread's stack may be
 * small; initialisation holds the init lock, so it has one user at a time. */
#define CONF_FILE_MAX (64 * 1024)
static char file_buf[CONF_FILE_MAX + 1];

/* The error's name (EACCES...): strerror may translate, and translating may allocate. */
static const char *errname(int err) { return mld_errname(err); }

static const char *file_kind(mode_t m) {
  return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" :
         S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

/* The configuration file: MALLARD_CONF_PATH (not in secure-execution mode) or /etc/mallard.conf. A path that
 * leads to a regular file (through symbolic links or not) is read as a file. A dangling symbolic link's target name
 * is the setting (jemalloc's /etc/malloc.conf convention). Anything else is reported in one line and skipped. */
static void read_conf_file(void) {
  const char *path = secure_getenv("MALLARD_CONF_PATH");   /* test and packaging override of /etc/mallard.conf */
  if (!path) path = "/etc/mallard.conf";
  conf_src_t src = { path, true, 0, false };
  struct stat st;
  if (stat(path, &st) != 0) {
    int err = errno;
    if (err == ENOENT) {
      ssize_t n = readlink(path, file_buf, sizeof file_buf);
      if (n > 0 && (size_t)n < sizeof file_buf) {
        conf_src_t link = { path, false, 0, false };   /* a link's target name is public (ls -l shows it) */
        parse_conf(&link, file_buf, (size_t)n);
      }
      return;   /* no file: the defaults are meant */
    }
    if (err != ENOTDIR) mld_message("mallard: %s: cannot read the configuration file (%s); ignored\n", path, errname(err));
    return;
  }
  if (!S_ISREG(st.st_mode)) {   /* never opened: opening a FIFO or a device may block or have effects */
    mld_message("mallard: %s: not a regular file (%s); ignored\n", path, file_kind(st.st_mode));
    return;
  }
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    mld_message("mallard: %s: cannot read the configuration file (%s); ignored\n", path, errname(errno));
    return;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {   /* replaced between stat and open */
    mld_message("mallard: %s: not a regular file (%s); ignored\n", path, file_kind(st.st_mode));
    close(fd);
    return;
  }
  size_t n = 0;
  while (n < sizeof file_buf) {   /* one byte more than the limit: to tell a full file from a longer one */
    ssize_t r = read(fd, file_buf + n, sizeof file_buf - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      mld_message("mallard: %s: cannot read the configuration file (%s); ignored\n", path, errname(errno));
      close(fd);
      return;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  close(fd);
  if (n > CONF_FILE_MAX) {
    mld_message("mallard: %s: configuration file larger than 64 KiB; ignored whole\n", path);
    return;
  }
  parse_conf(&src, file_buf, n);
}

#ifdef MALLARD_OVERRIDE
/* A jemalloc source: its mapped keys applied, the others named in one line. */
static void parse_jemalloc_conf(const char *name, const char *text) {
  conf_src_t src = { name, false, 0, true };
  ignored_len = 0;
  ignored_buf[0] = 0;
  parse_conf(&src, text, strlen(text));
  if (ignored_len)
    mld_message("mallard: %s: ignored (no Mallard equivalent): %s; see docs/COMPAT.md\n", name, ignored_buf);
}
#endif

/* In secure-execution mode (set-UID, set-GID, file capabilities) the user's environment is not trusted, as glibc
 * does for MALLOC_*: secure_getenv answers NULL for MALLARD_CONF, MALLARD_CONF_PATH and MALLOC_CONF. */
void mld_options_init(void) {
  set_defaults();
  bad_conf = false;
  decay_set = decay_max_set = false;
  conf_src_t prog = { "mallard_conf", false, 0, false }, envsrc = { "MALLARD_CONF", false, 0, false };
#ifdef MALLARD_OVERRIDE
  /* jemalloc's sources first (lowest priority): the program's malloc_conf, then MALLOC_CONF. */
  if (&malloc_conf != NULL && malloc_conf) parse_jemalloc_conf("malloc_conf", malloc_conf);
  const char *je_env = secure_getenv("MALLOC_CONF");
  if (je_env) parse_jemalloc_conf("MALLOC_CONF", je_env);
#endif
  if (&mallard_conf != NULL && mallard_conf) parse_conf(&prog, mallard_conf, strlen(mallard_conf));
  read_conf_file();
  const char *env = secure_getenv("MALLARD_CONF");
  if (env) parse_conf(&envsrc, env, strlen(env));
  if (decay_set && !decay_max_set) mld_opt.dirty_decay_max_ms = mld_opt.dirty_decay_ms < 0 ? 0 : mld_opt.dirty_decay_ms;
#ifdef MALLARD_SECURE
  mld_opt.owner_free_flags = (uint8_t)((MLD_ZERO_ON_FREE_ALWAYS || mld_opt.zero_on_free ? MLD_OWNER_FREE_WIPE : 0) |
                                       (mld_opt.delayed_reuse ? 0 : MLD_OWNER_FREE_FIRST));
#endif
  if (bad_conf && mld_opt.abort_conf) mld_fatal("mallard: invalid configuration and abort_conf:true; aborting\n");
}

/* ---- the printed form of the options in force ---- */
typedef struct fmt_s {
  char *buf;
  size_t len, n;   /* n: bytes the whole text needs (as snprintf counts) */
} fmt_t;

static void put(fmt_t *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(fmt_t *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = vsnprintf(f->n < f->len ? f->buf + f->n : NULL, f->n < f->len ? f->len - f->n : 0, fmt, ap);
  va_end(ap);
  if (r > 0) f->n += (size_t)r;
}

static const char *tf(bool b) { return b ? "true" : "false"; }

/* The options of *o and *po as "key:value,...". Also formats another process's copies (live.c): every string read
 * from them is bounded here, and an out-of-range enum prints as its default. */
size_t mld_options_format_of(const options_t *o, const prof_options_t *po, unsigned auto_arenas, char *buf,
                             size_t len) {
  fmt_t f = { buf, len, 0 };
  char spo[sizeof o->stats_print_opts + 1], signame[sizeof po->signame + 1], prefix[sizeof po->prefix + 1];
  snprintf(spo, sizeof spo, "%.*s", (int)sizeof o->stats_print_opts, o->stats_print_opts);
  snprintf(signame, sizeof signame, "%.*s", (int)sizeof po->signame, po->signame);
  snprintf(prefix, sizeof prefix, "%.*s", (int)sizeof po->prefix, po->prefix);
  if (len) buf[0] = 0;
  put(&f, "narenas:%u,dirty_decay_ms:%ld,dirty_decay_max_ms:%ld,background_thread:%s,retain:%s,thp:%s,verbose:%s,"
          "zero_on_free:%s,tcache:%s,abort_conf:%s,stats_print:%s,stats_print_opts:%s,slab_sizes:",
      o->narenas ? o->narenas : auto_arenas, o->dirty_decay_ms, o->dirty_decay_max_ms, tf(o->background_thread),
      tf(o->retain), o->thp < 0 || o->thp > 2 ? "never" : thp_names[o->thp], tf(o->verbose),
      tf(o->zero_on_free), tf(o->tcache), tf(o->abort_conf), tf(o->stats_print), spo);
  /* Runs of classes with the same page size, as LO-HI:SLOTS ranges of block sizes. */
  for (unsigned c = 0; c < MLD_NUM_CLASSES;) {
    unsigned e = c;
    while (e + 1 < MLD_NUM_CLASSES && o->page_slots[e + 1] == o->page_slots[c]) e++;
    put(&f, "%s%u-%u:%u", c ? "|" : "", mld_class_size[c], mld_class_size[e], o->page_slots[c]);
    c = e + 1;
  }
  put(&f, ",page_cache:%u,huge_cache_max:%zu", o->page_cache, o->huge_cache_max);
  /* secure_noaccess_min: no block is larger than MLD_MAX_REQUEST, so any minimum above it means none */
  if (o->secure_noaccess_min > MLD_MAX_REQUEST) put(&f, ",guard_slab_interval:%u,secure_noaccess_min:none", o->guard_slab_interval);
  else put(&f, ",guard_slab_interval:%u,secure_noaccess_min:%zu", o->guard_slab_interval, o->secure_noaccess_min);
  put(&f, ",large_quarantine:%u,delayed_reuse:%s,shuffle:%u,junk:%s", o->large_quarantine, tf(o->delayed_reuse),
      o->shuffle, junk_names[o->junk & 3]);
  put(&f, ",guard_sample:%zu,guard_slots:%u,guard_action:%s", o->guard_sample, o->guard_slots,
      guard_action_names[o->guard_action & 1]);
  put(&f, ",prof:%s,prof_active:%s,prof_sample:%zu,prof_final:%s,prof_leak:%s,prof_prefix:%s,prof_interval:%zu,"
          "prof_signal:%s,prof_seed:%llu",
      tf(po->prof), tf(po->active), po->sample, tf(po->final), tf(po->leak), prefix, po->interval,
      signame, (unsigned long long)po->seed);
  return f.n;
}

size_t mld_options_format(char *buf, size_t len) {
  return mld_options_format_of(&mld_opt, &mld_prof_opt, mld_auto_arenas, buf, len);
}

void mld_options_announce(void) {
  char line[MLD_OPTIONS_TEXT_MAX + 64];
  int head = snprintf(line, sizeof line, "mallard %s: ", MALLARD_VERSION);
  if (head < 0) return;
  size_t n = (size_t)head + mld_options_format(line + head, sizeof line - (size_t)head - 1);
  if (n > sizeof line - 2) n = sizeof line - 2;
  line[n++] = '\n';
  for (size_t off = 0; off < n;) {
    ssize_t w = write(2, line + off, n - off);
    if (w <= 0) return;
    off += (size_t)w;
  }
}
