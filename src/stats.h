/* stats.h — statistics snapshots shared by stats.c and ctl.c. */
#ifndef MALLARD_STATS_H
#define MALLARD_STATS_H
#include "internal.h"

#define MLD_OWNER_MAP_TOUCHED_ESTIMATE 4096   /* one page of the ownership bitmap covers 128 GiB of segments */

typedef struct global_stats_s {
  uint64_t allocated, active, resident, mapped, retained, dirty, metadata, huge_cached;
} global_stats_t;

typedef struct arena_snapshot_s {
  unsigned nthreads;
  uint64_t nthreads_total;
  uint64_t nsegments, dirty_bytes, purged_bytes, large_active, npurge_passes, nmadvise, purged_total;
  lock_stats_t lock;
} arena_snapshot_t;

MLD_HIDDEN void mld_stats_sum(heap_stats_t *out);
MLD_HIDDEN void mld_global_stats(global_stats_t *g);
MLD_HIDDEN bool mld_arena_snapshot(unsigned index, arena_snapshot_t *s);
MLD_HIDDEN void mld_stats_print_at_exit(void);
MLD_HIDDEN void mld_stats_print_setup(void);
MLD_HIDDEN bool mld_purge_thread_running(void);
MLD_HIDDEN uint64_t mld_purge_thread_wakeups(void);
#endif
