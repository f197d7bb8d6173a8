/* prof/gzip.h — a gzip writer for the heap profiler: one fixed-Huffman deflate block with greedy LZ77, CRC-32, ISIZE;
 * output goes to a file descriptor through a caller-provided buffer, nothing is allocated. */
#ifndef MALLARD_GZIP_H
#define MALLARD_GZIP_H
#include <stddef.h>
#include <stdint.h>

#define GZ_OUT ((size_t)64 * 1024)
#define GZ_HASH_BITS 15
#define GZ_WINDOW 32768
#define GZ_CHUNK ((size_t)1 << 30)   /* input positions in the hash table are 32-bit: compress in pieces this big */

typedef struct {
  int fd, err;
  uint8_t *out;                      /* GZ_OUT bytes, flushed with write(2) when full */
  size_t out_len;
  uint64_t bits;                     /* pending bits, LSB first */
  unsigned nbits;
  uint32_t crc, isize;               /* CRC-32 and length mod 2^32 of the uncompressed data */
  uint32_t crc_table[256];
  uint16_t lit_code[288];            /* fixed Huffman codes, bit-reversed for LSB-first output */
  uint8_t lit_len[288];
  uint32_t *head;                    /* 1 << GZ_HASH_BITS: last position + 1 with that hash, 0 for none */
} gz_t;

/* Scratch the caller maps: GZ_OUT output bytes, then the hash table (uint32_t << GZ_HASH_BITS), then the gz_t. */
#define GZ_SCRATCH (GZ_OUT + (sizeof(uint32_t) << GZ_HASH_BITS) + sizeof(gz_t))

/* Writes the gzip header and opens the deflate block; out holds GZ_OUT bytes, head 1 << GZ_HASH_BITS entries. */
__attribute__((visibility("hidden"))) void mld_gz_init(gz_t *g, int fd, uint8_t *out, uint32_t *head);
/* Compresses n more bytes of the member's data. */
__attribute__((visibility("hidden"))) void mld_gz_data(gz_t *g, const uint8_t *p, size_t n);
/* Closes the block, writes CRC-32 and ISIZE, flushes: 0, or the first write error (errno value). */
__attribute__((visibility("hidden"))) int mld_gz_finish(gz_t *g);
#endif
