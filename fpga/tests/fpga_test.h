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

#endif
