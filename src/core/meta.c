/* core/meta.c — internal metadata memory (heap structs, arenas): carved from mapped chunks, never freed. */
#include "core/core.h"
#include <string.h>

static pthread_mutex_t meta_lock = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *meta_cur, *meta_end;
_Atomic(uint64_t) mld_meta_bytes;

#define META_CHUNK (256 * 1024)

void *mld_meta_alloc(size_t size) {
  size = (size + MLD_CACHE_LINE - 1) & ~(size_t)(MLD_CACHE_LINE - 1);
  pthread_mutex_lock(&meta_lock);
  if ((size_t)(meta_end - meta_cur) < size) {
    size_t chunk = size > META_CHUNK ? mld_page_round(size) : META_CHUNK;   /* internal sizes: no wrap */
    uint8_t *p = mld_os_map_aligned(chunk, mld_os_page(), 0);
    if (!p) { pthread_mutex_unlock(&meta_lock); return NULL; }
    atomic_fetch_add(&mld_meta_bytes, chunk);
    meta_cur = p;
    meta_end = p + chunk;
  }
  void *r = meta_cur;
  meta_cur += size;
  pthread_mutex_unlock(&meta_lock);
  return r;   /* fresh mapping: already zero */
}

/* fork(): no thread may be inside mld_meta_alloc while the child is made. */
void mld_meta_fork_prepare(void) { pthread_mutex_lock(&meta_lock); }
void mld_meta_fork_parent(void) { pthread_mutex_unlock(&meta_lock); }
void mld_meta_fork_child(void) { pthread_mutex_init(&meta_lock, NULL); }
