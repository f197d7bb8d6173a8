/* options.c — options: defaults, then the program's `mallard_conf`, /etc/mallard.conf and MALLARD_CONF, parsed without allocating. */
#define _GNU_SOURCE
#include "internal.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

options_t mld_opt;

/* A program may define `const char *mallard_conf = "key:value,...";` (lowest priority). */
extern const char *mallard_conf __attribute__((weak));

enum { T_UINT, T_LONG, T_BOOL, T_THP, T_STR, T_SLABS, T_SIZE };
typedef struct opt_desc_s {
  const char *name;
  int type;
  long lo, hi;
  const char *accepts;
} opt_desc_t;

static const opt_desc_t descs[] = {
  { "narenas", T_UINT, 0, MLD_MAX_ARENAS, "an integer 0..64 (0: one per CPU)" },
  { "dirty_decay_ms", T_LONG, -1, 86400000, "milliseconds -1..86400000 (-1: never purge, 0: at once)" },
  { "background_thread", T_BOOL, 0, 1, "true or false" },
  { "retain", T_BOOL, 0, 1, "true or false" },
  { "thp", T_THP, 0, 3, "default, never, madvise or always" },
  { "verbose", T_BOOL, 0, 1, "true or false" },
  { "zero_on_free", T_BOOL, 0, 1, "true or false" },
  { "abort_conf", T_BOOL, 0, 1, "true or false" },
  { "stats_print", T_BOOL, 0, 1, "true or false" },
  { "stats_print_opts", T_STR, 0, 15, "letters: J (JSON), a (no per-arena), b (no per-class)" },
  { "slab_sizes", T_SLABS, 1, MLD_MAX_PAGE_SLOTS, "ranges LO-HI:SLOTS separated by | (SLOTS of 64 KiB, 1..16)" },
  { "page_cache", T_UINT, 0, 64, "an integer 0..64 (empty 64 KiB pages kept per thread)" },
  { "huge_cache_max", T_SIZE, 0, 1L << 40, "a size in bytes, with optional K, M or G (0: no cache)" },
};
#define NDESCS (sizeof descs / sizeof descs[0])

static void set_defaults(void) {
  mld_opt.narenas = 0;
  mld_opt.dirty_decay_ms = 1000;
  mld_opt.background_thread = true;
  mld_opt.retain = false;
  mld_opt.thp = 0;
  mld_opt.verbose = false;
  mld_opt.abort_conf = false;
  mld_opt.stats_print = false;
  mld_opt.stats_print_opts[0] = 0;
  mld_opt.huge_cache_max = 256u << 20;
  mld_opt.page_cache = 4;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    size_t bs = mld_class_size[c];
    /* Small classes use one 64 KiB slot; medium ones enough slots for ~8 blocks, at most 1 MiB. */
    size_t slots = bs <= MLD_SMALL_MAX ? 1 : (8 * bs + MLD_SLOT_SIZE - 1) / MLD_SLOT_SIZE;
    mld_opt.page_slots[c] = (unsigned)(slots > MLD_MAX_PAGE_SLOTS ? MLD_MAX_PAGE_SLOTS : slots);
  }
}

static bool bad_conf;

/* One line per problem: where, which key, which value, what is accepted. */
static void conf_error(const char *src, const char *key, size_t klen, const char *val, size_t vlen, const char *why,
                       const char *accepts) {
  mld_message("mallard: %s: %s '%.*s' (value '%.*s'); accepted: %s; %s\n", src, why, (int)klen, key, (int)vlen, val,
              accepts, mld_opt.abort_conf ? "aborting (abort_conf:true)" : "the default stays in force");
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
  if (errno || *end) return false;
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
        if ((size_t)slots * MLD_SLOT_SIZE < mld_class_size[c]) return false;   /* a page must hold a block */
        tmp[c] = (unsigned)slots;
      }
    p = bar ? bar + 1 : end;
  }
  memcpy(out, tmp, sizeof tmp);
  return true;
}

static void apply(const char *src, const char *k, size_t kl, const char *v, size_t vl) {
  const opt_desc_t *d = NULL;
  for (size_t i = 0; i < NDESCS; i++)
    if (strlen(descs[i].name) == kl && !memcmp(descs[i].name, k, kl)) { d = &descs[i]; break; }
  if (!d) {
    conf_error(src, k, kl, v, vl, "unknown option",
               "narenas, dirty_decay_ms, background_thread, retain, thp, verbose, abort_conf, stats_print, "
               "stats_print_opts, slab_sizes, page_cache, huge_cache_max, zero_on_free");
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
    if (ok && d->type == T_LONG) mld_opt.dirty_decay_ms = x;
    break;
  case T_SIZE:
    ok = parse_size(v, vl, &x) && x >= d->lo && x <= d->hi;
    if (ok) mld_opt.huge_cache_max = (size_t)x;
    break;
  case T_BOOL:
    ok = parse_bool(v, vl, &b);
    if (ok) {
      if (!strcmp(d->name, "background_thread")) mld_opt.background_thread = b;
      else if (!strcmp(d->name, "retain")) mld_opt.retain = b;
      else if (!strcmp(d->name, "verbose")) mld_opt.verbose = b;
      else if (!strcmp(d->name, "zero_on_free")) mld_opt.zero_on_free = b;
      else if (!strcmp(d->name, "abort_conf")) mld_opt.abort_conf = b;
      else mld_opt.stats_print = b;
    }
    break;
  case T_THP: {
    static const char *names[] = { "default", "madvise", "always", "never" };
    ok = false;
    for (int i = 0; i < 4; i++)
      if (strlen(names[i]) == vl && !memcmp(names[i], v, vl)) { mld_opt.thp = i == 3 ? -1 : i; ok = true; }
    break;
  }
  case T_STR:
    ok = vl < sizeof mld_opt.stats_print_opts && strspn(v, "Jab") >= vl;
    if (ok) { memcpy(mld_opt.stats_print_opts, v, vl); mld_opt.stats_print_opts[vl] = 0; }
    break;
  case T_SLABS:
    ok = parse_slabs(v, vl, mld_opt.page_slots);
    break;
  }
  if (!ok) {
    conf_error(src, k, kl, v, vl, "bad value for option", d->accepts);
  }
}

/* Parse "key:value,key:value" (whitespace around items ignored). */
static void parse_conf(const char *src, const char *s, size_t len) {
  const char *p = s, *end = s + len;
  while (p < end) {
    while (p < end && (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t')) p++;
    if (p >= end) break;
    const char *item = p;
    while (p < end && *p != ',' && *p != '\n') p++;
    const char *item_end = p;
    while (item_end > item && (item_end[-1] == ' ' || item_end[-1] == '\t' || item_end[-1] == '\r')) item_end--;
    if (*item == '#') continue;   /* a comment line in the file */
    const char *colon = memchr(item, ':', (size_t)(item_end - item));
    if (!colon) { conf_error(src, item, (size_t)(item_end - item), "", 0, "missing ':value' in", "key:value items separated by commas"); continue; }
    apply(src, item, (size_t)(colon - item), colon + 1, (size_t)(item_end - colon - 1));
  }
}

static void read_conf_file(void) {
  const char *path = getenv("MALLARD_CONF_PATH");   /* test and packaging override of /etc/mallard.conf */
  if (!path) path = "/etc/mallard.conf";
  char buf[1024];
  ssize_t n = readlink(path, buf, sizeof buf - 1);   /* like /etc/malloc.conf: a symlink's target name is the setting */
  if (n > 0) { parse_conf(path, buf, (size_t)n); return; }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n > 0) parse_conf(path, buf, (size_t)n);
}

void mld_options_init(void) {
  set_defaults();
  if (&mallard_conf != NULL && mallard_conf) parse_conf("mallard_conf", mallard_conf, strlen(mallard_conf));
  read_conf_file();
  const char *env = getenv("MALLARD_CONF");
  if (env) parse_conf("MALLARD_CONF", env, strlen(env));
  if (bad_conf && mld_opt.abort_conf) mld_fatal("mallard: invalid configuration and abort_conf:true; aborting\n");
}
