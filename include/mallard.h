/* mallard.h — Mallard's public API: prefixed allocation functions, control (mallard_ctl) and statistics. */
#ifndef MALLARD_H
#define MALLARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MALLARD_VERSION "0.1.0"

/* Allocation, usable without replacing malloc: same contracts as the standard functions. */
void *mallard_malloc(size_t size);
void *mallard_calloc(size_t n, size_t size);
void *mallard_realloc(void *p, size_t size);
void *mallard_reallocarray(void *p, size_t n, size_t size);
void mallard_free(void *p);
void mallard_free_sized(void *p, size_t size);
void mallard_free_aligned_sized(void *p, size_t align, size_t size);
void *mallard_aligned_alloc(size_t align, size_t size);
int mallard_posix_memalign(void **out, size_t align, size_t size);
void *mallard_memalign(size_t align, size_t size);
void *mallard_valloc(size_t size);
void *mallard_pvalloc(size_t size);
size_t mallard_usable_size(const void *p);

/* The usable size malloc(size) would return (for sizing buffers to what they will really get). */
size_t mallard_good_size(size_t size);

/* jemalloc's non-standard API with Mallard's semantics (exported unprefixed too by libmallard.so, so that
 * programs built against jemalloc keep working under LD_PRELOAD). flags: low 6 bits log2(alignment), 0x40 zero. */
size_t mallard_nallocx(size_t size, int flags);
void *mallard_mallocx(size_t size, int flags);
void *mallard_rallocx(void *p, size_t size, int flags);
size_t mallard_xallocx(void *p, size_t size, size_t extra, int flags);
size_t mallard_sallocx(const void *p, int flags);
void mallard_dallocx(void *p, int flags);
void mallard_sdallocx(void *p, size_t size, int flags);

/* True when p points into memory Mallard handed out: a page of small blocks, a large block's span or a huge block's
 * usable bytes (interior pointers too); false for any other address. Any address may be asked about, from any
 * thread, even while Mallard unmaps the memory around it: it is never dereferenced. It may take the lock of the
 * block's arena or of the huge blocks. */
bool mallard_owns(const void *p);

/* Give cached memory back to the OS now: this thread's empty pages (force: even the last of each class),
 * then every arena's dirty pages (force) or those whose decay delay has passed. */
void mallard_collect(bool force);

/* jemalloc-style control: read *oldp (size in *oldlenp) and/or write newp (newlen). Returns 0 or an errno code:
 * ENOENT unknown name, EINVAL wrong length or value, EPERM writing a read-only name. See docs/CTL.md. */
int mallard_ctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);

/* Write statistics through write_cb (NULL: stderr). opts: "J" for JSON; see docs/STATS.md. */
void mallard_stats_print(void (*write_cb)(void *opaque, const char *text), void *opaque, const char *opts);

/* The same report for another running process under Mallard (what `mallard stats PID` calls): root_addr is the
 * address of the symbol mallard_live_root in that process. Its counters are read from its memory (the kernel allows
 * it to the same user, ptrace rules applying, or to root), without stopping it: a racy snapshot. The target may be
 * any Mallard whose root is version 2: the root describes its own layout (a table of fields), and everything read
 * through it is validated before use. Returns 0, or an errno code: ESRCH no such process, EPERM not allowed, EPROTO
 * a root it cannot validate, EAGAIN Mallard not initialised there yet, EFAULT the root or one of its fields not
 * readable in the process, EINVAL bad arguments. See docs/STATS.md. */
int mallard_live_stats(int pid, uintptr_t root_addr, void (*write_cb)(void *opaque, const char *text), void *opaque,
                       const char *opts);
/* Why the last mallard_live_stats of this process refused (after EPROTO or EFAULT): one line, NUL-terminated. */
void mallard_live_reason(char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
