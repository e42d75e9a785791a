/* SPDX-License-Identifier: MIT */
/*
 * fpga/tests/fpga_test.h — helpers of the fpga tests: a context of score copies written to a
 * file (the "tier's file") and kept in memory, opened with O_DIRECT when the file system allows.
 */
#ifndef FPGA_TEST_H
#define FPGA_TEST_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "device.h"
#include "score_test.h"

static inline const char *t_fpga_errtext(const kv_fpga_err *e)
{
  static char buf[512];
  kv_fpga_errmsg(e, buf, sizeof buf);
  return buf;
}

/* The emulated device (KV_FPGA_EMULATED), opened or the test fails. */
static inline kv_fpga_dev *t_emu_open(void)
{
  kv_fpga_opts o;
  kv_fpga_opts_init(&o);
  o.backend = KV_FPGA_EMULATED;
  kv_fpga_dev *dev;
  kv_fpga_err e;
  REQUIRE(kv_fpga_open(&o, &dev, &e) == KV_FPGA_OK, "open the emulated device: %s",
          t_fpga_errtext(&e));
  return dev;
}

/* A context of n_blocks sections of block_tokens tokens (the last may be shorter). */
typedef struct t_ctx {
  uint32_t n_tokens, head_dim, bits, block_tokens, n_blocks;
  uint8_t **mem;           /* each section's bytes (4 KiB aligned) */
  kv_score_view *views;    /* parsed from mem */
  uint64_t *file_off;      /* where each section lies in the file */
  char path[4096];
  int fd;                  /* O_DIRECT when possible */
  int direct;
} t_ctx;

static inline void t_ctx_make(t_ctx *c, t_rng *r, uint32_t n, uint32_t d, unsigned bits,
                              uint32_t block_tokens)
{
  memset(c, 0, sizeof *c);
  c->n_tokens = n;
  c->head_dim = d;
  c->bits = bits;
  c->block_tokens = block_tokens;
  c->n_blocks = (n + block_tokens - 1) / block_tokens;
  c->mem = calloc(c->n_blocks, sizeof *c->mem);
  c->views = calloc(c->n_blocks, sizeof *c->views);
  c->file_off = calloc(c->n_blocks, sizeof *c->file_off);
  const char *base = getenv("TMPDIR");
  snprintf(c->path, sizeof c->path, "%s/kvdb-fpga-XXXXXX", base && *base ? base : "/tmp");
  int wfd = mkstemp(c->path);
  REQUIRE(wfd >= 0, "mkstemp %s: %s", c->path, strerror(errno));
  uint16_t *k = malloc((size_t)block_tokens * d * 2);
  uint64_t off = 4096; /* something else first in the file */
  uint8_t pad[4096];
  memset(pad, 0x77, sizeof pad);
  REQUIRE(pwrite(wfd, pad, 4096, 0) == 4096, "write");
  for (uint32_t b = 0; b < c->n_blocks; b++) {
    uint32_t m = n - b * block_tokens < block_tokens ? n - b * block_tokens : block_tokens;
    for (size_t i = 0; i < (size_t)m * d; i++)
      k[i] = kv_score_f32_to_f16(t_gauss(r) * (i % d == 5 ? 6.0f : 1.0f) + (float)(b % 3) * 0.1f);
    kv_score_layout l;
    REQUIRE(kv_score_layout_init(&l, m, d, bits, NULL) == KV_SCORE_OK, "layout");
    REQUIRE(posix_memalign((void **)&c->mem[b], 4096, (size_t)l.total_bytes) == 0, "oom");
    REQUIRE(kv_score_copy_encode(KV_SCORE_F16, k, (size_t)d * 2, m, d, bits, c->mem[b],
                                 (size_t)l.total_bytes, NULL, NULL) == KV_SCORE_OK,
            "encode");
    REQUIRE(kv_score_copy_parse(c->mem[b], (size_t)l.total_bytes, &c->views[b], NULL) ==
                KV_SCORE_OK,
            "parse");
    c->file_off[b] = off;
    REQUIRE(pwrite(wfd, c->mem[b], (size_t)l.total_bytes, (off_t)off) == (ssize_t)l.total_bytes,
            "write section");
    off += l.total_bytes;
  }
  REQUIRE(fsync(wfd) == 0, "fsync");
  close(wfd);
  free(k);
  c->fd = open(c->path, O_RDONLY | O_DIRECT);
  c->direct = c->fd >= 0;
  if (c->fd < 0)
    c->fd = open(c->path, O_RDONLY);
  REQUIRE(c->fd >= 0, "open %s: %s", c->path, strerror(errno));
}

static inline void t_ctx_free(t_ctx *c)
{
  close(c->fd);
  unlink(c->path);
  for (uint32_t b = 0; b < c->n_blocks; b++)
    free(c->mem[b]);
  free(c->mem);
  free(c->views);
  free(c->file_off);
}

/*
 * The row gather (kv_fpga_gather) on dev against the bytes it read: a file of a checksum page
 * (page 0: XXH3-64 of page p with seed 1000 + p at byte 8 (p - 1)) and 15 data pages of random
 * bytes, P2P-read whole; rows of several sizes (64-byte multiples, small, odd, a whole page) at
 * random offsets of random pages, checked groups = every page holding a row. With `flip`, one
 * byte of data page 3 differs from its checksum in the file and a row from page 3 is asked for:
 * the call's status is returned (the rows are compared only on KV_FPGA_OK). *verified gets the
 * device's flag.
 */
#include <xxhash.h>

static inline kv_fpga_status t_gather_run(kv_fpga_dev *dev, t_rng *r, int flip, int *verified,
                                          kv_fpga_err *e)
{
  enum { PAGES = 16 };
  uint8_t *file = NULL;
  REQUIRE(posix_memalign((void **)&file, 4096, PAGES * 4096) == 0, "oom");
  for (size_t i = 4096; i < PAGES * 4096; i++)
    file[i] = (uint8_t)t_next(r);
  memset(file, 0, 4096);
  for (uint32_t p = 1; p < PAGES; p++) {
    uint64_t h = XXH3_64bits_withSeed(file + (size_t)p * 4096, 4096, 1000 + p);
    for (int b = 0; b < 8; b++)
      file[8 * (p - 1) + (unsigned)b] = (uint8_t)(h >> (8 * b));
  }
  if (flip)
    file[3 * 4096 + 77] ^= 0x10;
  const char *base = getenv("TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/kvdb-gather-XXXXXX", base && *base ? base : "/tmp");
  int wfd = mkstemp(path);
  REQUIRE(wfd >= 0 && pwrite(wfd, file, PAGES * 4096, 0) == PAGES * 4096 && fsync(wfd) == 0,
          "write %s", path);
  close(wfd);
  int fd = open(path, O_RDONLY | O_DIRECT);
  if (fd < 0)
    fd = open(path, O_RDONLY);
  REQUIRE(fd >= 0, "open %s", path);
  static const uint32_t sizes[] = {256, 64, 32, 100, 4096, 3};
  kv_fpga_status rc = KV_FPGA_OK;
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0] && rc == KV_FPGA_OK; si++) {
    uint32_t rb = sizes[si], n = 1 + t_below(r, 40);
    uint64_t off[40];
    kv_fpga_gcheck ck[PAGES];
    uint32_t n_ck = 0, used[PAGES] = {0};
    for (uint32_t i = 0; i < n; i++) {
      uint32_t page = (flip && i == 0) ? 3 : 1 + t_below(r, PAGES - 1);
      off[i] = (uint64_t)page * 4096 + t_below(r, 4096 - rb + 1);
      if (rb == 64 || rb == 256)
        off[i] &= ~(uint64_t)(rb - 1); /* aligned rows, as in kvdb's page groups */
      if (!used[page]) {
        used[page] = 1;
        ck[n_ck++] = (kv_fpga_gcheck){(uint64_t)page * 4096, 8u * (page - 1), 1000 + page, 4096};
      }
    }
    kv_fpga_buf *src = NULL, *desc = NULL, *dst = NULL;
    size_t stride = KV_FPGA_ROW_STRIDE(rb);
    REQUIRE(kv_fpga_buf_alloc(dev, PAGES * 4096, KV_FPGA_BUF_P2P, &src, e) == KV_FPGA_OK &&
                kv_fpga_buf_alloc(dev, (size_t)n * 8, KV_FPGA_BUF_IN, &desc, e) == KV_FPGA_OK &&
                kv_fpga_buf_alloc(dev, (size_t)n * stride, KV_FPGA_BUF_OUT, &dst, e) == KV_FPGA_OK,
            "buffers: %s", t_fpga_errtext(e));
    REQUIRE(kv_fpga_p2p_read(dev, src, 0, fd, 0, PAGES * 4096, e) == KV_FPGA_OK, "p2p: %s",
            t_fpga_errtext(e));
    kv_fpga_gather_args a = {src, desc, dst, off, n, rb, ck, n_ck};
    rc = kv_fpga_gather(dev, &a, verified, e);
    if (rc == KV_FPGA_OK) {
      uint8_t *rows = malloc((size_t)n * stride);
      REQUIRE(kv_fpga_buf_read(dev, dst, 0, rows, (size_t)n * stride, e) == KV_FPGA_OK, "read");
      int same = 1;
      for (uint32_t i = 0; i < n && same; i++) {
        same = memcmp(rows + i * stride, file + off[i], rb) == 0;
        for (size_t b = rb; b < stride && same; b++)
          same = rows[i * stride + b] == 0;
      }
      CHECK(same, "gathered rows of %u bytes equal the file's (and zero padded)", rb);
      free(rows);
    }
    kv_fpga_buf_free(src);
    kv_fpga_buf_free(desc);
    kv_fpga_buf_free(dst);
  }
  close(fd);
  unlink(path);
  free(file);
  return rc;
}

#endif
