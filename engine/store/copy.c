/* SPDX-License-Identifier: MIT */
/*
 * engine/store/copy.c — copies between a block's page-grouped sections and a caller's
 * strided layout (kvdb_kv_view). The only place that interprets caller strides.
 *
 * Fast path: dims contiguous (dim_stride == element size) -> one memcpy per (token, head) row.
 */
#include "kv_db.h"

static uint8_t *elem_addr(const kvdb_tensor_view *t, uint32_t layer, uint64_t token, uint32_t head)
{
  uint8_t *base = t->layer_bases ? (uint8_t *)t->layer_bases[layer]
                                 : (uint8_t *)t->base + (int64_t)layer * t->layer_stride;
  return base + (int64_t)token * t->token_stride + (int64_t)head * t->head_stride;
}

static void copy_row(uint8_t *dst, int64_t dst_step, const uint8_t *src, int64_t src_step,
                     uint32_t n, uint32_t eb)
{
  if (dst_step == eb && src_step == eb) {
    memcpy(dst, src, (size_t)n * eb);
    return;
  }
  for (uint32_t i = 0; i < n; i++)
    memcpy(dst + (int64_t)i * dst_step, src + (int64_t)i * src_step, eb);
}

static int64_t dstep(const kvdb_tensor_view *t, uint32_t eb)
{
  return t->dim_stride ? t->dim_stride : (int64_t)eb;
}

static inline const uint8_t *row_in(const kv_block_geom *g, const uint8_t *data, uint32_t s,
                                    uint32_t t)
{
  return data + (uint64_t)s * g->section_bytes + (uint64_t)(t / g->group_tokens) * g->group_stride +
         (uint64_t)(t % g->group_tokens) * g->row_bytes;
}

void kv_gather(const kv_block_geom *g, const kvdb_kv_view *v, uint64_t t0, uint8_t *data)
{
  const uint32_t eb = g->elem_bytes;
  for (uint32_t l = 0; l < g->n_layers; l++)
    for (uint32_t h = 0; h < g->n_kv_heads; h++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        const kvdb_tensor_view *tv = kv ? &v->v : &v->k;
        uint32_t s = (l * g->n_kv_heads + h) * 2 + kv;
        int64_t ds = dstep(tv, eb);
        for (uint32_t t = 0; t < g->n_tokens; t++)
          copy_row((uint8_t *)row_in(g, data, s, t), eb, elem_addr(tv, l, t0 + t, h), ds,
                   g->head_dim, eb);
      }
}

void kv_scatter(const kv_block_geom *g, const uint8_t *data, uint32_t from, uint32_t n,
                const kvdb_kv_view *v, uint64_t t0)
{
  const uint32_t eb = g->elem_bytes;
  for (uint32_t l = 0; l < g->n_layers; l++)
    for (uint32_t h = 0; h < g->n_kv_heads; h++)
      for (uint32_t kv = 0; kv < 2; kv++) {
        const kvdb_tensor_view *tv = kv ? &v->v : &v->k;
        uint32_t s = (l * g->n_kv_heads + h) * 2 + kv;
        int64_t ds = dstep(tv, eb);
        for (uint32_t t = from; t < from + n; t++)
          copy_row(elem_addr(tv, l, t0 + (t - from), h), ds, row_in(g, data, s, t), eb,
                   g->head_dim, eb);
      }
}

void kv_scatter_token_layer(const kv_block_geom *g, const uint8_t *data, uint32_t layer,
                            uint32_t t, const kvdb_kv_view *v, uint64_t dst_tok)
{
  const uint32_t eb = g->elem_bytes;
  for (uint32_t h = 0; h < g->n_kv_heads; h++)
    for (uint32_t kv = 0; kv < 2; kv++) {
      const kvdb_tensor_view *tv = kv ? &v->v : &v->k;
      uint32_t s = (layer * g->n_kv_heads + h) * 2 + kv;
      copy_row(elem_addr(tv, 0, dst_tok, h), dstep(tv, eb), row_in(g, data, s, t), eb,
               g->head_dim, eb);
    }
}
