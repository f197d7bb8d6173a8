/* core/state.c — the allocator's process-wide state that every layer reads: the options in force and where
 * initialisation stands. The layers above write it (control/options.c parses the options, api/init.c initialises);
 * defined here, at the bottom of its readers, so that no reader refers up to the layer that fills it. */
#include "core/core.h"

_Atomic(uint64_t) mld_decay_ext_ms;       /* the decay as lengthened (core.h mld_decay_ms); 0: not lengthened */
options_t mld_opt;                       /* zero until control/options.c fills it in mld_options_init */
_Atomic(int) mld_initialized;            /* 0: not yet, 1: in progress, 2: ready */
pthread_key_t mld_heap_key;              /* the thread's heap, for its destructor (api/init.c creates the key) */
uint64_t mld_start_ms;                   /* when the allocator was initialised */
unsigned mld_auto_arenas;                /* arenas made at start-up; arenas.create adds others for binding */

/* The linker gathers the top layer's MLD_INIT_HOOK pointers between these two symbols. Strong references: they keep
 * the section through --gc-sections, and a link without the top layer fails to link rather than at run time. */
extern void (*const __start_mld_init_hook[])(void) __attribute__((visibility("hidden")));
extern void (*const __stop_mld_init_hook[])(void) __attribute__((visibility("hidden")));

void mld_init_slow(void) {
  void (*const *f)(void) = __start_mld_init_hook, (*const *end)(void) = __stop_mld_init_hook;
  if (f == end) mld_fatal("mallard: no initialisation linked in (api/init.c missing from this link)\n");
  for (; f < end; f++) (*f)();
}
