/* prof/pprof.h — the heap profile writer's interface: samples in, a gzip-compressed pprof profile.proto out. */
#ifndef MALLARD_PROF_PPROF_H
#define MALLARD_PROF_PPROF_H

#include <stdbool.h>
#include <stdint.h>
#include "core/core.h"

/* One sampled stack and its unbiased estimates. */
typedef struct mld_pprof_sample_s {
  const uintptr_t *pcs;      /* return addresses, innermost first (as _Unwind_GetIP / __builtin_return_address give) */
  uint32_t depth;
  int64_t alloc_objects, alloc_space, inuse_objects, inuse_space;   /* unbiased estimates (already scaled) */
} mld_pprof_sample_t;

typedef struct mld_pprof_info_s {
  int64_t time_nanos, duration_nanos;  /* profile start (CLOCK_REALTIME ns) and length */
  int64_t period;                      /* prof_sample: mean bytes between samples */
} mld_pprof_info_t;

/* Called repeatedly; fills *out and returns true, or returns false when there are no more samples. The writer makes
 * a single pass: `next` is never called again after it returned false, and never restarted. The stack `out->pcs`
 * points to need only stay valid until the next call of `next`. */
typedef bool (*mld_pprof_next_fn)(void *ctx, mld_pprof_sample_t *out);

/* Writes the gzip-compressed profile (with the process's mappings, build IDs, locations, functions where cheap) to fd.
 * Never calls malloc (memory is mapped with mmap and given back before returning). Returns 0, or an errno value:
 * EINVAL (NULL info or next, a sample with depth > 0 and NULL pcs), ENOMEM (a mapping failed or a size overflowed),
 * or the error of write(2). A failure can leave a partial file behind: write to a temporary name and rename (as
 * mld_pprof_write_file does). Each location's address is the return address minus 1 (the call instruction), and
 * frames whose pc is 0 are dropped. */
MLD_HIDDEN int mld_pprof_write(int fd, const mld_pprof_info_t *info, mld_pprof_next_fn next, void *ctx);

/* The same into the file `path`, all or nothing: writes `path`.tmp.PID (created exclusively, mode 0644 less the
 * umask), then renames it over `path`; on failure the temporary file is removed and `path` is untouched. Returns 0,
 * or an errno value (ENAMETOOLONG when `path` is too long for the temporary name). */
MLD_HIDDEN int mld_pprof_write_file(const char *path, const mld_pprof_info_t *info, mld_pprof_next_fn next,
                                    void *ctx);

#endif
