/* prof/gzip.c — the gzip writer of gzip.h (RFC 1952 member, RFC 1951 fixed-Huffman block, greedy LZ77 with one
 * candidate per 3-byte hash), written with write(2) through the caller's buffer. */
#define _GNU_SOURCE
#include "prof/gzip.h"
#include <errno.h>
#include <string.h>
#include <unistd.h>

static const uint16_t len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                      31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t dist_base[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                                       193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;   /* no progress and no error: give up rather than spin */
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static void gz_flush(gz_t *g) {
  if (!g->err && g->out_len) g->err = write_all(g->fd, g->out, g->out_len);
  g->out_len = 0;
}

static void gz_byte(gz_t *g, uint8_t b) {
  if (g->out_len == GZ_OUT) gz_flush(g);
  g->out[g->out_len++] = b;
}

static void gz_bits(gz_t *g, uint32_t v, unsigned n) {   /* n <= 16, and nbits < 8 between calls */
  g->bits |= (uint64_t)v << g->nbits;
  g->nbits += n;
  while (g->nbits >= 8) {
    gz_byte(g, (uint8_t)g->bits);
    g->bits >>= 8;
    g->nbits -= 8;
  }
}

static uint32_t reverse_bits(uint32_t v, unsigned n) {
  uint32_t r = 0;
  for (unsigned i = 0; i < n; i++) r |= ((v >> i) & 1) << (n - 1 - i);
  return r;
}

void mld_gz_init(gz_t *g, int fd, uint8_t *out, uint32_t *head) {
  g->fd = fd;
  g->err = 0;
  g->out = out;
  g->out_len = 0;
  g->bits = 0;
  g->nbits = 0;
  g->crc = 0xffffffffu;
  g->isize = 0;
  g->head = head;
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
    g->crc_table[i] = c;
  }
  for (uint32_t s = 0; s < 288; s++) {   /* RFC 1951 3.2.6 */
    uint32_t code, len;
    if (s < 144) code = 0x30 + s, len = 8;
    else if (s < 256) code = 0x190 + (s - 144), len = 9;
    else if (s < 280) code = s - 256, len = 7;
    else code = 0xc0 + (s - 280), len = 8;
    g->lit_code[s] = (uint16_t)reverse_bits(code, len);
    g->lit_len[s] = (uint8_t)len;
  }
  static const uint8_t hdr[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};   /* deflate, no flags, no mtime, Unix */
  for (int i = 0; i < 10; i++) gz_byte(g, hdr[i]);
  gz_bits(g, 1, 1);   /* BFINAL: the whole stream is one block */
  gz_bits(g, 1, 2);   /* BTYPE 01: fixed Huffman codes */
}

static void gz_sym(gz_t *g, unsigned s) { gz_bits(g, g->lit_code[s], g->lit_len[s]); }

static void gz_match(gz_t *g, unsigned len, unsigned dist) {
  unsigned c = 28;
  while (len_base[c] > len) c--;
  gz_sym(g, 257 + c);
  if (len_extra[c]) gz_bits(g, len - len_base[c], len_extra[c]);
  unsigned d = 29;
  while (dist_base[d] > dist) d--;
  gz_bits(g, reverse_bits(d, 5), 5);
  if (dist_extra[d]) gz_bits(g, dist - dist_base[d], dist_extra[d]);
}

static uint32_t hash3(const uint8_t *p) {
  uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
  return (v * 2654435761u) >> (32 - GZ_HASH_BITS);
}

/* Compresses n bytes (n <= GZ_CHUNK); matches refer only to earlier bytes of the same piece. */
static void gz_piece(gz_t *g, const uint8_t *p, size_t n) {
  memset(g->head, 0, sizeof(uint32_t) << GZ_HASH_BITS);
  size_t i = 0;
  while (i < n) {
    if (n - i >= 3) {
      uint32_t h = hash3(p + i);
      size_t cand = g->head[h];
      g->head[h] = (uint32_t)(i + 1);
      if (cand && i - (cand - 1) <= GZ_WINDOW) {
        const uint8_t *a = p + cand - 1, *b = p + i;
        size_t max = n - i < 258 ? n - i : 258, len = 0;
        while (len < max && a[len] == b[len]) len++;
        if (len >= 3) {
          gz_match(g, (unsigned)len, (unsigned)(i - (cand - 1)));
          for (size_t k = i + 1; k < i + len && n - k >= 3; k++) g->head[hash3(p + k)] = (uint32_t)(k + 1);
          i += len;
          continue;
        }
      }
    }
    gz_sym(g, p[i]);
    i++;
  }
}

void mld_gz_data(gz_t *g, const uint8_t *p, size_t n) {
  uint32_t c = g->crc;
  for (size_t i = 0; i < n; i++) c = g->crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  g->crc = c;
  g->isize += (uint32_t)n;   /* ISIZE is the length modulo 2^32 */
  for (size_t off = 0; off < n; off += GZ_CHUNK) gz_piece(g, p + off, n - off < GZ_CHUNK ? n - off : GZ_CHUNK);
}

int mld_gz_finish(gz_t *g) {
  gz_sym(g, 256);   /* end of block */
  if (g->nbits) gz_bits(g, 0, 8 - g->nbits);
  uint32_t crc = g->crc ^ 0xffffffffu;
  for (int i = 0; i < 4; i++) gz_byte(g, (uint8_t)(crc >> (8 * i)));
  for (int i = 0; i < 4; i++) gz_byte(g, (uint8_t)(g->isize >> (8 * i)));
  gz_flush(g);
  return g->err;
}

