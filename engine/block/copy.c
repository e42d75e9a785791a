/* SPDX-License-Identifier: MIT */
/*
 * engine/block/copy.c — copies between a block's page-grouped sections and a caller's
 * strided layout (kvdb_kv_view). The only place that interprets caller strides.
 *
 * Fast path: dims contiguous (dim_stride == element size) -> one copy per (token, head) row.
 *
 * Stores. A put gathers with ordinary stores: the section is checksummed right after, while
 * it is still in cache (measured: gather + checksum in place 25 ms per 128 MiB, against 30 ms
 * through a scratch buffer and 33 ms with non-temporal stores and a checksum pass from memory).
 * A large scatter (kv_scatter_streams) into the caller's buffer uses non-temporal stores when rows are 16-byte
 * multiples at 16-byte aligned addresses: per-row memcpy of 256-byte rows uses ordinary stores,
 * whose cache lines are read before they are written (a third memory stream), which held the
 * DRAM-tier get to ~0.5x memcpy. Small copies (get_tokens) keep ordinary stores: the caller
 * is about to use the data and it fits in cache.
 */
#include "cblock.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#define KV_HAVE_NT 1
#else
#define KV_HAVE_NT 0
#endif

/* Scatters of at least this many bytes use non-temporal stores where the layout allows. */
#define KV_NT_MIN_BYTES (1u << 20)

static uint8_t *elem_addr(const kvdb_tensor_view *t, uint32_t layer, uint64_t token, uint32_t head)
{
  uint8_t *base = t->layer_bases ? (uint8_t *)t->layer_bases[layer]
                                 : (uint8_t *)t->base + (int64_t)layer * t->layer_stride;
  return base + (int64_t)token * t->token_stride + (int64_t)head * t->head_stride;
}

#if KV_HAVE_NT
/* n bytes, n a multiple of 16, dst 16-byte aligned. */
static void copy_nt(uint8_t *dst, const uint8_t *src, size_t n)
{
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
    _mm_stream_si128((__m128i *)(dst + i), a);
    _mm_stream_si128((__m128i *)(dst + i + 16), b);
    _mm_stream_si128((__m128i *)(dst + i + 32), c);
    _mm_stream_si128((__m128i *)(dst + i + 48), d);
  }
  for (; i < n; i += 16)
    _mm_stream_si128((__m128i *)(dst + i), _mm_loadu_si128((const __m128i *)(src + i)));
}
#endif

static void copy_row(uint8_t *dst, int64_t dst_step, const uint8_t *src, int64_t src_step,
                     uint32_t n, uint32_t eb, int nt)
{
  if (dst_step == eb && src_step == eb) {
    size_t len = (size_t)n * eb;
#if KV_HAVE_NT
    if (nt && (len & 15) == 0 && ((uintptr_t)dst & 15) == 0) {
      copy_nt(dst, src, len);
      return;
    }
#else
    (void)nt;
#endif
    memcpy(dst, src, len);
    return;
  }
  for (uint32_t i = 0; i < n; i++)
    memcpy(dst + (int64_t)i * dst_step, src + (int64_t)i * src_step, eb);
}

static void nt_fence(int nt)
{
#if KV_HAVE_NT
  if (nt)
    _mm_sfence(); /* order the streaming stores before anything the caller does next */
#else
  (void)nt;
#endif
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

void kv_gather_section(const kv_block_geom *g, const kvdb_kv_view *v, uint64_t t0, uint32_t s,
                       uint8_t *data)
{
  const uint32_t eb = g->elem_bytes;
  uint32_t kv = s & 1, h = (s >> 1) % g->n_kv_heads, l = (s >> 1) / g->n_kv_heads;
  const kvdb_tensor_view *tv = kv ? &v->v : &v->k;
  int64_t ds = dstep(tv, eb);
  for (uint32_t t = 0; t < g->n_tokens; t++)
    copy_row((uint8_t *)row_in(g, data, s, t), eb, elem_addr(tv, l, t0 + t, h), ds, g->head_dim,
             eb, 0);
}

void kv_gather_rows(const kv_block_geom *g, const kvdb_kv_view *v, uint64_t t0, uint32_t s,
                    uint8_t *rows)
{
  const uint32_t eb = g->elem_bytes;
  uint32_t kv = s & 1, h = (s >> 1) % g->n_kv_heads, l = (s >> 1) / g->n_kv_heads;
  const kvdb_tensor_view *tv = kv ? &v->v : &v->k;
  int64_t ds = dstep(tv, eb);
  for (uint32_t t = 0; t < g->n_tokens; t++)
    copy_row(rows + (uint64_t)t * g->row_bytes, eb, elem_addr(tv, l, t0 + t, h), ds, g->head_dim,
             eb, 0);
}

void kv_gather_head(const kvdb_kv_view *v, uint32_t elem_bytes, uint32_t head_dim,
                    uint32_t layer, uint32_t head, int is_v, uint64_t t0, uint64_t n,
                    uint8_t *rows)
{
  const kvdb_tensor_view *tv = is_v ? &v->v : &v->k;
  int64_t ds = dstep(tv, elem_bytes);
  size_t row = (size_t)head_dim * elem_bytes;
  for (uint64_t t = 0; t < n; t++)
    copy_row(rows + t * row, elem_bytes, elem_addr(tv, layer, t0 + t, head), ds, head_dim,
             elem_bytes, 0);
}

void kv_rows_to_section(const kv_block_geom *g, const uint8_t *rows, uint32_t s, uint8_t *data)
{
  if (g->group_stride == (uint64_t)g->group_tokens * g->row_bytes) {
    memcpy(data + (uint64_t)s * g->section_bytes, rows, (size_t)g->n_tokens * g->row_bytes);
    return;
  }
  for (uint32_t t = 0; t < g->n_tokens; t++)
    memcpy((uint8_t *)row_in(g, data, s, t), rows + (uint64_t)t * g->row_bytes, g->row_bytes);
}

void kv_scatter_rows(const kv_block_geom *g, const uint8_t *rows, uint32_t n_rows, uint32_t s,
                     const kvdb_kv_view *v, uint64_t t0)
{
  const uint32_t eb = g->elem_bytes;
  uint32_t kv = s & 1, h = (s >> 1) % g->n_kv_heads, l = (s >> 1) / g->n_kv_heads;
  const kvdb_tensor_view *tv = kv ? &v->v : &v->k;
  int64_t ds = dstep(tv, eb);
  for (uint32_t r = 0; r < n_rows; r++)
    copy_row(elem_addr(tv, l, t0 + r, h), ds, rows + (uint64_t)r * g->row_bytes, eb, g->head_dim,
             eb, 0);
}

uint8_t *kv_view_section_rows(const kv_block_geom *g, const kvdb_kv_view *v, uint32_t s,
                              uint64_t t0, size_t *stride)
{
  const uint32_t eb = g->elem_bytes;
  uint32_t kv = s & 1, h = (s >> 1) % g->n_kv_heads, l = (s >> 1) / g->n_kv_heads;
  const kvdb_tensor_view *tv = kv ? &v->v : &v->k;
  if (dstep(tv, eb) != (int64_t)eb || tv->token_stride < (int64_t)g->row_bytes)
    return NULL; /* elements apart, or tokens not ascending by at least a row */
  *stride = (size_t)tv->token_stride;
  return elem_addr(tv, l, t0, h);
}

void kv_gather(const kv_block_geom *g, const kvdb_kv_view *v, uint64_t t0, uint8_t *data)
{
  for (uint32_t s = 0; s < g->n_sections; s++)
    kv_gather_section(g, v, t0, s, data);
}

int kv_scatter_streams(const kv_block_geom *g, uint32_t n)
{
  return (uint64_t)g->n_sections * n * g->row_bytes >= KV_NT_MIN_BYTES;
}

void kv_scatter_sections(const kv_block_geom *g, const uint8_t *data, uint32_t s0, uint32_t s1,
                         uint32_t from, uint32_t n, const kvdb_kv_view *v, uint64_t t0,
                         int stream)
{
  const uint32_t eb = g->elem_bytes, nh = g->n_kv_heads;
  if (s0 >= s1)
    return;
  for (uint32_t l = s0 / (2 * nh); l <= (s1 - 1) / (2 * nh); l++)
    for (uint32_t kv = 0; kv < 2; kv++) {
      /* the heads of this (layer, K/V) plane whose sections are in [s0, s1) */
      uint32_t h0 = nh, h1 = 0;
      for (uint32_t h = 0; h < nh; h++) {
        uint32_t sec = (l * nh + h) * 2 + kv;
        if (sec >= s0 && sec < s1) {
          h0 = h < h0 ? h : h0;
          h1 = h + 1;
        }
      }
      if (h0 >= h1)
        continue;
      const kvdb_tensor_view *tv = kv ? &v->v : &v->k;
      int64_t ds = dstep(tv, eb);
      if (tv->head_stride == (int64_t)g->row_bytes && ds == (int64_t)eb) {
        /* heads adjacent in the caller's buffer (vLLM's [.., token, head, dim]): a token's
         * rows of every head back to back, so each cache line is written whole even when
         * the buffer is not 64-byte aligned (malloc's is 16): 9.7 against 1.7 GB/s with
         * non-temporal stores, measured */
        for (uint32_t t = from; t < from + n; t++)
          for (uint32_t h = h0; h < h1; h++)
            copy_row(elem_addr(tv, l, t0 + (t - from), h), ds,
                     row_in(g, data, (l * nh + h) * 2 + kv, t), eb, g->head_dim, eb, stream);
      } else {
        for (uint32_t h = h0; h < h1; h++)
          for (uint32_t t = from; t < from + n; t++)
            copy_row(elem_addr(tv, l, t0 + (t - from), h), ds,
                     row_in(g, data, (l * nh + h) * 2 + kv, t), eb, g->head_dim, eb, stream);
      }
    }
  nt_fence(stream);
}

void kv_scatter(const kv_block_geom *g, const uint8_t *data, uint32_t from, uint32_t n,
                const kvdb_kv_view *v, uint64_t t0)
{
  kv_scatter_sections(g, data, 0, g->n_sections, from, n, v, t0, kv_scatter_streams(g, n));
}

void kv_put_row(const kv_block_geom *g, uint32_t s, const uint8_t *row, const kvdb_kv_view *v,
                uint64_t dst_tok)
{
  const uint32_t eb = g->elem_bytes;
  uint32_t kv = s & 1, h = (s >> 1) % g->n_kv_heads;
  const kvdb_tensor_view *tv = kv ? &v->v : &v->k;
  copy_row(elem_addr(tv, 0, dst_tok, h), dstep(tv, eb), row, eb, g->head_dim, eb, 0);
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
               g->head_dim, eb, 0);
    }
}
