/* platform/diag.c — messages on stderr without allocating: invalid-pointer reports (once per kind) and fatal errors. */
#define _GNU_SOURCE
#include "platform/platform.h"
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The error's name (EACCES...), never translated nor allocated: glibc names them all; elsewhere (musl) the ones a
 * file or mapping call returns, else "error". */
const char *mld_errname(int err) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  const char *n = strerrorname_np(err);
  return n ? n : "error";
#else
  switch (err) {
#define E(x) case x: return #x;
    E(EPERM) E(ENOENT) E(EINTR) E(EIO) E(ENXIO) E(EBADF) E(EAGAIN) E(ENOMEM) E(EACCES) E(EFAULT) E(EBUSY) E(EEXIST)
    E(ENOTDIR) E(EISDIR) E(EINVAL) E(ENFILE) E(EMFILE) E(ETXTBSY) E(EFBIG) E(ENOSPC) E(ESPIPE) E(EROFS) E(EPIPE)
    E(ERANGE) E(ENAMETOOLONG) E(ENOSYS) E(ELOOP) E(EOVERFLOW) E(EDQUOT) E(ESRCH) E(ECHILD)
#undef E
  default: return "error";
  }
#endif
}

static void write_all(const char *s, size_t n) {
  while (n) {
    ssize_t w = write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

void mld_message(const char *fmt, ...) {
  char buf[1024];   /* the unknown-option message lists every key */
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);   /* glibc's vsnprintf does not allocate for plain formats */
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof buf) {   /* cut: still one line */
    n = sizeof buf - 1;
    buf[n - 1] = '\n';
  }
  write_all(buf, (size_t)n);
}

void mld_fatal(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) write_all(buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
  abort();
}

static _Atomic(int) reported;

/* Report a pointer Mallard did not hand out (or no longer owns); only the first is printed, the rest are counted. */
_Atomic(uint64_t) mld_invalid_count;
void mld_report_invalid(const char *what, const void *p) {
  atomic_fetch_add(&mld_invalid_count, 1);
#ifdef MALLARD_SECURE
  mld_fatal("mallard-secure: %s(%p): invalid pointer (not allocated by mallard, interior, or already freed); aborting\n",
            what, p);
#endif
  if (atomic_exchange(&reported, 1) == 0)
    mld_message("mallard: %s(%p): pointer not allocated by mallard (or already freed); ignored. "
                "Further reports are suppressed.\n", what, p);
}
