/* control/live.c — statistics of another running process: the self-describing root it exports, and the reader that copies its counters through that root. */
#define _GNU_SOURCE
#include "core/core.h"
#include "mallard.h"
#include "control/control.h"
#include "prof/prof.h"
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* The root (docs/STATS.md, version 3): a fixed header, then a table of fields, each naming what it is (id), where it
 * is (an address in the process, an offset inside a record, or a value), and its size and count. A reader finds every
 * figure through the table, never through its own struct layout: one reader reads any build of this version, and a
 * root it cannot validate is refused. The root and its table are constants (relocated once by the loader): nothing
 * is written at run time but the options text, once, at initialisation. */
#define LIVE_MAGIC "MLDLIVE"          /* 8 bytes with its NUL */
#define LIVE_VERSION 3u
#define LIVE_MAX_HEAPS 65536u         /* bound of the heap-list walk: a list changing under the reader may loop */
#define LIVE_TRIES 4                  /* heap walks retried while exiting threads move counters into dead_stats */
#define LIVE_MAX_HEADER 4096u         /* bounds of what a reader accepts from a root (all checked before use) */
#define LIVE_MAX_FIELDS 256u
#define LIVE_MAX_FIELD_SIZE 256u
#define LIVE_MAX_RECORD 65536u        /* a record copied whole: a heap's statistics, an arena */
#define LIVE_MAX_COUNT 65536u
#define LIVE_MAX_ARENA_PTRS 4096u
#define LIVE_MAX_SLOTS 4096u

enum { LIVE_GLOBAL = 1, LIVE_MEMBER = 2, LIVE_CONST = 3 };   /* what a field's `where` holds */

/* Field ids: fixed for ever (a new field takes a new id; a reader ignores ids it does not know). */
enum {
  LF_INITIALIZED = 1, LF_START_MS, LF_HEAPS_ALL, LF_DEAD_STATS, LF_ORPHAN_STATS, LF_ARENAS, LF_NARENAS,
  LF_HUGE_ACTIVE, LF_HUGE_CACHED, LF_META_BYTES, LF_MAPPED_BYTES, LF_INVALID_FREES, LF_OPTIONS_TEXT, LF_CLASS_SIZE,
  LF_PAGE_SLOTS, LF_DIRTY_DECAY_MS, LF_BACKGROUND_THREAD, LF_RETAIN, LF_THP, LF_HUGE_CACHE_MAX, LF_PAGE_CACHE,
  LF_SLOT_SIZE, LF_USABLE_SLOTS, LF_HUGE_HEADER, LF_ARENA_SIZE,
  LF_HEAP_NEXT_ALL, LF_HEAP_STATS,
  LF_HS_CLS, LF_HS_LARGE_NMALLOC, LF_HS_LARGE_NFREE, LF_HS_HUGE_NMALLOC, LF_HS_HUGE_NFREE, LF_HS_REMOTE_FREES,
  LF_CS_NMALLOC /* retired in version 3 */, LF_CS_NFREE, LF_CS_NREFILLS, LF_CS_NPAGES, LF_CS_NPAGES_CACHED,
  LF_CS_NPAGES_RELEASED,
  LF_AR_NTHREADS, LF_AR_NTHREADS_TOTAL, LF_AR_NSEGMENTS, LF_AR_DIRTY_SLOTS, LF_AR_PURGED_SLOTS, LF_AR_NPURGE_PASSES,
  LF_AR_NMADVISE, LF_AR_PURGED_TOTAL, LF_AR_LARGE_ACTIVE, LF_AR_LOCK_OPS, LF_AR_LOCK_CONTENDED, LF_AR_LOCK_WAIT_NS,
  LF_PAGE_SIZE,
  LF_HS_NMALLOC,                      /* version 3: the classes' malloc counts, out of their records */
  LF_COUNT
};

typedef struct live_field_s {
  uint32_t id;
  uint32_t kind;                      /* LIVE_GLOBAL, LIVE_MEMBER or LIVE_CONST */
  uint32_t size;                      /* bytes of one element */
  uint32_t count;                     /* elements (1 unless an array) */
  union { const volatile void *addr; uint64_t value; } where;   /* address, offset in its record, or value */
} live_field_t;

typedef struct live_root_s {
  char magic[8];
  uint32_t version;
  uint32_t header_size;               /* sizeof(live_root_t): a later version may only grow it */
  char lib_version[16];               /* MALLARD_VERSION, NUL-terminated */
  uint32_t nfields;
  uint32_t field_size;                /* sizeof(live_field_t): a later version may only grow it */
  const live_field_t *fields;
} live_root_t;
_Static_assert(sizeof(live_root_t) == 48 && sizeof(live_field_t) == 24 && sizeof(void *) == 8,
               "the root's layout is documented byte by byte in docs/STATS.md (64-bit processes)");

/* The options as text, formatted once at initialisation (they never change after it). */
static char live_options_text[MLD_OPTIONS_TEXT_MAX];

/* Run-time geometry (the page size is read at start): set once, before the root says "ready". */
static uint64_t live_huge_header, live_page_size;

void mld_live_init(void) {
  mld_options_format(live_options_text, sizeof live_options_text);
  live_huge_header = mld_huge_header();
  live_page_size = mld_os_page();
}

#define F_G(id, var) { id, LIVE_GLOBAL, sizeof(var), 1, { .addr = &(var) } }
#define F_GA(id, arr, n) { id, LIVE_GLOBAL, sizeof((arr)[0]), n, { .addr = (arr) } }
#define F_M(id, type, member) { id, LIVE_MEMBER, sizeof(((type *)0)->member), 1, { .value = offsetof(type, member) } }
#define F_C(id, v) { id, LIVE_CONST, sizeof(uint64_t), 1, { .value = (v) } }
#define F_LOCKST(id, m) { id, LIVE_MEMBER, sizeof(uint64_t), 1, \
                        { .value = offsetof(arena_t, lock_stats) + offsetof(lock_stats_t, m) } }

static const live_field_t live_fields[] = {
  F_G(LF_INITIALIZED, mld_initialized), F_G(LF_START_MS, mld_start_ms), F_G(LF_HEAPS_ALL, mld_heaps_all),
  F_G(LF_DEAD_STATS, mld_dead_stats), F_G(LF_ORPHAN_STATS, mld_orphan_stats),
  F_GA(LF_ARENAS, mld_arenas, MLD_MAX_ARENAS), F_G(LF_NARENAS, mld_narenas),
  F_G(LF_HUGE_ACTIVE, mld_huge_active), F_G(LF_HUGE_CACHED, mld_huge_cached), F_G(LF_META_BYTES, mld_meta_bytes),
  F_G(LF_MAPPED_BYTES, mld_mapped_bytes), F_G(LF_INVALID_FREES, mld_invalid_count),
  F_GA(LF_OPTIONS_TEXT, live_options_text, MLD_OPTIONS_TEXT_MAX), F_GA(LF_CLASS_SIZE, mld_class_size, MLD_NUM_CLASSES),
  F_GA(LF_PAGE_SLOTS, mld_opt.page_slots, MLD_NUM_CLASSES), F_G(LF_DIRTY_DECAY_MS, mld_opt.dirty_decay_ms),
  F_G(LF_BACKGROUND_THREAD, mld_opt.background_thread), F_G(LF_RETAIN, mld_opt.retain), F_G(LF_THP, mld_opt.thp),
  F_G(LF_HUGE_CACHE_MAX, mld_opt.huge_cache_max), F_G(LF_PAGE_CACHE, mld_opt.page_cache),
  F_C(LF_SLOT_SIZE, MLD_SLOT_SIZE), F_C(LF_USABLE_SLOTS, MLD_USABLE_SLOTS), F_G(LF_HUGE_HEADER, live_huge_header),
  F_C(LF_ARENA_SIZE, sizeof(arena_t)),
  F_M(LF_HEAP_NEXT_ALL, heap_t, next_all), F_M(LF_HEAP_STATS, heap_t, stats),
  { LF_HS_CLS, LIVE_MEMBER, sizeof(class_stats_t), MLD_NUM_CLASSES, { .value = offsetof(heap_stats_t, cls) } },
  F_M(LF_HS_LARGE_NMALLOC, heap_stats_t, large_nmalloc), F_M(LF_HS_LARGE_NFREE, heap_stats_t, large_nfree),
  F_M(LF_HS_HUGE_NMALLOC, heap_stats_t, huge_nmalloc), F_M(LF_HS_HUGE_NFREE, heap_stats_t, huge_nfree),
  F_M(LF_HS_REMOTE_FREES, heap_stats_t, remote_frees),
  { LF_HS_NMALLOC, LIVE_MEMBER, sizeof(uint64_t), MLD_NUM_CLASSES, { .value = offsetof(heap_stats_t, nmalloc) } },
  F_M(LF_CS_NFREE, class_stats_t, nfree),
  F_M(LF_CS_NREFILLS, class_stats_t, nrefills), F_M(LF_CS_NPAGES, class_stats_t, npages),
  F_M(LF_CS_NPAGES_CACHED, class_stats_t, npages_cached), F_M(LF_CS_NPAGES_RELEASED, class_stats_t, npages_released),
  F_M(LF_AR_NTHREADS, arena_t, nthreads), F_M(LF_AR_NTHREADS_TOTAL, arena_t, nthreads_total),
  F_M(LF_AR_NSEGMENTS, arena_t, nsegments), F_M(LF_AR_DIRTY_SLOTS, arena_t, dirty_slots),
  F_M(LF_AR_PURGED_SLOTS, arena_t, purged_slots), F_M(LF_AR_NPURGE_PASSES, arena_t, npurge_passes),
  F_M(LF_AR_NMADVISE, arena_t, nmadvise), F_M(LF_AR_PURGED_TOTAL, arena_t, purged_bytes_total),
  F_M(LF_AR_LARGE_ACTIVE, arena_t, large_active), F_LOCKST(LF_AR_LOCK_OPS, ops), F_LOCKST(LF_AR_LOCK_CONTENDED, contended),
  F_LOCKST(LF_AR_LOCK_WAIT_NS, wait_ns), F_G(LF_PAGE_SIZE, live_page_size),
};
_Static_assert(sizeof live_fields / sizeof live_fields[0] == LF_COUNT - 2, "one field for every id but the retired one");

MLD_EXPORT const live_root_t mallard_live_root = {
  LIVE_MAGIC, LIVE_VERSION, sizeof(live_root_t), MALLARD_VERSION,
  sizeof live_fields / sizeof live_fields[0], sizeof(live_field_t), live_fields,
};

/* ---- the reader: everything below reads another process's memory and trusts none of it ---- */

/* What the reader expects of each id: the kind, the type, the record a member lies in, and the count. */
enum { T_INT = 1, T_SINT, T_PTR, T_TEXT, T_REC };                  /* T_REC: a whole record, size bounded */
enum { R_NONE, R_HEAP, R_HS, R_CS, R_ARENA };                      /* records that members lie in */
enum { N_ONE, N_CLASSES, N_ARENAS, N_TEXT };
typedef struct want_s { uint8_t kind, type, rec, count; } want_t;
static const want_t live_want[LF_COUNT] = {
  [LF_INITIALIZED] = { LIVE_GLOBAL, T_SINT, R_NONE, N_ONE }, [LF_START_MS] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE },
  [LF_HEAPS_ALL] = { LIVE_GLOBAL, T_PTR, R_NONE, N_ONE }, [LF_DEAD_STATS] = { LIVE_GLOBAL, T_REC, R_NONE, N_ONE },
  [LF_ORPHAN_STATS] = { LIVE_GLOBAL, T_REC, R_NONE, N_ONE }, [LF_ARENAS] = { LIVE_GLOBAL, T_PTR, R_NONE, N_ARENAS },
  [LF_NARENAS] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE }, [LF_HUGE_ACTIVE] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE },
  [LF_HUGE_CACHED] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE }, [LF_META_BYTES] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE },
  [LF_MAPPED_BYTES] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE }, [LF_INVALID_FREES] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE },
  [LF_OPTIONS_TEXT] = { LIVE_GLOBAL, T_TEXT, R_NONE, N_TEXT },
  [LF_CLASS_SIZE] = { LIVE_GLOBAL, T_INT, R_NONE, N_CLASSES }, [LF_PAGE_SLOTS] = { LIVE_GLOBAL, T_INT, R_NONE, N_CLASSES },
  [LF_DIRTY_DECAY_MS] = { LIVE_GLOBAL, T_SINT, R_NONE, N_ONE },
  [LF_BACKGROUND_THREAD] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE }, [LF_RETAIN] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE },
  [LF_THP] = { LIVE_GLOBAL, T_SINT, R_NONE, N_ONE }, [LF_HUGE_CACHE_MAX] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE },
  [LF_PAGE_CACHE] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE },
  [LF_SLOT_SIZE] = { LIVE_CONST, T_INT, R_NONE, N_ONE }, [LF_USABLE_SLOTS] = { LIVE_CONST, T_INT, R_NONE, N_ONE },
  [LF_HUGE_HEADER] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE }, [LF_ARENA_SIZE] = { LIVE_CONST, T_INT, R_NONE, N_ONE },
  [LF_HEAP_NEXT_ALL] = { LIVE_MEMBER, T_PTR, R_HEAP, N_ONE }, [LF_HEAP_STATS] = { LIVE_MEMBER, T_REC, R_HEAP, N_ONE },
  [LF_HS_CLS] = { LIVE_MEMBER, T_REC, R_HS, N_CLASSES },
  [LF_HS_LARGE_NMALLOC] = { LIVE_MEMBER, T_INT, R_HS, N_ONE }, [LF_HS_LARGE_NFREE] = { LIVE_MEMBER, T_INT, R_HS, N_ONE },
  [LF_HS_HUGE_NMALLOC] = { LIVE_MEMBER, T_INT, R_HS, N_ONE }, [LF_HS_HUGE_NFREE] = { LIVE_MEMBER, T_INT, R_HS, N_ONE },
  [LF_HS_REMOTE_FREES] = { LIVE_MEMBER, T_INT, R_HS, N_ONE },
  [LF_CS_NFREE] = { LIVE_MEMBER, T_INT, R_CS, N_ONE },
  [LF_CS_NREFILLS] = { LIVE_MEMBER, T_INT, R_CS, N_ONE }, [LF_CS_NPAGES] = { LIVE_MEMBER, T_INT, R_CS, N_ONE },
  [LF_CS_NPAGES_CACHED] = { LIVE_MEMBER, T_INT, R_CS, N_ONE },
  [LF_CS_NPAGES_RELEASED] = { LIVE_MEMBER, T_INT, R_CS, N_ONE },
  [LF_AR_NTHREADS] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE }, [LF_AR_NTHREADS_TOTAL] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE },
  [LF_AR_NSEGMENTS] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE }, [LF_AR_DIRTY_SLOTS] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE },
  [LF_AR_PURGED_SLOTS] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE },
  [LF_AR_NPURGE_PASSES] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE }, [LF_AR_NMADVISE] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE },
  [LF_AR_PURGED_TOTAL] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE },
  [LF_AR_LARGE_ACTIVE] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE }, [LF_AR_LOCK_OPS] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE },
  [LF_AR_LOCK_CONTENDED] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE },
  [LF_AR_LOCK_WAIT_NS] = { LIVE_MEMBER, T_INT, R_ARENA, N_ONE }, [LF_PAGE_SIZE] = { LIVE_GLOBAL, T_INT, R_NONE, N_ONE },
  [LF_HS_NMALLOC] = { LIVE_MEMBER, T_INT, R_HS, N_CLASSES },
};

/* The reader's state: one reader at a time (live_lock), every buffer static and bounded, nothing allocated. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static char live_why[192];                          /* why the last root was refused (mallard_live_reason) */
static live_field_t F[LF_COUNT];                    /* the target's fields by id; id 0: absent */
static uint64_t rec_size[R_ARENA + 1];              /* sizes of the records members lie in (R_HEAP: unbounded) */
static unsigned char table_buf[LIVE_MAX_FIELDS * LIVE_MAX_FIELD_SIZE];
static unsigned char rec_a[LIVE_MAX_RECORD], rec_b[LIVE_MAX_RECORD], rec_c[LIVE_MAX_RECORD];
static uint64_t arena_ptrs[LIVE_MAX_ARENA_PTRS];

static int refuse(int e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(int e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(live_why, sizeof live_why, fmt, ap);
  va_end(ap);
  return e;
}

/* ---- reading another process's memory: the kernel allows it to the same user (ptrace rules) or root ---- */
static int rd(pid_t pid, uint64_t addr, void *buf, size_t n) {
  struct iovec l = { buf, n }, r = { (void *)(uintptr_t)addr, n };
  long got = mld_os_read_process(pid, &l, &r, 1);
  if (got == (ssize_t)n) return 0;
  return got < 0 ? errno : EFAULT;   /* a partial read: part of the range is not mapped (any more) */
}

/* A global field read whole (its size and count were bounded by check_fields). */
static int rd_field(pid_t pid, unsigned id, void *buf, size_t cap) {
  uint64_t n = (uint64_t)F[id].size * F[id].count;
  if (n > cap) n = cap;   /* only the options text may be longer than its buffer: its NUL is looked for in cap */
  int e = rd(pid, F[id].where.value, buf, (size_t)n);
  if (e == EFAULT) return refuse(e, "field %u at 0x%llx is not readable in the process", id,
                                 (unsigned long long)F[id].where.value);
  return e;
}

/* An integer of 1, 2, 4 or 8 bytes at p (the target's byte order is ours: it runs on this machine). */
static uint64_t get_u(const unsigned char *p, uint32_t size) {
  uint8_t v1; uint16_t v2; uint32_t v4; uint64_t v8;
  switch (size) {
  case 1: memcpy(&v1, p, 1); return v1;
  case 2: memcpy(&v2, p, 2); return v2;
  case 4: memcpy(&v4, p, 4); return v4;
  default: memcpy(&v8, p, 8); return v8;
  }
}
static int64_t get_s(const unsigned char *p, uint32_t size) {
  uint64_t v = get_u(p, size);
  unsigned shift = 64 - 8 * size;   /* sign-extended from its own width */
  return shift ? (int64_t)(v << shift) >> shift : (int64_t)v;
}
/* A member of a record copied into rec (check_fields bounded where + size within the record). */
static uint64_t member(const unsigned char *rec, unsigned id) { return get_u(rec + F[id].where.value, F[id].size); }

static int rd_int(pid_t pid, unsigned id, uint64_t *v) {
  unsigned char b[8];
  int e = rd_field(pid, id, b, sizeof b);
  if (!e) *v = get_u(b, F[id].size);
  return e;
}

/* The table read and checked: every id the reader needs present once, of its kind, type and count; members within
 * their records; records and counts bounded. Ids the reader does not know are skipped (a later build may add some). */
static int check_fields(pid_t pid, const live_root_t *r) {
  if (r->nfields == 0 || r->nfields > LIVE_MAX_FIELDS || r->field_size < sizeof(live_field_t) ||
      r->field_size > LIVE_MAX_FIELD_SIZE)
    return refuse(EPROTO, "its field table has %u entries of %u bytes (at most %u of %u..%u)", r->nfields,
                  r->field_size, LIVE_MAX_FIELDS, (unsigned)sizeof(live_field_t), LIVE_MAX_FIELD_SIZE);
  int e = rd(pid, (uint64_t)(uintptr_t)r->fields, table_buf, (size_t)r->nfields * r->field_size);
  if (e == EFAULT) return refuse(e, "its field table at %p is not readable in the process", (const void *)r->fields);
  if (e) return e;
  memset(F, 0, sizeof F);
  for (uint32_t i = 0; i < r->nfields; i++) {
    live_field_t f;
    memcpy(&f, table_buf + (size_t)i * r->field_size, sizeof f);
    if (f.id == 0 || f.id >= LF_COUNT) continue;
    if (F[f.id].id) return refuse(EPROTO, "field %u appears twice", f.id);
    F[f.id] = f;
  }
  for (unsigned id = 1; id < LF_COUNT; id++) {
    const want_t *w = &live_want[id];
    const live_field_t *f = &F[id];
    if (!w->kind) continue;   /* a retired id: not read, not asked for */
    if (!f->id) return refuse(EPROTO, "field %u is missing", id);
    if (f->kind != w->kind) return refuse(EPROTO, "field %u is of kind %u, not %u", id, f->kind, w->kind);
    bool size_ok = w->type == T_INT || w->type == T_SINT ? f->size == 1 || f->size == 2 || f->size == 4 || f->size == 8
                 : w->type == T_PTR ? f->size == sizeof(uint64_t)
                 : w->type == T_TEXT ? f->size == 1
                 : f->size >= 1 && f->size <= LIVE_MAX_RECORD;
    bool count_ok = w->count == N_ONE ? f->count == 1
                  : w->count == N_CLASSES ? f->count == MLD_NUM_CLASSES
                  : w->count == N_ARENAS ? f->count >= 1 && f->count <= LIVE_MAX_ARENA_PTRS
                  : f->count >= 1 && f->count <= LIVE_MAX_COUNT;
    if (!size_ok || !count_ok) return refuse(EPROTO, "field %u has elements of %u bytes and a count of %u", id, f->size,
                                             f->count);
    if (w->kind == LIVE_GLOBAL && !f->where.value) return refuse(EPROTO, "field %u has a null address", id);
  }
  /* The records members lie in, and the constants the figures need. */
  rec_size[R_HEAP] = LIVE_MAX_RECORD;   /* a heap is read member by member: its offsets are only bounded */
  rec_size[R_HS] = F[LF_HEAP_STATS].size;
  rec_size[R_CS] = F[LF_HS_CLS].size;
  rec_size[R_ARENA] = F[LF_ARENA_SIZE].where.value;
  if (rec_size[R_ARENA] < 1 || rec_size[R_ARENA] > LIVE_MAX_RECORD)
    return refuse(EPROTO, "its arena record is %llu bytes (at most %u)", (unsigned long long)rec_size[R_ARENA],
                  LIVE_MAX_RECORD);
  if (F[LF_DEAD_STATS].size != rec_size[R_HS] || F[LF_ORPHAN_STATS].size != rec_size[R_HS])
    return refuse(EPROTO, "its heap statistics records differ in size (%u, %u, %llu bytes)", F[LF_DEAD_STATS].size,
                  F[LF_ORPHAN_STATS].size, (unsigned long long)rec_size[R_HS]);
  for (unsigned id = 1; id < LF_COUNT; id++) {
    const live_field_t *f = &F[id];
    if (live_want[id].kind != LIVE_MEMBER) continue;
    uint64_t end = (uint64_t)f->size * f->count;   /* both bounded above: no overflow */
    uint64_t cap = rec_size[live_want[id].rec];
    if (f->where.value > cap || end > cap - f->where.value)
      return refuse(EPROTO, "field %u (offset %llu, %llu bytes) lies outside its record of %llu bytes", id,
                    (unsigned long long)f->where.value, (unsigned long long)end, (unsigned long long)cap);
  }
  if (F[LF_SLOT_SIZE].where.value != MLD_SLOT_SIZE)
    return refuse(EPROTO, "its slots are of %llu bytes, the reader's of %zu", (unsigned long long)F[LF_SLOT_SIZE].where.value,
                  MLD_SLOT_SIZE);
  if (F[LF_USABLE_SLOTS].where.value < 1 || F[LF_USABLE_SLOTS].where.value > LIVE_MAX_SLOTS)
    return refuse(EPROTO, "its segment geometry (%llu usable slots) is out of bounds",
                  (unsigned long long)F[LF_USABLE_SLOTS].where.value);
  return 0;
}

/* The size-class table must be the reader's own: the report's rows and figures are computed with it. */
static int check_classes(pid_t pid) {
  unsigned char b[MLD_NUM_CLASSES * 8];
  int e = rd_field(pid, LF_CLASS_SIZE, b, sizeof b);
  if (e) return e;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++)
    if (get_u(b + (size_t)c * F[LF_CLASS_SIZE].size, F[LF_CLASS_SIZE].size) != mld_class_size[c])
      return refuse(EPROTO, "its size-class table differs from the reader's (class %u)", c);
  return 0;
}

/* A heap-statistics record (copied whole) into the reader's own struct, through the member fields. */
static void hs_extract(const unsigned char *rec, heap_stats_t *out) {
  memset(out, 0, sizeof *out);
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    const unsigned char *cr = rec + F[LF_HS_CLS].where.value + (size_t)c * F[LF_HS_CLS].size;
    class_stats_t *cs = &out->cls[c];
    cs->nfree = member(cr, LF_CS_NFREE);
    cs->nrefills = member(cr, LF_CS_NREFILLS);
    cs->npages = member(cr, LF_CS_NPAGES);
    cs->npages_cached = member(cr, LF_CS_NPAGES_CACHED);
    cs->npages_released = member(cr, LF_CS_NPAGES_RELEASED);
  }
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++)
    out->nmalloc[c] = get_u(rec + F[LF_HS_NMALLOC].where.value + (size_t)c * F[LF_HS_NMALLOC].size, F[LF_HS_NMALLOC].size);
  out->large_nmalloc = member(rec, LF_HS_LARGE_NMALLOC);
  out->large_nfree = member(rec, LF_HS_LARGE_NFREE);
  out->huge_nmalloc = member(rec, LF_HS_HUGE_NMALLOC);
  out->huge_nfree = member(rec, LF_HS_HUGE_NFREE);
  out->remote_frees = member(rec, LF_HS_REMOTE_FREES);
}

/* next_all and the statistics record of one remote heap, in one call; false: not readable (a stale link). */
static bool rd_heap(pid_t pid, uint64_t h, uint64_t *next, unsigned char *st) {
  uint64_t on = F[LF_HEAP_NEXT_ALL].where.value, os = F[LF_HEAP_STATS].where.value;   /* both < LIVE_MAX_RECORD */
  if (h > UINT64_MAX - LIVE_MAX_RECORD) return false;
  struct iovec l[2] = { { next, sizeof *next }, { st, rec_size[R_HS] } };
  struct iovec r[2] = { { (void *)(uintptr_t)(h + on), sizeof *next }, { (void *)(uintptr_t)(h + os), rec_size[R_HS] } };
  long got = mld_os_read_process(pid, l, r, 2);
  return got == (ssize_t)(sizeof *next + rec_size[R_HS]);
}

/* The heap counters summed: exited threads, threads without a heap, then the live heaps. Without the registry lock
 * a thread exiting during the walk may be counted twice or not at all: the walk is repeated while dead_stats moves. */
static int remote_heaps(pid_t pid, heap_stats_t *sum) {
  static heap_stats_t one;   /* the reader holds live_lock */
  size_t n_hs = rec_size[R_HS];
  int e = 0;
  for (int t = 0; t < LIVE_TRIES; t++) {
    uint64_t h;
    if ((e = rd_field(pid, LF_DEAD_STATS, rec_a, n_hs)) || (e = rd_field(pid, LF_ORPHAN_STATS, rec_b, n_hs)) ||
        (e = rd_int(pid, LF_HEAPS_ALL, &h)))
      return e;
    memset(sum, 0, sizeof *sum);
    hs_extract(rec_a, &one);
    mld_stats_add(sum, &one);
    hs_extract(rec_b, &one);
    mld_stats_add(sum, &one);
    for (unsigned n = 0; h && n < LIVE_MAX_HEAPS; n++) {
      if (!rd_heap(pid, h, &h, rec_c)) break;   /* a stale link read mid-change: the rest is not counted this time */
      hs_extract(rec_c, &one);
      mld_stats_add(sum, &one);
    }
    if (rd_field(pid, LF_DEAD_STATS, rec_b, n_hs) || !memcmp(rec_a, rec_b, n_hs)) break;
  }
  return 0;
}

/* Is one of the process's threads the purging thread (background.c names it)? Read without allocating. */
static bool remote_purge_thread(pid_t pid) {
  char path[64], buf[4096];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return false;
  bool found = false;
  long n;
  while (!found && (n = mld_os_getdents(dfd, buf, sizeof buf)) > 0) {
    for (long off = 0; off < n && !found;) {
      const char *d_name = buf + off + 19;   /* struct linux_dirent64: ino 8, off 8, reclen 2, type 1, name */
      unsigned short reclen;
      memcpy(&reclen, buf + off + 16, sizeof reclen);
      if (!reclen) break;
      off += reclen;
      if (d_name[0] < '0' || d_name[0] > '9') continue;
      char cpath[96], comm[32];
      snprintf(cpath, sizeof cpath, "/proc/%d/task/%.20s/comm", (int)pid, d_name);
      int fd = open(cpath, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ssize_t k = read(fd, comm, sizeof comm - 1);
      close(fd);
      comm[k > 0 ? k : 0] = 0;
      found = !strcmp(comm, "mallard-purge\n");
    }
  }
  close(dfd);
  return found;
}

/* The options: the text kept by the target (NUL-terminated within what is read, control bytes shown as '?'), and
 * the values the report shows. */
static int remote_options(pid_t pid, stats_snapshot_t *s) {
  unsigned char b[MLD_NUM_CLASSES * 8];
  uint64_t v;
  int e;
  if ((e = rd_field(pid, LF_OPTIONS_TEXT, s->options_text, sizeof s->options_text))) return e;
  size_t cap = F[LF_OPTIONS_TEXT].count < sizeof s->options_text ? F[LF_OPTIONS_TEXT].count : sizeof s->options_text;
  size_t len = strnlen(s->options_text, cap);   /* its NUL within what was read, and within its own count */
  if (len == cap) return refuse(EPROTO, "its options text is not terminated within %zu bytes", cap);
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)s->options_text[i] < 0x20 || s->options_text[i] == 0x7f) s->options_text[i] = '?';
  if ((e = rd_field(pid, LF_PAGE_SLOTS, b, sizeof b))) return e;
  for (unsigned c = 0; c < MLD_NUM_CLASSES; c++) {
    uint64_t slots = get_u(b + (size_t)c * F[LF_PAGE_SLOTS].size, F[LF_PAGE_SLOTS].size);
    s->page_slots[c] = slots <= MLD_MAX_PAGE_SLOTS ? (unsigned)slots : 0;
  }
  unsigned char one[8];
  if ((e = rd_field(pid, LF_DIRTY_DECAY_MS, one, sizeof one))) return e;
  s->dirty_decay_ms = (long)get_s(one, F[LF_DIRTY_DECAY_MS].size);
  if ((e = rd_field(pid, LF_THP, one, sizeof one))) return e;
  s->thp = (int)get_s(one, F[LF_THP].size);
  if ((e = rd_int(pid, LF_BACKGROUND_THREAD, &v))) return e;
  s->background_thread = v != 0;
  if ((e = rd_int(pid, LF_RETAIN, &v))) return e;
  s->retain = v != 0;
  if ((e = rd_int(pid, LF_HUGE_CACHE_MAX, &v))) return e;
  s->huge_cache_max = (size_t)v;
  if ((e = rd_int(pid, LF_PAGE_CACHE, &v))) return e;
  s->page_cache = (unsigned)v;
  return 0;
}

/* One arena's record (copied whole) as the report shows it. */
static void arena_extract(const unsigned char *a, arena_snapshot_t *s) {
  s->nthreads = (unsigned)member(a, LF_AR_NTHREADS);
  s->nthreads_total = member(a, LF_AR_NTHREADS_TOTAL);
  s->nsegments = member(a, LF_AR_NSEGMENTS);
  s->dirty_bytes = member(a, LF_AR_DIRTY_SLOTS) * MLD_SLOT_SIZE;   /* the target's slot size: checked equal */
  s->purged_bytes = member(a, LF_AR_PURGED_SLOTS) * MLD_SLOT_SIZE;
  s->large_active = member(a, LF_AR_LARGE_ACTIVE);
  s->npurge_passes = member(a, LF_AR_NPURGE_PASSES);
  s->nmadvise = member(a, LF_AR_NMADVISE);
  s->purged_total = member(a, LF_AR_PURGED_TOTAL);
  s->lock.ops = member(a, LF_AR_LOCK_OPS);
  s->lock.contended = member(a, LF_AR_LOCK_CONTENDED);
  s->lock.wait_ns = member(a, LF_AR_LOCK_WAIT_NS);
}

static int remote_snapshot(pid_t pid, stats_snapshot_t *s) {
  int e;
  uint64_t init, n, start_ms, page;
  stats_atomics_t at;
  unsigned char b[8];
  if ((e = rd_field(pid, LF_INITIALIZED, b, sizeof b))) return e;
  init = (uint64_t)get_s(b, F[LF_INITIALIZED].size);
  if (init != 2) return EAGAIN;   /* not initialised yet (or being initialised): nothing to read */
  if ((e = check_classes(pid))) return e;
  size_t nptrs = F[LF_ARENAS].count;   /* bounded by LIVE_MAX_ARENA_PTRS */
  if ((e = rd_int(pid, LF_NARENAS, &n)) || (e = rd_field(pid, LF_ARENAS, arena_ptrs, sizeof arena_ptrs)) ||
      (e = remote_options(pid, s)) || (e = rd_int(pid, LF_START_MS, &start_ms)) ||
      (e = rd_int(pid, LF_HUGE_ACTIVE, &at.huge_active)) || (e = rd_int(pid, LF_HUGE_CACHED, &at.huge_cached)) ||
      (e = rd_int(pid, LF_META_BYTES, &at.meta_bytes)) || (e = rd_int(pid, LF_MAPPED_BYTES, &at.mapped_bytes)) ||
      (e = rd_int(pid, LF_INVALID_FREES, &s->invalid_frees)) || (e = rd_int(pid, LF_HUGE_HEADER, &at.huge_header)) ||
      (e = rd_int(pid, LF_PAGE_SIZE, &page)) || (e = remote_heaps(pid, &s->hs)))
    return e;
  if (page < MLD_OS_PAGE_MIN || page > MLD_OS_PAGE_MAX || (page & (page - 1)) || at.huge_header > MLD_SEGMENT_SIZE)
    return refuse(EPROTO, "its page geometry (page %llu bytes, huge header %llu bytes) is out of bounds",
                  (unsigned long long)page, (unsigned long long)at.huge_header);
  s->page_size = (size_t)page;
  at.segment_usable = F[LF_USABLE_SLOTS].where.value * MLD_SLOT_SIZE;   /* at most 4096 slots: no overflow */
  s->narenas = 0;
  for (size_t i = 0; i < n && i < nptrs && s->narenas < MLD_MAX_ARENAS; i++) {
    if (!arena_ptrs[i] || rd(pid, arena_ptrs[i], rec_a, rec_size[R_ARENA])) break;   /* arenas are never freed */
    arena_extract(rec_a, &s->arenas[s->narenas++]);
  }
  mld_global_compute(&s->g, &s->hs, s->arenas, s->narenas, &at);
  s->pid = (int)pid;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/exe", (int)pid);
  ssize_t xl = readlink(path, s->exe, sizeof s->exe - 1);
  s->exe[xl > 0 ? xl : 0] = 0;
  uint64_t now = mld_now_ms();   /* CLOCK_MONOTONIC_COARSE: the same clock in every process of this boot */
  s->uptime_ms = now >= start_ms ? now - start_ms : 0;
  s->ncpus = mld_ncpus_of(pid);
  s->purge_running = remote_purge_thread(pid);
  s->purge_wakeups_known = false;   /* background.c keeps its counter private: not in the root */
  return 0;
}

/* The header: magic, version, sizes, and a library version that prints safely (ASCII, no quote or backslash). */
static int check_header(pid_t pid, uint64_t addr, live_root_t *root, char *version) {
  unsigned char head[16];
  int e = rd(pid, addr, head, sizeof head);
  if (e == EFAULT) return refuse(e, "no readable root at 0x%llx", (unsigned long long)addr);
  if (e) return e;
  uint32_t ver, hsize;
  memcpy(&ver, head + 8, sizeof ver);
  memcpy(&hsize, head + 12, sizeof hsize);
  if (memcmp(head, LIVE_MAGIC, sizeof LIVE_MAGIC)) return refuse(EPROTO, "no Mallard root at 0x%llx (bad magic)",
                                                                 (unsigned long long)addr);
  if (ver != LIVE_VERSION)
    return refuse(EPROTO, "its root is of version %u; this reader reads version %u%s", ver, LIVE_VERSION,
                  ver < LIVE_VERSION ? " (an older Mallard: read it with the mallard command of its own release)" : "");
  if (hsize < sizeof *root || hsize > LIVE_MAX_HEADER)
    return refuse(EPROTO, "its root header is %u bytes (%zu..%u expected)", hsize, sizeof *root, LIVE_MAX_HEADER);
  if ((e = rd(pid, addr, root, sizeof *root))) return e == EFAULT ? refuse(e, "its root is not readable") : e;
  size_t len = strnlen(root->lib_version, sizeof root->lib_version);
  if (len == 0 || len == sizeof root->lib_version) return refuse(EPROTO, "its library version is not a string");
  for (size_t i = 0; i < len; i++)
    if (root->lib_version[i] <= 0x20 || root->lib_version[i] >= 0x7f || root->lib_version[i] == '"' ||
        root->lib_version[i] == '\\')
      return refuse(EPROTO, "its library version holds byte 0x%02x", (unsigned char)root->lib_version[i]);
  memcpy(version, root->lib_version, len + 1);
  return 0;
}

MLD_EXPORT int mallard_live_stats(int pid, uintptr_t root_addr, void (*write_cb)(void *, const char *), void *opaque,
                                  const char *opts) {
  static stats_snapshot_t snap;
  live_root_t root;
  if (pid <= 0 || !root_addr || !write_cb) return EINVAL;
  pthread_mutex_lock(&live_lock);
  live_why[0] = 0;
  memset(&snap, 0, sizeof snap);
  int e = check_header((pid_t)pid, root_addr, &root, snap.version);
  if (!e) e = check_fields((pid_t)pid, &root);
  if (!e) e = remote_snapshot((pid_t)pid, &snap);
  if (!e) mld_stats_print_snapshot(&snap, write_cb, opaque, opts);
  pthread_mutex_unlock(&live_lock);
  return e;
}

/* Why the last mallard_live_stats of this process refused its root (EPROTO, EFAULT): one line, "" when it did not. */
MLD_EXPORT void mallard_live_reason(char *buf, size_t len) {
  if (!buf || !len) return;
  pthread_mutex_lock(&live_lock);
  snprintf(buf, len, "%s", live_why);
  pthread_mutex_unlock(&live_lock);
}
