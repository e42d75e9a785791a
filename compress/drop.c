/* SPDX-License-Identifier: MIT */
/*
 * compress/drop.c — token dropping: choosing which tokens of a head to keep (knorm, keydiff,
 * snapkv; the EvicPress §6.1 baselines) and the "drop" codec (id 4) that stores them.
 *
 * Selection runs once per KV head on its K section and yields sorted positions; the K and the
 * V section of that head are then both encoded with the drop codec and those positions, so
 * the two always keep the same tokens. The codec stores a keep bitmap over the original
 * tokens (n/8 bytes: cheaper than 4-byte positions at any keep ratio above 1/32) and the kept
 * rows, raw or KIVI-quantized (drop first, then quantize the kept rows); the residual of a
 * quantized drop section is its last `residual` kept rows.
 *
 * Ranking is a total order — score descending, NaN lowest, then position ascending — so
 * every platform and every qsort keeps the same tokens.
 */
#include "codec_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- selection ------------------------------------------------------------------------------- */

typedef struct scored {
  double s;
  uint32_t i;
} scored;

static int cmp_scored(const void *a, const void *b)
{
  const scored *x = a, *y = b;
  int xn = isnan(x->s), yn = isnan(y->s);
  if (xn != yn)
    return xn - yn;
  if (!xn && x->s != y->s)
    return x->s > y->s ? -1 : 1;
  return (x->i > y->i) - (x->i < y->i);
}

static inline size_t al8(size_t n)
{
  return (n + 7) & ~(size_t)7;
}

static int window_ok(const kv_snapkv_window *w, uint32_t n_tokens)
{
  unsigned kernel = w->kernel ? w->kernel : KV_SNAPKV_KERNEL_DEFAULT;
  return w->q != NULL && w->n_obs > 0 && w->n_q_heads > 0 &&
         (uint64_t)w->n_obs * w->n_q_heads <= (1u << 24) && (kernel & 1u) && kernel < 65536 &&
         (w->pool == KV_POOL_MAX || w->pool == KV_POOL_AVG) &&
         (w->tail_window == 0 || (w->tail_window == 1 && w->n_obs <= n_tokens));
}

size_t kv_drop_scratch_bytes(kv_drop_method m, uint32_t n_tokens, uint32_t head_dim,
                             const kv_snapkv_window *win)
{
  if (n_tokens == 0 || n_tokens > KV_CODEC_MAX_TOKENS || head_dim == 0 ||
      head_dim > KV_CODEC_MAX_HEAD_DIM)
    return 0;
  size_t n = n_tokens, d = head_dim;
  /* scored[n], keep flags[n], a float row, a double row */
  size_t b = KV_CODEC_SCRATCH_SLACK + al8(sizeof(scored) * n) + al8(n) + al8(4 * d) + 8 * d;
  switch (m) {
  case KV_DROP_KNORM:
  case KV_DROP_KEYDIFF:
    return win == NULL ? b : 0;
  case KV_DROP_SNAPKV:
    if (win == NULL || !window_ok(win, n_tokens))
      return 0;
    /* K as float [n][d], accumulated scores and pooled scores (double), one logit row */
    return b + al8(4 * n * d) + 8 * n + 8 * n + al8(4 * n);
  default:
    return 0;
  }
}

/* SnapKV scores of keys [0, len) into sc (pooled into pool_out). See kv_snapkv_window. */
static void snapkv_scores(const kv_snapkv_window *w, const float *kf, uint32_t n, uint32_t d,
                          double *sc, double *pool_out, float *logit, uint32_t len)
{
  float scale = (float)(1.0 / sqrt((double)d));
  uint32_t rows = w->n_obs * w->n_q_heads;
  for (uint32_t i = 0; i < len; i++)
    sc[i] = 0;
  for (uint32_t r = 0; r < rows; r++) {
    const float *q = w->q + (size_t)r * d;
    uint32_t obs = r / w->n_q_heads;
    /* keys this query sees: all, or (tail window) those up to its own token */
    uint32_t vis = w->tail_window ? n - w->n_obs + obs + 1 : n;
    float mx = -INFINITY;
    for (uint32_t i = 0; i < vis; i++) {
      logit[i] = (float)kv_codec_dot_f32(q, kf + (size_t)i * d, d) * scale;
      mx = logit[i] > mx ? logit[i] : mx;
    }
    double sum = 0;
    for (uint32_t i = 0; i < vis; i++) {
      logit[i] = expf(logit[i] - mx);
      sum += logit[i];
    }
    uint32_t upto = vis < len ? vis : len;
    for (uint32_t i = 0; i < upto; i++)
      sc[i] += logit[i] / sum;
  }
  unsigned kernel = w->kernel ? w->kernel : KV_SNAPKV_KERNEL_DEFAULT;
  uint32_t h = kernel / 2;
  for (uint32_t i = 0; i < len; i++) {
    uint32_t a = i >= h ? i - h : 0;
    uint32_t b = i + h < len ? i + h : len - 1;
    if (w->pool == KV_POOL_MAX) {
      double m = sc[a];
      for (uint32_t j = a + 1; j <= b; j++)
        m = sc[j] > m ? sc[j] : m;
      pool_out[i] = m;
    } else {
      double s = 0;
      for (uint32_t j = a; j <= b; j++)
        s += sc[j];
      pool_out[i] = s / kernel; /* padding counts as zeros, as F.avg_pool1d */
    }
  }
}

static kv_codec_status select_keep(kv_drop_method m, const kv_section_shape *shape,
                                   const void *k, size_t k_len, unsigned keep_permille,
                                   uint32_t keep_n, const kv_snapkv_window *win, void *scratch,
                                   size_t scratch_cap, uint32_t *keep_pos, uint32_t keep_cap,
                                   uint32_t *n_keep, kv_codec_err *err);

kv_codec_status kv_drop_select(kv_drop_method m, const kv_section_shape *shape, const void *k,
                               size_t k_len, unsigned keep_permille, const kv_snapkv_window *win,
                               void *scratch, size_t scratch_cap, uint32_t *keep_pos,
                               uint32_t keep_cap, uint32_t *n_keep, kv_codec_err *err)
{
  return select_keep(m, shape, k, k_len, keep_permille, 0, win, scratch, scratch_cap, keep_pos,
                     keep_cap, n_keep, err);
}

kv_codec_status kv_drop_select_n(kv_drop_method m, const kv_section_shape *shape, const void *k,
                                 size_t k_len, uint32_t keep, const kv_snapkv_window *win,
                                 void *scratch, size_t scratch_cap, uint32_t *keep_pos,
                                 uint32_t keep_cap, uint32_t *n_keep, kv_codec_err *err)
{
  if (keep == 0) {
    if (n_keep != NULL)
      *n_keep = 0;
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "kept count 0", 0, 1);
  }
  return select_keep(m, shape, k, k_len, 0, keep, win, scratch, scratch_cap, keep_pos, keep_cap,
                     n_keep, err);
}

/* keep_n > 0: keep exactly that many (kv_drop_select_n); else kv_drop_keep_count(permille) */
static kv_codec_status select_keep(kv_drop_method m, const kv_section_shape *shape,
                                   const void *k, size_t k_len, unsigned keep_permille,
                                   uint32_t keep_n, const kv_snapkv_window *win, void *scratch,
                                   size_t scratch_cap, uint32_t *keep_pos, uint32_t keep_cap,
                                   uint32_t *n_keep, kv_codec_err *err)
{
  size_t unused;
  if (n_keep == NULL || keep_pos == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "NULL keep_pos or n_keep", 0, 0);
  *n_keep = 0;
  kv_codec_status rc = kv_codec_encode_args(shape, k, k_len, k, &unused, err);
  if (rc != KV_CODEC_OK)
    return rc;
  if (shape->kind != KV_SECTION_K)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "token selection runs on the K section",
                         shape->kind, KV_SECTION_K);
  if (shape->n_tokens == 0 || shape->n_tokens > KV_CODEC_MAX_TOKENS || shape->head_dim == 0 ||
      shape->head_dim > KV_CODEC_MAX_HEAD_DIM)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "section shape out of range", shape->n_tokens,
                         KV_CODEC_MAX_TOKENS);
  if (m != KV_DROP_KNORM && m != KV_DROP_KEYDIFF && m != KV_DROP_SNAPKV)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "unknown drop method", m, KV_DROP_SNAPKV);
  if ((m == KV_DROP_SNAPKV) != (win != NULL))
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL,
                         m == KV_DROP_SNAPKV ? "snapkv needs an observation window"
                                             : "observation window given to a method without one",
                         0, 0);
  if (win != NULL && !window_ok(win, shape->n_tokens))
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL,
                         "bad observation window (q, n_obs, n_q_heads, odd kernel, pool, tail)",
                         win->n_obs, shape->n_tokens);
  uint32_t n = shape->n_tokens, d = shape->head_dim;
  if (keep_n > n)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "kept count above the tokens", keep_n, n);
  uint32_t keep = keep_n ? keep_n : kv_drop_keep_count(n, keep_permille);
  if (keep == 0)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "keep_permille outside 1..1000", keep_permille,
                         1000);
  if (keep_cap < keep)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "keep_cap smaller than the kept count", keep_cap,
                         keep);
  size_t need = kv_drop_scratch_bytes(m, n, d, win);
  if (scratch == NULL || scratch_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than kv_drop_scratch_bytes()",
                         scratch ? scratch_cap : 0, need);

  size_t cap = scratch_cap;
  uint8_t *ws = kv_codec_scratch_align(scratch, &cap);
  scored *v = (scored *)(void *)ws;
  uint8_t *flags = ws + al8(sizeof(scored) * n);
  float *row = (float *)(void *)(flags + al8(n));
  double *drow = (double *)(void *)((uint8_t *)row + al8(4 * (size_t)d));
  size_t rowb = (size_t)d * kv_codec_dtype_bytes(shape->dtype);
  const uint8_t *k8 = k;
  uint32_t n_scored = n, tail_keep = 0;
  memset(flags, 0, n);

  if (m == KV_DROP_KNORM) {
    for (uint32_t t = 0; t < n; t++) {
      kv_codec_to_f32(shape->dtype, k8 + (size_t)t * rowb, d, row);
      double ss = 0;
      for (uint32_t j = 0; j < d; j++)
        ss += (double)row[j] * row[j];
      v[t].s = -ss; /* lowest norm first; the square keeps the order */
      v[t].i = t;
    }
  } else if (m == KV_DROP_KEYDIFF) {
    double *a = drow;
    for (uint32_t j = 0; j < d; j++)
      a[j] = 0;
    for (uint32_t t = 0; t < n; t++) {
      kv_codec_to_f32(shape->dtype, k8 + (size_t)t * rowb, d, row);
      double ss = 0;
      for (uint32_t j = 0; j < d; j++)
        ss += (double)row[j] * row[j];
      if (ss > 0) {
        double inv = 1.0 / sqrt(ss);
        for (uint32_t j = 0; j < d; j++)
          a[j] += row[j] * inv;
      }
    }
    double an = 0;
    for (uint32_t j = 0; j < d; j++) {
      a[j] /= n;
      an += a[j] * a[j];
    }
    an = sqrt(an);
    for (uint32_t t = 0; t < n; t++) {
      kv_codec_to_f32(shape->dtype, k8 + (size_t)t * rowb, d, row);
      double ss = 0, dp = 0;
      for (uint32_t j = 0; j < d; j++) {
        ss += (double)row[j] * row[j];
        dp += row[j] * a[j];
      }
      double cosv = (ss > 0 && an > 0) ? dp / (sqrt(ss) * an) : 0.0;
      v[t].s = -cosv;
      v[t].i = t;
    }
  } else {
    uint8_t *p = (uint8_t *)drow + 8 * (size_t)d;
    float *kf = (float *)(void *)p;
    double *sc = (double *)(void *)(p + al8(4 * (size_t)n * d));
    double *pooled = sc + n;
    float *logit = (float *)(void *)(pooled + n);
    kv_codec_to_f32(shape->dtype, k, (size_t)n * d, kf);
    uint32_t len = win->tail_window ? n - win->n_obs : n;
    if (win->tail_window) {
      /* [SnapKV] the window itself is always kept; it takes the most recent slots */
      tail_keep = win->n_obs < keep ? win->n_obs : keep;
      for (uint32_t t = n - tail_keep; t < n; t++)
        flags[t] = 1;
    }
    n_scored = len;
    if (len > 0)
      snapkv_scores(win, kf, n, d, sc, pooled, logit, len);
    for (uint32_t t = 0; t < len; t++) {
      v[t].s = pooled[t];
      v[t].i = t;
    }
  }

  uint32_t want = keep - tail_keep;
  if (want > 0) {
    qsort(v, n_scored, sizeof *v, cmp_scored);
    for (uint32_t i = 0; i < want && i < n_scored; i++)
      flags[v[i].i] = 1;
  }
  uint32_t c = 0;
  for (uint32_t t = 0; t < n; t++)
    if (flags[t])
      keep_pos[c++] = t;
  *n_keep = c;
  return KV_CODEC_OK;
}

/* ---- the drop codec ---------------------------------------------------------------------------- */

static size_t rows_payload(const kv_section_info *info, uint32_t g)
{
  if (info->params.bits != 0)
    return kv_quant_group_bytes(info, g);
  return (size_t)kv_codec_group_rows(info, g) * info->shape.head_dim *
         kv_codec_dtype_bytes(info->shape.dtype);
}

size_t kv_codec_drop_bound(const kv_section_shape *shape, const kv_codec_params *p)
{
  kv_section_info info;
  if (kv_codec_plan(KV_CODEC_ID_DROP, shape, p, &info, NULL) != KV_CODEC_OK)
    return 0;
  size_t n = info.header_bytes;
  for (uint32_t g = 0; g < info.n_groups; g++)
    n += rows_payload(&info, g);
  return n;
}

size_t kv_codec_drop_scratch_bytes(const kv_section_shape *shape, const kv_codec_params *p,
                                   kv_codec_op op)
{
  kv_section_info info;
  (void)op;
  if (kv_codec_plan(KV_CODEC_ID_DROP, shape, p, &info, NULL) != KV_CODEC_OK)
    return 0;
  return p->bits ? kv_quant_scratch_bytes(shape->head_dim) : KV_CODEC_SCRATCH_SLACK;
}

kv_codec_status kv_codec_drop_encode(const kv_section_shape *shape, const void *src, size_t src_len,
                                     const kv_codec_params *p, void *scratch, size_t scratch_cap,
                                     void *dst, size_t dst_cap, size_t *out_len, kv_codec_err *err)
{
  kv_section_info info;
  kv_codec_status rc = kv_codec_encode_args(shape, src, src_len, dst, out_len, err);
  if (rc != KV_CODEC_OK)
    return rc;
  if (p == NULL || p->keep_pos == NULL)
    return KV_CODEC_FAIL(err, KV_CODEC_EINVAL, "drop encode needs keep_pos", 0, 0);
  rc = kv_codec_plan(KV_CODEC_ID_DROP, shape, p, &info, err);
  if (rc != KV_CODEC_OK)
    return rc;
  void *ws = NULL;
  if (p->bits != 0) {
    size_t need = kv_quant_scratch_bytes(shape->head_dim), cap = scratch_cap;
    if (scratch == NULL || scratch_cap < need)
      return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than scratch_bytes()",
                           scratch ? scratch_cap : 0, need);
    ws = kv_codec_scratch_align(scratch, &cap);
  }
  size_t bound = kv_codec_drop_bound(shape, p);
  if (dst_cap < bound)
    return KV_CODEC_FAIL(err, KV_CODEC_ETOOSMALL, "dst smaller than the encoded section", dst_cap,
                         bound);
  uint8_t *d = dst;
  const uint8_t *s = src;
  kv_codec_write_header(&info, p->keep_pos, d);
  uint8_t *table = d + info.header_bytes - 4 * (size_t)info.n_groups;
  size_t pos = info.header_bytes;
  size_t rowb = (size_t)shape->head_dim * kv_codec_dtype_bytes(shape->dtype);
  for (uint32_t g = 0; g < info.n_groups; g++) {
    size_t n = rows_payload(&info, g);
    if (p->bits != 0) {
      rc = kv_quant_encode_group(&info, g, src, p->keep_pos, ws, d + pos, err);
      if (rc != KV_CODEC_OK)
        return rc;
    } else {
      uint32_t r0 = g * info.params.page_tokens, t = kv_codec_group_rows(&info, g);
      for (uint32_t r = 0; r < t; r++)
        kv_codec_store_le(shape->dtype, s + (size_t)p->keep_pos[r0 + r] * rowb, shape->head_dim,
                          d + pos + (size_t)r * rowb);
    }
    kv_codec_put_le32(table + 4 * (size_t)g, (uint32_t)n);
    pos += n;
  }
  *out_len = pos;
  return KV_CODEC_OK;
}

kv_codec_status kv_drop_decode_parsed(const kv_section_info *info, const uint8_t *payload,
                                      uint32_t g0, uint32_t g1, void *scratch, size_t scratch_cap,
                                      void *dst, kv_codec_dctx *ctx, kv_codec_err *err)
{
  const uint8_t *in = payload;
  uint8_t *out = dst;
  size_t rowb = (size_t)info->shape.head_dim * kv_codec_dtype_bytes(info->shape.dtype);
  if (info->params.bits == 0) {
    size_t es = kv_codec_dtype_bytes(info->shape.dtype);
    kv_codec_load_le(info->shape.dtype, in, kv_section_rows_bytes(info, g0, g1) / es, out);
    return KV_CODEC_OK;
  }
  size_t need = kv_quant_scratch_bytes(info->shape.head_dim), cap = scratch_cap;
  if (scratch == NULL || scratch_cap < need)
    return KV_CODEC_FAIL(err, KV_CODEC_ENOMEM, "scratch smaller than scratch_bytes()",
                         scratch ? scratch_cap : 0, need);
  void *ws = kv_codec_scratch_align(scratch, &cap);
  int stream = kv_codec_stream_call(ctx, kv_section_rows_bytes(info, g0, g1));
  for (uint32_t g = g0; g < g1; g++) {
    kv_quant_decode_group(info, g, in, ws, out, stream ? 2 : 1);
    in += kv_quant_group_bytes(info, g);
    out += (size_t)kv_codec_group_rows(info, g) * rowb;
  }
  if (stream)
    kv_quant_stream_fence();
  return KV_CODEC_OK;
}

/* The bitmap keeps exactly n_rows tokens and nothing past n_tokens; groups have their size. */
kv_codec_status kv_codec_drop_check(const kv_section_info *info, const uint8_t *hdr,
                                    kv_codec_err *err)
{
  const uint8_t *bm = hdr + KV_SECTION_FIXED_BYTES;
  uint32_t n = info->shape.n_tokens;
  if ((n & 7u) && (bm[n / 8] >> (n & 7u)) != 0)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "keep bitmap has bits past the tokens",
                         bm[n / 8], 0);
  uint32_t c = kv_drop_bitmap_count(bm, n);
  if (c != info->n_rows)
    return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "keep bitmap count differs from the rows", c,
                         info->n_rows);
  if (info->params.bits != 0)
    return kv_quant_check(info, hdr, err);
  const uint8_t *t = bm + ((size_t)n + 7) / 8;
  for (uint32_t g = 0; g < info->n_groups; g++) {
    size_t want = rows_payload(info, g);
    uint32_t have = kv_codec_get_le32(t + 4 * (size_t)g);
    if (have != want)
      return KV_CODEC_FAIL(err, KV_CODEC_ECORRUPT, "drop group length is not its rows' bytes",
                           have, want);
  }
  return KV_CODEC_OK;
}

