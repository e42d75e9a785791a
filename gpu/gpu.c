/* SPDX-License-Identifier: MIT */
/*
 * gpu/gpu.c — kvdb gets into and puts from device memory over a backend (kvdb_gpu.h; the
 * backends: gpu_cuda.cu, or a test's). Only kvdb.h's public calls.
 *
 * GET. The staging buffer (pinned, grown to the largest get) is described as a packed view of
 * n tokens; kvdb_get_notify fills it block by block and tells each range [t0, t0 + c), and
 * the range's copy is queued at once on the next stream in turn (kv_gpu_plan_range: one 2-D
 * copy, a row per layer and K/V (LKTHD) or per layer, K/V and head (LKHTD)). The staging
 * bytes of a range are written once before the range is told (a retried read writes the same
 * bytes again), so a queued copy never reads bytes that change. Every stream is waited for
 * before the call returns, also after a failure.
 *
 * LENT BLOCKS. From an attached database (its DRAM tier page-locked: kvdb_gpu_attach) the get is
 * kvdb_get_lend's: each block the tier holds is lent (kvdb_lent_block), its whole data region
 * copied in one piece into the device scratch buffer of the next stream in turn, and the
 * stream's scatter (kv_gpu_scatter_ref's rearrangement, a kernel on CUDA) moves its tokens into
 * the destination; the next copy on that stream waits for the scatter (stream order), so two
 * scratch buffers keep the copy engine busy. The lent blocks are given back after every stream
 * has been waited for, also after a failure. Blocks read from a disk tier take the staging path
 * above in the same get.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_backend.h"

#define KV_GPU_MAX_ATTACHED 8

struct kvdb_gpu {
  kv_gpu_backend *be;
  void *stage;      /* pinned */
  size_t stage_cap;
  void *scratch[KV_GPU_STREAMS]; /* device: a lent block's data region, per stream */
  size_t scratch_cap[KV_GPU_STREAMS];
  struct {
    kvdb *db;
    void *base;
  } att[KV_GPU_MAX_ATTACHED];
  int n_att;
  kvdb_lent_block *lent; /* lent during the current get, given back at its end */
  size_t n_lent, lent_cap;
};

static _Thread_local char errbuf[512];
static _Thread_local int err_is_kvdb; /* the last failure was kvdb's own */

kvdb_status kv_gpu_fail(kvdb_status rc, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errbuf, sizeof errbuf, fmt, ap);
  va_end(ap);
  err_is_kvdb = 0;
  return rc;
}

const char *kvdb_gpu_errmsg(void)
{
  return err_is_kvdb ? kvdb_errmsg() : errbuf;
}

static kvdb_status kvdb_fail_through(kvdb_status rc)
{
  if (rc != KVDB_OK)
    err_is_kvdb = 1;
  return rc;
}

static kvdb_status be_fail(kvdb_gpu *g, kvdb_status rc, const char *what)
{
  return kv_gpu_fail(rc, "%s: %s (backend %s)", what, g->be->err, g->be->name);
}

kvdb_status kv_gpu_wrap(kv_gpu_backend *b, kvdb_gpu **out)
{
  *out = calloc(1, sizeof **out);
  if (*out == NULL) {
    b->destroy(b);
    return kv_gpu_fail(KVDB_NOMEM, "kvdb_gpu object");
  }
  (*out)->be = b;
  return KVDB_OK;
}

void kvdb_gpu_close(kvdb_gpu *g)
{
  if (g == NULL)
    return;
  while (g->n_att > 0)
    kvdb_gpu_detach(g, g->att[0].db);
  for (int s = 0; s < KV_GPU_STREAMS; s++)
    if (g->scratch[s] != NULL)
      g->be->dev_free(g->be, g->scratch[s]);
  free(g->lent);
  if (g->stage != NULL)
    g->be->host_free(g->be, g->stage);
  g->be->destroy(g->be);
  free(g);
}

const char *kvdb_gpu_name(const kvdb_gpu *g)
{
  return g != NULL ? g->be->name : "none";
}

int kv_gpu_plan_range(const kvdb_model *m, kvdb_layout layout, size_t n, size_t t0, size_t c,
                      kv_gpu_plan *out)
{
  size_t tb = kvdb_model_token_bytes(m);
  if (tb == 0 || t0 + c > n || c == 0)
    return -1;
  size_t row = tb / (2u * m->n_layers); /* one token of one layer's K (or V): heads x dims */
  if (layout == KVDB_LAYOUT_LKTHD) {
    /* [layer][K,V][token][head][dim]: a plane per (layer, K/V) of n rows */
    out->pitch = n * row;
    out->off = t0 * row;
    out->width = c * row;
    out->height = 2u * m->n_layers;
    return 0;
  }
  if (layout == KVDB_LAYOUT_LKHTD) {
    /* [layer][K,V][head][token][dim]: a plane per (layer, K/V, head) of n rows of one head */
    size_t hrow = row / m->n_kv_heads;
    out->pitch = n * hrow;
    out->off = t0 * hrow;
    out->width = c * hrow;
    out->height = 2u * m->n_layers * m->n_kv_heads;
    return 0;
  }
  return -1;
}

void kv_gpu_scatter_ref(void *dst, const void *src, const kv_gpu_scatter *a)
{
  const uint32_t nh = a->n_kv_heads, rb = a->row_bytes;
  for (uint32_t s = 0; s < a->n_sections; s++) {
    uint32_t l = s / (2u * nh), h = (s / 2u) % nh, kv = s & 1u;
    for (uint32_t t = 0; t < a->n_tokens; t++) {
      const char *from = (const char *)src + s * a->section_bytes +
                         (uint64_t)(t / a->group_tokens) * a->group_stride +
                         (uint64_t)(t % a->group_tokens) * rb;
      uint64_t tok = a->t0 + t, plane = (uint64_t)l * 2u + kv;
      uint64_t row = a->layout == KVDB_LAYOUT_LKTHD ? (plane * a->n + tok) * nh + h
                                                    : (plane * nh + h) * a->n + tok;
      memcpy((char *)dst + row * rb, from, rb);
    }
  }
}

static int attached(const kvdb_gpu *g, const kvdb *db)
{
  for (int i = 0; i < g->n_att; i++)
    if (g->att[i].db == db)
      return 1;
  return 0;
}

kvdb_status kvdb_gpu_attach(kvdb_gpu *g, kvdb *db)
{
  if (g == NULL || db == NULL)
    return kv_gpu_fail(KVDB_INVALID, "g or db is NULL");
  if (attached(g, db))
    return KVDB_OK;
  if (g->n_att == KV_GPU_MAX_ATTACHED)
    return kv_gpu_fail(KVDB_NOMEM, "%d databases are attached already (the most)",
                       KV_GPU_MAX_ATTACHED);
  void *base;
  size_t bytes;
  kvdb_status rc = kvdb_dram_memory(db, &base, &bytes);
  if (rc != KVDB_OK)
    return kvdb_fail_through(rc);
  if (g->be->host_register(g->be, base, bytes) != 0)
    return kv_gpu_fail(KVDB_IOERR, "page-locking the DRAM tier (%zu bytes): %s (backend %s)",
                       bytes, g->be->err, g->be->name);
  g->att[g->n_att].db = db;
  g->att[g->n_att].base = base;
  g->n_att++;
  return KVDB_OK;
}

void kvdb_gpu_detach(kvdb_gpu *g, kvdb *db)
{
  if (g == NULL)
    return;
  for (int i = 0; i < g->n_att; i++)
    if (g->att[i].db == db) {
      g->be->host_unregister(g->be, g->att[i].base);
      g->att[i] = g->att[--g->n_att];
      return;
    }
}

/* The staging buffer holds at least `bytes`. */
static kvdb_status stage_reserve(kvdb_gpu *g, size_t bytes)
{
  if (g->stage_cap >= bytes)
    return KVDB_OK;
  if (g->stage != NULL)
    g->be->host_free(g->be, g->stage);
  g->stage = NULL;
  g->stage_cap = 0;
  if (g->be->host_alloc(g->be, bytes, &g->stage) != 0)
    return be_fail(g, KVDB_NOMEM, "pinned staging buffer");
  g->stage_cap = bytes;
  return KVDB_OK;
}

typedef struct pipe {
  kvdb_gpu *g;
  const kvdb_model *m;
  kvdb_layout layout;
  size_t n;
  void *dev;
  int next_stream;
  kvdb_status rc; /* the first failure of a queued copy */
} pipe;

/* A lent block: its data region to the next stream's scratch buffer, then the scatter into
 * the destination; kept for kvdb_lent_return. 0 (not taken: copied into the staging buffer
 * as any other block) after a failure, or when the block cannot be recorded. */
static int on_lend(void *ctx, const kvdb_lent_block *b)
{
  pipe *p = ctx;
  kvdb_gpu *g = p->g;
  kv_gpu_backend *be = g->be;
  if (p->rc != KVDB_OK)
    return 0;
  if (g->n_lent == g->lent_cap) {
    size_t cap = g->lent_cap ? 2 * g->lent_cap : 64;
    kvdb_lent_block *nl = realloc(g->lent, cap * sizeof *nl);
    if (nl == NULL)
      return 0;
    g->lent = nl;
    g->lent_cap = cap;
  }
  int s = p->next_stream;
  if (g->scratch_cap[s] < b->data_bytes) {
    /* grown before its first use in a get, or after its stream's work is done */
    if (be->sync(be, s) != 0) {
      p->rc = be_fail(g, KVDB_IOERR, "waiting for the copies");
      return 0;
    }
    if (g->scratch[s] != NULL)
      be->dev_free(be, g->scratch[s]);
    g->scratch[s] = NULL;
    g->scratch_cap[s] = 0;
    if (be->dev_alloc(be, b->data_bytes, &g->scratch[s]) != 0) {
      p->rc = be_fail(g, KVDB_NOMEM, "device scratch buffer");
      return 0;
    }
    g->scratch_cap[s] = b->data_bytes;
  }
  g->lent[g->n_lent++] = *b; /* ours now: given back after the streams are waited for */
  kv_gpu_scatter a = {b->n_sections, p->m->n_kv_heads, b->group_tokens, b->row_bytes,
                      b->group_stride, (uint32_t)b->n_tokens, b->section_bytes, p->n, b->t0,
                      (int)p->layout};
  p->next_stream = (s + 1) % KV_GPU_STREAMS;
  if (b->t0 + b->n_tokens > p->n)
    p->rc = kv_gpu_fail(KVDB_PANIC, "lent range [%zu, %zu) of %zu tokens", b->t0,
                        b->t0 + b->n_tokens, p->n);
  else if (be->copy2d(be, s, g->scratch[s], b->data, b->data_bytes, b->data_bytes, 1, 1) != 0)
    p->rc = be_fail(g, KVDB_IOERR, "copy of a DRAM-tier block to the device");
  else if (be->scatter(be, s, p->dev, g->scratch[s], &a) != 0)
    p->rc = be_fail(g, KVDB_IOERR, "scatter on the device");
  return 1;
}

static void on_block(void *ctx, size_t t0, size_t c)
{
  pipe *p = ctx;
  kv_gpu_plan pl;
  if (p->rc != KVDB_OK)
    return;
  if (kv_gpu_plan_range(p->m, p->layout, p->n, t0, c, &pl) != 0) {
    p->rc = kv_gpu_fail(KVDB_PANIC, "range [%zu, %zu) of %zu tokens", t0, t0 + c, p->n);
    return;
  }
  kv_gpu_backend *b = p->g->be;
  int s = p->next_stream;
  p->next_stream = (s + 1) % KV_GPU_STREAMS;
  if (b->copy2d(b, s, (char *)p->dev + pl.off, (const char *)p->g->stage + pl.off, pl.pitch,
                pl.width, pl.height, 1) != 0)
    p->rc = be_fail(p->g, KVDB_IOERR, "copy to the device");
}

/* Wait for every stream; the first failure wins over rc only when rc is KVDB_OK. */
static kvdb_status sync_all(kvdb_gpu *g, kvdb_status rc)
{
  for (int s = 0; s < KV_GPU_STREAMS; s++)
    if (g->be->sync(g->be, s) != 0 && rc == KVDB_OK)
      rc = be_fail(g, KVDB_IOERR, "waiting for the copies");
  return rc;
}

static kvdb_status check_args(kvdb_gpu *g, kvdb *db, const kvdb_model *m, const void *tokens,
                              size_t n, const void *dev, kvdb_layout layout)
{
  if (g == NULL || db == NULL || m == NULL || tokens == NULL || dev == NULL)
    return kv_gpu_fail(KVDB_INVALID, "a NULL argument (g, db, m, tokens or dev)");
  if (n == 0)
    return kv_gpu_fail(KVDB_INVALID, "n is 0");
  if (layout != KVDB_LAYOUT_LKTHD && layout != KVDB_LAYOUT_LKHTD)
    return kv_gpu_fail(KVDB_INVALID, "layout %d is not KVDB_LAYOUT_LKTHD or KVDB_LAYOUT_LKHTD",
                       (int)layout);
  if (kvdb_model_token_bytes(m) == 0)
    return kv_gpu_fail(KVDB_INVALID, "bad model (kvdb_model_token_bytes is 0)");
  if (n > SIZE_MAX / kvdb_model_token_bytes(m))
    return kv_gpu_fail(KVDB_INVALID, "n %zu tokens: the buffer's size overflows", n);
  return KVDB_OK;
}

kvdb_status kvdb_gpu_get(kvdb_gpu *g, kvdb *db, const kvdb_model *m, const uint32_t *tokens,
                         size_t n, void *dev, kvdb_layout layout, size_t *hit_tokens)
{
  if (hit_tokens == NULL)
    return kv_gpu_fail(KVDB_INVALID, "hit_tokens is NULL");
  *hit_tokens = 0;
  kvdb_status rc = check_args(g, db, m, tokens, n, dev, layout);
  if (rc != KVDB_OK)
    return rc;
  if ((rc = stage_reserve(g, n * kvdb_model_token_bytes(m))) != KVDB_OK)
    return rc;
  kvdb_kv_view v;
  if ((rc = kvdb_kv_view_packed(&v, g->stage, m, n, layout)) != KVDB_OK)
    return kvdb_fail_through(rc);
  pipe p = {g, m, layout, n, dev, 0, KVDB_OK};
  g->n_lent = 0;
  rc = kvdb_get_lend(db, m, tokens, n, &v, hit_tokens, on_block,
                     attached(g, db) ? on_lend : NULL, &p);
  if (rc != KVDB_OK)
    err_is_kvdb = 1;
  kvdb_status rs = sync_all(g, p.rc); /* whatever happened: nothing stays in flight */
  for (size_t i = 0; i < g->n_lent; i++)
    kvdb_lent_return(db, &g->lent[i]);
  g->n_lent = 0;
  if (rc == KVDB_OK && rs != KVDB_OK) {
    *hit_tokens = 0;
    return rs;
  }
  return rc;
}

kvdb_status kvdb_gpu_put(kvdb_gpu *g, kvdb *db, const kvdb_model *m, const uint32_t *tokens,
                         size_t n, const void *dev, kvdb_layout layout, kvdb_put_info *info)
{
  kvdb_status rc = check_args(g, db, m, tokens, n, dev, layout);
  if (rc != KVDB_OK)
    return rc;
  if ((rc = stage_reserve(g, n * kvdb_model_token_bytes(m))) != KVDB_OK)
    return rc;
  /* block-sized pieces on the streams in turn (256 tokens: kvdb's default block) */
  size_t piece = m->block_tokens ? m->block_tokens : 256;
  int s = 0;
  for (size_t t0 = 0; t0 < n && rc == KVDB_OK; t0 += piece) {
    size_t c = n - t0 < piece ? n - t0 : piece;
    kv_gpu_plan pl;
    if (kv_gpu_plan_range(m, layout, n, t0, c, &pl) != 0)
      rc = kv_gpu_fail(KVDB_PANIC, "range [%zu, %zu) of %zu tokens", t0, t0 + c, n);
    else if (g->be->copy2d(g->be, s, (char *)g->stage + pl.off, (const char *)dev + pl.off,
                           pl.pitch, pl.width, pl.height, 0) != 0)
      rc = be_fail(g, KVDB_IOERR, "copy from the device");
    s = (s + 1) % KV_GPU_STREAMS;
  }
  rc = sync_all(g, rc);
  if (rc != KVDB_OK)
    return rc;
  kvdb_kv_view v;
  if ((rc = kvdb_kv_view_packed(&v, g->stage, m, n, layout)) != KVDB_OK)
    return kvdb_fail_through(rc);
  return kvdb_fail_through(kvdb_put(db, m, tokens, n, &v, info));
}

kvdb_status kvdb_gpu_alloc(kvdb_gpu *g, size_t bytes, void **dev)
{
  if (g == NULL || dev == NULL)
    return kv_gpu_fail(KVDB_INVALID, "g or dev is NULL");
  return g->be->dev_alloc(g->be, bytes, dev) == 0 ? KVDB_OK
                                                    : be_fail(g, KVDB_NOMEM, "device memory");
}

void kvdb_gpu_free(kvdb_gpu *g, void *dev)
{
  if (g != NULL && dev != NULL)
    g->be->dev_free(g->be, dev);
}

kvdb_status kvdb_gpu_host_alloc(kvdb_gpu *g, size_t bytes, void **host)
{
  if (g == NULL || host == NULL)
    return kv_gpu_fail(KVDB_INVALID, "g or host is NULL");
  return g->be->host_alloc(g->be, bytes, host) == 0 ? KVDB_OK
                                                      : be_fail(g, KVDB_NOMEM, "pinned memory");
}

void kvdb_gpu_host_free(kvdb_gpu *g, void *host)
{
  if (g != NULL && host != NULL)
    g->be->host_free(g->be, host);
}

kvdb_status kvdb_gpu_copy(kvdb_gpu *g, void *dst, const void *src, size_t bytes, int to_device)
{
  if (g == NULL || dst == NULL || src == NULL)
    return kv_gpu_fail(KVDB_INVALID, "g, dst or src is NULL");
  if (bytes == 0)
    return KVDB_OK;
  if (g->be->copy2d(g->be, 0, dst, src, bytes, bytes, 1, to_device) != 0)
    return sync_all(g, be_fail(g, KVDB_IOERR, "copy"));
  return sync_all(g, KVDB_OK);
}
