/* live_fakeroot.c: a copy of Mallard's live root (found with dlsym) with one thing changed, for the reader to judge.
 * Run under Mallard (LD_PRELOAD=libmallard.so): prints "root ADDRESS" and "ready", then waits for a line on stdin.
 * MODE: same (an exact copy: read as the real one), shuffled (the field table in reverse order, plus an entry of an
 * id no reader knows: read as the real one, since fields are found by id), offset (a class counter's offset outside
 * its record), classes (a different size-class table), missing (one field left out), twice (one field listed twice),
 * arenas (an absurd arena count), text (an options text without its NUL), kind (a global described as a member),
 * size (a counter of 3 bytes). Header (docs/STATS.md): magic[8], version, header size, lib_version[16], nfields,
 * field size, address of the table; entries: id, kind, size, count, where (24 bytes). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct entry_s { uint32_t id, kind, size, count; uint64_t where; } entry_t;

static unsigned char root[4096];
static entry_t table[512];
static uint32_t classes[1024];
static char text[64];

static entry_t *find(uint32_t n, uint32_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (table[i].id == id) return &table[i];
    fprintf(stderr, "field %u not found\n", id);
    return &table[n];   /* a spare entry: the change lands nowhere, the test then fails on its expectation */
}

int main(int argc, char **argv)
{
    const unsigned char *real = dlsym(RTLD_DEFAULT, "mallard_live_root");
    if (argc != 2 || !real) { fprintf(stderr, "usage: live_fakeroot MODE (under Mallard)\n"); return 2; }
    uint32_t hsize, n, fsize;
    const entry_t *real_table;
    memcpy(&hsize, real + 12, 4);
    memcpy(&n, real + 32, 4);
    memcpy(&fsize, real + 36, 4);
    memcpy(&real_table, real + 40, sizeof real_table);
    if (hsize > sizeof root || n + 2 > sizeof table / sizeof table[0] || fsize != sizeof(entry_t)) {
        fprintf(stderr, "unexpected root\n");
        return 1;
    }
    memcpy(root, real, hsize);
    memcpy(table, real_table, n * sizeof *table);
    const char *m = argv[1];
    /* ids (docs/STATS.md): 6 arenas, 13 options text, 14 class sizes, 35 a class's nfree, 21 page_cache */
    if (!strcmp(m, "shuffled")) {
        for (uint32_t i = 0; i < n / 2; i++) {
            entry_t t = table[i];
            table[i] = table[n - 1 - i];
            table[n - 1 - i] = t;
        }
        table[n++] = (entry_t){ 9999, 1, 8, 1, 0x10 };   /* unknown to the reader: skipped, even if unreadable */
    } else if (!strcmp(m, "offset")) find(n, 35)->where = 1u << 20;
    else if (!strcmp(m, "classes")) {
        entry_t *e = find(n, 14);
        if (e->size != 4 || e->count > 1024) return 1;
        memcpy(classes, (const void *)(uintptr_t)e->where, e->count * 4);
        classes[3] += 8;
        e->where = (uint64_t)(uintptr_t)classes;
    } else if (!strcmp(m, "missing")) find(n, 21)->id = 0;
    else if (!strcmp(m, "twice")) {
        entry_t e = *find(n, 21);
        table[n++] = e;
    }
    else if (!strcmp(m, "arenas")) find(n, 6)->count = 1u << 30;
    else if (!strcmp(m, "text")) {
        memset(text, 'x', sizeof text);
        entry_t *e = find(n, 13);
        e->where = (uint64_t)(uintptr_t)text;
        e->count = sizeof text;
    } else if (!strcmp(m, "kind")) find(n, 21)->kind = 2;
    else if (!strcmp(m, "size")) find(n, 21)->size = 3;
    else if (strcmp(m, "same")) { fprintf(stderr, "unknown mode %s\n", m); return 2; }
    uint64_t t = (uint64_t)(uintptr_t)table;
    memcpy(root + 32, &n, 4);
    memcpy(root + 40, &t, 8);
    printf("root %lu\nready\n", (unsigned long)(uintptr_t)root);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) { /* EOF: exit as well */ }
    return 0;
}
