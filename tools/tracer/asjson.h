/* asjson.h: an async-signal-safe JSON writer to a file descriptor (no malloc, no stdio, no locks; small fixed buffer). */
#ifndef MALLARD_ASJSON_H
#define MALLARD_ASJSON_H

#include <stddef.h>
#include <stdint.h>

/* The caller owns one writer at a time (the tracer's single record writer); buf is flushed with write(2). */
struct asjson {
    int fd;
    int failed; /* a write failed: later output is dropped */
    size_t len;
    char buf[4096];
};

void asjson_init(struct asjson *w, int fd);
void asjson_raw(struct asjson *w, const char *s);                  /* literal text, NUL-terminated */
void asjson_u64(struct asjson *w, uint64_t v);
void asjson_i64(struct asjson *w, int64_t v);
void asjson_fixed9(struct asjson *w, uint64_t ns);                 /* ns as seconds with 9 decimals */
void asjson_string(struct asjson *w, const char *s, size_t n);    /* quoted; valid UTF-8 kept, bad bytes as U+FFFD */
int asjson_flush(struct asjson *w);                                /* 0 when everything reached the file */

#endif
