/* asjson.c: async-signal-safe JSON output (integers and UTF-8-checked strings) through a small buffer and write(2). */
#include "asjson.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

void asjson_init(struct asjson *w, int fd)
{
    w->fd = fd;
    w->failed = 0;
    w->len = 0;
}

int asjson_flush(struct asjson *w)
{
    size_t off = 0;
    while (off < w->len && !w->failed) {
        ssize_t n = write(w->fd, w->buf + off, w->len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            w->failed = 1;
        else
            off += (size_t)n;
    }
    w->len = 0;
    return w->failed ? -1 : 0;
}

static void put(struct asjson *w, const char *s, size_t n)
{
    while (n > 0) {
        if (w->len == sizeof w->buf)
            asjson_flush(w);
        size_t room = sizeof w->buf - w->len;
        size_t k = n < room ? n : room;
        memcpy(w->buf + w->len, s, k);
        w->len += k;
        s += k;
        n -= k;
    }
}

void asjson_raw(struct asjson *w, const char *s)
{
    put(w, s, strlen(s));
}

void asjson_u64(struct asjson *w, uint64_t v)
{
    char d[20];
    size_t i = sizeof d;
    do {
        d[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put(w, d + i, sizeof d - i);
}

void asjson_i64(struct asjson *w, int64_t v)
{
    if (v < 0) {
        put(w, "-", 1);
        asjson_u64(w, (uint64_t)0 - (uint64_t)v); /* well defined for INT64_MIN too */
    } else {
        asjson_u64(w, (uint64_t)v);
    }
}

void asjson_fixed9(struct asjson *w, uint64_t ns)
{
    asjson_u64(w, ns / 1000000000u);
    char frac[10] = {'.'};
    uint64_t f = ns % 1000000000u;
    for (int i = 9; i >= 1; i--) {
        frac[i] = (char)('0' + f % 10);
        f /= 10;
    }
    put(w, frac, sizeof frac);
}

/* Length of the valid UTF-8 sequence at s (at most n bytes), 0 when the bytes there are not valid UTF-8. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte: excludes overlongs and surrogates */
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (len > n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return len;
}

void asjson_string(struct asjson *w, const char *str, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    put(w, "\"", 1);
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c == 0) { /* the NUL separators of /proc/self/cmdline */
            put(w, " ", 1);
            i++;
        } else if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            put(w, e, 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            put(w, e, 6);
            i++;
        } else if (c < 0x80) {
            put(w, (const char *)&s[i], 1);
            i++;
        } else {
            size_t len = utf8_len(s + i, n - i);
            if (len) {
                put(w, (const char *)&s[i], len);
                i += len;
            } else {
                put(w, "\\ufffd", 6); /* not UTF-8: one replacement character per bad byte */
                i++;
            }
        }
    }
    put(w, "\"", 1);
}
