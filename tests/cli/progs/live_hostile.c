/* live_hostile.c: a hostile shared library for `mallard stats PID` — it serves malloc, exports a mallard_live_root that
 * is not a valid root and a mallard_live_stats that fakes a report; a reader that loaded it would run its constructor.
 * Built with -shared -fPIC and preloaded into a target. LIVE_HOSTILE_MARKER=FILE: every process that runs the
 * constructor (or the fake reader) appends "ctor PID" (or "reader PID") to FILE, so a reader that loads this library
 * leaves its own PID there. LIVE_HOSTILE_ROOT picks the root the target exports: garbage (default: bad magic),
 * version (a root of version 1), nfields (an absurd field count), fieldsize (absurd entries), pointer (a field
 * table outside the process's mappings), header (an absurd header size). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

void *malloc(size_t n) { return __libc_malloc(n); }
void *calloc(size_t n, size_t m) { return __libc_calloc(n, m); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void free(void *p) { __libc_free(p); }

/* Initialised, so it lies in .data (a mapping of this file), written by the constructor in the target. */
__attribute__((visibility("default"))) unsigned char mallard_live_root[64] = "HOSTILE-ROOT";

static void mark(const char *what)
{
    const char *path = getenv("LIVE_HOSTILE_MARKER");
    if (!path) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd < 0) return;
    char line[64];
    int n = snprintf(line, sizeof line, "%s %d\n", what, (int)getpid());
    if (n > 0 && write(fd, line, (size_t)n) < 0) { /* a marker that cannot be written: nothing to do */ }
    close(fd);
}

/* The root's header as docs/STATS.md lays it out: magic, version, header size, library version, nfields, field size,
 * address of the field table. */
static void header(uint32_t version, uint32_t hsize, uint32_t nfields, uint32_t fsize, uint64_t table)
{
    memcpy(mallard_live_root, "MLDLIVE", 8);
    memcpy(mallard_live_root + 8, &version, 4);
    memcpy(mallard_live_root + 12, &hsize, 4);
    memcpy(mallard_live_root + 16, "6.6.6", 6);
    memcpy(mallard_live_root + 32, &nfields, 4);
    memcpy(mallard_live_root + 36, &fsize, 4);
    memcpy(mallard_live_root + 40, &table, 8);
}

static unsigned char table[24 * 4] = { 1 };   /* a few entries, all zero but the first id */

__attribute__((constructor)) static void hostile_init(void)
{
    mark("ctor");
    const char *mode = getenv("LIVE_HOSTILE_ROOT");
    uint64_t t = (uint64_t)(uintptr_t)table;
    if (!mode || !strcmp(mode, "garbage")) return;
    if (!strcmp(mode, "version")) header(1, 48, 4, 24, t);
    else if (!strcmp(mode, "nfields")) header(3, 48, 0xffffffffu, 24, t);
    else if (!strcmp(mode, "fieldsize")) header(3, 48, 4, 1u << 30, t);
    else if (!strcmp(mode, "pointer")) header(3, 48, 4, 24, 0x10);
    else if (!strcmp(mode, "header")) header(3, 0x7fffffffu, 4, 24, t);
    else if (!strcmp(mode, "missing")) header(3, 48, 4, 24, t);
}

/* What the old reader called after loading this file: a fake report, "successfully". */
__attribute__((visibility("default"))) int mallard_live_stats(int pid, uintptr_t root, void (*cb)(void *, const char *),
                                                              void *opaque, const char *opts)
{
    (void)pid; (void)root; (void)opts;
    mark("reader");
    cb(opaque, "FAKE REPORT written by the hostile library\n");
    return 0;
}

__attribute__((visibility("default"))) void mallard_live_reason(char *buf, size_t len)
{
    mark("reason");
    snprintf(buf, len, "FAKE REASON");
}
