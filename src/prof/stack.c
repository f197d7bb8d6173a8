/* prof/stack.c — heap profiling's stacks: libgcc's unwinder (reads DWARF CFI, so frame pointers are not needed),
 * loaded with dlopen at the first sample taken in a safe context, so that the allocator depends on it only when
 * profiling runs; on musl, first an unwinder the program links in itself (docs/COMPATIBILITY.md, "musl"). */
#define _GNU_SOURCE
#include "prof/prof.h"
#include <dlfcn.h>
#include <link.h>
#include <unwind.h>

typedef _Unwind_Reason_Code (*backtrace_fn)(_Unwind_Trace_Fn, void *);
typedef _Unwind_Ptr (*getip_fn)(struct _Unwind_Context *);

static _Atomic(int) unwinder_state;          /* 0 not tried, 1 loading, 2 ready, 3 unavailable */
static backtrace_fn u_backtrace;
static getip_fn u_getip;

#ifndef __GLIBC__
/* musl: the unwinder of the program itself, when it links one (libgcc_eh or LLVM's libunwind: C++ and Rust programs
 * do; a C program with -Wl,-u,_Unwind_Backtrace). Weak, so that linking Mallard never pulls one in: a static
 * program cannot dlopen libgcc_s, and Debian's libgcc_eh.a needs glibc's _dl_find_object. */
#pragma weak _Unwind_Backtrace
#pragma weak _Unwind_GetIP

static int eh_frame_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  uintptr_t *addr = arg;
  bool inside = false, table = false;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && *addr - info->dlpi_addr - ph->p_vaddr < ph->p_memsz) inside = true;
    if (ph->p_type == PT_GNU_EH_FRAME) table = true;
  }
  if (!inside) return 0;
  *addr = table;   /* the answer; iteration stops */
  return 1;
}

/* The object holding `code` has an unwind table index (PT_GNU_EH_FRAME, from the linker's --eh-frame-hdr), where
 * unwinders look frames up: without it libgcc's finds none of the object's frames, and aborts on its own. musl-gcc
 * links without it unless told (cmake/MallardMusl.cmake). */
static bool has_unwind_index(const void *code) {
  uintptr_t a = (uintptr_t)code;
  if (!dl_iterate_phdr(eh_frame_cb, &a)) return false;   /* in no object */
  return a == 1;
}
#endif

/* No profiler lock is held here (a thread inside dlopen may be waiting for it while holding the loader's lock), and
 * the caller checked that no dlopen is in progress (glibc asserts on a dlopen nested in another's mapping phase). The
 * loader's own allocations are not sampled (mld_self_alloc). */
void mld_prof_unwinder_load(void) {
  if (atomic_load_explicit(&unwinder_state, memory_order_acquire) != 0) return;
  int expect = 0;
  if (!atomic_compare_exchange_strong(&unwinder_state, &expect, 1)) return;
#ifndef __GLIBC__
  bool linked = _Unwind_Backtrace && _Unwind_GetIP;
  if (linked && has_unwind_index((const void *)_Unwind_Backtrace) &&
      has_unwind_index((const void *)mld_prof_backtrace)) {   /* the walk starts in Mallard's frames */
    u_backtrace = _Unwind_Backtrace;
    u_getip = _Unwind_GetIP;
    atomic_store_explicit(&unwinder_state, 2, memory_order_release);
    return;
  }
#endif
  void *lib = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  void *bt = lib ? dlsym(lib, "_Unwind_Backtrace") : NULL, *ip = lib ? dlsym(lib, "_Unwind_GetIP") : NULL;
  if (bt && ip) {
    u_backtrace = (backtrace_fn)bt;
    u_getip = (getip_fn)ip;
    atomic_store_explicit(&unwinder_state, 2, memory_order_release);
  } else {
#ifdef __GLIBC__
    mld_message("mallard: prof: libgcc_s.so.1 not loadable; stacks hold the allocation's caller only\n");
#else
    mld_message("mallard: prof: %s, and libgcc_s.so.1 is not loadable; stacks hold the allocation's caller only "
                "(docs/COMPATIBILITY.md, \"musl\")\n",
                linked ? "the program's unwinder finds no frame index (link with -Wl,--eh-frame-hdr)"
                       : "the program has no unwinder");
#endif
    atomic_store_explicit(&unwinder_state, 3, memory_order_release);
  }
}

typedef struct walk_s {
  uintptr_t *pcs;
  unsigned n, max, skipped;
  uintptr_t ra;
  bool found;
} walk_t;

#define MAX_SKIP 16                            /* frames of the allocator itself above the caller */

static _Unwind_Reason_Code step(struct _Unwind_Context *ctx, void *arg) {
  walk_t *w = arg;
  uintptr_t ip = (uintptr_t)u_getip(ctx);
  if (!ip) return _URC_END_OF_STACK;
  if (!w->found) {   /* frames inside the allocator: skipped up to the one returning into its caller */
    if (ip != w->ra) return ++w->skipped > MAX_SKIP ? _URC_END_OF_STACK : _URC_NO_REASON;
    w->found = true;
  }
  w->pcs[w->n++] = ip;
  return w->n < w->max ? _URC_NO_REASON : _URC_END_OF_STACK;
}

/* The stack of the allocation whose API entry returns to `ra`: return addresses, innermost (ra) first. Without the
 * unwinder (not loaded yet, or unavailable) or when the walk does not meet ra, the stack is ra alone. */
unsigned mld_prof_backtrace(uintptr_t *pcs, unsigned max, uintptr_t ra) {
  if (atomic_load_explicit(&unwinder_state, memory_order_acquire) == 2) {
    walk_t w = { pcs, 0, max, 0, ra, false };
    u_backtrace(step, &w);
    if (w.found && w.n) return w.n;
  }
  pcs[0] = ra;
  return 1;
}
