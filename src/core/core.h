/* core/core.h — what the core offers the layers above: layout constants, pages, heaps, arenas, size classes, options in force. */
#ifndef MALLARD_CORE_H
#define MALLARD_CORE_H

#include "platform/platform.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>


/* ---- layout ---------------------------------------------------------------------------------------- */
#define MLD_SEGMENT_SHIFT 22                              /* segments are 4 MiB, aligned to 4 MiB */
#define MLD_SEGMENT_SIZE ((size_t)1 << MLD_SEGMENT_SHIFT)
#define MLD_SEGMENT_MASK (MLD_SEGMENT_SIZE - 1)
#define MLD_SLOT_SHIFT 16                                 /* a segment is cut into 64 KiB slots */
#define MLD_SLOT_SIZE ((size_t)1 << MLD_SLOT_SHIFT)
#define MLD_SLOTS (MLD_SEGMENT_SIZE / MLD_SLOT_SIZE)      /* 64; slot 0 holds the segment header */
#ifdef MALLARD_SECURE
#define MLD_FIRST_SLOT 2                                  /* secure.h: header, two bitmaps and a guard in slots 0-1 */
#else
#define MLD_FIRST_SLOT 1
#endif
#define MLD_USABLE_SLOTS (MLD_SLOTS - MLD_FIRST_SLOT)
#define MLD_MIN_ALIGN 16

#define MLD_SMALL_MAX 8192                                /* up to here: pages of one slot */
#define MLD_MEDIUM_MAX (256 * 1024)                       /* up to here: size-class pages of several slots */
#define MLD_LARGE_MAX (2 * 1024 * 1024)                   /* up to here: slot spans; above: huge mappings */
/* realloc(NULL, n) above this starts a growable buffer in a huge mapping of its own: the pages the program has not
 * filled yet are never resident, where a span may lie on pages earlier blocks made resident. malloc's blocks stay
 * spans up to MLD_LARGE_MAX: usually written whole, they are best on dirty spans (docs/DESIGN.md). */
#define MLD_HUGE_FROM (512 * 1024)
#define MLD_NUM_CLASSES 52
#define MLD_MAX_PAGE_SLOTS 16
#define MLD_MEDIUM_PAGE_SLOTS 4                           /* fast variant: default medium pages at most this many slots */
#ifdef MALLARD_SECURE
#define MLD_SPAN_USES (MLD_MAX_PAGE_SLOTS + 1)          /* segments hold large blocks (0) or small pages of one size */
#else
#define MLD_SPAN_USES 1
#endif
#define MLD_MAX_ARENAS 64
#define MLD_KEEP_SLOTS 16                                 /* slots of empty multi-slot current pages a heap keeps */
#define MLD_KEEP_EMPTIES 8      /* a multi-slot current page stays empty with its heap once its class emptied pages */
#define MLD_KEEP_WINDOW_MS 4    /* ... this many times within this many ms (heap.c keep_empty): a malloc/free loop */
/* The largest request (and alignment) ever served: no mapping can be larger than the user address space (glibc
 * refuses above PTRDIFF_MAX, far above it). Size computations start from values at most this large, with checks. */
#define MLD_MAX_REQUEST ((size_t)1 << MLD_ADDR_BITS)

/* ---- blocks, pages, segments ----------------------------------------------------------------------- */
typedef struct block_s { struct block_s *next; } block_t;

/* PAGE_PURGING: a free span's first slot while madvise runs on it without the arena lock (arena.c mld_arena_purge):
 * out of the free lists, so that no thread takes it, grows into it or joins it. */
enum { PAGE_META = 0, PAGE_FREE = 1, PAGE_SMALL = 2, PAGE_LARGE = 3, PAGE_PURGING = 4 };

struct heap_s;
struct arena_s;

/* A page descriptor: one per slot; a span's first slot describes it, its other slots hold `offset` back to it.
 * Two cache lines (128 bytes, aligned): page_of() is shifts only. The first line is read by every thread that
 * frees into the page and written rarely (page set-up, parking, once per remote batch); the second holds what
 * the owner's fast paths write on every call (`free`, `used`). A thread freeing blocks of another thread's page
 * never reads a line that the owner is writing block by block. */
typedef struct __attribute__((aligned(MLD_CACHE_LINE))) page_s {
  _Atomic(struct heap_s *) heap;         /* owning heap of a small page; NULL when abandoned or not small */
  /* Batches freed by other threads (lock-free push, outbox.c): the list's head | its length in blocks << 48
   * (MLD_BATCH_COUNT_SHIFT), so that a collection into an empty free list takes it whole without walking it (page.c).
   * Unused by the secure variant (remote bits and summaries: secure.h). */
  _Atomic(uintptr_t) thread_free;
  uint32_t block_size;
  uint32_t slot_count;                   /* span length in slots (first and last slot of a span) */
  uint32_t offset;                       /* distance in descriptors to the span's first slot (0 for the first) */
  uint8_t kind;                          /* PAGE_* */
  uint8_t size_class;
  /* The owner's free fast path tests both bytes at once (owner_slow): one test, whichever sends it away. */
  union {
    struct {
      uint8_t in_full;                   /* parked on its heap's full list (written under the heap lock) */
      uint8_t junk_free;                 /* junk:free|true: owner frees take the slow path, which fills (api.c) */
    };
    uint16_t owner_slow;                 /* non-zero: the owner's frees into this page take the slow path */
  };
  uint8_t keep_check;                    /* multi-slot small page not (yet) kept empty as current: ask on empty */
  uint8_t purged;                        /* free span: memory was given back to the OS */
  uint8_t zero;                          /* free span or large block: memory known to be zero */
  uint8_t guarded;                       /* secure: small page whose last OS page is a guard; large block in the
                                          * quarantine that was made PROT_NONE whole (large.c) */
  uint8_t is_current;                    /* small page: its owner's current page of its class (written under the
                                          * heap lock; read by remote senders: a send into another page asks for
                                          * a sweep, outbox.c) */
  union {
    struct {                             /* a large block or a free span */
      void *user;                        /* large block: the pointer handed out (checked on free) */
      union {
        size_t large_size;               /* large block: requested usable size */
        uint64_t purge_age;              /* purged free span: how long it had been dirty when purged, ms */
      };
      uint64_t dirty_since;              /* free span: when it became dirty, ms */
    };
#ifdef MALLARD_SECURE
    /* A small page: the secure variant's per-page secrets, drawn afresh whenever the page is initialised
     * (secure.h). On this line: remote frees read them (canary) and never the owner's line. */
    struct {
      uint64_t list_key;                 /* free-list links are encrypted with it, canaries keyed with it */
      uintptr_t start;                   /* page_start(): decoded links are checked against it */
      uint64_t align_magic;              /* ceil(2^64 / block_size): a decoded link must be a block start */
    };
#endif
  };
  /* ---- second line: the owner's ---- */
  _Alignas(MLD_CACHE_LINE) block_t *free;   /* owner's list: allocation pops, owner frees push (LIFO) */
  uint32_t used;                         /* blocks handed out and not yet back on `free` */
  uint32_t capacity;                     /* blocks carved into lists so far */
  uint32_t reserved;                     /* blocks that fit in the page */
  uint8_t keep_on_empty;                 /* its class's current page, and may stay with the heap when empty */
  uint8_t dry_seen;                      /* found with nothing free by a refill and moved to its class list's tail:
                                          * parked when found so again (heap.c heap_find_page; heap lock) */
  struct page_s *next, *prev;            /* heap page list, arena free-span list or abandoned list */
  uint64_t *nfree_count;                 /* &heap->stats.cls[size_class].nfree, set with `heap` (mld_page_set_owner):
                                          * an owner free counts without loading size_class (one dependent load less
                                          * on the fast path) */
#ifdef MALLARD_SECURE
  uint64_t *nmalloc_count;               /* &heap->stats.nmalloc[size_class], set with it: the secure variant's malloc
                                          * counts through it (fewer registers live than the fast variant's indexed add) */
#endif
} page_t;

enum { SEG_NORMAL = 1, SEG_HUGE = 2 };

typedef struct segment_s {
  uint32_t kind;                         /* SEG_* */
  uint32_t free_slots;                   /* normal segment: slots in free spans */
  uint32_t use;                          /* normal segment: what its spans serve (arena_t.spans; 0 in the fast variant) */
  struct arena_s *arena;
  struct segment_s *next, *prev;         /* arena segment list, or the huge cache */
  size_t map_size;                       /* huge: bytes mapped from `this` */
  void *user;                            /* huge: the pointer handed out */
  size_t user_size;                      /* huge: usable bytes from user */
  uint64_t dirty_since;                  /* huge cache entry: when it was freed, ms */
  size_t guard_end;                      /* huge in use, secure variant: its PROT_NONE pages run from the block's end to here */
  /* Secure variant, normal segment (arena lock held): slots whose last OS page is PROT_NONE (guard slabs), and
   * slots that are PROT_NONE whole (large blocks' guard slots, freed large blocks). A bit may over-state the
   * protection (it costs one mprotect more) but never under-state it. */
  uint64_t prot_tail, prot_full;
  struct segment_s *purged_next;         /* normal segment: next on a purge pass's list of segments it purged in */
  uint8_t purged_listed;                 /* on that list (arena lock held) */
  page_t pages[MLD_SLOTS];
} segment_t;

_Static_assert(sizeof(segment_t) <= MLD_SLOT_SIZE, "segment header fits its slot");
_Static_assert(sizeof(page_t) == 128, "page descriptors are two cache lines");
_Static_assert(offsetof(page_t, dirty_since) < MLD_CACHE_LINE && offsetof(page_t, free) == MLD_CACHE_LINE,
               "what other threads read, and what the owner writes on every call, are on separate lines");
/* Where a huge block's data starts in its mapping: the segment header rounded up to the page in force (12 KiB at
 * 4 KiB pages, 16 KiB at 16 KiB, 64 KiB at 64 KiB), so the data starts on a page of its own. */
static inline size_t mld_huge_header(void) { return mld_page_round(sizeof(segment_t)); }
_Static_assert(sizeof(segment_t) <= MLD_OS_PAGE_MAX, "the huge header is at most one page of any size supported");

static inline segment_t *segment_of(const void *p) { return (segment_t *)((uintptr_t)p & ~(uintptr_t)MLD_SEGMENT_MASK); }
/* The descriptor of p's slot: its page's own for a block in the page's first slot. */
/* Bit arithmetic on p alone (a segment is aligned to its size, a descriptor is 1 << 7 bytes): one shift and one mask
 * give the descriptor's byte offset, and the base's offset of pages[] folds into the field displacements. */
static inline page_t *slot_page(segment_t *seg, const void *p) {
  size_t off = ((uintptr_t)p >> (MLD_SLOT_SHIFT - 7)) & ((MLD_SLOTS - 1) << 7);
  return (page_t *)((uint8_t *)seg->pages + off);
}
static inline page_t *page_of(segment_t *seg, const void *p) {
  page_t *pg = slot_page(seg, p);
  return pg - pg->offset;
}
static inline uint8_t *page_start(const page_t *pg) {
  segment_t *seg = segment_of(pg);
  return (uint8_t *)seg + ((size_t)(pg - seg->pages) << MLD_SLOT_SHIFT);
}
static inline size_t slot_index(const page_t *pg) { return (size_t)(pg - segment_of(pg)->pages); }

/* ---- size arithmetic: every computation on a user-supplied size goes through these ---------------- */
/* *out = a + b; false on overflow. */
static inline bool mld_add(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }
/* *out = x rounded up to the power of two `a`; false on overflow. */
static inline bool mld_round(size_t x, size_t a, size_t *out) {
  size_t t;
  if (__builtin_add_overflow(x, a - 1, &t)) return false;
  *out = t & ~(a - 1);
  return true;
}

/* The owner's free takes a block back from its page: `used` falls by one, the last write of the free into the page,
 * with release semantics, so that a sweep which reads it (acquire) equal to the page's published remote frees knows
 * the free is done (heap.c sweep_unparked). On x86-64 a store is never reordered with earlier stores: a compiler
 * barrier makes the plain decrement a release (one `sub` with memory, as before: the fast path keeps its count of
 * instructions); elsewhere, and under ThreadSanitizer (which must see the release), an atomic release store. */
static inline uint32_t mld_used_release_dec(page_t *pg) { return mld_dec_release_u32(&pg->used); }




/* ---- statistics (per heap, summed when read) --------------------------------------------------------- */
typedef struct class_stats_s {
  uint64_t nfree;                        /* blocks freed by this thread (local or remote) */
  uint64_t nrefills;                     /* slow-path refills of the allocation list */
  uint64_t npages;                       /* pages taken for this class (from the arena or the page cache) */
  uint64_t npages_cached;                /* of those, pages reused from the thread's page cache */
  uint64_t npages_released;              /* empty pages given back to the arena */
} class_stats_t;

typedef struct heap_stats_s {
  class_stats_t cls[MLD_NUM_CLASSES];
  /* Blocks of each class handed out by this heap: an array of its own, so that the malloc fast path counts with one
   * add indexed by the class it already holds (a class record's stride is no scale an address can take). */
  uint64_t nmalloc[MLD_NUM_CLASSES];
  uint64_t large_nmalloc, large_nfree, large_bytes_alloc, large_bytes_free;
  uint64_t huge_nmalloc, huge_nfree, huge_bytes_alloc, huge_bytes_free;
  uint64_t remote_frees;                 /* frees pushed to another heap's page */
  uint64_t pages_handed_over;            /* parked pages of an idle owner given to other heaps (heap.c hand_over) */
  uint64_t pages_claimed;                /* other heaps' pages, every block freed remotely, taken as new pages (heap.c) */
  uint64_t pages_emptied;                /* parked pages given back to their arena by the remote free that emptied them (heap.c) */
  uint64_t pages_taken_idle;             /* pages of an idle live owner, still holding its blocks, parked from outside and handed over (heap.c) */
  uint64_t pages_parked;                 /* pages its refills found with nothing free and parked (heap.c park) */
  uint64_t frees_parked;                 /* its frees into its own parked pages: the locked path (heap.c mld_free_parked) */
} heap_stats_t;
/* Live blocks of class c: malloc count less free count, 0 while a summing reader saw a free before its malloc. */
static inline uint64_t mld_class_curobjs(const heap_stats_t *hs, unsigned c) {
  return hs->nmalloc[c] >= hs->cls[c].nfree ? hs->nmalloc[c] - hs->cls[c].nfree : 0;
}
/* Pages a class holds: pages made less pages released, 0 while a summing reader saw a release before its page. */
static inline uint64_t mld_class_curpages(const class_stats_t *cs) {
  return cs->npages >= cs->npages_released ? cs->npages - cs->npages_released : 0;
}

/* ---- thread heap ------------------------------------------------------------------------------------- */
typedef struct page_list_s { page_t *head, *tail; } page_list_t;

/* Remote frees are batched per destination page (outbox.c): one entry holds a chain of blocks of one page that
 * this thread freed (the secure variant: the summary bits of the remote words it found empty), sent with a single
 * atomic operation when full, when its slot is needed for another page, or when flushed. */
#define MLD_RECLAIM_MS 8                                  /* an owner walks its pages for remote frees at most this often */
#define MLD_OUTBOX_SLOTS 32                               /* pages batched for at once (direct-mapped) */
#define MLD_OUTBOX_BLOCKS 64                              /* a batch is sent when it holds this many blocks */
#define MLD_OUTBOX_BYTES (8 * 1024)                       /* ... or this many bytes: pending <= 256 KiB a thread */
#define MLD_OUTBOX_AGE 4096                               /* every this many remote frees, all batches are sent */
#define MLD_BATCH_COUNT_SHIFT 48                          /* a page's thread_free: head | count << 48 (outbox.c) */
#define MLD_BATCH_PTR_MASK (((uintptr_t)1 << MLD_BATCH_COUNT_SHIFT) - 1)
#define MLD_PAGE_BLOCKS_MAX 65535                          /* blocks a page holds at most: a count fits in 16 bits */
_Static_assert(MLD_ADDR_BITS <= MLD_BATCH_COUNT_SHIFT, "every user address fits below a list's count");
_Static_assert(MLD_PAGE_BLOCKS_MAX < ((uintptr_t)1 << (64 - MLD_BATCH_COUNT_SHIFT)), "a page's count fits above its list");
#define MLD_OUTBOX_WORDS 8                                /* secure: a slot is sent when it holds this many words */
typedef struct outbox_s {
  page_t *page;                          /* destination page; NULL: slot empty */
  union {
    struct {
      block_t *head, *tail;              /* the chain, linked through block->next */
    };
    uint64_t summary;                    /* secure: bits of one summary word of the page (`sword`): the remote
                                          * words this thread found empty */
  };
  uint32_t count;
  union {
    uint32_t bytes;                      /* fast variant: bytes in the chain */
    uint32_t sword;                      /* secure: which summary word of the page (the slot in the page) */
  };
} outbox_t;

#ifndef MALLARD_SECURE
/* The thread cache's bounds per class (heap.c bcache_limit): 32 KiB and 64 blocks, classes up to 1 KiB. */
#define MLD_BCACHE_BYTES 32768
#define MLD_BCACHE_BLOCKS 64
#define MLD_BCACHE_CLASS_MAX 1024
/* Slots for every class's stack: 16 classes up to 512 B of 64, and 51 + 42 + 36 + 32 for 640 B-1 KiB (1,185). */
#define MLD_BCACHE_SLOTS 1192
/* The bounds of one class's stack in its heap's bslots (which grows down from `empty`: heap_t btop points at the block
 * freed last), as the low 32 bits of the pointers (a stack spans a few hundred bytes: no two of its slots share them):
 * btop[c] is empty when its low bits equal `empty`, full when they equal `full`; both equal for a class without a
 * cache. Apart from btop, so that each is reached with one scaled index (no multiply by 16 on the fast paths). */
typedef struct bbound_s { uint32_t empty, full; } bbound_t;
#endif

typedef struct heap_s {
#ifndef MALLARD_SECURE
  void **btop[MLD_NUM_CLASSES];          /* the thread cache: per class a stack of blocks the owner freed (in bslots) */
  bbound_t bbound[MLD_NUM_CLASSES];      /* ... and its bounds */
#endif
  page_t *current[MLD_NUM_CLASSES];      /* page allocated from; &mld_page_empty when none */
  page_list_t avail[MLD_NUM_CLASSES];    /* pages with (possibly) free blocks; head == current */
  page_list_t full[MLD_NUM_CLASSES];     /* pages found full (parked); swept for remote frees before taking new pages */
  struct arena_s *arena;
  struct heap_s *next_all, *prev_all;    /* registry of live heaps */
  struct heap_s *next_free;              /* pool of recycled heap structs, or the list of orphans */
  /* An orphan: the heap of a thread that exited, kept whole (pages, lists, cache) for the next thread that starts,
   * which takes it over as it is (heap.c mld_heap_exit): since when, ms (0: not an orphan). */
  uint64_t orphan_ms;
  pthread_t thread;
  bool live;
  bool bound;                            /* arena chosen by the thread (thread.arena), not round-robin */
  page_t *cache;                         /* empty pages kept for reuse */
  unsigned ncache;                       /* slots in the cache (at most opt.page_cache) */
  /* The heap lock: the owner holds it in every slow path that may change its full lists or a parked page
   * (refill, frees into parked pages, collection, abandonment); another thread takes it (trylock) to give back
   * the parked pages of an idle owner (mld_heaps_sweep), touching nothing else of the heap. The owner's fast
   * paths never take it: they touch only `current` pages and unparked pages holding their own live blocks. */
  _Atomic(int) lock;                     /* mld_spin_*: 0 free, 1 held */
  /* Robust, held by the owning thread for the heap's whole life: if the thread ends without its destructor
   * having run (first allocation in the last destructor round), the kernel marks it and a sweep abandons it. */
  pthread_mutex_t life;
  _Atomic(uint64_t) last_slow_ms;        /* the owner's last refill: a heap idle for the sweep age is swept */
  /* Set by a thread that sent remote frees into a page of this heap that is not a current one: the owner walks its
   * pages at a refill (at most every MLD_RECLAIM_MS), collecting them and giving back pages left empty (heap.c). */
  _Atomic(int) reclaim_wanted;
  uint64_t reclaim_ms;                   /* the owner's last such walk, plus 1 ms per 64 pages it walked */
  /* Claims (heap.c claim_parked) that found nothing in a row, and the new pages to take before the next try. */
  uint32_t claim_misses, claim_skip;
#ifndef MALLARD_SECURE
  /* Per class: when the heap's current count of emptied multi-slot pages began (ms, truncated), and the count
   * (heap.c keep_empty; the secure variant keeps such a page at once and has neither). */
  uint32_t empties_since[MLD_NUM_CLASSES];
  uint8_t empties[MLD_NUM_CLASSES];
#endif
  /* The block the owner last began to free (api.c dealloc), stored with release before its free reads the page's
   * owner_slow: a thread that parks a page of an idle owner from outside (heap.c take_from_idle) leaves alone the page
   * this points into after a barrier on every thread (mld_os_barrier_all). Written on every free: it starts a line
   * that only the owner writes (the fields above it are written or read by other threads: remote senders read
   * reclaim_wanted and last_slow_ms on every batch into a page that is not current, claims take `lock`). */
  _Alignas(MLD_CACHE_LINE) _Atomic(void *) hazard;
  unsigned outbox_ops;                   /* remote frees since the outbox was last flushed */
  outbox_t outbox[MLD_OUTBOX_SLOTS];
  heap_stats_t stats;
#ifndef MALLARD_SECURE
  void *bslots[MLD_BCACHE_SLOTS];        /* the thread cache's stacks, class after class (heap.c bcache_reset) */
#endif
} heap_t;

/* h takes pg, a small page of class pg->size_class: its `nfree_count` goes with its `heap` (the owner's free counts
 * through it), and `heap` last, with release: whoever reads it names h sees the page made ready. */
static inline void mld_page_set_owner(page_t *pg, heap_t *h) {
  pg->nfree_count = &h->stats.cls[pg->size_class].nfree;
#ifdef MALLARD_SECURE
  pg->nmalloc_count = &h->stats.nmalloc[pg->size_class];
#endif
  atomic_store_explicit(&pg->heap, h, memory_order_release);
}

/* ---- arena ------------------------------------------------------------------------------------------- */
typedef struct lock_stats_s { uint64_t ops, contended, wait_ns; } lock_stats_t;

typedef struct arena_s {
  pthread_mutex_t lock;
  lock_stats_t lock_stats;
  unsigned index;
  unsigned nthreads;                     /* heaps currently attached */
  uint64_t nthreads_total;               /* heaps ever attached */
  segment_t *segments;                   /* normal segments of this arena */
  size_t nsegments;
  page_t *spans[MLD_SPAN_USES][MLD_USABLE_SLOTS + 1];   /* free spans by segment use and slot count; dirty first */
  page_t *abandoned[MLD_NUM_CLASSES];    /* small pages of exited threads that still hold blocks */
  size_t dirty_slots;                    /* slots in free spans not yet purged */
  size_t purged_slots;
  uint64_t next_purge_ms;                /* earliest time a dirty span is due */
  page_t *purging;                       /* spans being purged without the lock (PAGE_PURGING; prev/next links) */
  uint64_t npurge_passes, nmadvise, purged_bytes_total;
  uint64_t nsegments_mapped, nsegments_unmapped;
  uint64_t large_active;                 /* bytes of large blocks in use */
  _Atomic(int) reap_pending;             /* a remote free went to an abandoned page since the last reap */
  _Atomic(uint64_t) reap_since;          /* when that was asked, ms */
} arena_t;

/* ---- options ----------------------------------------------------------------------------------------- */
typedef struct options_s {
  unsigned narenas;                      /* 0: one per CPU */
  long dirty_decay_ms;                   /* delay before free memory is purged; -1: never, 0: at once */
  long dirty_decay_max_ms;               /* the decay lengthens up to this while purged memory is faulted in again */
  bool background_thread;                /* a purging thread while dirty memory waits */
  bool retain;                           /* keep empty segments mapped (purged) instead of unmapping */
  int thp;                               /* 0 kernel default, 1 madvise (huge blocks), 2 always, -1 never */
  bool verbose;
  bool abort_conf;
  bool stats_print;
  char stats_print_opts[16];
  unsigned page_slots[MLD_NUM_CLASSES];  /* slots per page for each size class (slab_sizes) */
  size_t huge_cache_max;                 /* bytes of freed huge mappings kept for reuse before decay */
  unsigned page_cache;                   /* empty 64 KiB pages each thread keeps before giving them back */
  bool zero_on_free;                     /* secure variant: wipe small blocks when they are freed */
  bool tcache;                           /* fast variant: a LIFO cache of freed blocks per thread and class */
  /* The secure variant's defences (docs/SECURITY.md); the fast variant holds them at their "off" values. */
  unsigned guard_slab_interval;          /* a small page ending on a multiple of this many slots ends in a guard; 0: none */
  size_t secure_noaccess_min;            /* freed large and huge blocks from this size are PROT_NONE; SIZE_MAX: none */
  unsigned large_quarantine;             /* freed large blocks held inaccessible before reuse (<= MLD_LARGE_QUARANTINE_MAX) */
  bool delayed_reuse;                    /* an owner's free goes second on its page's list */
  unsigned shuffle;                      /* fresh blocks in random order within runs of this many; 0, 1: address order */
  uint8_t junk;                          /* debug fills: MLD_JUNK_ALLOC | MLD_JUNK_FREE (junk.h) */
  uint8_t owner_free_flags;              /* derived (secure.h's owner free tests one byte): MLD_OWNER_FREE_* */
  /* Sampled guarded allocations (guarded.h, docs/SECURITY.md): both variants. */
  uint8_t guard_action;                  /* MLD_GUARD_ABORT or MLD_GUARD_REPORT */
  unsigned guard_slots;                  /* slots of the guarded pool (1..MLD_GUARD_SLOTS_MAX) */
  size_t guard_sample;                   /* mean bytes allocated between guarded samples; 0: off */
} options_t;
#define MLD_OWNER_FREE_WIPE 1            /* zero_on_free (or a build with MLD_ZERO_ON_FREE_ALWAYS) */
#define MLD_OWNER_FREE_FIRST 2           /* delayed_reuse:false */
#define MLD_LARGE_QUARANTINE_MAX 64      /* bound of large_quarantine: the quarantine's array (large.c) */
#define MLD_EXTEND_BYTES (16 * 1024)     /* a page is carved this much at a time (page.c): RSS grows with use */
#ifdef MALLARD_SECURE
#define MLD_EXTEND_FIRST MLD_EXTEND_BYTES   /* a page's first chunk (page.c): the secure variant carves it whole */
#else
#define MLD_EXTEND_FIRST (4 * 1024)      /* a page's first chunk (page.c): a class used once pins less */
#endif
#define MLD_SHUFFLE_MAX (MLD_EXTEND_BYTES / 16)   /* bound of shuffle: the most blocks a carved chunk holds */

extern options_t mld_opt MLD_HIDDEN;

MLD_HIDDEN uintptr_t mld_random_hint(void);   /* secure.c: an unpredictable address (secure variant only) */
/* Where to try a segment-aligned mapping first: the secure variant's unpredictable segment addresses (0: the
 * platform's choice, below the previous mapping). ThreadSanitizer owns most of the address space: no hint there. */
static inline uintptr_t mld_segment_hint(size_t size, size_t align) {
#if defined(MALLARD_SECURE) && !defined(__SANITIZE_THREAD__)
  if (align == MLD_SEGMENT_SIZE) return mld_random_hint() + size + align;
#endif
  (void)size;
  (void)align;
  return 0;
}
/* The thp option as advice for a new mapping: huge pages (`always`, or `madvise` for huge blocks), none (`never`). */
static inline int mld_thp_advice(bool huge_block) {
  return mld_opt.thp == 2 || (mld_opt.thp == 1 && huge_block) ? 1 : mld_opt.thp < 0 ? -1 : 0;
}

/* Age at which dirty memory of a decay of d ms is purged: 7/8 of d, so that with the wake-up latency of the purging
 * thread and the time a large purge takes, memory is back within the decay delay, not just after. */
static inline uint64_t mld_age_of(long d) { return d > 0 ? (uint64_t)(d - d / 8) : 0; }

/* The decay as set (dirty_decay_ms): orphans, reaps and sweeps wait for it. */
static inline uint64_t mld_base_age(void) { return mld_age_of(mld_opt.dirty_decay_ms); }

/* The decay in force for dirty spans, cached huge mappings and the quarantine: dirty_decay_ms, lengthened (up to
 * dirty_decay_max_ms) while memory it purged is faulted in again soon after (arena.c decay_note_reuse). */
extern _Atomic(uint64_t) mld_decay_ext_ms MLD_HIDDEN;   /* the lengthened decay, ms; 0 or below the base: none */
static inline long mld_decay_ms(void) {
  long d = mld_opt.dirty_decay_ms;
  uint64_t e = atomic_load_explicit(&mld_decay_ext_ms, memory_order_relaxed);
  return d > 0 && e > (uint64_t)d ? (long)e : d;
}
static inline uint64_t mld_purge_age(void) { return mld_age_of(mld_decay_ms()); }

/* Age at which a sweep request is served (heap.c mld_heaps_sweep): pages whose blocks all came back, parked by an
 * owner that has not refilled for as long, go back to their arena, where any heap of the arena reuses them at once
 * (they are purged only once dirty_decay_ms has passed). Much shorter than the decay: a thread that allocated blocks
 * and handed them all on (larson's main thread, a producer that stopped) would otherwise keep their pages for a decay
 * period while the threads that freed them fill new ones. Orphans still wait the decay age. */
#define MLD_SWEEP_AGE_MS 16
static inline uint64_t mld_sweep_age(void) {
  uint64_t a = mld_base_age();
  return a < MLD_SWEEP_AGE_MS ? a : MLD_SWEEP_AGE_MS;
}

/* ---- cross-file declarations ------------------------------------------------------------------------- */
/* size_classes.c */
extern const uint32_t mld_class_size[MLD_NUM_CLASSES] MLD_HIDDEN;
extern const uint8_t mld_small_class[MLD_SMALL_MAX / 16 + 1] MLD_HIDDEN;   /* (size+15)/16 -> class, size <= SMALL_MAX */
MLD_HIDDEN unsigned mld_size_class_slow(size_t size);
static inline unsigned mld_size_class(size_t size) {
  return likely(size <= MLD_SMALL_MAX) ? mld_small_class[(size + 15) >> 4] : mld_size_class_slow(size);
}

/* hazard.c: the segment ownership map (one bit per 4 MiB granule where a segment header starts) */
MLD_HIDDEN void mld_owner_set(const void *seg, bool on);
#define MLD_OWNER_WORDS (((size_t)1 << (MLD_ADDR_BITS - MLD_SEGMENT_SHIFT)) / 64)
/* In .bss: 4 MiB of address space, zero until touched; only the words covering our segments ever become resident. */
extern _Atomic(uint64_t) mld_owner_map[MLD_OWNER_WORDS] MLD_HIDDEN;
static inline bool mld_owned(const void *seg) {
  _Atomic(uint64_t) *map = mld_owner_map;
  uintptr_t g = (uintptr_t)seg >> MLD_SEGMENT_SHIFT;
  if (unlikely(g >= ((uintptr_t)1 << (MLD_ADDR_BITS - MLD_SEGMENT_SHIFT)))) return false;
  return (atomic_load_explicit(&map[g >> 6], memory_order_relaxed) >> (g & 63)) & 1;
}
extern _Atomic(uint64_t) mld_meta_bytes MLD_HIDDEN;



/* lock helpers (arena.c) */
MLD_HIDDEN void mld_lock(pthread_mutex_t *m, lock_stats_t *st);

/* arena.c */
extern arena_t *mld_arenas[MLD_MAX_ARENAS] MLD_HIDDEN;
extern _Atomic(unsigned) mld_narenas MLD_HIDDEN;
MLD_HIDDEN arena_t *mld_arena_get(unsigned index);
MLD_HIDDEN unsigned mld_arenas_auto(void);   /* how many automatic arenas threads spread over */
MLD_HIDDEN int mld_arena_create(void);
MLD_HIDDEN page_t *mld_arena_alloc_span(arena_t *a, size_t slots, bool *zero);   /* a large block's span */
MLD_HIDDEN page_t *mld_arena_alloc_span_kind(arena_t *a, size_t slots, uint8_t kind, bool *zero);
MLD_HIDDEN void mld_arena_free_span(arena_t *a, page_t *pg);
MLD_HIDDEN bool mld_arena_trylock(arena_t *a);
MLD_HIDDEN void mld_arena_free_span_unlock(arena_t *a, page_t *pg);   /* a's lock held; released */
MLD_HIDDEN void mld_arena_free_span_noaccess(arena_t *a, page_t *pg);   /* secure: a span made PROT_NONE whole */
MLD_HIDDEN page_t *mld_arena_adopt(arena_t *a, unsigned cls, heap_t *h);
MLD_HIDDEN void mld_arena_abandon(arena_t *a, page_t *pg);
MLD_HIDDEN bool mld_arena_grow_large(arena_t *a, page_t *pg, size_t new_slots);
MLD_HIDDEN void mld_arena_shrink_large(arena_t *a, page_t *pg, size_t new_slots);
MLD_HIDDEN void mld_span_set_used(page_t *pg, size_t slots, uint8_t kind);
MLD_HIDDEN void mld_arena_reap_abandoned(arena_t *a, uint64_t now);   /* lock held */
MLD_HIDDEN extern size_t mld_arenas_fork_relisted;   /* spans a fork child listed again (being purged at the fork) */
MLD_HIDDEN void mld_segment_release(arena_t *a, segment_t *seg);       /* lock held; segment entirely free */

/* arena.c: an arena's counters as the report shows them (control/stats.c) */
typedef struct arena_snapshot_s {
  unsigned nthreads;
  uint64_t nthreads_total;
  uint64_t nsegments, dirty_bytes, purged_bytes, large_active, npurge_passes, nmadvise, purged_total;
  lock_stats_t lock;
} arena_snapshot_t;
MLD_HIDDEN void mld_arena_snapshot_of(const arena_t *a, arena_snapshot_t *s);   /* the caller holds its lock */
MLD_HIDDEN bool mld_arena_snapshot(unsigned index, arena_snapshot_t *s);        /* takes the lock */

/* arena.c: decay */
MLD_HIDDEN size_t mld_arena_maybe_purge(arena_t *a, uint64_t now);   /* lock held; returns bytes purged */
MLD_HIDDEN size_t mld_arena_purge(arena_t *a, bool all);          /* lock held; returns bytes purged */
MLD_HIDDEN long mld_decay_current(uint64_t now);                  /* the decay in force, ms (core.h mld_decay_ms) */
MLD_HIDDEN uint64_t mld_arena_next_due(arena_t *a, bool *dirty);  /* takes the lock */

/* background.c */
MLD_HIDDEN size_t mld_purge_all(bool force);                      /* returns bytes given back to the OS */
MLD_HIDDEN size_t mld_collect(bool force);                        /* heap, sweeps, then purge: bytes given back */
MLD_HIDDEN void mld_dirty_notify(void);
MLD_HIDDEN void mld_purge_wake(void);
MLD_HIDDEN void mld_purge_thread_maybe_start(void);                /* allocation slow paths only: see background.c */
MLD_HIDDEN void mld_purge_init(void);
MLD_HIDDEN void mld_purge_create_lock(void);                       /* fork handlers: before every other lock */
MLD_HIDDEN void mld_purge_create_unlock(void);
MLD_HIDDEN void mld_purge_fork_prepare(void);
MLD_HIDDEN void mld_purge_fork_parent(void);
MLD_HIDDEN void mld_purge_fork_child(void);
MLD_HIDDEN void mld_purge_new_heap(void);                          /* heap.c: a heap was made for the calling thread */

/* outbox.c */
MLD_HIDDEN void mld_outbox_add(heap_t *h, page_t *pg, block_t *b);
MLD_HIDDEN void mld_outbox_flush(heap_t *h);
MLD_HIDDEN void mld_remote_push(page_t *pg, block_t *head, block_t *tail, uint32_t n);   /* fast variant */
MLD_HIDDEN bool mld_heap_give_emptied(heap_t *o, page_t *pg, uint32_t n);   /* fast variant; heap.c */
MLD_HIDDEN void mld_remote_free_secure(heap_t *h, page_t *pg, block_t *b);             /* secure variant */
MLD_HIDDEN void mld_sweep_want(void);                              /* a send went to a page only a sweep visits */
MLD_HIDDEN uint64_t mld_sweep_due(void);                           /* when a requested sweep falls due (0: none) */
extern _Atomic(uint64_t) mld_sweep_since MLD_HIDDEN;               /* when a sweep was asked for << 1 | soon (0: none) */
/* A parked page of an owner idle this long is handed over to heaps that need one (heap.c hand_over); a send into it
 * asks for a sweep within this delay (mld_sweep_want_soon), not the sweep age. */
#define MLD_HAND_OVER_IDLE_MS 2
#define MLD_SWEEP_SOON 1u                                          /* bit 0 of mld_sweep_since: a soon request */
MLD_HIDDEN void mld_sweep_want_soon(void);
MLD_HIDDEN void mld_sweep_keep(uint64_t req);                      /* a taken request not due yet, put back */
MLD_HIDDEN uint64_t mld_sweep_request_age(uint64_t req);           /* the age a request is due at */

/* page.c */
extern page_t mld_page_empty MLD_HIDDEN;
MLD_HIDDEN void mld_page_init(page_t *pg, unsigned cls, heap_t *h);
MLD_HIDDEN bool mld_page_collect(page_t *pg);
MLD_HIDDEN bool mld_page_extend(page_t *pg);
MLD_HIDDEN void mld_page_restart(page_t *pg);
MLD_HIDDEN size_t mld_page_collect_remote(page_t *pg);
MLD_HIDDEN bool mld_page_remote_waiting(const page_t *pg);          /* remote frees wait to be collected */
MLD_HIDDEN size_t mld_page_remote_published(const page_t *pg);     /* blocks a collection would take now */
MLD_HIDDEN bool mld_page_refill(page_t *pg);

/* background.c */
/* Set while this thread allocates for Mallard itself (the profiler's tables, the unwinder's loader, the purging
 * thread's TLS): such allocations are never sampled by the profiler nor guarded. */
extern __thread bool mld_self_alloc MLD_HIDDEN;

/* heap.c */
/* The thread's heap and the heap profiler's sampling countdown (prof.h) in one TLS block: the malloc fast path
 * reaches both through one TLS offset (one GOT load in the shared library, not two). */
typedef struct mld_tls_s { heap_t *heap; uint64_t prof_left; } mld_tls_t;
extern __thread mld_tls_t mld_tls MLD_HIDDEN;
#define mld_tls_heap (mld_tls.heap)
#define MLD_TLS_PROF_LEFT (mld_tls.prof_left)
extern heap_t mld_heap_empty MLD_HIDDEN;
extern heap_t mld_exit_heap MLD_HIDDEN;                           /* threads past their heap's destructor */
MLD_HIDDEN void *mld_malloc_slow(heap_t *h, unsigned cls);
MLD_HIDDEN void mld_free_remote(page_t *pg, void *p);             /* a block of another thread's small page */
/* A page's slot in a thread's outbox (outbox.c): one page at a time, direct-mapped by descriptor address. */
static inline outbox_t *mld_outbox_slot(heap_t *h, const page_t *pg) {
  return &h->outbox[((uintptr_t)pg / sizeof(page_t)) & (MLD_OUTBOX_SLOTS - 1)];
}
#ifndef MALLARD_SECURE
/* Link b into the batch e holds for b's page, whose bytes become `bytes` (outbox.c mld_outbox_add; its common case
 * below). */
static inline void mld_outbox_link(outbox_t *e, block_t *b, uint32_t bytes) {
  b->next = e->head;
  e->head = b;
  e->count++;
  e->bytes = bytes;
}
/* A remote free's common case, inlined into free() (api.c): the block joins the batch that h's outbox holds for its
 * page already, and nothing falls due (the batch stays under MLD_OUTBOX_BLOCKS blocks and MLD_OUTBOX_BYTES bytes, the
 * outbox under MLD_OUTBOX_AGE frees since its flush): no call, no atomic. Anything else is mld_free_remote's, which
 * counts for itself. mld_heap_empty's outbox names no page, so its frees never match. Nothing is published: the
 * block, still counted in `used`, keeps its page in use while this reads the descriptor. */
static inline void mld_free_remote_fast(heap_t *h, page_t *pg, block_t *b) {
  outbox_t *e = mld_outbox_slot(h, pg);
  uint32_t bytes = e->bytes + pg->block_size;
  if (likely(e->page == pg) && likely(e->count < MLD_OUTBOX_BLOCKS - 1) && likely(bytes < MLD_OUTBOX_BYTES) &&
      likely(h->outbox_ops < MLD_OUTBOX_AGE - 1)) {
    h->stats.cls[pg->size_class].nfree++;
    h->stats.remote_frees++;
    mld_outbox_link(e, b, bytes);
    h->outbox_ops++;
    return;
  }
  mld_free_remote(pg, b);
}
#endif
MLD_HIDDEN void mld_free_parked(void *p);          /* the owner frees a block of one of its parked pages */
MLD_HIDDEN void mld_page_retire(heap_t *h, page_t *pg);            /* heap lock held */
MLD_HIDDEN void mld_page_retire_owner(heap_t *h, page_t *pg);      /* the owner's fast path emptied pg: takes the lock */
MLD_HIDDEN heap_t *mld_heap_get(void);
MLD_HIDDEN heap_t *mld_heap_get_near(const heap_t *prefer);   /* prefer: an orphan to take over first */
MLD_HIDDEN void mld_heap_collect(heap_t *h, bool force);
MLD_HIDDEN size_t mld_heaps_sweep(bool force);                    /* idle heaps' parked pages, exit heap, dead heaps */

MLD_HIDDEN void mld_heap_abandon(heap_t *h);
MLD_HIDDEN void mld_heap_exit(heap_t *h);                           /* thread exit: orphaned, or abandoned */
MLD_HIDDEN void mld_heaps_lock(void);
MLD_HIDDEN void mld_heaps_unlock(void);
MLD_HIDDEN void mld_heaps_fork_child(void);
MLD_HIDDEN bool mld_heap_bind_arena(heap_t *h, unsigned index);
MLD_HIDDEN arena_t *mld_heap_arena(heap_t *h);
extern __thread bool mld_tls_contended MLD_HIDDEN;
extern __thread bool mld_tls_exiting MLD_HIDDEN;                  /* this thread's heap was abandoned at exit */
MLD_HIDDEN void *mld_exit_alloc(unsigned cls);
MLD_HIDDEN void mld_exit_heap_lock(void);
MLD_HIDDEN void mld_exit_heap_unlock(void);
MLD_HIDDEN void mld_exit_heap_fork_child(void);
MLD_HIDDEN void mld_arena_want_reap(arena_t *a);
extern unsigned mld_auto_arenas MLD_HIDDEN;
extern _Atomic(unsigned) mld_arena_cap MLD_HIDDEN;
extern pthread_mutex_t mld_heaps_mutex MLD_HIDDEN;
extern heap_t *mld_heaps_all MLD_HIDDEN;
extern heap_stats_t mld_dead_stats MLD_HIDDEN;
extern heap_stats_t mld_orphan_stats MLD_HIDDEN;
MLD_HIDDEN void mld_stats_add(heap_stats_t *dst, const heap_stats_t *src);
/* Count into the thread's heap, or (a thread that never allocated has none) atomically into a shared record. */
#define MLD_STAT_ADD(h, field, n)                                                      \
  do {                                                                                 \
    if (likely((h) != &mld_heap_empty)) (h)->stats.field += (n);                       \
    else __atomic_fetch_add(&mld_orphan_stats.field, (n), __ATOMIC_RELAXED);           \
  } while (0)

/* large.c */
MLD_HIDDEN void *mld_large_alloc(heap_t *h, size_t size, size_t align, bool zero, size_t span_max);   /* above span_max: huge */
MLD_HIDDEN void mld_large_free(heap_t *h, page_t *pg, void *p);
MLD_HIDDEN void *mld_huge_alloc(heap_t *h, size_t size, size_t align, bool zero);
MLD_HIDDEN bool mld_huge_layout(size_t size, size_t align, size_t *off, size_t *map, size_t *usable);
MLD_HIDDEN void mld_huge_free(heap_t *h, segment_t *seg, void *p);
MLD_HIDDEN void *mld_huge_realloc(heap_t *h, segment_t *seg, void *p, size_t size);
MLD_HIDDEN bool mld_large_resize_in_place(page_t *pg, size_t size);
MLD_HIDDEN bool mld_huge_resize_within(segment_t *seg, size_t size);
MLD_HIDDEN void *mld_big_aligned_find(const void *p, bool remove);
MLD_HIDDEN size_t mld_huge_cache_purge(bool all);
MLD_HIDDEN void *mld_huge_find(const void *p);
MLD_HIDDEN void mld_huge_cache_age(void);                          /* unmap what is due; outside every lock */                     /* the huge block containing p, or NULL */
MLD_HIDDEN uint64_t mld_huge_cache_due(void);
MLD_HIDDEN size_t mld_large_quarantine_purge(bool all);          /* secure: purge quarantined large blocks now due */
MLD_HIDDEN uint64_t mld_large_quarantine_due(void);              /* secure: when the first of them falls due; 0: none */
MLD_HIDDEN void mld_huge_fork_prepare(void);
MLD_HIDDEN void mld_huge_fork_parent(void);
MLD_HIDDEN void mld_huge_fork_child(void);
extern _Atomic(uint64_t) mld_huge_active MLD_HIDDEN;
extern _Atomic(uint64_t) mld_huge_cached MLD_HIDDEN;
/* hazard.c: reading the header at a granule the ownership map marks, safe while other threads unmap segments */
MLD_HIDDEN int mld_owns_peek(const void *seg, arena_t **arena);   /* its kind (and arena), 0 when not marked */
MLD_HIDDEN void mld_owns_quiesce(const void *seg);                /* bit just cleared: waits for its readers */
MLD_HIDDEN void mld_owns_fork_child(void);
MLD_HIDDEN bool mld_owns(const void *p);                         /* owns.c: in a block of a segment or a huge block */

/* meta.c */
MLD_HIDDEN void *mld_meta_alloc(size_t size);
MLD_HIDDEN void mld_meta_fork_prepare(void);
MLD_HIDDEN void mld_meta_fork_parent(void);
MLD_HIDDEN void mld_meta_fork_child(void);
MLD_HIDDEN void mld_arenas_fork_prepare(void);
MLD_HIDDEN void mld_arenas_fork_parent(void);
MLD_HIDDEN void mld_arenas_fork_child(void);


/* state.c (written by api/init.c) and api/init.c */
extern _Atomic(int) mld_initialized MLD_HIDDEN;
extern uint64_t mld_start_ms MLD_HIDDEN;
extern pthread_key_t mld_heap_key MLD_HIDDEN;
/* Initialisation is the top layer's (api/init.c); every layer may need it first (a call of mallard_ctl, mallctl
 * or a profiler entry may be the process's first). The top layer registers its function at link time, as a
 * pointer in the section mld_init_hook (MLD_INIT_HOOK): mld_init_slow (state.c) calls it, so no layer refers up. */
#if defined(__has_attribute) && __has_attribute(retain)
#define MLD_RETAIN retain,   /* SHF_GNU_RETAIN: the section survives --gc-sections in any link */
#else
#define MLD_RETAIN
#endif
#define MLD_INIT_HOOK(fn)                                                                                \
  __attribute__((used, MLD_RETAIN section("mld_init_hook"), aligned(sizeof(void *)))) static void (*const \
      mld_init_hook_##fn)(void) = fn
MLD_HIDDEN void mld_init_slow(void);
static inline void mld_ensure_init(void) {
  if (unlikely(atomic_load_explicit(&mld_initialized, memory_order_acquire) != 2)) mld_init_slow();
}

#endif
