/* control/control.h — what the control layer offers the layer on top: options parsing and formatting, statistics snapshots and reports (stats.c, ctl.c, live.c). */
#ifndef MALLARD_CONTROL_H
#define MALLARD_CONTROL_H
#include "core/core.h"

/* options.c */
MLD_HIDDEN void mld_options_init(void);
#define MLD_OPTIONS_TEXT_MAX 2048   /* enough for every option, slab_sizes with one range per class included */
/* The options in force as "key:value,..." that MALLARD_CONF accepts back; returns the length it needs (snprintf). */
MLD_HIDDEN size_t mld_options_format(char *buf, size_t len);
struct prof_options_s;
MLD_HIDDEN size_t mld_options_format_of(const options_t *o, const struct prof_options_s *po, unsigned auto_arenas,
                                         char *buf, size_t len);
MLD_HIDDEN void mld_options_announce(void);   /* verbose:true: "mallard VERSION: <options>" on stderr */

#define MLD_OWNER_MAP_TOUCHED_ESTIMATE 4096   /* one page of the ownership bitmap covers 128 GiB of segments */

typedef struct global_stats_s {
  uint64_t allocated, active, resident, mapped, retained, dirty, metadata, huge_cached;
} global_stats_t;


/* Everything the report shows, copied either from this process under its locks (stats.c) or from another process's
 * memory without them (live.c: a racy snapshot). The report is printed from this alone. */
typedef struct stats_snapshot_s {
  char version[16];                      /* MALLARD_VERSION of the process reported (live.c: the target's, checked) */
  heap_stats_t hs;                       /* live heaps + exited threads + threads without a heap */
  global_stats_t g;
  uint64_t invalid_frees;
  unsigned narenas;                      /* arenas[0 .. narenas) are filled */
  arena_snapshot_t arenas[MLD_MAX_ARENAS];
  unsigned page_slots[MLD_NUM_CLASSES];  /* options the report shows */
  long dirty_decay_ms;
  bool background_thread, retain;
  int thp;
  size_t huge_cache_max;
  unsigned page_cache;
  char options_text[MLD_OPTIONS_TEXT_MAX];
  int pid;
  char exe[512];
  uint64_t uptime_ms;
  size_t ncpus;
  size_t page_size;                      /* the page size in force (mld_os_page: the kernel's, or a test build's) */
  bool purge_running;
  bool purge_wakeups_known;              /* false: the reader cannot see the purging thread's counter (live.c) */
  uint64_t purge_wakeups;
} stats_snapshot_t;

/* The memory figures of `g` from summed heap counters, arena totals, the allocator's global atomics and its segment
 * geometry (the reported process's: live.c reads them from its root, the variants differ). */
typedef struct stats_atomics_s {
  uint64_t huge_active, huge_cached, meta_bytes, mapped_bytes;
  uint64_t segment_usable;               /* bytes of a segment's usable slots (MLD_USABLE_SLOTS * MLD_SLOT_SIZE) */
  uint64_t huge_header;                  /* mld_huge_header(): the segment header rounded to the page */
} stats_atomics_t;
struct prof_options_s;
MLD_HIDDEN void mld_snapshot_options(stats_snapshot_t *s, const options_t *o, const struct prof_options_s *po,
                                     unsigned auto_arenas);
MLD_HIDDEN void mld_global_compute(global_stats_t *g, const heap_stats_t *hs, const arena_snapshot_t *arenas,
                                   unsigned narenas, const stats_atomics_t *at);
/* Print the report of a snapshot; opts as mallard_stats_print's. */
MLD_HIDDEN void mld_stats_print_snapshot(const stats_snapshot_t *s, void (*write_cb)(void *, const char *),
                                         void *opaque, const char *opts);

/* live.c: the root a reader in another process starts from (self-describing: docs/STATS.md), and the options text
 * it points to, formatted once at initialisation (init.c calls this before the allocator is marked ready). */
extern const struct live_root_s mallard_live_root;
MLD_HIDDEN void mld_live_init(void);

MLD_HIDDEN void mld_stats_sum(heap_stats_t *out);
MLD_HIDDEN void mld_global_stats(global_stats_t *g);
MLD_HIDDEN void mld_stats_print_at_exit(void);
MLD_HIDDEN void mld_stats_print_setup(void);
MLD_HIDDEN bool mld_purge_thread_running(void);
MLD_HIDDEN bool mld_purge_thread_booted(void);   /* the thread created runs (a creation's first step) */
MLD_HIDDEN uint64_t mld_purge_thread_wakeups(void);
#endif
