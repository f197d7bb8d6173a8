/* prof/pprof.c — the heap profile writer: pprof's profile.proto encoded by hand, gzip-compressed (fixed-Huffman
 * deflate with a small LZ77, gzip.c), written with write(2); every byte of memory it uses is mapped here, never malloc'd.
 *
 * What goes into a profile (pprof's proto/profile.proto):
 *  - sample_type: alloc_objects/count, alloc_space/bytes, inuse_objects/count, inuse_space/bytes (that order);
 *    period_type space/bytes with the caller's period; default_sample_type inuse_space; time and duration.
 *  - one Sample per sample given, values as given, its frames as location ids (frames whose pc is 0 dropped).
 *  - one Location per distinct pc, address pc - 1: the pcs are return addresses, and pc - 1 lies inside the call
 *    instruction, so that pprof, addr2line and `mallard heap` report the line of the call, not the next one.
 *  - Mappings: the executable (r-x) file mappings of /proc/self/maps, the main program's first (pprof convention),
 *    with start, limit, file offset, file name and the GNU build ID in hex (read from the PT_NOTE segments that
 *    dl_iterate_phdr shows in memory: no file is read). has_functions stays false: pprof then still symbolises the
 *    mapping from the binary on disk where it can (DWARF: file:line, and names of static functions), and keeps our
 *    names where it cannot (stripped binaries, libraries without DWARF). Measured with go tool pprof 1.26: `true`
 *    would lose file:line and every function missing from .dynsym; `false` costs only the name of a function whose
 *    out-of-line copy refers to its name through DW_AT_abstract_origin (Go's reader shows it with file:line only).
 *  - Function names from the dynamic symbol tables (glibc: dladdr1(RTLD_DL_SYMENT); musl: the tables read through
 *    dl_iterate_phdr), accepted only if pc - 1 lies inside [st_value, st_value + st_size) of that function symbol: a
 *    neighbouring exported symbol is no answer. name and system_name are the symbol as linked (C++ names mangled:
 *    pprof demangles them). A static program has no dynamic symbols: pprof names its functions from the binary.
 * Memory: growable buffers (platform plain mappings) and open-addressing hash tables, all unmapped before returning. */
#define _GNU_SOURCE
#include "platform/platform.h"
#include "prof/pprof.h"
#include "prof/gzip.h"
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- mapped memory ------------------------------------------------------------------------------------------- */
#define PP_MIN_MAP ((size_t)64 * 1024)

static void *pp_map(size_t size) { return mld_os_map_plain(size, true); }

/* A growable byte buffer; cap is 0 or a power of two >= PP_MIN_MAP (a whole number of pages). */
typedef struct { uint8_t *p; size_t len, cap; } pbuf_t;

static int buf_reserve(pbuf_t *b, size_t more) {
  if (more <= b->cap - b->len) return 0;
  size_t need;
  if (__builtin_add_overflow(b->len, more, &need)) return ENOMEM;
  size_t cap = b->cap ? b->cap : PP_MIN_MAP;
  while (cap < need) {
    if (cap > SIZE_MAX / 2) return ENOMEM;
    cap *= 2;
  }
  void *q = b->p ? mld_os_remap_plain(b->p, b->cap, cap) : mld_os_map_plain(cap, true);
  if (!q) return ENOMEM;
  b->p = q;
  b->cap = cap;
  return 0;
}

static void buf_free(pbuf_t *b) {
  if (b->p) mld_os_unmap_plain(b->p, b->cap);
  b->p = NULL;
  b->len = b->cap = 0;
}

static int buf_append(pbuf_t *b, const void *src, size_t n) {
  int e = buf_reserve(b, n);
  if (e) return e;
  memcpy(b->p + b->len, src, n);
  b->len += n;
  return 0;
}

/* ---- hash table: nonzero 64-bit key -> 32-bit value ---------------------------------------------------------- */
/* Open addressing, linear probing, at most half full; key 0 marks an empty slot. Strings keep several entries with
 * the same key (their hash) apart by comparing contents: see str_intern. */
typedef struct { uint64_t *keys; uint32_t *vals; size_t cap, count; } pmap_t;

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

static size_t map_bytes(size_t cap) { return cap * (sizeof(uint64_t) + sizeof(uint32_t)); }

static void map_free(pmap_t *m) {
  if (m->keys) mld_os_unmap_plain(m->keys, map_bytes(m->cap));
  m->keys = NULL;
  m->vals = NULL;
  m->cap = m->count = 0;
}

static int map_alloc(pmap_t *m, size_t cap) {
  if (cap > SIZE_MAX / (2 * (sizeof(uint64_t) + sizeof(uint32_t)))) return ENOMEM;
  void *p = pp_map(map_bytes(cap));
  if (!p) return ENOMEM;
  m->keys = p;
  m->vals = (uint32_t *)(m->keys + cap);   /* cap is a power of two >= 1024: the values stay aligned */
  m->cap = cap;
  m->count = 0;
  return 0;
}

/* The slot holding `key`, or the empty slot where it would go. */
static size_t map_slot(const pmap_t *m, uint64_t key) {
  size_t mask = m->cap - 1, i = (size_t)mix64(key) & mask;
  while (m->keys[i] != 0 && m->keys[i] != key) i = (i + 1) & mask;
  return i;
}

/* Makes room for one more entry (doubling at half full, moving every entry). */
static int map_grow(pmap_t *m) {
  if (m->cap && m->count + 1 <= m->cap / 2) return 0;
  pmap_t n;
  if (m->cap > SIZE_MAX / 2) return ENOMEM;
  int e = map_alloc(&n, m->cap ? m->cap * 2 : 1024);
  if (e) return e;
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i]) continue;
    size_t j = (size_t)mix64(m->keys[i]) & (n.cap - 1);
    while (n.keys[j]) j = (j + 1) & (n.cap - 1);   /* duplicates (strings) each get their own slot */
    n.keys[j] = m->keys[i];
    n.vals[j] = m->vals[i];
  }
  n.count = m->count;
  map_free(m);
  *m = n;
  return 0;
}

/* ---- protobuf encoding --------------------------------------------------------------------------------------- */
enum { WT_VARINT = 0, WT_LEN = 2 };
#define VARINT_MAX 10

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t *put_varint(uint8_t *q, uint64_t v) {
  while (v >= 0x80) {
    *q++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *q++ = (uint8_t)v;
  return q;
}

static uint8_t *put_tag(uint8_t *q, unsigned field, unsigned wt) { return put_varint(q, (uint64_t)field << 3 | wt); }

/* A varint field; int64 values are written as their two's complement (negative: 10 bytes), as protobuf does. */
static uint8_t *put_field(uint8_t *q, unsigned field, uint64_t v) { return put_varint(put_tag(q, field, WT_VARINT), v); }

/* Appends a message field whose body (already encoded, `n` bytes at `body`) is copied after tag and length. */
static int put_message(pbuf_t *b, unsigned field, const uint8_t *body, size_t n) {
  int e = buf_reserve(b, n);
  if (!e) e = buf_reserve(b, n + 2 * VARINT_MAX);   /* n + 20 cannot overflow: the first reserve fit n */
  if (e) return e;
  uint8_t *q = put_varint(put_tag(b->p + b->len, field, WT_LEN), n);
  memcpy(q, body, n);
  b->len = (size_t)(q + n - b->p);
  return 0;
}

/* ---- the writer's state -------------------------------------------------------------------------------------- */
typedef struct { uint64_t off, len; } pstr_t;                    /* a string's bytes in `strtab` */
typedef struct { uintptr_t pc; } ploc_t;                          /* location id = index + 1 */
typedef struct { uint64_t start, limit, offset; uint64_t name, build_id; uint32_t id; bool main; } pmapping_t;
typedef struct { uintptr_t lo, hi; char build_id[2 * 64 + 1]; bool main; } pobj_t;   /* an object's code */

typedef struct {
  pbuf_t strtab;      /* encoded string_table fields (6), in index order */
  pbuf_t strs;        /* pstr_t per string index */
  pmap_t strmap;      /* FNV-1a hash -> string index + 1 */
  pbuf_t samples;     /* encoded sample fields (2) */
  pbuf_t locs;        /* ploc_t per location */
  pmap_t locmap;      /* pc -> location index + 1 */
  pbuf_t funcs;       /* encoded function fields (5) */
  pmap_t funcmap;     /* symbol address -> function id */
  uint32_t nfuncs;
  pbuf_t mappings;    /* pmapping_t, in address order */
  pbuf_t objs;        /* pobj_t: loaded objects' code ranges and build IDs (dl_iterate_phdr) */
  pbuf_t scratch;     /* one sample's location ids, then one message body */
  pbuf_t out;         /* the other encoded fields: locations (4), mappings (3), header and trailer fields */
} pp_t;

static void pp_free(pp_t *s) {
  pbuf_t *bufs[] = {&s->strtab, &s->strs, &s->samples, &s->locs, &s->funcs, &s->mappings, &s->objs, &s->scratch,
                    &s->out};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) buf_free(bufs[i]);
  map_free(&s->strmap);
  map_free(&s->locmap);
  map_free(&s->funcmap);
}

/* The string table index of `str` (n bytes), adding it on first sight. */
static int str_intern(pp_t *s, const char *str, size_t n, uint64_t *idx) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)str[i]) * 0x100000001b3ULL;
  if (h == 0) h = 1;   /* 0 marks empty slots */
  int e = map_grow(&s->strmap);
  if (e) return e;
  size_t mask = s->strmap.cap - 1, i = (size_t)mix64(h) & mask;
  const pstr_t *tab = (const pstr_t *)s->strs.p;
  for (; s->strmap.keys[i] != 0; i = (i + 1) & mask) {
    if (s->strmap.keys[i] != h) continue;
    const pstr_t *t = &tab[s->strmap.vals[i] - 1];
    if (t->len == n && memcmp(s->strtab.p + t->off, str, n) == 0) {
      *idx = s->strmap.vals[i] - 1;
      return 0;
    }
  }
  uint64_t count = s->strs.len / sizeof(pstr_t);
  if (count >= UINT32_MAX - 1) return ENOMEM;
  if ((e = buf_reserve(&s->strtab, n)) || (e = buf_reserve(&s->strtab, n + 2 * VARINT_MAX))) return e;
  uint8_t *q = put_varint(put_tag(s->strtab.p + s->strtab.len, 6, WT_LEN), n);
  pstr_t rec = {(uint64_t)(q - s->strtab.p), n};
  memcpy(q, str, n);
  s->strtab.len = (size_t)(q + n - s->strtab.p);
  if ((e = buf_append(&s->strs, &rec, sizeof rec))) return e;
  s->strmap.keys[i] = h;
  s->strmap.vals[i] = (uint32_t)count + 1;
  s->strmap.count++;
  *idx = count;
  return 0;
}

static int str_intern_c(pp_t *s, const char *str, uint64_t *idx) { return str_intern(s, str, strlen(str), idx); }

/* ---- loaded objects: code ranges and build IDs (dl_iterate_phdr; reads memory only) ------------------------- */
static bool in_loaded(const struct dl_phdr_info *info, uintptr_t vaddr, size_t size) {
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && vaddr >= ph->p_vaddr && vaddr - ph->p_vaddr <= ph->p_filesz &&
        size <= ph->p_filesz - (vaddr - ph->p_vaddr))
      return true;
  }
  return false;
}

/* The GNU build ID of the object, in lower-case hex, from its PT_NOTE segments; "" when it has none. */
static void object_build_id(const struct dl_phdr_info *info, char *hex, size_t hex_size) {
  static const char digits[] = "0123456789abcdef";
  hex[0] = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_NOTE || !in_loaded(info, ph->p_vaddr, ph->p_filesz)) continue;   /* only what is mapped */
    size_t align = ph->p_align == 8 ? 8 : 4;
    const uint8_t *p = (const uint8_t *)(info->dlpi_addr + ph->p_vaddr);
    size_t left = ph->p_filesz;
    while (left >= sizeof(ElfW(Nhdr))) {
      ElfW(Nhdr) nh;
      memcpy(&nh, p, sizeof nh);
      size_t name_sz = ((size_t)nh.n_namesz + align - 1) & ~(align - 1);   /* 32-bit fields: no overflow */
      size_t desc_sz = ((size_t)nh.n_descsz + align - 1) & ~(align - 1);
      size_t body = sizeof nh;
      if (name_sz > left - body) break;
      body += name_sz;
      if (desc_sz > left - body) break;
      if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 && memcmp(p + sizeof nh, "GNU", 4) == 0 &&
          nh.n_descsz > 0 && (size_t)nh.n_descsz * 2 < hex_size) {
        const uint8_t *d = p + body;
        for (size_t k = 0; k < nh.n_descsz; k++) {
          hex[2 * k] = digits[d[k] >> 4];
          hex[2 * k + 1] = digits[d[k] & 15];
        }
        hex[2 * (size_t)nh.n_descsz] = 0;
        return;
      }
      body += desc_sz;
      p += body;
      left -= body;
    }
  }
}

typedef struct { pp_t *s; int err; bool first; } objs_ctx_t;

static int objs_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  objs_ctx_t *c = arg;
  bool main = c->first;   /* the first object dl_iterate_phdr reports is the main program */
  c->first = false;
  char hex[2 * 64 + 1];
  object_build_id(info, hex, sizeof hex);
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X) || ph->p_memsz == 0) continue;
    pobj_t o = {.lo = info->dlpi_addr + ph->p_vaddr, .main = main};
    o.hi = o.lo + ph->p_memsz;
    memcpy(o.build_id, hex, sizeof hex);
    if ((c->err = buf_append(&c->s->objs, &o, sizeof o))) return 1;
  }
  return 0;
}

/* ---- mappings: the executable file mappings of /proc/self/maps ----------------------------------------------- */
static const char *parse_hex(const char *p, const char *end, uint64_t *v) {
  uint64_t x = 0;
  const char *s = p;
  for (; p < end; p++) {
    unsigned d;
    if (*p >= '0' && *p <= '9') d = (unsigned)(*p - '0');
    else if (*p >= 'a' && *p <= 'f') d = (unsigned)(*p - 'a' + 10);
    else break;
    if (x >> 60) return NULL;   /* more than 64 bits */
    x = x << 4 | d;
  }
  *v = x;
  return p == s ? NULL : p;
}

static const char *skip_field(const char *p, const char *end) {
  while (p < end && *p != ' ') p++;
  while (p < end && *p == ' ') p++;
  return p;
}

/* One line "start-limit perms offset dev inode   path" (no newline); keeps executable mappings of files. */
static int maps_line(pp_t *s, const char *p, const char *end) {
  uint64_t start, limit, offset;
  if (!(p = parse_hex(p, end, &start)) || p >= end || *p++ != '-' || !(p = parse_hex(p, end, &limit))) return 0;
  if (end - p < 5 || p[0] != ' ' || p[3] != 'x') return 0;   /* " rwxp": executable only */
  p = skip_field(p + 1, end);
  if (!(p = parse_hex(p, end, &offset))) return 0;
  p = skip_field(p, end);   /* to dev */
  p = skip_field(p, end);   /* to inode */
  p = skip_field(p, end);   /* to the path, which may hold spaces */
  if (p >= end || *p != '/' || limit <= start) return 0;
  pmapping_t m = {.start = start, .limit = limit, .offset = offset};
  int e = str_intern(s, p, (size_t)(end - p), &m.name);
  if (e) return e;
  const pobj_t *objs = (const pobj_t *)s->objs.p;
  size_t nobj = s->objs.len / sizeof(pobj_t);
  const char *bid = "";
  for (size_t i = 0; i < nobj; i++) {
    if (objs[i].lo < limit && start < objs[i].hi) {   /* the object's code lies in this mapping */
      bid = objs[i].build_id;
      m.main = objs[i].main;
      break;
    }
  }
  if ((e = str_intern_c(s, bid, &m.build_id))) return e;
  return buf_append(&s->mappings, &m, sizeof m);
}

/* Reads /proc/self/maps with read(2) into a mapped buffer; lines longer than the buffer are skipped. Without
 * /proc the profile has no mappings (locations keep their addresses and names). */
static int read_maps(pp_t *s) {
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  enum { LINE_MAX_BYTES = 3 * PATH_MAX };
  int e = buf_reserve(&s->scratch, 4 * PATH_MAX);
  size_t have = 0;
  bool skipping = false;   /* inside a line too long for the buffer */
  while (!e) {
    ssize_t r = read(fd, s->scratch.p + have, s->scratch.cap - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    have += (size_t)r;
    char *p = (char *)s->scratch.p, *end = p + have, *nl;
    while (!e && (nl = memchr(p, '\n', (size_t)(end - p)))) {
      if (!skipping) e = maps_line(s, p, nl);
      skipping = false;
      p = nl + 1;
    }
    have = (size_t)(end - p);
    if (have > LINE_MAX_BYTES) {   /* drop the head of an overlong line */
      skipping = true;
      have = 0;
    }
    memmove(s->scratch.p, p, have);
  }
  close(fd);
  s->scratch.len = 0;
  return e;
}

/* ---- locations and functions ---------------------------------------------------------------------------------- */
/* The location id of pc, adding it on first sight. */
static int location_id(pp_t *s, uintptr_t pc, uint64_t *id) {
  int e = map_grow(&s->locmap);
  if (e) return e;
  size_t i = map_slot(&s->locmap, pc);
  if (s->locmap.keys[i]) {
    *id = s->locmap.vals[i];
    return 0;
  }
  uint64_t count = s->locs.len / sizeof(ploc_t);
  if (count >= UINT32_MAX - 1) return ENOMEM;
  ploc_t l = {pc};
  if ((e = buf_append(&s->locs, &l, sizeof l))) return e;
  s->locmap.keys[i] = pc;
  s->locmap.vals[i] = (uint32_t)count + 1;
  s->locmap.count++;
  *id = count + 1;
  return 0;
}

#ifdef __GLIBC__
/* The function symbol whose [value, value + size) holds addr: its name and start. glibc: dladdr1 gives the symbol
 * entry, whose type and size decide (dladdr alone would name the nearest exported symbol below addr). */
static bool symbol_of(uintptr_t addr, const char **name, uintptr_t *lo) {
  Dl_info dl;
  const ElfW(Sym) *sym = NULL;
  if (!dladdr1((void *)addr, &dl, (void **)&sym, RTLD_DL_SYMENT) || !dl.dli_sname || !dl.dli_sname[0] || !sym ||
      !dl.dli_saddr)
    return false;
  uintptr_t start = (uintptr_t)dl.dli_saddr;
  unsigned type = ELF64_ST_TYPE(sym->st_info);
  if ((type != STT_FUNC && type != STT_GNU_IFUNC) || addr < start || addr - start >= sym->st_size) return false;
  *name = dl.dli_sname;
  *lo = start;
  return true;
}
#else
/* Without dladdr1 (musl; its dladdr takes symbols of any type, and one of size 0 at any distance): the dynamic
 * symbol table of the object holding addr, read in memory through dl_iterate_phdr. A static program has none: its
 * names come from the binary on disk, which pprof reads through the mapping. */
typedef struct { uintptr_t addr, lo; const char *name; } sym_query_t;

/* A dynamic-section address: glibc relocates them in place, musl leaves them relative to the load base. */
static uintptr_t dyn_ptr(const struct dl_phdr_info *info, uintptr_t v) {
  return v < info->dlpi_addr ? info->dlpi_addr + v : v;
}

/* The number of dynamic symbols: DT_HASH's nchain, else one past the last symbol of DT_GNU_HASH's chains. */
static size_t dyn_symbols(const uint32_t *hash, const uint32_t *gnu) {
  if (hash) return hash[1];
  if (!gnu) return 0;
  uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_words = gnu[2];
  const uint32_t *buckets = gnu + 4 + (size_t)bloom_words * (sizeof(ElfW(Addr)) / 4);
  const uint32_t *chains = buckets + nbuckets;   /* chains[i - symoffset]: symbol i's hash, bit 0 ends a chain */
  uint32_t last = 0;
  for (uint32_t i = 0; i < nbuckets; i++) if (buckets[i] > last) last = buckets[i];
  if (last < symoffset) return symoffset;
  while (!(chains[last - symoffset] & 1)) last++;
  return (size_t)last + 1;
}

static int symbol_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  sym_query_t *q = arg;
  const ElfW(Dyn) *dyn = NULL;
  bool inside = false;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type == PT_LOAD && q->addr - info->dlpi_addr - ph->p_vaddr < ph->p_memsz) inside = true;
    if (ph->p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(info->dlpi_addr + ph->p_vaddr);
  }
  if (!inside) return 0;
  if (!dyn) return 1;   /* the object holding addr has no dynamic symbols: stop here */
  const ElfW(Sym) *syms = NULL;
  const char *strs = NULL;
  const uint32_t *hash = NULL, *gnu = NULL;
  size_t strsz = 0;
  for (; dyn->d_tag != DT_NULL; dyn++) {
    if (dyn->d_tag == DT_SYMTAB) syms = (const ElfW(Sym) *)dyn_ptr(info, dyn->d_un.d_ptr);
    else if (dyn->d_tag == DT_STRTAB) strs = (const char *)dyn_ptr(info, dyn->d_un.d_ptr);
    else if (dyn->d_tag == DT_STRSZ) strsz = dyn->d_un.d_val;
    else if (dyn->d_tag == DT_HASH) hash = (const uint32_t *)dyn_ptr(info, dyn->d_un.d_ptr);
    else if (dyn->d_tag == DT_GNU_HASH) gnu = (const uint32_t *)dyn_ptr(info, dyn->d_un.d_ptr);
  }
  if (!syms || !strs) return 1;
  size_t n = dyn_symbols(hash, gnu);
  for (size_t i = 1; i < n; i++) {   /* symbol 0 is the undefined one */
    const ElfW(Sym) *sym = &syms[i];
    unsigned type = ELF64_ST_TYPE(sym->st_info);
    if ((type != STT_FUNC && type != STT_GNU_IFUNC) || sym->st_shndx == SHN_UNDEF || !sym->st_size ||
        sym->st_name >= strsz || !strs[sym->st_name])
      continue;
    uintptr_t start = info->dlpi_addr + sym->st_value;
    if (q->addr >= start && q->addr - start < sym->st_size) {
      q->lo = start;
      q->name = strs + sym->st_name;
      break;
    }
  }
  return 1;
}

static bool symbol_of(uintptr_t addr, const char **name, uintptr_t *lo) {
  sym_query_t q = {addr, 0, NULL};
  dl_iterate_phdr(symbol_cb, &q);
  if (!q.name) return false;
  *name = q.name;
  *lo = q.lo;
  return true;
}
#endif

/* The function id naming `addr` (a call instruction), or 0: a function symbol is accepted only if addr lies within
 * its [value, value + size). */
static int function_id(pp_t *s, uintptr_t addr, uint64_t *id) {
  *id = 0;
  const char *sname;
  uintptr_t lo;
  if (!symbol_of(addr, &sname, &lo)) return 0;
  int e = map_grow(&s->funcmap);
  if (e) return e;
  size_t i = map_slot(&s->funcmap, lo);
  if (s->funcmap.keys[i]) {
    *id = s->funcmap.vals[i];
    return 0;
  }
  uint64_t name;
  if ((e = str_intern_c(s, sname, &name))) return e;
  if (s->nfuncs >= UINT32_MAX - 1) return ENOMEM;
  uint32_t fid = s->nfuncs + 1;
  uint8_t body[3 * (1 + VARINT_MAX)], *q = body;
  q = put_field(q, 1, fid);
  q = put_field(q, 2, name);   /* name */
  q = put_field(q, 3, name);   /* system_name: the same, as linked */
  if ((e = put_message(&s->funcs, 5, body, (size_t)(q - body)))) return e;
  s->nfuncs = fid;
  s->funcmap.keys[i] = lo;
  s->funcmap.vals[i] = fid;
  s->funcmap.count++;
  *id = fid;
  return 0;
}

/* The mapping holding addr (binary search over the address-ordered mappings), or NULL. */
static const pmapping_t *mapping_of(const pp_t *s, uintptr_t addr) {
  const pmapping_t *m = (const pmapping_t *)s->mappings.p;
  size_t lo = 0, hi = s->mappings.len / sizeof(pmapping_t);
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (addr < m[mid].start) hi = mid;
    else if (addr >= m[mid].limit) lo = mid + 1;
    else return &m[mid];
  }
  return NULL;
}

/* ---- samples --------------------------------------------------------------------------------------------------- */
static int add_sample(pp_t *s, const mld_pprof_sample_t *smp) {
  if (smp->depth && !smp->pcs) return EINVAL;
  size_t ids_bytes = 0;   /* packed location ids */
  s->scratch.len = 0;
  int e = 0;
  for (uint32_t k = 0; k < smp->depth; k++) {
    if (smp->pcs[k] == 0) continue;   /* the end marker of some unwinders: no frame */
    uint64_t id;
    if ((e = location_id(s, smp->pcs[k], &id)) || (e = buf_append(&s->scratch, &id, sizeof id))) return e;
    ids_bytes += varint_len(id);   /* at most 5 bytes per 8-byte id kept in scratch: cannot overflow */
  }
  const int64_t v[4] = {smp->alloc_objects, smp->alloc_space, smp->inuse_objects, smp->inuse_space};
  size_t val_bytes = 0;
  for (int k = 0; k < 4; k++) val_bytes += varint_len((uint64_t)v[k]);
  size_t body = 1 + varint_len(val_bytes) + val_bytes;
  if (ids_bytes) body += 1 + varint_len(ids_bytes) + ids_bytes;   /* bounded by the scratch size: no overflow */
  if ((e = buf_reserve(&s->samples, body)) || (e = buf_reserve(&s->samples, body + 2 * VARINT_MAX))) return e;
  uint8_t *q = put_varint(put_tag(s->samples.p + s->samples.len, 2, WT_LEN), body);
  if (ids_bytes) {
    q = put_varint(put_tag(q, 1, WT_LEN), ids_bytes);   /* location_id, packed */
    const uint64_t *ids = (const uint64_t *)s->scratch.p;
    for (size_t k = 0; k < s->scratch.len / sizeof(uint64_t); k++) q = put_varint(q, ids[k]);
  }
  q = put_varint(put_tag(q, 2, WT_LEN), val_bytes);   /* value, packed */
  for (int k = 0; k < 4; k++) q = put_varint(q, (uint64_t)v[k]);
  s->samples.len = (size_t)(q - s->samples.p);
  return 0;
}

/* ---- the other sections ---------------------------------------------------------------------------------------- */
static int put_value_type(pbuf_t *b, unsigned field, uint64_t type, uint64_t unit) {
  uint8_t body[2 * (1 + VARINT_MAX)], *q = body;
  q = put_field(q, 1, type);
  q = put_field(q, 2, unit);
  return put_message(b, field, body, (size_t)(q - body));
}

/* Mapping ids: the main program's mappings first, then the others in address order. */
static int encode_mappings(pp_t *s) {
  pmapping_t *m = (pmapping_t *)s->mappings.p;
  size_t n = s->mappings.len / sizeof(pmapping_t);
  uint32_t id = 0;
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < n; i++)
      if (m[i].main == (pass == 0)) m[i].id = ++id;
  for (uint32_t want = 1; want <= id; want++) {
    for (size_t i = 0; i < n; i++) {
      if (m[i].id != want) continue;
      uint8_t body[6 * (1 + VARINT_MAX)], *q = body;
      q = put_field(q, 1, m[i].id);
      q = put_field(q, 2, m[i].start);
      q = put_field(q, 3, m[i].limit);
      if (m[i].offset) q = put_field(q, 4, m[i].offset);
      q = put_field(q, 5, m[i].name);
      if (m[i].build_id) q = put_field(q, 6, m[i].build_id);
      int e = put_message(&s->out, 3, body, (size_t)(q - body));
      if (e) return e;
      break;
    }
  }
  return 0;
}

static int encode_locations(pp_t *s) {
  size_t n = s->locs.len / sizeof(ploc_t);
  for (size_t i = 0; i < n; i++) {
    uintptr_t addr = ((const ploc_t *)s->locs.p)[i].pc - 1;   /* the call instruction (pc is nonzero) */
    const pmapping_t *m = mapping_of(s, addr);
    uint64_t fid;
    int e = function_id(s, addr, &fid);
    if (e) return e;
    uint8_t body[4 * (1 + VARINT_MAX) + 2 + VARINT_MAX], *q = body;
    q = put_field(q, 1, i + 1);
    if (m) q = put_field(q, 2, m->id);
    q = put_field(q, 3, addr);
    if (fid) {
      uint8_t line[1 + VARINT_MAX];
      size_t ln = (size_t)(put_field(line, 1, fid) - line);   /* Line { function_id } */
      q = put_varint(put_tag(q, 4, WT_LEN), ln);
      memcpy(q, line, ln);
      q += ln;
    }
    if ((e = put_message(&s->out, 4, body, (size_t)(q - body)))) return e;
  }
  return 0;
}

/* ---- the writer ------------------------------------------------------------------------------------------------ */
static int pp_build(pp_t *s, const mld_pprof_info_t *info, mld_pprof_next_fn next, void *ctx) {
  /* String indices 0..7, fixed: "" first (protobuf's rule for pprof), then the sample and period types. */
  static const char *const fixed[] = {"", "alloc_objects", "count", "alloc_space", "bytes", "inuse_objects",
                                      "inuse_space", "space"};
  uint64_t idx;
  int e = 0;
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] && !e; i++) e = str_intern_c(s, fixed[i], &idx);
  if (e) return e;
  objs_ctx_t oc = {s, 0, true};
  dl_iterate_phdr(objs_cb, &oc);
  if (oc.err) return oc.err;
  if ((e = read_maps(s))) return e;
  mld_pprof_sample_t smp;
  while (next(ctx, &smp))
    if ((e = add_sample(s, &smp))) return e;
  if ((e = encode_mappings(s)) || (e = encode_locations(s))) return e;
  /* Profile fields after the string table: sample types, period, times, default sample type. */
  if ((e = put_value_type(&s->out, 1, 1, 2)) || (e = put_value_type(&s->out, 1, 3, 4)) ||
      (e = put_value_type(&s->out, 1, 5, 2)) || (e = put_value_type(&s->out, 1, 6, 4)) ||
      (e = put_value_type(&s->out, 11, 7, 4)) || (e = buf_reserve(&s->out, 4 * (1 + VARINT_MAX))))
    return e;
  uint8_t *q = s->out.p + s->out.len;
  q = put_field(q, 9, (uint64_t)info->time_nanos);
  q = put_field(q, 10, (uint64_t)info->duration_nanos);
  q = put_field(q, 12, (uint64_t)info->period);
  q = put_field(q, 14, 6);   /* default_sample_type: "inuse_space" */
  s->out.len = (size_t)(q - s->out.p);
  return 0;
}

int mld_pprof_write(int fd, const mld_pprof_info_t *info, mld_pprof_next_fn next, void *ctx) {
  if (!info || !next) return EINVAL;
  pp_t s;
  memset(&s, 0, sizeof s);
  int e = pp_build(&s, info, next, ctx);
  if (!e) {
    size_t ws = GZ_SCRATCH;
    uint8_t *w = pp_map(ws);
    if (!w) {
      e = ENOMEM;
    } else {
      gz_t *g = (gz_t *)(w + GZ_OUT + (sizeof(uint32_t) << GZ_HASH_BITS));
      mld_gz_init(g, fd, w, (uint32_t *)(w + GZ_OUT));
      /* Field order is free in protobuf; pprof resolves string indices after reading the whole message. */
      mld_gz_data(g, s.out.p, s.out.len);
      mld_gz_data(g, s.samples.p, s.samples.len);
      mld_gz_data(g, s.funcs.p, s.funcs.len);
      mld_gz_data(g, s.strtab.p, s.strtab.len);
      e = mld_gz_finish(g);
      mld_os_unmap_plain(w, ws);
    }
  }
  pp_free(&s);
  return e;
}

int mld_pprof_write_file(const char *path, const mld_pprof_info_t *info, mld_pprof_next_fn next, void *ctx) {
  if (!path || !info || !next) return EINVAL;
  char tmp[PATH_MAX];
  size_t n = strlen(path);
  char pid[24];
  size_t np = 0;
  for (unsigned long v = (unsigned long)getpid(); np == 0 || v; v /= 10) pid[np++] = (char)('0' + v % 10);
  static const char mid[] = ".tmp.";
  if (n >= sizeof tmp - (sizeof mid - 1) - np) return ENAMETOOLONG;   /* room for mid, pid and the NUL */
  memcpy(tmp, path, n);
  memcpy(tmp + n, mid, sizeof mid - 1);
  n += sizeof mid - 1;
  while (np) tmp[n++] = pid[--np];
  tmp[n] = 0;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  int e = mld_pprof_write(fd, info, next, ctx);
  if (close(fd) != 0 && !e) e = errno;   /* e.g. a delayed write error on NFS */
  if (!e && rename(tmp, path) != 0) e = errno;
  if (e) unlink(tmp);
  return e;
}
